"""``RankTable``: global, node and local ranks as immutable data.

The rank arithmetic alone, usable without the rest of the core (like raft's
``quorum/``): assign the lowest free rank at each level, release, recover from
reports, and compact back to contiguous with the fewest changes.

Every method returns a new table; the old one stays valid and unchanged
(see :mod:`rankcore.base.persistent` for how that is cheap). Bulk methods
(``assign_many``, ``release_many``, ``recover_many``) do one event's worth of
work in one version, at dict speed.

Internal module: import its public names from ``rankcore`` (docs/embedding.md,
"What you may import").
"""

from __future__ import annotations

from collections.abc import Hashable, Iterable, Iterator, Mapping, Sequence
from itertools import islice
from typing import Any

import attrs

from .errors import InvalidConfig, InvariantViolation, RankConflict, UnknownReplica
from .fields import shown
from .persistent import MISSING, Edit, Persistent, atomic, atomic_bulk, locked
from .records import maker

__all__ = ["ReplicaRank", "ReportedRank", "Reassignment", "Reassignments", "LowerBound", "RankTable",
           "MAX_RANKS", "MAX_LOCAL"]

Replica = Hashable
Node = Hashable


def _nonneg_int(inst: Any, attribute: attrs.Attribute, value: Any) -> None:
    if type(value) is not int or value < 0:
        raise InvalidConfig(
            f"{type(inst).__name__}.{attribute.name} must be a non-negative int, got {shown(value)}"
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
            f"a reported rank must be a ReplicaRank, an int or a dict, got {shown(value)}"
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

    def __getitem__(self, i: Any) -> Any:
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


# Table layout (indices into the version's dicts). Every key and value is an
# int or one of the caller's replica/node ids, never a tuple: a dict holding
# only ints and strings is never tracked by the cyclic garbage collector, so a
# table of 100k replicas (with str ids) costs no collection anything, and a
# write never makes a collection traverse it again (docs/benchmarks.md, (e)).
_REC = 0  # replica -> rank << 41 | node rank << 17 | (local rank + 1); rank << 41 while unplaced
_OWNER = 1  # global rank -> replica
_NODES = 2  # node -> mask << 24 | node rank (bit i of mask set: local rank i is used)
_NOWNER = 3  # node rank -> node
_SLOT = 4  # node rank << 16 | local rank -> replica (so compaction finds its movers)
_HOLEY = 5  # node -> 1 for every node whose used local ranks are not 0..count-1
_GBITS = 6  # free-rank index for global ranks
_NBITS = 7  # free-rank index for node ranks
_META = 8  # "hw"/"nhw": highest held global/node rank + 1; "unplaced": replicas without a node
_PNODE = 9  # unplaced crash replacement -> its predecessor's node
_PSLOT = 10  # unplaced crash replacement -> its predecessor's node rank << 16 | local rank
_N_TABLES = 11

_LB = 17  # bits of (local rank + 1) at the bottom of a _REC value (0: not placed)
_LM = (1 << _LB) - 1
_NB = 24  # bits of a node rank (in a _REC value, above the local; at the bottom of a _NODES value)
_NM = (1 << _NB) - 1
_RB = _LB + _NB  # where the global rank starts in a _REC value
_SB = 16  # bits of the local rank in a _SLOT key
_SM = (1 << _SB) - 1

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


def _lowest_free_local(mask: int) -> int:
    """The local rank a replica placed on a node gets: the lowest free one
    (``mask``: the node's used local ranks)."""
    return _lowest_zero(mask)


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


_make_rank = maker(ReplicaRank)


def _rank(r: int, nr: int, local: int) -> ReplicaRank:
    """Build a ReplicaRank from ints the table already validated (hot path)."""
    return _make_rank(rank=r, node_rank=nr, local_rank=local)


def _bit_positions(mask: int) -> list[int]:
    """The set bits of ``mask``, lowest first."""
    out = []
    while mask:
        low = mask & -mask
        out.append(low.bit_length() - 1)
        mask ^= low
    return out


def _held_from(present: Mapping, lo: int, hi: int) -> list[int]:
    """Keys of ``present`` in ``lo..hi-1``, ascending, in O(min(hi - lo, len(present)))."""
    if hi - lo > len(present):
        return sorted(k for k in present if k >= lo)
    return [i for i in range(lo, hi) if i in present]


def _count(e: Edit, key: str, delta: int) -> None:
    e.set(_META, key, e.dicts[_META].get(key, 0) + delta)


def _node_write(e: Edit, node: Node, nr: int, m0: int, m1: int) -> None:
    """``node``'s used local ranks go from mask ``m0`` to ``m1`` (0: not in the table)."""
    d = e.dicts
    if m1:
        e.set(_NODES, node, (m1 << _NB) | nr)
        if not m0:
            e.set(_NOWNER, nr, node)
            _bits_set(e, _NBITS, nr)
            if nr >= d[_META].get("nhw", 0):
                e.set(_META, "nhw", nr + 1)
        if m1 & (m1 + 1):
            if node not in d[_HOLEY]:
                e.set(_HOLEY, node, 1)
        elif node in d[_HOLEY]:
            e.pop(_HOLEY, node)
    else:
        e.pop(_NODES, node)
        e.pop(_NOWNER, nr)
        _bits_clear(e, _NBITS, nr)
        e.discard(_HOLEY, node)
        nhw = d[_META].get("nhw", 0)
        if nr == nhw - 1:
            e.set(_META, "nhw", _top(nhw, d[_NOWNER]))


def _place(e: Edit, replica: Replica, r: int, node: Node, want: int = -1) -> None:
    """Give ``replica`` (global rank ``r``) the lowest free local rank on ``node``
    (and the node the lowest free node rank if it is new to the table).

    ``want`` (a predecessor's node rank << 16 | local rank, or -1) is taken
    instead where free: its local rank, and its node rank for a node new to
    the table (a crash replacement back on its predecessor's node)."""
    d = e.dicts
    v = d[_NODES].get(node)
    if v is None:
        m0 = 0
        if want >= 0 and want >> _SB not in d[_NOWNER]:
            nr = want >> _SB
        else:
            nr = _bits_lowest_free(e.dicts[_NBITS])
    else:
        m0, nr = v >> _NB, v & _NM
    if want >= 0 and not (m0 >> (want & _SM)) & 1:
        local = want & _SM
    else:
        local = _lowest_free_local(m0)
    if local >= MAX_LOCAL:
        raise InvariantViolation(f"node {node!r} already holds {MAX_LOCAL} replicas (the most one node may hold)")
    _node_write(e, node, nr, m0, m0 | (1 << local))
    e.set(_REC, replica, (r << _RB) | (nr << _LB) | (local + 1))
    e.set(_SLOT, (nr << _SB) | local, replica)


def _unplace(e: Edit, v: int) -> None:
    """Free the node and local ranks of a placed replica whose _REC value is ``v``."""
    d = e.dicts
    local, nr = (v & _LM) - 1, (v >> _LB) & _NM
    node = d[_NOWNER][nr]
    m0 = d[_NODES][node] >> _NB
    e.pop(_SLOT, (nr << _SB) | local)
    _node_write(e, node, nr, m0, m0 & ~(1 << local))


def _take_preference(e: Edit, replica: Replica) -> tuple[Node, int] | None:
    """Drop ``replica``'s preference (if it has one) and return it as (node, slot)."""
    d = e.dicts
    if replica not in d[_PNODE]:
        return None
    return e.pop(_PNODE, replica), e.pop(_PSLOT, replica)


def _write_nodes(e: Edit, work: Mapping) -> None:
    """Write nodes whose masks a bulk operation changed (``work``: node -> [nr, mask])
    and their _HOLEY entries; nodes left with no replica leave _NODES."""
    holey = e.dicts[_HOLEY]
    e.update(_NODES, {n: (m << _NB) | nr for n, (nr, m) in work.items() if m})
    e.pop_many(_NODES, [n for n, (_, m) in work.items() if not m])
    e.insert_new(_HOLEY, {n: 1 for n, (_, m) in work.items() if m & (m + 1) and n not in holey})
    e.pop_many(_HOLEY, [n for n, (_, m) in work.items() if not (m & (m + 1)) and n in holey])


class RankTable(Persistent):
    """Immutable map of replicas to ranks at three levels.

    Replicas and nodes are any hashable ids. A replica first holds a global
    rank (``assign`` with no node) and gets its node and local ranks when
    placed (``place``); ``assign(replica, node)`` does both at once.
    """

    __slots__ = ()
    _N_TABLES = _N_TABLES

    # ------------------------------------------------------------- queries
    @locked
    def __len__(self) -> int:
        return len(self._read()[_REC])

    @locked
    def __contains__(self, replica: object) -> bool:
        return replica in self._read()[_REC]

    @locked
    def __iter__(self) -> Iterator[Replica]:
        """Replicas in global-rank order (dict order would depend on version history)."""
        owner = self._read()[_OWNER]
        return iter([owner[r] for r in sorted(owner)])

    def _value(self, replica: Replica) -> int:
        if self._link is not None:
            self._reroot()
        try:
            return self._store.dicts[_REC][replica]
        except KeyError:
            raise UnknownReplica(f"replica {replica!r} holds no rank") from None

    # The hot reads take the store's lock inline (one frame less than @locked).
    def global_rank(self, replica: Replica) -> int:
        with self._store.lock:
            if self._link is not None:
                self._reroot()
            try:
                return self._store.dicts[_REC][replica] >> _RB
            except KeyError:
                raise UnknownReplica(f"replica {replica!r} holds no rank") from None

    def node_of(self, replica: Replica) -> Node | None:
        with self._store.lock:
            if self._link is not None:
                self._reroot()
            dicts = self._store.dicts
            try:
                v = dicts[_REC][replica]
            except KeyError:
                raise UnknownReplica(f"replica {replica!r} holds no rank") from None
            return dicts[_NOWNER][(v >> _LB) & _NM] if v & _LM else None

    @locked
    def is_placed(self, replica: Replica) -> bool:
        return bool(self._value(replica) & _LM)

    def rank_of(self, replica: Replica) -> ReplicaRank | None:
        """The full rank, or None while the replica holds only a global rank."""
        with self._store.lock:
            v = self._value(replica)
        local = v & _LM
        return _rank(v >> _RB, (v >> _LB) & _NM, local - 1) if local else None

    def rank_tuple(self, replica: Replica) -> tuple[int, int | None, int | None]:
        """(global rank, node rank, local rank), the last two None while the replica
        holds only a global rank: ``rank_of`` without making a record (a trace
        writer reads one per replica a step touched)."""
        with self._store.lock:
            v = self._value(replica)
        local = v & _LM
        return (v >> _RB, (v >> _LB) & _NM, local - 1) if local else (v >> _RB, None, None)

    @locked
    def holder_of(self, rank: int) -> Replica | None:
        return self._read()[_OWNER].get(rank)

    @locked
    def node_rank(self, node: Node) -> int | None:
        v = self._read()[_NODES].get(node)
        return None if v is None else v & _NM

    @locked
    def nodes(self) -> dict[Node, int]:
        """Nodes hosting at least one placed replica, with their node ranks."""
        return {n: v & _NM for n, v in self._read()[_NODES].items()}

    @locked
    def replicas_on(self, node: Node) -> int:
        v = self._read()[_NODES].get(node)
        return 0 if v is None else (v >> _NB).bit_count()

    @locked
    def local_ranks_on(self, node: Node) -> frozenset[int]:
        """The local ranks held on ``node`` (O(replicas on it), not O(table))."""
        v = self._read()[_NODES].get(node)
        return frozenset() if v is None else frozenset(_bit_positions(v >> _NB))

    @locked
    def lowest_free(self) -> int:
        d = self._read()
        hw = d[_META].get("hw", 0)
        if hw == len(d[_OWNER]):
            return hw
        return _bits_lowest_free(d[_GBITS])

    @locked
    def items(self) -> Iterator[tuple[Replica, ReplicaRank | None]]:
        d = self._read()
        rec, owner = d[_REC], d[_OWNER]
        out: list[tuple[Replica, ReplicaRank | None]] = []
        append = out.append
        for r in sorted(owner):
            rep = owner[r]
            v = rec[rep]
            local = v & _LM
            append((rep, _rank(r, (v >> _LB) & _NM, local - 1) if local else None))
        return iter(out)

    @locked
    def to_dict(self) -> dict[Replica, tuple]:
        """Plain snapshot: replica -> (rank, node, node_rank, local_rank), in rank order."""
        d = self._read()
        rec, owner, nowner = d[_REC], d[_OWNER], d[_NOWNER]
        out = {}
        for r in sorted(owner):
            rep = owner[r]
            v = rec[rep]
            local = v & _LM
            if local:
                nr = (v >> _LB) & _NM
                out[rep] = (r, nowner[nr], nr, local - 1)
            else:
                out[rep] = (r, None, None, None)
        return out

    @locked
    def preferred_node(self, replica: Replica) -> Node | None:
        """The predecessor's node of an unplaced crash replacement (see :meth:`replace`), else None."""
        return self._read()[_PNODE].get(replica)

    @locked
    def preferences(self) -> dict[Replica, tuple[Node, int, int]]:
        """Unplaced crash replacements -> their predecessor's (node, node rank,
        local rank), which :meth:`place` on that node takes where still free
        (see :meth:`replace`). Not part of :meth:`to_dict`."""
        d = self._read()
        return {rep: (node, d[_PSLOT][rep] >> _SB, d[_PSLOT][rep] & _SM) for rep, node in d[_PNODE].items()}

    def __eq__(self, other: object) -> bool:
        """Same ranks, and the same preferences (they decide what ``place`` gives)."""
        if not isinstance(other, RankTable):
            return NotImplemented
        if self is other:
            return True
        return self.to_dict() == other.to_dict() and self.preferences() == other.preferences()

    def __hash__(self) -> int:
        return hash(frozenset(self.to_dict().items()))

    @locked
    def __repr__(self) -> str:
        prefs = self.preferences()
        more = f", preferences={prefs!r}" if prefs else ""
        return f"RankTable.from_dict({self.to_dict()!r}{more})"

    @classmethod
    def from_dict(
        cls, snapshot: Mapping[Replica, tuple], preferences: Mapping[Replica, tuple] | None = None
    ) -> RankTable:
        """Rebuild from ``to_dict()`` output, and ``preferences()`` output if
        given (a snapshot alone loses them), so ``repr`` is valid Python."""
        placed, reserved = [], []
        for rep, (r, node, node_rank, local) in snapshot.items():
            if node is None:
                reserved.append((rep, r))
            else:
                placed.append((rep, node, ReplicaRank(rank=r, node_rank=node_rank, local_rank=local)))
        t = cls().recover_many(placed)
        for rep, r in reserved:
            t = t.assign(rep, rank=r)
        if preferences:
            t = t._with_preferences(preferences)
        return t

    @atomic
    def _with_preferences(self, preferences: Mapping[Replica, tuple]) -> RankTable:
        rec = self._read()[_REC]
        e = Edit(self)
        for rep, (node, nr, local) in preferences.items():
            if rec.get(rep, 1) & _LM:
                raise InvalidConfig(f"a preference is for an unplaced replica; {rep!r} is placed or unknown")
            if type(nr) is not int or type(local) is not int or not (0 <= nr < MAX_RANKS and 0 <= local < MAX_LOCAL):
                raise InvalidConfig(f"preference of {rep!r} needs a node rank and a local rank in range, "
                                    f"got {shown((node, nr, local))}")
            e.set(_PNODE, rep, node)
            e.set(_PSLOT, rep, (nr << _SB) | local)
        return e.commit()

    @locked
    def is_contiguous(self) -> bool:
        """True when every level is exactly 0..count-1 (O(1): counters kept by every edit)."""
        d = self._read()
        meta = d[_META]
        return (
            meta.get("hw", 0) == len(d[_OWNER])
            and meta.get("nhw", 0) == len(d[_NOWNER])
            and not d[_HOLEY]
        )

    @locked
    def lower_bound(self) -> LowerBound:
        """The replicas any compaction to contiguous must change, per level and in all.

        Costs O(what is off: the holes and the nodes whose local ranks have
        holes), not O(replicas)."""
        d = self._read()
        rec, owner, nodes, nowner, meta = d[_REC], d[_OWNER], d[_NODES], d[_NOWNER], d[_META]
        n, k = len(rec), len(nodes)
        movers = _held_from(owner, n, meta.get("hw", 0))
        far = set(_held_from(nowner, k, meta.get("nhw", 0)))  # node ranks >= k
        nr_count = sum((nodes[nowner[nr]] >> _NB).bit_count() for nr in far)
        lr = 0
        changed = nr_count  # every replica on a far node, then the others
        for node in d[_HOLEY]:
            v = nodes[node]
            m = v >> _NB
            above = (m >> m.bit_count()).bit_count()
            lr += above
            if v & _NM not in far:
                changed += above
        for r in movers:
            v = rec[owner[r]]
            if v & _LM:
                nr = (v >> _LB) & _NM
                if nr in far or (v & _LM) - 1 >= (nodes[nowner[nr]] >> _NB).bit_count():
                    continue  # counted with its node or its local rank
            changed += 1
        return LowerBound(rank=len(movers), node_rank=nr_count, local_rank=lr, replicas=changed)

    # ------------------------------------------------------------ mutators
    def assign(self, replica: Replica, node: Node | None = None, *, rank: int | None = None) -> RankTable:
        """Give ``replica`` the lowest free global rank (or ``rank``, if free).

        With ``node``, also its node's rank (the lowest free one for a node new
        to this table) and the lowest free local rank on that node.
        """
        if rank is None and node is not None:
            # Hot path (a scale-up one replica at a time: no global hole, no
            # index word filling up): the writes an Edit would make, and their
            # undo list, by hand.
            store = self._store
            with store.lock:
                if self._link is not None:
                    self._reroot()
                d = store.dicts
                rec, owner, meta, nodes = d[_REC], d[_OWNER], d[_META], d[_NODES]
                hw = meta.get("hw", 0)
                if replica not in rec and hw == len(owner):
                    gbits = d[_GBITS]
                    gold = gbits.get(hw >> 6, 0)
                    gnew = gold | (1 << (hw & 63))
                    v = nodes.get(node)
                    if v is not None:
                        m0, nr = v >> _NB, v & _NM
                        local = _lowest_free_local(m0)
                        fast = gnew != _FULL and local < MAX_LOCAL
                    else:
                        m0, v, local = 0, MISSING, 0
                        nowner, nbits = d[_NOWNER], d[_NBITS]
                        nr = meta.get("nhw", 0)
                        nold = nbits.get(nr >> 6, 0)
                        nnew = nold | (1 << (nr & 63))
                        fast = gnew != _FULL and nnew != _FULL and nr == len(nowner)
                    if fast:
                        m1 = m0 | (1 << local)
                        key = (nr << _SB) | local
                        undo = [
                            (_OWNER, hw, MISSING),
                            (_GBITS, hw >> 6, gold if gold else MISSING),
                            (_META, "hw", meta.get("hw", MISSING)),
                            (_NODES, node, v),
                            (_REC, replica, MISSING),
                            (_SLOT, key, MISSING),
                        ]
                        owner[hw] = replica
                        gbits[hw >> 6] = gnew
                        meta["hw"] = hw + 1
                        nodes[node] = (m1 << _NB) | nr
                        rec[replica] = (hw << _RB) | (nr << _LB) | (local + 1)
                        d[_SLOT][key] = replica
                        if v is MISSING:
                            undo.append((_NOWNER, nr, MISSING))
                            undo.append((_NBITS, nr >> 6, nold if nold else MISSING))
                            undo.append((_META, "nhw", meta.get("nhw", MISSING)))
                            nowner[nr] = node
                            nbits[nr >> 6] = nnew
                            meta["nhw"] = nr + 1
                        else:
                            holey = d[_HOLEY]
                            if m1 & (m1 + 1):
                                if node not in holey:
                                    undo.append((_HOLEY, node, MISSING))
                                    holey[node] = 1
                            elif node in holey:
                                undo.append((_HOLEY, node, 1))
                                del holey[node]
                        return self._next(undo)
        return self._assign(replica, node, rank)

    @atomic
    def _assign(self, replica: Replica, node: Node | None, rank: int | None) -> RankTable:
        d = self._read()
        rec = d[_REC]
        if replica in rec:
            raise RankConflict(f"replica {replica!r} already holds rank {rec[replica] >> _RB}")
        meta, owner = d[_META], d[_OWNER]
        hw = meta.get("hw", 0)
        if rank is None:
            r = hw if hw == len(owner) else _bits_lowest_free(d[_GBITS])
        else:
            if type(rank) is not int or not 0 <= rank < MAX_RANKS:
                raise InvalidConfig(f"rank must be an int in 0..{MAX_RANKS - 1}, got {shown(rank)}")
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
            e.set(_REC, replica, r << _RB)
            _count(e, "unplaced", 1)
        else:
            _place(e, replica, r, node)
        return e.commit()

    @atomic
    def place(self, replica: Replica, node: Node) -> RankTable:
        """Give a replica that holds only a global rank its node and local ranks."""
        v = self._value(replica)
        if v & _LM:
            raise RankConflict(f"replica {replica!r} is already placed on node {self.node_of(replica)!r}")
        e = Edit(self)
        pref = _take_preference(e, replica)
        _place(e, replica, v >> _RB, node, pref[1] if pref is not None and pref[0] == node else -1)
        _count(e, "unplaced", -1)
        return e.commit()

    @atomic
    def unplace(self, replica: Replica) -> RankTable:
        """Take a placed replica off its node: it keeps its global rank only
        (a placement the executor could not carry out)."""
        v = self._value(replica)
        if not v & _LM:
            raise RankConflict(f"replica {replica!r} is not placed")
        e = Edit(self)
        _unplace(e, v)
        e.set(_REC, replica, (v >> _RB) << _RB)
        _count(e, "unplaced", 1)
        return e.commit()

    @atomic
    def release(self, replica: Replica) -> RankTable:
        """Free every rank the replica holds (call once it has fully stopped)."""
        v = self._value(replica)
        r = v >> _RB
        e = Edit(self)
        e.pop(_REC, replica)
        owner = e.dicts[_OWNER]
        e.pop(_OWNER, r)
        _bits_clear(e, _GBITS, r)
        hw = e.dicts[_META].get("hw", 0)
        if r == hw - 1:
            e.set(_META, "hw", _top(hw, owner))
        if v & _LM:
            _unplace(e, v)
        else:
            _count(e, "unplaced", -1)
            _take_preference(e, replica)
        return e.commit()

    @atomic
    def replace(self, old: Replica, new: Replica, node: Node | None = None) -> RankTable:
        """Crash replacement: ``new`` takes ``old``'s global rank; ``old`` leaves.

        A restarted replica keeps its ranks: on ``old``'s node, ``new`` takes
        ``old``'s node and local ranks too (even if a lower local rank is
        free: compaction fixes that later, as after any release). On another
        node it gets the lowest free local rank there (and ``old``'s ranks are
        freed). With no ``node``, ``new`` holds only the global rank and
        remembers ``old``'s node, node rank and local rank as a preference:
        ``place(new, that node)`` takes them where still free (the node rank
        if the node had been left empty). The preference is dropped when
        ``new`` is placed or released, and passes on if ``new`` is itself
        replaced before being placed; see :meth:`preferences`.
        """
        if self._link is not None:
            self._reroot()
        dicts = self._store.dicts
        rec = dicts[_REC]
        try:
            v = rec[old]
        except KeyError:
            raise UnknownReplica(f"replica {old!r} holds no rank") from None
        if new in rec:
            raise RankConflict(f"replica {new!r} already holds rank {rec[new] >> _RB}")
        r = v >> _RB
        if node is not None and v & _LM:
            key = (((v >> _LB) & _NM) << _SB) | ((v & _LM) - 1)
            if dicts[_NOWNER][key >> _SB] == node:
                # Hot path (a crash replaced in place): new takes over old's slot, all three ranks.
                del rec[old]
                rec[new] = v
                dicts[_OWNER][r] = new
                dicts[_SLOT][key] = new
                return self._next([(_REC, old, v), (_REC, new, MISSING), (_OWNER, r, old), (_SLOT, key, old)])
        e = Edit(self)
        pref: tuple[Node, int] | None
        if v & _LM:
            nr = (v >> _LB) & _NM
            pref = (dicts[_NOWNER][nr], (nr << _SB) | ((v & _LM) - 1))
            _unplace(e, v)
        else:  # old was an unplaced replacement itself: its preference passes on
            pref = _take_preference(e, old)
        e.pop(_REC, old)
        e.set(_OWNER, r, new)
        if node is None:
            e.set(_REC, new, r << _RB)
            if v & _LM:
                _count(e, "unplaced", 1)
            if pref is not None:
                e.set(_PNODE, new, pref[0])
                e.set(_PSLOT, new, pref[1])
        else:
            _place(e, new, r, node, pref[1] if pref is not None and pref[0] == node else -1)
            if not v & _LM:
                _count(e, "unplaced", -1)
        return e.commit()

    def recover(self, replica: Replica, node: Node, rank: ReplicaRank) -> RankTable:
        """Put back a rank a live replica reports (controller recovery)."""
        return self.recover_many(((replica, node, rank),))

    @atomic_bulk
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
                raise InvalidConfig(f"recover needs a ReplicaRank for {shown(replica)}, got {shown(rk)}")
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
                    info = [base & _NM, base >> _NB]
                node_info[node] = info
            if info[0] != rk.node_rank:
                raise RankConflict(
                    f"node {node!r} has node rank {info[0]}, but {replica!r} reports {rk.node_rank}"
                )
            bit = 1 << rk.local_rank
            if info[1] & bit:
                raise RankConflict(f"local rank {rk.local_rank} on node {node!r} is claimed twice")
            info[1] |= bit
            new_rec[replica] = (r << _RB) | (rk.node_rank << _LB) | (rk.local_rank + 1)
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
        e.insert_new(_REC, new_rec)
        e.insert_new(_OWNER, new_owner)
        e.insert_new(_SLOT, {(((v >> _LB) & _NM) << _SB) | ((v & _LM) - 1): rep for rep, v in new_rec.items()})
        _write_nodes(e, node_info)
        e.insert_new(_NOWNER, {nr: n for n, nr in fresh.items()})
        _bits_update(e, _GBITS, add=new_owner)
        _bits_update(e, _NBITS, add=fresh.values())
        meta = d[_META]
        e.set(_META, "hw", max(meta.get("hw", 0), max(new_owner) + 1))
        if fresh:
            e.set(_META, "nhw", max(meta.get("nhw", 0), max(fresh.values()) + 1))
        return e.commit()

    def _take_free(self, d: tuple[dict, ...], k: int) -> list[int]:
        hw = d[_META].get("hw", 0)
        holes = hw - len(d[_OWNER])
        ranks = list(islice(_bits_iter_free(d[_GBITS]), min(holes, k))) if holes else []
        ranks.extend(range(hw, hw + k - len(ranks)))
        if ranks and ranks[-1] >= MAX_RANKS:
            raise InvariantViolation(f"rank space exhausted ({MAX_RANKS} ranks)")
        return ranks

    @atomic_bulk
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
            raise RankConflict(f"replica {taken[0]!r} already holds rank {rec[taken[0]] >> _RB}")
        ranks = self._take_free(d, len(pairs))
        nodes = d[_NODES]
        work: dict = {}  # node -> [node_rank, mask]
        free_nodes = _bits_iter_free(d[_NBITS])  # a node new to the table takes the next one
        fresh: dict = {}  # node rank -> node
        new_rec: dict = {}
        new_slot: dict = {}
        for (rep, node), r in zip(pairs, ranks):
            if node is None:
                new_rec[rep] = r << _RB
                continue
            info = work.get(node)
            if info is None:
                base = nodes.get(node)
                if base is None:
                    nr = next(free_nodes)
                    fresh[nr] = node
                    info = work[node] = [nr, 0]
                else:
                    info = work[node] = [base & _NM, base >> _NB]
            nr, m = info
            local = ((~m) & (m + 1)).bit_length() - 1
            info[1] = m | (1 << local)
            new_rec[rep] = (r << _RB) | (nr << _LB) | (local + 1)
            new_slot[(nr << _SB) | local] = rep
        for node, (_, m) in work.items():
            if m >> MAX_LOCAL:
                raise InvariantViolation(f"node {node!r} would hold more than {MAX_LOCAL} replicas")
        hw = d[_META].get("hw", 0)
        e = Edit(self)
        e.insert_new(_REC, new_rec)
        e.insert_new(_OWNER, dict(zip(ranks, replicas)))
        e.insert_new(_SLOT, new_slot)
        _write_nodes(e, work)
        e.insert_new(_NOWNER, fresh)
        below = [r for r in ranks if r < hw]
        if below:
            _bits_update(e, _GBITS, add=below)
        if ranks[-1] >= hw:
            _bits_set_range(e, _GBITS, hw, ranks[-1] + 1)
            e.set(_META, "hw", ranks[-1] + 1)
        if fresh:
            _bits_update(e, _NBITS, add=fresh)
            e.set(_META, "nhw", max(d[_META].get("nhw", 0), max(fresh) + 1))
        if len(new_slot) < len(new_rec):
            _count(e, "unplaced", len(new_rec) - len(new_slot))
        return e.commit()

    @atomic_bulk
    def release_many(self, replicas: Iterable[Replica]) -> RankTable:
        """``release`` for many replicas in one version."""
        reps = list(replicas)  # before reading: the iterable may read another version
        d = self._read()
        rec, owner, nodes, nowner = d[_REC], d[_OWNER], d[_NODES], d[_NOWNER]
        if len(set(reps)) != len(reps):
            raise InvalidConfig("release_many got the same replica twice")
        missing = [rep for rep in reps if rep not in rec]
        if missing:
            raise UnknownReplica(f"replica {missing[0]!r} holds no rank")
        if not reps:
            return self
        e = Edit(self)
        old = e.pop_many(_REC, reps)
        ranks = [v >> _RB for v in old.values()]
        e.pop_many(_OWNER, ranks)
        work: dict = {}  # node rank -> mask
        slots: list[int] = []
        append = slots.append
        unplaced: list[Replica] = []
        for rep, v in old.items():
            local = (v & _LM) - 1
            if local < 0:
                unplaced.append(rep)
                continue
            nr = (v >> _LB) & _NM
            m = work.get(nr)
            if m is None:
                m = nodes[nowner[nr]] >> _NB
            work[nr] = m & ~(1 << local)
            append((nr << _SB) | local)
        e.pop_many(_SLOT, slots)
        gone = [nr for nr, m in work.items() if not m]
        _write_nodes(e, {nowner[nr]: (nr, m) for nr, m in work.items()})
        e.pop_many(_NOWNER, gone)
        _bits_update(e, _GBITS, remove=ranks)
        meta = d[_META]
        e.set(_META, "hw", _top(meta.get("hw", 0), owner))
        if gone:
            _bits_update(e, _NBITS, remove=gone)
            e.set(_META, "nhw", _top(meta.get("nhw", 0), nowner))
        if unplaced:
            _count(e, "unplaced", -len(unplaced))
            pnode = d[_PNODE]
            preferring = [rep for rep in unplaced if rep in pnode]
            e.pop_many(_PNODE, preferring)
            e.pop_many(_PSLOT, preferring)
        return e.commit()

    @atomic_bulk
    def compact(self, active: Iterable[Replica] | None = None) -> tuple[RankTable, Reassignments]:
        """Make all three levels contiguous, changing only the ranks that must change.

        Ranks at or above the new count move, lowest old rank first, into the
        holes below it, lowest hole first (the same rule at node and local
        level), so the changes equal :meth:`lower_bound`. ``active``, when
        given, must be exactly the table's replicas. Everything is validated
        before anything changes. Costs O(replicas changed + holes), not
        O(replicas) (checking ``active``, when given, is O(replicas)).
        """
        act = None if active is None else set(active)  # before reading (see recover_many)
        d = self._read()
        rec, owner, nodes, nowner, slot, meta = d[_REC], d[_OWNER], d[_NODES], d[_NOWNER], d[_SLOT], d[_META]
        if act is not None and act != rec.keys():
            stale = sorted(map(repr, rec.keys() - act))[:5]
            unranked = sorted(map(repr, act - rec.keys()))[:5]
            raise InvariantViolation(
                f"compact: active replicas differ from the table "
                f"(ranked but not active: {stale}; active without rank: {unranked})"
            )
        if meta.get("unplaced", 0):
            unplaced = next(rep for rep, v in rec.items() if not v & _LM)
            raise InvariantViolation(f"compact: replica {unplaced!r} is not placed yet")
        n, k = len(rec), len(nodes)
        # Global level: holders of ranks >= n move into the holes below n.
        movers = _held_from(owner, n, meta.get("hw", 0))
        holes = list(islice(_bits_iter_free(d[_GBITS]), len(movers))) if movers else []
        if len(holes) != len(movers) or (holes and holes[-1] >= n):
            raise InvariantViolation("compact: global ranks are not unique")
        new_rank = {owner[old]: new for old, new in zip(movers, holes)}
        # Node level, the same rule over node ranks.
        nmovers = _held_from(nowner, k, meta.get("nhw", 0))
        nholes = list(islice(_bits_iter_free(d[_NBITS]), len(nmovers))) if nmovers else []
        if len(nholes) != len(nmovers) or (nholes and nholes[-1] >= k):
            raise InvariantViolation("compact: node ranks are not unique")
        new_nr = dict(zip(nmovers, nholes))  # old node rank -> new
        # Local level: on nodes whose used local ranks are not 0..count-1.
        new_local: dict = {}
        new_masks: dict = {}  # node -> its mask after
        for node in d[_HOLEY]:
            v = nodes[node]
            nr, m = v & _NM, v >> _NB
            c = m.bit_count()
            for old_local, hole in zip(_bit_positions(m >> c), _bit_positions(~m & ((1 << c) - 1))):
                new_local[slot[(nr << _SB) | (old_local + c)]] = hole
            new_masks[node] = (1 << c) - 1
        changed = dict.fromkeys(new_rank)
        changed.update(dict.fromkeys(new_local))
        for nr in nmovers:  # every replica on a moved node changes node rank
            changed.update((slot[(nr << _SB) | i], None) for i in _bit_positions(nodes[nowner[nr]] >> _NB))
        if not changed:
            return self, Reassignments()
        olds: dict = {}
        news: dict = {}
        rec_updates: dict = {}
        old_slots = []
        new_slots: dict = {}
        node_ranks: dict = {}
        new_node_ranks: dict = {}
        for rep in changed:
            v = rec[rep]
            r, nr, local = v >> _RB, (v >> _LB) & _NM, (v & _LM) - 1
            node = nowner[nr]
            r2, nr2, l2 = new_rank.get(rep, r), new_nr.get(nr, nr), new_local.get(rep, local)
            olds[rep] = (r, node, local)
            news[rep] = (r2, node, l2)
            node_ranks[node] = nr
            new_node_ranks[node] = nr2
            rec_updates[rep] = (r2 << _RB) | (nr2 << _LB) | (l2 + 1)
            old_slots.append((nr << _SB) | local)
            new_slots[(nr2 << _SB) | l2] = rep
        e = Edit(self)
        e.update(_REC, rec_updates)
        e.pop_many(_OWNER, movers)
        e.insert_new(_OWNER, {new: rep for rep, new in new_rank.items()})
        e.pop_many(_SLOT, old_slots)
        e.insert_new(_SLOT, new_slots)
        moved = {nowner[nr]: new for nr, new in new_nr.items()}  # node -> its new node rank
        e.update(_NODES, {
            node: (new_masks.get(node, nodes[node] >> _NB) << _NB) | moved.get(node, nodes[node] & _NM)
            for node in moved.keys() | new_masks.keys()
        })
        e.pop_many(_NOWNER, nmovers)
        e.insert_new(_NOWNER, {new: node for node, new in moved.items()})
        e.pop_many(_HOLEY, list(new_masks))
        if movers:  # the index becomes exactly 0..n-1: bit by bit, or rewritten when cheaper
            if len(movers) < n >> 6:
                _bits_update(e, _GBITS, add=holes, remove=movers)
            else:
                _bits_prefix(e, _GBITS, n)
            e.set(_META, "hw", n)
        if nmovers:
            if len(nmovers) < k >> 6:
                _bits_update(e, _NBITS, add=nholes, remove=nmovers)
            else:
                _bits_prefix(e, _NBITS, k)
            e.set(_META, "nhw", k)
        order = sorted(olds, key=lambda rep: news[rep][0])
        return e.commit(), Reassignments(order, olds, news, node_ranks, new_node_ranks)
