"""Example-based tests of ``RankTable`` and its records (rankcore.base.ranks)."""

from __future__ import annotations

import random

import pytest

from rankcore.base.errors import InvalidConfig, InvariantViolation, RankConflict, UnknownReplica
from rankcore.base.ranks import (
    LowerBound,
    RankTable,
    Reassignment,
    Reassignments,
    ReplicaRank,
    ReportedRank,
)


# ------------------------------------------------------------------ helpers
def build(*placements):
    """A table from (replica, node) pairs assigned in order."""
    t = RankTable()
    for rep, node in placements:
        t = t.assign(rep, node)
    return t


def ranks(t):
    """replica -> global rank."""
    return {rep: t.global_rank(rep) for rep in t}


def assert_unchanged(before_table, before_snapshot):
    """The table object still reads exactly like its snapshot."""
    assert before_table.to_dict() == before_snapshot
    assert len(before_table) == len(before_snapshot)
    for rep, (r, node, nr, local) in before_snapshot.items():
        assert before_table.global_rank(rep) == r
        assert before_table.holder_of(r) == rep
        assert before_table.node_of(rep) == node
        rk = before_table.rank_of(rep)
        assert rk == (None if node is None else ReplicaRank(r, nr, local))


def contiguous_levels(t):
    """Whether global, node and every node's local ranks are 0..count-1."""
    d = t.to_dict()
    if sorted(v[0] for v in d.values()) != list(range(len(d))):
        return False
    node_ranks = t.nodes()
    if sorted(node_ranks.values()) != list(range(len(node_ranks))):
        return False
    for node in node_ranks:
        locals_ = sorted(v[3] for v in d.values() if v[1] == node)
        if locals_ != list(range(len(locals_))):
            return False
    return True


# ------------------------------------------------------- lowest free ranks
def test_global_ranks_are_handed_out_from_zero_upwards():
    """Successive assigns get global ranks 0, 1, 2, ... in order."""
    t = RankTable()
    for i in range(6):
        assert t.lowest_free() == i
        t = t.assign(f"r{i}")
        assert t.global_rank(f"r{i}") == i
    assert len(t) == 6


def test_a_new_node_gets_the_lowest_free_node_rank():
    """Each node new to the table gets the lowest node rank not held by another node."""
    t = build(("a", "n0"), ("b", "n1"), ("c", "n0"), ("d", "n2"))
    assert t.nodes() == {"n0": 0, "n1": 1, "n2": 2}
    assert t.rank_of("c").node_rank == 0
    assert t.rank_of("d").node_rank == 2


def test_local_ranks_start_at_zero_on_every_node():
    """Local ranks count from 0 separately on each node."""
    t = build(("a", "n0"), ("b", "n1"), ("c", "n0"), ("d", "n1"), ("e", "n0"))
    assert [t.rank_of(r).local_rank for r in "abcde"] == [0, 0, 1, 1, 2]
    assert t.replicas_on("n0") == 3 and t.replicas_on("n1") == 2
    assert t.replicas_on("nowhere") == 0
    assert t.local_ranks_on("n0") == {0, 1, 2} and t.local_ranks_on("nowhere") == frozenset()
    assert t.release("c").local_ranks_on("n0") == {0, 2}


def test_rank_tuple_agrees_with_rank_of_and_global_rank():
    """``rank_tuple`` (the trace writer's read) says what ``rank_of`` and
    ``global_rank`` say, None for the node and local rank of an unplaced
    replica, and also on an older version of the table."""
    t = build(("a", "n0"), ("b", "n1"), ("c", "n0"))
    t2 = t.release("a").assign("d")
    assert t2.rank_tuple("c") == t2.rank_of("c").as_tuple() == (2, 0, 1)
    assert t2.rank_tuple("d") == (t2.global_rank("d"), None, None) == (0, None, None)
    assert t.rank_tuple("a") == (0, 0, 0)  # (the older version, read after the newer one)
    with pytest.raises(UnknownReplica, match="'a'"):
        t2.rank_tuple("a")


def test_freed_global_ranks_are_reused_lowest_first():
    """After releases, the lowest freed global rank is handed out next, then the next one."""
    t = RankTable()
    for i in range(6):
        t = t.assign(f"r{i}")
    t = t.release("r4").release("r1").release("r3")
    assert t.lowest_free() == 1
    t = t.assign("x")
    assert t.global_rank("x") == 1
    t = t.assign("y")
    assert t.global_rank("y") == 3
    t = t.assign("z")
    assert t.global_rank("z") == 4
    t = t.assign("w")
    assert t.global_rank("w") == 6


def test_freed_node_rank_is_reused_lowest_first():
    """When nodes empty out, the next new node gets the lowest freed node rank."""
    t = build(("a", "n0"), ("b", "n1"), ("c", "n2"), ("d", "n3"))
    t = t.release("c").release("b")
    assert t.nodes() == {"n0": 0, "n3": 3}
    t = t.assign("e", "n9")
    assert t.node_rank("n9") == 1
    t = t.assign("f", "n8")
    assert t.node_rank("n8") == 2
    t = t.assign("g", "n7")
    assert t.node_rank("n7") == 4


def test_freed_local_rank_is_reused_lowest_first():
    """On a node, the lowest freed local rank is handed out next."""
    t = build(*[(f"r{i}", "n0") for i in range(5)])
    t = t.release("r3").release("r1")
    t = t.assign("x", "n0")
    assert t.rank_of("x").local_rank == 1
    t = t.assign("y", "n0")
    assert t.rank_of("y").local_rank == 3
    t = t.assign("z", "n0")
    assert t.rank_of("z").local_rank == 5


def test_lowest_free_across_bitmap_word_boundaries():
    """With thousands of ranks, freed ranks at word boundaries come back lowest first."""
    n = 4200
    t = RankTable().assign_many([(f"r{i}", None) for i in range(n)])
    freed = [4100, 4096, 4095, 64, 63, 5]
    t = t.release_many([f"r{i}" for i in freed])
    for expected in sorted(freed):
        assert t.lowest_free() == expected
        t = t.assign(f"new{expected}")
        assert t.global_rank(f"new{expected}") == expected
    assert t.lowest_free() == n


def test_single_release_in_a_full_bitmap_word_is_found_again():
    """release() of one rank inside a full 64-rank word makes it the lowest free rank again."""
    t = RankTable()
    for i in range(130):
        t = t.assign(f"r{i}")
    t = t.release("r70")
    assert t.lowest_free() == 70
    t = t.assign("x")
    assert t.global_rank("x") == 70
    t = t.release("r3").release("r64")
    assert t.lowest_free() == 3
    t = t.assign("y").assign("z")
    assert (t.global_rank("y"), t.global_rank("z")) == (3, 64)
    assert t.assign("w").global_rank("w") == 130


def test_many_nodes_across_a_full_node_rank_word():
    """Node ranks past 64 nodes are handed out and reused lowest first."""
    t = RankTable()
    for i in range(70):
        t = t.assign(f"r{i}", f"n{i}")
    assert t.node_rank("n69") == 69
    t = t.release("r65").release("r10")
    assert t.assign("x", "fresh").node_rank("fresh") == 10
    t = t.assign("x", "fresh").assign("y", "fresh2")
    assert t.node_rank("fresh2") == 65


