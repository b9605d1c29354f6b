"""The simulator's proxies (issue 38): it runs what the core decides, and routes requests through them.

With a scenario's ``proxies:`` section the core runs the proxies (``ProxiesConfigured`` at
t=0, ``rankcore.control.proxies``) and this module carries out its commands as a node's
proxy would: ``StartProxy`` is ready after a ``start`` draw (``ProxyStarted``), ``DrainProxy``
turns its drain checks on (a ``ProxyHealthChecked`` every ``PROXY_DRAIN_CHECK_PERIOD_S``, saying
how many requests it has in flight: Serve's drain check), ``StopProxy`` ends it. It decides
nothing: a proxy dies at random (``crash_rate_per_proxy_hour``, one Poisson clock per
incarnation) or with its node, and the core hears of it (``ProxyCrashed``; a lost node's
proxy through ``NodeLost``).

An outside load balancer spreads the requests over the proxies that serve (ready, not
draining: ``/-/healthz`` answers 200), one drawn at random per request (its own seeded stream,
``proxies/route``). A request that finds none fails at its caller (``no_proxy``); a proxy that
dies drops the connections it holds: each request it carried fails at its caller
(``dropped``) and is cancelled in the request machine (``Cancel``: the client hung up), which
frees its queue slot or its replica's.
"""

from __future__ import annotations

from typing import Any

import rankcore as rc

__all__ = ["SimProxies", "PROXY_DRAIN_CHECK_PERIOD_S"]

#: Serve's PROXY_DRAIN_CHECK_PERIOD_S: how often a draining proxy reports what it has in flight
PROXY_DRAIN_CHECK_PERIOD_S = 5.0


class _Proxy:
    __slots__ = ("pid", "node", "ready", "draining", "carrying")

    def __init__(self, pid: str, node: str) -> None:
        self.pid, self.node = pid, node
        self.ready = self.draining = False
        self.carrying: set[str] = set()  # the requests whose connections it holds


class SimProxies:
    """Every proxy of one simulation (module docstring). ``spec``: the scenario's ``ProxySpec``."""

    def __init__(self, sim: Any, spec: Any) -> None:
        self.sim, self.spec = sim, spec
        self.up: dict[str, _Proxy] = {}  # proxy id -> the proxy, started and not gone
        self._route = sim.stream("proxies/route")
        self._crash = sim.stream("proxies/crash")
        self._start = sim.stream("proxies/start")
        self.traffic: Any = None  # (SimTraffic: told which requests a dead proxy dropped)
        self.starts = self.crashes = self.dropped = self.no_proxy = self.drains = self.lost_with_node = 0
        self.stops: dict[str, int] = {}
        self._serving_seconds = 0.0  # proxies serving, integrated over time
        self._since = 0.0
        self.peak = 0
        self.numbered = 0  # one above the highest proxy number started (a recovery's next_proxy_number)

    def configured(self) -> rc.ProxiesConfigured:
        return rc.ProxiesConfigured(options=self.spec.options, head_node=self.spec.head)

    # ------------------------------------------------------------ commands
    def start(self, cmd: rc.StartProxy) -> None:
        self._settle()
        p = self.up[cmd.proxy_id] = _Proxy(cmd.proxy_id, cmd.node_id)
        self.starts += 1
        parsed = rc.query.parse_proxy_id(cmd.proxy_id)
        self.numbered = max(self.numbered, (parsed[1] if parsed else -1) + 1)
        self.sim.schedule(self.spec.start.sample(self._start), self._ready, p)
        if self.spec.crash_rate > 0:
            self.sim.schedule(self._crash.expovariate(self.spec.crash_rate), self._die, p, "crashed")

    def drain(self, cmd: rc.DrainProxy) -> None:
        p = self.up.get(cmd.proxy_id)
        if p is None:
            return
        self._settle()
        was, p.draining = p.draining, cmd.draining
        if cmd.draining and not was:
            self.drains += 1
            self.sim.schedule(PROXY_DRAIN_CHECK_PERIOD_S, self._drain_check, p)

    def stop(self, cmd: rc.StopProxy) -> None:
        self.stops[cmd.reason] = self.stops.get(cmd.reason, 0) + 1
        p = self.up.get(cmd.proxy_id)
        if p is not None:
            self._gone(p)

    # ------------------------------------------------------- what happens
    def _ready(self, p: _Proxy) -> None:
        if self.up.get(p.pid) is p:
            self._settle()
            p.ready = True
            self.sim.deliver(rc.ProxyStarted(proxy_id=p.pid, now=self.sim.now))

    def _drain_check(self, p: _Proxy) -> None:
        if self.up.get(p.pid) is p and p.draining:
            self.sim.deliver(rc.ProxyHealthChecked(proxy_id=p.pid, healthy=True, ongoing=len(p.carrying),
                                                   now=self.sim.now))
            if self.up.get(p.pid) is p:
                self.sim.schedule(PROXY_DRAIN_CHECK_PERIOD_S, self._drain_check, p)

    def _die(self, p: _Proxy, why: str) -> None:
        if self.up.get(p.pid) is not p:
            return
        self.crashes += 1
        self._gone(p)
        self.sim.deliver(rc.ProxyCrashed(proxy_id=p.pid, reason=why, now=self.sim.now))

    def node_lost(self, node: str) -> None:
        """The node is gone, and its proxy with it (the core learns it from ``NodeLost``)."""
        for p in [p for p in self.up.values() if p.node == node]:
            self.lost_with_node += 1
            self._gone(p)

    def _gone(self, p: _Proxy) -> None:
        self._settle()
        del self.up[p.pid]
        if p.carrying and self.traffic is not None:
            dropped = sorted(p.carrying)
            p.carrying.clear()
            self.dropped += len(dropped)
            self.traffic.dropped(dropped)

    # ------------------------------------------------------------ requests
    def route(self, rid: str) -> _Proxy | None:
        """The proxy a new request reaches (None: none serves: it fails at its caller)."""
        serving = [p for p in self.up.values() if p.ready and not p.draining]
        if not serving:
            self.no_proxy += 1
            return None
        p = serving[0] if len(serving) == 1 else serving[self._route.randrange(len(serving))]
        p.carrying.add(rid)
        return p

    def done(self, p: _Proxy, rid: str) -> None:
        p.carrying.discard(rid)

    # ------------------------------------------------------------- figures
    def _settle(self) -> None:
        now = self.sim.now
        n = sum(1 for p in self.up.values() if p.ready and not p.draining)
        self._serving_seconds += n * (now - self._since)
        self._since = now
        self.peak = max(self.peak, len(self.up))

    def as_dict(self) -> dict:
        self._settle()
        end = self.sim.now
        return {"location": self.spec.options.proxy_location.value, "started": self.starts, "crashes": self.crashes,
                "lost_with_node": self.lost_with_node, "drains": self.drains, "stops": dict(sorted(self.stops.items())),
                "requests_dropped": self.dropped, "requests_without_proxy": self.no_proxy,
                "serving_mean": round(self._serving_seconds / end, 6) if end > 0 else None, "peak": self.peak}
