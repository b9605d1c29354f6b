"""The simulator's requests (issue 22): arrivals, service times, and one request machine.

Each deployment with a ``traffic:`` entry (``executors.scenarios.format.TrafficSpec``)
gets requests from its arrival process (``poisson``, ``bursts``, ``daily``, ``file``),
each seeded stream its own (``traffic/<deployment>/...``), so adding traffic changes
no other draw. Every decision about a request is ``rankcore.requests.RequestMachine``'s
(one for the whole run): the simulator feeds it ``Configure`` per deployment, every
pool command the core emits (``SimBackend.pool_changed``), a ``Submit`` at each
arrival, a ``Completed`` once the replica it was dispatched to has served it for a
``service`` draw, and a ``Tick`` at each deadline. It decides nothing itself: a
replica that dies holding requests never answers them, and the machine learns it
from the core's ``PoolChanged(gone)`` (then requeues, retries or fails them). The
only fact the simulator reports on its own is a dispatch to a replica that is no
longer there (dead while the controller was down): ``NotDelivered``, as a handle
gets an error sending to a dead actor.

What it measures per deployment (``as_dict``): the machine's counters, what the
callers saw (every Submit ends once: ``lost`` from the simulator's own books),
queue wait (submit -> first dispatch) and end-to-end latency (submit -> answer)
percentiles in virtual seconds, the longest queue, and ``queue_series``: (t,
queued, in flight) every ``metrics_interval_s``, the load an autoscaler reads
(issue 23).
"""

from __future__ import annotations

import math
import random
from collections.abc import Iterator
from typing import Any

from rankcore.records import maker
from rankcore.requests import (
    CancelOnReplica,
    Completed,
    Configure,
    Dispatch,
    Failed,
    NotDelivered,
    Rejected,
    RequestAction,
    RequestMachine,
    Submit,
    Tick,
)

from ..scenarios.format import ArrivalSpec, TrafficSpec
from ..scenarios.metrics import percentile

__all__ = ["SimTraffic", "arrival_times", "segments"]

# records built from values the simulator holds valid (ids it made, its own clock)
_Submit, _Completed, _NotDelivered, _Tick = (maker(c) for c in (Submit, Completed, NotDelivered, Tick))
#: the phases in which a replica takes a call (one stopping drains what it holds, takes nothing new)
_TAKES_CALLS = ("running", "reconfiguring")
#: the failures each deployment's metrics keep in full (the rest are counted)
KEEP_FAILURES = 20


def segments(spec: ArrivalSpec) -> Iterator[tuple[float, float, float]]:
    """The arrival rate as consecutive (start, end, requests/s) pieces from t=0, for ever."""
    if spec.kind == "poisson":
        yield 0.0, math.inf, spec.rate
    elif spec.kind == "bursts":
        if spec.offset_s > 0:
            yield 0.0, spec.offset_s, spec.base_rate
        k = 0
        while True:
            s = spec.offset_s + k * spec.period_s
            yield s, s + spec.burst_s, spec.burst_rate
            yield s + spec.burst_s, s + spec.period_s, spec.base_rate
            k += 1
    elif spec.kind == "daily":
        hour, k = spec.day_s / 24.0, 0
        while True:
            for h, rate in enumerate(spec.rates):
                yield k * spec.day_s + h * hour, k * spec.day_s + (h + 1) * hour, rate
            k += 1
    else:
        raise ValueError(f"arrivals of kind {spec.kind!r} come from a list, not a rate")


def arrival_times(spec: ArrivalSpec, rng: random.Random, start: float, until: float) -> Iterator[float]:
    """Arrival times in ``[start, until]``, increasing: ``file``'s as listed; the others a Poisson
    process whose rate is constant on each piece of ``segments`` (exact: an exponential gap that
    crosses a piece's end is dropped and drawn again from there, the process being memoryless)."""
    if spec.kind == "file":
        yield from (t for t in spec.times if start <= t <= until)
        return
    t = start
    for a, b, rate in segments(spec):
        if a > until:
            return
        if b <= t:
            continue
        t = max(t, a)
        while rate > 0:
            t += rng.expovariate(rate)
            if t >= b:
                break
            if t > until:
                return
            yield t
        t = b