# ------------------------------------------------------------ assign/place
def test_assign_without_node_holds_only_a_global_rank():
    """assign(node=None) gives a global rank but no node/local rank until place()."""
    t = RankTable().assign("a").assign("b")
    assert t.rank_of("a") is None
    assert t.node_of("a") is None
    assert not t.is_placed("a")
    assert t.global_rank("b") == 1
    assert t.nodes() == {}
    assert t.to_dict() == {"a": (0, None, None, None), "b": (1, None, None, None)}


def test_place_gives_node_and_local_ranks():
    """place() keeps the global rank and adds the node's rank and the lowest free local rank."""
    t = RankTable().assign("a").assign("b").assign("c")
    t = t.place("b", "n0").place("c", "n1").place("a", "n0")
    assert t.rank_of("b") == ReplicaRank(1, 0, 0)
    assert t.rank_of("c") == ReplicaRank(2, 1, 0)
    assert t.rank_of("a") == ReplicaRank(0, 0, 1)
    assert t.is_placed("a")


def test_place_twice_raises_and_changes_nothing():
    """place() of an already placed replica raises RankConflict naming it; the table is unchanged."""
    t = build(("a", "n0"))
    snap = t.to_dict()
    with pytest.raises(RankConflict, match="'a'"):
        t.place("a", "n1")
    assert_unchanged(t, snap)


def test_place_unknown_replica_raises():
    """place() of a replica with no rank raises UnknownReplica naming it."""
    with pytest.raises(UnknownReplica, match="ghost"):
        RankTable().place("ghost", "n0")


def test_assign_explicit_free_rank():
    """assign(rank=k) with k free takes k, and later lowest-free assigns fill the gap below it."""
    t = RankTable().assign("a", rank=3)
    assert t.global_rank("a") == 3
    t = t.assign("b").assign("c")
    assert (t.global_rank("b"), t.global_rank("c")) == (0, 1)
    t = t.assign("d").assign("e")
    assert (t.global_rank("d"), t.global_rank("e")) == (2, 4)


# ----------------------------------------------------------------- replace
def test_replace_on_same_node_takes_old_global_and_local_rank():
    """replace(old, new, same node): new gets old's global rank, node rank and local rank."""
    t = build(("a", "n0"), ("b", "n1"), ("c", "n0"))
    t2 = t.replace("c", "c2", "n0")
    assert "c" not in t2
    assert t2.rank_of("c2") == ReplicaRank(2, 0, 1)
    assert t2.holder_of(2) == "c2"
    assert t2.replicas_on("n0") == 2
    assert len(t2) == 3


def test_replace_on_same_node_keeps_node_rank_of_a_sole_replica():
    """Replacing the only replica of a node on that node keeps the node's rank, even if a lower one is free."""
    t = build(("a", "n0"), ("b", "n1")).release("a")
    assert t.nodes() == {"n1": 1}
    t2 = t.replace("b", "b2", "n1")
    assert t2.rank_of("b2") == ReplicaRank(1, 1, 0)
    assert t2.nodes() == {"n1": 1}


def test_replace_on_same_node_keeps_its_local_rank_even_when_a_lower_one_is_free():
    """A restarted replica keeps all three ranks (issue 8, point 1): on the same node new
    takes old's local rank, not the lower one a downscale freed; compaction fixes that later."""
    t = build(("a", "n0"), ("b", "n0"), ("c", "n0")).release("a")
    t2 = t.replace("c", "c2", "n0")
    assert t2.rank_of("c2") == ReplicaRank(2, 0, 2)
    assert t2.rank_of("b") == ReplicaRank(1, 0, 1)
    assert t2.replicas_on("n0") == 2
    # the global hole and the local hole are both still there, as after the release alone
    assert t2.lower_bound() == t.lower_bound() == LowerBound(rank=1, node_rank=0, local_rank=1, replicas=1)
    assert t2.assign("d", "n0").rank_of("d") == ReplicaRank(0, 0, 0)
    compacted, changes = t2.compact()
    assert compacted.is_contiguous() and len(changes) == 1
    assert compacted.rank_of("c2") == ReplicaRank(0, 0, 0) and compacted.rank_of("b") == ReplicaRank(1, 0, 1)


def test_replace_on_same_node_is_a_rename():
    """Whatever else changed on the node, the replacement reads exactly like its predecessor."""
    t = build(("a", "n0"), ("b", "n1"), ("c", "n0"), ("d", "n0"), ("e", "n1")).release_many(["a", "c"])
    before = t.rank_of("d")
    t2 = t.replace("d", "d2", "n0")
    assert t2.rank_of("d2") == before == ReplicaRank(3, 0, 2)
    assert t2.lower_bound() == t.lower_bound()
    assert t2.nodes() == t.nodes() and t2.holder_of(3) == "d2"


def test_replace_on_other_node_frees_old_local_rank():
    """replace onto another node frees old's local rank on its node; new gets a local rank on the new node."""
    t = build(("a", "n0"), ("b", "n0"), ("c", "n1"))
    t2 = t.replace("a", "a2", "n1")
    assert t2.rank_of("a2") == ReplicaRank(0, 1, 1)
    assert t2.replicas_on("n0") == 1
    assert t2.nodes() == {"n0": 0, "n1": 1}
    t3 = t2.assign("d", "n0")
    assert t3.rank_of("d").local_rank == 0


def test_replace_on_other_node_releases_emptied_node_rank():
    """If old's node becomes empty, its node rank is released (and reused by the next new node)."""
    t = build(("a", "n0"), ("b", "n1"))
    t2 = t.replace("a", "a2", "n1")
    assert t2.node_rank("n0") is None
    assert t2.nodes() == {"n1": 1}
    assert t2.rank_of("a2") == ReplicaRank(0, 1, 1)
    t3 = t2.assign("c", "n5")
    assert t3.node_rank("n5") == 0


def test_replace_onto_new_node_reuses_the_emptied_node_rank():
    """Old's node is emptied before new's node is placed, so a brand new node gets the freed rank."""
    t = build(("a", "n0"), ("b", "n1"))
    t2 = t.replace("a", "a2", "n7")
    assert t2.nodes() == {"n7": 0, "n1": 1}
    assert t2.rank_of("a2") == ReplicaRank(0, 0, 0)


def test_replace_without_node_leaves_new_unplaced():
    """replace(old, new) with no node gives new only old's global rank and frees old's node ranks."""
    t = build(("a", "n0"), ("b", "n1"))
    t2 = t.replace("b", "b2")
    assert t2.global_rank("b2") == 1
    assert t2.rank_of("b2") is None
    assert t2.nodes() == {"n0": 0}
    t3 = t2.place("b2", "n1")
    assert t3.rank_of("b2") == ReplicaRank(1, 1, 0)


