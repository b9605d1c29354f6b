"""``RankTable``: global, node and local ranks as immutable data.

The rank arithmetic alone, usable without the rest of the core (like raft's
``quorum/``): assign the lowest free rank at each level, release, recover from
reports, and compact back to contiguous with the fewest changes.

Every method returns a new table; the old one stays valid and unchanged
(see :mod:`rankcore.persistent` for how that is cheap). Bulk methods
(``assign_many``, ``release_many``, ``recover_many``) do one event's worth of
work in one version, at dict speed.
"""

from __future__ import annotations

from itertools import islice
from typing import Any, Hashable, Iterable, Iterator, Mapping, Sequence

import attrs

from .errors import InvalidConfig, InvariantViolation, RankConflict, UnknownReplica
from .persistent import MISSING, Edit, Persistent, atomic

__all__ = ["ReplicaRank", "ReportedRank", "Reassignment", "Reassignments", "LowerBound", "RankTable",
           "MAX_RANKS", "MAX_LOCAL"]

Replica = Hashable
Node = Hashable


def _nonneg_int(inst: Any, attribute: attrs.Attribute, value: Any) -> None:
    if type(value) is not int or value < 0:
        raise InvalidConfig(
            f"{type(inst).__name__}.{attribute.name} must be a non-negative int, got {value!r}"
        )


def _opt_nonneg_int(inst: Any, attribute: attrs.Attribute, value: Any) -> None:
    if value is not None:
        _nonneg_int(inst, attribute, value)


@attrs.frozen(order=True)
class ReplicaRank:
    """A replica's ranks: global (0..N-1), its node's (0..M-1), on its node (0..K-1)."""

    rank: int = attrs.field(validator=_nonneg_int)
    node_rank: int = attrs.field(validator=_nonneg_int)
    local_rank: int = attrs.field(validator=_nonneg_int)

    def as_tuple(self) -> tuple[int, int, int]:
        return (self.rank, self.node_rank, self.local_rank)


@attrs.frozen
class ReportedRank:
    """What a live replica says its rank is; node/local parts may be unknown."""

    rank: int = attrs.field(validator=_nonneg_int)
    node_rank: int | None = attrs.field(default=None, validator=_opt_nonneg_int)
    local_rank: int | None = attrs.field(default=None, validator=_opt_nonneg_int)

    @classmethod
    def parse(cls, value: Any) -> ReportedRank:
        """Accept a rank record, a bare int or a dict (the confusion of ray#64636).

        Anything else raises :class:`InvalidConfig` naming the value.
        """
        if isinstance(value, ReportedRank):
            return value
        if isinstance(value, ReplicaRank):
            return cls(rank=value.rank, node_rank=value.node_rank, local_rank=value.local_rank)
        if type(value) is int:
            return cls(rank=value)
        if isinstance(value, Mapping):
            unknown = set(value) - {"rank", "node_rank", "local_rank"}
            if unknown or "rank" not in value:
                raise InvalidConfig(
                    f"a reported rank dict needs 'rank' (and optionally 'node_rank', "
                    f"'local_rank'), got keys {sorted(map(str, value))}"
                )
            return cls(
                rank=value["rank"],
                node_rank=value.get("node_rank"),
                local_rank=value.get("local_rank"),
            )
        if all(hasattr(value, a) for a in ("rank", "node_rank", "local_rank")):
            # e.g. ray.serve.schema.ReplicaRank
            return cls(rank=value.rank, node_rank=value.node_rank, local_rank=value.local_rank)
        raise InvalidConfig(
            f"a reported rank must be a ReplicaRank, an int or a dict, got {value!r}"
        )


@attrs.frozen
class Reassignment:
    """One replica whose ranks a compaction changed (at one level or more)."""

    replica: Replica
    old: ReplicaRank
    new: ReplicaRank


@attrs.frozen
class LowerBound:
    """How many replicas any compaction must change, per level and in all."""

    rank: int
    node_rank: int
    local_rank: int
    replicas: int


