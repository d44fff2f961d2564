"""How the learner ranks of a driver-launched run find each other: through the run's Redis.

Rank 0 starts the group's ``TCPStore`` on ``MASTER_ADDR`` alone (``common.net.hosted_store``), on a
port the kernel gives it (port 0), so the port is bound
before anyone learns of it, then publishes the port under a key unique to this start of the learner
tier (the driver's rendezvous id). The other ranks wait for the key and connect. A port picked
beforehand (by the driver) stays free only by luck until rank 0 binds it seconds later: another
process on the node can take it in between, and rank 0 then fails with ``EADDRINUSE``.

Processes started without a rendezvous id (``rredcot learn``, torchrun-style launches) keep the
``env://`` rendezvous (``MASTER_ADDR``/``MASTER_PORT``) of ``engine.init_distributed``.
"""

from __future__ import annotations

import os
import time
from datetime import timedelta
from typing import TYPE_CHECKING

import redis

from rredcot.common.net import hosted_store
from rredcot.common.streams import run_key

if TYPE_CHECKING:  # torch only where a store is made: the driver reads ENV
    import torch.distributed as dist

ENV = "RREDCOT_RENDEZVOUS"  # the rendezvous id the driver gives one start of the learner tier
POLL_S = 0.1
TIMEOUT_S = 600.0  # a rank waits this long for rank 0's port, and the store's operations as long


def rendezvous_key(client: redis.Redis, run_id: str, rendezvous_id: str) -> str:
    return run_key(client, run_id, f"learner:rendezvous:{rendezvous_id}")


def learner_store(
    client: redis.Redis,
    run_id: str,
    rendezvous_id: str,
    rank: int,
    world: int,
    address: str,
    timeout_s: float,
) -> dist.TCPStore:
    """The store of the learner group: hosted on a free port by rank 0, joined by the others once
    rank 0 has published its port (they wait up to ``timeout_s``)."""
    import torch.distributed as dist

    timeout = timedelta(seconds=timeout_s)
    name = rendezvous_key(client, run_id, rendezvous_id)
    if rank == 0:
        store = hosted_store(address, world, timeout)  # listening on address only, not every interface
        client.set(name, store.port)
        return store
    deadline = time.monotonic() + timeout_s
    while (port := client.get(name)) is None:
        if time.monotonic() > deadline:
            raise TimeoutError(
                f"learner rank {rank}: rank 0 did not publish the group's port in {timeout_s:.0f} s "
                f"(Redis key {name}); see learner0's log"
            )
        time.sleep(POLL_S)
    return dist.TCPStore(address, int(port), world, False, timeout)


def join_from_env(client: redis.Redis, run_id: str, timeout_s: float = TIMEOUT_S) -> dist.TCPStore | None:
    """This rank's learner store when the driver gave it a rendezvous id (``RREDCOT_RENDEZVOUS``,
    with ``RANK``, ``WORLD_SIZE`` and rank 0's ``MASTER_ADDR``); None otherwise."""
    rendezvous_id = os.environ.get(ENV)
    if not rendezvous_id:
        return None
    rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    return learner_store(client, run_id, rendezvous_id, rank, world, os.environ["MASTER_ADDR"], timeout_s)
