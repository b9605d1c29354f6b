"""The JSON Lines trace every executor writes (schema: docs/trace-format.md).

One record per event and per command, a ``delta`` after every step that
changed what a reader sees of a deployment (its target, whether it is healthy,
and only the replicas that changed), full snapshots now and then, faults the
executor injected, events the core rejected, expectation results and a closing
record with the metrics. The trace grows with what happened, not with the
fleet times the steps: a full snapshot is written when the deltas since the
last one add up to its size (or every ``snapshot_every`` steps), after a
controller recovery (which rebuilds ranks from reports the trace does not
hold), on a writer's first change and at the end. Same inputs, same bytes:
keys are written in a fixed order and nothing depends on hash order.

A delta names the replicas a step changed from what the step itself says:
the event's replica, the commands' replicas, the victims of a scale and the
replicas a compaction moved. The state is immutable and structurally shared,
so an unchanged deployment is the same object and is skipped by identity;
where the step cannot bound what it touched (a lost node) or the count of
replicas does not add up, the writer compares the whole deployment (O(N),
rare). ``verify=True`` (tests) compares every deployment after every step
and raises when the bounded delta missed a change.
"""

from __future__ import annotations

import json
import math
import os
from collections.abc import Iterable, Iterator
from typing import IO, Any

import attrs

import rankcore as rc
from rankcore import Phase

SCHEMA = "rankcore-trace"
VERSION = 3  # 3: delta records, snapshots periodic (not after every step nor at each healthy); 2: StartReplica.rank

__all__ = ["TraceWriter", "read_trace", "states", "SCHEMA", "VERSION", "jsonable"]

#: the replica keys of a snapshot or delta, in the order written
REPLICA_KEYS = ("phase", "node", "rank", "global_rank", "lineage")
#: events whose step can change replicas no record of the step names (every replica is compared)
_UNBOUNDED = (rc.NodeLost,)


def jsonable(value: Any) -> Any:
    """A JSON-safe copy of an event/command field."""
    ty = type(value)
    if ty in _PLAIN:
        return value
    conv = _BY_TYPE.get(ty)
    if conv is None:
        conv = _BY_TYPE[ty] = _converter(ty, value)
    return conv(value)


def _converter(ty: type, value: Any) -> Any:
    """How every value of ``ty`` is made JSON-safe; what it is depends on the type
    alone, so it is found once per type (a trace writes tens of thousands of
    records, and ``attrs.has``/``isinstance(_, Enum)`` per nested field were
    most of their cost)."""
    if ty is rc.ReplicaRank or ty is rc.ReportedRank:
        return lambda v: [v.rank, v.node_rank, v.local_rank]
    if issubclass(ty, Phase):
        return lambda v: v.value
    if attrs.has(ty):  # (a DeploymentApplied: its options by their flat names, rankcore.base.options)
        names = tuple(value.flat()) if ty is rc.DeploymentApplied else tuple(f.name for f in attrs.fields(ty))

        def fields(v: Any) -> dict:
            out = {}
            for n in names:
                x = getattr(v, n)
                out[n] = x if type(x) in _PLAIN else jsonable(x)
            return out
        return fields
    if issubclass(ty, dict):
        return lambda v: {str(k): jsonable(x) for k, x in v.items()}
    if issubclass(ty, (list, tuple)):
        return lambda v: [x if type(x) in _PLAIN else jsonable(x) for x in v]
    if issubclass(ty, (bool, int, float, str)):
        return lambda v: v
    return repr


#: types written as they are, and how each other type met so far is made JSON-safe
_PLAIN = frozenset({str, int, float, bool, type(None)})
_BY_TYPE: dict[type, Any] = {}
_ENCODER = json.JSONEncoder(separators=(",", ":"), check_circular=False)
_quote = json.encoder.encode_basestring_ascii  # (ensure_ascii, as the encoder)
_c_make_encoder = getattr(json.encoder, "c_make_encoder", None)
# ``JSONEncoder.encode`` builds its C encoder anew on every call: most of the cost of a
# small record. Built once here, with the same settings, it writes the same bytes.
_C_ENCODE: Any = (_c_make_encoder(None, _ENCODER.default, _quote, None, ":", ",", False, False, True)
             if _c_make_encoder is not None else None)


def _encode(value: Any) -> str:
    """``value`` as compact JSON (what ``json.dumps(value, separators=(",", ":"))`` writes)."""
    if _C_ENCODE is None:  # pragma: no cover - a Python without the json C accelerator
        return _ENCODER.encode(value)
    return "".join(_C_ENCODE(value, 0))


