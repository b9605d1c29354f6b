"""What a big state costs the cyclic garbage collector, and per-event work that
must not grow with the number of replicas (issue 8, point 3).

A dict that holds only ints and strings is never tracked by the collector; one
tuple (or record) inside it makes every collection traverse all its entries,
and inserting a fresh tuple re-tracks a dict a full collection had untracked.
"""

from __future__ import annotations

import gc
import random
import time

from rankcore.base.ranks import RankTable, ReplicaRank


def _tracked_tables(t: RankTable) -> list[int]:
    return [i for i, d in enumerate(t._read()) if gc.is_tracked(d)]


def test_rank_table_dicts_are_never_gc_tracked():
    """Every operation leaves the table's dicts holding only ints and the caller's ids."""
    rng = random.Random(0)
    t = RankTable().assign_many([(f"r{i}", f"n{i % 5}") for i in range(40)])
    assert _tracked_tables(t) == []
    steps = [
        lambda t: t.assign("x", "n9"),
        lambda t: t.assign("y"),
        lambda t: t.place("y", "n1"),
        lambda t: t.replace("r3", "r3b", "n3"),  # same node
        lambda t: t.replace("r4", "r4b", "n0"),  # other node
        lambda t: t.replace("r5", "r5b"),  # unplaced
        lambda t: t.place("r5b", "n7"),
        lambda t: t.release("r7"),
        lambda t: t.release_many(rng.sample([r for r in t if r.startswith("r")], 10)),
        lambda t: t.compact()[0],
        lambda t: t.recover_many([("z", "n20", ReplicaRank(rank=500, node_rank=40, local_rank=3))]),
        lambda t: t.assign_many([(f"g{i}", f"n{i % 30}") for i in range(30)]),
        lambda t: t.release_many(["z"]).compact()[0],
    ]
    for i, op in enumerate(steps):
        t = op(t)
        assert _tracked_tables(t) == [], f"after step {i}"
    assert t.is_contiguous()


def _best(fn, repeats: int = 7) -> float:
    best = float("inf")
    for _ in range(repeats):
        t0 = time.process_time()
        fn()
        best = min(best, time.process_time() - t0)
    return best


def _one_hole(n: int) -> RankTable:
    """n replicas, eight per node, and one released from the middle (a downscale by one)."""
    t = RankTable().assign_many([(f"r{i}", f"n{i % (n // 8)}") for i in range(n)])
    return t.release(f"r{n // 3}")


def test_compaction_after_one_release_costs_the_same_at_any_size():
    """A ReplicaStopped that compacts calls lower_bound() and compact(): both cost
    O(what changes), not O(replicas) (it was ~100x from 2k to 200k replicas)."""
    small, big = _one_hole(2_000), _one_hole(200_000)
    for t in (small, big):
        assert t.lower_bound().replicas == 2  # the top rank moves down; a local rank too
        c, changes = t.compact()
        assert c.is_contiguous() and len(changes) == 2

    def work(t: RankTable):
        return lambda: (t.lower_bound(), t.compact())

    ratio = _best(work(big)) / _best(work(small))
    assert ratio < 5, f"compaction at 200k costs {ratio:.1f}x what it costs at 2k"
