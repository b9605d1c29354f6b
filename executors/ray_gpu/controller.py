"""The controller: a named, detached, restartable Ray actor running the core.

It carries out rankcore's commands on real replica actors (named
``ModelActor:<deployment>:<replica_id>``) and turns what Ray reports into
core events, through the same ``Driver`` as the simulator. Every Ray call is
awaited in its own asyncio task; the core is stepped only from the actor's
event loop, so there is no locking.
"""

from __future__ import annotations

import asyncio
import time
from typing import Any

import ray

import rankcore as rc

from ..driver import Driver
from .replica import ReplicaActor

NAMESPACE = "rankcore"
CONTROLLER_NAME = "rankcore-controller"


def actor_name(deployment: str, replica_id: str) -> str:
    return f"ModelActor:{deployment}:{replica_id}"


class _Backend:
    def __init__(self, ctl: Controller) -> None:
        self.ctl = ctl

    def execute(self, commands: Any, t: float) -> None:
        c = self.ctl
        for cmd in commands:
            if isinstance(cmd, rc.StartReplica):
                c._spawn(c._start(cmd))
            elif isinstance(cmd, rc.InitializeReplica):
                c._spawn(c._initialize(cmd))
            elif isinstance(cmd, rc.ReconfigureReplica):
                c._spawn(c._reconfigure(cmd))
            elif isinstance(cmd, rc.StopReplica):
                c._spawn(c._stop(cmd))
            elif isinstance(cmd, rc.UpdateWorldSize):
                for rid, (dep, actor) in list(c.actors.items()):
                    if dep == cmd.deployment:
                        actor.update_world_size.remote(cmd.world_size)