def fields_json(value: Any) -> str:
    """``_encode(jsonable(value))`` for an event or a command: the same bytes,
    written by a function made once per class (about a third of what the
    dict and the encoder cost per record)."""
    write = _WRITERS.get(type(value))
    if write is None:
        write = _WRITERS[type(value)] = _writer(type(value), value)
    return write(value)


def _writer(ty: type, value: Any) -> Any:
    """The generated ``fields_json`` of one attrs class. Each field is written
    inline when its value has the type the first instance's had (a class's
    fields keep their types), else by ``_value_json``."""
    if not attrs.has(ty):
        return lambda v: _encode(jsonable(v))
    names = tuple(value.flat()) if ty is rc.DeploymentApplied else tuple(f.name for f in attrs.fields(ty))
    parts = [f'"{n}":{{{_INLINE.get(type(getattr(value, n)), "_j({})").format(f"(x := v.{n})")}}}'
             for n in names]
    src = "def write(v):\n    return f'{{" + ",".join(parts) + "}}'\n"
    scope: dict[str, Any] = {"_q": _quote, "_j": _value_json, "_r": float.__repr__, "_RR": rc.ReplicaRank}
    exec(compile(src, f"<trace fields of {ty.__name__}>", "exec"), scope)
    return scope["write"]


#: how a field is written inline, by the type of its value (``{}`` reads it into ``x``)
_INLINE = {
    str: "_q(x) if {}.__class__ is str else _j(x)",
    int: "x if {}.__class__ is int else _j(x)",
    type(None): '"null" if {} is None else _j(x)',
    bool: '"true" if {} is True else "false" if x is False else _j(x)',
    float: "_r(x) if {}.__class__ is float and x - x == 0.0 else _j(x)",  # (inf, nan: x - x is not 0)
    rc.ReplicaRank: '"[%d,%d,%d]" % (x.rank, x.node_rank, x.local_rank) if {}.__class__ is _RR else _j(x)',
}


def _value_json(x: Any) -> str:
    """One field's value as JSON, when it is not of the type the generated writer
    inlines for that field (what the encoder writes for it)."""
    if x.__class__ is tuple:  # (a deployment's resources, bundles: the same tuple in every command that carries it)
        seen = _TUPLES.get(id(x))
        if seen is not None and seen[0] is x:
            return seen[1]
        js = _encode(jsonable(x))
        if _atoms(x):  # (immutable all the way down: its JSON cannot change)
            if len(_TUPLES) >= 256:
                _TUPLES.clear()
            _TUPLES[id(x)] = (x, js)  # (the tuple is held, so its id is not reused)
        return js
    return _encode(jsonable(x))


def _atoms(x: tuple) -> bool:
    return all(type(v) in _PLAIN or (type(v) is tuple and _atoms(v)) for v in x)


#: id -> (tuple, its JSON) for the tuples of atoms met lately
_TUPLES: dict[int, tuple[tuple, str]] = {}


#: the generated ``fields_json`` of each class met so far
_WRITERS: dict[type, Any] = {}


def _rank_triple(dep: rc.Deployment | None, rid: str | None) -> list | None:
    if dep is None or rid is None or rid not in dep.ranks:
        return None
    rk = dep.ranks.rank_of(rid)
    if rk is None:
        return [dep.ranks.global_rank(rid), None, None]
    return [rk.rank, rk.node_rank, rk.local_rank]


#: one replica as a snapshot shows it: (phase, node, (rank, node_rank, local_rank) or None,
#: global_rank, lineage); a tuple of atoms, which the cyclic collector stops tracking
View = tuple


def _replica_view(dep: rc.Deployment, rid: str) -> View | None:
    """What a snapshot says of one replica (None: not in the deployment)."""
    rep = dep.replicas.get(rid)
    if rep is None:
        return None
    g, node_rank, local = dep.ranks.rank_tuple(rid)
    return (rep.phase._value_, rep.node_id, None if node_rank is None else (g, node_rank, local), g, rep.lineage)


def _view_json(v: View | None) -> str:
    """One replica's view as a snapshot or a delta writes it (null: gone)."""
    if v is None:
        return "null"
    phase, node, rank, g, lin = v
    if rank is None:
        r = "null"
    else:
        a, b, c = rank  # (a placed replica's node and local ranks are ints)
        r = f"[{a},{b},{c}]"
    return (f'{{"phase":{_quote(phase)},"node":{"null" if node is None else _quote(node)},"rank":{r},'
            f'"global_rank":{g},"lineage":{"null" if lin is None else lin}}}')


