"""The simulated cluster: nodes with GPUs, replicas, and the backend that
carries out the core's commands on them in virtual time.

The world talks to its simulation through ``SimServices`` (a clock that
schedules callbacks, delivery of answers to the core, latencies, the seeded
random source, metrics), not through the runner itself: the runner builds the
world, never the other way round. Answers go back through ``deliver``
(dropped while the controller is down: the new controller learns from
reports instead).
"""

from __future__ import annotations

import random
from collections.abc import Callable, Sequence
from typing import Any, Protocol

import rankcore as rc

from ..scenarios import Metrics, Scenario

__all__ = ["SimNode", "SimReplica", "SimBackend", "SimServices"]


class SimServices(Protocol):
    """What the world needs of the simulation running it."""

    scenario: Scenario
    rng: random.Random
    metrics: Metrics
    now: float

    def schedule(self, delay: float, fn: Callable, *args: Any, last: bool = False) -> int:
        """Call ``fn(*args)`` after ``delay`` virtual seconds."""

    def latency(self, deployment: str, what: str) -> float:
        """A latency drawn for ``what`` ("place", "start", "ready", ...) of a deployment."""

    def deliver(self, event: object) -> None:
        """Hand an answer to the core (dropped while the controller is down)."""

    def replica_running(self, r: SimReplica) -> None:
        """Note that a replica became ready (metrics, timeline bookkeeping)."""

LIVE = tuple(p.value for p in rc.lifecycle.LIVE)


class SimNode:
    __slots__ = ("name", "gpus", "used", "alive", "replicas", "order", "per_deployment", "views")

    def __init__(self, name: str, gpus: float, order: int) -> None:
        self.name, self.gpus, self.order = name, gpus, order
        self.used = 0.0
        self.alive = True
        self.replicas: set[str] = set()
        self.per_deployment: dict[str, int] = {}  # replicas on it per deployment (spread's tie-break)
        self.views: dict[str, rc.placement.NodeView] = {}  # per deployment; cleared when the node changes

    @property
    def free(self) -> float:
        return self.gpus - self.used


class SimReplica:
    """A replica as it sees itself: the rank in its context, its phase."""

    __slots__ = ("replica_id", "deployment", "phase", "node", "rank", "global_rank", "world_size",
                 "user_config", "version", "lineage", "gpus", "epoch")

    def __init__(self, cmd: rc.StartReplica, gpus: float, epoch: int) -> None:
        self.replica_id = cmd.replica_id
        self.deployment = cmd.deployment
        self.phase = "pending"
        self.node: str | None = None
        self.rank: rc.ReplicaRank | None = None
        self.global_rank = cmd.global_rank
        self.world_size = cmd.world_size
        self.user_config = None
        self.version = 0
        self.lineage = cmd.lineage
        self.gpus = gpus
        self.epoch = epoch  # changed when the replica dies: scheduled work for it is void

    @property
    def alive(self) -> bool:
        return self.phase in LIVE

    def report(self) -> rc.ReplicaReport:
        rank = self.rank if self.rank is not None and self.node is not None else self.global_rank
        return rc.ReplicaReport(
            replica_id=self.replica_id,
            deployment=self.deployment,
            rank=rank,
            node_id=self.node,
            phase=self.phase,
            world_size=self.world_size,
            lineage=self.lineage,
            version=self.version,
            user_config=self.user_config if self.rank is not None else rc.events.UNKNOWN,
        )


