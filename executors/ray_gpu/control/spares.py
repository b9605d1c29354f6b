"""Spare processes on Ray: started, idle worker processes kept on a node, as
``KeepSpareProcesses`` asks (the core decides where and how many:
``rankcore.placement.spares``).

How: Ray gives an actor it creates an idle worker process of the same job that
has never run anything, when the node has one, instead of starting a process
(measured here: a replica actor created and answering in 0.02 s with one,
0.44 s without). A worker that ran a task is never given to an actor (Ray
keeps task and actor workers apart), so the pool asks the node's raylet to
start workers for the controller's job with Ray's own ``PrestartWorkers``
call (the one behind ``num_prestart_python_workers``), kept alive
``keep_alive_s`` (then Ray's own idle-worker rules apply to them, as to the
workers it prestarts itself). The pool counts as its spares the worker
processes that appeared on the node with that call, that no replica of ours
runs in, and that are not near the end of their keep-alive; it tops the node up
to its count when told a count, after a replica there has started (it may
have taken one; never before: a top-up racing a replica's creation would only
add a process), and every ``check_s`` (the controller's node loop).

Needs ``grpcio`` (the ``ray`` extra installs it): without it, or when the
raylet refuses, the pool logs why once per node and keeps nothing (replicas
then start as before, in new processes). Observation details only
(docs/architecture.md, "What is left in executors/"): ``keep_alive_s``,
``renew_s``, ``check_s``, ``appear_s``.
"""

from __future__ import annotations

import asyncio
import logging
from typing import Any

import rankcore as rc

__all__ = ["SparePool"]

log = logging.getLogger(__name__)


class SparePool:
    """What the controller keeps of ``KeepSpareProcesses``: per node, the count each
    deployment asked for (the node keeps the largest) and the pids of the idle
    workers the pool started there."""

    #: how long Ray keeps a prestarted worker alive while idle (then its idle-worker killer may)
    keep_alive_s = 3600.0
    #: a spare this close to the end of its keep-alive no longer counts (a new one is started)
    renew_s = 300.0
    #: seconds between two top-ups of every node that keeps spares
    check_s = 60.0
    #: how long to look for the new processes after a prestart call
    appear_s = 5.0

    def __init__(self) -> None:
        self.wanted: dict[str, dict[str, int]] = {}  # node -> deployment -> count
        self.idle: dict[str, dict[int, float]] = {}  # node -> pid -> when started, of spares no replica runs in
        self.started: dict[str, int] = {}  # node -> spares started
        self.taken: dict[str, int] = {}  # node -> replicas that started in a spare
        self.unavailable: dict[str, str] = {}  # node -> why no spare can be kept there
        self._stubs: dict[str, Any] = {}
        self._running: dict[str, asyncio.Task] = {}
        self._again: set[str] = set()

    def keep(self, cmd: rc.KeepSpareProcesses) -> None:
        """Note one command (the core sends a count only when it changes)."""
        per = self.wanted.setdefault(cmd.node_id, {})
        if cmd.count:
            per[cmd.deployment] = cmd.count
        else:
            per.pop(cmd.deployment, None)
            if not per:  # (its spares are left to Ray's idle-worker rules)
                del self.wanted[cmd.node_id]
                self.idle.pop(cmd.node_id, None)

    def target(self, node: str) -> int:
        return max(self.wanted.get(node, {}).values(), default=0)

    def took(self, node: str | None, pid: int | None) -> None:
        """A replica of ours runs in process ``pid`` on ``node``: not a spare (any more)."""
        if node is not None and pid is not None and pid in self.idle.get(node, {}):
            del self.idle[node][pid]
            self.taken[node] = self.taken.get(node, 0) + 1

    def refill(self, node: str | None) -> None:
        """Top the node's spares up to its count, in the background (one top-up
        per node at a time; one asked for meanwhile runs after it)."""
        if node is None or not self.target(node):
            return
        if node in self._running:
            self._again.add(node)
            return
        self._running[node] = asyncio.get_running_loop().create_task(self._refill(node))

    async def _refill(self, node: str) -> None:
        try:
            while True:
                self._again.discard(node)
                try:
                    await self._top_up(node)
                except Exception as exc:  # no grpcio, the node went, the raylet refused
                    if node not in self.unavailable:
                        log.warning("spare processes on node %s: none kept: %s", node, exc)
                    self.unavailable[node] = f"{type(exc).__name__}: {exc}"
                    return
                self.unavailable.pop(node, None)
                if node not in self._again:
                    return
        finally:
            self._running.pop(node, None)

    async def _top_up(self, node: str) -> None:
        from ray.core.generated import common_pb2 as common
        from ray.core.generated import node_manager_pb2 as messages

        # (generated modules: no types for mypy to read)
        node_manager_pb2: Any = messages
        common_pb2: Any = common
        stub = self._stub(node)
        loop = asyncio.get_running_loop()
        pids = set((await stub.GetWorkerPIDs(node_manager_pb2.GetWorkerPIDsRequest(), timeout=10)).pids)
        fresh = loop.time() - (self.keep_alive_s - self.renew_s)
        # (a spare that is gone: Ray's idle killer, the node restarted; or about to be let go)
        idle = self.idle[node] = {p: t for p, t in self.idle.get(node, {}).items() if p in pids and t > fresh}
        want = self.target(node) - len(idle)
        if want <= 0:
            return
        import ray

        job = ray.get_runtime_context().get_job_id()
        await stub.PrestartWorkers(node_manager_pb2.PrestartWorkersRequest(
            language=common_pb2.Language.PYTHON, job_id=bytes.fromhex(job),
            keep_alive_duration_secs=int(self.keep_alive_s), num_workers=want), timeout=10)
        t0 = loop.time()
        while True:
            new = set((await stub.GetWorkerPIDs(node_manager_pb2.GetWorkerPIDsRequest(), timeout=10)).pids) - pids
            if len(new) >= want or loop.time() > t0 + self.appear_s:
                break
            await asyncio.sleep(0.05)
        if self.target(node):
            idle.update((p, t0) for p in sorted(new)[:want])
        self.started[node] = self.started.get(node, 0) + len(new)

    def _stub(self, node: str) -> Any:
        stub = self._stubs.get(node)
        if stub is None:
            import ray
            from ray._private.grpc_utils import init_grpc_channel
            from ray.core.generated import node_manager_pb2_grpc

            info = next((n for n in ray.nodes() if n["NodeID"] == node and n.get("Alive")), None)
            if info is None:
                raise LookupError(f"no live Ray node {node}")
            channel = init_grpc_channel(f"{info['NodeManagerAddress']}:{info['NodeManagerPort']}", asynchronous=True)
            stub = self._stubs[node] = node_manager_pb2_grpc.NodeManagerServiceStub(channel)
        return stub

    def forget(self, node: str) -> None:
        """The node is gone: so are its spares."""
        self.idle.pop(node, None)
        self._stubs.pop(node, None)

    def cancel(self) -> None:
        for t in self._running.values():
            t.cancel()
        self._running.clear()

    def status(self) -> dict[str, dict[str, Any]]:
        """node -> its count, the pids of its spares, how many were started and
        taken by a replica, and why none can be kept (if so)."""
        nodes = sorted(self.wanted)
        return {node: {"target": self.target(node), "pids": sorted(self.idle.get(node, ())),
                       "started": self.started.get(node, 0), "taken": self.taken.get(node, 0),
                       "unavailable": self.unavailable.get(node)} for node in nodes}