class Reassignments(Sequence[Reassignment]):
    """What one compaction changed, ordered by new global rank.

    Built lazily from the compaction's own tables: a downscale of 100k
    replicas changes tens of thousands of ranks, and most callers only count
    them or walk them once.
    """

    __slots__ = ("_order", "_old", "_new", "_old_nr", "_new_nr")

    def __init__(
        self,
        order: Sequence[Replica] = (),
        old: Mapping | None = None,
        new: Mapping | None = None,
        old_node_ranks: Mapping | None = None,
        new_node_ranks: Mapping | None = None,
    ) -> None:
        self._order = tuple(order)
        self._old, self._new = old or {}, new or {}
        self._old_nr, self._new_nr = old_node_ranks or {}, new_node_ranks or {}

    def __len__(self) -> int:
        return len(self._order)

    def _make(self, rep: Replica) -> Reassignment:
        r, node, local = self._old[rep]
        r2, _, l2 = self._new[rep]
        return Reassignment(
            replica=rep,
            old=_rank(r, self._old_nr[node], local),
            new=_rank(r2, self._new_nr[node], l2),
        )

    def __getitem__(self, i):  # type: ignore[override]
        if isinstance(i, slice):
            return tuple(self._make(rep) for rep in self._order[i])
        return self._make(self._order[i])

    def __iter__(self) -> Iterator[Reassignment]:
        return map(self._make, self._order)

    def __eq__(self, other: object) -> bool:
        if isinstance(other, (Reassignments, list, tuple)):
            return list(self) == list(other)
        return NotImplemented

    def __hash__(self) -> int:
        return hash(tuple(self))

    def __repr__(self) -> str:
        return f"Reassignments({list(self)!r})"

    def replicas(self) -> tuple[Replica, ...]:
        return self._order


# Table layout (indices into the version's dicts).
_REC = 0  # replica -> (rank, node | None, local | None)
_OWNER = 1  # rank -> replica
_NODES = 2  # node -> (node_rank, bitmask of used local ranks)
_NOWNER = 3  # node_rank -> node
_GBITS = 4  # free-rank index for global ranks
_NBITS = 5  # free-rank index for node ranks
_META = 6  # "hw": highest held global rank + 1
_N_TABLES = 7

# Free-rank index: a 64-ary tree of bitmasks, 4 levels (16.7M ranks). At level
# 0 a set bit is a used rank; above, a set bit means "that child word is full".
_W = 64
_FULL = (1 << _W) - 1
_LEVELS = 4
MAX_RANKS = _W**_LEVELS
#: local ranks are bits of one int per node: more replicas than this on one node is refused
MAX_LOCAL = 1 << 16
_KEY_MASK = (1 << 40) - 1


def _lowest_zero(mask: int) -> int:
    return ((~mask) & (mask + 1)).bit_length() - 1


def _top(hw: int, present: dict) -> int:
    """The high-water mark (highest key + 1) after keys at the top went away.

    Scans down a little (the usual case: one rank freed at the top), else
    takes the max, so a sparse table never costs O(old high-water)."""
    for _ in range(64):
        if not hw or (hw - 1) in present:
            return hw
        hw -= 1
    return max(present) + 1 if present else 0


def _bits_lowest_free(bits: dict) -> int:
    idx = 0
    for level in range(_LEVELS - 1, -1, -1):
        m = bits.get((level << 40) | idx, 0)
        if m == _FULL:
            raise InvariantViolation(f"rank space exhausted ({MAX_RANKS} ranks)")
        idx = idx * _W + _lowest_zero(m)
    return idx


def _bits_iter_free(bits: dict, level: int = _LEVELS - 1, idx: int = 0) -> Iterator[int]:
    """Free ranks in ascending order (skips full words through the upper levels)."""
    m = bits.get((level << 40) | idx, 0)
    base = idx * _W
    free = ~m & _FULL
    while free:
        low = free & -free
        free ^= low
        if level == 0:
            yield base + low.bit_length() - 1
        else:
            yield from _bits_iter_free(bits, level - 1, base + low.bit_length() - 1)


def _bits_set(e: Edit, t: int, r: int) -> None:
    bits = e.dicts[t]
    idx = r
    for level in range(_LEVELS):
        k = (level << 40) | (idx >> 6)
        new = bits.get(k, 0) | (1 << (idx & 63))
        e.set(t, k, new)
        if new != _FULL:
            return
        idx >>= 6


def _bits_clear(e: Edit, t: int, r: int) -> None:
    bits = e.dicts[t]
    idx = r
    for level in range(_LEVELS):
        k = (level << 40) | (idx >> 6)
        old = bits.get(k, 0)
        new = old & ~(1 << (idx & 63))
        if new:
            e.set(t, k, new)
        else:
            e.discard(t, k)
        if old != _FULL:
            return
        idx >>= 6


