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
from typing import TYPE_CHECKING, Any, Protocol

import rankcore as rc
from rankcore.base.records import maker
from rankcore.query import parse_replica_number
from rankcore.requests import ZONE_LABEL

from ..scenarios import Metrics, Scenario
from ..scenarios.latency import Latency
from ..scenarios.timeline import rank_holder

if TYPE_CHECKING:
    from .provision import SimProvisioner
    from .traffic import SimTraffic

__all__ = ["SimNode", "SimReplica", "SimBackend", "SimServices"]


class SimServices(Protocol):
    """What the world needs of the simulation running it."""

    scenario: Scenario
    rng: random.Random
    metrics: Metrics
    now: float
    #: False while the controller is down (a crash then is one it never hears of)
    controller_up: bool

    def schedule(self, delay: float, fn: Callable, *args: Any, last: bool = False) -> int:
        """Call ``fn(*args)`` after ``delay`` virtual seconds."""

    def latency(self, deployment: str, what: str) -> float:
        """A latency drawn for ``what`` ("place", "start", "ready", ...) of a deployment."""

    def deliver(self, event: object) -> None:
        """Hand an answer to the core (dropped while the controller is down)."""

    def replica_running(self, r: SimReplica) -> None:
        """Note that a replica became ready (metrics, timeline bookkeeping)."""

    def tick(self) -> None:
        """Tell the core the time now (a ScheduleTick came due)."""

    def stream(self, name: str) -> random.Random:
        """The seeded random stream of one source of randomness."""

    def note(self, type_: str, **fields: Any) -> None:
        """Write what the cluster did on its own account into the trace (a ``fault`` record)."""

LIVE = tuple(p.value for p in rc.LIVE)

# The world's answers, built without their validators: every field is a
# replica id from a StartReplica, a node name from the scenario, a float
# clock (~1 µs less per answer; a week of 64 replicas sends ~3,500).
_Placed, _Ready, _Crashed, _Stopped, _Checked = (
    maker(c) for c in (rc.ReplicaPlaced, rc.ReplicaReady, rc.ReplicaCrashed, rc.ReplicaStopped, rc.HealthChecked))
#: the phases in which a replica carries out a weights move (one starting applies its updates once ready)
_MOVING = ("running", "reconfiguring")
#: a graceful stop whose replica still holds requests when the guess of their end has passed looks
#: again this much later (virtual seconds), until they end or its graceful_shutdown_timeout_s does
DRAIN_RECHECK_S = 0.01


class SimSpares:
    """A node's spare processes (``KeepSpareProcesses``): started, idle worker
    processes a replica starting there takes instead of waiting for a new one
    (the ``process`` latency). They live and die with their node."""

    __slots__ = ("wanted", "target", "idle", "coming")

    def __init__(self) -> None:
        self.wanted: dict[str, int] = {}  # deployment -> the count it asked of the node
        self.target = 0  # the largest of them: what the node keeps
        self.idle = 0  # started, idle processes
        self.coming = 0  # processes being started (each idle after a ``process`` draw)


class SimCopy:
    """A WARM copy of a model's weights in a node's CPU cache: what an evicted replica
    (``EvictReplica(to="warm")``) left there."""

    __slots__ = ("deployment", "replica_id", "nbytes")

    def __init__(self, deployment: str, replica_id: str, nbytes: int) -> None:
        self.deployment, self.replica_id, self.nbytes = deployment, replica_id, nbytes


class SimNode:
    __slots__ = ("name", "gpus", "used", "alive", "replicas", "order", "held", "unreported", "spares",
                 "memory", "booked", "cache_bytes", "cache", "zone")

    def __init__(self, name: str, gpus: float, order: int, unreported: float = 0.0, memory: int = 0,
                 cache_bytes: int = 0, zone: str = "") -> None:
        self.name, self.gpus, self.order = name, gpus, order
        self.zone = zone  # its availability zone, told the core as its ZONE_LABEL label ("" none)
        #: each GPU's memory (a device node: ``gpu_memory``), and the bytes booked on each now
        self.memory: tuple[int, ...] = (memory,) * int(gpus) if memory else ()
        self.booked = [0.0] * len(self.memory)
        #: CPU memory for WARM copies, and the copies it holds (in the order they came)
        self.cache_bytes = cache_bytes
        self.cache: list[SimCopy] = []
        self.used = 0.0
        self.held = 0.0  # GPUs the bundles of a caller's placement group hold here
        self.unreported = unreported  # GPUs held by something the node does not report to the core
        self.alive = True
        self.replicas: set[str] = set()
        self.spares: SimSpares | None = None  # none until a deployment asks for spare processes here

    @property
    def free(self) -> float:
        return self.gpus - self.used

    def room(self) -> float:
        """What a replica can really take here (the core may believe more: ``unreported``)."""
        return self.gpus - self.held - self.unreported - self.used

    def joined(self) -> rc.NodeJoined:
        """What the node tells the core when it joins (or at a recovery)."""
        return rc.NodeJoined(node_id=self.name, resources={"GPU": self.gpus - self.held}, order=self.order,
                             devices=self.memory, cpu_cache_bytes=self.cache_bytes,
                             labels={ZONE_LABEL: self.zone} if self.zone else {})

    def copy_for(self, deployment: str, replica_id: str) -> SimCopy | None:
        """The WARM copy a "warm" placement of ``replica_id`` loads from: its own, else the
        oldest of its deployment (the one the core's books take: ``rankcore.tiers.choice.apply``)."""
        mine = [c for c in self.cache if c.deployment == deployment]
        return next((c for c in mine if c.replica_id == replica_id), mine[0] if mine else None)

    @property
    def cached(self) -> int:
        return sum(c.nbytes for c in self.cache)


