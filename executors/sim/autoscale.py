"""The simulator's side of autoscaling (issue 23): it feeds the core's autoscaler and measures it.

The policy is the core's (``rankcore.control.autoscaling``); the simulator only reports what its
request path sees, as Ray Serve's handles and replicas push theirs: every
``metrics_interval_s`` (the deployment's own option, read from the core's config, so an
``apply`` that changes it is followed) an ``AutoscalingMetrics`` per autoscaled deployment,
stamped with the virtual time, ``queued`` the request machine's queue for it and ``ongoing``
the requests in flight on each replica of its pool (``RequestMachine.pool``). Without
``traffic:`` for it the load is zero. A request queued while the deployment's target is 0
sends one at once, so a cold start does not wait for the next interval.

While the controller is down nothing is fed (autoscaling pauses; requests keep flowing to
the replicas the machine knows); the timers keep their phase, and the first sample after
the recovery starts the core's window afresh. The timers are scheduled ``last`` at their
instant (after everything else due then), so the same seed gives the same samples.

What it measures per deployment (``as_dict``, under ``autoscaling`` in the run's metrics):
samples fed and skipped (controller down), the autoscaler's target changes (ups, downs,
from the steps of ``AutoscalingMetrics``), the highest and lowest target, and *time to
enough*: from a sample whose load needs more replicas than serve (ceil(total /
``target_ongoing_requests``), bounded like the target) to the moment enough serve for the
latest sample's load; episodes that end because the load fell with no more replicas
serving are not counted (nothing had to come), those still open at the end are counted
apart (``to_enough_open``).
"""

from __future__ import annotations

import math
from typing import Any

import rankcore as rc

from ..scenarios.metrics import percentile

__all__ = ["SimAutoscaler"]


def _autoscaled(dep: rc.Deployment | None) -> bool:
    return dep is not None and dep.config.autoscaler.autoscaling and not dep.deleting


class _Figures:
    """One autoscaled deployment's figures, and its open *time to enough* episode."""

    __slots__ = ("fed", "skipped", "ups", "downs", "max_target", "min_target", "to_enough", "open_since",
                 "open_need", "open_serving", "absorbed", "timer", "interval")

    def __init__(self, target: int, interval: float) -> None:
        self.fed = self.skipped = self.ups = self.downs = self.absorbed = 0
        self.max_target = self.min_target = target
        self.to_enough: list[float] = []
        self.open_since: float | None = None  # an episode: since when more replicas were needed
        self.open_need = 0  # replicas the latest sample's load needs
        self.open_serving = 0  # replicas serving when it opened
        self.timer: int | None = None
        self.interval = interval  # its metrics_interval_s, as last known (kept while the controller is down)

    def as_dict(self) -> dict:
        return {"metrics_fed": self.fed, "metrics_skipped": self.skipped, "scale_ups": self.ups,
                "scale_downs": self.downs, "target_changes": self.ups + self.downs,
                "max_target": self.max_target, "min_target": self.min_target,
                "to_enough_p50": _r(percentile(self.to_enough, 50)),
                "to_enough_max": _r(max(self.to_enough)) if self.to_enough else None,
                "to_enough_n": len(self.to_enough), "to_enough_open": int(self.open_since is not None),
                "load_fell_first": self.absorbed}


