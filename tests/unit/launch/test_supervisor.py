"""Which worker failures the supervisor restarts: a dead process, not a constructor that raised; and
which learner rank's death a rank's failure came from."""

from __future__ import annotations

import os
import time

import pytest
import ray
from ray.exceptions import ActorDiedError, ActorUnavailableError, RayTaskError

from rredcot.launch.supervisor import peer_death, process_died


@ray.remote(num_cpus=0)
class Rank:
    """A learner rank's ``run()`` as its peers see it: its process dies, or it stays in a collective."""

    def run(self, how: str) -> None:
        if how == "die":
            time.sleep(0.5)
            os._exit(1)
        time.sleep(20)  # blocked in a collective whose peer failed


def test_a_dead_process_is_restarted_and_a_failed_constructor_is_not():
    killed = ActorDiedError()  # the process went away (SIGKILL, OOM killer): Ray's system-level death
    bad_start = ActorDiedError(RayTaskError("StageWorker.__init__", "Traceback ...", ValueError("bad checkpoint")))
    assert process_died(killed)
    # a rank on a lost node, before Ray declares the node dead: its socket closed, its call's result lost
    assert process_died(ActorUnavailableError("RPC error: Socket closed", None))
    assert not process_died(bad_start)  # it would raise again at every restart
    assert not process_died(RuntimeError("a peer's collective failed"))


@pytest.mark.slow  # a real local Ray
def test_a_peer_whose_process_died_is_named_without_waiting_for_the_live_ones(ray_local):
    blocked, dying = Rank.remote(), Rank.remote()
    still = blocked.run.remote("block")
    peers = {still: 1, dying.run.remote("die"): 2}
    died = peer_death(peers, wait_s=300)
    assert died is not None and died.startswith("learner2: "), died
    assert ray.wait([still], timeout=0)[0] == []  # found while rank 1 was still blocked: not waited for
    # a rank that failed on its own: its peers stay blocked, none died, and the wait ends
    assert peer_death({still: 1}, wait_s=1) is None