# ------------------------------------------- replace, then place (the core's crash path)
def test_replacement_placed_later_on_its_node_keeps_its_local_rank():
    """replace(old, new) then place(new, old's node): new gets old's local rank, not the
    lowest free one (the core replaces at the crash and places at ReplicaPlaced)."""
    t = build(("a", "n0"), ("b", "n0"), ("c", "n0")).release("a")  # local 0 free on n0
    t2 = t.replace("c", "c2")
    assert t2.rank_of("c2") is None
    assert t2.preferences() == {"c2": ("n0", 0, 2)}
    t3 = t2.place("c2", "n0")
    assert t3.rank_of("c2") == ReplicaRank(2, 0, 2)
    assert t3.preferences() == {}


def test_replacement_placed_later_on_its_emptied_node_keeps_its_node_rank():
    """If old's node was left empty, new placed there takes old's node rank back while it is
    free, even when a lower node rank is free, and old's local rank on it."""
    t = build(("a", "n0"), ("b", "n1"), ("x", "n1"), ("c", "n2")).release_many(["a", "x"])  # node rank 0 free
    assert t.rank_of("b") == ReplicaRank(1, 1, 0)
    t2 = t.replace("b", "b2")  # n1 is now empty, node rank 1 free too
    assert t2.nodes() == {"n2": 2}
    t3 = t2.place("b2", "n1")
    assert t3.rank_of("b2") == ReplicaRank(1, 1, 0)
    assert t3.nodes() == {"n1": 1, "n2": 2}
    # a replica that had local rank 1 gets local rank 1 on the emptied node, too
    t = build(("a", "n0"), ("b", "n0")).replace("b", "b2").release("a")
    assert t.place("b2", "n0").rank_of("b2") == ReplicaRank(1, 0, 1)


def test_replacement_preference_yields_to_whoever_took_the_ranks_meanwhile():
    """The preference is taken only where still free; elsewhere, or when taken, the lowest free."""
    t = build(("a", "n0"), ("b", "n0"), ("c", "n1"))
    t2 = t.replace("b", "b2")  # b had ranks (1, 0, 1)
    # someone else took local rank 1 on n0 meanwhile
    taken = t2.assign("d", "n0")
    assert taken.rank_of("d") == ReplicaRank(3, 0, 1)
    assert taken.place("b2", "n0").rank_of("b2") == ReplicaRank(1, 0, 2)
    # placed on another node: the lowest free there
    assert t2.place("b2", "n1").rank_of("b2") == ReplicaRank(1, 1, 1)
    # old's node emptied and its node rank taken by a new node: the lowest free node rank
    t = build(("a", "n0"), ("b", "n1")).replace("a", "a2").assign("z", "n9")
    assert t.node_rank("n9") == 0
    assert t.place("a2", "n0").rank_of("a2") == ReplicaRank(0, 2, 0)


def test_replacement_preference_is_dropped_on_place_or_release_and_passes_on_a_second_crash():
    t = build(("a", "n0"), ("b", "n0"), ("c", "n0")).release("a").replace("c", "c2")
    assert t.release("c2").preferences() == {}
    assert t.release_many(["c2", "b"]).preferences() == {}
    # c2 crashes before it was placed: c3 inherits the preference
    t3 = t.replace("c2", "c3")
    assert t3.preferences() == {"c3": ("n0", 0, 2)}
    assert t3.place("c3", "n0").rank_of("c3") == ReplicaRank(2, 0, 2)
    # placed elsewhere: dropped
    assert t.place("c2", "n5").preferences() == {}
    # replaced straight onto a node: used there, dropped anyway
    t4 = t.replace("c2", "c4", "n0")
    assert t4.rank_of("c4") == ReplicaRank(2, 0, 2) and t4.preferences() == {}


def test_preferences_survive_repr_and_pickle_and_count_in_equality():
    import pickle

    t = build(("a", "n0"), ("b", "n0"), ("c", "n0")).release("a").replace("c", "c2")
    assert eval(repr(t), {"RankTable": RankTable}) == t
    assert "preferences={'c2': ('n0', 0, 2)}" in repr(t)
    assert pickle.loads(pickle.dumps(t)) == t
    # a snapshot alone holds the ranks only: the preference is lost
    bare = RankTable.from_dict(t.to_dict())
    assert bare.to_dict() == t.to_dict() and bare != t
    assert bare.place("c2", "n0").rank_of("c2").local_rank == 0
    assert RankTable.from_dict(t.to_dict(), t.preferences()) == t
    with pytest.raises(InvalidConfig, match="'b'"):
        RankTable.from_dict(t.to_dict(), {"b": ("n0", 0, 0)})


def test_replace_errors_leave_table_unchanged():
    """replace of an unknown old raises UnknownReplica; a new that holds a rank raises RankConflict."""
    t = build(("a", "n0"), ("b", "n1"))
    snap = t.to_dict()
    with pytest.raises(UnknownReplica, match="ghost"):
        t.replace("ghost", "x", "n0")
    with pytest.raises(RankConflict, match="'b'"):
        t.replace("a", "b", "n0")
    assert_unchanged(t, snap)


# ----------------------------------------------------------------- release
def test_release_frees_all_three_levels():
    """release frees the global, local and (if emptied) node rank; the next assigns get them back."""
    t = build(("a", "n0"), ("b", "n1"), ("c", "n1"), ("d", "n0"))
    t2 = t.release("b")
    assert "b" not in t2 and len(t2) == 3
    assert t2.holder_of(1) is None
    assert t2.lowest_free() == 1
    assert t2.replicas_on("n1") == 1
    t3 = t2.assign("e", "n1")
    assert t3.rank_of("e") == ReplicaRank(1, 1, 0)


def test_releasing_last_replica_of_a_node_frees_its_node_rank():
    """Releasing a node's last replica removes the node and frees its node rank."""
    t = build(("a", "n0"), ("b", "n1"), ("c", "n2"))
    t2 = t.release("b")
    assert t2.node_rank("n1") is None
    assert "n1" not in t2.nodes()
    assert t2.nodes() == {"n0": 0, "n2": 2}
    assert t2.assign("d", "n3").node_rank("n3") == 1


def test_release_of_the_top_rank_lowers_next_fresh_rank():
    """Releasing the highest ranks makes the next assign reuse them rather than go above."""
    t = RankTable()
    for i in range(5):
        t = t.assign(f"r{i}")
    t = t.release("r2").release("r4").release("r3")
    assert t.lowest_free() == 2
    t = t.assign("x").assign("y")
    assert (t.global_rank("x"), t.global_rank("y")) == (2, 3)


# ----------------------------------------------------------------- recover
def test_recover_puts_back_reported_ranks():
    """recover / recover_many restore exactly the reported global, node and local ranks."""
    t = RankTable().recover("a", "n0", ReplicaRank(5, 2, 3))
    assert t.rank_of("a") == ReplicaRank(5, 2, 3)
    t = t.recover_many([("b", "n0", ReplicaRank(1, 2, 0)), ("c", "n1", ReplicaRank(0, 0, 0))])
    assert t.to_dict() == {
        "a": (5, "n0", 2, 3),
        "b": (1, "n0", 2, 0),
        "c": (0, "n1", 0, 0),
    }
    assert t.lowest_free() == 2
    assert t.assign("d", "n9").rank_of("d") == ReplicaRank(2, 1, 0)