class SimReplica:
    """A replica as it sees itself: the rank in its context, its phase."""

    __slots__ = ("replica_id", "deployment", "phase", "node", "rank", "global_rank", "world_size",
                 "user_config", "version", "lineage", "gpus", "epoch", "target", "gang", "checks", "hung",
                 "tier", "weights", "link", "held_updates", "devices", "per_device", "source", "evict_to",
                 "asked_at", "hot_at", "placed_at", "revision", "models", "reserved", "group")

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
        self.revision = cmd.revision  # the deployment revision it runs (told back to a recovering controller)
        self.gpus = gpus
        self.epoch = epoch  # changed when the replica dies: scheduled work for it is void
        self.target: str | None = None  # the node a PlaceReplica sent it to
        #: the ranks that PlaceReplica reserved for it there (told back to a recovering controller while it
        #: has not been initialised: the old controller's choice, which the new one keeps)
        self.reserved: rc.ReplicaRank | None = None
        self.gang: rc.GangContext | None = cmd.gang  # its context's gang (GangChanged updates the members)
        self.group: rc.GroupContext | None = None  # its collective group's epoch, as ReformGroup last told it
        self.checks = (rc.options.HEALTH_CHECK_PERIOD_S, rc.options.HEALTH_CHECK_TIMEOUT_S)  # InitializeReplica's
        self.hung = False  # it stopped answering (a ``hang`` action): its health checks fail
        self.tier = "hot"  # where its weights are: "hot" (its GPU) or "warm" (CPU memory, asleep)
        self.weights = 0  # the weights version it holds (InitializeReplica's, then each UpdateWeights')
        self.link = 0.0  # its weights' moves run one after another: the link is busy until then
        self.held_updates: list[int] = []  # UpdateWeights received while starting: applied once ready
        #: a tiered replica (``PlaceReplica.devices``): its GPUs on its node, the bytes on each, where
        #: its weights load from ("warm"/"cold", as carried out), and an eviction's ``to``
        self.devices: tuple[int, ...] = ()
        self.per_device = 0.0
        self.source = ""
        self.evict_to: str | None = None
        self.asked_at: float | None = 0.0  # when its StartReplica came (the wait to be HOT); None once ready
        self.hot_at: float | None = None  # HOT (serving from its GPU) since then; None: not HOT
        self.placed_at: float | None = None  # holding its node's GPUs since then (its cost); None: not
        self.models: tuple[str, ...] = ()  # its multiplexed models, as it last reported them (traffic.py)

    @property
    def alive(self) -> bool:
        return self.phase in LIVE

    def report(self) -> rc.ReplicaReport:
        if self.rank is not None and self.node is not None:
            rank: Any = self.rank
        elif self.reserved is not None and self.node is not None and self.node == self.target:
            # placed, never initialised: the ranks its placement carried (its global rank as it is now)
            rank = {"rank": self.global_rank, "node_rank": self.reserved.node_rank,
                    "local_rank": self.reserved.local_rank}
        else:
            rank = self.global_rank
        return rc.ReplicaReport(
            replica_id=self.replica_id,
            deployment=self.deployment,
            rank=rank,
            node_id=self.node,
            phase=self.phase,
            world_size=self.world_size,
            lineage=self.lineage,
            version=self.version,
            user_config=self.user_config if self.rank is not None else rc.UNKNOWN,
            tier=self.tier,
            weights_version=self.weights,
            devices=self.devices if self.tier == "hot" and self.node is not None else (),
            revision=self.revision,
            models=self.models,
            group_id=self.group.group_id if self.group is not None else None,
            group_epoch=self.group.epoch if self.group is not None else 0,
            group_members=self.group.members if self.group is not None else (),
        )


