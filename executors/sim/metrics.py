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

    @staticmethod
    def _contiguous(dep: rc.Deployment) -> bool:
        return not dep.dirty or dep.ranks.is_contiguous()

    def __call__(self, t: float, event: object, before: rc.State, result: rc.Step) -> None:
        self.advance(t)
        self.events += 1
        self.stale += result.stale
        after = result.state
        reports = {}
        if isinstance(event, rc.ControllerRecovered):
            reports = {r.replica_id: r.rank for r in event.reports}
        for comp in result.compactions:
            m = self._m(comp.deployment)
            for ch in comp.changes:
                self._count_change(m, ch.old.as_tuple(), ch.new.as_tuple())
        for cmd in result.commands:
            if isinstance(cmd, rc.StartReplica):
                m = self._m(cmd.deployment)
                m.starts += 1
                if cmd.replaces is not None:
                    m.crashes += 1
                    self._crashed_at.setdefault((cmd.deployment, cmd.lineage), t)
            elif isinstance(cmd, rc.ReconfigureReplica):
                m = self._m(cmd.deployment)
                m.reconfigures[cmd.reason] += 1
                if cmd.reason == "rank" and not result.compactions:
                    said = reports.get(cmd.replica_id)
                    old = (said.rank, said.node_rank, said.local_rank) if said is not None else (None, None, None)
                    self._count_change(m, old, cmd.rank.as_tuple())
        if isinstance(event, rc.ReplicaReady) and not result.stale:
            name = after.index.get(event.replica_id)
            if name is not None:
                rep = after.deployments[name].replicas[event.replica_id]
                t0 = self._crashed_at.pop((name, rep.lineage), None)
                if t0 is not None:
                    self._m(name).crash_to_ready.append(t - t0)
        if isinstance(event, rc.ReplicaCrashed) and not result.stale:
            name = before.index.get(event.replica_id)
            if name is not None and before.deployments[name].replicas[event.replica_id].phase is Phase.STOPPING:
                self._m(name).crashes += 1
        for name, dep in after.deployments.items():
            m = self._m(name)
            serving = dep.count(Phase.RUNNING) + dep.count(Phase.RECONFIGURING)
            m._unavailable = max(0, dep.target - serving)
            m._noncontiguous = not self._contiguous(dep)
            if m.first_healthy is None and dep.healthy and dep.target > 0:
                m.first_healthy = t

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
