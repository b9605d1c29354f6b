"""Hostile input for the core and the request plane (issue 40, "Hostile input on every surface").

The pieces the campaign (``tests/property/test_hostile_events.py``) and its tally script
(``benchmarks/bench_hostile.py``) share:

* ``forge``: a copy of a record with fields changed *without* its validators (what an
  unpickled or hand-built record can hold), so the core itself is tested, not the constructors;
* strategies of hostile values (wrong types, out of range, NaN, inf, huge ints, empty strings,
  None, wrong nested types, an object whose every method raises) and of malformed variants of
  a valid event (one field, one nested field, one element of a tuple field);
* ``templates``: a valid event of every type the core takes, naming things the state holds;
  ``stale_events``: news of retired replicas, deleted deployments, unknown nodes, old clocks,
  old versions, older proxy incarnations; ``NOT_EVENTS``: things that are no event at all;
* ``attempt``: the contract. ``rankcore.step`` either returns a ``Step`` (then every invariant
  holds: ``check_state``, ``check_step(full=True)``) or raises a ``RankcoreError`` (never
  ``InvariantViolation``) whose message names the field or one of the event's ids; the input
  state is unchanged (``deep_view``) either way. Any other exception fails the test;
* the same for the request machine, the batcher and the model cache (their views);
* ``TALLY``: what was tried, by kind, event type and outcome (the error's class).
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Iterable
from typing import Any

import attrs
import immutables
from hypothesis import note
from hypothesis import strategies as st

import rankcore as rc
import rankcore.requests as rq
from rankcore import invariants as inv
from rankcore.base import events as ev
from rankcore.base.errors import InvariantViolation, RankcoreError
from rankcore.base.fields import shown
from rankcore.base.lifecycle import Phase
from rankcore.base.proxybook import ProxyOptions
from rankcore.base.state import State, Step
from rankcore.protocol import answers

_GB = 10**9

# ------------------------------------------------------------------ the tally


class Tally:
    """Events tried: ``(kind, event type, outcome)`` -> count; outcome ``applied`` or the
    refusing error's class name."""

    def __init__(self) -> None:
        self.counts: Counter[tuple[str, str, str]] = Counter()

    def add(self, kind: str, event: object, outcome: str) -> None:
        self.counts[(kind, type(event).__name__, outcome)] += 1

    def applied(self, kind: str, event: object) -> None:
        self.add(kind, event, "applied")

    def refused(self, kind: str, event: object, exc: BaseException) -> None:
        self.add(kind, event, type(exc).__name__)

    def clear(self) -> None:
        self.counts.clear()

    def total(self) -> int:
        return sum(self.counts.values())

    def lines(self, detail: bool = True) -> list[str]:
        """The summary: one headline, then by kind, then (``detail``) by event type."""
        total = self.total()
        applied = sum(n for (_, _, o), n in self.counts.items() if o == "applied")
        by_error: Counter[str] = Counter()
        for (_, _, o), n in self.counts.items():
            if o != "applied":
                by_error[o] += n
        errors = ", ".join(f"{k} {n}" for k, n in sorted(by_error.items(), key=lambda kv: (-kv[1], kv[0])))
        out = [f"{total} events tried: {applied} applied, {total - applied} refused by class"
               + (f" ({errors})" if errors else "")]
        kinds = sorted({k for k, _, _ in self.counts})
        for kind in kinds:
            rows = {key: n for key, n in self.counts.items() if key[0] == kind}
            n_all = sum(rows.values())
            n_ok = sum(n for (_, _, o), n in rows.items() if o == "applied")
            errs: Counter[str] = Counter()
            for (_, _, o), n in rows.items():
                if o != "applied":
                    errs[o] += n
            tail = ", ".join(f"{k} {n}" for k, n in sorted(errs.items()))
            out.append(f"  {kind:<22} {n_all:>7} tried: {n_ok:>6} applied, {n_all - n_ok:>6} refused"
                       + (f" ({tail})" if tail else ""))
            if detail:
                types = sorted({t for _, t, _ in rows})
                for t in types:
                    mine = {o: n for (_, tt, o), n in rows.items() if tt == t}
                    parts = ", ".join(f"{o} {n}" for o, n in sorted(mine.items()))
                    out.append(f"      {t:<26} {parts}")
        return out


TALLY = Tally()

