"""Stateful property test: ``RankTable`` against a tiny, obviously-correct reference model.

The reference keeps four plain dicts (replica -> global rank, replica -> node,
node -> node rank, replica -> local rank) and finds the lowest free rank by
scanning. Every version of the table is kept with the reference snapshot taken
when it was made; "time travel" rules check old versions and branch from them.
"""

from __future__ import annotations

import copy

from hypothesis import event, note
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, precondition, rule

from rankcore.base.errors import InvalidConfig, InvariantViolation, RankConflict, UnknownReplica
from rankcore.base.ranks import LowerBound, RankTable, Reassignment, ReplicaRank

REPLICAS = tuple(f"r{i}" for i in range(12))
NODES = tuple(f"n{i}" for i in range(4))
# small ranks collide often; the large ones cross 64-rank bitmap words
EXPLICIT_RANKS = st.one_of(st.integers(0, 15), st.sampled_from([63, 64, 65, 127, 128, 4095, 4096]))
MAYBE_NODE = st.sampled_from((None,) + NODES)


def lowest_free(used) -> int:
    used = set(used)
    i = 0
    while i in used:
        i += 1
    return i


class Ref:
    """The reference model: plain dicts, nothing clever."""

    def __init__(self) -> None:
        self.g: dict = {}  # replica -> global rank
        self.node: dict = {}  # replica -> node (placed replicas only)
        self.nrank: dict = {}  # node -> node rank
        self.local: dict = {}  # replica -> local rank (placed replicas only)
        self.pref: dict = {}  # unplaced crash replacement -> its predecessor's (node, node rank, local)

    def copy(self) -> Ref:
        return copy.deepcopy(self)

    # -------------------------------------------------------------- reads
    def on(self, node) -> list:
        return [rep for rep, n in self.node.items() if n == node]

    def holder(self, rank):
        for rep, r in self.g.items():
            if r == rank:
                return rep
        return None

    def rank_of(self, rep):
        node = self.node.get(rep)
        if node is None:
            return None
        return ReplicaRank(self.g[rep], self.nrank[node], self.local[rep])

    def snapshot(self) -> dict:
        return {
            rep: (
                r,
                self.node.get(rep),
                self.nrank[self.node[rep]] if rep in self.node else None,
                self.local.get(rep),
            )
            for rep, r in self.g.items()
        }

    def lower_bound(self) -> LowerBound:
        n, k = len(self.g), len(self.nrank)
        g = nr = lr = changed = 0
        for rep, r in self.g.items():
            hits = [r >= n]
            if rep in self.node:
                node = self.node[rep]
                hits.append(self.nrank[node] >= k)
                hits.append(self.local[rep] >= len(self.on(node)))
            else:
                hits += [False, False]
            g += hits[0]
            nr += hits[1]
            lr += hits[2]
            changed += any(hits)
        return LowerBound(rank=g, node_rank=nr, local_rank=lr, replicas=changed)

    # ------------------------------------------------------------ writes
    def _place(self, rep, node) -> None:
        """Lowest free node and local ranks, or the predecessor's where free on its node."""
        pref = self.pref.pop(rep, None)
        want = pref if pref is not None and pref[0] == node else None
        if node not in self.nrank:
            if want is not None and want[1] not in self.nrank.values():
                self.nrank[node] = want[1]
            else:
                self.nrank[node] = lowest_free(self.nrank.values())
        used = {self.local[x] for x in self.on(node)}
        self.local[rep] = want[2] if want is not None and want[2] not in used else lowest_free(used)
        self.node[rep] = node

    def _unplace(self, rep) -> None:
        node = self.node.pop(rep, None)
        if node is None:
            return
        del self.local[rep]
        if not self.on(node):
            del self.nrank[node]

    def assign(self, rep, node=None, rank=None) -> None:
        self.g[rep] = lowest_free(self.g.values()) if rank is None else rank
        if node is not None:
            self._place(rep, node)

    def place(self, rep, node) -> None:
        self._place(rep, node)

    def release(self, rep) -> None:
        self._unplace(rep)
        self.pref.pop(rep, None)
        del self.g[rep]

    def replace(self, old, new, node) -> None:
        """A restarted replica keeps its ranks: all three on the same node; the
        predecessor's as a preference when not placed yet."""
        r = self.g.pop(old)
        if node is not None and self.node.get(old) == node:
            self.local[new] = self.local.pop(old)
            self.node[new] = self.node.pop(old)
            self.g[new] = r
            return
        if old in self.node:
            self.pref[new] = (self.node[old], self.nrank[self.node[old]], self.local[old])
        elif old in self.pref:
            self.pref[new] = self.pref.pop(old)
        self._unplace(old)
        self.g[new] = r
        if node is not None:
            self._place(new, node)

    def recover_conflict(self, items) -> bool:
        """Whether recovering ``items`` must raise RankConflict."""
        reps, ranks = set(self.g), set(self.g.values())
        node_nr = dict(self.nrank)
        used_locals = {(self.node[rep], self.local[rep]) for rep in self.node}
        for rep, node, rk in items:
            if rep in reps or rk.rank in ranks:
                return True
            reps.add(rep)
            ranks.add(rk.rank)
            if node in node_nr:
                if node_nr[node] != rk.node_rank:
                    return True
            else:
                if rk.node_rank in node_nr.values():
                    return True
                node_nr[node] = rk.node_rank
            if (node, rk.local_rank) in used_locals:
                return True
            used_locals.add((node, rk.local_rank))
        return False

    def recover(self, items) -> None:
        for rep, node, rk in items:
            self.g[rep] = rk.rank
            self.node[rep] = node
            self.nrank[node] = rk.node_rank
            self.local[rep] = rk.local_rank

    def compact(self) -> list:
        """Move ranks >= count into holes, lowest old first, at each level; return the changes."""
        old = {rep: self.rank_of(rep) for rep in self.g}
        n = len(self.g)
        movers = sorted((r, rep) for rep, r in self.g.items() if r >= n)
        holes = [i for i in range(n) if i not in set(self.g.values())]
        assert len(movers) == len(holes)
        for (_, rep), hole in zip(movers, holes):
            self.g[rep] = hole
        k = len(self.nrank)
        nmovers = sorted((nr, node) for node, nr in self.nrank.items() if nr >= k)
        nholes = [i for i in range(k) if i not in set(self.nrank.values())]
        assert len(nmovers) == len(nholes)
        for (_, node), hole in zip(nmovers, nholes):
            self.nrank[node] = hole
        for node in list(self.nrank):
            reps = self.on(node)
            c = len(reps)
            used = {self.local[rep] for rep in reps}
            lmovers = sorted((self.local[rep], rep) for rep in reps if self.local[rep] >= c)
            lholes = [i for i in range(c) if i not in used]
            assert len(lmovers) == len(lholes)
            for (_, rep), hole in zip(lmovers, lholes):
                self.local[rep] = hole
        new = {rep: self.rank_of(rep) for rep in self.g}
        changes = [Reassignment(rep, old[rep], new[rep]) for rep in self.g if old[rep] != new[rep]]
        changes.sort(key=lambda ch: ch.new.rank)
        return changes


