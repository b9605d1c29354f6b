"""Run a scenario file on real Ray actors, writing the simulator's trace format.

Supported: every deployment key (gangs; a static placement runs on a
placement group this runner makes for it before the timeline starts, as the
simulator's caller's group exists from the start), and the timeline actions
of ``RAY_ACTIONS`` (a hang freezes the replica's process, an orphan is a
replica actor of a deployment no spec names); ``NODE_ACTIONS`` and a node's
``unreported_gpus`` when run on a ``ScenarioCluster`` (a local multi-node Ray
shaped like the scenario's ``cluster:``; there replicas ask for the scenario's
GPUs and spread or pack as its ``placement`` says). What only the simulator
can do (random crashes, node losses and hung starts, the actions of
``REFUSED``, a ``model_bytes`` above ``MAX_MODEL_BYTES``) is refused by
``check_supported``, naming it. The replicas' classes are
``scenario_models``': with ``model_bytes``, each replica holds real tensors
of that size, and ``sleep`` / ``wake`` / ``push_weights`` move them
(``scenario_models.weights_for`` makes a version's weights).

An action completes only once the controller has seen its effect: a crash
once it fed the replica's death to the core, a node loss or join once the
core holds it. Times are an order, not a clock: each action runs when the
simulator's clock would run it (``executors.scenarios.plan``), so against a
controller crash it runs while the controller is down, or after its recovery,
as there; ``wait``/``after``/``at`` sleep ``time_scale`` times as long
(default 0: no sleeping), and a controller stays down at least long enough
for Ray to restart it. An expectation ``at: t`` is checked when the timeline
passes t (before the first action due after t; once the controller is back
if it is down then), allowing ``settle`` seconds for it to come true; the
others at the end.
"""

from __future__ import annotations

import logging
import os
import shutil
import signal
import tempfile
import time
from typing import IO, Any, cast

import attrs
import ray

import rankcore as rc

from ..scenarios import Desired, Scenario
from ..scenarios.timeline import (
    Action,
    AddNode,
    Crash,
    CrashController,
    Delete,
    Deploy,
    Hang,
    LoseNode,
    Orphan,
    PlaceBundles,
    PushWeights,
    Rollout,
    Scale,
    Sleep,
    UpdateConfig,
    Wait,
    WaitUntilHealthy,
    WaitUntilServing,
    Wake,
    plan,
    rank_holder,
)
from .api.deployments import Deployment, ask, get_controller
from .base.fingerprint import stamp
from .base.replicas import NAMESPACE, actor_name
from .control.cluster import SCENARIO_NODE_LABEL, ScenarioCluster
from .control.observe import UNSEEN_GROUP_PREFIX
from .control.record import queue_fault
from .control.static import StaticPlacementConfig
from .replica.actor import remote_class
from .scenario_models import CLASSES, WEIGHTED, NoReconfigure, weights_for

log = logging.getLogger(__name__)

__all__ = ["run_on_ray", "UnsupportedOnRay", "RAY_ACTIONS", "NODE_ACTIONS", "REFUSED", "check_supported",
           "needs_cluster", "CLASSES"]

#: the timeline actions (``executors.scenarios.ACTIONS``) Ray carries out anywhere ...
RAY_ACTIONS: tuple[type[Action], ...] = (Deploy, Scale, Delete, UpdateConfig, Rollout, Crash, Hang, Orphan, CrashController,
                                         WaitUntilHealthy, Wait, Sleep, Wake, PushWeights, WaitUntilServing)
#: ... on a ScenarioCluster only ...
NODE_ACTIONS: tuple[type[Action], ...] = (LoseNode, AddNode)
#: ... and those it refuses (``check_supported``), with why
REFUSED: dict[type[Action], str] = {PlaceBundles: "Ray cannot move a placement group's bundles"}
#: the most bytes of weights a scenario replica may hold on Ray (real tensors, in this machine's memory)
MAX_MODEL_BYTES = 256 * 1024**2
#: how long the controller may take to see an action's effect before the run fails
OBSERVE_TIMEOUT_S = 60.0


