"""Run a scenario file on real Ray actors, writing the simulator's trace format.

Supported actions: deploy, scale, update_config, crash (by replica or rank),
crash_controller, wait_until_healthy, wait; and lose_node/add_node when run
on a ``ScenarioCluster`` (a local multi-node Ray shaped like the scenario's
``cluster:``; there replicas ask for the scenario's GPUs and spread or pack
as its ``placement`` says). Random crash rates and hung starts need the
simulator: such a scenario is refused.

Times are an order, not a clock: ``wait``/``after`` sleep ``time_scale`` times
as long (default 0: no sleeping), except that a controller stays down for its
``recover_after`` (scaled, at least long enough for Ray to restart it) so
crashes meanwhile happen while it is down. An expectation ``at: t`` is checked
when the timeline passes t (before the first action due after t), allowing
``settle`` seconds for it to come true; the others at the end.
"""

from __future__ import annotations

import math
import time
from typing import IO, Any, cast

import attrs
import ray

from ..scenarios import Desired, Scenario, needs_controller, perform
from .api import Deployment, ask, get_controller
from .cluster import ScenarioCluster
from .context import get_replica_context
from .controller import NAMESPACE, actor_name, queue_fault

__all__ = ["run_on_ray", "UnsupportedOnRay", "RAY_ACTIONS", "NODE_ACTIONS", "check_supported", "needs_cluster"]

RAY_ACTIONS = ("deploy", "scale", "update_config", "crash", "crash_controller", "wait_until_healthy", "wait")
NODE_ACTIONS = ("lose_node", "add_node")  # on a ScenarioCluster only


class UnsupportedOnRay(ValueError):
    """The scenario uses something only the simulator can do."""


class NoReconfigure:
    def __call__(self) -> Any:
        return get_replica_context().rank.rank


class PlainReconfigure(NoReconfigure):
    def reconfigure(self, user_config: Any) -> None:
        self.user_config = user_config


class RankReconfigure(NoReconfigure):
    def reconfigure(self, user_config: Any, rank: Any) -> None:
        self.user_config, self.rank = user_config, rank


CLASSES = {"none": NoReconfigure, "plain": PlainReconfigure, "with_rank": RankReconfigure}


def _holder(deployment: str, rank: int, timeout: float = 10.0) -> str | None:
    """The live replica whose own context says it holds global rank ``rank``
    (asked directly, all at once, so it works while the controller is down; a
    replica not yet initialised counts with the global rank it was started
    with: the simulator's rule too)."""
    prefix = f"ModelActor:{deployment}:"
    names = sorted(a["name"] for a in ray.util.list_named_actors(all_namespaces=True)
                   if a.get("namespace") == NAMESPACE and a["name"].startswith(prefix))
    refs = []
    for name in names:
        try:
            refs.append(ray.get_actor(name, namespace=NAMESPACE).report.remote())
        except ValueError:
            continue  # gone meanwhile
    hits = []
    ready, _ = ray.wait(refs, num_returns=len(refs), timeout=timeout) if refs else ([], [])
    for ref in ready:
        try:
            r = ray.get(ref)
        except Exception:
            continue
        held = r["rank"][0] if r["rank"] is not None else r.get("global_rank")
        if held == rank and r["phase"] != "stopping":
            hits.append(r["replica_id"])
    return min(hits) if hits else None


def needs_cluster(sc: Scenario) -> bool:
    """Whether ``sc`` loses or adds nodes (so it needs a ScenarioCluster)."""
    return any(a.kind in NODE_ACTIONS for a in sc.timeline)


