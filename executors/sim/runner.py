"""The discrete-event simulation: virtual clock, timeline, faults, expectations.

Deterministic: one seeded ``random.Random`` and a heap ordered by (time,
sequence number), so the same scenario and seed give a byte-identical trace.
No sleeping: virtual time jumps from one scheduled happening to the next.
"""

from __future__ import annotations

import heapq
import random
from collections.abc import Callable
from typing import Any, TextIO

import attrs

import rankcore as rc
from rankcore.invariants import check_state

from ..driver import Driver
from ..scenarios import (
    Action,
    Desired,
    Expectation,
    ExpectationResult,
    Metrics,
    Scenario,
    check_expectation,
)
from ..scenarios.timeline import Crash, Hang, Wait, WaitUntilHealthy, WaitUntilServing
from ..trace import TraceWriter
from .autoscale import SimAutoscaler
from .provision import SimProvisioner
from .proxies import SimProxies
from .traffic import SimTraffic
from .world import SimBackend, SimReplica

__all__ = ["Simulation", "RunResult", "run_scenario"]

#: without a ``duration``, a run that has not settled by then is stopped
HORIZON = 7 * 24 * 3600.0


@attrs.frozen
class RunResult:
    scenario: Scenario
    seed: int
    end_time: float
    state: rc.State
    metrics: dict
    expectations: tuple[ExpectationResult, ...]
    events: int
    settled: bool

    @property
    def passed(self) -> bool:
        return all(e.passed for e in self.expectations)

    @property
    def failures(self) -> list[ExpectationResult]:
        return [e for e in self.expectations if not e.passed]


