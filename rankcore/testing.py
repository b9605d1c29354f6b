"""Hypothesis strategies and a stateful machine for anything that steps like the core.

The machine is parameterised by the thing under test (zarr's pattern): the
bare core, the simulator, or an embedder's own wrapper. A subject only has to
``step(state, event) -> Step`` from ``initial()``; the machine drives it with
random but *plausible* event sequences (answers to the commands it was given,
crashes, node loss, scaling, config updates, controller recovery, stale and
illegal events) and after every step checks every invariant in
:mod:`rankcore.invariants`, purity (the input state is unchanged) and, at the
end, determinism (replaying the same events gives the same commands).

Use from a test module::

    from rankcore.testing import CoreSubject, make_machine
    TestCore = make_machine(CoreSubject).TestCase

Hypothesis profiles ``rankcore-ci`` (150 examples of up to 40 steps),
``rankcore-thorough`` (2,000 of up to 100) and ``rankcore-dev`` (30) are
registered on import; pick one with ``--hypothesis-profile=rankcore-thorough``
or ``settings.load_profile``, or pass ``settings=`` to ``make_machine``.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any, Protocol

import attrs
from hypothesis import HealthCheck, note
from hypothesis import event as hyp_event
from hypothesis import settings as hypothesis_settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, precondition, rule

from . import invariants as inv
from .base.bundles import StaticPlacement
from .base.commands import PoolComing, RequestResources, StartProxy, StopProxy
from .base.errors import InvalidConfig, InvalidEvent, InvariantViolation
from .base.events import (
    CRASH_CAUSES,
    AutoscalingMetrics,
    BundlesPlaced,
    ControllerRecovered,
    DeploymentApplied,
    DeploymentDeleted,
    HealthChecked,
    ModelsReported,
    NodeCapacityChanged,
    NodeDraining,
    NodeJoined,
    NodeLost,
    PlacementFailed,
    ProxiesConfigured,
    ProxyCrashed,
    ProxyHealthChecked,
    ProxyStarted,
    ReplicaCrashed,
    ReplicaPlaced,
    ReplicaReady,
    ReplicaReconfigured,
    ReplicaReport,
    ReplicaStopped,
    ScaleRequested,
    SleepRequested,
    Tick,
    TierMoved,
    TierMoveFailed,
    UnresponsiveReplica,
    WakeRequested,
    WeightsPushed,
    WeightsUpdated,
)
from .base.gangmap import GANG_FAILURES, GANG_PLACEMENTS
from .base.lifecycle import Phase, Residency
from .base.proxybook import PROXY_LOCATIONS, ProxyOptions, ProxyPhase
from .base.ranks import ReplicaRank
from .base.state import State, Step
from .control.pool import PoolView
from .core import step as core_step
from .placement.policies import POLICIES
from .protocol import answers

__all__ = [
    "Subject",
    "CoreSubject",
    "make_machine",
    "ExecutorSubject",
    "make_timeline_machine",
    "deployment_names",
    "node_ids",
    "user_configs",
    "reported_ranks",
    "snapshot",
    "answers",
    "PROFILES",
]

#: Hypothesis profiles for the machines (registered on import, never loaded
#: for you): "rankcore-ci" is what this project's CI runs.
PROFILES = {
    "rankcore-ci": dict(max_examples=150, stateful_step_count=40),
    "rankcore-thorough": dict(max_examples=2000, stateful_step_count=100),
    "rankcore-dev": dict(max_examples=30, stateful_step_count=30),
}
for _name, _kw in PROFILES.items():
    hypothesis_settings.register_profile(_name, deadline=None, suppress_health_check=[HealthCheck.too_slow],
                              print_blob=True, **_kw)  # type: ignore[arg-type]

DEPLOYMENTS = ("llm", "embed", "rerank")
NODES = ("node-a", "node-b", "node-c", "node-d")
_GB = 10**9  # (the tiers machine's model and GPU sizes)
#: with ``groups=True``: the deployment made of gangs, the one on a static placement
GANGS, STATIC = "llm", "embed"
STATIC_MAPPING = ((0,), (1, 2), (3,))


def _rounded(need: tuple) -> tuple:
    return tuple((k, round(v, 9)) for k, v in need)


def _demand(state: State) -> tuple:
    """The autoscaler's demand of ``state``, worked out apart from ``rankcore.placement.demand``:
    each waiting replica (not one the core evicts for) by its deployment's resources, and
    the sum of the bookings on each live node (not the nodes' free room)."""
    cl = state.cluster
    counts: dict = {}
    for rid in cl.queued:
        if rid in cl.evicting:
            continue
        need = state.deployments[state.index[rid]].resources
        if need:
            counts[need] = counts.get(need, 0) + 1
    if not counts:
        return ((), ())
    by_node: dict = {}
    for node_id, need in cl.held.values():
        if node_id in cl.nodes:
            mine = by_node.setdefault(node_id, {})
            for k, v in need:
                mine[k] = mine.get(k, 0.0) + v
    held = tuple(sorted(_rounded(tuple(sorted((k, v) for k, v in m.items() if v > 1e-9)))
                        for m in by_node.values() if any(v > 1e-9 for v in m.values())))
    return tuple(sorted(counts.items())), held


class Subject(Protocol):
    """What the machine drives: anything that steps like ``rankcore.step``.

    ``step`` returns a ``rankcore.Step`` whose ``state`` may be the subject's
    own type; then the subject also has ``core_state(state) -> rankcore.State``
    (the view every check reads). Without it the state must be a ``State``.
    """

    def initial(self) -> Any: ...

    def step(self, state: Any, event: object) -> Step: ...


class CoreSubject:
    """The bare core."""

    def initial(self) -> State:
        return State()

    def step(self, state: State, event: object) -> Step:
        return core_step(state, event)


# -------------------------------------------------------------- strategies
deployment_names = st.sampled_from(DEPLOYMENTS).map(str)
node_ids = st.sampled_from(NODES).map(str)
user_configs = st.one_of(st.none(), st.fixed_dictionaries({"model": st.sampled_from(["v1", "v2", "v3"])}))


def reported_ranks(rank: ReplicaRank) -> st.SearchStrategy[Any]:
    """The three forms a live replica may report its rank in (ray#64636)."""
    return st.sampled_from(
        [rank, rank.rank, {"rank": rank.rank, "node_rank": rank.node_rank, "local_rank": rank.local_rank}]
    )


def snapshot(state: State) -> Any:
    """A deep, plain copy of everything observable in a state (for purity checks)."""
    return {
        name: (
            dep.target,
            dep.user_config,
            dep.counts,
            dep.config_version,
            {rid: (r.phase, r.node_id, r.version, r.lineage, r.config_version) for rid, r in dep.replicas.items()},
            dep.ranks.to_dict(),
        )
        for name, dep in state.deployments.items()
    }, dict(state.index), state.next_replica, state.next_lineage, state.cluster


#: in a machine's event log: the controller restarted (its state is the initial one again)
_RESTART = object()


@attrs.frozen
class MachineOptions:
    """``make_machine``'s arguments, as the machine's rules read them (``self.opts``)."""

    subject_factory: Callable[[], Subject]
    max_replicas: int
    managed: bool
    groups: bool
    tiers: bool


class _Harness(RuleBasedStateMachine):
    """The machine's harness: the subject driven, every step checked (``invariants.check_step``, the pools and
    the demand told, the proxies carried out as an executor would), replay for determinism at teardown."""

    #: the machine's parameters (``make_machine``'s arguments), set on the class it builds
    opts: MachineOptions

    def __init__(self) -> None:
        super().__init__()
        self.subject = self.opts.subject_factory()
        view = getattr(self.subject, "core_state", None)
        self.view: Callable[[Any], State] = view if view is not None else (lambda s: s)
        self.own = self.subject.initial()  # the subject's own state
        self.state = self.view(self.own)  # what the checks read
        self.initial = self.own
        self.events: list[object] = []
        self.commands: list[object] = []
        self.retired: list[str] = []
        self.pools = PoolView()  # the pools as the steps' pool commands told them
        self.restarting = False  # between a controller's restart and its ControllerRecovered
        self.asked: RequestResources = RequestResources()  # the autoscaler's demand as last told
        self.proxies_up: dict[str, str] = {}  # the executor's proxies: id -> node (started, not gone)

    # --------------------------------------------------------- driving
    def step_subject(self, event: object) -> tuple[Step, State]:
        result = self.subject.step(self.own, event)
        return result, self.view(result.state)

    def apply(self, event: object) -> Step:
        before = self.state
        snap = snapshot(before)
        note(f"step({event!r})")
        result, after = self.step_subject(event)
        assert snapshot(before) == snap, "step mutated its input state"
        checked = result if after is result.state else Step(
            state=after, commands=result.commands, stale=result.stale,
            compactions=result.compactions, recovery=result.recovery)
        inv.check_step(before, event, checked, full=True)
        for cmd in getattr(result, "pool", ()):
            self.pools.apply(cmd)
        problem = None if self.restarting else self.pools.mismatch(after)  # (stale until the PoolReset)
        assert problem is None, f"after {event!r} the pool commands so far do not describe the core's pools: {problem}"
        if type(event) is ControllerRecovered and not after.cluster.joined:
            self.asked = RequestResources()  # (no node reported: no autoscaler to tell, demand.tell)
        for cmd in result.commands:
            if type(cmd) is RequestResources:
                self.asked = cmd
        self.carry_proxies(event, result, after)
        if not self.restarting:
            told = (self.asked.waiting, tuple(_rounded(b) for b in self.asked.held))
            assert told == _demand(after), (f"after {event!r} the demand told ({self.asked!r}) is not "
                                            f"the queue's: {_demand(after)!r}")
        gone = set(before.index.keys()) - set(after.index.keys())
        self.retired.extend(sorted(gone))
        self.own = result.state
        self.state = after
        self.events.append(event)
        self.commands.extend(result.commands)
        hyp_event(type(event).__name__)
        if result.compactions:
            hyp_event("compaction")
        if result.stale:
            hyp_event("stale")
        if after.cluster.delayed and math.inf in after.cluster.deadlines.values():
            hyp_event("a gang's successors held for its rollout")
        return result

    def carry_proxies(self, event: object, result: Step, after: State) -> None:
        """The executor's side of the proxies: one a node (a StartProxy never goes where one
        runs), never on a lost node, and a drain stops a proxy only on its report of nothing
        in flight (the step of a ProxyHealthChecked of it with ``ongoing=0``)."""
        up = self.proxies_up
        if type(event) is ProxyCrashed and not result.stale:
            up.pop(event.proxy_id, None)
        if type(event) is NodeLost:
            for pid in [p for p, n in up.items() if n == event.node_id]:
                del up[pid]  # (died with its node)
        if type(event) is ControllerRecovered:  # (what did not report is gone)
            up = self.proxies_up = {p: n for p, n in up.items() if p in event.proxy_ids}
        for cmd in result.commands:  # (carried out in order: a StopProxy after its node's next StartProxy
            # is a wrapper that reorders commands)
            if type(cmd) is StartProxy:
                if cmd.node_id in up.values():
                    raise InvariantViolation(f"{cmd!r}: a proxy already runs on {cmd.node_id}")
                if cmd.node_id not in after.cluster.nodes:
                    raise InvariantViolation(f"{cmd!r}: {cmd.node_id} is not in the cluster")
                up[cmd.proxy_id] = cmd.node_id
            elif type(cmd) is StopProxy:
                if cmd.reason == "drained" and not (type(event) is ProxyHealthChecked
                                                    and event.proxy_id == cmd.proxy_id and event.ongoing == 0):
                    raise InvariantViolation(f"{cmd!r} after {event!r}: a drain cut requests in flight")
                up.pop(cmd.proxy_id, None)
                hyp_event(f"proxy stopped: {cmd.reason}")

    def live(self, *phases: Phase) -> list[tuple[str, str]]:
        out: list[tuple[str, str]] = []
        for name in sorted(self.state.deployments.keys()):
            dep = self.state.deployments[name]
            out.extend((name, rid) for rid in sorted(dep.replicas.keys()) if dep.replicas[rid].phase in phases)
        return out

    def later(self, data: st.DataObject, label: str) -> float | None:
        """The clock an answer carries (``now``): none, the clock's own
        reading, or later (the core moves its clock first, in the same step)."""
        if not self.opts.managed:
            return None
        ahead = data.draw(st.sampled_from([None, None, 0.0, 0.5, 6.0, 20.0]), label=f"{label}: now")
        return None if ahead is None else self.state.cluster.now + ahead

    def where(self, data: st.DataObject, label: str) -> str | None:
        """A node an executor may place on: any (unmanaged); one the core knows, or one it
        was told is lost (a placement racing the loss), when it places (None: none)."""
        cl = self.state.cluster
        if not cl.managed:
            return data.draw(node_ids, label=label)
        known = sorted(cl.nodes.keys()) + sorted(cl.lost)
        return data.draw(st.sampled_from(known), label=label) if known else None

    def refused(self, event: object, says: str, *also: type[Exception]) -> None:
        """``event`` raises ``InvalidEvent`` (or one of ``also``) saying ``says``, and changes nothing."""
        snap = snapshot(self.state)
        kinds: tuple[type[Exception], ...] = (InvalidEvent, *also)
        try:
            self.step_subject(event)
        except kinds as exc:
            assert says in str(exc), f"{event!r} was refused with {exc!r}, which does not say {says!r}"
            assert snapshot(self.state) == snap, f"{event!r} was refused but changed the state"
            return
        raise AssertionError(f"{event!r} was accepted")

    # ------------------------------------------------------ invariants
    @invariant()
    def world_size_is_target(self) -> None:
        for dep in self.state.deployments.values():
            assert dep.world_size == dep.target

    def teardown(self) -> None:
        """Determinism: replaying the same events gives the same commands."""
        if not self.events:
            return
        state = self.initial
        commands: list[object] = []
        for event in self.events:
            if event is _RESTART:
                state = self.subject.initial()
                continue
            result = self.subject.step(state, event)
            state = result.state
            commands.extend(result.commands)
        assert commands == self.commands, "replaying the same events gave different commands"
        assert snapshot(self.view(state)) == snapshot(self.state), "replaying the same events gave a different state"


    def fenced(self) -> list[tuple[str, str]]:
        """(deployment, id) of the unresponsive replicas a recovery stopped, not gone yet."""
        return [(name, rid) for name in sorted(self.state.deployments.keys())
                for rid in sorted(self.state.deployments[name].unresponsive.keys())]

    def in_flight(self) -> list[tuple[str, str]]:
        """Replicas with a tier move or a weights update unanswered."""
        return [(name, rid) for name in sorted(self.state.deployments.keys())
                for rid, rep in sorted(self.state.deployments[name].replicas.items())
                if rep.phase not in (Phase.PENDING, Phase.FAILED)
                and (rep.residency in (Residency.OFFLOADING, Residency.LOADING) or rep.weights_pending)]

    def answer_in_flight(self, name: str, rid: str, fail: bool = False) -> None:
        rep = self.state.deployments[name].replicas[rid]
        if rep.residency in (Residency.OFFLOADING, Residency.LOADING):
            if fail:
                self.apply(TierMoveFailed(replica_id=rid, reason="test"))
            else:
                tier = "warm" if rep.residency is Residency.OFFLOADING else "hot"
                self.apply(TierMoved(replica_id=rid, tier=tier))
        elif rep.weights_pending and rep.phase is not Phase.STARTING:  # (a starting one answers once ready)
            self.apply(WeightsUpdated(replica_id=rid, version=rep.weights_version))

    def memory(self, node: str, gpus: int, data: st.DataObject) -> dict:
        """A node's GPU memory and CPU cache (``tiers`` machines only)."""
        if not self.opts.tiers or not gpus:
            return {}
        gb = data.draw(st.sampled_from([40, 80, 80]), label=f"GB per GPU of {node}")
        cache = data.draw(st.sampled_from([0, 60, 200]), label=f"cache GB of {node}")
        return {"devices": (gb * _GB,) * gpus, "cpu_cache_bytes": cache * _GB}

class _DeploymentRules(_Harness):
    """The control plane's rules: deployments applied (placement fields, gangs, static placement,
    autoscaling, rollouts), scaled by a person or the autoscaler's metrics, deleted."""

    def shaped(self, name: str, n: int, data: st.DataObject) -> tuple[int, dict]:
        """The replica count and placement fields of deployment ``name``."""
        fields = self.placing(data)
        dep = self.state.deployments.get(name)
        if self.opts.tiers and dep is not None and dep.replicas:  # (its model stays while it has replicas)
            fields.update(model_bytes=dep.config.tier.model_bytes, resources=dict(dep.resources),
                          multiplexed_bytes=dep.config.tier.multiplexed_bytes)
        fields["spare_processes"] = data.draw(st.sampled_from([0, 0, 1, 2]), label="spare processes")
        # (a gang deployment rolls whole gangs: a max_unavailable below its gang size still retires one)
        fields["version"] = data.draw(st.sampled_from([None, None, "v1", "v2"]), label="version")
        fields["max_unavailable"] = data.draw(st.sampled_from([0.2, 0.5, 1, 2, 3]), label="max unavailable")
        fields["max_surge"] = data.draw(st.sampled_from([0, 0, 1, 2, 0.5]), label="max surge")
        # (a collective group: every step then checks its epochs, rankcore.invariants.check_groups)
        fields["collective_group"] = data.draw(st.booleans(), label="collective group")
        fields["rank_moves"] = data.draw(st.sampled_from(["reconfigure", "reconfigure", "restart"]), label="rank moves")
        if self.opts.groups and name == GANGS:
            fields.update(gang_size=2, gang_placement=data.draw(st.sampled_from(GANG_PLACEMENTS), label="gang"),
                          gang_failure=data.draw(st.sampled_from(GANG_FAILURES), label="gang failure"))
            if self.autoscaled(fields, 2, data):
                return 0, fields
            return n - n % 2, fields
        if self.opts.groups and name == STATIC:
            dep = self.state.deployments.get(name)
            nodes = dep.static.bundle_nodes if dep is not None and dep.static is not None else tuple(
                data.draw(st.sampled_from(NODES), label=f"node of bundle {b}") for b in range(4))
            fields["static_placement"] = StaticPlacement(group="pg", bundle_nodes=nodes,
                                                         mapping=STATIC_MAPPING)
            if dep is not None and dep.count(Phase.STOPPING):
                return dep.target, fields  # (back up only once they have stopped: the core says so)
            return len(STATIC_MAPPING), fields
        if self.autoscaled(fields, 1, data):
            return 0, fields
        if not fields.get("model_bytes"):
            fields["update_mode"] = data.draw(st.sampled_from(["rolling", "rolling", "blue_green"]),
                                              label="update mode")
        return n, fields

    def autoscaled(self, fields: dict, gang: int, data: st.DataObject) -> bool:
        """Maybe autoscale the deployment (a third of the time): bounds holding a whole gang,
        short delays, and the autoscaler's other options at random (``fields`` takes them)."""
        if not data.draw(st.sampled_from([False, False, True]), label="autoscaled"):
            return False
        low = data.draw(st.integers(0, min(2, self.opts.max_replicas)), label="min_replicas")
        top = data.draw(st.integers(max(low, gang, 1), self.opts.max_replicas), label="max_replicas")
        top = max(top, -(-low // gang) * gang)  # (a whole gang between them)
        fields.update(
            autoscaling=True, min_replicas=low, max_replicas=top,
            initial_replicas=data.draw(st.one_of(st.none(), st.integers(low, top)), label="initial_replicas"),
            target_ongoing_requests=data.draw(st.sampled_from([1.0, 2.0]), label="target_ongoing_requests"),
            upscale_delay_s=data.draw(st.sampled_from([0.0, 10.0]), label="upscale_delay_s"),
            downscale_delay_s=data.draw(st.sampled_from([0.0, 20.0]), label="downscale_delay_s"),
            downscale_to_zero_delay_s=data.draw(st.sampled_from([None, 0.0, 30.0]), label="to zero delay"),
            look_back_period_s=data.draw(st.sampled_from([5.0, 30.0]), label="look_back_period_s"),
            upscaling_factor=data.draw(st.sampled_from([None, 2.0]), label="upscaling_factor"),
            burst=data.draw(st.booleans(), label="burst"))
        return True

    def autoscaled_names(self) -> list[str]:
        return [name for name, dep in sorted(self.state.deployments.items()) if dep.config.autoscaler.autoscaling]

    def placing(self, data: st.DataObject) -> dict:
        """A deployment's placement fields (managed machines only)."""
        if not self.opts.managed:
            return {}
        if self.opts.tiers:
            return {"resources": {"GPU": data.draw(st.sampled_from([1, 1, 2]), label="gpus")},
                    "model_bytes": data.draw(st.sampled_from([30, 50, 70, 130]), label="model GB") * _GB,
                    "multiplexed_bytes": data.draw(st.sampled_from([0, 0, 10]), label="multiplexed GB") * _GB,
                    "dedicated": data.draw(st.sampled_from([False, False, True]), label="dedicated"),
                    "min_deployment_time_s": data.draw(st.sampled_from([0.0, 10.0]), label="min time"),
                    "placement": data.draw(st.sampled_from(POLICIES), label="policy"),
                    "start_timeout_s": data.draw(st.sampled_from([None, 30.0]), label="start timeout")}
        return {"resources": {"GPU": data.draw(st.sampled_from([0, 1, 2]), label="gpus")},
                "placement": data.draw(st.sampled_from(POLICIES), label="policy"),
                "start_timeout_s": data.draw(st.sampled_from([None, 5.0, 30.0]), label="start timeout")}

    # ----------------------------------------------------------- rules
    def deploy_first(self, name: str, n: int, config: Any, data: st.DataObject) -> None:
        if self.opts.managed:
            for i, node in enumerate(NODES[:3]):
                gpus = data.draw(st.integers(1, 4), label=f"GPUs of {node}")
                self.apply(NodeJoined(node_id=node, resources={"GPU": gpus, "CPU": 8}, order=i,
                                      **self.memory(node, gpus, data)))
            self.apply(Tick(now=1.0))
        n, fields = self.shaped(name, n, data)
        self.apply(DeploymentApplied(name=name, num_replicas=n, user_config=config, has_reconfigure=True,
                                     reconfigure_takes_rank=True, **fields))

    def deploy(self, name: str, n: int, config: Any, has_reconfigure: bool, takes_rank: bool,
                         data: st.DataObject) -> None:
        n, fields = self.shaped(name, n, data)
        self.apply(DeploymentApplied(
            name=name, num_replicas=n, user_config=config,
            has_reconfigure=has_reconfigure, reconfigure_takes_rank=has_reconfigure and takes_rank,
            **fields,
        ))

    @precondition(lambda self: bool(self.opts.groups) and GANGS in self.state.deployments
                  and bool(self.state.deployments[GANGS].replicas))
    @rule(data=st.data())
    def roll_gangs(self, data: st.DataObject) -> None:
        """The gang deployment as it is, with another version (and pace): its gangs roll whole."""
        spec = self.state.deployments[GANGS].spec()
        self.apply(DeploymentApplied(
            name=GANGS, num_replicas=spec.num_replicas, user_config=spec.user_config,
            has_reconfigure=spec.has_reconfigure, reconfigure_takes_rank=spec.reconfigure_takes_rank,
            max_replicas=spec.max_replicas, config=spec.config,
            version=data.draw(st.sampled_from(["v1", "v2", "v3"]), label="gang version"),
            max_unavailable=data.draw(st.sampled_from([1, 2, 3, 0.5]), label="gang max_unavailable")))

    @precondition(lambda self: bool(self.opts.groups) and STATIC in self.state.deployments)
    @rule(data=st.data())
    def move_bundles(self, data: st.DataObject) -> None:
        """The caller's group has its bundles elsewhere now (or some not placed)."""
        nodes = tuple(data.draw(st.sampled_from((*NODES, None)), label=f"bundle {b}") for b in range(4))
        self.apply(BundlesPlaced(deployment=STATIC, bundle_nodes=nodes))
        dep = self.state.deployments[STATIC]
        for rid, rep in dep.replicas.items():
            g = dep.ranks.global_rank(rid)
            placed = g < len(dep.static.mapping) and dep.static.placed(g)
            assert (rep.phase is Phase.FAILED) == (not placed and rep.phase is not Phase.STOPPING), (
                f"{rid} is {rep.phase.value} with bundles placed={placed}")

    @precondition(lambda self: len(self.state.deployments) > 0)
    @rule(data=st.data())
    def scale(self, data: st.DataObject) -> None:
        name = data.draw(st.sampled_from(sorted(self.state.deployments.keys())), label="deployment")
        dep = self.state.deployments[name]
        n = data.draw(st.integers(0, self.opts.max_replicas), label="num_replicas")
        victims: tuple = ()
        if dep.deleting:  # (refused: a DeploymentApplied takes it back)
            self.refused(ScaleRequested(deployment=name, num_replicas=n), "being deleted")
            return
        if dep.config.autoscaler.autoscaling:  # (refused: its target is the autoscaler's)
            self.refused(ScaleRequested(deployment=name, num_replicas=n), "is autoscaled")
            return
        if dep.blues:  # (refused until the blue-green switch)
            self.refused(ScaleRequested(deployment=name, num_replicas=n), "is switching blue-green")
            return
        if dep.static is not None or dep.gang_size > 1:
            early = dep.static is not None and n > dep.active and dep.count(Phase.STOPPING) - dep.retiring > 0
            if (dep.static is not None and n not in (0, dep.static.replicas)) or n % dep.gang_size or early:
                self.refused(ScaleRequested(deployment=name, num_replicas=n), "", InvalidConfig)
                return
            self.apply(ScaleRequested(deployment=name, num_replicas=n))
            return
        removing = dep.active - n
        if removing > 0:
            alive = sorted(r for r, rep in dep.replicas.items() if rep.phase is not Phase.STOPPING)
            if alive:  # (those a rollout retires count, but stop already)
                victims = tuple(data.draw(st.lists(st.sampled_from(alive), unique=True, max_size=removing),
                                          label="victims"))
        self.apply(ScaleRequested(deployment=name, num_replicas=n, victims=victims))

    @precondition(lambda self: self.autoscaled_names())
    @rule(data=st.data())
    def autoscaling_metrics(self, data: st.DataObject) -> None:
        """The request path's load of an autoscaled deployment (some later time): the
        autoscaler moves its target, within its bounds; requests at zero bring one back."""
        name = data.draw(st.sampled_from(self.autoscaled_names()), label="autoscaled deployment")
        dep = self.state.deployments[name]
        window = dep.autoscaler.window if dep.autoscaler is not None else ()
        newest = max(self.state.cluster.now, window[-1][0] if window else 0.0)
        now = newest + data.draw(st.sampled_from([0.0, 0.5, 5.0, 20.0, 60.0]), label="metrics: later by")
        serving = [rid for rid, r in sorted(dep.replicas.items()) if r.phase in (Phase.RUNNING, Phase.RECONFIGURING)]
        ongoing = {rid: data.draw(st.integers(0, 4), label=f"in flight on {rid}") for rid in serving}
        queued = data.draw(st.sampled_from([0, 0, 1, 3, 10]), label="queued")
        result = self.apply(AutoscalingMetrics(deployment=name, now=now, queued=queued, ongoing=ongoing))
        after = self.state.deployments[name]
        if dep.deleting:
            assert result.stale and after.target == 0, f"{name} is being deleted but its metrics were taken"
            return
        if not serving and queued and not dep.target:
            assert after.target > 0, f"{queued} requests waited for {name} at zero replicas and none is coming"
        quiet = after.autoscaler is not None and not any(q + o for _, q, o in after.autoscaler.window)
        if quiet and not dep.target:
            assert after.target == 0, f"{name} at zero with no traffic went to {after.target} (ray#61731)"

    @precondition(lambda self: len(self.state.deployments) > 0)
    @rule(data=st.data())
    def delete_deployment(self, data: st.DataObject) -> None:
        """Delete one deployment: at 0 at once, its replicas drain, its record goes with the last."""
        name = data.draw(st.sampled_from(sorted(self.state.deployments.keys())), label="deleted deployment")
        before = self.state.deployments[name]
        result = self.apply(DeploymentDeleted(deployment=name))
        after = self.state.deployments.get(name)
        if after is None:  # (gone in the same step: none of its replicas had a process to stop)
            assert all(r.phase in (Phase.PENDING, Phase.FAILED) for r in before.replicas.values()), \
                f"{name} left at once though replicas of it were running"
            assert name in self.state.deleted, f"{name} left but is not in State.deleted"
        else:
            assert after.deleting and after.target == 0, f"{name} deleted but {after.target=} {after.deleting=}"
            if not before.deleting:
                assert all(r.phase is Phase.STOPPING for r in after.replicas.values()), \
                    f"{name} deleted with replicas not stopping"
        if not before.deleting:
            assert not [c for c in result.pool if isinstance(c, PoolComing) and c.coming], \
                "a deleted deployment was announced coming"


class _ClusterRules(_Harness):
    """The placement plane's world: nodes joining, resized, drained and lost, the clock, the proxies."""

    # ------------------------------------------------- managed cluster

    @precondition(lambda self: self.opts.managed)
    @rule(node=node_ids, gpus=st.integers(0, 4), data=st.data())
    def join_or_resize(self, node: str, gpus: int, data: st.DataObject) -> None:
        """A node joins, or one in the cluster reports new capacity."""
        if node in self.state.cluster.nodes:
            if node in self.state.cluster.devices:  # (its GPUs are its devices: only its CPUs change)
                gpus = len(self.state.cluster.devices[node])
            self.apply(NodeCapacityChanged(node_id=node, resources={"GPU": gpus, "CPU": 8}))
        else:
            self.apply(NodeJoined(node_id=node, resources={"GPU": gpus, "CPU": 8},
                                  **self.memory(node, gpus, data)))

    @precondition(lambda self: self.opts.managed)
    @rule(data=st.data())
    def configure_proxies(self, data: st.DataObject) -> None:
        """The core runs the proxies from now on, or where they run changes."""
        where = data.draw(st.sampled_from(("EveryNode", *PROXY_LOCATIONS)), label="proxy_location")
        head = data.draw(st.sampled_from((None, *NODES)) if where != "HeadOnly" else node_ids, label="head")
        drain = data.draw(st.sampled_from([0.0, 30.0]), label="min_draining_period_s")
        self.apply(ProxiesConfigured(options=ProxyOptions(proxy_location=where, min_draining_period_s=drain),
                                     head_node=head, now=self.later(data, "configure")))

    @precondition(lambda self: self.opts.managed and self.state.proxies.started > 0)
    @rule(data=st.data())
    def proxy_news(self, data: st.DataObject) -> None:
        """A proxy (the current one on its node, mostly; else an older incarnation's late news)
        is ready, died, or was health-checked with some requests in flight."""
        book = self.state.proxies
        current = [p.proxy_id for _, p in sorted(book.proxies.items()) if p.phase is not ProxyPhase.BACKOFF]
        late = not current or data.draw(st.integers(0, 4), label="late news") == 0
        pid = data.draw(st.sampled_from([f"proxy:{n}#{i}" for n in NODES for i in range(book.started)]
                                        if late else current), label="proxy")
        kind = data.draw(st.sampled_from(["started", "started", "crashed", "health", "health", "health"]),
                         label="news")
        now = self.later(data, "proxy news")
        if kind == "started":
            self.apply(ProxyStarted(proxy_id=pid, now=now))
        elif kind == "crashed":
            self.apply(ProxyCrashed(proxy_id=pid, reason="killed", now=now))
        else:
            self.apply(ProxyHealthChecked(proxy_id=pid, healthy=data.draw(st.booleans(), label="healthy"),
                                          ongoing=data.draw(st.integers(0, 2), label="in flight"), now=now))

    @precondition(lambda self: self.opts.managed and len(self.state.cluster.nodes) > 0)
    @rule(data=st.data())
    def drain_node(self, data: st.DataObject) -> None:
        node = data.draw(st.sampled_from(sorted(self.state.cluster.nodes.keys())), label="node draining")
        self.apply(NodeDraining(node_id=node, now=self.later(data, "drain")))

    @precondition(lambda self: self.opts.managed)
    @rule(seconds=st.sampled_from([0.5, 6.0, 20.0, 40.0]))
    def tick(self, seconds: float) -> None:
        self.apply(Tick(now=self.state.cluster.now + seconds))

    @rule(node=node_ids)
    def lose_node(self, node: str) -> None:
        hosted = any(r.node_id == node for r in self.state.replicas()) or node in self.state.cluster.nodes or any(
            d.static is not None and node in d.static.bundle_nodes for d in self.state.deployments.values())
        result = self.apply(NodeLost(node_id=node))
        assert result.stale == (not hosted), "NodeLost is stale exactly when neither a replica nor the node was known"
        assert node not in self.state.cluster.nodes


class _ReplicaRules(_Harness):
    """A replica's answers and failures: placed, ready, reconfigured, stopped, crashed, health checked,
    its models reported; ``stabilize`` answers everything until the cluster is quiet."""

    def answer_pending(self, rid: str, rep: Any, data: st.DataObject, label: str) -> None:
        if not self.opts.managed or rep.node_id is None:
            if rid in self.state.cluster.delayed:
                # held for its gang (rankcore.control.moves.hold) or waiting out a restart backoff: no
                # StartReplica yet, the executor never heard of it (a ReplicaPlaced is refused)
                return
            if self.opts.managed and not data.draw(st.booleans(), label=f"{label}: executor places a waiting one itself"):
                return
            node = self.where(data, label)
            if node is not None:
                self.apply(ReplicaPlaced(replica_id=rid, node_id=node))
            return
        how = data.draw(st.sampled_from(["as told", "as told", "elsewhere", "failed"]), label=label)
        now = self.later(data, label)
        if how == "failed":
            self.apply(PlacementFailed(replica_id=rid, node_id=rep.node_id, reason="test", now=now))
        elif how == "elsewhere":
            node = self.where(data, f"{label}: node")
            if node is not None:
                self.apply(ReplicaPlaced(replica_id=rid, node_id=node, now=now))
        else:
            self.apply(ReplicaPlaced(replica_id=rid, node_id=rep.node_id, now=now))

    @precondition(lambda self: self.live(Phase.PENDING, Phase.STARTING, Phase.RECONFIGURING, Phase.STOPPING))
    @rule(data=st.data())
    def answer(self, data: st.DataObject) -> None:
        """The executor answers an outstanding command."""
        name, rid = data.draw(
            st.sampled_from(self.live(Phase.PENDING, Phase.STARTING, Phase.RECONFIGURING, Phase.STOPPING)), label="replica"
        )
        rep = self.state.deployments[name].replicas[rid]
        if rep.phase is Phase.PENDING:
            self.answer_pending(rid, rep, data, "node")
        elif rep.phase is Phase.STARTING:
            self.apply(ReplicaReady(replica_id=rid))
        elif rep.phase is Phase.RECONFIGURING:
            self.apply(ReplicaReconfigured(replica_id=rid, version=rep.version))
        else:
            self.apply(ReplicaStopped(replica_id=rid))

    @precondition(lambda self: self.live(Phase.PENDING, Phase.STARTING, Phase.RECONFIGURING, Phase.STOPPING)
                  or self.fenced())
    @rule(data=st.data())
    def stabilize(self, data: st.DataObject) -> None:
        """The executor answers everything outstanding until all is quiet
        (raft's ``stabilize``): this is what reaches healthy deployments."""
        for _, rid in self.fenced():
            self.apply(ReplicaStopped(replica_id=rid))
            self.retired.append(rid)
        for _ in range(8 * self.opts.max_replicas * max(1, len(self.state.deployments))):
            outstanding = self.live(Phase.PENDING, Phase.STARTING, Phase.RECONFIGURING, Phase.STOPPING)
            if self.opts.managed:  # (replicas waiting for room have nothing to answer)
                outstanding = [(n, r) for n, r in outstanding
                               if self.state.deployments[n].replicas[r].phase is not Phase.PENDING
                               or self.state.deployments[n].replicas[r].node_id is not None]
            if not outstanding:
                moving = [x for x in self.in_flight()
                          if self.state.deployments[x[0]].replicas[x[1]].phase is not Phase.STARTING]
                if not moving:
                    for name, dep in self.state.deployments.items():
                        # every answer given: a healthy deployment's rollout is over, every replica on
                        # its revision (rankcore.control.rollouts)
                        assert not (dep.healthy and dep.rolling), f"{name} is healthy but still rolling"
                    return
                for name, rid in moving:
                    dep = self.state.deployments.get(name)
                    if dep is not None and rid in dep.replicas:  # (not gone with an earlier answer)
                        self.answer_in_flight(name, rid)
                continue
            for name, rid in outstanding:
                rep = self.state.deployments[name].replicas.get(rid)
                if rep is None:
                    continue
                if rep.phase is Phase.PENDING:
                    if self.opts.managed and rep.node_id is None:
                        continue  # waits for room
                    if self.opts.managed:
                        self.apply(ReplicaPlaced(replica_id=rid, node_id=rep.node_id))
                    else:
                        self.apply(ReplicaPlaced(replica_id=rid, node_id=data.draw(node_ids,
                                                                                   label=f"node for {rid}")))
                elif rep.phase is Phase.STARTING:
                    self.apply(ReplicaReady(replica_id=rid))
                elif rep.phase is Phase.RECONFIGURING:
                    self.apply(ReplicaReconfigured(replica_id=rid, version=rep.version))
                elif rep.phase is Phase.STOPPING:
                    self.apply(ReplicaStopped(replica_id=rid))
        raise AssertionError("answering every command never settled")

    @precondition(lambda self: self.live(Phase.PENDING, Phase.STARTING, Phase.RUNNING, Phase.RECONFIGURING, Phase.STOPPING))
    @rule(data=st.data())
    def crash(self, data: st.DataObject) -> None:
        _name, rid = data.draw(st.sampled_from(self.live(*Phase.__members__.values())), label="replica")
        cause = data.draw(st.sampled_from(CRASH_CAUSES), label="cause")  # exited: node suspect; error: failed start
        self.apply(ReplicaCrashed(replica_id=rid, reason="test", cause=cause, now=self.later(data, "crash")))

    @precondition(lambda self: self.live(Phase.RUNNING, Phase.RECONFIGURING, Phase.STARTING))
    @rule(data=st.data())
    def health_check(self, data: st.DataObject) -> None:
        """A health check; or, one time in four, what the replica says of its multiplexed models
        (a news of a replica's own, as a check is: drawn here, not by a rule of its own, so the
        other rules' share of the steps stays as it was)."""
        _name, rid = data.draw(st.sampled_from(self.live(Phase.RUNNING, Phase.RECONFIGURING, Phase.STARTING)),
                               label="replica")
        if data.draw(st.integers(0, 3), label="models instead") == 0:
            self.models_reported(rid, data)
            return
        healthy = data.draw(st.booleans(), label="healthy")
        self.apply(HealthChecked(replica_id=rid, healthy=healthy, now=self.later(data, "check")))

    def models_reported(self, rid: str, data: st.DataObject) -> None:
        """The replica says which multiplexed models it holds: the core keeps them on its record; a
        changed set in a pool is told to the request path (the pool commands' view is checked
        against the core's after every step)."""
        models = tuple(data.draw(st.lists(st.sampled_from(("m0", "m1", "m2")), unique=True, max_size=3),
                                 label="models"))
        before = self.state.replica(rid)
        result = self.apply(ModelsReported(replica_id=rid, model_ids=models))
        after = self.state.replica(rid)
        if before is not None and after is not None:
            assert after.models == models, (rid, after.models, models)
            assert result.stale is (before.models == models), (rid, before.models, models)


class _TierRules(_Harness):
    """The tiers plane: sleep, wake and weight pushes asked, and the tier moves they start answered."""

    @precondition(lambda self: len(self.state.deployments) > 0)
    @rule(data=st.data())
    def sleep_wake_or_push(self, data: st.DataObject) -> None:
        """RL's moves: put a deployment to sleep, wake it (maybe with new weights), push weights."""
        name = data.draw(st.sampled_from(sorted(self.state.deployments.keys())), label="deployment")
        v, was = self.state.deployments[name].weights_version, self.state.deployments[name].asleep
        event = data.draw(st.sampled_from([SleepRequested(deployment=name), WakeRequested(deployment=name),
                                           WakeRequested(deployment=name, weights_version=v + 1),
                                           WeightsPushed(deployment=name, version=v + 1)]), label="request")
        self.apply(event)
        after = self.state.deployments[name]
        asleep = {SleepRequested: True, WakeRequested: False}.get(type(event), was)
        version = getattr(event, "version", None) or getattr(event, "weights_version", None) or v
        assert (after.asleep, after.weights_version) == (asleep, version)

    # ------------------------------------------- sleep, wake, weights
    @precondition(lambda self: self.in_flight())
    @rule(data=st.data())
    def answer_move(self, data: st.DataObject) -> None:
        """The executor answers a tier move (moved or failed) or a weights update."""
        name, rid = data.draw(st.sampled_from(self.in_flight()), label="replica")
        self.answer_in_flight(name, rid, fail=data.draw(st.booleans(), label="move fails"))


class _RecoveryRules(_Harness):
    """Controller recovery and hostile input: exact and messy recoveries, unresponsive replicas gone,
    stale, illegal and unknown events refused."""

    @precondition(lambda self: self.fenced())
    @rule(data=st.data())
    def unresponsive_gone(self, data: st.DataObject) -> None:
        """An unresponsive replica a recovery stopped has stopped (or crashed)."""
        _name, rid = data.draw(st.sampled_from(self.fenced()), label="unresponsive replica")
        gone = data.draw(st.sampled_from([ReplicaStopped(replica_id=rid), ReplicaCrashed(replica_id=rid)]))
        result = self.apply(gone)
        assert not result.stale and all(rid not in d.unresponsive for d in self.state.deployments.values())
        self.retired.append(rid)

    def recover(self, event: ControllerRecovered) -> None:
        """A controller restart: the subject starts again from its initial
        state (ticked to the clock it had) and recovers from ``event``;
        the live ids the recovery drops are retired."""
        old = self.state
        unresponsive = tuple(UnresponsiveReplica(replica_id=rid, deployment=name,
                                                 node_id=old.deployments[name].unresponsive[rid])
                             for name, rid in self.fenced())  # (still not answering)
        self.events.append(_RESTART)
        self.own = self.subject.initial()
        self.state = self.view(self.own)
        self.restarting = True
        if old.cluster.clock:
            self.apply(Tick(now=old.cluster.now))
        self.restarting = False
        self.apply(attrs.evolve(event, unresponsive=event.unresponsive + unresponsive))
        fenced = {rid for _, rid in self.fenced()}  # (retired once gone)
        self.retired.extend(sorted(set(old.index.keys()) - set(self.state.index.keys()) - fenced))

    @precondition(lambda self: len(self.state.deployments) > 0)
    @rule()
    def recover_exactly(self) -> None:
        """Controller restart with every replica reporting: nothing changes."""
        failed = any(r.phase is Phase.FAILED for r in self.state.replicas())
        if getattr(self.subject, "core_state", None) is None and not failed and not self.fenced():
            # (a FAILED replica has no process to report: recovery makes a new FAILED one on its rank)
            inv.check_recovery_roundtrip(self.state, self.subject.step)
        self.recover(inv.reports_from(self.state))

    @precondition(lambda self: len(self.state.index) > 0)
    @rule(data=st.data())
    def recover_messy(self, data: st.DataObject) -> None:
        """Controller restart where some replicas died meanwhile, some did not
        answer, reports use every rank form, and some claims conflict."""
        exact = inv.reports_from(self.state)
        reports = []
        silent = []
        for rep in exact.reports:
            if data.draw(st.booleans(), label=f"{rep.replica_id} died meanwhile") and rep.phase is not Phase.STOPPING:
                continue
            if data.draw(st.integers(0, 5), label=f"{rep.replica_id} did not answer") == 0:
                silent.append(UnresponsiveReplica(replica_id=rep.replica_id, deployment=rep.deployment,
                                                  node_id=rep.node_id))
                continue
            rank: Any = rep.rank
            if rep.node_id is not None:
                full = ReplicaRank(rank=rank.rank, node_rank=rank.node_rank, local_rank=rank.local_rank)
                if data.draw(st.booleans(), label="conflicting claim"):
                    full = ReplicaRank(rank=0, node_rank=full.node_rank, local_rank=0)
                rank = data.draw(reported_ranks(full), label="rank form")
            else:
                rank = rank.rank
            world_size = rep.world_size
            if data.draw(st.booleans(), label="missed a world_size update"):
                world_size = data.draw(st.integers(0, self.opts.max_replicas), label="reported world_size")
            reports.append(ReplicaReport(
                replica_id=rep.replica_id, deployment=rep.deployment, rank=rank, node_id=rep.node_id,
                phase=rep.phase, world_size=world_size, lineage=rep.lineage, version=rep.version,
                tier=rep.tier, devices=rep.devices, models=rep.models,
            ))
        self.recover(ControllerRecovered(deployments=exact.deployments, reports=tuple(reports), nodes=exact.nodes,
                                         next_replica_number=exact.next_replica_number,
                                         next_lineage=exact.next_lineage, unresponsive=tuple(silent),
                                         deleted=exact.deleted))

    @precondition(lambda self: self.retired)
    @rule(data=st.data())
    def stale_event(self, data: st.DataObject) -> None:
        rid = data.draw(st.sampled_from(self.retired), label="retired replica")
        kind = data.draw(st.sampled_from(["crash", "stopped", "ready", "placed"]), label="kind")
        event = {
            "crash": ReplicaCrashed(replica_id=rid),
            "stopped": ReplicaStopped(replica_id=rid),
            "ready": ReplicaReady(replica_id=rid),
            "placed": ReplicaPlaced(replica_id=rid, node_id="node-a"),
        }[kind]
        result = self.apply(event)
        assert result.stale and result.commands == (), f"{event!r} about a retired replica was not stale"

    @precondition(lambda self: self.live(Phase.PENDING, Phase.RUNNING))
    @rule(data=st.data())
    def illegal_event(self, data: st.DataObject) -> None:
        """An answer that does not fit the phase raises and changes nothing."""
        name, rid = data.draw(st.sampled_from(self.live(Phase.PENDING, Phase.RUNNING)), label="replica")
        phase = self.state.deployments[name].replicas[rid].phase
        event = ReplicaReady(replica_id=rid) if phase is Phase.PENDING else ReplicaStopped(replica_id=rid)
        snap = snapshot(self.state)
        try:
            self.step_subject(event)
        except InvalidEvent as exc:
            assert rid in str(exc) and phase.value in str(exc), f"error does not name replica and phase: {exc}"
        else:
            raise AssertionError(f"{event!r} was accepted in phase {phase.value}")
        assert snapshot(self.state) == snap

    @rule(name=st.text(alphabet="abxyz019-_", min_size=1, max_size=3))
    def unknown_things(self, name: str) -> None:
        """Unknown deployments and never-started replicas raise InvalidEvent
        naming them, and change nothing."""
        snap = snapshot(self.state)
        cases = [
            (ScaleRequested(deployment=f"no-such-{name}", num_replicas=1), f"unknown deployment 'no-such-{name}'"),
            (ReplicaReady(replica_id=f"never-started-{name}"), "the core never started it"),
        ]
        for event, message in cases:
            try:
                self.step_subject(event)
            except InvalidEvent as exc:
                assert message in str(exc), f"{event!r} raised {exc!r}, which does not say {message!r}"
            else:
                raise AssertionError(f"{event!r} was accepted")
            assert snapshot(self.state) == snap, f"{event!r} was refused but changed the state"

def make_machine(
    subject_factory: Callable[[], Subject], *, max_replicas: int = 6,
    settings: hypothesis_settings | None = None, managed: bool = True, groups: bool | None = None,
    tiers: bool = False,
) -> type[RuleBasedStateMachine]:
    """A ``RuleBasedStateMachine`` class checking ``subject_factory()``'s subject.

    The bare call checks everything: a wrapper is driven through placement,
    gangs and static placement too (a machine without them passed a wrapper
    that dropped every ``GangChanged``).

    ``settings`` (a ``hypothesis.settings``) applies to its ``TestCase``;
    without it the loaded profile applies (see ``PROFILES``). ``managed``
    (default) lets the core place replicas: nodes join first (and join, leave,
    change capacity later), deployments ask for GPUs with a random placement
    policy and start timeout, pending replicas are answered on the node the
    core chose (or another one, or with PlacementFailed), the clock ticks, and
    crashes may make a node suspect. ``groups`` (default: as ``managed``)
    makes ``llm`` a deployment of gangs of two (pack or spread, restart_gang
    or restart_replica) and ``embed`` a static placement of three ranks on a
    caller's four-bundle group (bundles moved by ``BundlesPlaced``, lost with
    their nodes). ``managed=False``: a wrapper around an unmanaged core (its
    executor chooses the nodes; no gangs or static placement, which need the
    core to place). ``tiers`` (managed, without groups): nodes declare their
    GPUs' memory and a CPU cache, deployments a model size (some dedicated),
    so models are booked by memory, evict each other and reload WARM or COLD
    (``rankcore.tiers.devices``). In every machine a third of the deployments applied
    (any but the static one) are autoscaled, with random bounds, delays and
    burst mode, and fed random load (``AutoscalingMetrics``); a person's scale
    of one must be refused (``rankcore.control.autoscaling``). Every deployment applied draws
    ``collective_group``, so each step checks its group epochs (``invariants.check_groups``: a
    wrapper that drops a ``ReformGroup`` fails).
    """
    if tiers and (groups or not managed):
        raise InvalidConfig("make_machine(tiers=True) needs managed=True and groups=False (a model booked by "
                            "memory is neither a gang nor statically placed)")
    if groups is None:
        groups = managed
    if groups and not managed:
        raise InvalidConfig("make_machine(groups=True) needs managed=True (gangs and static placement are "
                            "placed by the core)")

    class RankMachine(_DeploymentRules, _ClusterRules, _ReplicaRules, _TierRules, _RecoveryRules):
        opts = MachineOptions(subject_factory=subject_factory, max_replicas=max_replicas, managed=managed,
                              groups=bool(groups), tiers=tiers)

        # ----------------------------------------------------------- rules
        @initialize(name=deployment_names, n=st.integers(0, max_replicas), config=user_configs, data=st.data())
        def first_deployment(self, name: str, n: int, config: Any, data: st.DataObject) -> None:
            self.deploy_first(name, n, config, data)

        @rule(name=deployment_names, n=st.integers(0, max_replicas), config=user_configs,
              has_reconfigure=st.booleans(), takes_rank=st.booleans(), data=st.data())
        def apply_deployment(self, name: str, n: int, config: Any, has_reconfigure: bool, takes_rank: bool,
                             data: st.DataObject) -> None:
            self.deploy(name, n, config, has_reconfigure, takes_rank, data)

    RankMachine.__name__ = f"RankMachine[{getattr(subject_factory, '__name__', 'subject')}]"
    if settings is not None:
        RankMachine.TestCase.settings = settings
    return RankMachine


# --------------------------------------------------------------------------
# Executors: the same checks, driven through timeline actions.


class ExecutorSubject(Protocol):
    """An executor driven action by action (the simulator, the Ray executor).

    ``snapshots()`` returns the trace snapshot records (dicts in the format of
    docs/trace-format.md) written since the last call; ``settle()`` runs until
    nothing is in flight (bounded) and returns whether every deployment is
    healthy; ``fingerprint()`` returns something equal for equal runs (the
    trace text), used to check determinism by replaying the same actions.
    ``capabilities`` may hold "node_loss" and "controller_crash".
    """

    capabilities: frozenset

    def deploy(self, name: str, replicas: int, user_config: Any) -> None: ...
    def scale(self, name: str, replicas: int) -> None: ...
    def update_config(self, name: str, user_config: Any) -> None: ...
    def crash_rank(self, name: str, rank: int) -> None: ...
    def lose_node(self) -> None: ...
    def add_node(self) -> None: ...
    def crash_controller(self) -> None: ...
    def advance(self, seconds: float) -> None: ...
    def settle(self) -> bool: ...
    def state(self) -> State: ...
    def snapshots(self) -> list: ...
    def fingerprint(self) -> Any: ...


def make_timeline_machine(
    subject_factory: Callable[[], ExecutorSubject], *, max_replicas: int = 6, deployments: tuple = ("llm", "embed")
) -> type[RuleBasedStateMachine]:
    """A ``RuleBasedStateMachine`` driving an executor with random timelines and
    checking every snapshot it writes; after ``settle`` every deployment must be
    healthy with contiguous ranks; replaying the same actions must give the
    same fingerprint."""
    names = st.sampled_from(deployments)

    class TimelineMachine(RuleBasedStateMachine):
        def __init__(self) -> None:
            super().__init__()
            self.subject = subject_factory()
            self.actions: list[tuple[str, tuple]] = []
            self.deployed: set[str] = set()

        def do(self, method: str, *args: Any) -> None:
            note(f"{method}{args!r}")
            hyp_event(method)
            getattr(self.subject, method)(*args)
            self.actions.append((method, args))
            for snap in self.subject.snapshots():
                inv.check_snapshot(snap)

        @rule(name=names, n=st.integers(1, max_replicas), config=user_configs)
        def deploy(self, name: str, n: int, config: Any) -> None:
            self.do("deploy", name, n, config)
            self.deployed.add(name)

        @precondition(lambda self: self.deployed)
        @rule(data=st.data())
        def scale(self, data: st.DataObject) -> None:
            name = data.draw(st.sampled_from(sorted(self.deployed)), label="deployment")
            self.do("scale", name, data.draw(st.integers(0, max_replicas), label="replicas"))

        @precondition(lambda self: self.deployed)
        @rule(data=st.data())
        def update_config(self, data: st.DataObject) -> None:
            name = data.draw(st.sampled_from(sorted(self.deployed)), label="deployment")
            self.do("update_config", name, data.draw(user_configs, label="user_config"))

        @precondition(lambda self: self.deployed)
        @rule(data=st.data())
        def crash(self, data: st.DataObject) -> None:
            name = data.draw(st.sampled_from(sorted(self.deployed)), label="deployment")
            self.do("crash_rank", name, data.draw(st.integers(0, max_replicas - 1), label="rank"))

        @precondition(lambda self: "node_loss" in self.subject.capabilities)
        @rule()
        def lose_node(self) -> None:
            self.do("lose_node")

        @precondition(lambda self: "node_loss" in self.subject.capabilities)
        @rule()
        def add_node(self) -> None:
            self.do("add_node")

        @precondition(lambda self: "controller_crash" in self.subject.capabilities and self.deployed)
        @rule()
        def crash_controller(self) -> None:
            self.do("crash_controller")

        @rule(seconds=st.sampled_from([0.5, 2.0, 10.0, 60.0]))
        def advance(self, seconds: float) -> None:
            self.do("advance", seconds)

        @rule()
        def settle(self) -> None:
            self.do("settle")
            state = self.subject.state()
            inv.check_state(state)
            for name in self.deployed:
                dep = state.deployments.get(name)
                assert dep is not None and dep.healthy, f"{name} not healthy after settling"
                assert dep.ranks.is_contiguous(), f"{name} ranks not contiguous after settling"

        def teardown(self) -> None:
            if not self.actions:
                return
            self.subject.settle()
            for snap in self.subject.snapshots():
                inv.check_snapshot(snap)
            first = self.subject.fingerprint()
            again = subject_factory()
            for method, args in self.actions:
                getattr(again, method)(*args)
            again.settle()
            assert again.fingerprint() == first, "the same actions gave a different run"

    TimelineMachine.__name__ = f"TimelineMachine[{getattr(subject_factory, '__name__', 'subject')}]"
    return TimelineMachine