class UnsupportedOnRay(ValueError):
    """The scenario uses something only the simulator can do."""


def _holder(deployment: str, rank: int, timeout: float = 10.0) -> str | None:
    """Who ``crash: {deployment, rank}`` hits (``rank_holder``, the simulator's
    rule too), from each live replica's own report (asked directly, all at
    once, so it works while the controller is down)."""
    prefix = f"ModelActor:{deployment}:"
    names = sorted(a["name"] for a in ray.util.list_named_actors(all_namespaces=True)
                   if a.get("namespace") == NAMESPACE and a["name"].startswith(prefix))
    refs = []
    for name in names:
        try:
            refs.append(ray.get_actor(name, namespace=NAMESPACE).report.remote())
        except ValueError:
            continue  # gone meanwhile
    ready, _ = ray.wait(refs, num_returns=len(refs), timeout=timeout) if refs else ([], [])
    seen = []
    for ref in ready:
        try:
            r = ray.get(ref)
        except Exception:
            continue
        seen.append((r["replica_id"], r["rank"][0] if r["rank"] is not None else r.get("global_rank"), r["phase"]))
    return rank_holder(seen, rank)


def needs_cluster(sc: Scenario) -> bool:
    """Whether ``sc`` loses or adds nodes, has a node short of what it reports
    (``unreported_gpus``), or declares nodes' GPU memory (``gpu_memory``: models
    booked by memory on those very nodes): it needs a ScenarioCluster."""
    return any(isinstance(a, NODE_ACTIONS) for a in sc.timeline) or any(
        n.unreported_gpus > 0 or _gpu_memory(n) or getattr(n, "zone", "") for n in sc.nodes)


def _gpu_memory(node: Any) -> int:
    return int(getattr(node, "gpu_memory", 0) or 0)


def memory_booking(sc: Scenario) -> Any:
    """The nodes' ``gpu_memory`` / ``cpu_cache`` as the controller's ``book_memory`` options
    (per scenario node name: the ScenarioCluster labels its nodes so), or None if no node
    declares GPU memory."""
    from .control.memory import MemoryBooking

    declared = [n for n in sc.nodes if _gpu_memory(n)]
    if not declared:
        return None
    return MemoryBooking.make({n.name: _gpu_memory(n) for n in declared},
                              {n.name: int(getattr(n, "cpu_cache", 0) or 0) for n in declared})


def _sim_only_faults(sc: Scenario) -> list[str]:
    """The ``faults`` keys only the simulator can honour, with why: random
    crashes, hangs and node losses (a rate of 0 is fine)."""
    raw = sc.raw.get("faults") if isinstance(sc.raw, dict) else None
    given = raw if isinstance(raw, dict) else {}
    out = []
    if sc.crash_rate_per_replica_hour > 0:
        out.append("faults.crash_rate_per_replica_hour (random crashes)")
    if sc.start_hang_probability > 0:
        out.append("faults.start_hang_probability (hung starts)")
    if sc.node_loss_rate > 0:
        key = "node_loss_per_node_day" if "node_loss_per_node_day" in given else "node_mtbf_hours"
        out.append(f"faults.{key} (random node loss)")
    if sc.cluster_node_loss_rate > 0:
        out.append("faults.node_loss_per_cluster_day (random node loss)")
    return out


def _tier_option(spec: Any) -> dict:
    """``model_bytes`` for the core, as the simulator gives it (``DeploymentSpec.tier_option``)."""
    option = getattr(spec, "tier_option", None)
    return dict(option()) if callable(option) else {}