class SimBackend:
    """Carries out commands on simulated replicas; schedules their answers."""

    def __init__(self, sim: SimServices) -> None:
        self.sim = sim
        sc = sim.scenario
        self.nodes: dict[str, SimNode] = {}
        for i, n in enumerate(sc.nodes):
            self.nodes[n.name] = SimNode(n.name, n.gpus, i)
        self.replicas: dict[str, SimReplica] = {}
        self.waiting: list[str] = []  # replicas that did not fit anywhere yet, FIFO
        # What the cluster knows of every replica it ever started, so a
        # recovering controller never reuses an id (see ControllerRecovered).
        self.started = 0
        self.lineages = 0
        self._epochs = 0  # unique over the run, so no two incarnations share one

    # ------------------------------------------------------------ commands
    def execute(self, commands: Sequence[object], t: float) -> None:
        for cmd in commands:
            if isinstance(cmd, rc.StartReplica):
                self._start(cmd)
            elif isinstance(cmd, rc.InitializeReplica):
                self._initialize(cmd)
            elif isinstance(cmd, rc.ReconfigureReplica):
                self._reconfigure(cmd)
            elif isinstance(cmd, rc.StopReplica):
                self._stop(cmd)
            elif isinstance(cmd, rc.UpdateWorldSize):
                for r in self.replicas.values():
                    if r.deployment == cmd.deployment and r.alive:
                        r.world_size = cmd.world_size

    def _gpus(self, deployment: str) -> float:
        spec = self.sim.scenario.deployments.get(deployment)
        return spec.gpus if spec is not None else 1.0

    def _start(self, cmd: rc.StartReplica) -> None:
        n = rc.state.parse_replica_number(cmd.replica_id)
        if n is not None:
            self.started = max(self.started, n + 1)
        if cmd.lineage is not None:
            self.lineages = max(self.lineages, cmd.lineage + 1)
        self._epochs += 1
        r = SimReplica(cmd, self._gpus(cmd.deployment), self._epochs)
        self.replicas[r.replica_id] = r
        delay = self.sim.latency(cmd.deployment, "place")
        self.sim.schedule(delay, self._try_place, r.replica_id, r.epoch)

    def _try_place(self, rid: str, epoch: int) -> None:
        r = self.replicas.get(rid)
        if r is None or r.epoch != epoch or r.phase != "pending":
            return
        node = self._choose_node(r)
        if node is None:
            if rid not in self.waiting:
                self.waiting.append(rid)
            return
        self._place(r, node)

    def _choose_node(self, r: SimReplica) -> SimNode | None:
        """By ``rankcore.placement.choose_node``, the Ray controller's rule too
        (the simulated nodes have GPUs only)."""
        policy = self.sim.scenario.placement
        # (only nodes with room can be chosen: the others are left out here, for speed)
        views = []
        for n in self.nodes.values():
            if n.alive and n.free + 1e-9 >= r.gpus:
                v = n.views.get(r.deployment)
                if v is None:
                    v = n.views[r.deployment] = rc.placement.NodeView(
                        node_id=n.name, order=n.order, free={"GPU": n.free},
                        replicas=n.per_deployment.get(r.deployment, 0))
                views.append(v)
        rank_nodes = None
        if policy == "rank_packed":
            rank_nodes = {x.global_rank: x.node for x in self.replicas.values()
                          if x.deployment == r.deployment and x.node is not None and x.alive
                          and x.global_rank is not None and x is not r}
        chosen = rc.placement.choose_node(views, {"GPU": r.gpus}, policy, rank=r.global_rank, rank_nodes=rank_nodes)
        return None if chosen is None else self.nodes[chosen]

    def _place(self, r: SimReplica, node: SimNode) -> None:
        node.used += r.gpus
        node.replicas.add(r.replica_id)
        node.per_deployment[r.deployment] = node.per_deployment.get(r.deployment, 0) + 1
        node.views.clear()
        r.node = node.name
        self.sim.deliver(rc.ReplicaPlaced(replica_id=r.replica_id, node_id=node.name))

    def _retry_waiting(self) -> None:
        """Capacity changed: place waiting replicas, first come first served."""
        queue, self.waiting = self.waiting, []
        for rid in queue:
            r = self.replicas.get(rid)
            if r is None or r.phase != "pending":
                continue
            node = self._choose_node(r)
            if node is None:
                self.waiting.append(rid)
            else:
                self._place(r, node)

    def _initialize(self, cmd: rc.InitializeReplica) -> None:
        r = self.replicas.get(cmd.replica_id)
        if r is None or not r.alive:
            return
        r.rank, r.world_size, r.user_config = cmd.rank, cmd.world_size, cmd.user_config
        r.global_rank = cmd.rank.rank
        if r.phase == "pending":
            r.phase = "starting"
        sc = self.sim.scenario
        hung = sc.start_hang_probability > 0 and self.sim.rng.random() < sc.start_hang_probability
        delay = self.sim.latency(cmd.deployment, "start") + self.sim.latency(cmd.deployment, "ready")
        if hung or delay > sc.start_timeout:
            self.sim.schedule(sc.start_timeout, self._start_timed_out, r.replica_id, r.epoch)
        else:
            self.sim.schedule(delay, self._ready, r.replica_id, r.epoch)

    def _ready(self, rid: str, epoch: int) -> None:
        r = self.replicas.get(rid)
        if r is None or r.epoch != epoch or r.phase not in ("starting", "stopping"):
            return
        if r.phase == "starting":
            r.phase = "running"
            self.sim.replica_running(r)
        self.sim.deliver(rc.ReplicaReady(replica_id=rid))

    def _start_timed_out(self, rid: str, epoch: int) -> None:
        r = self.replicas.get(rid)
        if r is None or r.epoch != epoch or r.phase != "starting":
            return
        self.crash(rid, "start timed out")

    def _reconfigure(self, cmd: rc.ReconfigureReplica) -> None:
        r = self.replicas.get(cmd.replica_id)
        if r is None or not r.alive:
            return
        # The context shows the new rank before the user's reconfigure runs.
        r.rank, r.world_size, r.user_config, r.version = cmd.rank, cmd.world_size, cmd.user_config, cmd.version
        r.global_rank = cmd.rank.rank
        if r.phase == "running":
            r.phase = "reconfiguring"
        delay = self.sim.latency(cmd.deployment, "reconfigure")
        self.sim.schedule(delay, self._reconfigured, r.replica_id, r.epoch, cmd.version)

    def _reconfigured(self, rid: str, epoch: int, version: int) -> None:
        r = self.replicas.get(rid)
        if r is None or r.epoch != epoch or not r.alive:
            return
        if r.phase == "reconfiguring" and version == r.version:
            r.phase = "running"
        self.sim.deliver(rc.ReplicaReconfigured(replica_id=rid, version=version))

    def _stop(self, cmd: rc.StopReplica) -> None:
        r = self.replicas.get(cmd.replica_id)
        if r is None or not r.alive:
            return
        r.phase = "stopping"
        if cmd.replica_id in self.waiting:
            self.waiting.remove(cmd.replica_id)
        delay = self.sim.latency(cmd.deployment, "stop")
        self.sim.schedule(delay, self._stopped, r.replica_id, r.epoch)

    def _stopped(self, rid: str, epoch: int) -> None:
        r = self.replicas.get(rid)
        if r is None or r.epoch != epoch or r.phase != "stopping":
            return
        self._free(r, "stopped")
        self.sim.deliver(rc.ReplicaStopped(replica_id=rid))
        self._retry_waiting()

    # -------------------------------------------------------------- faults
    def _free(self, r: SimReplica, phase: str) -> None:
        if r.node is not None and r.node in self.nodes:
            node = self.nodes[r.node]
            if r.replica_id in node.replicas:
                node.replicas.discard(r.replica_id)
                node.per_deployment[r.deployment] -= 1
                node.views.clear()
                node.used -= r.gpus
        r.phase = phase
        self._epochs += 1
        r.epoch = self._epochs
        if r.replica_id in self.waiting:
            self.waiting.remove(r.replica_id)
        del self.replicas[r.replica_id]

    def crash(self, rid: str, reason: str) -> bool:
        r = self.replicas.get(rid)
        if r is None or not r.alive:
            return False
        self.sim.metrics.crashed(self.sim.now, r.deployment, r.phase in ("running", "reconfiguring"))
        self._free(r, "dead")
        self.sim.deliver(rc.ReplicaCrashed(replica_id=rid, reason=reason))
        self._retry_waiting()
        return True

    def holder(self, deployment: str, rank: int) -> str | None:
        """The live replica whose context says it holds ``rank`` (lowest id if several)."""
        hits = sorted(r.replica_id for r in self.replicas.values()
                      if r.deployment == deployment and r.alive and r.global_rank == rank)
        return hits[0] if hits else None

    def lose_node(self, name: str) -> int:
        node = self.nodes.get(name)
        if node is None or not node.alive:
            return -1
        node.alive = False
        dead = sorted(node.replicas)
        for rid in dead:
            r = self.replicas.get(rid)
            if r is not None:
                self.sim.metrics.crashed(self.sim.now, r.deployment, r.phase in ("running", "reconfiguring"))
                self._free(r, "dead")
        del self.nodes[name]
        self.sim.deliver(rc.NodeLost(node_id=name))
        self._retry_waiting()
        return len(dead)

    def add_node(self, name: str, gpus: float) -> bool:
        if name in self.nodes:
            return False
        self.nodes[name] = SimNode(name, gpus, len(self.nodes) + 1000)
        self._retry_waiting()
        return True

    def reports(self) -> list[rc.ReplicaReport]:
        return [r.report() for _, r in sorted(self.replicas.items()) if r.alive]