@pytest.mark.parametrize(
    "base, items, words",
    [
        pytest.param(
            [],
            [("a", "n0", ReplicaRank(1, 0, 0)), ("b", "n1", ReplicaRank(1, 1, 0))],
            ["rank 1", "'a'", "'b'"],
            id="two-replicas-same-rank-in-batch",
        ),
        pytest.param(
            [("a", "n0", ReplicaRank(1, 0, 0))],
            [("b", "n1", ReplicaRank(1, 1, 0))],
            ["rank 1", "'a'", "'b'"],
            id="rank-already-held",
        ),
        pytest.param(
            [],
            [("a", "n0", ReplicaRank(0, 0, 0)), ("b", "n0", ReplicaRank(1, 1, 1))],
            ["'n0'", "'b'", "0", "1"],
            id="node-reported-with-two-node-ranks",
        ),
        pytest.param(
            [],
            [("a", "n0", ReplicaRank(0, 2, 0)), ("b", "n1", ReplicaRank(1, 2, 0))],
            ["node rank 2", "'n0'", "'n1'"],
            id="two-nodes-same-node-rank-in-batch",
        ),
        pytest.param(
            [("a", "n0", ReplicaRank(0, 2, 0))],
            [("b", "n1", ReplicaRank(1, 2, 0))],
            ["node rank 2", "'n0'", "'n1'", "'b'"],
            id="node-rank-held-by-other-node",
        ),
        pytest.param(
            [],
            [("a", "n0", ReplicaRank(0, 0, 1)), ("b", "n0", ReplicaRank(1, 0, 1))],
            ["local rank 1", "'n0'"],
            id="local-rank-twice-in-batch",
        ),
        pytest.param(
            [("a", "n0", ReplicaRank(0, 0, 1))],
            [("b", "n0", ReplicaRank(1, 0, 1))],
            ["local rank 1", "'n0'"],
            id="local-rank-already-held",
        ),
        pytest.param(
            [("a", "n0", ReplicaRank(0, 0, 0))],
            [("a", "n0", ReplicaRank(1, 0, 1))],
            ["'a'"],
            id="replica-already-ranked",
        ),
        pytest.param(
            [],
            [("a", "n0", ReplicaRank(0, 0, 0)), ("a", "n0", ReplicaRank(1, 0, 1))],
            ["'a'"],
            id="replica-twice-in-batch",
        ),
    ],
)
def test_recover_conflicts_raise_and_change_nothing(base, items, words):
    """Every recover conflict raises RankConflict naming rank/replica/node; the table stays as it was."""
    t = RankTable().recover_many(base).assign("u", rank=50)  # "u" holds only a global rank
    snap = t.to_dict()
    with pytest.raises(RankConflict) as info:
        t.recover_many(items)
    for w in words:
        assert w in str(info.value)
    assert_unchanged(t, snap)
    if len(items) == 1:
        with pytest.raises(RankConflict):
            t.recover(*items[0])
        assert_unchanged(t, snap)
    # the table still works normally afterwards
    t2 = t.assign("v", "nz")
    assert t2.global_rank("v") == t.lowest_free()
    assert_unchanged(t, snap)


def test_recover_conflict_after_successful_items_leaves_no_trace():
    """A conflict at the end of a batch discards the earlier, valid items too."""
    t = build(("a", "n0"))
    snap = t.to_dict()
    items = [
        ("b", "n1", ReplicaRank(3, 1, 0)),
        ("c", "n1", ReplicaRank(4, 1, 1)),
        ("d", "n2", ReplicaRank(3, 2, 0)),  # rank 3 claimed twice
    ]
    with pytest.raises(RankConflict, match="rank 3"):
        t.recover_many(items)
    assert_unchanged(t, snap)
    assert t.lowest_free() == 1
    assert t.assign("x", "n1").rank_of("x") == ReplicaRank(1, 1, 0)


def test_recover_rejects_non_replicarank():
    """recover needs a ReplicaRank; anything else is InvalidConfig naming it."""
    t = RankTable()
    with pytest.raises(InvalidConfig, match="'a'"):
        t.recover("a", "n0", 3)


def test_recover_on_existing_node_with_other_node_rank_conflicts():
    """A replica reporting a node rank different from its (existing) node's rank raises RankConflict.

    Regression: up to c653671 the first report for a node already in the table was accepted and
    its node rank silently replaced by the node's (fixed in 4984f54).
    """
    t = build(("a", "n0"))  # n0 has node rank 0
    snap = t.to_dict()
    with pytest.raises(RankConflict) as info:
        t.recover("b", "n0", ReplicaRank(1, 5, 1))
    assert "'n0'" in str(info.value) and "'b'" in str(info.value) and "5" in str(info.value)
    assert_unchanged(t, snap)
    with pytest.raises(RankConflict):
        t.recover_many([("b", "n0", ReplicaRank(1, 5, 1)), ("c", "n0", ReplicaRank(2, 5, 2))])
    assert_unchanged(t, snap)
    assert t.recover("b", "n0", ReplicaRank(1, 0, 1)).rank_of("b") == ReplicaRank(1, 0, 1)


# ----------------------------------------------------------------- compact
def _hole_table():
    """12 replicas over 4 nodes, then releases that leave holes at all three levels."""
    t = RankTable()
    nodes = ["n0", "n1", "n2", "n3"]
    for i in range(12):
        t = t.assign(f"r{i}", nodes[i % 4])
    # n1 loses everything (node rank 1 becomes a hole); holes in global and local ranks
    return t.release_many(["r1", "r5", "r9", "r2", "r4"])


def test_compact_makes_all_levels_contiguous():
    """After releases, compact() leaves global, node and local ranks each 0..count-1."""
    t = _hole_table()
    assert not t.is_contiguous()
    assert not contiguous_levels(t)
    t2, _changes = t.compact()
    assert contiguous_levels(t2)
    assert t2.is_contiguous()
    assert t2.lower_bound() == LowerBound(0, 0, 0, 0)
    assert len(t2) == len(t)
    assert set(t2) == set(t)
    # the nodes are kept, only renumbered
    assert {rep: t2.node_of(rep) for rep in t2} == {rep: t.node_of(rep) for rep in t}


def test_compact_changes_exactly_the_lower_bound():
    """The number of changed replicas and the per-level changes equal lower_bound()."""
    t = _hole_table()
    lb = t.lower_bound()
    t2, changes = t.compact()
    before, after = t.to_dict(), t2.to_dict()
    changed = {rep for rep in before if before[rep] != after[rep]}
    # only the rank tuple may change, never the node
    assert set(changes.replicas()) == changed
    assert len(changes) == lb.replicas == len(changed)
    assert lb.rank == sum(before[r][0] != after[r][0] for r in before)
    assert lb.node_rank == sum(before[r][2] != after[r][2] for r in before)
    assert lb.local_rank == sum(before[r][3] != after[r][3] for r in before)
    assert (lb.rank, lb.node_rank, lb.local_rank) != (0, 0, 0)
    assert lb.node_rank > 0 and lb.local_rank > 0 and lb.rank > 0
    for ch in changes:
        assert isinstance(ch, Reassignment)
        assert ch.old == ReplicaRank(before[ch.replica][0], before[ch.replica][2], before[ch.replica][3])
        assert ch.new == t2.rank_of(ch.replica)
    new_ranks = [ch.new.rank for ch in changes]
    assert new_ranks == sorted(new_ranks)