def check_supported(sc: Scenario, *, multi_node: bool = False) -> None:
    """Raise ``UnsupportedOnRay`` naming every key and action of ``sc`` that
    only the simulator can run (the CLI exits 2 with it). ``multi_node``: the
    run has a ScenarioCluster, so node loss/join is fine."""
    allowed = RAY_ACTIONS + (NODE_ACTIONS if multi_node else ())
    bad = [f"timeline[{a.index}] {a.key}" + (f" ({REFUSED[type(a)]})" if type(a) in REFUSED else "")
           for a in sc.timeline if not isinstance(a, allowed)]
    if not multi_node:  # (on a scenario-shaped cluster a hidden placement group holds them: _hide_gpus)
        bad += [f"cluster.nodes {n.name}: unreported_gpus" for n in sc.nodes if n.unreported_gpus > 0]
        bad += [f"cluster.nodes {n.name}: gpu_memory" for n in sc.nodes if _gpu_memory(n)]
        bad += [f"cluster.nodes {n.name}: zone" for n in sc.nodes if getattr(n, "zone", "")]
    faults = _sim_only_faults(sc) + [f"traffic ({', '.join(sorted(sc.traffic))}: the simulator's queue only)"] * bool(sc.traffic)
    if sc.provisioning is not None:  # (the controller still asks Ray's autoscaler: RequestResources)
        faults.append("cluster.provisioning (the simulator's node provider: on Ray, nodes come from the "
                      "cluster's own autoscaler, which the controller asks with request_resources)")
    if sc.proxies is not None:  # (the scenario runner drives no proxy faults nor an outside load balancer)
        faults.append("proxies (the simulator's proxy model: on Ray, start_ingress(proxy_location=...) runs them, "
                      "and the scenario runner does not model their faults or the load balancer)")
    nodes_only = not multi_node and not faults and all(
        isinstance(a, NODE_ACTIONS) for a in sc.timeline if not isinstance(a, allowed))
    bad += faults
    bad += [f"deployments.{name}.model_bytes {spec.model_bytes:g} (each replica holds real tensors on Ray: "
            f"at most {MAX_MODEL_BYTES} bytes)" for name, spec in sorted(sc.deployments.items())
            if spec.model_bytes > MAX_MODEL_BYTES]
    if bad:
        hint = "node loss, unreported_gpus, gpu_memory and zone need the scenario-shaped local cluster: --cluster scenario, " \
            "no --address" if nodes_only else "use --executor sim"
        raise UnsupportedOnRay(f"{sc.source}: the Ray executor cannot run {', '.join(bad)} ({hint})")


@attrs.frozen
class RayRun:
    expectations: tuple  # (name, passed, detail)
    trace: str

    @property
    def passed(self) -> bool:
        return all(p for _, p, _ in self.expectations)


def _make_groups(sc: Scenario, cluster: ScenarioCluster | None, timeout: float = 60.0) -> dict[str, Any]:
    """The callers' placement groups of the static deployments, made before the
    timeline starts (the simulator's hold their bundles from the start): on a
    ScenarioCluster each bundle holds ``bundle_gpus`` on the node the scenario
    names (a label selector); on one local node, a sliver of CPU each."""
    from ray.util.placement_group import placement_group, remove_placement_group

    groups: dict[str, Any] = {}
    try:
        for name, spec in sorted(sc.deployments.items()):
            if spec.static is None:
                continue
            nodes = spec.static.bundle_nodes
            if cluster is not None and spec.bundle_gpus > 0:
                bundles: list[dict] = [{"GPU": float(spec.bundle_gpus)} for _ in nodes]
                selectors = [{SCENARIO_NODE_LABEL: str(n)} for n in nodes]
                pg = placement_group(bundles, strategy="PACK", name=f"scenario:{spec.static.group}",
                                     bundle_label_selector=selectors)
            else:
                pg = placement_group([{"CPU": 0.01} for _ in nodes], strategy="PACK",
                                     name=f"scenario:{spec.static.group}")
            groups[name] = pg
            ray.get(pg.ready(), timeout=timeout)
    except BaseException:
        for pg in groups.values():
            remove_placement_group(pg)
        raise
    return groups