# ------------------------------------------------------------------ forging


def forge(record: Any, **changes: Any) -> Any:
    """A copy of attrs ``record`` with ``changes``, built without its converters or validators
    (``object.__new__`` and the slots set one by one): what pickle or a hand-made record gives."""
    cls = type(record)
    new = object.__new__(cls)
    for a in attrs.fields(cls):
        object.__setattr__(new, a.name, changes[a.name] if a.name in changes else getattr(record, a.name))
    return new


class NastyError(RuntimeError):
    """What a ``Nasty`` raises: the caller's own value failing (its ``__eq__`` on a ``user_config``
    the core compares, its ``__iter__`` in a constructor's conversion), not the core."""


class Nasty:
    """A value whose every method raises ``NastyError``: compared, hashed, shown, tested for truth."""

    def _boom(self, *args: Any) -> Any:
        raise NastyError("nasty")

    __eq__ = __ne__ = __lt__ = __le__ = __gt__ = __ge__ = __hash__ = __repr__ = __str__ = __bool__ = _boom
    __len__ = __iter__ = __index__ = __float__ = __int__ = _boom


class OddStr(str):
    """A str that equals every other (its hash is the str's): an id that matches what it should not."""

    def __eq__(self, other: object) -> bool:
        return True

    def __ne__(self, other: object) -> bool:
        return False

    __hash__ = str.__hash__


HUGE = 10**400
VERY_HUGE = 10**5000  # (more digits than int -> str converts)

#: hostile scalars: wrong types, out of range, not finite, empty, nested wrong (and, in ``scalars``,
#: ``VERY_HUGE`` and ``Nasty()``, whose reprs raise)
SCALARS: tuple[Any, ...] = (
    None, "", " ", "x", "ghost", "llm", "node-a", -1, 0, 1, 7, 2**31, 2**63, -(2**63), HUGE,
    math.nan, -math.nan, math.inf, -math.inf, -0.0, 0.5, -1.5, 1e308, 5e-324, True, False, b"llm",
    bytearray(b"x"), (), ("x",), ("x", "x"), (1, 2), ((1, 2),), [], ["llm#0"], {}, {"GPU": -1}, {"rank": "0"},
    frozenset({1}), 1j, Phase.RUNNING, rc.ReplicaReady(replica_id="llm#0"), OddStr("llm#0"), OddStr("node-a"),
)


class _Unshowable:
    """Stands for a value whose ``repr`` raises, in a ``sampled_from`` (hypothesis shows its
    elements): ``_resolve`` swaps it for the value."""

    def __init__(self, name: str) -> None:
        self.name = name

    def __repr__(self) -> str:
        return self.name


_VERY_HUGE, _NASTY = _Unshowable("VERY_HUGE"), _Unshowable("Nasty()")


def _resolve(x: Any) -> Any:
    return VERY_HUGE if x is _VERY_HUGE else Nasty() if x is _NASTY else x


#: the values whose ``repr`` raises
unshowable: st.SearchStrategy[Any] = st.sampled_from((_VERY_HUGE, _NASTY)).map(_resolve)
#: ``SCALARS``, and the unshowable ones now and then
scalars: st.SearchStrategy[Any] = st.sampled_from((*SCALARS, _VERY_HUGE, _NASTY)).map(_resolve)

hostile_values: st.SearchStrategy[Any] = st.one_of(
    scalars,
    st.integers(),
    st.floats(),
    st.text(max_size=6),
    st.lists(st.one_of(st.none(), st.integers(-3, 3), st.text(max_size=3), st.floats()), max_size=3).map(tuple),
)


def _is_record(x: Any) -> bool:
    return attrs.has(type(x)) and type(x).__module__.startswith("rankcore.")


def corrupt_tuple(data: st.DataObject, value: tuple) -> tuple:
    """One element of a tuple field made hostile (replaced, duplicated, reordered, added to)."""
    how = data.draw(st.sampled_from(["replace", "duplicate", "reverse", "append", "inner"] if value
                                    else ["append"]), label="tuple corruption")
    if how == "append":
        return (*value, data.draw(hostile_values, label="appended"))
    i = data.draw(st.integers(0, len(value) - 1), label="element")
    if how == "duplicate":
        return (*value, value[i])
    if how == "reverse":
        return tuple(reversed(value)) if len(value) > 1 else (*value, value[0])
    if how == "inner" and type(value[i]) is tuple and value[i]:
        inner = value[i]
        j = data.draw(st.integers(0, len(inner) - 1), label="inner element")
        changed = (*inner[:j], data.draw(hostile_values, label="inner value"), *inner[j + 1:])
        return (*value[:i], changed, *value[i + 1:])
    return (*value[:i], data.draw(hostile_values, label="replacement"), *value[i + 1:])