def _bits_update(
    e: Edit, t: int, add: Iterable[int] = (), remove: Iterable[int] = (), level: int = 0
) -> None:
    """Set and clear many bits from ``level`` up, writing each touched word once."""
    bits = e.dicts[t]
    while level < _LEVELS:
        words: dict[int, int] = {}
        get = bits.get
        for i in add:
            k = (level << 40) | (i >> 6)
            words[k] = words.get(k, get(k, 0)) | (1 << (i & 63))
        for i in remove:
            k = (level << 40) | (i >> 6)
            words[k] = words.get(k, get(k, 0)) & ~(1 << (i & 63))
        if not words:
            return
        full_now, full_gone, zero = [], [], []
        for k, new in words.items():
            was_full = get(k, 0) == _FULL
            if new == _FULL:
                if not was_full:
                    full_now.append(k & _KEY_MASK)
            elif was_full:
                full_gone.append(k & _KEY_MASK)
            if not new:
                zero.append(k)
        for k in zero:
            del words[k]
        e.update(t, words)
        for k in zero:
            e.discard(t, k)
        add, remove = full_now, full_gone
        level += 1


def _bits_set_range(e: Edit, t: int, a: int, b: int) -> None:
    """Set bits a..b-1 (a fresh run of ranks) a word at a time."""
    if a >= b:
        return
    bits = e.dicts[t]
    words: dict[int, int] = {}
    full_now = []
    for w in range(a >> 6, ((b - 1) >> 6) + 1):
        lo = max(a, w << 6) - (w << 6)
        hi = min(b, (w + 1) << 6) - (w << 6)
        old = bits.get(w, 0)
        new = old | (((1 << (hi - lo)) - 1) << lo)
        words[w] = new
        if new == _FULL and old != _FULL:
            full_now.append(w)
    e.update(t, words)
    _bits_update(e, t, add=full_now, level=1)


def _bits_prefix(e: Edit, t: int, n: int) -> None:
    """Rewrite the index as exactly ranks 0..n-1 used.

    At level L the set bits are exactly 0..(n >> 6L)-1 (a word is full iff all
    its ranks are below n). Costs O(n/64 + words held), never O(old high-water).
    """
    bits = e.dicts[t]
    want: dict[int, int] = {}
    for level in range(_LEVELS):
        c = n >> (6 * level)
        for w in range((c + 63) >> 6):
            used = min(c - (w << 6), _W)
            want[(level << 40) | w] = (1 << used) - 1
    stale = [k for k in bits if k not in want]
    e.update(t, {k: v for k, v in want.items() if bits.get(k) != v})
    for k in stale:
        e.discard(t, k)


def _rank(r: int, nr: int, local: int, _new: Any = object.__new__, _set: Any = object.__setattr__) -> ReplicaRank:
    """Build a ReplicaRank from ints the table already validated (hot path)."""
    rk = _new(ReplicaRank)
    _set(rk, "rank", r)
    _set(rk, "node_rank", nr)
    _set(rk, "local_rank", local)
    return rk


def _holey(info: tuple | None) -> int:
    """1 if a node's used local ranks are not exactly 0..count-1."""
    return 0 if info is None else int(bool(info[1] & (info[1] + 1)))


def _account(e: Edit, before: dict) -> None:
    """Keep the O(1) contiguity counters in _META true after nodes changed.

    ``before`` maps every node whose entry this edit touched to its entry
    before the edit (None if it was absent).
    """
    if not before:
        return
    nodes, meta, nowner = e.dicts[_NODES], e.dicts[_META], e.dicts[_NOWNER]
    delta = sum(_holey(nodes.get(n)) - _holey(old) for n, old in before.items())
    if delta:
        e.set(_META, "holey", meta.get("holey", 0) + delta)
    nhw = meta.get("nhw", 0)
    new = nhw
    for n in before:
        info = nodes.get(n)
        if info is not None and info[0] >= new:
            new = info[0] + 1
    new = _top(new, nowner)
    if new != nhw:
        e.set(_META, "nhw", new)