class Controller:
    def __init__(self) -> None:
        self.t0 = time.monotonic()
        self.driver = Driver(_Backend(self))
        self.specs: dict[str, dict] = {}
        self.actors: dict[str, tuple[str, Any]] = {}  # replica id -> (deployment, handle)
        self.stopping: set[str] = set()
        self.tasks: set[asyncio.Task] = set()
        self.errors: list[str] = []

    # ---------------------------------------------------------------- plumbing
    def _now(self) -> float:
        return time.monotonic() - self.t0

    def _spawn(self, coro: Any) -> None:
        task = asyncio.get_event_loop().create_task(coro)
        self.tasks.add(task)
        task.add_done_callback(self.tasks.discard)

    def _feed(self, event: object) -> None:
        try:
            self.driver.feed(event, self._now())
        except rc.RankcoreError as exc:  # a bug or a race we did not foresee: keep serving
            self.errors.append(f"{event!r}: {exc}")

    # ----------------------------------------------------------- commands
    async def _start(self, cmd: rc.StartReplica) -> None:
        spec = self.specs[cmd.deployment]
        opts = dict(spec["actor_options"])
        actor = ray.remote(ReplicaActor).options(
            name=actor_name(cmd.deployment, cmd.replica_id), namespace=NAMESPACE, lifetime="detached",
            max_restarts=0, max_concurrency=spec["max_ongoing_requests"] + 4, **opts,
        ).remote(cmd.deployment, cmd.replica_id, spec["cls"], spec["args"], spec["kwargs"])
        self.actors[cmd.replica_id] = (cmd.deployment, actor)
        try:
            node = await actor.node_id.remote()
        except Exception as exc:
            self.actors.pop(cmd.replica_id, None)
            self._feed(rc.ReplicaCrashed(replica_id=cmd.replica_id, reason=f"failed to start: {exc}"))
            return
        self._spawn(self._watch(cmd.replica_id, actor))
        self._feed(rc.ReplicaPlaced(replica_id=cmd.replica_id, node_id=node))

    async def _watch(self, rid: str, actor: Any) -> None:
        try:
            await actor.watch.remote()
        except Exception:
            pass
        if rid in self.stopping:
            return
        self.actors.pop(rid, None)
        self._feed(rc.ReplicaCrashed(replica_id=rid, reason="actor died"))

    def _kill(self, rid: str) -> None:
        entry = self.actors.pop(rid, None)
        if entry is not None:
            self.stopping.add(rid)
            ray.kill(entry[1], no_restart=True)

    async def _initialize(self, cmd: rc.InitializeReplica) -> None:
        entry = self.actors.get(cmd.replica_id)
        if entry is None:
            return
        try:
            await entry[1].initialize.remote(cmd.rank.as_tuple(), cmd.world_size, cmd.user_config,
                                             cmd.call_reconfigure, cmd.pass_rank)
        except Exception as exc:
            self._kill(cmd.replica_id)
            self._feed(rc.ReplicaCrashed(replica_id=cmd.replica_id, reason=f"initialize failed: {exc}"))
            return
        self._feed(rc.ReplicaReady(replica_id=cmd.replica_id))

    async def _reconfigure(self, cmd: rc.ReconfigureReplica) -> None:
        entry = self.actors.get(cmd.replica_id)
        if entry is None:
            return
        try:
            await entry[1].reconfigure.remote(cmd.rank.as_tuple(), cmd.world_size, cmd.user_config, cmd.version,
                                              cmd.call_user, cmd.pass_rank)
        except Exception as exc:
            self._kill(cmd.replica_id)
            self._feed(rc.ReplicaCrashed(replica_id=cmd.replica_id, reason=f"reconfigure failed: {exc}"))
            return
        self._feed(rc.ReplicaReconfigured(replica_id=cmd.replica_id, version=cmd.version))

    async def _stop(self, cmd: rc.StopReplica) -> None:
        self.stopping.add(cmd.replica_id)
        entry = self.actors.pop(cmd.replica_id, None)
        if entry is not None:
            try:
                await asyncio.wait_for(entry[1].prepare_stop.remote(), timeout=10)
            except Exception:
                pass
            ray.kill(entry[1], no_restart=True)
        self._feed(rc.ReplicaStopped(replica_id=cmd.replica_id))

    # ------------------------------------------------------------------ API
    async def apply(self, name: str, num_replicas: int, user_config: Any, cls: type, args: tuple, kwargs: dict,
                    actor_options: dict, max_ongoing_requests: int) -> None:
        has_reconfigure = callable(getattr(cls, "reconfigure", None))
        takes_rank = False
        if has_reconfigure:
            import inspect

            takes_rank = "rank" in inspect.signature(cls.reconfigure).parameters
        self.specs[name] = {"cls": cls, "args": args, "kwargs": kwargs, "actor_options": actor_options,
                            "max_ongoing_requests": max_ongoing_requests}
        self._feed(rc.DeploymentApplied(name=name, num_replicas=num_replicas, user_config=user_config,
                                        has_reconfigure=has_reconfigure, reconfigure_takes_rank=takes_rank))

    async def scale(self, name: str, num_replicas: int, victims: tuple = ()) -> None:
        self._feed(rc.ScaleRequested(deployment=name, num_replicas=num_replicas, victims=victims))

    async def wait_healthy(self, name: str, timeout: float = 120.0) -> bool:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            dep = self.driver.state.deployments.get(name)
            if dep is not None and dep.healthy:
                return True
            await asyncio.sleep(0.05)
        return False

    async def endpoints(self, name: str) -> tuple[list, int]:
        """Serving replicas (id, actor handle) and max_ongoing_requests."""
        dep = self.driver.state.deployments.get(name)
        if dep is None:
            return [], 0
        out = []
        for rid, rep in sorted(dep.replicas.items()):
            if rep.phase in (rc.Phase.RUNNING, rc.Phase.RECONFIGURING) and rid in self.actors:
                out.append((rid, self.actors[rid][1]))
        return out, self.specs[name]["max_ongoing_requests"]

    async def ranks(self, name: str) -> dict:
        dep = self.driver.state.deployments.get(name)
        if dep is None:
            return {}
        return {rid: (rk.as_tuple() if rk else None) for rid, rk in dep.ranks.items()}

    async def state_errors(self) -> list[str]:
        return list(self.errors)

    async def shutdown_replicas(self, timeout: float = 60.0) -> None:
        """Scale every deployment to 0 through the core and wait for the stops."""
        for name in sorted(self.driver.state.deployments.keys()):
            if self.driver.state.deployments[name].target:
                self._feed(rc.ScaleRequested(deployment=name, num_replicas=0))
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline and any(d.replicas for d in self.driver.state.deployments.values()):
            await asyncio.sleep(0.05)
        for rid in list(self.actors):  # anything left behind
            self._kill(rid)