def _deployment_views(dep: rc.Deployment) -> dict[str, View]:
    return {rid: _replica_view(dep, rid) for rid in sorted(dep.replicas.keys())}  # type: ignore[misc]


def _view_of(known: dict[str, _Known] | None, name: str | None, rid: str | None) -> View | None:
    """What the trace says of replica ``rid`` of deployment ``name`` (None: nothing)."""
    k = known.get(name) if known is not None and name is not None else None
    return k.replicas.get(rid) if k is not None and rid is not None else None


class _Known:
    """What the trace has told a reader of one deployment so far (the writer's side)."""

    __slots__ = ("target", "healthy", "replicas")

    def __init__(self, dep: rc.Deployment | None = None) -> None:
        self.target: int | None = None if dep is None else dep.target
        self.healthy: bool | None = None if dep is None else dep.healthy
        self.replicas: dict[str, View] = {} if dep is None else _deployment_views(dep)


class TraceWriter:
    """Writes trace records to ``fp`` (any text file object).

    ``snapshot_every``: 0 (the default) writes a full snapshot when the deltas
    written since the last one add up to its size, so snapshots cost at most
    what the deltas cost; N writes one every N steps instead.
    ``header=False`` continues a trace another writer started (a restarted
    controller): its first change is written as a full snapshot.
    """

    def __init__(self, fp: IO[str], *, snapshot_every: int = 0, meta: dict | None = None,
                 header: bool = True, verify: bool = False) -> None:
        if snapshot_every < 0:
            raise ValueError(f"snapshot_every must be >= 0 (0: by size), got {snapshot_every}")
        self.fp = fp
        self.snapshot_every = snapshot_every
        self.verify = verify
        self.steps = 0
        #: name -> what the trace says of it; None until the first snapshot
        self._known: dict[str, _Known] | None = None
        self._since = 0  # characters of deltas written since the last full snapshot
        self._full = 0  # characters of the last full snapshot
        if header:
            self.write({"kind": "header", "schema": SCHEMA, "version": VERSION, **(meta or {})})

    def write(self, record: dict) -> int:
        line = _encode(record) + "\n"
        self.fp.write(line)
        return len(line)

    def step(self, t: float, event: object, before: rc.State, result: rc.Step) -> None:
        after = result.state
        changed = after.deployments is not before.deployments
        if type(event) is rc.Tick and not result.commands and not changed:
            return  # only the clock moved: not written (a Tick that does something is)
        tj = _num(t)
        self.steps += 1
        rid = getattr(event, "replica_id", None)
        name: str | None = None if rid is None else before.index.get(rid) or after.index.get(rid)
        # what the trace said of the event's replica before the step (None: nothing to say)
        tracked = rid is not None and self._known is not None and not isinstance(event, rc.ControllerRecovered)
        was = _view_of(self._known, name, rid) if tracked else None
        tail = []  # the delta and a snapshot, written after the commands
        if changed:
            if self._known is None or isinstance(event, rc.ControllerRecovered):
                # a recovery rebuilt ranks from reports the trace does not hold: say it all
                tail.append(self._snapshot(t, after, "recovery" if isinstance(event, rc.ControllerRecovered)
                                           else "sync"))
            else:
                delta = self._delta(event, before, result)
                if delta:
                    tail.append(f'{{"kind":"delta","t":{tj},"deployments":{delta}}}')
                    self._since += len(tail[-1]) + 1
                every = self.snapshot_every
                if (self.steps % every == 0) if every else (delta and self._since >= self._full):
                    tail.append(self._snapshot(t, after, "step", known=True))
        # The writer's view is now the state after the step: the commands and the
        # event read their replicas' node and phase from it, not from the rank tables.
        known = self._known
        views = (was, _view_of(known, name, rid)) if tracked else None
        lines = [_event_line(tj, event, before, result, name, views)]
        for cmd in result.commands:
            lines.append(_command_line(tj, cmd, after, known))
        for cmd in result.pool:  # (the request path's: PoolChanged, PoolComing, PoolReset)
            lines.append(_command_line(tj, cmd, after, known))
        lines.extend(tail)
        lines.append("")
        self.fp.write("\n".join(lines))

    def _snapshot(self, t: float, state: rc.State, reason: str, *, known: bool = False) -> str:
        """The line of a full snapshot; what the trace says is now all of ``state``.
        ``known``: the writer's view already is ``state`` (a delta was just written):
        the snapshot is written from it, not read again from the rank tables."""
        if not known or self._known is None:
            self._known = {name: _Known(state.deployments[name]) for name in sorted(state.deployments.keys())}
        deps = ",".join(
            f'{_quote(name)}:{{"target":{k.target},"healthy":{"true" if k.healthy else "false"},"replicas":{{'
            + ",".join(f"{_quote(rid)}:{_view_json(k.replicas[rid])}" for rid in sorted(k.replicas)) + "}}"
            for name, k in sorted(self._known.items()))
        line = f'{{"kind":"snapshot","t":{_num(t)},"reason":{_quote(reason)},"deployments":{{{deps}}}}}'
        self._full = len(line) + 1
        self._since = 0
        return line

    # ------------------------------------------------------------ deltas
    def _delta(self, event: object, before: rc.State, result: rc.Step) -> str:
        """The JSON of what changed, name -> {target, healthy, replicas: {id: view or
        null}} (null: the deployment is gone), "" if nothing did; the writer's view follows."""
        known = self._known
        assert known is not None
        after = result.state.deployments
        prior = before.deployments
        out: list[tuple[str, str]] = []
        for name, dep in after.items():
            old = prior.get(name)
            k = known.get(name)
            if k is None:
                k = known[name] = _Known()
            elif dep is old:
                continue
            if old is not None and dep.replicas is old.replicas and dep.ranks is old.ranks:
                changes: dict[str, View | None] = {}
            else:
                changes = _bounded_changes(name, dep, k, event, result)  # type: ignore[assignment]
                if changes is None:
                    changes = _all_changes(dep, k)
                elif self.verify:
                    every = _all_changes(dep, k)
                    if every != changes:
                        raise AssertionError(f"trace delta of {name} after {type(event).__name__} missed "
                                             f"{sorted(set(every) ^ set(changes) or every)}")
            if not changes and k.target == dep.target and k.healthy == dep.healthy:
                continue
            k.target, k.healthy = dep.target, dep.healthy
            reps = k.replicas
            parts = []
            for rid in sorted(changes):
                view = changes[rid]
                if view is None:
                    reps.pop(rid, None)
                else:
                    reps[rid] = view
                parts.append(f"{_quote(rid)}:{_view_json(view)}")
            out.append((name, f'{{"target":{dep.target},"healthy":{"true" if dep.healthy else "false"},'
                              f'"replicas":{{{",".join(parts)}}}}}'))
        if len(known) > len(after):
            for name in [n for n in known if n not in after]:
                del known[name]
                out.append((name, "null"))
        if not out:
            return ""
        if len(out) == 1:
            return f"{{{_quote(out[0][0])}:{out[0][1]}}}"
        out.sort()
        return "{" + ",".join(f"{_quote(name)}:{js}" for name, js in out) + "}"

    def fault(self, t: float, type_: str, **fields: Any) -> None:
        self.write({"kind": "fault", "t": t, "type": type_, **{k: jsonable(v) for k, v in fields.items()}})

    def rejected(self, t: float, event: object, error: BaseException) -> None:
        """An event the core refused (``step`` raised): written between steps,
        where the step would have been. An executor that survives a bad event
        must still say so; ``rankcore check-trace`` reports each one."""
        if isinstance(event, rc.ControllerRecovered):
            fields: Any = {"deployments": [d.name for d in event.deployments], "reports": len(event.reports)}
        else:
            fields = jsonable(event)
        self.write({"kind": "rejected", "t": t, "type": type(event).__name__,
                    "deployment": getattr(event, "deployment", None) or getattr(event, "name", None),
                    "replica": getattr(event, "replica_id", None), "error": str(error),
                    "error_type": type(error).__name__, "fields": fields})

    def end(self, t: float, state: rc.State, metrics: dict, expectations: Iterable[dict] = ()) -> None:
        for e in expectations:
            self.write({"kind": "expectation", **e})
        self.fp.write(self._snapshot(t, state, "end") + "\n")
        self.write({"kind": "end", "t": t, "metrics": metrics})