def malformed(data: st.DataObject, record: Any, depth: int = 0) -> tuple[Any, tuple[str, ...]]:
    """``record`` with one field made hostile (maybe deep: a nested record's field, one record of
    a tuple of records, one element of a tuple), and the path of field names to it."""
    name = data.draw(st.sampled_from([a.name for a in attrs.fields(type(record))]),
                     label=f"field of {type(record).__name__}")
    a = attrs.fields_dict(type(record))[name]
    value = getattr(record, a.name)
    how = data.draw(st.sampled_from(["value", "value", "nested"]), label="how")
    if how == "nested" and depth < 3:
        if _is_record(value):
            inner, path = malformed(data, value, depth + 1)
            return forge(record, **{a.name: inner}), (a.name, *path)
        if type(value) is tuple and value:
            records = [i for i, x in enumerate(value) if _is_record(x)]
            if records:
                i = data.draw(st.sampled_from(records), label="record in tuple")
                inner, path = malformed(data, value[i], depth + 1)
                return forge(record, **{a.name: (*value[:i], inner, *value[i + 1:])}), (a.name, *path)
        if type(value) is tuple:
            return forge(record, **{a.name: corrupt_tuple(data, value)}), (a.name,)
    return forge(record, **{a.name: data.draw(hostile_values, label=f"{a.name} =")}), (a.name,)


# ------------------------------------------------------------------ what a refusal must name

_ID_FIELDS = ("replica_id", "deployment", "name", "node_id", "proxy_id", "head_node", "request_id", "model_id")


def ids_of(record: Any, depth: int = 0) -> set[str]:
    """The ids a record (and the records it holds) names: what a refusal may name instead of a field."""
    out: set[str] = set()
    if not _is_record(record) or depth > 3:
        return out
    for a in attrs.fields(type(record)):
        try:
            v = getattr(record, a.name)
        except AttributeError:
            continue
        if a.name in _ID_FIELDS and type(v) is str and v:
            out.add(v)
        for x in (v if type(v) is tuple else (v,)):
            out |= ids_of(x, depth + 1)
            if type(x) is str and x and a.name in ("victims", "serving", "draining", "model_ids", "asleep",
                                                   "deleted", "no_evict", "proxy_ids"):
                out.add(x)
    return out


def names_what(message: str, event: Any, path: Iterable[str] = ()) -> bool:
    """Whether a refusal's message names one of the fields on ``path``, or an id of the event."""
    path = tuple(path)
    if any(p in message for p in path):
        return True
    if path and attrs.has(type(event)):  # (the value itself, as the core shows it: an unknown id)
        shown_value = shown(getattr(event, path[0], None))
        if len(shown_value) > 2 and shown_value in message:
            return True
    fields = [a.name for a in attrs.fields(type(event))] if attrs.has(type(event)) else []
    if not path and any(name in message for name in fields):
        return True
    if type(event).__name__ in message and any(  # ("Tick: the clock went back from 4.2 to 2.5")
            shown(getattr(event, name)) in message for name in fields):
        return True
    return any(repr(i) in message or (len(i) > 1 and (i in message or repr(i)[1:-1] in message))
               for i in ids_of(event))  # (a one-letter id only as the core quotes it: 'x')


# ------------------------------------------------------------------ the core


def deep_view(state: State) -> tuple:
    """Everything a state holds, as plain comparable values (a purity check deeper than
    ``rankcore.testing.snapshot``: every field of every deployment, the cluster, the proxies)."""
    out = []
    for a in attrs.fields(State):
        v = getattr(state, a.name)
        if a.name == "deployments":
            v = {name: tuple((b.name, dep.ranks.to_dict() if b.name == "ranks"
                              else dict(getattr(dep, b.name)) if isinstance(getattr(dep, b.name), immutables.Map)
                              else getattr(dep, b.name)) for b in attrs.fields(type(dep)))
                 for name, dep in v.items()}
        elif isinstance(v, immutables.Map):
            v = dict(v)
        out.append((a.name, v))
    return tuple(out)