def _hide_gpus(sc: Scenario, cluster: ScenarioCluster | None, timeout: float = 60.0) -> list[Any]:
    """A node's ``unreported_gpus``: a placement group pinned to the node holds
    them, named so that the controller does not subtract it from the node's
    free GPUs (``observe.UNSEEN_GROUP_PREFIX``, a fault-injection knob): the
    core believes in room that is not there, as in the simulator, and a
    replica it aims there gets a group Ray never places (the core's
    placement timeout gives the node up). Needs a ScenarioCluster."""
    from ray.util.placement_group import placement_group, remove_placement_group

    hidden: list[Any] = []
    try:
        for n in sc.nodes:
            if n.unreported_gpus <= 0:
                continue
            if cluster is None:
                raise UnsupportedOnRay(f"{sc.source}: cluster.nodes {n.name}: unreported_gpus needs --cluster scenario")
            pg = placement_group([{"GPU": float(n.unreported_gpus)}], strategy="PACK",
                                 name=f"{UNSEEN_GROUP_PREFIX}{n.name}",
                                 bundle_label_selector=[{SCENARIO_NODE_LABEL: n.name}])
            hidden.append(pg)
            ray.get(pg.ready(), timeout=timeout)
    except BaseException:
        for pg in hidden:
            remove_placement_group(pg)
        raise
    return hidden


def _signal(pid: int, node_id: str, sig: int, timeout: float = OBSERVE_TIMEOUT_S) -> None:
    """Send ``sig`` to process ``pid`` of node ``node_id`` (from a task on that node)."""
    from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

    def send(pid: int, sig: int) -> None:
        os.kill(pid, sig)

    task = ray.remote(num_cpus=0, max_retries=0)(send).options(
        scheduling_strategy=NodeAffinitySchedulingStrategy(node_id=node_id, soft=False))
    ray.get(task.remote(pid, sig), timeout=timeout)


def _freeze(actor: Any, timeout: float = OBSERVE_TIMEOUT_S) -> bool:
    """The scenario's ``hang`` on Ray: freeze the replica's process (SIGSTOP). It is
    alive but answers nothing: its health checks time out, and so does a
    recovering controller's report call (it is reported unresponsive), as the
    simulator's hung replica. False if the actor is gone; a freeze that did not
    take (the signal failed, the process still answers) raises."""
    try:
        pid = ray.get(actor.handle_request.remote("pid", (), {}), timeout=timeout)
        node_id = ray.get(actor.node_id.remote(), timeout=timeout)
    except ray.exceptions.RayActorError:
        return False  # it died meanwhile: nothing to hang
    _signal(pid, node_id, signal.SIGSTOP)
    ready, _ = ray.wait([actor.report.remote()], timeout=1.0)
    if ready:
        raise RuntimeError(f"hang: replica process {pid} still answers after SIGSTOP")
    return True


