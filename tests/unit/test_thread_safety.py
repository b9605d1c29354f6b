"""Every version of a RankTable may be read and derived from by many threads at
once (issue 8, point 2): rerooting writes the shared store, so it runs under
the store's lock. Before the lock, nine threads on nine versions of one table
raised KeyError or read wrong ranks within a second."""

from __future__ import annotations

import random
import sys
import threading
import time

import rankcore as rc
from rankcore.base.ranks import RankTable

N, NODES, THREADS, SECONDS = 10_000, 125, 8, 3.0


def _versions() -> list[RankTable]:
    """Eight versions of one table (one store), each a different branch from the base."""
    base = RankTable().assign_many([(f"r{i}", f"n{i % NODES}") for i in range(N)])
    out = []
    for k in range(THREADS):
        rng = random.Random(k)
        gone = rng.sample(range(N), 50 + 10 * k)
        v = base.release_many([f"r{i}" for i in gone])
        crashed = f"r{next(i for i in range(k, N) if i not in gone)}"
        v = v.replace(crashed, f"k{k}-{crashed}", v.node_of(crashed))
        out.append(v.assign(f"extra{k}", f"n{k}"))
    return out


def _derive(v: RankTable, k: int) -> tuple:
    """What a thread computes from its version: new versions and reads of them."""
    a = v.assign(f"new{k}", f"n{(k * 7) % NODES}")
    b = a.replace(f"new{k}", f"again{k}")
    c, changes = v.compact()
    return (
        a.rank_of(f"new{k}"),
        b.preferences(),
        b.place(f"again{k}", f"n{(k * 7) % NODES}").rank_of(f"again{k}"),
        len(changes),
        c.is_contiguous(),
        v.lower_bound(),
        sorted(v.nodes().items())[:5],
    )


def test_eight_threads_each_on_its_own_version_of_one_table_read_what_one_thread_reads():
    versions = _versions()
    # everything single-threaded first: the expected reads
    snaps = [v.to_dict() for v in versions]
    derived = [_derive(v, k) for k, v in enumerate(versions)]
    errors: list[str] = []
    counts = [0] * THREADS
    start = threading.Barrier(THREADS)

    def work(k: int) -> None:
        v, snap, rng = versions[k], snaps[k], random.Random(100 + k)
        names = list(snap)
        start.wait()
        deadline = time.monotonic() + SECONDS
        try:
            while time.monotonic() < deadline:
                for rep in rng.sample(names, 20):
                    r, node, nr, local = snap[rep]
                    got = v.rank_of(rep)
                    if v.node_of(rep) != node or got is None or (got.rank, got.node_rank, got.local_rank) != (r, nr, local):
                        errors.append(f"thread {k}: {rep} read {got} on {v.node_of(rep)}, expected {snap[rep]}")
                if _derive(v, k) != derived[k]:
                    errors.append(f"thread {k}: derived versions read differently")
                if counts[k] % 10 == 0 and v.to_dict() != snap:
                    errors.append(f"thread {k}: to_dict differs from the snapshot")
                counts[k] += 1
        except Exception as exc:  # a KeyError from a half-rerooted store, say
            errors.append(f"thread {k}: {type(exc).__name__}: {exc}")

    old = sys.getswitchinterval()
    sys.setswitchinterval(1e-5)  # switch threads often: interleave reroots as much as possible
    try:
        threads = [threading.Thread(target=work, args=(k,)) for k in range(THREADS)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
    finally:
        sys.setswitchinterval(old)
    assert not errors, errors[:5]
    assert all(c >= 3 for c in counts), counts  # every thread really ran
    assert [v.to_dict() for v in versions] == snaps


def test_states_from_one_history_step_safely_from_several_threads():
    """The same holds through rankcore.step: each thread steps its own branch of one State."""
    s = rc.State()
    r = rc.step(s, rc.DeploymentApplied(name="app", num_replicas=200))
    s = r.state
    for i in range(200):
        s = rc.step(s, rc.ReplicaPlaced(replica_id=f"app#{i}", node_id=f"n{i % 9}")).state
        s = rc.step(s, rc.ReplicaReady(replica_id=f"app#{i}")).state
    events = [[rc.ReplicaCrashed(replica_id=f"app#{k * 20 + j}") for j in range(10)] for k in range(THREADS)]

    def run(k: int) -> list:
        st, out = s, []
        for ev in events[k]:
            res = rc.step(st, ev)
            st = res.state
            out.append((res.commands, sorted(st.ranks("app").items())))
        return out

    expected = [run(k) for k in range(THREADS)]
    got: list = [None] * THREADS
    errors: list[str] = []

    def work(k: int) -> None:
        try:
            for _ in range(5):
                got[k] = run(k)
                if got[k] != expected[k]:
                    errors.append(f"thread {k}: different commands or ranks")
        except Exception as exc:
            errors.append(f"thread {k}: {type(exc).__name__}: {exc}")

    threads = [threading.Thread(target=work, args=(k,)) for k in range(THREADS)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors, errors[:5]
    assert got == expected