def attempt(state: State, event: object, kind: str, path: Iterable[str] = (), *,
            tally: Tally | None = None) -> Step | None:
    """Step ``event`` on ``state`` under the contract; the ``Step`` if it was applied, else None."""
    tally = TALLY if tally is None else tally
    before = deep_view(state)
    note(f"hostile ({kind}): step({shown(event, 2000)})")
    try:
        result = rc.step(state, event)
    except NastyError as exc:  # (a value of the caller's own that raises when the core compares it)
        assert deep_view(state) == before, f"{kind} event raised the caller's own error but changed the state"
        tally.refused(kind, event, exc)
        return None
    except RankcoreError as exc:
        assert not isinstance(exc, InvariantViolation), f"{kind} event broke an internal rule: {exc}"
        assert deep_view(state) == before, f"{kind} event was refused but changed the caller's state"
        message = str(exc)
        assert names_what(message, event, path), f"refusal names neither {tuple(path)} nor an id: {message}"
        tally.refused(kind, event, exc)
        return None
    assert deep_view(state) == before, f"{kind} event was applied but changed the caller's state"
    inv.check_state(result.state)
    inv.check_step(state, event, result, full=True)
    tally.applied(kind, event)
    return result


def templates(state: State) -> list[Any]:
    """A valid event of every type the core takes, naming what ``state`` holds (a deployment,
    a live replica, a node) where it holds some; built by their constructors."""
    deps = sorted(state.deployments.keys())
    name = deps[0] if deps else "llm"
    dep = state.deployments.get(name)
    rids = sorted(state.index.keys())
    rid = rids[0] if rids else "llm#0"
    rep = state.replica(rid)
    nodes = sorted(state.cluster.nodes.keys())
    node = nodes[0] if nodes else "node-a"
    now = state.cluster.now + 1.0
    version = dep.weights_version if dep is not None else 0
    out: list[Any] = [
        rc.ScaleRequested(deployment=name, num_replicas=2, victims=(rid,) if rid in state.index else ()),
        rc.DeploymentDeleted(deployment=name),
        rc.ReplicaPlaced(replica_id=rid, node_id=node, now=now),
        rc.ReplicaReady(replica_id=rid),
        rc.ReplicaReconfigured(replica_id=rid, version=rep.version if rep is not None else 0),
        rc.ReplicaCrashed(replica_id=rid, reason="hostile", cause="error", now=now),
        rc.HealthChecked(replica_id=rid, healthy=False, detail="hostile", now=now),
        rc.ReplicaStopped(replica_id=rid, now=now),
        rc.NodeLost(node_id=node),
        rc.BundlesPlaced(deployment=name, bundle_nodes=(node, None, node, node)),
        rc.NodeJoined(node_id="node-z", resources={"GPU": 2, "CPU": 8}, labels={"zone": "z"}, order=9,
                      devices=(80 * _GB, 80 * _GB), cpu_cache_bytes=60 * _GB),
        rc.NodeCapacityChanged(node_id=node, resources={"GPU": 1, "CPU": 4}),
        rc.PlacementFailed(replica_id=rid, node_id=node, reason="hostile", now=now),
        rc.Tick(now=now),
        rc.SleepRequested(deployment=name),
        rc.WakeRequested(deployment=name, weights_version=version + 1),
        rc.WeightsPushed(deployment=name, version=version + 1),
        rc.TierMoved(replica_id=rid, tier="warm", nbytes=1),
        rc.TierMoveFailed(replica_id=rid, reason="hostile"),
        rc.WeightsUpdated(replica_id=rid, version=version),
        rc.AutoscalingMetrics(deployment=name, now=now, queued=1, ongoing={rid: 1}),
        rc.ProxiesConfigured(options=ProxyOptions(proxy_location="EveryNode"), head_node=node, now=now),
        rc.ProxyStarted(proxy_id=f"proxy:{node}#0", now=now),
        rc.ProxyCrashed(proxy_id=f"proxy:{node}#0", reason="hostile", now=now),
        rc.ProxyHealthChecked(proxy_id=f"proxy:{node}#0", healthy=True, ongoing=1, now=now),
        rc.NodeDraining(node_id=node, now=now),
        rc.ModelsReported(replica_id=rid, model_ids=("m0", "m1")),
    ]
    if dep is not None:
        out.append(dep.spec())  # (the deployment as it is: applied again)
    else:
        out.append(rc.DeploymentApplied(name=name, num_replicas=1, resources={"GPU": 1}, spare_processes=1,
                                        autoscaling=True, min_replicas=0, max_replicas=4))
    return out