def test_compact_keeps_ranks_below_the_new_count():
    """Replicas whose global rank is below the replica count keep it; only those above move."""
    t = RankTable()
    for i in range(8):
        t = t.assign(f"r{i}", "n0")
    t = t.release_many(["r1", "r3", "r6"])  # 5 left: ranks 0,2,4,5,7
    t2, _ = t.compact()
    for rep, r in ranks(t).items():
        if r < len(t):
            assert t2.global_rank(rep) == r
        else:
            assert t2.global_rank(rep) < len(t)
    assert sorted(ranks(t2).values()) == list(range(5))


def test_compact_moves_lowest_old_rank_into_lowest_hole_first():
    """Movers go, lowest old rank first, into the holes, lowest hole first (at every level)."""
    t = RankTable()
    for i in range(8):
        t = t.assign(f"r{i}", "n0")
    t = t.release_many(["r1", "r3", "r6"])  # holes 1,3; movers 5 (r5), 7 (r7)
    t2, changes = t.compact()
    assert t2.rank_of("r5") == ReplicaRank(1, 0, 1)
    assert t2.rank_of("r7") == ReplicaRank(3, 0, 3)
    assert list(changes) == [
        Reassignment("r5", ReplicaRank(5, 0, 5), ReplicaRank(1, 0, 1)),
        Reassignment("r7", ReplicaRank(7, 0, 7), ReplicaRank(3, 0, 3)),
    ]
    assert changes == [
        Reassignment("r5", ReplicaRank(5, 0, 5), ReplicaRank(1, 0, 1)),
        Reassignment("r7", ReplicaRank(7, 0, 7), ReplicaRank(3, 0, 3)),
    ]
    assert changes[1].replica == "r7"
    assert changes[0:1] == (changes[0],)
    assert changes.replicas() == ("r5", "r7")


def test_compact_node_ranks_lowest_old_first():
    """Node ranks >= node count move into the node-rank holes, lowest old node rank first."""
    t = build(*[(f"r{i}", f"n{i}") for i in range(6)])
    t = t.release_many(["r0", "r2"])  # nodes n1,n3,n4,n5 with node ranks 1,3,4,5
    t2, changes = t.compact()
    assert t2.nodes() == {"n1": 1, "n3": 3, "n4": 0, "n5": 2}
    # global ranks: 4 replicas, ranks 1,3,4,5 -> r4 to 0, r5 to 2
    assert t2.rank_of("r4") == ReplicaRank(0, 0, 0)
    assert t2.rank_of("r5") == ReplicaRank(2, 2, 0)
    assert t2.rank_of("r1") == ReplicaRank(1, 1, 0)
    assert [ch.replica for ch in changes] == ["r4", "r5"]


def test_after_compaction_next_assign_continues_the_contiguous_ranks():
    """After a compaction the next replica gets rank n, a new node node rank k, and local ranks continue."""
    t = build(("a", "n0"), ("b", "n1"), ("c", "n2"), ("d", "n3"), ("e", "n3"))
    t = t.release_many(["a", "c", "d"])  # n1 (node rank 1) and n3 (node rank 3) remain
    t2, _ = t.compact()
    assert t2.nodes() == {"n1": 1, "n3": 0}
    t3 = t2.assign("f", "n9")
    assert t3.rank_of("f") == ReplicaRank(2, 2, 0)
    t4 = t3.assign("g", "n3")
    assert t4.rank_of("g") == ReplicaRank(3, 0, 1)
    t5 = t2.assign_many([("h", "n8"), ("i", "n7"), ("j", "n3")])
    assert [t5.rank_of(r) for r in "hij"] == [ReplicaRank(2, 2, 0), ReplicaRank(3, 3, 0), ReplicaRank(4, 0, 1)]


def test_after_compaction_freed_ranks_are_found_in_the_filled_holes():
    """After compaction moved replicas into holes, releasing one of them frees exactly its new rank."""
    t = build(*[(f"r{i}", "n0") for i in range(6)]).release_many(["r1", "r2"])
    t2, _ = t.compact()  # r4 -> 1, r5 -> 2
    assert ranks(t2) == {"r0": 0, "r3": 3, "r4": 1, "r5": 2}
    t3 = t2.release("r5")  # frees 2 (not 5)
    assert t3.lowest_free() == 2
    t4 = t3.assign("x", "n0")
    assert t4.rank_of("x") == ReplicaRank(2, 0, 2)
    assert t4.holder_of(1) == "r4"
    t5 = t2.release_many(["r0", "r4"]).assign_many([("y", None), ("z", None), ("w", None)])
    assert ranks(t5) == {"r3": 3, "r5": 2, "y": 0, "z": 1, "w": 4}


def test_compact_node_rank_change_counts_every_replica_on_the_node():
    """A node whose rank changes changes every replica placed on it (each counted once)."""
    t = build(("a", "n0"), ("b", "n1"), ("c", "n1"), ("d", "n1"))
    t = t.release("a")  # n1 keeps node rank 1 with one node -> must become 0
    lb = t.lower_bound()
    assert lb.node_rank == 3
    t2, changes = t.compact()
    assert t2.nodes() == {"n1": 0}
    assert len(changes) == lb.replicas == 3
    # global level: ranks {1, 2, 3} for 3 replicas -> only d (rank 3) moves, into hole 0
    assert {ch.replica: ch.new for ch in changes} == {
        "b": ReplicaRank(1, 0, 0),
        "c": ReplicaRank(2, 0, 1),
        "d": ReplicaRank(0, 0, 2),
    }
    assert changes.replicas() == ("d", "b", "c")  # ordered by new global rank
    assert {ch.replica: ch.old for ch in changes} == {
        "b": ReplicaRank(1, 1, 0),
        "c": ReplicaRank(2, 1, 1),
        "d": ReplicaRank(3, 1, 2),
    }


def test_compact_local_ranks_only():
    """When only local ranks have holes, only replicas with local >= count on that node move."""
    t = build(("a", "n0"), ("b", "n1"), ("c", "n0"), ("d", "n0"))
    t = t.replace("c", "c2", "n1")  # n0 locals {0, 2}; n1 locals {0, 1}
    lb = t.lower_bound()
    assert lb == LowerBound(rank=0, node_rank=0, local_rank=1, replicas=1)
    t2, changes = t.compact()
    assert list(changes) == [Reassignment("d", ReplicaRank(3, 0, 2), ReplicaRank(3, 0, 1))]
    assert t2.is_contiguous()


