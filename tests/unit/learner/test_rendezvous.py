"""The learner group's rendezvous through Redis: rank 0's own port reaches the other ranks, a start's
ranks never meet another start's, and a rank whose rank 0 never comes says so (real Redis, gloo)."""

from __future__ import annotations

import socket
import threading

import pytest
import torch
import torch.distributed as dist

from rredcot.common.streams import registered_keys
from rredcot.learner.rendezvous import join_from_env, learner_store, rendezvous_key


def _allreduce(stores: dict[int, dist.Store], world: int) -> dict[int, float]:
    """Each rank's sum of (rank + 1) over a gloo group formed on its store, ranks as threads."""
    sums: dict[int, float] = {}

    def rank_body(rank: int) -> None:
        group = dist.ProcessGroupGloo(dist.PrefixStore("t", stores[rank]), rank, world)
        x = torch.tensor([rank + 1.0])
        group.allreduce([x]).wait()
        sums[rank] = float(x)

    threads = [threading.Thread(target=rank_body, args=(r,)) for r in range(world)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=60)
    return sums


def test_ranks_that_start_before_rank_0_join_the_port_it_bound(redis_client, run_id):
    world, stores = 3, {}

    def join(rank: int) -> None:
        stores[rank] = learner_store(redis_client, run_id, "start1", rank, world, "127.0.0.1", 30)

    waiting = [threading.Thread(target=join, args=(r,)) for r in (1, 2)]
    for t in waiting:
        t.start()
    join(0)
    for t in waiting:
        t.join(timeout=30)
    assert _allreduce(stores, world) == {0: 6.0, 1: 6.0, 2: 6.0}
    port = int(redis_client.get(rendezvous_key(redis_client, run_id, "start1")))
    assert port == stores[0].port and all(s.port == port for s in stores.values())
    with socket.socket() as s, pytest.raises(OSError):  # rank 0 holds it from the moment it published it
        s.bind(("127.0.0.1", port))
    assert rendezvous_key(redis_client, run_id, "start1") in registered_keys(redis_client, run_id)


def test_a_new_start_of_the_tier_never_joins_the_old_ones_store(redis_client, run_id):
    old = learner_store(redis_client, run_id, "start1", 0, 2, "127.0.0.1", 30)
    new = learner_store(redis_client, run_id, "start2", 0, 2, "127.0.0.1", 30)
    joined = learner_store(redis_client, run_id, "start2", 1, 2, "127.0.0.1", 30)
    assert joined.port == new.port != old.port


def test_a_rank_whose_rank_0_never_publishes_times_out_naming_the_key(redis_client, run_id):
    with pytest.raises(TimeoutError, match=rf"rank 0 did not publish.*rredcot:{run_id}:learner:rendezvous:gone"):
        learner_store(redis_client, run_id, "gone", 1, 2, "127.0.0.1", 0.3)


def test_without_a_rendezvous_id_the_rank_keeps_env_rendezvous(redis_client, run_id, monkeypatch):
    monkeypatch.delenv("RREDCOT_RENDEZVOUS", raising=False)
    assert join_from_env(redis_client, run_id) is None
    monkeypatch.setenv("RREDCOT_RENDEZVOUS", "start3")
    monkeypatch.setenv("RANK", "0")
    monkeypatch.setenv("WORLD_SIZE", "1")
    monkeypatch.setenv("MASTER_ADDR", "127.0.0.1")
    store = join_from_env(redis_client, run_id)
    assert store is not None and int(redis_client.get(rendezvous_key(redis_client, run_id, "start3"))) == store.port