class RankTableMachine(RuleBasedStateMachine):
    """Drives a RankTable and the reference side by side, with time travel between versions."""

    def __init__(self) -> None:
        super().__init__()
        self.table = RankTable()
        self.ref = Ref()
        # every version ever made, with the reference snapshot taken at that time
        self.versions: list[tuple[RankTable, dict, Ref]] = []
        self._record()

    # ------------------------------------------------------------ helpers
    def _record(self) -> None:
        self.versions.append((self.table, self.ref.snapshot(), self.ref.copy()))

    def _step(self, new_table: RankTable) -> None:
        self.table = new_table
        self._record()

    def _expect_unchanged(self, exc_type, fn, *args, **kwargs):
        """``fn`` raises ``exc_type`` and the current table still reads as the reference."""
        before = self.ref.snapshot()
        try:
            fn(*args, **kwargs)
        except exc_type as e:
            assert self.table.to_dict() == before
            assert len(self.table) == len(before)
            return e
        raise AssertionError(f"{getattr(fn, '__name__', fn)}{args} did not raise {exc_type.__name__}")

    def _present(self):
        return sorted(self.ref.g)

    def _absent(self):
        return [r for r in REPLICAS if r not in self.ref.g]

    # -------------------------------------------------------------- rules
    @initialize(data=st.data())
    def start(self, data):
        """start empty or from a populated table (built by assign_many or by assign in a loop)."""
        k = data.draw(st.integers(0, len(REPLICAS)), label="initial replicas")
        pairs = [(rep, data.draw(MAYBE_NODE, label=f"node of {rep}")) for rep in REPLICAS[:k]]
        if data.draw(st.booleans(), label="bulk"):
            table = self.table.assign_many(pairs)
        else:
            table = self.table
            for rep, node in pairs:
                table = table.assign(rep, node)
        for rep, node in pairs:
            self.ref.assign(rep, node)
        self._step(table)

    @rule(data=st.data(), node=MAYBE_NODE, explicit=st.one_of(st.none(), EXPLICIT_RANKS))
    def assign(self, data, node, explicit):
        """assign a replica (placed or not, lowest free or an explicit rank)."""
        rep = data.draw(st.sampled_from(REPLICAS), label="replica")
        if rep in self.ref.g:
            e = self._expect_unchanged(RankConflict, self.table.assign, rep, node, rank=explicit)
            assert repr(rep) in str(e)
            return
        if explicit is not None and explicit in self.ref.g.values():
            e = self._expect_unchanged(RankConflict, self.table.assign, rep, node, rank=explicit)
            assert str(explicit) in str(e)
            return
        expected_rank = lowest_free(self.ref.g.values()) if explicit is None else explicit
        assert self.table.lowest_free() == lowest_free(self.ref.g.values())
        self.ref.assign(rep, node, explicit)
        self._step(self.table.assign(rep, node, rank=explicit))
        assert self.table.global_rank(rep) == expected_rank

    @rule(data=st.data(), node=st.sampled_from(NODES))
    def place(self, data, node):
        """place an unplaced replica (placing a placed one raises RankConflict)."""
        present = self._present()
        if not present:
            self._expect_unchanged(UnknownReplica, self.table.place, "r0", node)
            return
        rep = data.draw(st.sampled_from(present), label="replica")
        if rep in self.ref.node:
            self._expect_unchanged(RankConflict, self.table.place, rep, node)
            return
        self.ref.place(rep, node)
        self._step(self.table.place(rep, node))

    @precondition(lambda self: self.ref.pref)
    @rule(data=st.data())
    def place_replacement(self, data):
        """place an unplaced crash replacement on its predecessor's node (or elsewhere)."""
        rep = data.draw(st.sampled_from(sorted(self.ref.pref)), label="replacement")
        node = data.draw(st.sampled_from([self.ref.pref[rep][0], *NODES]), label="node")
        self.ref.place(rep, node)
        self._step(self.table.place(rep, node))

    @rule(data=st.data())
    def release(self, data):
        """release a replica (an unknown one raises UnknownReplica)."""
        rep = data.draw(st.sampled_from(REPLICAS), label="replica")
        if rep not in self.ref.g:
            e = self._expect_unchanged(UnknownReplica, self.table.release, rep)
            assert repr(rep) in str(e)
            return
        self.ref.release(rep)
        self._step(self.table.release(rep))

    @precondition(lambda self: self.ref.g and len(self.ref.g) < len(REPLICAS))
    @rule(data=st.data(), where=st.sampled_from(["same", "other", "none"]))
    def replace(self, data, where):
        """replace old by new on the same node, another node, or no node."""
        # a replica with a free local rank below its own makes "same node" replacement interesting
        above_hole = [
            rep for rep in self._present()
            if rep in self.ref.node
            and self.ref.local[rep] > lowest_free(self.ref.local[x] for x in self.ref.on(self.ref.node[rep]))
        ]
        if above_hole and data.draw(st.booleans(), label="old above a local hole"):
            old = data.draw(st.sampled_from(above_hole), label="old")
        else:
            old = data.draw(st.sampled_from(self._present()), label="old")
        new = data.draw(st.sampled_from(self._absent()), label="new")
        if where == "same":
            node = self.ref.node.get(old)
        elif where == "other":
            node = data.draw(st.sampled_from([n for n in NODES if n != self.ref.node.get(old)]), label="node")
        else:
            node = None
        self.ref.replace(old, new, node)
        self._step(self.table.replace(old, new, node))

    @precondition(lambda self: self.ref.g)
    @rule(data=st.data())
    def replace_errors(self, data):
        """replace with an unknown old raises UnknownReplica; with a ranked new raises RankConflict."""
        present = self._present()
        absent = self._absent()
        node = data.draw(MAYBE_NODE, label="node")
        if absent:
            self._expect_unchanged(UnknownReplica, self.table.replace, absent[0], absent[-1], node)
        old = data.draw(st.sampled_from(present), label="old")
        new = data.draw(st.sampled_from(present), label="new")
        self._expect_unchanged(RankConflict, self.table.replace, old, new, node)

    @rule(data=st.data())
    def assign_many(self, data):
        """assign_many equals assign() in order: lowest free ranks, fresh nodes lowest node ranks."""
        absent = self._absent()
        reps = data.draw(st.lists(st.sampled_from(absent), unique=True, max_size=5) if absent else st.just([]),
                         label="replicas")
        pairs = [(rep, data.draw(MAYBE_NODE, label="node")) for rep in reps]
        if reps and self.ref.g and data.draw(st.booleans(), label="include a ranked replica"):
            bad = pairs + [(data.draw(st.sampled_from(self._present())), None)]
            self._expect_unchanged(RankConflict, self.table.assign_many, bad)
        if reps and data.draw(st.booleans(), label="duplicate"):
            self._expect_unchanged(RankConflict, self.table.assign_many, pairs + pairs[:1])
        for rep, node in pairs:
            self.ref.assign(rep, node)
        as_mapping = data.draw(st.booleans(), label="as mapping")
        self._step(self.table.assign_many(dict(pairs) if as_mapping else pairs))

    @rule(data=st.data())
    def release_many(self, data):
        """release_many equals release() in a loop; unknown or repeated replicas raise and change nothing."""
        present = self._present()
        reps = data.draw(st.lists(st.sampled_from(present), unique=True, max_size=5) if present else st.just([]),
                         label="replicas")
        absent = self._absent()
        if absent and data.draw(st.booleans(), label="include unknown"):
            self._expect_unchanged(UnknownReplica, self.table.release_many, reps + [absent[0]])
        if reps and data.draw(st.booleans(), label="duplicate"):
            self._expect_unchanged(InvalidConfig, self.table.release_many, reps + reps[:1])
        for rep in reps:
            self.ref.release(rep)
        self._step(self.table.release_many(reps))

    @rule(data=st.data())
    def recover_many(self, data):
        """recover_many puts reported ranks back, or raises RankConflict and changes nothing."""
        items = []
        for _ in range(data.draw(st.integers(1, 3), label="count")):
            rep = data.draw(st.sampled_from(REPLICAS), label="replica")
            node = data.draw(st.sampled_from(NODES), label="node")
            rank = data.draw(EXPLICIT_RANKS, label="rank")
            # for a node the table has, usually report its true node rank (else a conflict)
            if node in self.ref.nrank and data.draw(st.booleans(), label="true node rank"):
                nr = self.ref.nrank[node]
            else:
                nr = data.draw(st.integers(0, 5), label="node rank")
            local = data.draw(st.integers(0, 5), label="local rank")
            items.append((rep, node, ReplicaRank(rank, nr, local)))
        note(f"recover_many({items!r})")
        if self.ref.recover_conflict(items):
            self._expect_unchanged(RankConflict, self.table.recover_many, items)
            return
        self.ref.recover(items)
        self._step(self.table.recover_many(items))

    def _compact(self, active) -> None:
        """Compact the current table (all placed) and compare with the reference."""
        lb = self.ref.lower_bound()
        if any(
            sum(self.ref.local[rep] >= len(self.ref.on(node)) for rep in self.ref.on(node)) >= 2
            for node in self.ref.nrank
        ):
            event("compact: >= 2 local movers on one node")
        k = len(self.ref.nrank)
        if sum(nr >= k for nr in self.ref.nrank.values()) >= 2:
            event("compact: >= 2 node movers")
        event(f"compact: global movers {min(lb.rank, 2)}, node movers {min(lb.node_rank, 2)}, "
              f"local movers {min(lb.local_rank, 2)}")
        expected = self.ref.compact()
        new_table, changes = self.table.compact(active=active)
        assert list(changes) == expected
        assert changes == expected
        assert len(changes) == lb.replicas
        assert changes.replicas() == tuple(ch.replica for ch in expected)
        assert sum(ch.old.rank != ch.new.rank for ch in changes) == lb.rank
        assert sum(ch.old.node_rank != ch.new.node_rank for ch in changes) == lb.node_rank
        assert sum(ch.old.local_rank != ch.new.local_rank for ch in changes) == lb.local_rank
        assert new_table.is_contiguous()
        if not expected:
            assert new_table == self.table
        self._step(new_table)

    @rule(data=st.data())
    def compact(self, data):
        """compact: holes filled lowest-old-first at each level; changes equal the reference and lower_bound."""
        mode = data.draw(st.sampled_from(["none", "exact", "wrong"]), label="active")
        if mode == "wrong":
            act = set(self.ref.g) ^ {data.draw(st.sampled_from(REPLICAS), label="flip")}
            self._expect_unchanged(InvariantViolation, self.table.compact, active=sorted(act))
            return
        active = None if mode == "none" else list(reversed(self._present()))
        if len(self.ref.node) != len(self.ref.g):
            unplaced = sorted(set(self.ref.g) - set(self.ref.node))
            event("compact: unplaced")
            e = self._expect_unchanged(InvariantViolation, self.table.compact, active=active)
            assert any(repr(rep) in str(e) for rep in unplaced)
            return
        self._compact(active)

    @rule(data=st.data(), node=st.sampled_from(NODES))
    def fill_node(self, data, node):
        """assign_many several replicas onto one node (crowded nodes make local-rank holes likely)."""
        absent = self._absent()
        k = data.draw(st.integers(0, min(6, len(absent))), label="count")
        pairs = [(rep, node) for rep in absent[:k]]
        for rep, n in pairs:
            self.ref.assign(rep, n)
        self._step(self.table.assign_many(pairs))

    @precondition(lambda self: self.ref.g)
    @rule(data=st.data())
    def scale_down_and_compact(self, data):
        """a downscale: release_many some replicas, place the rest, then compact (the Ray Serve flow)."""
        how = data.draw(st.sampled_from(["replicas", "nodes", "lowest nodes", "lowest locals"]), label="how")
        if how == "replicas" or not self.ref.nrank:
            gone = data.draw(st.lists(st.sampled_from(self._present()), unique=True, min_size=1), label="gone")
        elif how == "lowest locals":
            # on the most crowded node, release the lower half of the local ranks (local movers)
            node = max(sorted(self.ref.nrank), key=lambda n: len(self.ref.on(n)))
            on = sorted(self.ref.on(node), key=self.ref.local.get)
            gone = on[: max(1, len(on) // 2)]
        else:
            by_rank = sorted(self.ref.nrank, key=self.ref.nrank.get)
            if how == "nodes":
                drained = data.draw(st.lists(st.sampled_from(by_rank), unique=True, min_size=1), label="drained")
            else:
                # draining the lowest-ranked nodes leaves node ranks >= the node count
                drained = by_rank[: (len(by_rank) + 1) // 2]
            gone = [rep for rep in self._present() if self.ref.node.get(rep) in drained]
        for rep in gone:
            self.ref.release(rep)
        self._step(self.table.release_many(gone))
        targets = sorted(self.ref.nrank) or list(NODES)  # the rest stay on surviving nodes
        for rep in sorted(set(self.ref.g) - set(self.ref.node)):
            node = data.draw(st.sampled_from(targets), label=f"node of {rep}")
            self.ref.place(rep, node)
            self._step(self.table.place(rep, node))
        self._compact(None)

    @precondition(lambda self: len(self.ref.node) < len(self.ref.g))
    @rule(data=st.data())
    def place_all(self, data):
        """place every unplaced replica, one version per place (so compaction can run)."""
        for rep in sorted(set(self.ref.g) - set(self.ref.node)):
            node = data.draw(st.sampled_from(NODES), label=f"node of {rep}")
            self.ref.place(rep, node)
            self._step(self.table.place(rep, node))

    @precondition(lambda self: self.ref.nrank)
    @rule(data=st.data())
    def drain_node(self, data):
        """release_many every replica on one node: its node rank is freed (node-rank holes)."""
        node = data.draw(st.sampled_from(sorted(self.ref.nrank)), label="node")
        reps = self.ref.on(node)
        for rep in reps:
            self.ref.release(rep)
        self._step(self.table.release_many(reps))
        assert self.table.node_rank(node) is None

    @rule(data=st.data())
    def fail_half_way(self, data):
        """a mutator that fails after it started writing (unhashable node) leaves the table unchanged."""
        bad = ["unhashable"]
        absent, present = self._absent(), self._present()
        unplaced = sorted(set(self.ref.g) - set(self.ref.node))
        ops = []
        if absent:
            ops.append(lambda: self.table.assign(absent[0], bad))
            ops.append(lambda: self.table.assign_many([(rep, "n0") for rep in absent[1:3]] + [(absent[0], bad)]))
            ops.append(lambda: self.table.recover(absent[0], bad, ReplicaRank(4097, 0, 0)))
            if present:
                ops.append(lambda: self.table.replace(present[-1], absent[0], bad))
        if unplaced:
            ops.append(lambda: self.table.place(unplaced[0], bad))
        if not ops:
            return
        op = data.draw(st.sampled_from(ops), label="op")
        self._expect_unchanged(TypeError, op)

    @precondition(lambda self: len(self.versions) > 1)
    @rule(data=st.data())
    def time_travel(self, data):
        """go back to an old version: it still equals its snapshot, and we continue (branch) from it."""
        i = data.draw(st.integers(0, len(self.versions) - 1), label="version")
        table, snap, ref = self.versions[i]
        assert table.to_dict() == snap
        assert len(table) == len(snap)
        self.table = table
        self.ref = ref.copy()

    @precondition(lambda self: len(self.versions) > 1)
    @rule(data=st.data())
    def read_old_versions(self, data):
        """read several old versions in a random order: each still equals its snapshot."""
        idx = data.draw(
            st.lists(st.integers(0, len(self.versions) - 1), min_size=1, max_size=6), label="versions"
        )
        for i in idx:
            table, snap, _ = self.versions[i]
            assert table.to_dict() == snap, f"version {i}"
            for rep, (r, node, nr, local) in snap.items():
                assert table.holder_of(r) == rep
                assert table.rank_of(rep) == (None if node is None else ReplicaRank(r, nr, local))

    # ---------------------------------------------------------- invariant
    @invariant()
    def matches_reference(self):
        """The current table equals the reference in every query."""
        t, ref = self.table, self.ref
        snap = ref.snapshot()
        assert t.to_dict() == snap
        assert len(t) == len(snap)
        assert set(t) == set(snap)
        assert dict(t.items()) == {rep: ref.rank_of(rep) for rep in snap}
        assert t.lower_bound() == ref.lower_bound()
        assert t.is_contiguous() == (ref.lower_bound().replicas == 0)
        assert t.lowest_free() == lowest_free(ref.g.values())
        assert t.nodes() == ref.nrank
        for node in NODES:
            assert t.node_rank(node) == ref.nrank.get(node)
            assert t.replicas_on(node) == len(ref.on(node))
            assert t.local_ranks_on(node) == {ref.local[x] for x in ref.on(node)}
        for rep in REPLICAS:
            assert (rep in t) == (rep in snap)
            if rep in snap:
                assert t.global_rank(rep) == ref.g[rep]
                assert t.node_of(rep) == ref.node.get(rep)
                assert t.is_placed(rep) == (rep in ref.node)
                assert t.rank_of(rep) == ref.rank_of(rep)
        probe = set(range(17)) | {63, 64, 65, 127, 128, 4095, 4096, 4097, len(snap)} | set(ref.g.values())
        for r in probe:
            assert t.holder_of(r) == ref.holder(r)
        assert t.preferences() == ref.pref
        assert eval(repr(t), {"RankTable": RankTable}) == t
        # probes (new versions; t itself must not change): the free-rank indexes agree
        free_g = lowest_free(ref.g.values())
        free_n = lowest_free(ref.nrank.values())
        p = t.assign("probe", "fresh-node")
        assert p.rank_of("probe") == ReplicaRank(free_g, free_n, 0)
        p = t.assign_many([("probe0", None), ("probe1", "fresh-a"), ("probe2", "fresh-b")])
        assert p.global_rank("probe0") == free_g
        assert p.global_rank("probe2") == lowest_free(set(ref.g.values()) | {free_g, p.global_rank("probe1")})
        assert p.node_rank("fresh-a") == free_n
        assert p.node_rank("fresh-b") == lowest_free(set(ref.nrank.values()) | {free_n})
        for node in ref.nrank:
            local = t.assign("probe", node).rank_of("probe").local_rank
            assert local == lowest_free(ref.local[rep] for rep in ref.on(node))
        assert t.to_dict() == snap


TestRankTableMachine = RankTableMachine.TestCase
