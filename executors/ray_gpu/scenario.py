"""Run a scenario file on real Ray actors, writing the simulator's trace format.

Supported actions: deploy, scale, update_config, crash (by replica or rank),
crash_controller, wait_until_healthy, wait. Times are an order, not a clock:
``wait``/``after`` sleep ``time_scale`` times as long (default 0: no
sleeping), except that a controller stays down for its ``recover_after``
(scaled, at least long enough for Ray to restart it) so crashes meanwhile
happen while it is down. Node loss/join, random crash rates and hung starts
need the simulator (or a multi-node cluster): such a scenario is refused.
GPU counts are not modelled here (replicas ask for no GPUs).
Expectations are checked at the end.
"""

from __future__ import annotations

import time
from typing import IO, Any

import attrs
import ray

from ..sim.scenario import Scenario
from .api import Deployment, ask, get_controller
from .context import get_replica_context
from .controller import NAMESPACE, actor_name

__all__ = ["run_on_ray", "UnsupportedOnRay", "RAY_ACTIONS"]

RAY_ACTIONS = ("deploy", "scale", "update_config", "crash", "crash_controller", "wait_until_healthy", "wait")


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


def _holder(deployment: str, rank: int) -> str | None:
    """The live replica whose own context says it holds ``rank`` (asked directly,
    so it works while the controller is down; the simulator's rule too)."""
    prefix = f"ModelActor:{deployment}:"
    names = sorted(a["name"] for a in ray.util.list_named_actors(all_namespaces=True)
                   if a.get("namespace") == NAMESPACE and a["name"].startswith(prefix))
    hits = []
    for name in names:
        try:
            r = ray.get(ray.get_actor(name, namespace=NAMESPACE).report.remote(), timeout=10)
        except Exception:
            continue
        if r["rank"] is not None and r["rank"][0] == rank and r["phase"] != "stopping":
            hits.append(r["replica_id"])
    return min(hits) if hits else None


def check_supported(sc: Scenario) -> None:
    bad = [f"timeline[{a.index}] {a.kind}" for a in sc.timeline if a.kind not in RAY_ACTIONS]
    if sc.crash_rate_per_replica_hour > 0:
        bad.append("faults.crash_rate_per_replica_hour")
    if sc.start_hang_probability > 0:
        bad.append("faults.start_hang_probability")
    if bad:
        raise UnsupportedOnRay(f"{sc.source}: the Ray executor cannot run {', '.join(bad)} (use --executor sim)")


@attrs.frozen
class RayRun:
    expectations: tuple  # (name, passed, detail)
    trace: str

    @property
    def passed(self) -> bool:
        return all(p for _, p, _ in self.expectations)


def run_on_ray(sc: Scenario, *, trace_fp: IO[str] | None = None, time_scale: float = 0.0,
               healthy_timeout: float = 120.0) -> RayRun:
    """Run ``sc`` on the Ray instance this process is connected to."""
    check_supported(sc)
    ctl = get_controller()
    ask(ctl, "reset")  # a scenario starts from an empty cluster, as in the simulator
    ask(ctl, "record", {"scenario": sc.name, "seed": sc.seed})
    chunks: list[str] = []

    def drain() -> None:
        text = ask(ctl, "drain_trace")
        chunks.append(text)
        if trace_fp is not None:
            trace_fp.write(text)

    applied: dict[str, dict] = {}

    def apply(name: str, **changes: Any) -> None:
        spec = sc.deployments[name]
        cur = applied.get(name, {"replicas": spec.replicas, "user_config": spec.user_config})
        cur = {**cur, **changes}
        applied[name] = cur
        d = Deployment(cls=CLASSES[spec.reconfigure], name=name, num_replicas=cur["replicas"],
                       user_config=cur["user_config"], ray_actor_options={"num_cpus": 0.01})
        ask(ctl, "apply", d.name, d.num_replicas, d.user_config, d.cls, (), {}, d.ray_actor_options,
            d.max_ongoing_requests)

    controller_back = 0.0
    for a in sc.timeline:
        if a.after:
            time.sleep(a.after * time_scale)
        needs_controller = a.kind not in ("crash", "wait")
        if needs_controller and time.monotonic() < controller_back:
            time.sleep(controller_back - time.monotonic())
        args = a.args
        if a.kind == "deploy":
            apply(args["deployment"], **{k: args[k] for k in ("replicas", "user_config") if k in args})
        elif a.kind == "scale":
            applied.setdefault(args["deployment"], {"replicas": args["replicas"],
                                                    "user_config": sc.deployments[args["deployment"]].user_config})
            applied[args["deployment"]]["replicas"] = args["replicas"]
            ask(ctl, "scale", args["deployment"], args["replicas"], tuple(args.get("victims", ())))
        elif a.kind == "update_config":
            apply(args["deployment"], user_config=args["user_config"])
        elif a.kind == "crash":
            rid = args.get("replica")
            dep = args.get("deployment") or (rid.rpartition("#")[0] if rid else None)
            if rid is None:
                rid = _holder(dep, args["rank"])
            if rid is not None:
                try:
                    ray.kill(ray.get_actor(actor_name(dep, rid), namespace=NAMESPACE), no_restart=True)
                except ValueError:
                    pass  # already gone
        elif a.kind == "crash_controller":
            drain()
            ray.kill(ctl, no_restart=False)
            controller_back = time.monotonic() + max(2.0, args["recover_after"] * time_scale)
        elif a.kind == "wait_until_healthy":
            timeout = args["timeout"] if args["timeout"] is not None else healthy_timeout
            ask(ctl, "wait_healthy", args["deployment"], max(timeout, healthy_timeout), timeout=timeout + 60)
        elif a.kind == "wait":
            time.sleep(args["seconds"] * time_scale)
        if time.monotonic() >= controller_back:
            drain()
    if time.monotonic() < controller_back:
        time.sleep(controller_back - time.monotonic())
    for name in applied:
        ask(ctl, "wait_healthy", name, healthy_timeout, timeout=healthy_timeout + 60)
    text, results = ask(ctl, "finish_trace", list(sc.expect))
    chunks.append(text)
    if trace_fp is not None:
        trace_fp.write(text)
    return RayRun(expectations=tuple(results), trace="".join(chunks))
