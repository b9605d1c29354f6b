"""The autoscaler's promises (issue 23), over random options, loads, clocks and replicas
answering or crashing: every step passes the core's invariants, the target stays within its
bounds, a constant load does not flap, zero traffic at zero stays at zero (ray#61731),
min_replicas=0 is honoured (ray#59076), and a request at zero brings a replica back."""

from __future__ import annotations

from typing import Any

import attrs
from hypothesis import assume, given, note
from hypothesis import strategies as st

import rankcore as rc
from rankcore import invariants as inv
from rankcore.control.autoscaling import bounds

NAME = "m"


@st.composite
def options(draw: st.DrawFn, *, factors: bool = True, burst: bool | None = None, min_replicas: int | None = None,
            initial: int | None = None) -> dict[str, Any]:
    gang = draw(st.sampled_from([1, 1, 2]))
    low = draw(st.integers(0, 3)) if min_replicas is None else min_replicas
    top = draw(st.integers(max(low, gang, 1), 8))
    assume(-(-low // gang) * gang <= top // gang * gang)
    opts: dict[str, Any] = {
        "autoscaling": True, "gang_size": gang, "min_replicas": low, "max_replicas": top,
        "initial_replicas": draw(st.one_of(st.none(), st.integers(low, top))) if initial is None else initial,
        "target_ongoing_requests": draw(st.sampled_from([0.5, 0.7, 1.0, 2.0, 3.0])),
        "upscale_delay_s": draw(st.sampled_from([0.0, 10.0, 30.0])),
        "downscale_delay_s": draw(st.sampled_from([0.0, 20.0, 60.0])),
        "downscale_to_zero_delay_s": draw(st.sampled_from([None, 0.0, 40.0])),
        "look_back_period_s": draw(st.sampled_from([5.0, 30.0])),
        "aggregation_function": draw(st.sampled_from(["mean", "max", "min"])),
        "burst": draw(st.booleans()) if burst is None else burst,
    }
    if factors:
        opts["upscaling_factor"] = draw(st.sampled_from([None, 0.5, 2.0]))
        opts["downscaling_factor"] = draw(st.sampled_from([None, 0.3, 1.5]))
    return opts


class World:
    """One autoscaled deployment and an executor: each step's invariants checked."""

    def __init__(self, opts: dict[str, Any]) -> None:
        self.state = rc.State()
        self.now = 0.0
        self.changes: list[tuple[float, int, int]] = []  # (time, old target, new target) made by metrics
        self.pools = rc.PoolView()  # the pools as the steps' pool commands told them
        self.apply(rc.DeploymentApplied(name=NAME, num_replicas=0, **opts))

    @property
    def dep(self) -> rc.Deployment:
        return self.state.deployment(NAME)

    def apply(self, event: object) -> rc.Step:
        note(f"step({event!r})")
        result = rc.step(self.state, event)
        inv.check_step(self.state, event, result, full=True)
        for cmd in result.pool:
            self.pools.apply(cmd)
        assert self.pools.mismatch(result.state) is None, self.pools.mismatch(result.state)
        self.state = result.state
        return result

    def answer(self, data: st.DataObject, crashes: bool = True, waits: bool = True) -> None:
        """The executor answers some of what is outstanding (or crashes a running replica)."""
        for rid in sorted(self.dep.replicas):
            rep = self.dep.replicas.get(rid)
            if rep is None:
                continue
            what = data.draw(st.sampled_from(["answer", "answer"] + (["wait"] if waits else [])
                                             + (["crash"] if crashes else [])),
                             label=f"{rid} ({rep.phase.value})")
            if what == "crash" and rep.phase is rc.Phase.RUNNING:
                self.apply(rc.ReplicaCrashed(replica_id=rid, cause="error"))
            elif what == "answer" and rep.phase is rc.Phase.PENDING:
                self.apply(rc.ReplicaPlaced(replica_id=rid, node_id="n0"))
            elif what == "answer" and rep.phase is rc.Phase.STARTING:
                self.apply(rc.ReplicaReady(replica_id=rid))
            elif what == "answer" and rep.phase is rc.Phase.STOPPING:
                self.apply(rc.ReplicaStopped(replica_id=rid))

    def metrics(self, after: float, total: int, data: st.DataObject | None = None) -> rc.Step:
        """AutoscalingMetrics ``after`` seconds on, ``total`` requests split between the queue
        and the running replicas."""
        self.now += after
        running = sorted(r for r, rep in self.dep.replicas.items() if rep.phase is rc.Phase.RUNNING)
        ongoing = dict.fromkeys(running, 0)
        queued = total
        if running and data is not None:
            for i in range(total):
                if data.draw(st.booleans(), label=f"request {i} on a replica"):
                    ongoing[running[i % len(running)]] += 1
                    queued -= 1
        old = self.dep.target
        result = self.apply(rc.AutoscalingMetrics(deployment=NAME, now=self.now, queued=queued, ongoing=ongoing))
        if self.dep.target != old:
            self.changes.append((self.now, old, self.dep.target))
        return result

    def restart(self) -> None:
        """The controller restarts and recovers from the replicas' reports and the persisted
        specs: the autoscaled target is kept, the window starts empty."""
        target, cl = self.dep.target, self.state.cluster
        fresh = rc.State(cluster=attrs.evolve(rc.State().cluster, now=cl.now, clock=cl.clock))
        event = inv.reports_from(self.state)
        note(f"restart: step({event!r})")
        result = rc.step(fresh, event)
        inv.check_step(fresh, event, result, full=True)
        self.state = result.state
        assert self.dep.target == target and self.dep.autoscaler is None

    def check_bounds(self) -> None:
        lo, hi = bounds(self.dep.config, self.dep.max_replicas)
        assert lo <= self.dep.target <= hi, f"target {self.dep.target} outside [{lo}, {hi}]"
        assert self.dep.target % self.dep.gang_size == 0, f"target {self.dep.target} is not whole gangs"


@given(opts=options(), data=st.data())
def test_every_step_keeps_the_invariants_and_the_target_within_its_bounds(opts: dict, data: st.DataObject) -> None:
    world = World(opts)
    world.check_bounds()
    for _ in range(data.draw(st.integers(1, 30), label="samples")):
        world.answer(data)
        world.metrics(data.draw(st.sampled_from([0.0, 1.0, 10.0, 35.0]), label="after"),
                      data.draw(st.integers(0, 30), label="requests"), data)
        world.check_bounds()
        if data.draw(st.integers(0, 9), label="controller restart") == 0:
            world.restart()


def _no_reversal_within_delays(world: World) -> None:
    auto = world.dep.config.autoscaler
    for (t1, a1, b1), (t2, a2, b2) in zip(world.changes, world.changes[1:]):
        up1, up2 = b1 > a1, b2 > a2
        if up1 == up2:
            continue
        delay = auto.upscale_delay_s if up2 else (
            auto.downscale_to_zero_delay_s if b2 == 0 and auto.downscale_to_zero_delay_s is not None
            else auto.downscale_delay_s)
        assert t2 - t1 >= delay, f"{world.changes}: {'up' if up1 else 'down'} at {t1}, then back at {t2}"


@given(opts=options(burst=False), load=st.integers(1, 25), data=st.data())
def test_a_constant_load_does_not_flap(opts: dict, load: int, data: st.DataObject) -> None:
    """No factors (Ray Serve's default): the target only ever moves one way. With factors: never
    back within the delay of the way back (ray#63279: 500 <-> 2,000 replicas under one load)."""
    world = World(opts)
    for _ in range(data.draw(st.integers(5, 40), label="samples")):
        world.answer(data, crashes=False)
        world.metrics(data.draw(st.sampled_from([1.0, 5.0, 10.0]), label="after"), load, data)
        world.check_bounds()
    note(f"changes: {world.changes}")
    _no_reversal_within_delays(world)
    if opts.get("upscaling_factor") is None and opts.get("downscaling_factor") is None:
        ways = {b > a for _, a, b in world.changes}
        assert len(ways) <= 1, f"a constant load of {load} moved the target both ways: {world.changes}"


@given(opts=options(min_replicas=0, initial=0), data=st.data())
def test_zero_traffic_at_zero_replicas_stays_at_zero(opts: dict, data: st.DataObject) -> None:
    world = World(opts)
    for _ in range(data.draw(st.integers(1, 40), label="samples")):
        result = world.metrics(data.draw(st.sampled_from([0.0, 0.1, 10.0, 600.0]), label="after"), 0)
        assert world.dep.target == 0 and not result.commands, f"zero traffic scaled {world.changes}"


@given(opts=options(), data=st.data())
def test_idle_it_goes_down_to_min_replicas_zero_included_and_a_request_brings_one_back(
        opts: dict, data: st.DataObject) -> None:
    world = World(opts)
    interval = data.draw(st.sampled_from([5.0, 10.0]), label="metrics interval")
    auto = world.dep.config.autoscaler
    # (each downscale waits its delay anew; a downscaling_factor < 1 takes one step per sample)
    enough = auto.look_back_period_s + (world.dep.max_replicas + 2) * (auto.downscale_delay_s + interval) \
        + (auto.downscale_to_zero_delay_s or 0.0)
    while world.now < enough:  # (answering everything: with no replica running nothing scales down, as in Ray Serve)
        world.answer(data, crashes=False, waits=False)
        world.metrics(interval, 0)
        world.check_bounds()
    lo, _ = bounds(world.dep.config, world.dep.max_replicas)
    assert world.dep.target == lo, f"idle for {world.now:g} s at {world.dep.target}, min is {lo}: {world.changes}"
    if lo == 0:  # scale to zero and back: the first request waits for a replica that comes at once
        result = world.metrics(interval, data.draw(st.integers(1, 5), label="requests"))
        assert world.dep.target >= 1
        assert world.pools.wanted.get(NAME) is True, "at zero, requests were not told a replica may come"
        assert any(isinstance(c, rc.StartReplica) for c in result.commands)