def check_supported(sc: Scenario, *, multi_node: bool = False) -> None:
    """Raise ``UnsupportedOnRay`` naming what only the simulator can do.
    ``multi_node``: the run has a ScenarioCluster, so node loss/join is fine."""
    allowed = RAY_ACTIONS + (NODE_ACTIONS if multi_node else ())
    bad = [f"timeline[{a.index}] {a.kind}" for a in sc.timeline if a.kind not in allowed]
    if sc.crash_rate_per_replica_hour > 0:
        bad.append("faults.crash_rate_per_replica_hour")
    if sc.start_hang_probability > 0:
        bad.append("faults.start_hang_probability")
    bad += [f"deployments.{n}.static_placement (a placement group you make in Python: "
            f"examples/ray/static_placement.py)" for n, d in sorted(sc.deployments.items()) if d.static is not None]
    if bad:
        hint = "use --executor sim" if multi_node or not needs_cluster(sc) else \
            "node loss needs the scenario-shaped local cluster: --cluster scenario, no --address"
        raise UnsupportedOnRay(f"{sc.source}: the Ray executor cannot run {', '.join(bad)} ({hint})")


def nominal_times(sc: Scenario) -> list[float]:
    """Each action's time as written (``at``, or ``after`` the previous one;
    waits take no time): where ``at:`` expectations fall in the order."""
    t, out = 0.0, []
    for a in sc.timeline:
        if a.at is not None:
            t = a.at
        elif a.after is not None:
            t += a.after
        out.append(t)
    return out


@attrs.frozen
class RayRun:
    expectations: tuple  # (name, passed, detail)
    trace: str

    @property
    def passed(self) -> bool:
        return all(p for _, p, _ in self.expectations)


class _RayTarget:
    """The timeline's effects (``executors.scenarios.Target``) on real Ray actors."""

    def __init__(self, sc: Scenario, ctl: Any, cluster: ScenarioCluster | None, time_scale: float,
                 keep: Any) -> None:
        self.sc, self.ctl, self.cluster, self.time_scale, self.keep = sc, ctl, cluster, time_scale, keep
        self.applied: set[str] = set()
        self.controller_back = 0.0  # monotonic time until which the controller is down
        self.down = False  # the controller was down when the current action began

    def note(self, type_: str, fields: dict) -> None:
        """A fault record in the trace. While the controller is down (it was down
        when the action began: nothing calls it before the action ends) the
        fault is queued in the cluster's KV store, and the next controller
        writes it (with the time it happened) before its recovery, as the
        simulator's trace has it."""
        if self.down:
            queue_fault(type_, fields)
        else:
            ask(self.ctl, "fault", type_, fields)

    def apply(self, event: Any) -> None:
        spec = self.sc.deployments[event.name]
        self.applied.add(event.name)
        opts: dict[str, Any] = {"num_cpus": 0.01}
        if self.cluster is not None:
            # The scenario's nodes are real: a replica reserves its GPUs and
            # nothing else, as in the simulator (the core is told the same
            # need, {"GPU": gpus}, so it places replicas by the same numbers;
            # the nodes' CPUs never decide where one goes).
            opts = {"num_cpus": 0, "num_gpus": spec.gpus}
        # (faults.start_timeout is not passed: the Deployment API has no start
        # timeout option, so on Ray the core waits for a start as long as it takes)
        d = Deployment(cls=CLASSES[spec.reconfigure], name=event.name, num_replicas=event.num_replicas,
                       user_config=event.user_config, ray_actor_options=opts, replica_placement=spec.placement,
                       max_replicas=event.max_replicas)
        ask(self.ctl, "apply", d.name, d.num_replicas, d.user_config, d.cls, (), {}, d.ray_actor_options,
            d.max_ongoing_requests, d.placement)

    def deployed(self, deployment: str) -> bool:
        return deployment in self.applied

    def scale(self, deployment: str, replicas: int, victims: tuple[str, ...]) -> None:
        ask(self.ctl, "scale", deployment, replicas, victims)

    def crash(self, args: dict[str, Any]) -> None:
        rid = args.get("replica")
        dep: str = args.get("deployment") or (rid.rpartition("#")[0] if rid else "")
        if rid is None:
            rid = _holder(dep, args["rank"])
        self.note("crash", {"replica": rid, **{k: v for k, v in args.items() if k != "replica"}})
        if rid is not None:
            try:
                ray.kill(ray.get_actor(actor_name(dep, rid), namespace=NAMESPACE), no_restart=True)
            except ValueError:
                pass  # already gone

    def lose_node(self, node: str) -> None:
        assert self.cluster is not None
        # (node_id: the Ray node, as the trace's other records name nodes)
        self.note("node_lost", {"node": node, "node_id": self.cluster.nodes[node].node_id
                                if node in self.cluster.nodes else None})
        self.cluster.lose(node)

    def add_node(self, node: str, gpus: float) -> None:
        assert self.cluster is not None
        self.note("node_added", {"node": node, "gpus": gpus})
        self.cluster.add(node, gpus)

    def place_bundles(self, deployment: str, bundle_nodes: tuple[str | None, ...]) -> None:
        raise UnsupportedOnRay("place_bundles: on Ray the caller's placement group moves its own bundles")

    def crash_controller(self, recover_after: float) -> None:
        self.note("controller_crash", {"recover_after": recover_after})
        self.keep(ask(self.ctl, "halt"))  # the rest of its trace; it steps nothing more
        ray.kill(self.ctl, no_restart=False)
        self.controller_back = time.monotonic() + max(2.0, recover_after * self.time_scale)


