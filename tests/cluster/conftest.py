"""The cluster harness's fixture: nodes as network namespaces (``tests/cluster/netns.py``), skipped
with the reason where namespaces cannot be made (not root, no ``ip``, ``ip netns add`` refused)."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from tests.cluster.netns import Cluster, cannot_run, leftovers


@pytest.fixture(scope="module")
def netns_cluster() -> Iterator[Cluster]:
    """A harness with no node yet (a test module adds and starts its own); whatever the module did,
    everything of it is gone afterwards: its processes, namespaces (veths, bridge) and directory."""
    if why := cannot_run():
        pytest.skip(f"no network namespaces: {why}")
    cluster = Cluster()
    try:
        yield cluster
    finally:
        cluster.close()
        left = leftovers(cluster.owner)
        assert not left, f"the cluster harness left: {left}"
        assert not cluster.root.exists(), f"the cluster harness left {cluster.root}"