def _bounded_changes(name: str, dep: rc.Deployment, k: _Known, event: object,
                     result: rc.Step) -> dict[str, View | None] | None:
    """The replicas of ``dep`` whose view changed, looking only at those the step
    names; None when it cannot say (every replica must be compared)."""
    if isinstance(event, _UNBOUNDED):
        return None
    named: set[str] = set()
    rid = getattr(event, "replica_id", None)
    if rid is not None:
        named.add(rid)
    victims = getattr(event, "victims", None)
    if victims:
        named.update(victims)
    for cmd in result.commands:
        if getattr(cmd, "deployment", None) == name:
            rid = getattr(cmd, "replica_id", None)
            if rid is not None:
                named.add(rid)
            rid = getattr(cmd, "replaces", None)
            if rid is not None:
                named.add(rid)
    for comp in result.compactions:
        if comp.deployment == name:
            named.update(comp.changes.replicas())  # type: ignore[arg-type]
    changes: dict[str, View | None] = {}
    size = len(k.replicas)
    for rid in named:
        view = _replica_view(dep, rid)
        was = k.replicas.get(rid)
        if view != was:
            changes[rid] = view
            size += (view is not None) - (was is not None)
    if size != len(dep.replicas):
        return None  # a replica came or went that the step does not name
    return changes