def _dead(name: str, timeout: float = OBSERVE_TIMEOUT_S) -> None:
    """Wait until the named replica actor is gone (``ray.kill`` returns before)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            ray.get_actor(name, namespace=NAMESPACE)
        except ValueError:
            return
        time.sleep(0.05)
    raise TimeoutError(f"{name} still alive {timeout:g}s after ray.kill")


class _RayTarget:
    """The timeline's effects (``executors.scenarios.Target``) on real Ray actors.
    Each returns once the controller has seen its effect (while it is down:
    once the cluster shows it, for the next controller to find)."""

    def __init__(self, sc: Scenario, ctl: Any, cluster: ScenarioCluster | None, time_scale: float,
                 keep: Any, groups: dict[str, Any], fail_dir: str | None = None) -> None:
        self.sc, self.ctl, self.cluster, self.time_scale, self.keep = sc, ctl, cluster, time_scale, keep
        self.groups = groups
        self.applied: set[str] = set()
        self.controller_back = 0.0  # monotonic time before which the crashed controller is left alone
        self.down = False  # the controller is down (crashed, not yet recovered)
        self.results: list[tuple[str, bool, str]] = []  # the runner's own, as the simulator's
        self.orphans: list[str] = []  # the actor names of the orphans left (killed at the end if still there)
        self.fail_dir = fail_dir  # (start_failures' counters: the run's, removed at its end)

    def note(self, type_: str, fields: dict) -> None:
        """A fault record in the trace. While the controller is down the fault
        is queued in the cluster's KV store, and the next controller writes it
        (with the time it happened) before its recovery, as the simulator's
        trace has it."""
        if self.down:
            queue_fault(type_, fields)
        else:
            ask(self.ctl, "fault", type_, fields)

    def observed(self, what: str, ok: bool) -> None:
        if not ok:
            raise TimeoutError(f"the controller did not see {what} within {OBSERVE_TIMEOUT_S:g}s")

    def deployment(self, name: str, num_replicas: int, user_config: Any) -> Deployment:
        """The scenario's deployment as the Python API's: its gangs, its static
        placement on the group made for it, its GPUs on a ScenarioCluster."""
        spec = self.sc.deployments[name]
        opts: dict[str, Any] = {"num_cpus": 0.01}
        if self.cluster is not None:
            # The scenario's nodes are real: a replica reserves its GPUs and
            # nothing else, as in the simulator (the core is told the same
            # need, {"GPU": gpus}, so it places replicas by the same numbers;
            # the nodes' CPUs never decide where one goes).
            opts = {"num_cpus": 0, "num_gpus": spec.gpus}
        where: dict[str, Any] = {"replica_placement": spec.placement}
        if spec.static is not None:  # in its caller's group, reserving nothing of its own (as simulated)
            opts = {"num_cpus": 0}
            where = {"static_placement": StaticPlacementConfig(
                self.groups[name], {r: list(b) for r, b in enumerate(spec.static.mapping)},
                spec.static.capture_child_tasks)}
        cls = (WEIGHTED if spec.model_bytes > 0 else CLASSES)[spec.reconfigure]
        core = {**dict(spec.options), **_tier_option(spec), "start_timeout_s": spec.start_timeout}
        version = core.pop("version", None)  # (Ray spells it with a keyword of its own)
        return Deployment(version=version, cls=cls, name=name, num_replicas=num_replicas,
                          user_config=user_config, ray_actor_options=opts, max_replicas=spec.max_replicas,
                          gang_size=spec.gang_size, gang_placement=spec.gang_placement,
                          gang_failure=spec.gang_failure,
                          core_options=core, **where)

    def apply(self, event: Any) -> None:
        d = self.deployment(event.name, event.num_replicas, event.user_config)
        # a ``rollout`` action's version and pace (None: the scenario class's fingerprint, never changing)
        d = attrs.evolve(d, version=event.version,
                         core_options={**d.core_options, "max_unavailable": event.max_unavailable,
                                       "max_surge": event.max_surge, "update_mode": event.update_mode})
        self.applied.add(event.name)
        spec = self.sc.deployments[event.name]
        init: dict[str, Any] = {"fail_dir": self.fail_dir, "start_failures": spec.start_failures}
        if spec.model_bytes > 0:
            init["model_bytes"] = int(spec.model_bytes)
        ask(self.ctl, "apply", d.name, d.num_replicas, d.user_config, d.cls, (), init, d.ray_actor_options,
            d.max_ongoing_requests, d.placement, d.max_replicas, d.core_options, *stamp(d.version, d.cls, (), init))

    def deployed(self, deployment: str) -> bool:
        return deployment in self.applied

    def delete(self, deployment: str) -> None:
        """``delete``: the controller's ``delete`` (the core drains and stops its replicas, its
        HTTP route goes); one not deployed is a failed line of the run, as in the simulator."""
        if deployment not in self.applied:
            self.results.append((f"delete {deployment}", False, "not deployed: nothing to delete"))
            return
        self.applied.discard(deployment)
        ask(self.ctl, "delete", deployment)

    def scale(self, deployment: str, replicas: int, victims: tuple[str, ...]) -> None:
        ask(self.ctl, "scale", deployment, replicas, victims)

    def _hit(self, action: Crash | Hang) -> tuple[str | None, str, Any]:
        """The replica a ``crash``/``hang`` names (by id, or the holder of a rank), noted
        in the trace as a fault: its id, its actor's name, its actor (None: no such actor)."""
        if action.by_rank is not None:
            dep, rank = action.by_rank
            rid = _holder(dep, rank)
        else:
            rid = action.replica
            dep = rid.rpartition("#")[0] if rid else ""
        self.note(action.key, {"replica": rid, **{k: v for k, v in action.as_dict().items() if k != "replica"}})
        name = actor_name(dep, rid) if rid is not None else ""
        try:
            return rid, name, ray.get_actor(name, namespace=NAMESPACE) if rid is not None else None
        except ValueError:
            return rid, name, None

    def crash(self, action: Crash) -> None:
        rid, name, actor = self._hit(action)
        if actor is None:  # as the simulator says it
            self.results.append((f"crash {action.as_dict()}", True, "nothing to crash: no live replica matched"))
            return
        ray.kill(actor, no_restart=True)
        if self.down:
            _dead(name)
        else:  # the controller fed ReplicaCrashed (or NodeLost) for it
            self.observed(f"the crash of {rid}", ask(self.ctl, "wait_gone", rid, OBSERVE_TIMEOUT_S,
                                                   timeout=OBSERVE_TIMEOUT_S + 30))

    def lose_node(self, node: str) -> None:
        assert self.cluster is not None
        # (node_id: the Ray node, as the trace's other records name nodes)
        node_id = self.cluster.nodes[node].node_id if node in self.cluster.nodes else None
        self.note("node_lost", {"node": node, "node_id": node_id})
        if not self.cluster.lose(node) or node_id is None:
            return
        deadline = time.monotonic() + OBSERVE_TIMEOUT_S  # Ray declares it dead (~1.5 s)
        while any(n["NodeID"] == node_id and n.get("Alive") for n in ray.nodes()):
            if time.monotonic() > deadline:
                raise TimeoutError(f"Ray still shows node {node} alive {OBSERVE_TIMEOUT_S:g}s after losing it")
            time.sleep(0.1)
        if not self.down:
            self.observed(f"the loss of node {node}", ask(self.ctl, "wait_node", node_id, False, OBSERVE_TIMEOUT_S,
                                                          timeout=OBSERVE_TIMEOUT_S + 30))

    def add_node(self, node: str, gpus: float) -> None:
        assert self.cluster is not None
        self.note("node_added", {"node": node, "gpus": gpus})
        self.cluster.add(node, gpus)
        if not self.down:
            node_id = self.cluster.node_id(node)
            self.observed(f"node {node} join", ask(self.ctl, "wait_node", node_id, True, OBSERVE_TIMEOUT_S,
                                                   timeout=OBSERVE_TIMEOUT_S + 30))

    def place_bundles(self, deployment: str, bundle_nodes: tuple[str | None, ...]) -> None:
        raise UnsupportedOnRay(f"{PlaceBundles.key}: {REFUSED[PlaceBundles]}")  # (check_supported refused it before)

    def request(self, event: Any) -> None:
        """``sleep``, ``wake``, ``push_weights``: the request to the controller, with the version's
        weights (``weights_for``, in the object store once) when the deployment holds tensors. A
        request the core refuses fails the run's ``timeline`` result, as in the simulator."""
        name = event.deployment
        nbytes = int(self.sc.deployments[name].model_bytes)
        version = event.version if isinstance(event, rc.WeightsPushed) else getattr(event, "weights_version", None)
        weights = [ray.put(weights_for(nbytes, version))] if nbytes > 0 and version else None
        try:
            if isinstance(event, rc.SleepRequested):
                ask(self.ctl, "sleep", name)
            elif isinstance(event, rc.WakeRequested):
                ask(self.ctl, "wake", name, event.weights_version, weights)
            else:
                ask(self.ctl, "push_weights", name, event.version, weights)
        except rc.RankcoreError as exc:
            self.results.append((f"{type(event).__name__} {name}", False, f"refused: {exc}"))

    def hang(self, action: Hang) -> None:
        """The replica's process freezes (``_freeze``): its health checks time out
        from now on, and a recovering controller's report call too. With the
        controller up, returns once the core gave it up."""
        rid, _, actor = self._hit(action)
        try:
            if actor is not None and not _freeze(actor):
                actor = None
        except Exception as exc:  # (the hang never happened: the run must not pass as if it had)
            self.results.append((f"hang {action.as_dict()}", False, f"{rid} could not be frozen: {exc!r}"))
            return
        if actor is None:  # as the simulator says it
            self.results.append((f"hang {action.as_dict()}", True, "nothing to hang: no serving replica matched"))
            return
        if not self.down:  # the core counted its failed checks and gave it up
            self.observed(f"the hang of {rid}", ask(self.ctl, "wait_gone", rid, OBSERVE_TIMEOUT_S,
                                                   timeout=OBSERVE_TIMEOUT_S + 30))

    def orphan(self, deployment: str, replica: str) -> None:
        """A replica actor of ``deployment`` (no spec names it), made and named as the
        controller makes its own and initialised (rank 0, running), holding nothing,
        on the first node as in the simulator (on a ScenarioCluster; else where Ray
        likes): the controller does not know it; a recovering one finds it and reports it."""
        from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

        name = actor_name(deployment, replica)
        self.note("orphan", {"replica": replica, "deployment": deployment})
        try:
            ray.get_actor(name, namespace=NAMESPACE)
            self.results.append((f"orphan {replica}", True, "nothing to leave: that replica is alive already"))
            return
        except ValueError:
            pass
        where: dict[str, Any] = {}
        if self.cluster is not None and self.cluster.nodes:
            first = next(iter(self.cluster.nodes.values())).node_id  # (in the order added; lost ones left out)
            where["scheduling_strategy"] = NodeAffinitySchedulingStrategy(node_id=first, soft=False)
        actor: Any = remote_class().options(
            name=name, namespace=NAMESPACE, lifetime="detached", max_restarts=0, num_cpus=0, max_concurrency=100,
            **where).remote(deployment, replica, NoReconfigure, (), {}, None, 0, 1)
        self.orphans.append(name)
        ray.get(actor.initialize.remote((0, 0, 0), 1, None, False, False), timeout=OBSERVE_TIMEOUT_S)

    def crash_controller(self, recover_after: float) -> None:
        self.note("controller_crash", {"recover_after": recover_after})
        self.keep(ask(self.ctl, "halt"))  # the rest of its trace; it steps nothing more
        ray.kill(self.ctl, no_restart=False)
        self.down = True
        self.controller_back = time.monotonic() + max(2.0, recover_after * self.time_scale)

    def recover(self) -> None:
        """Let the crashed controller come back: Ray restarted it; the first call
        makes it recover (``ControllerRecovered``) before it answers."""
        if not self.down:
            return
        if time.monotonic() < self.controller_back:
            time.sleep(self.controller_back - time.monotonic())
        self.down = False
        self.keep(ask(self.ctl, "drain_trace"))