class SimBackend:
    """Carries out commands on simulated replicas; schedules their answers.

    The core decides every placement (``PlaceReplica``) and every timeout
    (``ScheduleTick``): the simulated cluster only carries them out, with
    latencies, and reports what happened."""

    def __init__(self, sim: SimServices) -> None:
        self.sim = sim
        sc = sim.scenario
        self.nodes: dict[str, SimNode] = {}
        for i, n in enumerate(sc.nodes):
            self.nodes[n.name] = SimNode(n.name, n.gpus, i, n.unreported_gpus, n.gpu_memory, n.cpu_cache, n.zone)
        #: node name -> its spec (a repaired node comes back with its GPUs' memory and its cache, empty)
        self._specs = {n.name: n for n in sc.nodes}
        # The callers' placement groups (static deployments) hold their bundles'
        # GPUs from the start: a node offers the core only what is left.
        self.groups: dict[str, list[str | None]] = {}
        for spec in sc.deployments.values():
            if spec.static is not None:
                self.groups[spec.name] = list(spec.static.bundle_nodes)
                for b in spec.static.bundle_nodes:
                    if b is not None and b in self.nodes:
                        self.nodes[b].held += spec.bundle_gpus
        self._order = len(self.nodes)
        self.replicas: dict[str, SimReplica] = {}
        # What the cluster knows of every replica it ever started, so a
        # recovering controller never reuses an id (see ControllerRecovered).
        self.started = 0
        self.lineages = 0
        self._epochs = 0  # unique over the run, so no two incarnations share one
        #: replicas whose gang-change hook ran (``on_gang_changed`` on Ray): one per running member told
        self.gang_hooks = 0
        #: collective-group re-forms carried out (``ReformGroup``), and of those the members that re-formed
        #: in place (kept their process and rank: ``GroupContext.in_place``)
        self.reforms = 0
        self.reformed_in_place = 0
        #: (deployment, global rank its context says) -> replica ids: ``holder`` without a scan
        self._by_rank: dict[tuple[str, int | None], set[str]] = {}
        self._gpu_of: dict[str, float] = {}  # deployment -> GPUs a replica takes (the scenario's)
        self._inits: dict[str, int] = {}  # deployment -> InitializeReplicas carried out (``start_failures``)
        #: orphans no recovery has reported yet: the controller does not know them, so it
        #: hears nothing of them (their death, their health) until a recovery finds them
        self.orphans: set[str] = set()
        #: deployment -> its ``process`` latency, drawn from a stream of its own ("process"), so
        #: that spare processes (which skip draws, and draw for refills) do not shift the other
        #: latencies: variants with and without spares see the same place/start/ready draws
        self._process: dict[str, Latency] = {}
        #: the run's requests (``traffic:``), if any: given the core's pool commands, asked how long a
        #: stopping replica needs to finish what it serves
        self.traffic: SimTraffic | None = None
        #: the run's proxies (``proxies:``), if any: they carry out the core's proxy commands
        self.proxies: Any = None
        #: the node provider answering the core's demand (``cluster.provisioning``); None: the
        #: demand goes unanswered, as on a Ray cluster with no autoscaler
        self.provisioner: SimProvisioner | None = None

    def joined(self) -> list[rc.NodeJoined]:
        """The live nodes, as NodeJoined events in their order."""
        return [n.joined() for n in sorted(self.nodes.values(), key=lambda n: n.order) if n.alive]

    def warm_copies(self) -> list[rc.WarmCopy]:
        """The WARM copies the live nodes' caches hold, for a recovering controller."""
        return [rc.WarmCopy(node_id=n.name, deployment=c.deployment, replica_id=c.replica_id, nbytes=c.nbytes)
                for n in sorted(self.nodes.values(), key=lambda n: n.order) if n.alive for c in n.cache]

    # ------------------------------------------------------------ commands
    def execute(self, commands: Sequence[object], t: float) -> None:
        for cmd in commands:
            carry = CARRIES.get(type(cmd))
            if carry is None:  # (every command type has its entry: tests/unit/test_dispatch_tables.py)
                raise TypeError(f"the simulator carries out no {type(cmd).__name__} (world.CARRIES)")
            carry(self, cmd)

    def pool_changed(self, commands: Sequence[object], t: float) -> None:
        """The core's pool commands of a step (``Step.pool``): the request machine takes them."""
        if self.traffic is not None:
            self.traffic.pool_changed(tuple(commands))

    def _proxy(self, cmd: rc.StartProxy | rc.DrainProxy | rc.StopProxy) -> None:
        if self.proxies is not None:  # (a scenario with no ``proxies:`` never configured the core's)
            {rc.StartProxy: self.proxies.start, rc.DrainProxy: self.proxies.drain,
             rc.StopProxy: self.proxies.stop}[type(cmd)](cmd)

    def _world_size(self, cmd: rc.UpdateWorldSize) -> None:
        for r in self.replicas.values():
            if r.deployment == cmd.deployment and r.alive:
                r.world_size = cmd.world_size

    def _health_checks(self, cmd: rc.UpdateHealthChecks) -> None:
        """Every live replica of the deployment is checked at the new period and timeout from its
        next check on (Ray: ``carry``, the watcher reads them before each check)."""
        for r in self.replicas.values():
            if r.deployment == cmd.deployment and r.alive:
                r.checks = (cmd.health_check_period_s, cmd.health_check_timeout_s)

    def _gang_changed(self, cmd: rc.GangChanged) -> None:
        """Every live member's context shows the new members; a running one's
        hook runs (Ray: ``on_gang_changed``), counted in ``gang_hooks``."""
        for rid in cmd.members:
            r = self.replicas.get(rid)
            if r is not None and r.alive and r.gang is not None:
                r.gang = rc.GangContext(gang_id=r.gang.gang_id, rank_in_gang=r.gang.rank_in_gang,
                                        gang_size=r.gang.gang_size, members=cmd.members)
                if r.phase in ("running", "reconfiguring"):
                    self.gang_hooks += 1

    def _reform_group(self, cmd: rc.ReformGroup) -> None:
        """A live member's context shows its group's new epoch (Ray: the replica's ``group``, which
        ``executors.ray_gpu.collective`` re-forms from), counted in ``reforms`` / ``reformed_in_place``."""
        r = self.replicas.get(cmd.replica_id)
        if r is not None and r.alive:
            r.group = cmd.group
            self.reforms += 1
            self.reformed_in_place += cmd.group.in_place

    def _request_resources(self, cmd: rc.RequestResources) -> None:
        if self.provisioner is not None:
            self.provisioner.request(cmd)

    def _schedule_tick(self, cmd: rc.ScheduleTick) -> None:
        self.sim.schedule(cmd.at - self.sim.now, self.sim.tick)

    def _gpus(self, deployment: str) -> float:
        spec = self.sim.scenario.deployments.get(deployment)
        if spec is not None and spec.static is not None:
            return 0.0  # it runs in its caller's group, on GPUs the group holds
        return spec.gpus if spec is not None else 1.0

    def _start(self, cmd: rc.StartReplica) -> None:
        n = parse_replica_number(cmd.replica_id)
        if n is not None and n >= self.started:
            self.started = n + 1
        if cmd.lineage is not None and cmd.lineage >= self.lineages:
            self.lineages = cmd.lineage + 1
        self._epochs += 1
        gpus = self._gpu_of.get(cmd.deployment)
        if gpus is None:
            gpus = self._gpu_of[cmd.deployment] = self._gpus(cmd.deployment)
        r = SimReplica(cmd, gpus, self._epochs)
        r.asked_at = self.sim.now
        self.replicas[r.replica_id] = r
        self._by_rank.setdefault((r.deployment, r.global_rank), set()).add(r.replica_id)

    def _rerank(self, r: SimReplica, global_rank: int) -> None:
        if global_rank != r.global_rank:
            self._by_rank.get((r.deployment, r.global_rank), set()).discard(r.replica_id)
            self._by_rank.setdefault((r.deployment, global_rank), set()).add(r.replica_id)
            r.global_rank = global_rank

    def _place_cmd(self, cmd: rc.PlaceReplica) -> None:
        r = self.replicas.get(cmd.replica_id)
        if r is None or r.phase != "pending":
            return
        r.target, r.reserved = cmd.node_id, cmd.rank
        r.devices, r.source = cmd.devices, cmd.source
        delay = self.sim.latency(cmd.deployment, "place")
        self.sim.schedule(delay, self._try_place, r.replica_id, r.epoch, cmd.node_id)

    def _try_place(self, rid: str, epoch: int, node_id: str) -> None:
        r = self.replicas.get(rid)
        if r is None or r.epoch != epoch or r.phase != "pending" or r.node is not None:
            return
        refused = self._land(r, node_id)
        if refused is not None:
            self.sim.deliver(rc.PlacementFailed(replica_id=rid, node_id=node_id, reason=refused, now=self.sim.now))
            return
        self.sim.deliver(_Placed(replica_id=rid, node_id=node_id, now=self.sim.now))

    def _land(self, r: SimReplica, node_id: str) -> str | None:
        """Put ``r`` on node ``node_id`` (its room taken); why not (the room is not there), or None."""
        node = self.nodes.get(node_id)
        if node is None or not node.alive:
            return "no such node"
        if r.devices:  # a tiered replica: booked by memory on the GPUs the core chose
            full = self._no_memory(node, r)
            if full:
                return f"no room: {full}"
            self._book(node, r, +1)
            self._take_copy(node, r)
        elif r.gpus > 0 and node.room() < r.gpus - 1e-9:  # the core believed in room that is not there
            return f"no room: {node.room():g} of {r.gpus:g} GPUs free"
        else:
            node.used += r.gpus
        node.replicas.add(r.replica_id)
        r.node = node.name
        r.placed_at = self.sim.now
        return None

    def _initialize(self, cmd: rc.InitializeReplica) -> None:
        r = self.replicas.get(cmd.replica_id)
        if r is None or not r.alive:
            return
        r.rank, r.world_size, r.user_config = cmd.rank, cmd.world_size, cmd.user_config
        r.checks = (cmd.health_check_period_s, cmd.health_check_timeout_s)
        r.weights = max(r.weights, cmd.weights_version)  # (loaded with the rest of the start)
        self._rerank(r, cmd.rank.rank)
        process = 0.0
        if r.phase == "pending":  # its worker process comes into being now
            r.phase = "starting"
            process = self._process_start(r)
            if r.source:  # its weights load from where the placement found them, before it is ready
                process += self.sim.scenario.transfer_seconds(r.deployment, "load" if r.source == "warm" else "disk")
        sc = self.sim.scenario
        hung = sc.start_hang_probability > 0 and self.sim.stream("hang").random() < sc.start_hang_probability
        delay = self.sim.latency(cmd.deployment, "start") + process
        spec = sc.deployments.get(cmd.deployment)
        if spec is not None and self._inits.get(cmd.deployment, 0) < spec.start_failures:  # its __init__ raises
            self._inits[cmd.deployment] = self._inits.get(cmd.deployment, 0) + 1
            self.sim.schedule(delay, self._init_failed, r.replica_id, r.epoch)
            return
        self._inits[cmd.deployment] = self._inits.get(cmd.deployment, 0) + 1
        delay += self.sim.latency(cmd.deployment, "ready")
        if not hung:  # a hung start never answers: the core's start timeout replaces it
            self.sim.schedule(delay, self._ready, r.replica_id, r.epoch)

    # ------------------------------------------------------ spare processes
    def _process_latency(self, deployment: str) -> float:
        lat = self._process.get(deployment)
        if lat is None:
            lat = self._process[deployment] = self.sim.scenario.latency_for(deployment, "process")
        return lat.sample(self.sim.stream("process"))

    def _process_start(self, r: SimReplica) -> float:
        """The seconds before ``r``'s worker process exists: none when its node has
        an idle spare (taken, and a refill started), else a ``process`` draw."""
        node = self.nodes.get(r.node) if r.node is not None else None
        if node is not None and node.spares is not None and node.spares.idle:
            node.spares.idle -= 1
            self.sim.metrics.process_started(r.deployment, True)
            self._refill(node, r.deployment)
            return 0.0
        self.sim.metrics.process_started(r.deployment, False)
        return self._process_latency(r.deployment)

    def _keep_spares(self, cmd: rc.KeepSpareProcesses) -> None:
        """The node keeps the largest count any deployment asks of it: a higher
        one starts processes to reach it, a lower one drops idle ones above it
        (a node gone: nothing to keep)."""
        node = self.nodes.get(cmd.node_id)
        if node is None or not node.alive:
            return
        sp = node.spares
        if sp is None:
            if not cmd.count:
                return
            sp = node.spares = SimSpares()
        if cmd.count:
            sp.wanted[cmd.deployment] = cmd.count
        else:
            sp.wanted.pop(cmd.deployment, None)
        sp.target = max(sp.wanted.values(), default=0)
        sp.idle = min(sp.idle, sp.target)
        self._refill(node, cmd.deployment)

    def _refill(self, node: SimNode, deployment: str) -> None:
        """Start processes until idle and coming ones reach the node's target
        (each after a ``process`` draw of ``deployment``, the one that asked)."""
        sp = node.spares
        assert sp is not None
        for _ in range(sp.target - sp.idle - sp.coming):
            sp.coming += 1
            self.sim.schedule(self._process_latency(deployment), self._spare_started, node)

    def _spare_started(self, node: SimNode) -> None:
        """A process started: idle, unless the target fell meanwhile (then it is
        dropped) or its node was lost (it went with it)."""
        sp = node.spares
        if sp is None or self.nodes.get(node.name) is not node or not node.alive:
            return
        sp.coming -= 1
        if sp.idle < sp.target:
            sp.idle += 1

    def _init_failed(self, rid: str, epoch: int) -> None:
        r = self.replicas.get(rid)
        if r is None or r.epoch != epoch or r.phase != "starting":
            return
        self.crash(rid, "__init__ raised (start_failures)", cause="error")

    def _ready(self, rid: str, epoch: int) -> None:
        r = self.replicas.get(rid)
        if r is None or r.epoch != epoch or r.phase not in ("starting", "stopping"):
            return
        if r.phase == "starting":
            r.phase = "running"
            self.sim.replica_running(r)
            self._waited(r, True)
            self._hot(r, True)
        held, r.held_updates = r.held_updates, []
        for version in held if r.phase == "running" else ():  # its constructor done, it takes the calls
            self._move(r, "update", self._updated, version)  # in their order: before any sent once ready
        self.sim.deliver(_Ready(replica_id=rid))

    # ------------------------------------------------- weights (issue 21)
    def _move(self, r: SimReplica, what: str, done: Callable[..., None], *args: Any) -> None:
        """Move ``r``'s weights (``what``: a ``TRANSFER_KEYS`` move): its model's bytes over that
        move's bandwidth, after the moves already on its link; ``done`` then answers. A replica
        that dies or stops meanwhile answers nothing (``_moved_ok``)."""
        start = max(self.sim.now, r.link)
        r.link = start + self.sim.scenario.transfer_seconds(r.deployment, what)
        self.sim.schedule(r.link - self.sim.now, done, r.replica_id, r.epoch, *args)

    def _nbytes(self, deployment: str) -> int:
        spec = self.sim.scenario.deployments.get(deployment)
        return int(spec.model_bytes) if spec is not None else 0

    def _mover(self, rid: str, epoch: int) -> SimReplica | None:
        """The replica a move finished on, if it still answers: the same incarnation, serving
        (not stopping: the core forgets its moves), not frozen."""
        r = self.replicas.get(rid)
        if r is None or r.epoch != epoch or r.phase not in _MOVING or r.hung:
            return None
        return r

    def _offload(self, cmd: rc.OffloadReplica) -> None:
        r = self.replicas.get(cmd.replica_id)
        if r is not None and r.phase in _MOVING and not r.hung:
            self._move(r, "offload", self._tier_moved, "warm")

    def _load(self, cmd: rc.LoadReplica) -> None:
        r = self.replicas.get(cmd.replica_id)
        if r is not None and r.phase in _MOVING and not r.hung:
            self._move(r, "load", self._tier_moved, "hot")

    def _tier_moved(self, rid: str, epoch: int, tier: str) -> None:
        r = self._mover(rid, epoch)
        if r is None:
            return
        r.tier = tier
        self._hot(r, tier == "hot")
        node = self.nodes.get(r.node) if r.node is not None else None
        if r.devices and node is not None:  # a sleeper's GPU memory is given up, and booked again on a wake
            self._book(node, r, +1 if tier == "hot" else -1)
        nbytes = self._nbytes(r.deployment)
        self.sim.metrics.transferred(r.deployment, "offload" if tier == "warm" else "load", nbytes)
        self.sim.deliver(rc.TierMoved(replica_id=rid, tier=tier, nbytes=nbytes))

    def _update(self, cmd: rc.UpdateWeights) -> None:
        """New weights: a starting replica holds them until it is ready (a Ray actor takes calls
        once its constructor is done), then applies them; a serving one applies them now."""
        r = self.replicas.get(cmd.replica_id)
        if r is None or not r.alive or r.hung:
            return
        if r.phase in ("pending", "starting"):
            r.held_updates.append(cmd.version)
        elif r.phase in _MOVING:
            self._move(r, "update", self._updated, cmd.version)

    def _updated(self, rid: str, epoch: int, version: int) -> None:
        r = self._mover(rid, epoch)
        if r is None:
            return
        r.weights = max(r.weights, version)
        self.sim.metrics.transferred(r.deployment, "update", self._nbytes(r.deployment))
        self.sim.deliver(rc.WeightsUpdated(replica_id=rid, version=version))

    def _reconfigure(self, cmd: rc.ReconfigureReplica) -> None:
        r = self.replicas.get(cmd.replica_id)
        if r is None or not r.alive:
            return
        # The context shows the new rank before the user's reconfigure runs.
        r.rank, r.world_size, r.user_config, r.version = cmd.rank, cmd.world_size, cmd.user_config, cmd.version
        self._rerank(r, cmd.rank.rank)
        if r.phase == "running":
            r.phase = "reconfiguring"
        if r.hung:
            return  # a frozen process never answers (on Ray: the call waits until it is stopped)
        delay = self.sim.latency(cmd.deployment, "reconfigure")
        self.sim.schedule(delay, self._reconfigured, r.replica_id, r.epoch, cmd.version)

    def _reconfigured(self, rid: str, epoch: int, version: int) -> None:
        r = self.replicas.get(rid)
        if r is None or r.epoch != epoch or not r.alive:
            return
        if r.phase == "reconfiguring" and version == r.version:
            r.phase = "running"
        self.sim.deliver(rc.ReplicaReconfigured(replica_id=rid, version=version))

    def _stop(self, cmd: rc.StopReplica | rc.EvictReplica) -> None:
        """A graceful stop drains for the stop latency, or until the requests it serves are
        answered if that is longer (``traffic``), killed at ``graceful_shutdown_timeout_s``
        (a hung replica drains nothing: killed at the timeout); with 0 s it is killed at once
        and its GPUs are free now (the core has passed its room on)."""
        r = self.replicas.get(cmd.replica_id)
        if r is None or not r.alive:
            return
        r.phase = "stopping"
        deadline = self.sim.now  # (until when it may go on serving what it holds)
        if cmd.graceful_shutdown_timeout_s <= 0:
            self._release_gpus(r)
            delay = 0.0
        elif r.hung:  # a frozen process drains nothing: killed at the timeout
            delay = cmd.graceful_shutdown_timeout_s
        else:
            delay = self.sim.latency(cmd.deployment, "stop")
            if self.traffic is not None:
                delay = max(delay, self.traffic.drain_s(r.replica_id))
                deadline += cmd.graceful_shutdown_timeout_s
            delay = min(delay, cmd.graceful_shutdown_timeout_s)
        self.sim.schedule(delay, self._stopped, r.replica_id, r.epoch, deadline)

    def _stopped(self, rid: str, epoch: int, deadline: float) -> None:
        r = self.replicas.get(rid)
        if r is None or r.epoch != epoch or r.phase != "stopping":
            return
        now = self.sim.now
        if now < deadline and self.traffic is not None and self.traffic.holds(rid):
            # What it serves outlasted the guess (on shared cores a request's CPU runs slower than
            # alone): a graceful stop waits for it, up to graceful_shutdown_timeout_s.
            wait = max(self.traffic.drain_s(rid), DRAIN_RECHECK_S)
            self.sim.schedule(min(wait, deadline - now), self._stopped, rid, epoch, deadline)
            return
        node = self.nodes.get(r.node) if r.node is not None else None
        self._free(r, "stopped")
        if r.evict_to == "warm" and node is not None and node.alive:  # its weights stay in the node's CPU memory
            node.cache.append(SimCopy(r.deployment, rid, self._nbytes(r.deployment)))
        self.sim.deliver(_Stopped(replica_id=rid, now=self.sim.now))  # (the driver would copy it to add now)

    # ------------------------------------------------- GPU memory tiers (issue 21)
    def _evict(self, cmd: rc.EvictReplica) -> None:
        """Drain and stop like a ``StopReplica``; once stopped, its weights stay in the node's
        CPU cache when ``to == "warm"`` (the core counted them in its budget), else are dropped."""
        r = self.replicas.get(cmd.replica_id)
        if r is None or not r.alive:
            return
        r.evict_to = cmd.to
        self.sim.metrics.evicted(r.deployment)
        self._stop(cmd)

    def _drop_copy(self, cmd: rc.DropWarmCopy) -> None:
        """Free the WARM copy ``replica_id`` left on ``node_id`` (no answer)."""
        node = self.nodes.get(cmd.node_id)
        if node is None:
            return
        kept = [c for c in node.cache if not (c.replica_id == cmd.replica_id and c.deployment == cmd.deployment)]
        draining = self.replicas.get(cmd.replica_id)
        if draining is not None and draining.evict_to == "warm" and draining.node == cmd.node_id:
            draining.evict_to = "cold"  # its copy was dropped before it came: none is kept once it stopped
        elif len(kept) == len(node.cache):
            self.sim.note("warm_copy_missing", node=cmd.node_id, deployment=cmd.deployment, replica=cmd.replica_id,
                          command="DropWarmCopy")
        node.cache = kept

    def _no_memory(self, node: SimNode, r: SimReplica) -> str:
        """Why ``r``'s weights do not fit on the GPUs the core chose ("" when they do)."""
        spec = self.sim.scenario.deployments.get(r.deployment)
        r.per_device = (spec.model_bytes if spec is not None else 0) / len(r.devices)
        for i in r.devices:
            if i >= len(node.memory):
                return f"no GPU {i} on {node.name} ({len(node.memory)} devices)"
            if node.booked[i] + r.per_device > node.memory[i] + 1e-6:
                return f"GPU {i} has {node.memory[i] - node.booked[i]:.0f} of {r.per_device:.0f} bytes free"
        return ""

    @staticmethod
    def _book(node: SimNode, r: SimReplica, sign: int) -> None:
        for i in r.devices:
            if i < len(node.booked):
                node.booked[i] += sign * r.per_device

    def _take_copy(self, node: SimNode, r: SimReplica) -> None:
        """Carry out the placement's ``source``: "warm" loads from the node's WARM copy (it leaves
        the cache for the GPU); with no copy there it loads from disk, and the trace says so."""
        fell_back = False
        if r.source == "warm":
            copy = node.copy_for(r.deployment, r.replica_id)
            if copy is None:
                fell_back, r.source = True, "cold"
                self.sim.note("warm_copy_missing", node=node.name, deployment=r.deployment, replica=r.replica_id,
                              command="PlaceReplica", loads_from="cold")
            else:
                node.cache.remove(copy)
        self.sim.metrics.loaded(r.deployment, r.source, fell_back)

    def _waited(self, r: SimReplica, ready: bool) -> None:
        """``r``'s wait to be HOT is over: it is ready, or (not ``ready``) it stopped or died
        first, or the run ended, having waited in vain."""
        if r.asked_at is not None:
            self.sim.metrics.waited_for_hot(r.deployment, self.sim.now - r.asked_at, ready)
            r.asked_at = None

    def end(self) -> None:
        """The run ends: the replicas still waiting to be HOT count their wait so far, and those
        still holding GPUs their cost so far."""
        for _, r in sorted(self.replicas.items()):
            if r.alive and r.replica_id not in self.orphans:
                self._waited(r, False)
            self._held(r)

    def _held(self, r: SimReplica) -> None:
        """``r``'s time on its node until now, counted once (replica-seconds, GPU-hours)."""
        if r.placed_at is not None:
            self.sim.metrics.held(r.deployment, self.sim.now - r.placed_at, self._cost_gpus(r.deployment))
            r.placed_at = None

    def _cost_gpus(self, deployment: str) -> float:
        """The GPUs a replica of ``deployment`` costs: the scenario's ``gpus`` (a static one's
        too: its caller's group holds them for it)."""
        spec = self.sim.scenario.deployments.get(deployment)
        return spec.gpus if spec is not None else 1.0

    def _hot(self, r: SimReplica, hot: bool) -> None:
        """``r`` is HOT (serving from its GPU) from now, or no longer (time HOT per model)."""
        if hot == (r.hot_at is not None):
            return
        r.hot_at = self.sim.now if hot else None
        self.sim.metrics.hot(self.sim.now, r.deployment, +1 if hot else -1)

    # -------------------------------------------------------------- faults
    def _release_gpus(self, r: SimReplica) -> None:
        self._hot(r, False)
        self._held(r)
        if r.node is not None and r.node in self.nodes:
            node = self.nodes[r.node]
            if r.replica_id in node.replicas:
                node.replicas.discard(r.replica_id)
                if not r.devices:
                    node.used -= r.gpus
                elif r.tier == "hot":  # (a sleeper's memory was given up already)
                    self._book(node, r, -1)

    def _free(self, r: SimReplica, phase: str) -> None:
        if self.traffic is not None:  # its streams stop here (their caller learns it from the pool)
            self.traffic.replica_silent(r.replica_id)
        self._release_gpus(r)
        self._waited(r, False)
        r.phase = phase
        self._epochs += 1
        r.epoch = self._epochs
        del self.replicas[r.replica_id]
        self._by_rank.get((r.deployment, r.global_rank), set()).discard(r.replica_id)

    def crash(self, rid: str, reason: str, cause: str = "unknown") -> bool:
        r = self.replicas.get(rid)
        if r is None or not r.alive:
            return False
        if rid in self.orphans:  # (nobody watches it)
            self.orphans.discard(rid)
            self._free(r, "dead")
            return True
        self.sim.metrics.crashed(self.sim.now, r.deployment, r.phase in ("running", "reconfiguring"),
                                 r.global_rank, self.sim.controller_up)
        self._free(r, "dead")
        self.sim.deliver(_Crashed(replica_id=rid, reason=reason, cause=cause, now=self.sim.now))
        return True

    def hang(self, rid: str) -> bool:
        """``rid`` stops answering: each health check (``InitializeReplica``'s period and
        timeout) now fails after its timeout, the next starting a period later; the core
        counts them and decides. Passing checks are not sent: they change nothing in the core.
        Nor does it answer a recovering controller's report call (``recovery_report``)."""
        r = self.replicas.get(rid)
        if r is None or r.phase not in ("running", "reconfiguring") or r.hung:
            return False
        r.hung = True
        if self.traffic is not None:  # its streams stop here
            self.traffic.replica_silent(rid)
        if rid not in self.orphans:  # (nobody checks an orphan's health)
            self.sim.schedule(r.checks[1], self._check_failed, rid, r.epoch)
        return True

    def _check_failed(self, rid: str, epoch: int) -> None:
        r = self.replicas.get(rid)
        if r is None or r.epoch != epoch or r.phase not in ("running", "reconfiguring"):
            return
        period, timeout = r.checks
        self.sim.deliver(_Checked(replica_id=rid, healthy=False, detail=f"no answer within {timeout:g} s",
                                  now=self.sim.now))
        self.sim.schedule(period + timeout, self._check_failed, rid, epoch)

    def holder(self, deployment: str, rank: int) -> str | None:
        """Who ``crash: {deployment, rank}`` hits (``rank_holder``, the Ray runner's rule too)."""
        ids = self._by_rank.get((deployment, rank))
        if not ids:
            return None
        return rank_holder(((rid, rank, self.replicas[rid].phase) for rid in ids), rank)

    def lose_node(self, name: str) -> int:
        node = self.nodes.get(name)
        if node is None or not node.alive:
            return -1
        node.alive = False
        # on the way there too: the core's NodeLost covers them (no answer of their own)
        dead = sorted(node.replicas | {r.replica_id for r in self.replicas.values()
                                       if r.node is None and r.target == name and r.alive})
        for rid in dead:
            r = self.replicas.get(rid)
            if r is not None:
                if rid not in self.orphans:
                    self.sim.metrics.crashed(self.sim.now, r.deployment, r.phase in ("running", "reconfiguring"),
                                             r.global_rank, self.sim.controller_up)
                self.orphans.discard(rid)
                self._free(r, "dead")
        del self.nodes[name]
        if self.proxies is not None:
            self.proxies.node_lost(name)
        self.sim.deliver(rc.NodeLost(node_id=name))
        return len(dead)

    def place_bundles(self, deployment: str, bundle_nodes: tuple[str | None, ...]) -> None:
        """The caller rescheduled its group: the bundles hold GPUs on their new nodes."""
        spec = self.sim.scenario.deployments[deployment]
        old = self.groups.get(deployment, [])
        for b in old:
            if b is not None and b in self.nodes:
                self.nodes[b].held -= spec.bundle_gpus
        self.groups[deployment] = list(bundle_nodes)
        for b in bundle_nodes:
            if b is not None and b in self.nodes:
                self.nodes[b].held += spec.bundle_gpus

    def add_node(self, name: str, gpus: float) -> bool:
        if name in self.nodes:
            return False
        spec = self._specs.get(name)  # a repaired node: its GPUs' memory and its cache (empty) again
        memory, cache = (spec.gpu_memory, spec.cpu_cache) if spec is not None and spec.gpus == gpus else (0, 0)
        node = self.nodes[name] = SimNode(name, gpus, self._order, memory=memory, cache_bytes=cache,
                                          zone=spec.zone if spec is not None else "")
        self._order += 1
        self.sim.deliver(node.joined())
        return True

    def orphan(self, deployment: str, rid: str) -> bool:
        """A running replica ``rid`` of ``deployment`` (no spec names it) on the first live
        node, holding no GPU: left from an earlier run, its controller never started it
        (no id or lineage counted). Only a recovery finds it (the core stops it:
        ``stop_unknown``). False if ``rid`` is alive already or no node is up."""
        node = next((n for n in sorted(self.nodes.values(), key=lambda n: n.order) if n.alive), None)
        if node is None or (rid in self.replicas and self.replicas[rid].alive):
            return False
        self._epochs += 1
        r = SimReplica(rc.StartReplica(replica_id=rid, deployment=deployment, global_rank=0, world_size=1), 0.0,
                       self._epochs)
        r.phase, r.node, r.rank, r.user_config = "running", node.name, rc.ReplicaRank(rank=0, node_rank=0, local_rank=0), None
        node.replicas.add(rid)
        self.replicas[rid] = r
        self._by_rank.setdefault((deployment, 0), set()).add(rid)
        self.orphans.add(rid)
        return True

    def recovery_report(self) -> tuple[list[rc.ReplicaReport], list[rc.UnresponsiveReplica]]:
        """What a recovering controller learns from the live replicas: each one's report,
        except those that hang (``hang``): they do not answer, so they are unresponsive.
        Orphans are reported too: from now on the controller knows them."""
        self.orphans.clear()
        reports, silent = [], []
        for _, r in sorted(self.replicas.items()):
            if not r.alive:
                continue
            if r.phase == "pending" and r.node is None and r.target is not None and not r.hung:
                # Its placement is under way: the recovery waits for it to land, as the Ray executor's
                # waits for a replica actor being created to answer (its answer to the old controller is
                # lost); one that cannot land is reported on no node, and the core places it again.
                self._land(r, r.target)
            if r.hung:
                silent.append(rc.UnresponsiveReplica(replica_id=r.replica_id, deployment=r.deployment, node_id=r.node))
            else:
                reports.append(r.report())
        return reports, silent


