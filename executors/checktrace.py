"""Check the rank invariants over a JSON Lines trace (``rankcore check-trace``).

The trace is streamed (one record in memory at a time, plus the records of the
current step and the state rebuilt from its snapshots and deltas), so a trace
of millions of lines costs memory proportional to the replicas, not the lines.
Each delta is applied to the rebuilt state, so every step is checked against
the state after it; a full snapshot written after deltas must equal what they
rebuilt (a writer that drops a change is caught).

Two kinds of problem, kept apart:

* :class:`TraceFormatError` - the file is not a readable version-3 trace (not
  JSON, no header, wrong schema or version, a record missing a required field
  or with a field of the wrong type, an unknown record kind, time going
  backwards, a command outside a step, records after the end record). The
  check stops at the first one; the message is one line naming the file and
  line.
* violations - the trace is well formed but a rule of ranks is broken. Every
  one is collected (``"line 123: ..."``), the check goes on.

Only the fields documented in docs/trace-format.md are relied on, so traces
written by any executor can be checked. What is checked, and what is not, is
listed in that document (section "Checking a trace").
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from rankcore import InvariantViolation
from rankcore.invariants import check_snapshot

from .trace import read_trace

__all__ = ["TraceFormatError", "TraceReport", "check_trace_file", "check_trace_lines"]

#: violations kept in ``TraceReport.violations``; the rest are only counted
MAX_VIOLATIONS = 1000
#: a line longer than this is refused before it is parsed (``check_trace_file`` reads no more of it):
#: a file with no line break must not be read whole into memory; the longest record a writer makes is a
#: snapshot, ~110 bytes a replica, so 64 MiB holds one of 600,000 replicas
MAX_LINE_BYTES = 64 << 20

KINDS = ("header", "event", "command", "delta", "snapshot", "fault", "rejected", "expectation", "end")
SNAPSHOT_REASONS = ("step", "sync", "recovery", "end")
#: commands that carry ``fields.world_size`` (each must equal the target)
WORLD_SIZE_COMMANDS = ("StartReplica", "InitializeReplica", "ReconfigureReplica", "UpdateWorldSize")


class TraceFormatError(Exception):
    """The file is not a well-formed trace; ``str()`` is one line: ``file: line N: what``."""


class TraceReport:
    """What :func:`check_trace_file` found.

    ``violations``: ``"line N: ..."`` strings (the first :data:`MAX_VIOLATIONS`;
    ``violation_count`` counts them all). ``counts``: records per kind plus
    ``steps`` and ``snapshots_checked``. ``checks``: how many times each
    cross-record rule could be applied (a rule is skipped where the trace does
    not say enough).
    """

    def __init__(self, path: str) -> None:
        self.path = path
        self.header: dict = {}
        self.violations: list[str] = []
        self.violation_count = 0
        self.counts: Counter = Counter({k: 0 for k in KINDS})
        self.counts["steps"] = 0
        self.counts["snapshots_checked"] = 0
        self.checks: Counter = Counter()
        self.complete = False  # an end record was read
        self.first_t: float | None = None
        self.last_t: float | None = None
        self.expectations_failed = 0

    @property
    def ok(self) -> bool:
        return self.violation_count == 0

    def add(self, line: int, message: str) -> None:
        self.violation_count += 1
        if len(self.violations) < MAX_VIOLATIONS:
            self.violations.append(f"line {line}: {_one_line(message)}")

    def summary(self) -> str:
        """One paragraph: what was read, what was checked, the verdict."""
        c = self.counts
        records = sum(c[k] for k in KINDS)
        kinds = ", ".join(f"{c[k]:,} {k}{'s' if c[k] != 1 else ''}" for k in KINDS[1:] if c[k])
        span = ""
        if self.first_t is not None and self.last_t is not None:
            span = f" over t={self.first_t:g}..{self.last_t:g}s"
        who = ", ".join(f"{k} {self.header[k]}" for k in ("executor", "scenario", "seed") if k in self.header)
        text = (f"{self.path}: {records:,} records ({kinds}); {c['steps']:,} steps{span}"
                + (f" ({who})" if who else "") + ". ")
        ch = self.checks
        text += (f"Checked {c['snapshots_checked']:,} snapshots and {ch['healthy_state']:,} rebuilt states "
                 f"that became healthy against the state invariants, {ch['snapshot_equal']:,} snapshots against "
                 f"the state rebuilt from the deltas before them, "
                 f"{ch['replacement']:,} replacement ranks, {ch['rank_reconfigure']:,} rank reconfigures, "
                 f"{ch['world_size']:,} world sizes, {ch['command_rank']:,} command ranks against the state "
                 f"after their step, {ch['rank_change']:,} changed replica ranks and "
                 f"{ch['presence']:,} departures (each must be explained). ")
        if not self.complete:
            text += "No end record: the trace is incomplete (the run may have been cut off). "
        if self.expectations_failed:
            text += f"{self.expectations_failed} expectation(s) recorded as failed. "
        if self.ok:
            text += "OK: no invariant violated."
        else:
            text += f"FAILED: {self.violation_count:,} violation(s); first: {self.violations[0]}"
        return text

    def __repr__(self) -> str:
        return f"TraceReport(path={self.path!r}, ok={self.ok}, violations={self.violation_count})"


def _one_line(s: str) -> str:
    return " ".join(str(s).split())


# ------------------------------------------------------------- validation
def _is_int(v: Any) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


def _is_num(v: Any) -> bool:
    return (isinstance(v, (int, float)) and not isinstance(v, bool)) and math.isfinite(v)


def _is_triple(v: Any) -> bool:
    return (isinstance(v, list) and len(v) == 3 and _is_int(v[0])
            and all(x is None or _is_int(x) for x in v[1:]))


def _is_full_triple(v: Any) -> bool:
    return _is_triple(v) and v[1] is not None and v[2] is not None


_TYPES = {
    "str": (lambda v: isinstance(v, str), "a string"),
    "str?": (lambda v: v is None or isinstance(v, str), "a string or null"),
    "int": (_is_int, "an integer"),
    "int?": (lambda v: v is None or _is_int(v), "an integer or null"),
    "bool": (lambda v: isinstance(v, bool), "true or false"),
    "num": (_is_num, "a finite number"),
    "dict": (lambda v: isinstance(v, dict), "an object"),
    "list": (lambda v: isinstance(v, list), "a list"),
    "rank?": (lambda v: v is None or _is_triple(v),
              "[rank, node_rank, local_rank] (node parts may be null) or null"),
    "rank": (_is_triple, "[rank, node_rank, local_rank]"),
    "fullrank": (_is_full_triple, "[rank, node_rank, local_rank] with no null part"),
}

_REQUIRED = {
    "event": {"t": "num", "type": "str", "deployment": "str?", "replica": "str?", "node": "str?",
              "rank": "rank?", "phase": "str?", "stale": "bool", "fields": "dict"},
    "command": {"t": "num", "type": "str", "deployment": "str?", "replica": "str?", "node": "str?",
                "rank": "rank?", "phase": "str?", "fields": "dict"},
    "delta": {"t": "num", "deployments": "dict"},
    "snapshot": {"t": "num", "reason": "str", "deployments": "dict"},
    "fault": {"t": "num", "type": "str"},
    "rejected": {"t": "num", "type": "str", "error": "str"},
    "expectation": {"t": "num", "name": "str", "passed": "bool", "detail": "str"},
    "end": {"t": "num", "metrics": "dict"},
}

#: per command type: (required top-level overrides, required ``fields`` entries)
_COMMAND_FIELDS = {
    "StartReplica": ({"replica": "str", "rank": "rank"},
                     {"global_rank": "int", "world_size": "int", "replaces": "str?", "lineage": "int?"}),
    "InitializeReplica": ({"replica": "str", "rank": "fullrank"}, {"world_size": "int"}),
    "ReconfigureReplica": ({"replica": "str", "rank": "fullrank"}, {"world_size": "int", "reason": "str"}),
    "StopReplica": ({"replica": "str"}, {}),
    "UpdateWorldSize": ({}, {"world_size": "int"}),
    "UpdateHealthChecks": ({}, {"health_check_period_s": "num", "health_check_timeout_s": "num"}),
    "PlaceReplica": ({"replica": "str", "rank": "fullrank"}, {"node_id": "str"}),
    "ScheduleTick": ({}, {"at": "num"}),
    "KeepSpareProcesses": ({"deployment": "str"}, {"node_id": "str", "count": "int"}),
    "GangChanged": ({"deployment": "str"}, {"gang_id": "str", "members": "list"}),
    "ReformGroup": ({"replica": "str", "deployment": "str"}, {"group": "dict"}),
    "OffloadReplica": ({"replica": "str", "deployment": "str"}, {}),
    "LoadReplica": ({"replica": "str", "deployment": "str"}, {}),
    "UpdateWeights": ({"replica": "str", "deployment": "str"}, {"version": "int"}),
    "EvictReplica": ({"replica": "str", "deployment": "str"}, {"node_id": "str", "to": "str", "for_replica": "str"}),
    "DropWarmCopy": ({"replica": "str", "deployment": "str"}, {"node_id": "str"}),
    "RequestResources": ({}, {"waiting": "list", "held": "list"}),
    "PoolChanged": ({"replica": "str", "deployment": "str"}, {"membership": "str"}),
    "PoolComing": ({"deployment": "str"}, {"coming": "bool"}),
    "PoolReset": ({"deployment": "str"}, {"serving": "list", "draining": "list", "coming": "bool"}),
    "ReplicaModels": ({"replica": "str", "deployment": "str"}, {"model_ids": "list"}),
    "StartProxy": ({}, {"proxy_id": "str", "node_id": "str"}),
    "DrainProxy": ({}, {"proxy_id": "str", "node_id": "str", "draining": "bool"}),
    "StopProxy": ({}, {"proxy_id": "str", "node_id": "str", "reason": "str"}),
}
#: per event type: its required ``fields`` entries (the sleep/wake/weights requests and answers, issue 21)
_EVENT_FIELDS = {
    "SleepRequested": {"deployment": "str"},
    "WakeRequested": {"deployment": "str", "weights_version": "int?"},
    "WeightsPushed": {"deployment": "str", "version": "int"},
    "TierMoved": {"replica_id": "str", "tier": "str", "nbytes": "int"},
    "TierMoveFailed": {"replica_id": "str", "reason": "str"},
    "WeightsUpdated": {"replica_id": "str", "version": "int"},
}

_DEPLOYMENT_FIELDS = {"target": "int", "healthy": "bool", "replicas": "dict"}
_REPLICA_FIELDS = {"phase": "str", "node": "str?", "rank": "rank?", "global_rank": "int?", "lineage": "int?"}


def _replica_ok(rep: Any) -> bool:
    """Fast check of one snapshot replica against ``_REPLICA_FIELDS`` (snapshots are most of a trace)."""
    try:
        phase, node, rk, g, lin = rep["phase"], rep["node"], rep["rank"], rep["global_rank"], rep["lineage"]
    except (KeyError, TypeError):
        return False
    return (type(phase) is str and (node is None or type(node) is str)
            and (g is None or type(g) is int) and (lin is None or type(lin) is int)
            and (rk is None or (type(rk) is list and len(rk) == 3 and type(rk[0]) is int
                                and (rk[1] is None or type(rk[1]) is int)
                                and (rk[2] is None or type(rk[2]) is int))))


class _Format:
    def __init__(self, path: str) -> None:
        self.path = path

    def error(self, line: int | None, what: str) -> TraceFormatError:
        where = f"{self.path}: line {line}" if line is not None else self.path
        return TraceFormatError(f"{where}: {_one_line(what)}")

    def need(self, obj: dict, spec: dict, line: int, what: str) -> None:
        for key, ty in spec.items():
            if key not in obj:
                raise self.error(line, f"{what} is missing the required field '{key}'")
            test, desc = _TYPES[ty]
            if not test(obj[key]):
                raise self.error(line, f"{what}: '{key}' must be {desc}, got {obj[key]!r:.80}")


# ------------------------------------------------------------------ checks
class _Step:
    __slots__ = ("index", "line", "t", "event", "commands", "delta", "snapshot", "recovered", "changes", "touched")

    def __init__(self, index: int, rec: dict) -> None:
        self.index = index
        self.line = rec["_line"]
        self.t = rec["t"]
        self.event = rec
        self.commands: list[dict] = []
        self.delta: dict | None = None
        self.snapshot: dict | None = None
        self.recovered = rec["type"] == "ControllerRecovered"
        #: (deployment, replica, view before, view after) of every replica the step's delta changed
        self.changes: list[tuple[str, str, dict | None, dict | None]] = []
        #: deployments the step's delta or snapshot says something about
        self.touched: set[str] = set()


class _Knowledge:
    """What the trace has said so far about one deployment's replicas."""

    __slots__ = ("grank", "lineage", "conveyed", "target")

    def __init__(self) -> None:
        self.grank: dict[str, int] = {}  # latest known global rank
        self.lineage: dict[str, int] = {}
        self.conveyed: dict[str, tuple] = {}  # last rank a command told the replica
        self.target: int | None = None