def recovery_of(state: State) -> ev.ControllerRecovered:
    """The recovery a fresh controller would get from ``state``'s replicas (every field filled)."""
    return inv.reports_from(state)



def stale_events(state: State, retired: Iterable[str]) -> list[tuple[Any, bool]]:
    """News the core must take as stale or refuse by name: ``(event, must_be_stale)``: about
    replicas that have left (``retired``: ids no longer in the state), deployments deleted and
    gone, nodes never seen, clocks gone back, versions already acknowledged, proxy incarnations
    long gone."""
    out: list[tuple[Any, bool]] = []
    cl = state.cluster
    now = cl.now
    node = sorted(cl.nodes.keys())[0] if cl.nodes else "node-a"
    for rid in sorted(set(retired) - set(state.index.keys()))[-3:]:
        later = now + 0.5
        out += [(rc.ReplicaPlaced(replica_id=rid, node_id=node, now=later), True),
                (rc.ReplicaReady(replica_id=rid), True),
                (rc.ReplicaReconfigured(replica_id=rid, version=0), True),
                (rc.ReplicaCrashed(replica_id=rid, cause="exited", now=later), True),
                (rc.HealthChecked(replica_id=rid, healthy=False, now=later), True),
                (rc.ReplicaStopped(replica_id=rid, now=later), True),
                (rc.PlacementFailed(replica_id=rid, node_id=node, now=later), True),
                (rc.TierMoved(replica_id=rid, tier="hot"), True),
                (rc.TierMoveFailed(replica_id=rid), True),
                (rc.WeightsUpdated(replica_id=rid, version=1), True),
                (rc.ModelsReported(replica_id=rid, model_ids=("m9",)), True)]
    for name in sorted(state.deleted.keys()):
        if name in state.deployments:
            continue  # (still being deleted)
        out += [(rc.AutoscalingMetrics(deployment=name, now=now, queued=3), True),
                (rc.ScaleRequested(deployment=name, num_replicas=1), False),
                (rc.DeploymentDeleted(deployment=name), False),
                (rc.SleepRequested(deployment=name), False),
                (rc.WakeRequested(deployment=name), False),
                (rc.WeightsPushed(deployment=name, version=99), False),
                (rc.BundlesPlaced(deployment=name, bundle_nodes=(node,)), False)]
    never = not any(r.node_id == "node-never" for r in state.replicas())  # (unmanaged: an executor may place there)
    out += [(rc.NodeLost(node_id="node-never"), never and "node-never" not in cl.nodes),
            (rc.NodeCapacityChanged(node_id="node-never", resources={"GPU": 1}), "node-never" not in cl.nodes),
            (rc.NodeDraining(node_id="node-never", now=now), False),
            (rc.ProxyStarted(proxy_id="proxy:node-a#0"), False),
            (rc.ProxyCrashed(proxy_id="proxy:node-never#0"), False),
            (rc.ProxyHealthChecked(proxy_id="proxy:node-a#0", healthy=False), False)]
    if cl.clock:
        out += [(rc.Tick(now=now), True), (rc.Tick(now=max(0.0, now - 5.0)), True)]
    for rid, name in sorted(state.index.items())[:3]:
        rep = state.deployments[name].replicas[rid]
        out.append((rc.ReplicaPlaced(replica_id=rid, node_id="node-never"), False))
        out.append((rc.PlacementFailed(replica_id=rid, node_id="node-never"), False))
        if rep.version > 0:
            out.append((rc.ReplicaReconfigured(replica_id=rid, version=rep.version - 1), True))
        if rep.weights_version > 0:
            out.append((rc.WeightsUpdated(replica_id=rid, version=rep.weights_version - 1), False))
        dep = state.deployments[name]
        out.append((rc.WeightsPushed(deployment=name, version=dep.weights_version), False))
    return out


