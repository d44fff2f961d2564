"""Which worker failures the supervisor restarts: a dead process, not a constructor that raised."""

from __future__ import annotations

from ray.exceptions import ActorDiedError, RayTaskError

from rredcot.launch.supervisor import process_died


def test_a_dead_process_is_restarted_and_a_failed_constructor_is_not():
    killed = ActorDiedError()  # the process went away (SIGKILL, OOM killer): Ray's system-level death
    bad_start = ActorDiedError(RayTaskError("StageWorker.__init__", "Traceback ...", ValueError("bad checkpoint")))
    assert process_died(killed)
    assert not process_died(bad_start)  # it would raise again at every restart
    assert not process_died(RuntimeError("a peer's collective failed"))