def run_on_ray(sc: Scenario, *, trace_fp: IO[str] | None = None, time_scale: float = 0.0,
               healthy_timeout: float = 120.0, cluster: ScenarioCluster | None = None,
               settle: float = 30.0) -> RayRun:
    """Run ``sc`` on the Ray instance this process is connected to (``cluster``:
    the ScenarioCluster it is connected to, for node loss and GPU counts).
    What each action means is ``executors.scenarios.timeline``'s, as in the
    simulator; only waiting and carrying effects out are done here."""
    check_supported(sc, multi_node=cluster is not None)
    ctl = get_controller()
    ask(ctl, "reset")  # a scenario starts from an empty cluster, as in the simulator
    ask(ctl, "record", {"scenario": sc.name, "seed": sc.seed})
    chunks: list[str] = []

    def keep(text: str) -> None:
        chunks.append(text)
        if trace_fp is not None:
            trace_fp.write(text)

    target = _RayTarget(sc, ctl, cluster, time_scale, keep)
    desired = Desired(sc)

    def wait_for_controller() -> None:
        if time.monotonic() < target.controller_back:
            time.sleep(target.controller_back - time.monotonic())

    timed = sorted((e for e in sc.expect if e.at is not None), key=lambda e: (e.at, e.index))
    earlier: list[dict] = []

    def check_until(t: float) -> None:
        """Check the ``at:`` expectations due before time ``t``."""
        while timed and cast(float, timed[0].at) < t:
            wait_for_controller()
            earlier.append(ask(ctl, "check", timed.pop(0), settle, timeout=settle + 60))

    for a, t in zip(sc.timeline, nominal_times(sc)):
        check_until(t)
        if a.after:
            time.sleep(a.after * time_scale)
        if needs_controller(a):
            wait_for_controller()
        target.down = time.monotonic() < target.controller_back  # (then the action leaves the controller alone)
        if a.kind == "wait_until_healthy":
            timeout = a.args["timeout"] if a.args["timeout"] is not None else healthy_timeout
            ask(ctl, "wait_healthy", a.args["deployment"], max(timeout, healthy_timeout), timeout=timeout + 60)
        elif a.kind == "wait":
            time.sleep(a.args["seconds"] * time_scale)
        else:
            perform(a.kind, a.args, desired, target)
        if time.monotonic() >= target.controller_back:
            keep(ask(ctl, "drain_trace"))
    wait_for_controller()
    for name in sorted(target.applied):
        ask(ctl, "wait_healthy", name, healthy_timeout, timeout=healthy_timeout + 60)
    check_until(math.inf)  # those due after the last action: once it settled, like the end ones
    text, results = ask(ctl, "finish_trace", [e for e in sc.expect if e.at is None], earlier)
    keep(text)
    return RayRun(expectations=tuple(results), trace="".join(chunks))