class _Checker:
    def __init__(self, path: str) -> None:
        self.fmt = _Format(path)
        self.report = TraceReport(path)
        self.deps: dict[str, _Knowledge] = {}
        self.step: _Step | None = None
        self.steps = 0
        self.last_t: float | None = None
        self.last_t_line = 0
        self.ended = False
        #: the state rebuilt from snapshots and deltas: name -> {"target", "healthy", "replicas"}
        self.view: dict[str, dict] = {}
        self.presence = _Presence()

    def dep(self, name: str) -> _Knowledge:
        k = self.deps.get(name)
        if k is None:
            k = self.deps[name] = _Knowledge()
        return k

    # -------------------------------------------------------------- records
    def feed(self, rec: dict) -> None:
        line = rec["_line"]
        kind = rec.get("kind")
        if kind not in KINDS:
            raise self.fmt.error(line, f"unknown record kind {kind!r} (one of: {', '.join(KINDS)})")
        r = self.report
        if kind == "header":
            if r.counts["header"]:
                raise self.fmt.error(line, "a second header (two traces in one file?)")
            r.counts["header"] += 1
            r.header = {k: v for k, v in rec.items() if k != "_line"}
            return
        if self.ended:
            raise self.fmt.error(line, f"a {kind} record after the end record")
        self.fmt.need(rec, _REQUIRED[kind], line, f"{kind} record")
        r.counts[kind] += 1
        t = rec["t"]
        if kind != "expectation":  # expectations carry the time they were checked at
            if self.last_t is not None and t < self.last_t:
                raise self.fmt.error(line, f"time goes backwards: t={t!r} after t={self.last_t!r} "
                                           f"(line {self.last_t_line})")
            self.last_t, self.last_t_line = t, line
            if r.first_t is None:
                r.first_t = t
            r.last_t = t
        getattr(self, f"_{kind}")(rec, line)

    def finish(self) -> TraceReport:
        self._close_step()
        if self.report.counts["header"] == 0:
            raise self.fmt.error(None, "empty file: no header record")
        self.presence.resolve(self.report)
        return self.report

    def _event(self, rec: dict, line: int) -> None:
        self._close_step()
        spec = _EVENT_FIELDS.get(rec["type"])
        if spec is not None:
            self.fmt.need(rec["fields"], spec, line, f"{rec['type']} event's fields")
        self.presence.event(rec)
        self.steps += 1
        self.report.counts["steps"] += 1
        st = self.step = _Step(self.steps, rec)
        if st.recovered:
            # The new controller rebuilt every rank from reports the trace does
            # not show: forget what was known (the step's snapshot restores it).
            for k in self.deps.values():
                k.grank.clear()
                k.lineage.clear()
                k.conveyed.clear()
                k.target = None
            return
        rid, dep, rank = rec["replica"], rec["deployment"], rec["rank"]
        if rid is not None and dep is not None and rank is not None and not rec["stale"]:
            # (what it held before the step, when the trace said it: the event's record shows it
            # after, and a replica drained beside its successor is after the step on a spare rank,
            # rankcore.control.moves.start_beside; the replacement's check wants the rank it held)
            self.dep(dep).grank.setdefault(rid, rank[0])

    def _in_step(self, rec: dict, line: int, kind: str, outside: str) -> Any:
        """The step ``rec`` belongs to: one is open and ``rec`` is at its time."""
        st = self.step
        if st is None:
            raise self.fmt.error(line, outside)
        if rec["t"] != st.t:
            raise self.fmt.error(line, f"{kind} at t={rec['t']!r} in the step of the event at t={st.t!r} "
                                       f"(line {st.line})")
        return st

    def _command(self, rec: dict, line: int) -> None:
        st = self._in_step(rec, line, "command", "a command record outside a step (it must follow its event "
                                                 "record)")
        if st.snapshot is not None or st.delta is not None:
            raise self.fmt.error(line, f"a command record after its step's "
                                       f"{'snapshot' if st.snapshot is not None else 'delta'}")
        typ = rec["type"]
        spec = _COMMAND_FIELDS.get(typ)
        if spec is not None:
            self.fmt.need(rec, spec[0], line, f"{typ} command")
            self.fmt.need(rec["fields"], spec[1], line, f"{typ} command's fields")
        st.commands.append(rec)
        self.presence.command(rec)
        if rec["deployment"] is None:  # ScheduleTick: about the clock, no replica
            return
        k = self.dep(rec["deployment"])
        rid, rank, f = rec["replica"], rec["rank"], rec["fields"]
        if typ == "StartReplica":
            x = f["replaces"]
            if x is not None:
                held = k.grank.get(x)
                if held is not None:
                    self.report.checks["replacement"] += 1
                    if rank[0] != held:
                        self.report.add(line, f"{rid} replaces {x}, which held global rank {held}, "
                                              f"but starts with rank {rank[0]}")
                lin = k.lineage.get(x)
                if lin is not None and f["lineage"] is not None and f["lineage"] != lin:
                    self.report.add(line, f"{rid} replaces {x} (lineage {lin}) "
                                          f"but has lineage {f['lineage']}")
            k.grank[rid] = rank[0]
            if f["lineage"] is not None:
                k.lineage[rid] = f["lineage"]
            k.conveyed[rid] = tuple(rank)
        elif typ in ("InitializeReplica", "ReconfigureReplica"):
            new = tuple(rank)
            if typ == "ReconfigureReplica" and f["reason"] == "rank":
                old = k.conveyed.get(rid)
                if old is not None and None not in old:
                    self.report.checks["rank_reconfigure"] += 1
                    if old == new:
                        self.report.add(line, f"rank reconfigure of {rid} carries {list(new)}, the rank it "
                                              f"was already given")
            k.grank[rid] = new[0]
            k.conveyed[rid] = new

    def _replica(self, rep: Any, line: int, what: str) -> None:
        if not _replica_ok(rep):  # the slow path names what is wrong
            if not isinstance(rep, dict):
                raise self.fmt.error(line, f"{what} must be an object")
            self.fmt.need(rep, _REPLICA_FIELDS, line, what)

    def _ranks_agree(self, line: int, where: str, name: str, rid: str, rep: dict) -> None:
        rk, g = rep["rank"], rep["global_rank"]
        if rk is not None and g is not None and rk[0] != g:
            self.report.add(line, f"{where}: {name}/{rid} has rank {rk} but global_rank {g}")
        if g is None and rk is None:
            self.report.add(line, f"{where}: {name}/{rid} ({rep['phase']}) holds no global rank")

    def _delta(self, rec: dict, line: int) -> None:
        st = self._in_step(rec, line, "delta", "a delta record outside a step (it must follow its event and "
                                               "commands)")
        if st.delta is not None or st.snapshot is not None:
            raise self.fmt.error(line, f"a second delta in one step, or a delta after its step's snapshot "
                                       f"(step of line {st.line})")
        st.delta = rec
        for name, d in rec["deployments"].items():
            st.touched.add(name)
            if d is None:  # (the deployment left: deleted, its last replica gone; one of its name later is new)
                for rid, was in self.view.pop(name, {"replicas": {}})["replicas"].items():
                    st.changes.append((name, rid, was, None))
                    self.presence.departed(name, rid, was, line, recovery=False)
                self.deps.pop(name, None)
                continue
            if not isinstance(d, dict):
                raise self.fmt.error(line, f"delta deployment {name!r} must be an object or null")
            self.fmt.need(d, _DEPLOYMENT_FIELDS, line, f"delta deployment {name!r}")
            cur = self.view.get(name)
            if cur is None:
                cur = self.view[name] = {"target": d["target"], "healthy": False, "replicas": {}}
            became_healthy = d["healthy"] and not cur["healthy"]
            cur["target"], cur["healthy"] = d["target"], d["healthy"]
            reps = cur["replicas"]
            k = self.dep(name)
            for rid, r in d["replicas"].items():
                was = reps.get(rid)
                if r is None:
                    if was is None:
                        self.report.add(line, f"delta: {name}/{rid} leaves, but the trace never showed it")
                        continue
                    del reps[rid]
                    self.presence.departed(name, rid, was, line, recovery=False)
                else:
                    self._replica(r, line, f"delta replica {rid!r} of {name!r}")
                    self._ranks_agree(line, "delta", name, rid, r)
                    reps[rid] = r
                    g = r["global_rank"] if r["global_rank"] is not None else (r["rank"] or [None])[0]
                    if g is not None:
                        k.grank[rid] = g
                    if r["lineage"] is not None:
                        k.lineage[rid] = r["lineage"]
                    if was is None:
                        self.presence.appeared(name, r["lineage"])
                st.changes.append((name, rid, was, r))
            if became_healthy:
                self._check_view(name, line)
        self.presence.resolve(self.report, clear=False)

    def _check_view(self, name: str, line: int) -> None:
        """The state invariants over one deployment of the rebuilt state (it became healthy).

        Most deltas that make a deployment healthy pass: one pass over its replicas
        (:func:`_healthy_ok`) says so; only then does ``check_snapshot`` (several
        passes) run, to name what is wrong."""
        self.report.checks["healthy_state"] += 1
        d = self.view[name]
        if _healthy_ok(d):
            return
        try:
            check_snapshot({"deployments": {name: d}})
        except InvariantViolation as exc:
            self.report.add(line, f"state rebuilt from deltas (became healthy): {exc}")
        else:  # pragma: no cover - _healthy_ok is stricter than check_snapshot nowhere
            self.report.add(line, f"state rebuilt from deltas (became healthy): {name} is not healthy")

    def _snapshot(self, rec: dict, line: int) -> None:
        reason = rec["reason"]
        if reason not in SNAPSHOT_REASONS:
            raise self.fmt.error(line, f"snapshot reason must be one of {', '.join(SNAPSHOT_REASONS)}, "
                                       f"got {reason!r}")
        for name, d in rec["deployments"].items():
            if not isinstance(d, dict):
                raise self.fmt.error(line, f"snapshot deployment {name!r} must be an object")
            self.fmt.need(d, _DEPLOYMENT_FIELDS, line, f"snapshot deployment {name!r}")
            for rid, rep in d["replicas"].items():
                self._replica(rep, line, f"snapshot replica {rid!r} of {name!r}")
        try:
            check_snapshot(rec)
        except InvariantViolation as exc:
            self.report.add(line, f"snapshot ({reason}): {exc}")
        self.report.counts["snapshots_checked"] += 1
        for name, d in rec["deployments"].items():
            for rid, rep in d["replicas"].items():
                self._ranks_agree(line, "snapshot", name, rid, rep)
        st = self.step
        in_step = reason != "end" and st is not None and st.snapshot is None
        if reason in ("step", "end"):
            self._compare(rec, line)
        # departures: what the rebuilt state holds and the snapshot does not
        recovery = reason in ("recovery", "sync")
        for name, cur in self.view.items():
            reps = rec["deployments"].get(name, {}).get("replicas", {})
            for rid, was in cur["replicas"].items():
                if rid not in reps:
                    self.presence.departed(name, rid, was, line, recovery=recovery)
        self.view = {name: {"target": d["target"], "healthy": d["healthy"], "replicas": dict(d["replicas"])}
                     for name, d in rec["deployments"].items()}
        self.presence.resolve(self.report)
        if in_step:
            assert st is not None
            st.snapshot = rec
            st.touched.update(rec["deployments"])
            self._close_step()  # checks the step against it, then learns from it
        else:
            self._close_step()
        self._learn(rec)

    def _compare(self, rec: dict, line: int) -> None:
        """A snapshot written after deltas equals the state the deltas rebuilt
        (a writer that dropped a change is caught here)."""
        self.report.checks["snapshot_equal"] += 1
        snap, view = rec["deployments"], self.view
        diffs: list[str] = []
        for name in sorted(set(snap) | set(view)):
            s, v = snap.get(name), view.get(name)
            if s is None or v is None:
                diffs.append(f"{name} is {'missing' if s is None else 'present'} in the snapshot but "
                             f"{'present' if v is not None else 'absent'} in the deltas")
                continue
            for key in ("target", "healthy"):
                if s[key] != v[key]:
                    diffs.append(f"{name}.{key} is {s[key]!r} in the snapshot, {v[key]!r} from the deltas")
            sr, vr = s["replicas"], v["replicas"]
            if sr != vr:
                for rid in sorted(set(sr) | set(vr)):
                    if sr.get(rid) != vr.get(rid):
                        diffs.append(f"{name}/{rid} is {sr.get(rid)} in the snapshot, {vr.get(rid)} from the deltas")
        if diffs:
            self.report.add(line, f"snapshot ({rec['reason']}) differs from the state rebuilt from the deltas "
                                  f"before it ({len(diffs)} difference(s)): " + "; ".join(diffs[:3]))

    def _fault(self, rec: dict, line: int) -> None:
        self._close_step()
        self.presence.fault(rec)

    def _rejected(self, rec: dict, line: int) -> None:
        self._close_step()
        self.report.add(line, f"the core rejected a {rec['type']} event"
                              + (f" about {rec['replica']}" if isinstance(rec.get("replica"), str) else "")
                              + f": {rec['error']} (the executor carried on without it)")

    def _expectation(self, rec: dict, line: int) -> None:
        self._close_step()
        if not rec["passed"]:
            self.report.expectations_failed += 1

    def _end(self, rec: dict, line: int) -> None:
        self._close_step()
        self.ended = True
        self.report.complete = True

    # ------------------------------------------------------------ per step
    def _learn(self, snap: dict) -> None:
        for name, d in snap["deployments"].items():
            k = self.dep(name)
            k.target = d["target"]
            reps = d["replicas"]
            k.grank = {rid: r["global_rank"] if r["global_rank"] is not None else r["rank"][0]
                       for rid, r in reps.items() if r["global_rank"] is not None or r["rank"] is not None}
            k.lineage = {rid: r["lineage"] for rid, r in reps.items() if r["lineage"] is not None}
            k.conveyed = {rid: v for rid, v in k.conveyed.items() if rid in reps}

    def _close_step(self) -> None:
        st = self.step
        if st is None:
            return
        self.step = None
        ev, rep, view = st.event, self.report, self.view
        # world_size: every command carries the deployment's target after the step
        by_dep: dict[str, list[dict]] = {}
        for c in st.commands:
            if c["deployment"] is not None:  # (ScheduleTick is about no deployment)
                by_dep.setdefault(c["deployment"], []).append(c)
        names = set(by_dep) | st.touched
        if ev["deployment"] is not None:
            names.add(ev["deployment"])
        for name in sorted(names):
            k = self.dep(name)
            cmds = by_dep.get(name, [])
            updates = [c["fields"]["world_size"] for c in cmds if c["type"] == "UpdateWorldSize"]
            pre = k.target
            post: int | None
            num = ev["fields"].get("num_replicas")
            if name in view:
                post = view[name]["target"]
            elif (ev["type"] in ("DeploymentApplied", "ScaleRequested") and ev["deployment"] == name
                  and not ev["stale"] and _is_int(num)):
                post = num
            elif updates:
                post = updates[-1]
            elif st.recovered:
                post = None
            else:
                post = pre
            if post is not None:
                for c in cmds:
                    if c["type"] in WORLD_SIZE_COMMANDS and _is_int(c["fields"].get("world_size")):
                        rep.checks["world_size"] += 1
                        if c["fields"]["world_size"] != post:
                            rep.add(c["_line"], f"{c['type']} for {name} carries world_size "
                                                f"{c['fields']['world_size']}, the target is {post}")
                if pre is not None and pre != post and not st.recovered and updates != [post]:
                    rep.add(st.line, f"{name}: target {pre} -> {post} but UpdateWorldSize sent {updates}")
            k.target = post
        # a rank reconfigure at most once per replica and step
        sent = Counter((c["deployment"], c["replica"]) for c in st.commands
                       if c["type"] == "ReconfigureReplica" and c["fields"]["reason"] == "rank")
        for (name, rid), n in sorted(sent.items()):
            if n > 1:
                rep.add(st.line, f"{name}/{rid} got {n} rank reconfigures in one step")
        # commands carry the rank their replica holds after the step
        for c in st.commands:
            if c["type"] in ("InitializeReplica", "ReconfigureReplica"):
                d = view.get(c["deployment"])
                r = d["replicas"].get(c["replica"]) if d is not None else None
                if r is not None:
                    rep.checks["command_rank"] += 1
                    if r["rank"] != c["rank"]:
                        rep.add(c["_line"], f"{c['type']} of {c['replica']} carries {c['rank']}, "
                                            f"the state after the step says {r['rank']}")
        # a placed replica whose rank changed in this step gets a rank reconfigure
        if not st.recovered:
            for name, rid, was, now in st.changes:
                if (was is None or now is None or was["rank"] is None or was["rank"][1] is None
                        or now["phase"] in ("failed", "pending")
                        or (now["phase"] == "stopping" and _succeeded_in(st.commands, name, rid))):
                    # (a FAILED replica's process is stopped: told its rank on restart; a pending
                    # one was never initialised: placed again elsewhere, its PlaceReplica says where;
                    # one stopped with a drain while its successor takes its ranks keeps a spare entry
                    # it is never told, as it takes no new call: rankcore.control.moves.start_beside)
                    continue
                rep.checks["rank_change"] += 1
                if now["rank"] != was["rank"] and (name, rid) not in sent:
                    rep.add(st.line, f"{name}/{rid}: rank {was['rank']} -> {now['rank']} in this step "
                                     f"without a rank reconfigure")
        # replicas that left
        if ev["type"] in ("ReplicaStopped", "ReplicaCrashed") and not ev["stale"] and ev["replica"]:
            gone = self.deps.get(ev["deployment"]) if ev["deployment"] else None
            if gone is not None:
                for m in (gone.grank, gone.lineage, gone.conveyed):
                    m.pop(ev["replica"], None)
        for c in st.commands:
            x = c["fields"].get("replaces") if c["type"] == "StartReplica" else None
            if x:
                k = self.dep(c["deployment"])
                for m in (k.grank, k.lineage, k.conveyed):
                    m.pop(x, None)