def _all_changes(dep: rc.Deployment, k: _Known) -> dict[str, View | None]:
    """Every replica of ``dep`` compared with what the trace says (O(N))."""
    changes: dict[str, View | None] = {rid: None for rid in k.replicas if rid not in dep.replicas}
    for rid in dep.replicas:
        view = _replica_view(dep, rid)
        if view != k.replicas.get(rid):
            changes[rid] = view
    return changes


def _event_line(t: str, event: object, before: rc.State, result: rc.Step, owner: str | None,
                views: tuple[View | None, View | None] | None = None) -> str:
    """``owner``: the deployment of the event's replica before or after the step;
    ``views``: that replica as the trace showed it before and after the step (the
    writer's own record of it: no look-up in the rank tables)."""
    rid = getattr(event, "replica_id", None)
    after = result.state
    dep_name = owner or getattr(event, "deployment", None) or getattr(event, "name", None)
    phase = None
    node = getattr(event, "node_id", None)
    rank: Any = None
    if views is not None and dep_name:
        was, now = views
        if now is not None:
            phase, node = now[0], now[1]
            rank = now[2] or (now[3], None, None)
        elif was is not None:
            node = was[1]
            rank = was[2] or (was[3], None, None)
            phase = "stopped" if type(event).__name__ == "ReplicaStopped" else "crashed"
    elif rid is not None and dep_name:
        dep_after = after.deployments.get(dep_name)
        rep = dep_after.replicas.get(rid) if dep_after is not None else None
        if rep is not None:
            phase, node = rep.phase.value, rep.node_id
            rank = _rank_triple(dep_after, rid)
        else:
            dep_before = before.deployments.get(dep_name)
            rep = dep_before.replicas.get(rid) if dep_before is not None else None
            if rep is not None:
                node = rep.node_id
                rank = _rank_triple(dep_before, rid)
                phase = "stopped" if type(event).__name__ == "ReplicaStopped" else "crashed"
    if isinstance(event, rc.ControllerRecovered):
        fields = _encode({"deployments": [d.name for d in event.deployments], "reports": len(event.reports),
                          "unresponsive": sorted(u.replica_id for u in event.unresponsive),
                          "unknown": event.unknown_ids()})
    else:
        fields = fields_json(event)
    return (f'{{"kind":"event","t":{t},"type":"{type(event).__name__}",'
            f'"deployment":{"null" if dep_name is None else _quote(dep_name)},'
            f'"replica":{"null" if rid is None else _quote(rid)},"node":{"null" if node is None else _quote(node)},'
            f'"rank":{"null" if rank is None else _triple(rank)},"phase":{"null" if phase is None else _quote(phase)},'
            f'"stale":{"true" if result.stale else "false"},"fields":{fields}}}')


def _command_line(t: str, cmd: object, after: rc.State, known: dict[str, _Known] | None) -> str:
    """``known``: what the trace says after the step (None before its first snapshot)."""
    rid = getattr(cmd, "replica_id", None)
    name = getattr(cmd, "deployment", None)  # (ScheduleTick names none)
    rank: Any = None
    r = getattr(cmd, "rank", None)
    if type(r) is rc.ReplicaRank:
        rank = (r.rank, r.node_rank, r.local_rank)
    elif type(cmd) is rc.StartReplica:
        rank = (cmd.global_rank, None, None)
    node = phase = None
    if name is not None and rid is not None:
        if known is not None:
            k = known.get(name)
            view = k.replicas.get(rid) if k is not None else None
            if view is not None:
                phase, node = view[0], view[1]
        else:
            dep = after.deployments.get(name)
            rep = dep.replicas.get(rid) if dep is not None else None
            if rep is not None:
                node, phase = rep.node_id, rep.phase.value
    # (the helpers inlined: a command line is the commonest record)
    return (f'{{"kind":"command","t":{t},"type":"{type(cmd).__name__}",'
            f'"deployment":{"null" if name is None else _quote(name)},'
            f'"replica":{"null" if rid is None else _quote(rid)},"node":{"null" if node is None else _quote(node)},'
            f'"rank":{"null" if rank is None else _triple(rank)},"phase":{"null" if phase is None else _quote(phase)},'
            f'"fields":{fields_json(cmd)}}}')


