"""What a run measured, per deployment, collected by observing every step."""

from __future__ import annotations

import math

import attrs

import rankcore as rc
from rankcore.lifecycle import Phase

__all__ = ["DeploymentMetrics", "Metrics", "percentile"]

LEVELS = ("rank", "node_rank", "local_rank", "any")


def percentile(values: list[float], q: float) -> float | None:
    """Nearest-rank percentile (None for no values)."""
    if not values:
        return None
    s = sorted(values)
    k = max(0, math.ceil(q / 100 * len(s)) - 1)
    return s[k]


@attrs.define
class DeploymentMetrics:
    reassignments: dict = attrs.field(factory=lambda: dict.fromkeys(LEVELS, 0))
    reconfigures: dict = attrs.field(factory=lambda: {"rank": 0, "user_config": 0})
    starts: int = 0
    crashes: int = 0
    #: replicas the core replaced because their start timed out (``faults.start_timeout``): not crashes
    timeouts: int = 0
    noncontiguous_seconds: float = 0.0
    unavailable_replica_seconds: float = 0.0
    crash_to_ready: list = attrs.field(factory=list)
    first_healthy: float | None = None
    # integration state
    _unavailable: int = 0
    _noncontiguous: bool = False

    def as_dict(self) -> dict:
        return {
            "reassignments": dict(self.reassignments),
            "reconfigures": dict(self.reconfigures),
            "starts": self.starts,
            "crashes": self.crashes,
            "timeouts": self.timeouts,
            "noncontiguous_seconds": round(self.noncontiguous_seconds, 6),
            "unavailable_replica_seconds": round(self.unavailable_replica_seconds, 6),
            "crash_to_ready_p50": percentile(self.crash_to_ready, 50),
            "crash_to_ready_p99": percentile(self.crash_to_ready, 99),
            "replacements_ready": len(self.crash_to_ready),
            "first_healthy": self.first_healthy,
        }


class Metrics:
    """A driver observer: ``Metrics()(t, event, before, result)`` after every step."""

    def __init__(self) -> None:
        self.deployments: dict[str, DeploymentMetrics] = {}
        self.last_t = 0.0
        self.events = 0
        self.stale = 0
        self._crashed_at: dict[tuple[str, int], float] = {}

    def _m(self, name: str) -> DeploymentMetrics:
        m = self.deployments.get(name)
        if m is None:
            m = self.deployments[name] = DeploymentMetrics()
        return m

    def advance(self, t: float) -> None:
        dt = t - self.last_t
        if dt > 0:
            for m in self.deployments.values():
                m.unavailable_replica_seconds += m._unavailable * dt
                if m._noncontiguous:
                    m.noncontiguous_seconds += dt
            self.last_t = t

    def __call__(self, t: float, event: object, before: rc.State, result: rc.Step) -> None:
        self.advance(t)
        self.events += 1
        self.stale += result.stale
        after = result.state
        if isinstance(event, rc.ControllerRecovered):
            # What each replica said against what it holds now (recovery and any
            # compaction in the same step together).
            for r in event.reports:
                dep = after.deployments.get(r.deployment)
                rk = dep.ranks.rank_of(r.replica_id) if dep is not None and r.replica_id in dep.ranks else None
                if rk is not None:
                    said = (r.rank.rank, r.rank.node_rank, r.rank.local_rank)
                    now = rk.as_tuple()
                    known = tuple(n if s is None else s for s, n in zip(said, now))  # unsaid = unchanged
                    self._count_change(self._m(r.deployment), known, now)
        else:
            for comp in result.compactions:
                m = self._m(comp.deployment)
                for ch in comp.changes:
                    self._count_change(m, ch.old.as_tuple(), ch.new.as_tuple())
        timed_out = isinstance(event, rc.Tick)  # a Tick replaces only replicas whose start timed out
        for cmd in result.commands:
            if isinstance(cmd, rc.StartReplica):
                self._m(cmd.deployment).starts += 1
                if timed_out and cmd.replaces is not None:
                    self._m(cmd.deployment).timeouts += 1
                if cmd.replaces is not None and cmd.lineage is not None:
                    self._crashed_at.setdefault((cmd.deployment, cmd.lineage), t)
            elif isinstance(cmd, rc.ReconfigureReplica):
                self._m(cmd.deployment).reconfigures[cmd.reason] += 1
        if isinstance(event, rc.ReplicaReady) and not result.stale:
            name = after.index.get(event.replica_id)
            if name is not None:
                rep = after.deployments[name].replicas[event.replica_id]
                t0 = self._crashed_at.pop((name, rep.lineage), None)
                if t0 is not None:
                    self._m(name).crash_to_ready.append(t - t0)
        for name, dep in after.deployments.items():
            m = self._m(name)
            serving = dep.count(Phase.RUNNING) + dep.count(Phase.RECONFIGURING)
            m._unavailable = max(0, dep.target - serving)
            m._noncontiguous = not dep.ranks.is_contiguous()
            if m.first_healthy is None and dep.healthy and dep.target > 0:
                m.first_healthy = t

    def crashed(self, t: float, deployment: str, serving: bool) -> None:
        """The cluster lost a replica (told by the executor, so crashes while the
        controller is down count too); a serving one is unavailable from now."""
        self.advance(t)
        m = self._m(deployment)
        m.crashes += 1
        if serving:
            m._unavailable += 1

    @staticmethod
    def _count_change(m: DeploymentMetrics, old: tuple, new: tuple) -> None:
        any_ = False
        for level, a, b in zip(LEVELS, old, new):
            if a != b:
                m.reassignments[level] += 1
                any_ = True
        m.reassignments["any"] += any_

    def as_dict(self) -> dict:
        return {
            "events": self.events,
            "stale_events": self.stale,
            "deployments": {name: m.as_dict() for name, m in sorted(self.deployments.items())},
        }