#: things that are no event at all
NOT_EVENTS: tuple[Any, ...] = (
    None, "ReplicaReady", "", 0, -1, math.nan, b"x", (), ["llm#0"], {"replica_id": "llm#0"},
    rc.ReplicaReady, object(), State(), rc.StartReplica(replica_id="llm#0", deployment="llm", global_rank=0,
                                                                  world_size=1),
    rq.Submit(request_id="q", deployment="llm"),
)


class ReadySubclass(rc.ReplicaReady):
    """A subclass of an event: not one the core knows (it dispatches on the exact type)."""


#: ``NOT_EVENTS``, a subclass of an event, and the unshowable values
not_events: st.SearchStrategy[Any] = st.sampled_from(
    (*NOT_EVENTS, ReadySubclass(replica_id="llm#0"), _VERY_HUGE, _NASTY)).map(_resolve)
#: the same, for the request plane's machines (a ``Submit`` is one of their events; a core event is not)
not_request_events: st.SearchStrategy[Any] = st.sampled_from(
    (*(x for x in NOT_EVENTS if not isinstance(x, rq.Submit)), rc.ReplicaReady(replica_id="x"), _VERY_HUGE,
     _NASTY)).map(_resolve)


def _extreme(cls: type, valid: dict[str, Any], extreme: dict[str, Any]) -> Any:
    """``cls`` with ``extreme`` values: built by its constructor if it takes them, else forged
    from a valid one (then the core's own boundary must refuse it)."""
    try:
        return cls(**{**valid, **extreme})
    except rc.InvalidConfig:
        return forge(cls(**valid), **extreme)


def extreme_events(state: State) -> list[Any]:
    """Events with extreme values (huge counts, versions, clocks, bytes, texts): as their
    constructors build them where they take them, forged where they do not."""
    deps = sorted(state.deployments.keys())
    name = deps[0] if deps else "llm"
    rids = sorted(state.index.keys())
    rid = rids[0] if rids else "llm#0"
    now = state.cluster.now
    big = 2**63
    return [
        _extreme(rc.AutoscalingMetrics, dict(deployment=name, now=now + 1), dict(queued=HUGE)),
        _extreme(rc.AutoscalingMetrics, dict(deployment=name, now=now + 1), dict(ongoing=((rid, HUGE),))),
        _extreme(rc.AutoscalingMetrics, dict(deployment=name, now=now + 1),
                 dict(queued=big - 1, ongoing=tuple(sorted({rid: big - 1, "ghost#1": 3}.items())))),
        _extreme(rc.AutoscalingMetrics, dict(deployment=name, now=now + 1), dict(now=1e300, queued=1)),
        _extreme(rc.ScaleRequested, dict(deployment=name, num_replicas=1), dict(num_replicas=HUGE)),
        _extreme(rc.ReplicaReconfigured, dict(replica_id=rid, version=0), dict(version=HUGE)),
        _extreme(rc.WeightsPushed, dict(deployment=name, version=1), dict(version=HUGE)),
        _extreme(rc.WakeRequested, dict(deployment=name), dict(weights_version=big)),
        _extreme(rc.WeightsUpdated, dict(replica_id=rid, version=0), dict(version=HUGE)),
        _extreme(rc.TierMoved, dict(replica_id=rid, tier="hot"), dict(nbytes=HUGE)),
        _extreme(rc.ProxyHealthChecked, dict(proxy_id="proxy:node-a#0", healthy=True), dict(ongoing=HUGE)),
        _extreme(rc.NodeJoined, dict(node_id="node-huge", resources={"GPU": 1.0}),
                 dict(resources=(("CPU", 1e300), ("GPU", 1e300)))),
        _extreme(rc.NodeJoined, dict(node_id="node-big", resources={"GPU": 1.0}),
                 dict(resources=(("CPU", 2.0**53), ("GPU", 2.0**53), ("memory", 2.0**53)))),
        _extreme(rc.NodeJoined, dict(node_id="node-dev", resources={"GPU": 1}),
                 dict(devices=(HUGE,), cpu_cache_bytes=HUGE)),
        _extreme(rc.NodeCapacityChanged, dict(node_id="node-a", resources={"GPU": 1.0}),
                 dict(resources=(("GPU", 1e300),))),
        _extreme(rc.NodeCapacityChanged, dict(node_id="node-c", resources={"GPU": 1.0}),
                 dict(resources=(("CPU", 2.0**53),))),
        _extreme(rc.HealthChecked, dict(replica_id=rid, healthy=True), dict(detail="x" * 100_000)),
        _extreme(rc.ReplicaCrashed, dict(replica_id=rid), dict(reason="y" * 100_000, cause="killed")),
        _extreme(rc.ModelsReported, dict(replica_id=rid, model_ids=()),
                 dict(model_ids=tuple(f"m{i}" for i in range(500)))),
        _extreme(rc.Tick, dict(now=1.0), dict(now=1e300)),
        _extreme(rc.ReplicaPlaced, dict(replica_id=rid, node_id="node-a"), dict(now=1.7e308)),
    ]