class Simulation:
    """Runs one scenario. Use :meth:`run` for the whole timeline, or drive it
    step by step with :meth:`act` and :meth:`run_until` (the property tests do)."""

    def __init__(
        self,
        scenario: Scenario,
        *,
        seed: int | None = None,
        trace: TextIO | None = None,
        snapshot_every: int | None = None,
        check: bool = False,
        progress: Callable[[float, float | None], None] | None = None,
    ) -> None:
        self.scenario = scenario
        self.seed = scenario.seed if seed is None else seed
        # One seeded stream per source of randomness (common random numbers): a
        # variant that changes the cluster or a latency does not reshuffle the
        # crashes, hangs or node losses. ``rng`` is the latencies' stream.
        self._streams: dict[str, random.Random] = {}
        self.rng = self.stream("latency")
        self._latency: dict[tuple[str, str], Any] = {}  # (deployment, what) -> the scenario's Latency
        self._slots: set[tuple[str, int]] = set()  # (deployment, rank) whose crash clock runs
        self.now = 0.0
        self._queue: list[tuple[float, int, int, Callable, tuple]] = []
        self._seq = 0
        self._cancelled: set[int] = set()
        self.backend = SimBackend(self)
        #: the requests (``traffic:``): one request machine fed the core's pool commands
        self.traffic = SimTraffic(self, scenario.traffic) if scenario.traffic else None
        self.backend.traffic = self.traffic
        #: the proxies the core runs (``proxies:``): requests come in through them
        self.proxies = SimProxies(self, scenario.proxies) if scenario.proxies is not None else None
        self.backend.proxies = self.proxies
        if self.proxies is not None and self.traffic is not None:
            self.traffic.proxies, self.proxies.traffic = self.proxies, self.traffic
        if scenario.provisioning is not None:  # nodes added on the core's demand
            self.backend.provisioner = SimProvisioner(self, self.backend, scenario.provisioning, self.add_node)
        every = snapshot_every or scenario.snapshot_every
        self.trace = (
            TraceWriter(trace, snapshot_every=every,
                        meta={"executor": "sim", "scenario": scenario.name, "seed": self.seed})
            if trace is not None else None
        )
        self.driver = Driver(self.backend, trace=self.trace, check=check, clock=True)
        #: a collective group is up the re-form's median after its epoch formed (docs/groups.md)
        self.metrics = Metrics(reform_s=lambda d: scenario.latency_for(d, "reform").quantile(0.5))
        self.driver.observers.append(self.metrics)
        #: feeds the core's autoscaler every metrics_interval_s (paused while the controller is down)
        self.autoscaler = SimAutoscaler(self)
        self.driver.observers.append(self.autoscaler)
        self.controller_up = True
        self.desired = Desired(scenario.deployments)  # what each timeline action means
        self._persisted: tuple[rc.DeploymentApplied, ...] = ()  # the core's specs at a controller crash
        #: and, beside them, the deployments meant to sleep and the weights versions pushed (docs/tiers.md)
        self._asleep: tuple[str, ...] = ()
        self._no_evict: tuple[str, ...] = ()
        self._deleted: tuple[str, ...] = ()
        self._weights: tuple[tuple[str, int], ...] = ()
        self.results: list[ExpectationResult] = []
        self.lost_events = 0
        self._next_action = 0
        self._blocked_on: tuple[WaitUntilHealthy | WaitUntilServing, int | None] | None = None  # a wait, its timer
        self._deferred: Action | None = None  # an action held until the controller is back
        self._timeline_done = not scenario.timeline
        self.progress = progress
        self.check = check
        self._crash_rate = scenario.crash_rate_per_replica_hour / 3600.0
        for joined in self.backend.joined():  # the core places replicas on these
            self.driver.feed(joined, 0.0)
        if self.proxies is not None:  # the core runs the proxies from now on
            self.driver.feed(self.proxies.configured(), 0.0)
        for node in sorted(self.backend.nodes):
            self.node_up(node)
        if scenario.cluster_node_loss_rate > 0:
            self._cluster_loss_at(0.0)

    # ------------------------------------------------------------- clock
    def schedule(self, delay: float, fn: Callable, *args: Any, last: bool = False) -> int:
        """Run ``fn(*args)`` ``delay`` virtual seconds from now (``last``: after
        everything else due at that instant); returns a ticket for ``cancel``."""
        self._seq += 1
        heapq.heappush(self._queue, (self.now + delay if delay > 0 else self.now, 1 if last else 0, self._seq, fn, args))
        return self._seq

    def cancel(self, ticket: int) -> None:
        """Forget a scheduled happening (it neither runs nor moves the clock)."""
        self._cancelled.add(ticket)

    def latency(self, deployment: str, what: str) -> float:
        lat = self._latency.get((deployment, what))
        if lat is None:
            lat = self._latency[deployment, what] = self.scenario.latency_for(deployment, what)
        return lat.sample(self.rng)

    def run_until(self, t_end: float, *, advance_clock: bool = True) -> None:
        """Process everything scheduled up to ``t_end`` (inclusive); then the
        clock reads ``t_end`` (or, with ``advance_clock=False``, the last happening)."""
        q, cancelled, pop, progress = self._queue, self._cancelled, heapq.heappop, self.progress
        n = 0
        while q and q[0][0] <= t_end:
            t, _, seq, fn, args = pop(q)
            if cancelled and seq in cancelled:
                cancelled.discard(seq)
                continue
            self.now = t
            fn(*args)
            n += 1
            if progress is not None and n % 2000 == 0:
                progress(self.now, self.scenario.duration)
        if advance_clock:
            self.now = max(self.now, t_end)

    def quiet(self) -> bool:
        return len(self._queue) == len(self._cancelled)

    # ----------------------------------------------------------- answers
    def deliver(self, event: object) -> None:
        """An answer from the cluster to the controller (lost while it is down)."""
        if not self.controller_up:
            self.lost_events += 1
            return
        self.driver.feed(event, self.now)
        if self.check:
            check_state(self.driver.state)
        if self._blocked_on is not None:
            self._maybe_unblock()

    def stream(self, name: str) -> random.Random:
        """The seeded random stream of one source (``crash/llm/3``, ``node/node-2``, ``hang``, ...)."""
        rng = self._streams.get(name)
        if rng is None:
            rng = self._streams[name] = random.Random(f"{self.seed}/{name}")
        return rng

    def note(self, type_: str, **fields: Any) -> None:
        """What the cluster did on its own account (a warm placement that found no copy, ...),
        as a ``fault`` record of the trace."""
        if self.trace:
            self.trace.fault(self.now, type_, **fields)

    def replica_running(self, r: SimReplica) -> None:
        """Random crashes hit a rank slot, not a replica: each (deployment, rank)
        has its own Poisson clock from t=0, so the crash times are the same in
        every variant; a crash hits whoever serves that rank then (if anyone)."""
        slot = (r.deployment, r.global_rank)
        if self._crash_rate > 0 and slot not in self._slots:
            self._slots.add(slot)
            rng = self.stream(f"crash/{slot[0]}/{slot[1]}")
            t = 0.0
            while t <= self.now:
                t += rng.expovariate(self._crash_rate)
            self.schedule(t - self.now, self._slot_crash, slot, t, rng)

    def _slot_crash(self, slot: tuple[str, int], t: float, rng: random.Random) -> None:
        rid = self.backend.holder(*slot)
        r = self.backend.replicas.get(rid) if rid is not None else None
        if r is not None and r.phase in ("running", "reconfiguring"):
            if self.trace:
                self.trace.fault(self.now, "random_crash", replica=rid)
            self.backend.crash(r.replica_id, "random crash")
        nxt = t + rng.expovariate(self._crash_rate)
        if self.scenario.duration is None or nxt <= self.scenario.duration:
            self.schedule(nxt - self.now, self._slot_crash, slot, nxt, rng)

    def node_up(self, name: str) -> None:
        """A node is (back) in the cluster: its loss clock runs (``faults.node_loss_*``)."""
        rate = self.scenario.node_loss_rate
        if rate > 0:
            up = self.stream(f"node/{name}").expovariate(rate)
            if self.scenario.duration is None or self.now + up <= self.scenario.duration:
                self.schedule(up, self._node_fault, name)

    def _cluster_loss_at(self, t: float) -> None:
        """The cluster-wide loss clock (``faults.node_loss_per_cluster_day``): one
        Poisson clock for the whole cluster from t=0, so its times are the same
        whatever the node count (more nodes do not mean more losses)."""
        nxt = t + self.stream("node-loss/cluster").expovariate(self.scenario.cluster_node_loss_rate)
        if self.scenario.duration is None or nxt <= self.scenario.duration:
            self.schedule(nxt - self.now, self._cluster_loss, nxt)

    def _cluster_loss(self, t: float) -> None:
        """The cluster-wide clock rang: lose a node drawn among those up (none up: nothing)."""
        up = sorted(n for n, node in self.backend.nodes.items() if node.alive)
        if up:
            self._node_fault(up[self.stream("node-loss/cluster/which").randrange(len(up))])
        self._cluster_loss_at(t)

    def _node_fault(self, name: str) -> None:
        node = self.backend.nodes.get(name)
        if node is None or not node.alive:
            return
        gpus = node.gpus
        if self.trace:
            self.trace.fault(self.now, "node_lost", node=name, random=True)
        self.backend.lose_node(name)
        repair = self.scenario.node_repair
        down = repair.sample(self.stream(f"repair/{name}")) if repair is not None else 600.0
        self.schedule(down, self._node_repaired, name, gpus)

    def _node_repaired(self, name: str, gpus: float) -> None:
        if self.trace:
            self.trace.fault(self.now, "node_added", node=name, gpus=gpus, repaired=True)
        if self.backend.add_node(name, gpus):
            self.node_up(name)

    def tick(self) -> None:
        """A ScheduleTick came due: the core learns the time (not while it is down)."""
        if self.controller_up and rc.cluster.clock_work_due(self.driver.state.cluster, self.now):
            # Only when the core has work then (next_deadline is a lower bound: a deadline whose
            # replica became ready meanwhile does not wake it once the bound was refreshed), but any
            # such work: a replica coming of age for an eviction (evictable_at) too, which used to
            # wait for the next event carrying the time, sharing its step (an AutoscalingMetrics
            # scaling down in the same step then contradicted the world_size just sent)
            self.driver.tick(self.now)
            self._maybe_unblock()

    # ----------------------------------------------------------- actions
    def act(self, action: Action) -> None:
        """Carry out one timeline action (not a wait) now (the controller must be up for most)."""
        action.perform(self.desired, self)
        if self.check:
            check_state(self.driver.state)

    # the timeline's effects (executors.scenarios.Target), carried out in the simulated cluster
    def apply(self, event: rc.DeploymentApplied) -> None:
        self.driver.feed(event, self.now)

    def scale(self, deployment: str, replicas: int, victims: tuple[str, ...]) -> None:
        """``scale``: one the core refuses (an autoscaled deployment) is a failure naming why."""
        try:
            self.driver.feed(rc.ScaleRequested(deployment=deployment, num_replicas=replicas, victims=victims),
                             self.now)
        except rc.RankcoreError as exc:
            self.results.append(ExpectationResult(None, f"scale {deployment}", False,
                                                  f"refused by the core: {exc}", self.now))

    def deployed(self, deployment: str) -> bool:
        dep = self.driver.state.deployments.get(deployment)
        return dep is not None and not dep.deleting

    def delete(self, deployment: str) -> None:
        """``delete``: the core stops its replicas and forgets it once they have gone."""
        dep = self.driver.state.deployments.get(deployment)
        if dep is None or dep.deleting:
            self.results.append(ExpectationResult(None, f"delete {deployment}", False,
                                                  "not deployed: nothing to delete" if dep is None else
                                                  "already being deleted", self.now))
            return
        self.driver.feed(rc.DeploymentDeleted(deployment=deployment), self.now)

    def request(self, event: rc.SleepRequested | rc.WakeRequested | rc.WeightsPushed) -> None:
        """``sleep`` / ``wake`` / ``push_weights``: the core decides who moves; one it refuses (a
        deployment never deployed) is a failure naming why, and the run goes on."""
        try:
            self.driver.feed(event, self.now)
        except rc.RankcoreError as exc:
            self.results.append(ExpectationResult(None, f"{type(event).__name__} {event.deployment}", False,
                                                  f"refused by the core: {exc}", self.now))

    def _hit(self, action: Crash | Hang, do: Callable[[str], bool], what: str) -> None:
        """A ``crash``/``hang``: the replica named (by id, or the holder of a rank), noted in
        the trace as a fault; nothing matching is a passing line, as on Ray."""
        rid = action.replica if action.by_rank is None else self.backend.holder(*action.by_rank)
        args = action.as_dict()
        if self.trace:
            self.trace.fault(self.now, action.key, replica=rid, **{k: v for k, v in args.items() if k != "replica"})
        if rid is None or not do(rid):
            self.results.append(ExpectationResult(None, f"{action.key} {args}", True,
                                                  f"nothing to {action.key}: no {what} replica matched", self.now))

    def crash(self, action: Crash) -> None:
        self._hit(action, lambda rid: self.backend.crash(rid, "scheduled crash", cause="killed"), "live")

    def hang(self, action: Hang) -> None:
        self._hit(action, self.backend.hang, "serving")

    def lose_node(self, node: str) -> None:
        if self.trace:
            self.trace.fault(self.now, "node_lost", node=node)
        self.backend.lose_node(node)

    def add_node(self, node: str, gpus: float) -> None:
        if self.trace:
            self.trace.fault(self.now, "node_added", node=node, gpus=gpus)
        if self.backend.add_node(node, gpus):
            self.node_up(node)

    def orphan(self, deployment: str, replica: str) -> None:
        if self.trace:
            self.trace.fault(self.now, "orphan", replica=replica, deployment=deployment)
        if not self.backend.orphan(deployment, replica):
            self.results.append(ExpectationResult(None, f"orphan {replica}", True,
                                                  "nothing to leave: that replica is alive already, or no node is up",
                                                  self.now))

    def place_bundles(self, deployment: str, bundle_nodes: tuple[str | None, ...]) -> None:
        if self.trace:
            self.trace.fault(self.now, "bundles_placed", deployment=deployment, bundles=list(bundle_nodes))
        self.backend.place_bundles(deployment, bundle_nodes)
        if self.controller_up:
            self.driver.feed(rc.BundlesPlaced(deployment=deployment, bundle_nodes=bundle_nodes), self.now)

    def crash_controller(self, recover_after: float) -> None:
        if not self.controller_up:
            return
        self.controller_up = False
        # what a controller persists: the core's own specs (scales folded in), as the Ray controller does
        self._persisted = rc.query.desired_specs(self.driver.state)
        self._asleep, self._weights = rc.query.desired_asleep(self.driver.state), rc.query.desired_weights(self.driver.state)
        self._no_evict = rc.query.desired_no_evict(self.driver.state)
        self._deleted = rc.query.desired_deleted(self.driver.state)
        self.driver.restart()
        if self.trace:
            self.trace.fault(self.now, "controller_crash", recover_after=recover_after)
        self.schedule(recover_after, self._recover_controller)

    def _recover_controller(self) -> None:
        self.controller_up = True
        reports, silent = self.backend.recovery_report()
        specs = self._recovery_specs()
        # every live replica is reported, those of deployments no spec names too: the core
        # stops them (stop_unknown), as it stops those that did not answer (unresponsive)
        event = rc.ControllerRecovered(deployments=specs, reports=tuple(reports), unresponsive=tuple(silent),
                                       next_replica_number=self.backend.started, next_lineage=self.backend.lineages,
                                       nodes=self.backend.joined(), stop_unknown=True,
                                       asleep=self._asleep, weights_versions=self._weights,
                                       warm_copies=tuple(self.backend.warm_copies()), no_evict=self._no_evict,
                                       deleted=self._deleted, **self._proxy_reports())
        if self.trace:
            self.trace.fault(self.now, "controller_recovered", reports=len(reports), lost_events=self.lost_events,
                             unresponsive=sorted(u.replica_id for u in silent), unknown=event.unknown_ids())
        self.driver.feed(event, self.now)
        if self._deferred is not None:
            held, self._deferred = self._deferred, None
            self._run_action(held)
        self._maybe_unblock()

    def _recovery_specs(self) -> tuple[rc.DeploymentApplied, ...]:
        """The specs persisted at the crash, each static deployment's bundles read from
        its group as it is now (a bundle on a node lost meanwhile: none), as the Ray
        controller reads them from Ray."""
        out = []
        for spec in self._persisted:
            sp = spec.static_placement
            if sp is not None and spec.name in self.backend.groups:
                nodes = tuple(b if b is not None and b in self.backend.nodes and self.backend.nodes[b].alive
                              else None for b in self.backend.groups[spec.name])
                spec = spec.replace(static_placement=sp.with_nodes(nodes))
            out.append(spec)
        return tuple(out)

    # ---------------------------------------------------------- timeline
    def _schedule_next_action(self) -> None:
        tl = self.scenario.timeline
        if self._next_action >= len(tl):
            self._timeline_done = True
            return
        a = tl[self._next_action]
        if a.at is not None:
            delay = a.at - self.now
        elif a.after is not None:
            delay = a.after
        else:
            delay = 0.0
        self.schedule(delay, self._run_action, a)

    def _run_action(self, a: Action) -> None:
        if not self.controller_up and a.needs_controller:
            self._deferred = a  # runs as soon as the controller is back
            return
        self._next_action += 1
        if isinstance(a, Wait):
            self.schedule(a.seconds, self._schedule_next_action)
            return
        if isinstance(a, (WaitUntilHealthy, WaitUntilServing)):
            timer = self.schedule(a.timeout, self._wait_timed_out, a) if a.timeout is not None else None
            self._blocked_on = (a, timer)
            self._maybe_unblock()
            return
        self.act(a)
        self._schedule_next_action()

    def _healthy(self, name: str) -> bool:
        dep = self.driver.state.deployments.get(name)
        return self.controller_up and dep is not None and dep.healthy

    def _serving(self, name: str) -> bool:
        """Healthy, awake, every replica running HOT with the last weights pushed (``wait_until_serving``)."""
        dep = self.driver.state.deployments.get(name)
        return self.controller_up and dep is not None and rc.query.fully_serving(dep)

    def _maybe_unblock(self) -> None:
        b = self._blocked_on
        if b is not None and (self._serving if isinstance(b[0], WaitUntilServing) else self._healthy)(b[0].deployment):
            self._blocked_on = None
            if b[1] is not None:
                self.cancel(b[1])
            self._schedule_next_action()

    def _wait_timed_out(self, a: WaitUntilHealthy | WaitUntilServing) -> None:
        b = self._blocked_on
        if b is None or b[0] is not a:
            return
        self._blocked_on = None
        self.results.append(ExpectationResult(
            None, f"timeline[{a.index}] {a.key} {a.deployment}", False,
            f"not {'serving' if isinstance(a, WaitUntilServing) else 'healthy'} after {a.timeout:g}s "
            f"(at t={self.now:g})", self.now))
        self._schedule_next_action()

    # ------------------------------------------------------ expectations
    def _check(self, e: Expectation) -> ExpectationResult:
        self.metrics.advance(self.now)  # the figures so far, up to now
        return check_expectation(e, self.driver.state, self.metrics, self.now)

    def _timed_check(self, e: Expectation) -> None:
        self.results.append(self._check(e))

    # --------------------------------------------------------------- run
    def _proxy_reports(self) -> dict:
        """A recovery's proxy fields: the config, the proxies alive (each answers), the next number."""
        if self.proxies is None:
            return {}
        return {"proxies": self.proxies.configured(), "proxy_ids": tuple(sorted(self.proxies.up)),
                "next_proxy_number": self.proxies.numbered}

    def run(self) -> RunResult:
        sc = self.scenario
        for e in sc.expect:
            if e.at is not None and (sc.duration is None or e.at <= sc.duration):
                self.schedule(e.at, self._timed_check, e, last=True)
        self._schedule_next_action()
        if sc.duration is not None:
            self.run_until(sc.duration)
        else:
            self.run_until(HORIZON, advance_clock=False)
        settled = sc.duration is not None or self.quiet()
        self.backend.end()
        self.metrics.advance(self.now)
        for e in sc.expect:
            if e.at is None or (sc.duration is not None and e.at > sc.duration) or (sc.duration is None and e.at > self.now):
                self.results.append(self._check(e))
        if not self._timeline_done:
            idx = self._next_action
            self.results.append(ExpectationResult(None, "timeline", False,
                                                  f"stopped at t={self.now:g} before timeline[{idx}] ran", self.now))
        if not settled:
            self.results.append(ExpectationResult(None, "settled", False,
                                                  f"still busy after the {HORIZON:g}s horizon", self.now))
        metrics = self.metrics.as_dict()
        metrics["lost_events"] = self.lost_events
        if self.traffic is not None:  # each deployment's requests beside its other figures
            for name, figures in self.traffic.as_dict().items():
                metrics["deployments"].setdefault(name, {})["requests"] = figures
        if self.backend.provisioner is not None:
            metrics["provisioning"] = self.backend.provisioner.as_dict()
        if self.proxies is not None:
            metrics["proxies"] = self.proxies.as_dict()
        for name, figures in self.autoscaler.as_dict().items():  # what the autoscaler did, beside its cost
            metrics["deployments"].setdefault(name, {})["autoscaling"] = figures
        if self.trace is not None:
            self.trace.end(self.now, self.driver.state, metrics, [r.as_record() for r in self.results])
        return RunResult(
            scenario=sc, seed=self.seed, end_time=self.now, state=self.driver.state, metrics=metrics,
            expectations=tuple(self.results), events=self.metrics.events, settled=settled,
        )


def run_scenario(scenario: Scenario, **kwargs: Any) -> RunResult:
    return Simulation(scenario, **kwargs).run()