def _triple(r: Any) -> str:
    if r is None:
        return "null"
    a, b, c = r
    return f"[{a},{'null' if b is None else b},{'null' if c is None else c}]"


def _num(t: float) -> str:
    """``t`` as JSON writes it (``float.__repr__``, once per step, not once per record)."""
    return float.__repr__(t) if type(t) is float and math.isfinite(t) else _encode(t)


def read_trace(source: str | os.PathLike[str] | Iterable[str]) -> Iterator[dict]:
    """Parse a trace, checking the header names this schema and a known version.

    ``source`` is a path (``str`` or ``os.PathLike``: a trace is a file, and a
    string is never taken for its text), an open file, or any iterable of lines.
    """
    if isinstance(source, (str, os.PathLike)):
        with open(source, encoding="utf-8") as fp:
            yield from _parse(fp)
        return
    yield from _parse(source)


def _parse(lines: Iterable[str]) -> Iterator[dict]:
    first = True
    for n, line in enumerate(lines, 1):
        if not line.strip():
            continue
        try:
            rec = json.loads(line)
        except json.JSONDecodeError as exc:
            raise ValueError(f"line {n}: not JSON ({exc.msg})") from None
        except ValueError as exc:  # (an int of more than 4,300 digits)
            raise ValueError(f"line {n}: not JSON ({exc})") from None
        except RecursionError:
            raise ValueError(f"line {n}: not JSON a reader can take (arrays or objects nested too deeply)") from None
        if not isinstance(rec, dict):
            if first:
                raise ValueError(f"line {n}: not a {SCHEMA} trace (first record must be its header)")
            raise ValueError(f"line {n}: a record must be an object with a 'kind'")
        if first:
            if rec.get("kind") != "header" or rec.get("schema") != SCHEMA:
                raise ValueError(f"line {n}: not a {SCHEMA} trace (first record must be its header)")
            if rec.get("version") != VERSION:
                raise ValueError(f"line {n}: trace version {rec.get('version')}, this rankcore reads {VERSION}")
            first = False
        if "kind" not in rec:
            raise ValueError(f"line {n}: a record must be an object with a 'kind'")
        rec["_line"] = n
        yield rec


def states(records: Iterable[dict]) -> Iterator[dict]:
    """The whole state after each change, rebuilt from a trace's records.

    One snapshot-shaped dict (``kind`` ``"snapshot"``, ``t``, ``reason``,
    ``deployments``) per snapshot and delta record: a snapshot's own reason;
    for a delta ``"healthy"`` when a deployment is healthy after it that was
    not before, else ``"delta"``. Each is a fresh copy (O(replicas) per
    record): for tests and small traces; ``rankcore check-trace`` rebuilds
    the state in place.
    """
    deps: dict[str, dict] = {}
    for rec in records:
        kind = rec.get("kind")
        if kind == "snapshot":
            deps = {name: {"target": d["target"], "healthy": d["healthy"], "replicas": dict(d["replicas"])}
                    for name, d in rec["deployments"].items()}
            reason = rec["reason"]
        elif kind == "delta":
            reason = "delta"
            for name, d in rec["deployments"].items():
                if d is None:
                    deps.pop(name, None)
                    continue
                cur = deps.setdefault(name, {"target": d["target"], "healthy": False, "replicas": {}})
                if d["healthy"] and not cur["healthy"]:
                    reason = "healthy"
                cur["target"], cur["healthy"] = d["target"], d["healthy"]
                for rid, r in d["replicas"].items():
                    if r is None:
                        cur["replicas"].pop(rid, None)
                    else:
                        cur["replicas"][rid] = r
        else:
            continue
        yield {"kind": "snapshot", "t": rec["t"], "reason": reason,
               "deployments": {name: {"target": d["target"], "healthy": d["healthy"],
                                      "replicas": dict(sorted(d["replicas"].items()))}
                               for name, d in sorted(deps.items())}}