def settle(state: State, events: Iterable[Any], *, answer: bool = True, rounds: int = 5000) -> State:
    """``events`` stepped in order, then (``answer``) every command answered as a healthy executor
    would, until nothing is left (placements on the node the core chose, proxies started)."""
    queue: list[Any] = list(events)
    while queue and rounds:
        rounds -= 1
        event = queue.pop(0)
        result = rc.step(state, event)
        state = result.state
        if not answer:
            continue
        for cmd in result.commands:
            if isinstance(cmd, rc.PlaceReplica):
                queue.append(rc.ReplicaPlaced(replica_id=cmd.replica_id, node_id=cmd.node_id))
            elif isinstance(cmd, rc.StartProxy):
                queue.append(rc.ProxyStarted(proxy_id=cmd.proxy_id))
            elif not isinstance(cmd, rc.StartReplica):
                queue.extend(answers(cmd))
    return state


def rich_states() -> list[State]:
    """A few states holding a bit of everything (built once): nodes with GPU memory and a CPU
    cache, proxies on every node, an autoscaled deployment fed load, a gang deployment, a static
    placement, models booked by GPU memory with weights pushed, spare processes, a rolling
    update, a sleeping deployment, multiplexed models reported, a deployment deleted and gone and
    one still being deleted; then the same with commands left unanswered, and after a crash."""
    if _RICH:
        return _RICH
    gb = _GB
    nodes = [rc.NodeJoined(node_id=n, resources={"GPU": 4, "CPU": 16}, order=i, devices=(80 * gb,) * 4,
                           cpu_cache_bytes=100 * gb) for i, n in enumerate(("node-a", "node-b"))]
    nodes.append(rc.NodeJoined(node_id="node-c", resources={"GPU": 4, "CPU": 16}, order=2))  # (GPUs counted: gangs)
    deploy = [
        rc.DeploymentApplied(name="auto", num_replicas=0, resources={"CPU": 1}, autoscaling=True, min_replicas=1,
                             max_replicas=4, initial_replicas=2, upscale_delay_s=0.0, downscale_delay_s=0.0),
        rc.DeploymentApplied(name="gang", num_replicas=2, resources={"GPU": 1}, gang_size=2),
        rc.DeploymentApplied(name="static", num_replicas=3, static_placement=rc.StaticPlacement(
            group="pg", bundle_nodes=("node-a", "node-b", "node-c", "node-a"), mapping=((0,), (1, 2), (3,)))),
        rc.DeploymentApplied(name="tiered", num_replicas=2, resources={"GPU": 1}, model_bytes=30 * gb),
        rc.DeploymentApplied(name="plain", num_replicas=3, resources={"CPU": 1}, spare_processes=1, version="v1",
                             user_config={"model": "v1"}, has_reconfigure=True),
        rc.DeploymentApplied(name="gone", num_replicas=1, resources={"CPU": 1}),
        rc.DeploymentApplied(name="going", num_replicas=1, resources={"CPU": 1}),
    ]
    state = settle(State(), [*nodes, rc.Tick(now=1.0),
                             rc.ProxiesConfigured(options=ProxyOptions(proxy_location="EveryNode"), head_node="node-a"),
                             *deploy])
    rid = sorted(r for r in state.index if state.index[r] == "plain")[0]
    state = settle(state, [rc.DeploymentDeleted(deployment="gone"), rc.WeightsPushed(deployment="tiered", version=1),
                           rc.SleepRequested(deployment="gang"), rc.Tick(now=5.0),
                           rc.AutoscalingMetrics(deployment="auto", now=5.0, queued=6),
                           rc.ModelsReported(replica_id=rid, model_ids=("m0", "m1"))])
    settled = state
    # commands left unanswered: a rolling update, a deletion draining, a push in flight
    state = settle(state, [rc.DeploymentApplied(name="plain", num_replicas=2, resources={"CPU": 1}, spare_processes=2,
                                                version="v2", user_config={"model": "v2"}, has_reconfigure=True),
                           rc.DeploymentDeleted(deployment="going"), rc.WeightsPushed(deployment="tiered", version=2),
                           rc.WakeRequested(deployment="gang", weights_version=1), rc.Tick(now=9.0)], answer=False)
    mid = state
    crashed = settle(mid, [rc.ReplicaCrashed(replica_id=sorted(mid.index.keys())[0], cause="exited", now=10.0),
                           rc.NodeLost(node_id="node-b")], answer=False)
    _RICH.extend([settled, mid, crashed])
    return _RICH