def run_on_ray(sc: Scenario, *, trace_fp: IO[str] | None = None, time_scale: float = 0.0,
               healthy_timeout: float = 120.0, cluster: ScenarioCluster | None = None,
               settle: float = 30.0) -> RayRun:
    """Run ``sc`` on the Ray instance this process is connected to (``cluster``:
    the ScenarioCluster it is connected to, for node loss and GPU counts).
    What each action means, and when it runs against the controller's
    crashes, is ``executors.scenarios.timeline``'s, as in the simulator; only
    waiting and carrying effects out are done here. The placement groups made
    for static deployments are removed at the end, after their replicas."""
    from ray.util.placement_group import remove_placement_group

    check_supported(sc, multi_node=cluster is not None)
    ctl = get_controller()
    ask(ctl, "reset")  # a scenario starts from an empty cluster, as in the simulator
    booking = memory_booking(sc)
    if booking is not None:  # nodes with gpu_memory join as device nodes (before any deployment)
        ask(ctl, "book_memory", booking)
    groups = _make_groups(sc, cluster)
    hidden: list[Any] = []
    orphans: list[str] = []
    # start_failures' counters, shared by the replicas' processes (``scenario_models``): the run's own
    fail_dir = (tempfile.mkdtemp(prefix="rankcore-start-failures-")
                if any(d.start_failures for d in sc.deployments.values()) else None)
    try:
        hidden = _hide_gpus(sc, cluster)
        return _run(sc, ctl, groups, trace_fp, time_scale, healthy_timeout, cluster, settle, orphans, fail_dir)
    finally:
        if fail_dir is not None:
            shutil.rmtree(fail_dir, ignore_errors=True)
        try:
            ask(ctl, "remove_cold_files")  # (the COLD files its evictions wrote)
        except Exception as exc:  # (the controller is gone: nothing more to ask it)
            log.warning("the scenario's COLD files were not removed: %r", exc)
        for name in orphans:  # left and never found by a recovery
            try:
                ray.kill(ray.get_actor(name, namespace=NAMESPACE), no_restart=True)
            except ValueError:
                pass
        if groups:
            ask(ctl, "shutdown_replicas")
            for pg in groups.values():
                remove_placement_group(pg)
        for pg in hidden:
            remove_placement_group(pg)