def test_is_contiguous_follows_every_level():
    """is_contiguous() is False exactly while some level (global, node, local) has a hole."""
    t = build(("a", "n0"), ("b", "n1"), ("c", "n0"), ("d", "n1"))
    assert t.is_contiguous()
    assert not t.release("b").is_contiguous()  # global hole at 1, local hole on n1
    assert t.release("d").is_contiguous()  # the top of every level
    assert not t.release("a").is_contiguous()  # global hole 0 and local hole 0 on n0
    two_nodes = build(("a", "n0"), ("b", "n1"), ("c", "n2"))
    assert not two_nodes.release_many(["a"]).replace("b", "b2", "n2").assign("x", rank=0).is_contiguous()
    assert two_nodes.replace("c", "c2", "n2").is_contiguous()
    # only a local hole: n0 has locals {0, 2}
    local_only = build(("a", "n0"), ("b", "n0"), ("c", "n0")).replace("b", "b2", "n1")
    assert local_only.lower_bound() == LowerBound(rank=0, node_rank=0, local_rank=1, replicas=1)
    assert not local_only.is_contiguous()
    # only a node hole: nodes n1 (rank 1) and global ranks 0
    node_only = build(("a", "n0"), ("b", "n1")).replace("a", "a2", "n1")
    assert node_only.lower_bound() == LowerBound(rank=0, node_rank=2, local_rank=0, replicas=2)
    assert not node_only.is_contiguous()
    for table in (local_only, node_only, t.release("a")):
        assert table.compact()[0].is_contiguous()
    # an unplaced replica counts at global level only
    assert RankTable().assign("u").assign("v").is_contiguous()
    assert not RankTable().assign("u", rank=1).is_contiguous()


def test_compact_of_contiguous_table_changes_nothing():
    """compact() of a contiguous table returns an equal table and no reassignments."""
    t = build(("a", "n0"), ("b", "n1"), ("c", "n0"))
    assert t.is_contiguous()
    t2, changes = t.compact()
    assert t2 == t and t2.to_dict() == t.to_dict()
    assert len(changes) == 0 and list(changes) == []
    t3, changes3 = RankTable().compact(active=[])
    assert len(t3) == 0 and len(changes3) == 0


def test_compact_with_wrong_active_set_raises_and_changes_nothing():
    """compact(active=...) differing from the table raises InvariantViolation naming the mismatch."""
    t = _hole_table()
    snap = t.to_dict()
    reps = list(t)
    with pytest.raises(InvariantViolation, match="'r0'"):
        t.compact(active=[r for r in reps if r != "r0"])
    assert_unchanged(t, snap)
    with pytest.raises(InvariantViolation, match="'zz'"):
        t.compact(active=reps + ["zz"])
    assert_unchanged(t, snap)
    t2, changes = t.compact(active=reversed(reps))
    assert t2.is_contiguous() and len(changes) == t.lower_bound().replicas
    assert_unchanged(t, snap)


def test_compact_with_unplaced_replica_raises():
    """compact() while a replica holds only a global rank raises InvariantViolation naming it."""
    t = build(("a", "n0"), ("b", "n0")).release("a").assign("u", rank=5)
    snap = t.to_dict()
    with pytest.raises(InvariantViolation, match="'u'"):
        t.compact()
    assert_unchanged(t, snap)


def test_ray_serve_downscale_seed_example():
    """4 replicas with ranks 0..3, remove rank 1, compact: ranks {0,1,2}, only rank 3 -> 1 changes."""
    t = build(("r0", "n0"), ("r1", "n0"), ("r2", "n0"), ("r3", "n0"))
    assert sorted(ranks(t).values()) == [0, 1, 2, 3]
    t = t.release("r1")
    assert t.lower_bound().replicas == 1
    t2, changes = t.compact()
    assert sorted(ranks(t2).values()) == [0, 1, 2]
    assert ranks(t2) == {"r0": 0, "r2": 2, "r3": 1}
    assert list(changes) == [Reassignment("r3", ReplicaRank(3, 0, 3), ReplicaRank(1, 0, 1))]
    # the next scale-up takes rank 3 again
    assert t2.assign("r4", "n0").rank_of("r4") == ReplicaRank(3, 0, 3)


def test_compact_large_table_with_scattered_holes():
    """A compaction across many bitmap words is contiguous, minimal, and refills lowest-first afterwards."""
    t = RankTable().assign_many([(f"r{i}", f"n{i % 7}") for i in range(5000)])
    rng = random.Random(7)
    gone = rng.sample(range(5000), 1500)
    t = t.release_many([f"r{i}" for i in gone])
    lb = t.lower_bound()
    t2, changes = t.compact()
    assert contiguous_levels(t2)
    assert len(changes) == lb.replicas
    assert t2.lowest_free() == 3500
    t3 = t2.assign("x")
    assert t3.global_rank("x") == 3500


# ------------------------------------------------------- bulk vs single ops
def _assign_loop(t, pairs):
    for rep, node in pairs:
        t = t.assign(rep, node)
    return t


@pytest.mark.parametrize("with_holes", [False, True])
def test_assign_many_equals_a_loop_of_assign(with_holes):
    """assign_many gives exactly the same to_dict() as assign() in a loop, also with holes below the top."""
    base = build(*[(f"b{i}", f"n{i % 3}") for i in range(10)])
    if with_holes:
        base = base.release_many(["b1", "b4", "b5", "b6"])  # n1 loses b1, b4 -> still has b7
        base = base.release("b7")  # n1 emptied, node rank 1 freed
    pairs = [("x0", "n2"), ("x1", None), ("x2", "n9"), ("x3", "n1"), ("x4", "n9"), ("x5", "n0"), ("x6", None)]
    bulk = base.assign_many(pairs)
    loop = _assign_loop(base, pairs)
    assert bulk.to_dict() == loop.to_dict()
    assert bulk == loop
    assert bulk.lowest_free() == loop.lowest_free()
    assert bulk.nodes() == loop.nodes()
    # and they stay equal as they keep growing
    more = [(f"y{i}", f"n{i % 5}") for i in range(6)]
    assert bulk.assign_many(more).to_dict() == _assign_loop(loop, more).to_dict()
    # mapping form
    assert base.assign_many(dict(pairs)).to_dict() == loop.to_dict()


def test_assign_many_equals_loop_across_word_boundaries():
    """assign_many filling holes around 64-rank word boundaries matches a loop of assign()."""
    base = RankTable().assign_many([(f"b{i}", None) for i in range(300)])
    base = base.release_many([f"b{i}" for i in (0, 62, 63, 64, 65, 127, 128, 299, 298)])
    pairs = [(f"x{i}", None if i % 2 else f"n{i % 3}") for i in range(20)]
    assert base.assign_many(pairs).to_dict() == _assign_loop(base, pairs).to_dict()


def test_release_many_equals_a_loop_of_release():
    """release_many gives exactly the same to_dict() as release() in a loop, including emptied nodes."""
    base = build(*[(f"b{i}", f"n{i % 4}") for i in range(12)]).assign("u")
    gone = ["b1", "b5", "b9", "b11", "u", "b0"]
    bulk = base.release_many(gone)
    loop = base
    for rep in gone:
        loop = loop.release(rep)
    assert bulk.to_dict() == loop.to_dict()
    assert bulk.nodes() == loop.nodes()
    assert bulk.lowest_free() == loop.lowest_free() == 0
    nxt = [("x0", "n7"), ("x1", None), ("x2", "n8")]
    assert bulk.assign_many(nxt).to_dict() == _assign_loop(loop, nxt).to_dict()