_RICH: list[State] = []


# ------------------------------------------------------------------ the request plane


def request_view(m: rq.RequestMachine, deps: Iterable[str], ids: Iterable[str]) -> tuple:
    """Everything the request machine shows (and its clock and deadline heap)."""
    names = sorted(set(deps) | set(m.deployments()))
    return (m.counters(), tuple((d, m.pool(d), m.queued(d), m.coming(d), m.load(d)) for d in names),
            tuple(m.status(r) for r in ids), m.deployments(), m._now, tuple(m._deadlines))


def request_probe(m: rq.RequestMachine, deps: Iterable[str], ids: Iterable[str]) -> None:
    """After a hostile event was taken: the machine still answers every read, nothing is lost, and
    the ordinary events that end everything still work (a latent corruption would raise here)."""
    c = m.counters()
    assert c.lost == 0, c
    for d in m.deployments():
        assert m.counters(d).lost == 0
    for r in ids:
        m.status(r)
    now = (m._now or 0.0) + 1e6
    m.handle(rq.Tick(now=now))
    for d in sorted(set(deps) | set(m.deployments())):
        m.handle(rc.PoolReset(deployment=d, serving=(), draining=(), coming=False))
    c = m.counters()
    assert c.lost == 0 and c.in_queue == 0, c


def batcher_view(b: rq.Batcher) -> tuple:
    forming = b._forming
    return (b.options, b.waiting, b.running, b.next_deadline(), b.batches, b.ran, b.refused, b.cancelled,
            dict(b.closed_by), b._now, None if forming is None else (forming.batch_id, dict(forming.items)),
            tuple((w.batch_id, dict(w.items)) for w in b._waiting), sorted(b._running))


def batcher_probe(b: rq.Batcher) -> None:
    """After a hostile event was taken: every batch still runs and ends."""
    now = b._now or 0.0
    for _ in range(50):
        due = b.next_deadline()
        now = max(now + 1.0, due if due is not None else now)
        out = b.handle(rq.Tick(now=now))
        for run in out:
            if isinstance(run, rq.RunBatch):
                assert run.size <= run.max_batch_size
        running = sorted(b._running)
        if not running and b.waiting == 0:
            return
        for bid in running:
            b.handle(rq.BatchDone(batch_id=bid, now=now))
    raise AssertionError("the batcher never drained after a hostile event")


def cache_view(c: rq.ModelCache) -> tuple:
    return (c.options, c.loaded_ids(), c.resident(), c.loading, c.loads, c.hits, c.evictions, c.failures)


def check_refusal(exc: BaseException, record: Any, path: Iterable[str], what: str) -> None:
    """A refusal by a request-plane machine: a RankcoreError naming the field or an id."""
    assert isinstance(exc, RankcoreError), f"{what}: {type(exc).__name__}: {exc}"
    assert not isinstance(exc, InvariantViolation), f"{what} broke an internal rule: {exc}"
    assert names_what(str(exc), record, path), f"{what}: refusal names neither {tuple(path)} nor an id: {exc}"


__all__ = [
    "TALLY", "Tally", "forge", "Nasty", "NastyError", "SCALARS", "scalars", "unshowable", "hostile_values",
    "malformed", "corrupt_tuple", "ids_of", "names_what", "deep_view", "attempt", "templates", "recovery_of",
    "stale_events", "NOT_EVENTS", "not_events", "not_request_events", "ReadySubclass", "extreme_events", "settle", "rich_states",
    "request_view", "request_probe", "batcher_view", "batcher_probe", "cache_view", "check_refusal",
]