class _Flow:
    """One deployment's traffic: its spec, streams and what it measured."""

    __slots__ = ("spec", "name", "times", "service", "errors", "n", "waits", "latencies", "series", "max_queued",
                 "ends", "answers", "live", "failures", "failed_by_replica", "double_ends")

    def __init__(self, spec: TrafficSpec, sim: Any) -> None:
        self.spec, self.name = spec, spec.deployment
        self.times = arrival_times(spec.arrivals, sim.stream(f"traffic/{self.name}/arrivals"), spec.start, spec.until)
        self.service = sim.stream(f"traffic/{self.name}/service")
        self.errors = sim.stream(f"traffic/{self.name}/errors")
        self.n = 0  # Submits so far (the next request's number)
        self.waits: list[float] = []  # submit -> first dispatch, per request dispatched
        self.latencies: list[float] = []  # submit -> answer (ok or an application error)
        self.series: list[tuple[float, int, int]] = []
        self.max_queued = 0
        self.ends = 0  # ends the callers were told: answers, Rejected, Failed
        self.answers = 0
        self.live = 0  # submitted and not ended, as the callers see it
        self.failures: list[dict] = []
        self.failed_by_replica: dict[str, int] = {}
        self.double_ends = 0  # an end for a request already ended (never, if the machine is right)


class _Req:
    __slots__ = ("flow", "t0", "dispatched")

    def __init__(self, flow: _Flow, t0: float) -> None:
        self.flow, self.t0, self.dispatched = flow, t0, False