def _healthy_ok(d: dict) -> bool:
    """A healthy deployment's state passes ``check_snapshot``, in one pass: ``target``
    replicas, all running and placed, global ranks ``0..n-1``, one node rank per node
    and ``0..m-1`` over the nodes, local ranks ``0..k-1`` on each node."""
    reps = d["replicas"]
    n = len(reps)
    if n != d["target"]:
        return False
    seen = bytearray(n)
    node_rank: dict[Any, int] = {}
    local: dict[Any, list[int]] = {}
    for r in reps.values():
        rk = r["rank"]
        if r["phase"] != "running" or rk is None:
            return False
        g, nr, lr = rk
        if not 0 <= g < n or seen[g] or r["global_rank"] not in (None, g):
            return False
        seen[g] = 1
        node = r["node"]
        if node is None or node_rank.setdefault(node, nr) != nr:
            return False
        local.setdefault(node, []).append(lr)
    if sorted(node_rank.values()) != list(range(len(node_rank))):
        return False
    return all(sorted(ls) == list(range(len(ls))) for ls in local.values())


class _Presence:
    """No replica vanishes unexplained.

    A replica the rebuilt state held and a delta or snapshot drops must have
    left through something the trace shows since the full snapshot before
    its departure, up to the step it left in: a ``ReplicaStopped`` or ``ReplicaCrashed`` event naming it,
    a ``StartReplica`` replacing it, a ``NodeLost`` event for its node, a fault
    naming it (``replica``) or its node (``node`` or ``node_id``:
    ``node_lost``), a ``StopReplica`` naming it while a new replica of its
    lineage appeared (stopped at once and replaced, the replacement waiting
    out a restart backoff: its ``StartReplica`` comes later), or a controller
    recovery when it was stopping (it was ``stopping``, or a ``StopReplica``
    was sent for it): its stop finished while no controller listened, and the
    answer was lost. A recovery alone explains nothing else: a replica that
    was running or starting when the controller went down is still there
    afterwards unless something (a fault) killed it.
    """

    __slots__ = ("pending", "left", "lost_nodes", "stops", "born")

    def __init__(self) -> None:
        #: (deployment, replica, its view when it was last seen, line, at a recovery)
        self.pending: list[tuple[str, str, dict, int, bool]] = []
        self.left: set[str] = set()
        self.lost_nodes: set[str] = set()
        self.stops: set[str] = set()
        self.born: set[tuple[str, int | None]] = set()  # (deployment, lineage) of replicas that appeared

    def event(self, rec: dict) -> None:
        rid, typ = rec["replica"], rec["type"]
        if typ == "NodeLost" and rec["node"] is not None:
            self.lost_nodes.add(rec["node"])
        elif rid is not None and typ in ("ReplicaStopped", "ReplicaCrashed"):
            self.left.add(rid)

    def command(self, rec: dict) -> None:
        if rec["type"] == "StartReplica" and isinstance(rec["fields"].get("replaces"), str):
            self.left.add(rec["fields"]["replaces"])
        elif rec["type"] == "StopReplica" and rec["replica"] is not None:
            self.stops.add(rec["replica"])

    def fault(self, rec: dict) -> None:
        if isinstance(rec.get("replica"), str):
            self.left.add(rec["replica"])
        for key in ("node", "node_id"):
            if isinstance(rec.get(key), str) and rec["type"] == "node_lost":
                self.lost_nodes.add(rec[key])

    def appeared(self, name: str, lineage: int | None) -> None:
        self.born.add((name, lineage))

    def departed(self, name: str, rid: str, was: dict, line: int, *, recovery: bool) -> None:
        self.pending.append((name, rid, was, line, recovery))

    def resolve(self, report: TraceReport, *, clear: bool = True) -> None:
        """Judge the departures seen; ``clear``: a full snapshot, what explains them starts afresh."""
        for name, rid, was, line, recovery in self.pending:
            report.checks["presence"] += 1
            if rid in self.left or was.get("node") in self.lost_nodes:
                continue
            if rid in self.stops and was.get("lineage") is not None and (name, was["lineage"]) in self.born:
                continue
            if recovery and (was.get("phase") == "stopping" or rid in self.stops):
                continue
            report.add(line, f"{name}/{rid} ({was.get('phase')} before line {line}) is gone without a "
                             f"ReplicaStopped, ReplicaCrashed or NodeLost event, a fault naming it or its node, "
                             f"or a recovery while it was stopping")
        self.pending.clear()
        if not clear:
            return
        self.left.clear()
        self.lost_nodes.clear()
        self.stops.clear()
        self.born.clear()