#: command type -> what carries it out (the core's commands are final classes: a type, not an
#: ``isinstance`` chain); ``SimBackend.execute`` refuses a type that has none. Beside the Ray
#: executor's ``carry.CARRIES``: the two cover every command (tests/unit/test_dispatch_tables.py)
CARRIES: dict[type, Callable[[SimBackend, Any], None]] = {
    rc.StartReplica: SimBackend._start, rc.PlaceReplica: SimBackend._place_cmd,
    rc.InitializeReplica: SimBackend._initialize, rc.ReconfigureReplica: SimBackend._reconfigure,
    rc.StopReplica: SimBackend._stop, rc.UpdateWorldSize: SimBackend._world_size,
    rc.UpdateHealthChecks: SimBackend._health_checks, rc.ScheduleTick: SimBackend._schedule_tick,
    rc.GangChanged: SimBackend._gang_changed, rc.ReformGroup: SimBackend._reform_group,
    rc.KeepSpareProcesses: SimBackend._keep_spares,
    rc.OffloadReplica: SimBackend._offload, rc.LoadReplica: SimBackend._load, rc.UpdateWeights: SimBackend._update,
    rc.EvictReplica: SimBackend._evict, rc.DropWarmCopy: SimBackend._drop_copy,
    rc.RequestResources: SimBackend._request_resources, rc.StartProxy: SimBackend._proxy,
    rc.DrainProxy: SimBackend._proxy, rc.StopProxy: SimBackend._proxy,
}