class SimTraffic:
    """Every deployment's requests in one simulation (module docstring). ``sim``: the
    ``Simulation`` (its clock, seeded streams and backend)."""

    def __init__(self, sim: Any, specs: dict[str, TrafficSpec]) -> None:
        self.sim = sim
        self.machine = RequestMachine()
        self.flows: dict[str, _Flow] = {}
        self._requests: dict[str, _Req] = {}  # live requests, as the callers see them
        #: replica id -> request id -> (when its answer is due, its ticket, ok): what each replica is serving
        self._held: dict[str, dict[str, tuple[float, int, bool]]] = {}
        self._end_t = sim.scenario.duration
        for name in sorted(specs):
            flow = self.flows[name] = _Flow(specs[name], sim)
            self.machine.handle(Configure(deployment=name, **dict(specs[name].limits)))
            self._next_arrival(flow)
            sim.schedule(0.0, self._sample, flow, last=True)

    # ------------------------------------------------------------ arrivals
    def _next_arrival(self, flow: _Flow) -> None:
        t = next(flow.times, None)
        if t is not None:
            self.sim.schedule(t - self.sim.now, self._arrive, flow)

    def _arrive(self, flow: _Flow) -> None:
        now, spec = self.sim.now, flow.spec
        rid = f"{flow.name}/{flow.n}"
        flow.n += 1
        deadline = None if spec.timeout_s is None else now + spec.timeout_s
        self._requests[rid] = _Req(flow, now)
        flow.live += 1
        actions = self.machine.handle(_Submit(request_id=rid, deployment=flow.name, idempotent=spec.idempotent,
                                              stream=False, deadline=deadline))
        if deadline is not None:
            self.sim.schedule(spec.timeout_s, self._tick)
        if not actions:  # queued
            self._peak(flow)
        self._carry(actions)
        self._next_arrival(flow)

    # ------------------------------------------------- the machine's actions
    def _carry(self, actions: list[RequestAction]) -> None:
        for a in actions:
            if isinstance(a, Dispatch):
                self._dispatch(a)
            elif isinstance(a, CancelOnReplica):
                self._answer_now(a.request_id, a.replica_id)
            else:
                self._ended(a)

    def _dispatch(self, a: Dispatch) -> None:
        """Hand the request to its replica: served for a ``service`` draw, then answered (a hung
        replica never answers); a replica no longer there never got it (``NotDelivered``)."""
        sim = self.sim
        r = sim.backend.replicas.get(a.replica_id)
        if r is None or r.phase not in _TAKES_CALLS:
            self._carry(self.machine.handle(_NotDelivered(request_id=a.request_id, replica_id=a.replica_id)))
            self._peak(self.flows[a.deployment])
            return
        req = self._requests.get(a.request_id)
        flow = self.flows[a.deployment]
        if req is not None and not req.dispatched:
            req.dispatched = True
            flow.waits.append(sim.now - req.t0)
        if r.hung:
            return  # a frozen process takes the call and never answers it
        service = flow.spec.service.sample(flow.service)
        ok = flow.spec.error_rate <= 0 or flow.errors.random() >= flow.spec.error_rate
        ticket = sim.schedule(service, self._complete, a.request_id, a.replica_id, r.epoch, ok)
        self._held.setdefault(a.replica_id, {})[a.request_id] = (sim.now + service, ticket, ok)

    def _complete(self, rid: str, replica_id: str, epoch: int, ok: bool) -> None:
        """The replica finished serving ``rid``: its answer goes in if that very replica is still
        alive and answering (one that died or froze meanwhile never answers)."""
        held = self._held.get(replica_id)
        if held is not None:
            held.pop(rid, None)
            if not held:
                del self._held[replica_id]
        r = self.sim.backend.replicas.get(replica_id)
        if r is None or r.epoch != epoch or r.hung:
            return
        st = self.machine.status(rid)
        if st is None:
            return  # ended so long ago the machine forgot it (its answer would only be counted late)
        answer = st.state in ("dispatched", "running") and st.replica_id == replica_id
        actions = self.machine.handle(_Completed(request_id=rid, ok=ok, replica_id=replica_id))
        if answer:
            req = self._requests.pop(rid)
            req.flow.latencies.append(self.sim.now - req.t0)
            req.flow.answers += 1
            req.flow.ends += 1
            req.flow.live -= 1
        self._carry(actions)

    def _answer_now(self, rid: str, replica_id: str) -> None:
        """``CancelOnReplica``: the replica stops serving ``rid`` and answers at once (counted late
        by the machine), which frees its slot."""
        entry = self._held.get(replica_id, {}).get(rid)
        if entry is not None:
            self.sim.cancel(entry[1])
            r = self.sim.backend.replicas.get(replica_id)
            epoch = r.epoch if r is not None else -1
            ticket = self.sim.schedule(0.0, self._complete, rid, replica_id, epoch, entry[2])
            self._held[replica_id][rid] = (self.sim.now, ticket, entry[2])

    def _ended(self, a: Rejected | Failed) -> None:
        req = self._requests.pop(a.request_id, None)
        if req is None:
            flow = self.flows.get(a.request_id.rsplit("/", 1)[0])
            if flow is not None:
                flow.double_ends += 1
            return
        flow = req.flow
        flow.ends += 1
        flow.live -= 1
        if type(a) is Failed:
            rep = a.replica_id or "-"
            flow.failed_by_replica[rep] = flow.failed_by_replica.get(rep, 0) + 1
            if len(flow.failures) < KEEP_FAILURES:
                flow.failures.append({"t": round(self.sim.now, 6), "request": a.request_id, "reason": a.reason,
                                      "replica": a.replica_id, "detail": a.detail})

    def _tick(self) -> None:
        """A deadline came due: the machine ends what is past it."""
        self._carry(self.machine.handle(_Tick(now=self.sim.now)))

    # ---------------------------------------------------------- the pool
    def pool_changed(self, commands: tuple) -> None:
        """The core's pool commands of one step (``Step.pool``), as they are."""
        for cmd in commands:
            self._carry(self.machine.handle(cmd))
            flow = self.flows.get(cmd.deployment)
            if flow is not None:
                self._peak(flow)  # (a replica gone puts what it held back in the queue)

    def drain_s(self, replica_id: str) -> float:
        """How long ``replica_id`` needs to finish what it is serving (its graceful stop waits)."""
        held = self._held.get(replica_id)
        if not held:
            return 0.0
        return max(0.0, max(due for due, _, _ in held.values()) - self.sim.now)

    # ------------------------------------------------------------ metrics
    def _peak(self, flow: _Flow) -> None:
        q = self.machine.counters(flow.name).in_queue
        if q > flow.max_queued:
            flow.max_queued = q

    def _sample(self, flow: _Flow) -> None:
        c = self.machine.counters(flow.name)
        flow.series.append((round(self.sim.now, 6), c.in_queue, c.in_flight))
        flow.max_queued = max(flow.max_queued, c.in_queue)
        nxt = self.sim.now + flow.spec.metrics_interval_s
        if self._end_t is None or nxt <= self._end_t + 1e-9:
            self.sim.schedule(flow.spec.metrics_interval_s, self._sample, flow, last=True)

    def as_dict(self) -> dict[str, dict]:
        """Per deployment: counters, percentiles (virtual seconds), the longest queue, the series."""
        out = {}
        for name, f in self.flows.items():
            c = self.machine.counters(name)
            out[name] = {
                "submitted": c.submitted, "dispatched": c.dispatched, "answered": c.answered,
                "app_errors": c.app_errors, "retried": c.retried, "failed": c.failed,
                "rejected": dict(c.rejected), "rejected_total": c.rejected_total, "cancelled": c.cancelled,
                "late": c.late, "in_queue": c.in_queue, "in_flight": c.in_flight,
                # the callers' books: every Submit ended once or is still waiting (the machine's own: machine_lost)
                "lost": f.n - f.ends - f.live, "machine_lost": c.lost, "double_ends": f.double_ends,
                "queue_wait_p50": _r(percentile(f.waits, 50)), "queue_wait_p99": _r(percentile(f.waits, 99)),
                "queue_wait_max": _r(max(f.waits)) if f.waits else None,
                "latency_p50": _r(percentile(f.latencies, 50)), "latency_p99": _r(percentile(f.latencies, 99)),
                "max_queued": f.max_queued,
                "failed_by_replica": dict(sorted(f.failed_by_replica.items())),
                "failures": list(f.failures),
                "queue_series": [list(s) for s in f.series],
            }
        return out


def _r(v: float | None) -> float | None:
    return None if v is None else round(v, 6)
