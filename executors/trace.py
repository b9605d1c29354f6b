"""The JSON Lines trace every executor writes (schema: docs/trace-format.md).

One record per event and per command, snapshots of every deployment (after
every step by default; thinned with ``snapshot_every``, but always written when
a deployment becomes healthy, after a controller recovery and at the end), faults the executor injected,
events the core rejected, expectation results and a closing record with the metrics. Same inputs, same
bytes: keys are written in a fixed order and nothing depends on hash order.
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterable, Iterator
from typing import IO, Any

import attrs

import rankcore as rc
from rankcore import Phase

SCHEMA = "rankcore-trace"
VERSION = 2  # 2: StartReplica.rank became global_rank

__all__ = ["TraceWriter", "read_trace", "snapshot_record", "SCHEMA", "VERSION", "jsonable"]


def jsonable(value: Any) -> Any:
    """A JSON-safe copy of an event/command field."""
    if isinstance(value, rc.ReplicaRank):
        return [value.rank, value.node_rank, value.local_rank]
    if isinstance(value, rc.ReportedRank):
        return [value.rank, value.node_rank, value.local_rank]
    if isinstance(value, Phase):
        return value.value
    if attrs.has(type(value)):
        return {f.name: jsonable(getattr(value, f.name)) for f in attrs.fields(type(value))}
    if isinstance(value, dict):
        return {str(k): jsonable(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [jsonable(v) for v in value]
    if value is None or isinstance(value, (bool, int, float, str)):
        return value
    return repr(value)


def _rank_triple(dep: rc.Deployment | None, rid: str | None) -> list | None:
    if dep is None or rid is None or rid not in dep.ranks:
        return None
    rk = dep.ranks.rank_of(rid)
    if rk is None:
        return [dep.ranks.global_rank(rid), None, None]
    return [rk.rank, rk.node_rank, rk.local_rank]


def snapshot_record(t: float, state: rc.State, reason: str) -> dict:
    deployments = {}
    for name in sorted(state.deployments.keys()):
        dep = state.deployments[name]
        replicas = {}
        for rid in sorted(dep.replicas.keys()):
            rep = dep.replicas[rid]
            rk = dep.ranks.rank_of(rid)
            replicas[rid] = {
                "phase": rep.phase.value,
                "node": rep.node_id,
                "rank": None if rk is None else [rk.rank, rk.node_rank, rk.local_rank],
                "global_rank": dep.ranks.global_rank(rid),
                "lineage": rep.lineage,
            }
        deployments[name] = {"target": dep.target, "healthy": dep.healthy, "replicas": replicas}
    return {"kind": "snapshot", "t": t, "reason": reason, "deployments": deployments}


class TraceWriter:
    """Writes trace records to ``fp`` (any text file object)."""

    def __init__(self, fp: IO[str], *, snapshot_every: int = 1, meta: dict | None = None,
                 header: bool = True) -> None:
        """``header=False`` continues a trace another writer started (a restarted controller)."""
        if snapshot_every < 1:
            raise ValueError(f"snapshot_every must be >= 1, got {snapshot_every}")
        self.fp = fp
        self.snapshot_every = snapshot_every
        self.steps = 0
        self._healthy: dict[str, bool] = {}
        if header:
            self.write({"kind": "header", "schema": SCHEMA, "version": VERSION, **(meta or {})})

    def write(self, record: dict) -> None:
        self.fp.write(json.dumps(record, separators=(",", ":")) + "\n")

    def step(self, t: float, event: object, before: rc.State, result: rc.Step) -> None:
        if type(event) is rc.Tick and not result.commands:
            return  # only the clock moved: not written (a Tick that does something is)
        after = result.state
        self.write(_event_record(t, event, before, result))
        for cmd in result.commands:
            self.write(_command_record(t, cmd, after))
        self.steps += 1
        became_healthy = False
        for name, dep in after.deployments.items():
            h = dep.healthy
            if h and not self._healthy.get(name, False):
                became_healthy = True
            self._healthy[name] = h
        if became_healthy:
            self.write(snapshot_record(t, after, "healthy"))
        elif isinstance(event, rc.ControllerRecovered):
            self.write(snapshot_record(t, after, "recovery"))
        elif self.steps % self.snapshot_every == 0 and after.deployments is not before.deployments:
            self.write(snapshot_record(t, after, "step"))

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
        self.write(snapshot_record(t, state, "end"))
        self.write({"kind": "end", "t": t, "metrics": metrics})


def _replica_of(event: object) -> str | None:
    return getattr(event, "replica_id", None)


def _event_record(t: float, event: object, before: rc.State, result: rc.Step) -> dict:
    rid = _replica_of(event)
    after = result.state
    dep_name = getattr(event, "deployment", None) or getattr(event, "name", None)
    if rid is not None:
        dep_name = before.index.get(rid) or after.index.get(rid) or dep_name
    dep_after = after.deployments.get(dep_name) if dep_name else None
    dep_before = before.deployments.get(dep_name) if dep_name else None
    phase = None
    node = getattr(event, "node_id", None)
    rank = None
    if rid is not None:
        if dep_after is not None and rid in dep_after.replicas:
            rep = dep_after.replicas[rid]
            phase, node = rep.phase.value, rep.node_id
            rank = _rank_triple(dep_after, rid)
        elif dep_before is not None and rid in dep_before.replicas:
            rep = dep_before.replicas[rid]
            node = rep.node_id
            rank = _rank_triple(dep_before, rid)
            phase = "stopped" if type(event).__name__ == "ReplicaStopped" else "crashed"
    fields = {} if isinstance(event, rc.ControllerRecovered) else jsonable(event)
    if isinstance(event, rc.ControllerRecovered):
        fields = {"deployments": [d.name for d in event.deployments], "reports": len(event.reports),
                  "unresponsive": sorted(u.replica_id for u in event.unresponsive),
                  "unknown": event.unknown_ids()}
    return {
        "kind": "event",
        "t": t,
        "type": type(event).__name__,
        "deployment": dep_name,
        "replica": rid,
        "node": node,
        "rank": rank,
        "phase": phase,
        "stale": result.stale,
        "fields": fields,
    }


def _command_record(t: float, cmd: object, after: rc.State) -> dict:
    rid = getattr(cmd, "replica_id", None)
    name = getattr(cmd, "deployment", None)  # (ScheduleTick names none)
    dep = after.deployments.get(name) if name is not None else None
    rank: list | None = None
    r = getattr(cmd, "rank", None)
    if isinstance(r, rc.ReplicaRank):
        rank = [r.rank, r.node_rank, r.local_rank]
    elif isinstance(cmd, rc.StartReplica):
        rank = [cmd.global_rank, None, None]
    node = None
    phase = None
    if dep is not None and rid is not None and rid in dep.replicas:
        node = dep.replicas[rid].node_id
        phase = dep.replicas[rid].phase.value
    return {
        "kind": "command",
        "t": t,
        "type": type(cmd).__name__,
        "deployment": name,
        "replica": rid,
        "node": node,
        "rank": rank,
        "phase": phase,
        "fields": jsonable(cmd),
    }


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
