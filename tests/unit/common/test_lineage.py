"""Versions as updates along the run's history, across restores (real Redis)."""

from __future__ import annotations

import numpy as np

from rredcot.common.lineage import VersionLineage


def test_versions_map_to_updates_across_two_restores(redis_client, run_id):
    lineage = VersionLineage(redis_client, run_id)
    assert lineage.position(np.arange(5)).tolist() == [0, 1, 2, 3, 4]  # no restore: the identity
    # published up to 5, restored to the checkpoint of version 2, republished as 6
    lineage.renumber(6, 2)
    assert lineage.position([2, 4, 5, 6, 7, 9]).tolist() == [2, 4, 5, 2, 3, 5]  # 4, 5: discarded, kept in place
    # published up to 9 (position 5), restored to version 8 (position 4), republished as 10
    lineage.renumber(10, 8)
    assert lineage.position([8, 9, 10, 12]).tolist() == [4, 5, 4, 6]
    # a learner that starts later reads the same renumberings
    assert VersionLineage(redis_client, run_id).position([5, 7, 9, 12]).tolist() == [5, 3, 5, 6]
    assert int(lineage.position(12)) == 6  # a scalar too


def test_a_reader_that_outlives_a_restore_sees_it_after_refresh(redis_client, run_id):
    """The redistributor reads the lineage at start and outlives a learner restart: ``refresh``
    brings in the restore's renumbering."""
    reader = VersionLineage(redis_client, run_id)
    VersionLineage(redis_client, run_id).renumber(6, 2)  # the restarted learner's
    assert int(reader.position(6)) == 6
    reader.refresh()
    assert reader.position([5, 6, 7]).tolist() == [5, 2, 3]
