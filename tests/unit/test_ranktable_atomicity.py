"""A RankTable mutator that fails leaves every version as it was, even when its
arguments read other versions of the same table."""

from __future__ import annotations

import pytest

import rankcore as rc
from rankcore.base.ranks import RankTable


def test_failed_release_many_leaves_the_table_unchanged():
    t = RankTable().assign_many([("a", "n0"), ("c", "n1")])
    before = t.to_dict()
    with pytest.raises(rc.UnknownReplica):
        t.release_many(["a", "b"])
    assert t.to_dict() == before and t.holder_of(0) == "a"


def test_arguments_reading_another_version_do_not_corrupt():
    """An iterable argument that reads another version of the same table."""
    t1 = RankTable().assign("x", "n0")
    t2 = t1.assign("y", "n0")

    def reports():
        t1.to_dict()  # reroots the store to t1
        yield ("z", "n9", rc.ReplicaRank(rank=0, node_rank=5, local_rank=0))

    with pytest.raises(rc.RankConflict, match="rank 0"):
        t2.recover_many(reports())
    assert t2.to_dict() == {"x": (0, "n0", 0, 0), "y": (1, "n0", 0, 1)}