# -------------------------------------------------------------------- entry
def check_trace_lines(lines: Any, path: str = "<trace>") -> TraceReport:
    """Check a trace given as an iterable of lines (``str`` or ``bytes``)."""
    checker = _Checker(path)
    counter = [0]

    def text() -> Iterator[str]:
        for raw in lines:
            counter[0] += 1
            if isinstance(raw, bytes):
                try:
                    raw = raw.decode("utf-8")
                except UnicodeDecodeError:
                    raise TraceFormatError(f"{path}: line {counter[0]}: not UTF-8 text") from None
            yield raw

    records = read_trace(text())
    while True:
        try:
            rec = next(records)
        except StopIteration:
            break
        except ValueError as exc:  # read_trace's "line N: ..." messages
            raise TraceFormatError(f"{path}: {_one_line(str(exc))}") from None
        except (AttributeError, TypeError):
            # read_trace assumes every line holds a JSON object (a number or null trips it up)
            what = ("a record must be a JSON object with a 'kind'" if checker.report.counts["header"]
                    else "not a rankcore-trace trace (the first record must be the header object)")
            raise TraceFormatError(f"{path}: line {counter[0]}: {what}") from None
        checker.feed(rec)
    return checker.finish()


def check_trace_file(path: str | Path) -> TraceReport:
    """Stream the trace at ``path`` and check it; raises :class:`TraceFormatError`
    for a file that is not a well-formed trace (or cannot be read)."""
    name = str(path)
    try:
        fp = open(path, "rb")
    except OSError as exc:
        raise TraceFormatError(f"{name}: cannot read: {exc.strerror or exc}") from None
    with fp:
        try:
            return check_trace_lines(_bounded_lines(fp, name), name)
        except OSError as exc:
            raise TraceFormatError(f"{name}: cannot read: {exc.strerror or exc}") from None


def _bounded_lines(fp: Any, name: str) -> Iterator[bytes]:
    """The file's lines, none longer than ``MAX_LINE_BYTES`` (``TraceFormatError`` at the first that is)."""
    n = 0
    while True:
        line = fp.readline(MAX_LINE_BYTES + 1)
        if not line:
            return
        n += 1
        if len(line) > MAX_LINE_BYTES:
            raise TraceFormatError(f"{name}: line {n}: longer than {MAX_LINE_BYTES:,} bytes (MAX_LINE_BYTES)")
        yield line


def _succeeded_in(commands: list[dict], deployment: str, rid: str) -> bool:
    """A command of the step starts ``rid``'s successor (``StartReplica`` replacing it)."""
    return any(c["type"] == "StartReplica" and c["deployment"] == deployment and c["fields"].get("replaces") == rid
               for c in commands)