class SimAutoscaler:
    """Feeds ``AutoscalingMetrics`` for every autoscaled deployment of one ``Simulation`` (``sim``:
    its clock, driver, traffic and ``controller_up``) and measures what the autoscaler did. A
    driver observer: it starts a deployment's timer when a step makes it autoscaled."""

    def __init__(self, sim: Any) -> None:
        self.sim = sim
        self.figures: dict[str, _Figures] = {}

    # ------------------------------------------------------------ the feed
    def __call__(self, t: float, event: object, before: rc.State, result: rc.Step) -> None:
        kind = type(event)
        after = result.state
        if kind is rc.AutoscalingMetrics:
            self._decided(t, before, after, event.deployment)  # type: ignore[attr-defined]
        elif kind is rc.DeploymentApplied or kind is rc.ControllerRecovered:
            for name, dep in after.deployments.items():
                if _autoscaled(dep):
                    self._follow(name, dep)
        elif kind is rc.ReplicaReady and self.figures:
            name = after.index.get(event.replica_id)  # type: ignore[attr-defined]
            f = self.figures.get(name) if name is not None else None
            if f is not None and f.open_since is not None:
                self._enough(f, after.deployments[name], t)

    def _follow(self, name: str, dep: rc.Deployment) -> None:
        """``name`` is autoscaled: its samples start one interval from now (once)."""
        f = self.figures.get(name)
        if f is None:
            f = self.figures[name] = _Figures(dep.target, dep.config.autoscaler.metrics_interval_s)
        f.interval = dep.config.autoscaler.metrics_interval_s
        if f.timer is None:
            f.timer = self.sim.schedule(f.interval, self._due, name, last=True)

    def _due(self, name: str) -> None:
        """A deployment's interval came round: a sample (unless the controller is down), and the
        next one; a deployment no longer autoscaled (or gone) stops its timer."""
        f = self.figures[name]
        f.timer = None
        dep = self.sim.driver.state.deployments.get(name)
        if self.sim.controller_up and not _autoscaled(dep):
            return
        if self.sim.controller_up:
            assert dep is not None
            f.interval = dep.config.autoscaler.metrics_interval_s
            self.feed(name)
        else:
            f.skipped += 1
        f.timer = self.sim.schedule(f.interval, self._due, name, last=True)

    def feed(self, name: str) -> None:
        """One sample of ``name``'s load, now, to the core."""
        traffic = self.sim.traffic
        queued, ongoing = traffic.machine.load(name) if traffic is not None and name in traffic.flows else (0, ())
        self.figures[name].fed += 1
        self.sim.deliver(rc.AutoscalingMetrics(deployment=name, now=self.sim.now, queued=queued, ongoing=ongoing))

    def queued(self, name: str) -> None:
        """A request for ``name`` was queued: with its target at 0 (scaled to zero, the controller
        up), a sample goes at once rather than at the next interval."""
        f = self.figures.get(name)
        if f is None or not self.sim.controller_up:
            return
        dep = self.sim.driver.state.deployments.get(name)
        if _autoscaled(dep) and dep is not None and dep.target == 0:
            self.feed(name)

    # --------------------------------------------------------- the figures
    def _decided(self, t: float, before: rc.State, after: rc.State, name: str) -> None:
        """An ``AutoscalingMetrics`` step: a target change counted, an episode opened or closed."""
        f = self.figures.get(name)
        dep = after.deployments.get(name)
        if f is None or dep is None:
            return
        old = before.deployments.get(name)
        if old is not None and dep.target != old.target:
            if dep.target > old.target:
                f.ups += 1
            else:
                f.downs += 1
            f.max_target, f.min_target = max(f.max_target, dep.target), min(f.min_target, dep.target)
        window = (dep.autoscaler.window if dep.autoscaler is not None else ())
        if not window:
            return
        _, queued, in_flight = window[-1]
        auto = dep.config.autoscaler
        need = rc.autoscaling.bounded(dep, math.ceil((queued + in_flight) / auto.target_ongoing_requests))
        serving = rc.autoscaling.running(dep)
        if f.open_since is None:
            if need > serving:
                f.open_since, f.open_need, f.open_serving = t, need, serving
            return
        f.open_need = need
        self._enough(f, dep, t)

    def _enough(self, f: _Figures, dep: rc.Deployment, t: float) -> None:
        """Close ``f``'s episode if enough replicas serve for the latest load."""
        serving = rc.autoscaling.running(dep)
        if f.open_since is None or serving < f.open_need:
            return
        if serving > f.open_serving:
            f.to_enough.append(t - f.open_since)
        else:
            f.absorbed += 1
        f.open_since = None

    def as_dict(self) -> dict[str, dict]:
        return {name: f.as_dict() for name, f in sorted(self.figures.items())}


def _r(v: float | None) -> float | None:
    return None if v is None else round(v, 6)