def _run(sc: Scenario, ctl: Any, groups: dict[str, Any], trace_fp: IO[str] | None, time_scale: float,
         healthy_timeout: float, cluster: ScenarioCluster | None, settle: float, orphans: list[str],
         fail_dir: str | None = None) -> RayRun:
    ask(ctl, "record", {"scenario": sc.name, "seed": sc.seed}, sc.snapshot_every)
    chunks: list[str] = []

    def keep(text: str) -> None:
        chunks.append(text)
        if trace_fp is not None:
            trace_fp.write(text)

    target = _RayTarget(sc, ctl, cluster, time_scale, keep, groups, fail_dir)
    target.orphans = orphans
    desired = Desired(sc.deployments)
    timed = sorted((e for e in sc.expect if e.at is not None), key=lambda e: (e.at, e.index))
    earlier: list[dict] = []

    def check_until(t: float) -> None:
        """Check the ``at:`` expectations due before time ``t``."""
        while timed and cast(float, timed[0].at) < t:
            earlier.append(ask(ctl, "check", timed.pop(0), settle, timeout=settle + 60))

    clock = 0.0  # the timeline's clock: when the previous action ended
    for a, planned in zip(sc.timeline, plan(sc.timeline)):
        if sc.duration is not None and planned.start > sc.duration:
            target.results.append(("timeline", False, f"stopped at t={sc.duration:g} before timeline[{a.index}] "
                                                      f"ran (the scenario's duration)"))
            break
        if target.down and not planned.controller_down:
            target.recover()  # the simulator's controller is back before this action
        if not target.down:
            check_until(planned.start)
        time.sleep(max(0.0, planned.start - clock) * time_scale)
        clock = planned.start
        if isinstance(a, (WaitUntilHealthy, WaitUntilServing)):
            timeout = max(a.timeout if a.timeout is not None else healthy_timeout, healthy_timeout)
            how = "wait_serving" if isinstance(a, WaitUntilServing) else "wait_healthy"
            if not ask(ctl, how, a.deployment, timeout, timeout=timeout + 60) and isinstance(a, WaitUntilServing):
                target.results.append((f"timeline[{a.index}] {a.key} {a.deployment}", False,
                                       f"not serving after {timeout:g}s"))
        elif isinstance(a, Wait):
            time.sleep(a.seconds * time_scale)
            clock += a.seconds
        else:
            a.perform(desired, target)
        if not target.down:
            keep(ask(ctl, "drain_trace"))
    target.recover()
    for name in sorted(target.applied):
        ask(ctl, "wait_healthy", name, healthy_timeout, timeout=healthy_timeout + 60)
    check_until(float("inf"))  # those due after the last action: once it settled, like the end ones
    text, results = ask(ctl, "finish_trace", [e for e in sc.expect if e.at is None], earlier)
    keep(text)
    return RayRun(expectations=tuple(results) + tuple(target.results), trace="".join(chunks))