def test_bulk_errors_change_nothing():
    """assign_many/release_many reject duplicates and unknown/ranked replicas without changing the table."""
    t = build(("a", "n0"), ("b", "n1"))
    snap = t.to_dict()
    with pytest.raises(RankConflict):
        t.assign_many([("x", "n0"), ("x", "n1")])
    with pytest.raises(RankConflict, match="'a'"):
        t.assign_many([("x", "n0"), ("a", "n1")])
    with pytest.raises(InvalidConfig):
        t.release_many(["a", "a"])
    with pytest.raises(UnknownReplica, match="ghost"):
        t.release_many(["a", "ghost"])
    assert_unchanged(t, snap)
    assert t.assign_many([]) is t and t.release_many([]) is t


# ------------------------------------------------------------- persistence
def test_old_version_is_unchanged_after_assign():
    """After t2 = t1.assign(...), t1 reads exactly as before (to_dict, len, rank_of, holder_of)."""
    t1 = build(("a", "n0"), ("b", "n1"))
    snap = t1.to_dict()
    t2 = t1.assign("c", "n0")
    assert_unchanged(t1, snap)
    assert "c" not in t1
    with pytest.raises(UnknownReplica):
        t1.rank_of("c")
    assert t1.holder_of(2) is None
    assert len(t1) == 2 and len(t2) == 3
    assert t2.rank_of("c") == ReplicaRank(2, 0, 1)
    # and the new version is still right after reading the old one
    assert t2.to_dict()["c"] == (2, "n0", 0, 1)


def test_many_versions_read_correctly_in_any_order():
    """Reading many versions in shuffled order (branching included) always gives each its own content."""
    rng = random.Random(1234)
    versions = [RankTable()]
    for i in range(40):
        base = versions[rng.randrange(len(versions))] if i % 3 == 0 else versions[-1]
        op = rng.randrange(6)
        live = list(base)
        if op == 0 or not live:
            t = base.assign(f"r{i}", rng.choice(["n0", "n1", "n2", None]))
        elif op == 1:
            t = base.release(rng.choice(live))
        elif op == 2:
            victim = rng.choice(live)
            t = base.replace(victim, f"r{i}", rng.choice([base.node_of(victim), "n3", None]))
        elif op == 3:
            t = base.assign_many([(f"r{i}a", "n1"), (f"r{i}b", None)])
        elif op == 4:
            t = base.release_many(rng.sample(live, min(2, len(live))))
        else:
            unplaced = [r for r in live if not base.is_placed(r)]
            t = base.place(unplaced[0], "n2") if unplaced else base.assign(f"r{i}")
        versions.append(t)
    expected = []
    for v in versions:
        expected.append((v.to_dict(), len(v), {r: v.holder_of(r) for r in range(20)}))
    order = list(range(len(versions)))
    for _ in range(5):
        rng.shuffle(order)
        for i in order:
            snap, n, holders = expected[i]
            v = versions[i]
            assert v.to_dict() == snap, i
            assert len(v) == n
            assert {r: v.holder_of(r) for r in range(20)} == holders
            for rep, (r, node, nr, local) in snap.items():
                assert v.global_rank(rep) == r
                assert v.rank_of(rep) == (None if node is None else ReplicaRank(r, nr, local))


def test_interleaved_versions_t1_t5_t2_t9():
    """Alternating reads and writes on versions t1, t5, t2, t9 keep each one's content."""
    ts = [RankTable()]
    for i in range(10):
        ts.append(ts[-1].assign(f"r{i}", f"n{i % 2}"))
    snaps = [t.to_dict() for t in ts]
    for i in [1, 5, 2, 9, 1, 10, 0, 5]:
        assert ts[i].to_dict() == snaps[i]
        assert len(ts[i]) == i
    b = ts[2].release("r0")  # branch off t2
    c = ts[9].assign("z", "n5")  # branch off t9
    assert ts[2].to_dict() == snaps[2]
    assert b.to_dict() == {"r1": (1, "n1", 1, 0)}
    assert c.rank_of("z") == ReplicaRank(9, 2, 0)
    assert ts[9].to_dict() == snaps[9]
    assert b.assign("q", "n1").rank_of("q") == ReplicaRank(0, 1, 1)
    assert c.global_rank("z") == 9


def test_exceptions_leave_the_table_unchanged():
    """Rejected operations (RankConflict, InvariantViolation, UnknownReplica) leave the table as it was."""
    t = build(("a", "n0"), ("b", "n1"), ("c", "n1")).release("b")
    snap = t.to_dict()
    with pytest.raises(RankConflict):
        t.assign("a", "n0")
    with pytest.raises(RankConflict):
        t.assign("x", rank=2)
    with pytest.raises(InvariantViolation):
        t.compact(active=["a"])
    with pytest.raises(UnknownReplica):
        t.release("b")
    with pytest.raises(RankConflict):
        t.recover("d", "n0", ReplicaRank(0, 0, 1))
    assert_unchanged(t, snap)
    assert t.lowest_free() == 1
    assert t.assign("x", "n1").rank_of("x") == ReplicaRank(1, 1, 0)  # c holds local 1 on n1


@pytest.mark.parametrize(
    "op",
    [
        pytest.param(lambda t: t.assign("b", ["unhashable"]), id="assign"),
        pytest.param(lambda t: t.assign("b", ["unhashable"], rank=9), id="assign-explicit-rank"),
        pytest.param(lambda t: t.replace("a", "c", ["unhashable"]), id="replace-other-node"),
        pytest.param(lambda t: t.replace("u", "c", ["unhashable"]), id="replace-unplaced"),
        pytest.param(lambda t: t.place("u", ["unhashable"]), id="place"),
        pytest.param(lambda t: t.assign_many([("b", "n0"), ("c", ["unhashable"])]), id="assign_many"),
        pytest.param(lambda t: t.recover("b", ["unhashable"], ReplicaRank(5, 1, 0)), id="recover"),
        pytest.param(lambda t: t.release_many(["a", ["unhashable"]]), id="release_many"),
        pytest.param(lambda t: t.compact(active=[["unhashable"]]), id="compact"),
    ],
)
def test_failure_half_way_through_a_mutator_leaves_table_unchanged(op):
    """An exception raised after a mutator started writing (TypeError: unhashable node) leaves the table as it was.

    Regression: up to c653671 assign/replace wrote owner/bitmap entries before the node lookup
    failed and never aborted the edit, corrupting the base version (fixed in 4984f54).
    """
    t = build(("a", "n0"), ("d", "n1")).assign("u")
    snap = t.to_dict()
    with pytest.raises(TypeError):
        op(t)
    assert_unchanged(t, snap)
    assert t.holder_of(3) is None and t.lowest_free() == 3
    assert t.is_contiguous()
    assert t.assign("b", "n2").rank_of("b") == ReplicaRank(3, 2, 0)
    assert t.replace("a", "c", "n1").rank_of("c") == ReplicaRank(0, 1, 1)
    assert_unchanged(t, snap)