class RankTable(Persistent):
    """Immutable map of replicas to ranks at three levels.

    Replicas and nodes are any hashable ids. A replica first holds a global
    rank (``assign`` with no node) and gets its node and local ranks when
    placed (``place``); ``assign(replica, node)`` does both at once.
    """

    __slots__ = ()
    _N_TABLES = _N_TABLES

    # ------------------------------------------------------------- queries
    def __len__(self) -> int:
        return len(self._read()[_REC])

    def __contains__(self, replica: object) -> bool:
        return replica in self._read()[_REC]

    def __iter__(self) -> Iterator[Replica]:
        """Replicas in global-rank order (dict order would depend on version history)."""
        rec = self._read()[_REC]
        return iter(sorted(rec, key=lambda rep: rec[rep][0]))

    def _rec(self, replica: Replica) -> tuple:
        if self._link is not None:
            self._reroot()
        try:
            return self._store.dicts[_REC][replica]
        except KeyError:
            raise UnknownReplica(f"replica {replica!r} holds no rank") from None

    def global_rank(self, replica: Replica) -> int:
        if self._link is not None:
            self._reroot()
        try:
            return self._store.dicts[_REC][replica][0]
        except KeyError:
            raise UnknownReplica(f"replica {replica!r} holds no rank") from None

    def node_of(self, replica: Replica) -> Node | None:
        if self._link is not None:
            self._reroot()
        try:
            return self._store.dicts[_REC][replica][1]
        except KeyError:
            raise UnknownReplica(f"replica {replica!r} holds no rank") from None

    def is_placed(self, replica: Replica) -> bool:
        return self._rec(replica)[1] is not None

    def rank_of(self, replica: Replica) -> ReplicaRank | None:
        """The full rank, or None while the replica holds only a global rank."""
        r, node, local = self._rec(replica)
        if node is None:
            return None
        return _rank(r, self._store.dicts[_NODES][node][0], local)

    def holder_of(self, rank: int) -> Replica | None:
        return self._read()[_OWNER].get(rank)

    def node_rank(self, node: Node) -> int | None:
        info = self._read()[_NODES].get(node)
        return None if info is None else info[0]

    def nodes(self) -> dict[Node, int]:
        """Nodes hosting at least one placed replica, with their node ranks."""
        return {n: info[0] for n, info in self._read()[_NODES].items()}

    def replicas_on(self, node: Node) -> int:
        info = self._read()[_NODES].get(node)
        return 0 if info is None else info[1].bit_count()

    def lowest_free(self) -> int:
        d = self._read()
        hw = d[_META].get("hw", 0)
        if hw == len(d[_OWNER]):
            return hw
        return _bits_lowest_free(d[_GBITS])

    def items(self) -> Iterator[tuple[Replica, ReplicaRank | None]]:
        d = self._read()
        nodes = d[_NODES]
        out = [
            (rep, None if node is None else _rank(r, nodes[node][0], local))
            for rep, (r, node, local) in sorted(d[_REC].items(), key=lambda kv: kv[1][0])
        ]
        return iter(out)

    def to_dict(self) -> dict[Replica, tuple]:
        """Plain snapshot: replica -> (rank, node, node_rank, local_rank), in rank order."""
        d = self._read()
        nodes = d[_NODES]
        return {
            rep: (r, node, None if node is None else nodes[node][0], local)
            for rep, (r, node, local) in sorted(d[_REC].items(), key=lambda kv: kv[1][0])
        }

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, RankTable):
            return NotImplemented
        if self is other:
            return True
        return self.to_dict() == other.to_dict()

    def __hash__(self) -> int:
        return hash(frozenset(self.to_dict().items()))

    def __repr__(self) -> str:
        return f"RankTable.from_dict({self.to_dict()!r})"

    @classmethod
    def from_dict(cls, snapshot: Mapping[Replica, tuple]) -> RankTable:
        """Rebuild from ``to_dict()`` output (so ``repr`` is valid Python)."""
        placed, reserved = [], []
        for rep, (r, node, node_rank, local) in snapshot.items():
            if node is None:
                reserved.append((rep, r))
            else:
                placed.append((rep, node, ReplicaRank(rank=r, node_rank=node_rank, local_rank=local)))
        t = cls().recover_many(placed)
        for rep, r in reserved:
            t = t.assign(rep, rank=r)
        return t

    def is_contiguous(self) -> bool:
        """True when every level is exactly 0..count-1 (O(1): counters kept by every edit)."""
        d = self._read()
        meta = d[_META]
        return (
            meta.get("hw", 0) == len(d[_OWNER])
            and meta.get("nhw", 0) == len(d[_NOWNER])
            and meta.get("holey", 0) == 0
        )

    def lower_bound(self) -> LowerBound:
        """The replicas any compaction to contiguous must change, per level and in all."""
        d = self._read()
        rec, nodes = d[_REC], d[_NODES]
        n, k = len(rec), len(nodes)
        far_nodes = {node for node, info in nodes.items() if info[0] >= k}
        counts = {node: info[1].bit_count() for node, info in nodes.items()}
        g = nr = lr = changed = 0
        for r, node, local in rec.values():
            hit = False
            if r >= n:
                g += 1
                hit = True
            if node is not None:
                if node in far_nodes:
                    nr += 1
                    hit = True
                if local >= counts[node]:
                    lr += 1
                    hit = True
            changed += hit
        return LowerBound(rank=g, node_rank=nr, local_rank=lr, replicas=changed)

    # ------------------------------------------------------------ mutators
    @atomic
    def assign(self, replica: Replica, node: Node | None = None, *, rank: int | None = None) -> RankTable:
        """Give ``replica`` the lowest free global rank (or ``rank``, if free).

        With ``node``, also its node's rank (the lowest free one for a node new
        to this table) and the lowest free local rank on that node.
        """
        d = self._read()
        if replica in d[_REC]:
            raise RankConflict(f"replica {replica!r} already holds rank {d[_REC][replica][0]}")
        hw = d[_META].get("hw", 0)
        if rank is None:
            r = hw if hw == len(d[_OWNER]) else _bits_lowest_free(d[_GBITS])
        else:
            if type(rank) is not int or not 0 <= rank < MAX_RANKS:
                raise InvalidConfig(f"rank must be an int in 0..{MAX_RANKS - 1}, got {rank!r}")
            if rank in d[_OWNER]:
                raise RankConflict(f"rank {rank} is held by replica {d[_OWNER][rank]!r}")
            r = rank
        if r >= MAX_RANKS:
            raise InvariantViolation(f"rank space exhausted ({MAX_RANKS} ranks)")
        e = Edit(self)
        e.set(_OWNER, r, replica)
        _bits_set(e, _GBITS, r)
        if r >= hw:
            e.set(_META, "hw", r + 1)
        if node is None:
            e.set(_REC, replica, (r, None, None))
        else:
            before: dict = {}
            e.set(_REC, replica, (r, node, self._take_local(e, node, before)))
            _account(e, before)
        return e.commit()

    @staticmethod
    def _take_local(e: Edit, node: Node, before: dict) -> int:
        info = e.dicts[_NODES].get(node)
        before.setdefault(node, info)
        if info is None:
            nr = _bits_lowest_free(e.dicts[_NBITS])
            e.set(_NOWNER, nr, node)
            _bits_set(e, _NBITS, nr)
            mask = 0
        else:
            nr, mask = info
        local = _lowest_zero(mask)
        e.set(_NODES, node, (nr, mask | (1 << local)))
        return local

    @staticmethod
    def _drop_local(e: Edit, node: Node, local: int, before: dict) -> None:
        nr, mask = e.dicts[_NODES][node]
        before.setdefault(node, (nr, mask))
        mask &= ~(1 << local)
        if mask:
            e.set(_NODES, node, (nr, mask))
        else:
            e.pop(_NODES, node)
            e.pop(_NOWNER, nr)
            _bits_clear(e, _NBITS, nr)

    @atomic
    def place(self, replica: Replica, node: Node) -> RankTable:
        """Give a replica that holds only a global rank its node and local ranks."""
        r, cur, _ = self._rec(replica)
        if cur is not None:
            raise RankConflict(f"replica {replica!r} is already placed on node {cur!r}")
        e = Edit(self)
        before: dict = {}
        e.set(_REC, replica, (r, node, self._take_local(e, node, before)))
        _account(e, before)
        return e.commit()

    @atomic
    def release(self, replica: Replica) -> RankTable:
        """Free every rank the replica holds (call once it has fully stopped)."""
        r, node, local = self._rec(replica)
        e = Edit(self)
        e.pop(_REC, replica)
        owner = e.dicts[_OWNER]
        e.pop(_OWNER, r)
        _bits_clear(e, _GBITS, r)
        hw = e.dicts[_META].get("hw", 0)
        if r == hw - 1:
            e.set(_META, "hw", _top(hw, owner))
        if node is not None:
            before: dict = {}
            self._drop_local(e, node, local, before)
            _account(e, before)
        return e.commit()

    @atomic
    def replace(self, old: Replica, new: Replica, node: Node | None = None) -> RankTable:
        """Crash replacement: ``new`` takes ``old``'s global rank; ``old`` leaves.

        ``old``'s node and local ranks are freed; ``new`` is placed on ``node``
        when given (on the same node it gets the lowest free local rank, which
        is ``old``'s unless a lower one was freed meanwhile).
        """
        if self._link is not None:
            self._reroot()
        dicts = self._store.dicts
        rec = dicts[_REC]
        try:
            r, old_node, old_local = rec[old]
        except KeyError:
            raise UnknownReplica(f"replica {old!r} holds no rank") from None
        if new in rec:
            raise RankConflict(f"replica {new!r} already holds rank {rec[new][0]}")
        if node is not None and node == old_node:
            # Hot path (a crash replaced in place): three dict writes.
            nodes = dicts[_NODES]
            nr, mask = nodes[node]
            free = mask & ~(1 << old_local)
            local = ((~free) & (free + 1)).bit_length() - 1
            old_rec = rec.pop(old)
            rec[new] = (r, node, local)
            owner = dicts[_OWNER]
            owner[r] = new
            undo = [(_REC, old, old_rec), (_REC, new, MISSING), (_OWNER, r, old)]
            if local != old_local:
                undo.append((_NODES, node, (nr, mask)))
                new_info = (nr, free | (1 << local))
                nodes[node] = new_info
                delta = _holey(new_info) - _holey((nr, mask))
                if delta:
                    meta = dicts[_META]
                    undo.append((_META, "holey", meta.get("holey", MISSING)))
                    meta["holey"] = meta.get("holey", 0) + delta
            return self._next(undo)
        e = Edit(self)
        e.pop(_REC, old)
        e.set(_OWNER, r, new)
        before: dict = {}
        if old_node is not None:
            self._drop_local(e, old_node, old_local, before)
        e.set(_REC, new, (r, None, None) if node is None else (r, node, self._take_local(e, node, before)))
        _account(e, before)
        return e.commit()

    def recover(self, replica: Replica, node: Node, rank: ReplicaRank) -> RankTable:
        """Put back a rank a live replica reports (controller recovery)."""
        return self.recover_many(((replica, node, rank),))

    @atomic
    def recover_many(self, items: Iterable[tuple[Replica, Node, ReplicaRank]]) -> RankTable:
        """Recover many replicas in one version; any conflict raises and changes nothing."""
        items = list(items)  # before reading: the iterable may read another version
        d = self._read()
        rec, owner, nodes, nowner = d[_REC], d[_OWNER], d[_NODES], d[_NOWNER]
        new_rec: dict = {}
        new_owner: dict = {}
        node_info: dict = {}  # node -> [node_rank, mask]
        for replica, node, rk in items:
            if type(rk) is not ReplicaRank:
                raise InvalidConfig(f"recover needs a ReplicaRank for {replica!r}, got {rk!r}")
            r = rk.rank
            if r >= MAX_RANKS or rk.node_rank >= MAX_RANKS or rk.local_rank >= MAX_LOCAL:
                raise InvalidConfig(
                    f"{rk} of {replica!r} is beyond the supported ranks "
                    f"({MAX_RANKS} global and node ranks, {MAX_LOCAL} local ranks per node)"
                )
            if replica in rec or replica in new_rec:
                raise RankConflict(f"replica {replica!r} already holds a rank")
            holder = owner.get(r, new_owner.get(r))
            if holder is not None:
                raise RankConflict(f"rank {r} is claimed by {holder!r} and {replica!r}")
            info = node_info.get(node)
            if info is None:
                base = nodes.get(node)
                if base is None:
                    other = nowner.get(rk.node_rank)
                    if other is not None:
                        raise RankConflict(
                            f"node rank {rk.node_rank} is held by node {other!r}, "
                            f"and {replica!r} reports it for node {node!r}"
                        )
                    info = [rk.node_rank, 0]
                else:
                    info = [base[0], base[1]]
                node_info[node] = info
            if info[0] != rk.node_rank:
                raise RankConflict(
                    f"node {node!r} has node rank {info[0]}, but {replica!r} reports {rk.node_rank}"
                )
            bit = 1 << rk.local_rank
            if info[1] & bit:
                raise RankConflict(f"local rank {rk.local_rank} on node {node!r} is claimed twice")
            info[1] |= bit
            new_rec[replica] = (r, node, rk.local_rank)
            new_owner[r] = replica
        fresh = {n: info[0] for n, info in node_info.items() if n not in nodes}
        if len(set(fresh.values())) != len(fresh):
            seen: dict = {}
            for n, nr in fresh.items():
                if nr in seen:
                    raise RankConflict(f"node rank {nr} is claimed by nodes {seen[nr]!r} and {n!r}")
                seen[nr] = n
        if not new_rec:
            return self
        e = Edit(self)
        before = {n: nodes.get(n) for n in node_info}
        e.insert_new(_REC, new_rec)
        e.insert_new(_OWNER, new_owner)
        e.update(_NODES, {n: (info[0], info[1]) for n, info in node_info.items()})
        e.insert_new(_NOWNER, {nr: n for n, nr in fresh.items()})
        _bits_update(e, _GBITS, add=new_owner)
        _bits_update(e, _NBITS, add=fresh.values())
        hw = max(d[_META].get("hw", 0), max(new_owner) + 1)
        e.set(_META, "hw", hw)
        _account(e, before)
        return e.commit()

    def _take_free(self, d: tuple[dict, ...], k: int) -> list[int]:
        hw = d[_META].get("hw", 0)
        holes = hw - len(d[_OWNER])
        ranks = list(islice(_bits_iter_free(d[_GBITS]), min(holes, k))) if holes else []
        ranks.extend(range(hw, hw + k - len(ranks)))
        if ranks and ranks[-1] >= MAX_RANKS:
            raise InvariantViolation(f"rank space exhausted ({MAX_RANKS} ranks)")
        return ranks

    @atomic
    def assign_many(self, placements: Iterable[tuple[Replica, Node | None]] | Mapping) -> RankTable:
        """``assign`` for many replicas in one version (one scale-up event).

        Replicas get the lowest free global ranks in the order given; a node
        new to the table gets the lowest free node rank at its first replica.
        """
        pairs = list(placements.items() if isinstance(placements, Mapping) else placements)
        if not pairs:
            return self
        d = self._read()
        rec = d[_REC]
        replicas = [p[0] for p in pairs]
        if len(set(replicas)) != len(replicas):
            raise RankConflict("assign_many got the same replica twice")
        taken = [rep for rep in replicas if rep in rec]
        if taken:
            raise RankConflict(f"replica {taken[0]!r} already holds rank {rec[taken[0]][0]}")
        ranks = self._take_free(d, len(pairs))
        nodes = d[_NODES]
        work: dict = {}  # node -> [node_rank or None, mask]
        records = []
        append = records.append
        for (_, node), r in zip(pairs, ranks):
            if node is None:
                append((r, None, None))
                continue
            info = work.get(node)
            if info is None:
                base = nodes.get(node)
                info = work[node] = [None, 0] if base is None else [base[0], base[1]]
            m = info[1]
            local = ((~m) & (m + 1)).bit_length() - 1
            info[1] = m | (1 << local)
            append((r, node, local))
        fresh = [n for n, info in work.items() if info[0] is None]
        free_nodes = list(islice(_bits_iter_free(d[_NBITS]), len(fresh)))
        for n, nr in zip(fresh, free_nodes):
            work[n][0] = nr
        hw = d[_META].get("hw", 0)
        e = Edit(self)
        before = {n: nodes.get(n) for n in work}
        e.insert_new(_REC, dict(zip(replicas, records)))
        e.insert_new(_OWNER, dict(zip(ranks, replicas)))
        e.update(_NODES, {n: (info[0], info[1]) for n, info in work.items()})
        e.insert_new(_NOWNER, dict(zip(free_nodes, fresh)))
        below = [r for r in ranks if r < hw]
        if below:
            _bits_update(e, _GBITS, add=below)
        if ranks[-1] >= hw:
            _bits_set_range(e, _GBITS, hw, ranks[-1] + 1)
            e.set(_META, "hw", ranks[-1] + 1)
        _bits_update(e, _NBITS, add=free_nodes)
        _account(e, before)
        return e.commit()

    @atomic
    def release_many(self, replicas: Iterable[Replica]) -> RankTable:
        """``release`` for many replicas in one version."""
        reps = list(replicas)  # before reading: the iterable may read another version
        d = self._read()
        rec, owner = d[_REC], d[_OWNER]
        if len(set(reps)) != len(reps):
            raise InvalidConfig("release_many got the same replica twice")
        missing = [rep for rep in reps if rep not in rec]
        if missing:
            raise UnknownReplica(f"replica {missing[0]!r} holds no rank")
        if not reps:
            return self
        nodes = d[_NODES]
        e = Edit(self)
        old = e.pop_many(_REC, reps)
        ranks = [v[0] for v in old.values()]
        e.pop_many(_OWNER, ranks)
        work: dict = {}
        for r, node, local in old.values():
            if node is not None:
                info = work.get(node)
                if info is None:
                    info = work[node] = list(nodes[node])
                info[1] &= ~(1 << local)
        before = {n: nodes[n] for n in work}
        emptied = [n for n, info in work.items() if not info[1]]
        e.update(_NODES, {n: (info[0], info[1]) for n, info in work.items() if info[1]})
        e.pop_many(_NODES, emptied)
        gone = [work[n][0] for n in emptied]
        e.pop_many(_NOWNER, gone)
        _bits_update(e, _GBITS, remove=ranks)
        _bits_update(e, _NBITS, remove=gone)
        e.set(_META, "hw", _top(d[_META].get("hw", 0), owner))
        _account(e, before)
        return e.commit()

    @atomic
    def compact(self, active: Iterable[Replica] | None = None) -> tuple[RankTable, Reassignments]:
        """Make all three levels contiguous, changing only the ranks that must change.

        Ranks at or above the new count move, lowest old rank first, into the
        holes below it, lowest hole first (the same rule at node and local
        level), so the changes equal :meth:`lower_bound`. ``active``, when
        given, must be exactly the table's replicas. Everything is validated
        before anything changes.
        """
        act = None if active is None else set(active)  # before reading (see recover_many)
        d = self._read()
        rec, owner, nodes, nowner = d[_REC], d[_OWNER], d[_NODES], d[_NOWNER]
        if act is not None:
            if act != rec.keys():
                stale = sorted(map(repr, rec.keys() - act))[:5]
                unranked = sorted(map(repr, act - rec.keys()))[:5]
                raise InvariantViolation(
                    f"compact: active replicas differ from the table "
                    f"(ranked but not active: {stale}; active without rank: {unranked})"
                )
        n, k = len(rec), len(nodes)
        hw = d[_META].get("hw", 0)
        unplaced = [rep for rep, v in rec.items() if v[1] is None]
        if unplaced:
            raise InvariantViolation(f"compact: replica {unplaced[0]!r} is not placed yet")
        # Global level: holders of ranks >= n move into the holes below n.
        if hw - n > len(owner):  # sparse (e.g. a far-off recovered rank): scan the holders
            movers = sorted(r for r in owner if r >= n)
        else:
            movers = [r for r in range(n, hw) if r in owner]
        holes = [r for r in range(n) if r not in owner] if movers else []
        if len(holes) != len(movers):
            raise InvariantViolation("compact: global ranks are not unique")
        new_rank = {owner[old]: new for old, new in zip(movers, holes)}
        # Node level, the same rule over node ranks.
        nmovers = sorted(nr for nr in nowner if nr >= k)
        nholes = [i for i in range(k) if i not in nowner] if nmovers else []
        new_node_rank = {nowner[old]: new for old, new in zip(nmovers, nholes)}
        # Local level: nodes whose used local ranks are not 0..count-1.
        bad = {node: info[1].bit_count() for node, info in nodes.items() if info[1] & (info[1] + 1)}
        new_local: dict = {}
        new_masks: dict = {}
        if bad:
            local_movers: dict = {}
            for rep, (r, node, local) in rec.items():
                c = bad.get(node)
                if c is not None and local >= c:
                    local_movers.setdefault(node, []).append((local, rep))
            for node, lst in local_movers.items():
                c = bad[node]
                lst.sort(key=lambda x: x[0])
                mask = nodes[node][1]
                free = [i for i in range(c) if not (mask >> i) & 1]
                for (_, rep), hole in zip(lst, free):
                    new_local[rep] = hole
                new_masks[node] = (1 << c) - 1
        changed = dict.fromkeys(new_rank)
        changed.update(dict.fromkeys(new_local))
        if new_node_rank:
            changed.update((rep, None) for rep, v in rec.items() if v[1] in new_node_rank)
        if not changed:
            return self, Reassignments()
        old_node_rank = {node: nodes[node][0] for node in new_node_rank}
        olds = {rep: rec[rep] for rep in changed}
        rec_updates = {
            rep: (new_rank.get(rep, r), node, new_local.get(rep, local))
            for rep, (r, node, local) in olds.items()
        }
        node_updates = {
            node: (new_node_rank.get(node, nodes[node][0]), new_masks.get(node, nodes[node][1]))
            for node in set(new_node_rank) | set(new_masks)
        }
        node_ranks = {node: nodes[node][0] for node in {v[1] for v in olds.values()}}
        e = Edit(self)
        before = {n: nodes[n] for n in node_updates}
        e.update(_REC, rec_updates)
        e.pop_many(_OWNER, movers)
        e.insert_new(_OWNER, {new: rep for rep, new in new_rank.items()})
        e.update(_NODES, node_updates)
        e.pop_many(_NOWNER, nmovers)
        e.insert_new(_NOWNER, {new: node for node, new in new_node_rank.items()})
        if movers:
            _bits_prefix(e, _GBITS, n)
            e.set(_META, "hw", n)
        if nmovers:
            _bits_prefix(e, _NBITS, k)
        _account(e, before)
        order = sorted(olds, key=lambda rep: rec_updates[rep][0])
        new_node_ranks = {**node_ranks, **new_node_rank}
        old_node_ranks = {**node_ranks, **old_node_rank}
        return e.commit(), Reassignments(order, olds, rec_updates, old_node_ranks, new_node_ranks)