# ------------------------------------------------------------ ReportedRank
def test_reported_rank_parse_accepts_rank_records_ints_and_dicts():
    """ReportedRank.parse accepts ReplicaRank, ReportedRank, int and dicts with optional node/local rank."""
    assert ReportedRank.parse(ReplicaRank(3, 1, 2)) == ReportedRank(3, 1, 2)
    rr = ReportedRank(4, None, 1)
    assert ReportedRank.parse(rr) is rr
    assert ReportedRank.parse(7) == ReportedRank(7, None, None)
    assert ReportedRank.parse(0) == ReportedRank(0)
    assert ReportedRank.parse({"rank": 2}) == ReportedRank(2, None, None)
    assert ReportedRank.parse({"rank": 2, "node_rank": 1}) == ReportedRank(2, 1, None)
    assert ReportedRank.parse({"rank": 2, "local_rank": 0}) == ReportedRank(2, None, 0)
    assert ReportedRank.parse({"rank": 2, "node_rank": 1, "local_rank": 3}) == ReportedRank(2, 1, 3)


@pytest.mark.parametrize(
    "value, fragment",
    [
        pytest.param("3", "'3'", id="str"),
        pytest.param(3.0, "3.0", id="float"),
        pytest.param(None, "None", id="none"),
        pytest.param({"node_rank": 1}, "node_rank", id="dict-without-rank"),
        pytest.param({"rank": 1, "color": 2}, "color", id="dict-unknown-key"),
        pytest.param(-1, "-1", id="negative-int"),
        pytest.param(True, "True", id="bool"),
        pytest.param({"rank": -2}, "-2", id="dict-negative-rank"),
        pytest.param({"rank": 1, "node_rank": "x"}, "'x'", id="dict-bad-node-rank"),
        pytest.param({"rank": True}, "True", id="dict-bool-rank"),
    ],
)
def test_reported_rank_parse_rejects_other_values(value, fragment):
    """ReportedRank.parse raises InvalidConfig naming the offending value for anything else."""
    with pytest.raises(InvalidConfig) as info:
        ReportedRank.parse(value)
    assert fragment in str(info.value)


def test_replica_rank_validates_fields():
    """ReplicaRank rejects negative, bool and non-int fields with InvalidConfig naming field and value."""
    with pytest.raises(InvalidConfig, match=r"rank.*-1"):
        ReplicaRank(-1, 0, 0)
    with pytest.raises(InvalidConfig, match=r"node_rank.*True"):
        ReplicaRank(0, True, 0)
    with pytest.raises(InvalidConfig, match=r"local_rank.*'2'"):
        ReplicaRank(0, 0, "2")
    assert ReplicaRank(1, 2, 3).as_tuple() == (1, 2, 3)


# -------------------------------------------------------------------- repr
@pytest.mark.parametrize(
    "table",
    [
        pytest.param(RankTable(), id="empty"),
        pytest.param(build(("a", "n0"), ("b", "n1"), ("c", "n0")), id="placed"),
        pytest.param(build(("a", "n0"), ("b", "n1"), ("c", "n0")).release("a").assign("u", rank=7), id="holes-and-unplaced"),
        pytest.param(RankTable().recover_many([((1, "x"), ("host", 2), ReplicaRank(4, 3, 2))]), id="tuple-ids"),
    ],
)
def test_repr_is_valid_python(table):
    """eval(repr(t)) rebuilds an equal table (same to_dict, same next assignment)."""
    again = eval(repr(table), {"RankTable": RankTable})
    assert again == table
    assert again.to_dict() == table.to_dict()
    assert repr(again) == repr(table)
    assert hash(again) == hash(table)
    assert again.lowest_free() == table.lowest_free()
    assert again.assign("new", "n0").to_dict() == table.assign("new", "n0").to_dict()


def test_tables_with_different_content_are_not_equal():
    """Equality compares content: different ranks or nodes make tables unequal."""
    a = build(("a", "n0"), ("b", "n1"))
    assert a != build(("a", "n0"), ("b", "n0"))
    assert a != build(("b", "n0"), ("a", "n1"))
    assert a != a.assign("c")
    assert a == build(("a", "n0"), ("b", "n1"))
    assert (a == "not a table") is False


# ------------------------------------------------------------------ errors
def test_unknown_replica_errors_name_the_replica():
    """release / rank_of / global_rank / node_of of an unknown replica raise UnknownReplica naming it."""
    t = build(("a", "n0"))
    for call in (t.release, t.rank_of, t.global_rank, t.node_of, t.is_placed):
        with pytest.raises(UnknownReplica) as info:
            call("ghost-7")
        assert "ghost-7" in str(info.value)
    assert isinstance(info.value, KeyError)


def test_assign_of_taken_rank_raises_rank_conflict():
    """assign(rank=k) when k is held raises RankConflict naming k and its holder."""
    t = build(("a", "n0"), ("b", "n0"))
    with pytest.raises(RankConflict) as info:
        t.assign("c", rank=1)
    assert "1" in str(info.value) and "'b'" in str(info.value)


def test_assign_of_existing_replica_raises_rank_conflict():
    """assign of a replica that already holds a rank raises RankConflict naming it."""
    t = build(("a", "n0"))
    with pytest.raises(RankConflict, match="'a'"):
        t.assign("a")


@pytest.mark.parametrize("bad", [-1, True, 1.0, "2", 2**40])
def test_assign_of_invalid_rank_raises_invalid_config(bad):
    """assign(rank=...) outside non-negative ints in range raises InvalidConfig naming the value."""
    t = build(("a", "n0"))
    snap = t.to_dict()
    with pytest.raises(InvalidConfig) as info:
        t.assign("c", rank=bad)
    assert repr(bad) in str(info.value)
    assert_unchanged(t, snap)


def test_reassignments_default_is_empty_sequence():
    """An empty Reassignments is an empty sequence equal to []."""
    r = Reassignments()
    assert len(r) == 0 and list(r) == [] and r == [] and r.replicas() == ()


def test_a_table_and_a_state_survive_pickling_version_by_version():
    """A State (and its RankTables) can be pickled (sent to another process,
    saved): each version alone, equal to the original, still usable."""
    import pickle

    import rankcore as rc

    t0 = RankTable()
    t1 = t0.assign_many([("a", "n0"), ("b", "n0"), ("c", "n1")])
    t2 = t1.release("b")
    for t in (t0, t1, t2):
        back = pickle.loads(pickle.dumps(t))
        assert back == t and dict(back.items()) == dict(t.items())
    back = pickle.loads(pickle.dumps(t1))
    t3 = back.assign("d", "n1")  # the copy is a working table of its own
    assert back.global_rank("c") == 2 and t3.global_rank("d") == 3
    assert t1.global_rank("b") == 1  # the original is untouched
    state = rc.step(rc.State(), rc.DeploymentApplied(name="llm", num_replicas=3)).state
    again = pickle.loads(pickle.dumps(state))
    assert again == state
    assert rc.step(again, rc.ScaleRequested(deployment="llm", num_replicas=1)).commands
