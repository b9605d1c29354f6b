"""The controller: a named, detached, restartable Ray actor running the core.

It carries out rankcore's commands on real replica actors (named
``ModelActor:<deployment>:<replica_id>``) and turns what Ray reports into
core events, through the same ``Driver`` as the simulator. Every Ray call is
awaited in its own asyncio task; the core is stepped only from the actor's
event loop, so there is no locking.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Set
from typing import Any, cast

import attrs
import ray
from ray import cloudpickle
from ray.experimental import internal_kv

import rankcore as rc

from ..driver import Driver
from . import placement as pl
from .replica import ReplicaActor

NAMESPACE = "rankcore"
CONTROLLER_NAME = "rankcore-controller"
_KV_SPECS = b"rankcore/specs"  # what was applied, to recover after a restart (ranks are not stored)
_KV_COUNTERS = b"rankcore/counters"  # id and lineage high-water marks, so no id is reused
_KV_RECORDING = b"rankcore/recording"  # a trace is being recorded (survives a restart)
_KV_EPOCH = b"rankcore/epoch"  # wall-clock origin of trace time, shared by every controller incarnation
_KV_INCARNATION = b"rankcore/incarnation"  # how many controllers have started (orders their commands)
#: every replica the controller started and has not forgotten, with how far its
#: start got (Ray Serve checkpoints its replica list too): a restarted controller
#: resumes the starts under way and knows which replicas died while it was down
_KV_REPLICAS = b"rankcore/replicas"
_KV_FAULTS = b"rankcore/faults"  # faults injected while no controller ran, for the trace

log = logging.getLogger("rankcore.ray.controller")


def actor_name(deployment: str, replica_id: str) -> str:
    return f"ModelActor:{deployment}:{replica_id}"


def queue_fault(type_: str, fields: dict) -> None:
    """Record a fault injected while the controller is down (from any process
    connected to the cluster): the next controller writes it to the trace, at
    the time it happened, before its recovery."""
    raw = internal_kv._internal_kv_get(_KV_FAULTS)
    queued = cloudpickle.loads(raw) if raw else []
    queued.append((type_, dict(fields), time.time()))
    internal_kv._internal_kv_put(_KV_FAULTS, cloudpickle.dumps(queued), overwrite=True)


class _Backend:
    def __init__(self, ctl: Controller) -> None:
        self.ctl = ctl

    def execute(self, commands: Any, t: float) -> None:
        """Carry commands out. Each that carries a world size gets a sequence
        number here, in command order ((controller incarnation, n): a later
        controller's are larger): a replica keeps the world size of the newest
        it has seen, since the calls themselves may arrive out of order (a
        reconfigure's task may start after a later UpdateWorldSize is sent)."""
        c = self.ctl
        for cmd in commands:
            if isinstance(cmd, rc.StartReplica):
                c._spawn(c._start(cmd))
            elif isinstance(cmd, rc.InitializeReplica):
                c._spawn(c._initialize(cmd, c._next_seq()))
            elif isinstance(cmd, rc.ReconfigureReplica):
                c._spawn(c._reconfigure(cmd, c._next_seq()))
            elif isinstance(cmd, rc.StopReplica):
                c._spawn(c._stop(cmd))
            elif isinstance(cmd, rc.UpdateWorldSize):
                seq = c._next_seq()
                for _rid, (dep, actor) in list(c.actors.items()):
                    if dep == cmd.deployment:
                        actor.update_world_size.remote(cmd.world_size, seq)


class Controller:
    #: seconds between health checks, and how long a ping may take
    health_check_period_s = 2.0
    health_check_timeout_s = 10.0
    #: how long a replica's group pinned to the chosen node may wait before Ray may place it anywhere
    pin_wait_s = 10.0
    #: deaths on one node this close together are handled as one batch, in rank order
    death_batch_s = 0.25
    #: a node where a replica died on its own (not ray.kill) gets no new replicas
    #: for this long while another node has room: it may be going down
    suspect_s = 15.0

    def __init__(self) -> None:
        raw = internal_kv._internal_kv_get(_KV_EPOCH)
        self.t0 = float(raw) if raw else time.time()
        if not raw:
            internal_kv._internal_kv_put(_KV_EPOCH, repr(self.t0).encode())
        raw = internal_kv._internal_kv_get(_KV_INCARNATION)
        self.incarnation = int(raw) + 1 if raw else 1
        internal_kv._internal_kv_put(_KV_INCARNATION, str(self.incarnation).encode(), overwrite=True)
        self._seq = 0
        self.driver = Driver(_Backend(self))
        self.specs: dict[str, dict] = {}
        self.applied: dict[str, rc.DeploymentApplied] = {}
        self.actors: dict[str, tuple[str, Any]] = {}  # replica id -> (deployment, handle)
        self.stopping: set[str] = set()
        self._placing: dict[str, list[str]] = {}  # replicas started, not yet reported placed, in order
        self._placed_on: dict[str, str] = {}
        self._waiting_pg: dict[str, asyncio.Task] = {}  # started, placement group not placed yet
        self._initialized: set[str] = set()  # initialize() returned: may hold calls, so drained on stop
        self.pgs: dict[str, Any] = {}  # replica id -> its placement group
        self._reserved: dict[str, tuple[str, dict]] = {}  # replica id -> (deployment, {node: resources held})
        self._pinning: set[str] = set()  # groups pinned to a node, not placed yet
        self._dying: dict[str, list[str]] = {}  # node -> replicas whose death is being batched
        self._suspects: dict[str, float] = {}  # node -> when a replica there last died on its own
        self._node_seen: dict[str, int] = {}  # node id -> order first seen (tie-breaks)
        self.tasks: set[asyncio.Task] = set()
        self.errors: list[str] = []  # events the core rejected, "repr(event): error"
        #: replica id -> {"deployment", "global_rank", "lineage", "world_size", "stage"}:
        #: stage "reserving" until its actor is created, then "created" (see _KV_REPLICAS)
        self.known: dict[str, dict] = {}
        self._halted = False  # halt() was called: the controller is about to be killed
        self.started = 0  # one past the highest replica number ever started
        self.lineages = 0
        self._recovered = False
        self._recovering: asyncio.Lock | None = None
        self._health_task: asyncio.Task | None = None
        self.metrics: Any = None

    # ------------------------------------------------------------- recovery
    def _persist(self) -> None:
        specs = {name: {**spec, "applied": self.applied[name]} for name, spec in self.specs.items()}
        internal_kv._internal_kv_put(_KV_SPECS, cloudpickle.dumps(specs), overwrite=True)
        internal_kv._internal_kv_put(_KV_COUNTERS, cloudpickle.dumps((self.started, self.lineages)), overwrite=True)

    def _checkpoint(self) -> None:
        internal_kv._internal_kv_put(_KV_REPLICAS, cloudpickle.dumps(self.known), overwrite=True)

    async def _health_loop(self) -> None:
        """Ping every initialised replica; one that fails or times out is killed
        and reported crashed (its replacement gets its rank)."""
        while True:
            await asyncio.sleep(self.health_check_period_s)
            state = self.driver.state
            checks = []
            for rid, (dep, actor) in list(self.actors.items()):
                d = state.deployments.get(dep)
                if d is not None and rid in d.replicas and d.replicas[rid].phase in (rc.Phase.RUNNING,
                                                                                     rc.Phase.RECONFIGURING):
                    checks.append((rid, actor))
            results = await asyncio.gather(
                *(asyncio.wait_for(actor.ping.remote(), self.health_check_timeout_s) for _, actor in checks),
                return_exceptions=True,
            )
            dying = {rid for batch in self._dying.values() for rid in batch}
            for (rid, _), res in zip(checks, results):
                if isinstance(res, BaseException) and rid in self.actors and rid not in dying:
                    node = self._node_of(rid)
                    if node is not None and self._node_dead(node):
                        self._lose_node(node)
                        continue
                    self._kill(rid)
                    self._feed(rc.ReplicaCrashed(replica_id=rid, reason=f"health check failed: {res!r}"))

    def _start_recording(self, meta: dict | None, header: bool) -> None:
        import io

        from ..scenarios import Metrics
        from ..trace import TraceWriter

        self._trace_buf = io.StringIO()
        self._trace_read = 0
        self.driver.trace = TraceWriter(self._trace_buf, meta=meta, header=header)
        self.metrics = Metrics()
        if self._observe not in self.driver.observers:
            self.driver.observers.append(self._observe)

    def _observe(self, t: float, event: object, before: rc.State, result: rc.Step) -> None:
        if self.metrics is not None:
            self.metrics(t, event, before, result)

    async def record(self, meta: dict) -> None:
        """Write a trace (docs/trace-format.md) from now on; ``drain_trace`` reads it."""
        await self._ready()
        internal_kv._internal_kv_put(_KV_RECORDING, b"1", overwrite=True)
        self._start_recording({"executor": "ray", **meta}, header=True)

    async def drain_trace(self) -> str:
        """The trace text written since the last call."""
        await self._ready()
        if self.driver.trace is None:
            return ""
        text = self._trace_buf.getvalue()
        new, self._trace_read = text[self._trace_read:], len(text)
        return new

    async def fault(self, type_: str, fields: dict) -> None:
        """Record a fault the scenario runner injected (a ``fault`` trace record)."""
        await self._ready()
        self._write_queued_faults()
        if self.driver.trace is not None:
            self.driver.trace.fault(self._now(), type_, **fields)

    def _write_queued_faults(self) -> set[str]:
        """Write the faults queued (``queue_fault``) while no controller ran, at
        the time each happened; returns the replica ids they name."""
        raw = internal_kv._internal_kv_get(_KV_FAULTS)
        if not raw:
            return set()
        internal_kv._internal_kv_del(_KV_FAULTS)
        named = set()
        now = self._now()
        for type_, fields, when in cloudpickle.loads(raw):
            if fields.get("replica"):
                named.add(fields["replica"])
            if self.driver.trace is not None:
                self.driver.trace.fault(min(now, max(0.0, when - self.t0)), type_, **fields)
        return named

    async def halt(self) -> str:
        """Stop stepping the core and hand back the trace not yet drained: call it
        just before killing the controller (a crash from then on). Nothing the
        controller wrote is lost between the last drain and the kill; answers
        arriving after it are lost, as with any crash."""
        await self._ready()
        self._halted = True
        if self._health_task is not None:
            self._health_task.cancel()
        for task in list(self.tasks):  # starts, stops, watches: left where a crash would leave them
            task.cancel()
        return await self.drain_trace()

    def _metrics_now(self) -> Any:
        from ..scenarios import Metrics

        if self.metrics is None:
            self.metrics = Metrics()
        self.metrics.advance(self._now())
        return self.metrics

    def _check(self, e: Any) -> Any:
        from ..scenarios import check_expectation

        return check_expectation(e, self.driver.state, self._metrics_now(), self._now())

    async def check(self, expectation: Any, settle: float = 30.0) -> dict:
        """Check one expectation now, re-checking for up to ``settle`` seconds
        until it holds (Ray has no virtual clock: "at t" means "by the time the
        timeline got there and things settled"). Returns its trace record."""
        await self._ready()
        deadline = time.monotonic() + settle
        result = self._check(expectation)
        while not result.passed and time.monotonic() < deadline:
            await asyncio.sleep(0.1)
            result = self._check(expectation)
        return result.as_record()

    async def finish_trace(self, expectations: list, earlier: list | None = None) -> tuple[str, list]:
        """Check ``expectations`` now, write the end records (after ``earlier``
        results, from ``check``), stop recording."""
        await self._ready()
        records = list(earlier or []) + [self._check(e).as_record() for e in expectations]
        if self.driver.trace is not None:
            self.driver.trace.end(self._now(), self.driver.state, self._metrics_now().as_dict(), records)
        text = await self.drain_trace()
        self.driver.trace = None
        internal_kv._internal_kv_del(_KV_RECORDING)
        return text, [(r["name"], r["passed"], r["detail"]) for r in records]

    async def _ready(self) -> None:
        """After a restart (Ray restarts this actor), rebuild ranks from the
        replicas' own reports before answering anything."""
        if self._health_task is None:
            self._health_task = asyncio.get_event_loop().create_task(self._health_loop())
        if self._recovered:
            return
        if self._recovering is None:
            self._recovering = asyncio.Lock()
        async with self._recovering:
            if self._recovered:
                return
            raw = internal_kv._internal_kv_get(_KV_SPECS)
            if internal_kv._internal_kv_get(_KV_RECORDING):
                self._start_recording(None, header=False)  # continue the trace after a restart
            named = self._write_queued_faults()  # what happened while no controller ran
            if raw:
                await self._recover(cloudpickle.loads(raw), named)
            self._recovered = True

    async def _recover(self, specs: dict, named: Set[str] = frozenset()) -> None:
        """Rebuild the ranks from the replicas' own reports (ranks are not
        stored). Replicas whose start was under way are adopted with their
        global rank: an actor not yet initialised is reported pending on its
        node (the core initialises it), one whose ``__init__`` runs is reported
        starting (and answered ready when it finishes), and one whose placement
        group was still being made (``known`` stage ``reserving``) is reported
        pending and its start resumed. Only replicas that died are replaced;
        each known one that is gone gets a ``replica_lost`` fault record
        (unless ``named``, the faults queued meanwhile, already name it)."""
        counters = internal_kv._internal_kv_get(_KV_COUNTERS)
        started, lineages = cloudpickle.loads(counters) if counters else (0, 0)
        raw = internal_kv._internal_kv_get(_KV_REPLICAS)
        known: dict[str, dict] = cloudpickle.loads(raw) if raw else {}
        self.specs = {name: {k: v for k, v in spec.items() if k != "applied"} for name, spec in specs.items()}
        self.applied = {name: spec["applied"] for name, spec in specs.items()}
        names = [a["name"] for a in ray.util.list_named_actors(all_namespaces=True)
                 if a.get("namespace") == NAMESPACE and a["name"].startswith("ModelActor:")]

        async def ask_report(name: str) -> tuple:
            try:
                actor = ray.get_actor(name, namespace=NAMESPACE)
                # (an actor still being created answers once it is up)
                return actor, await asyncio.wait_for(actor.report.remote(), timeout=30)
            except Exception:
                return None, None  # died meanwhile: its rank is a gap the core refills

        reports, starting, resume = [], [], []
        for actor, r in await asyncio.gather(*(ask_report(n) for n in sorted(names))):
            if r is None:
                continue
            rid, dep, rank = r["replica_id"], r["deployment"], r["rank"]
            grank = rank[0] if rank is not None else r.get("global_rank")
            if dep not in self.specs or grank is None:
                ray.kill(actor, no_restart=True)  # not ours to adopt: the core would not know it
                continue
            if rank is None:  # created, placed, never initialised: the core initialises it
                phase, claim, config = "pending", grank, rc.UNKNOWN
            else:
                phase, claim = r["phase"], {"rank": rank[0], "node_rank": rank[1], "local_rank": rank[2]}
                config = r["user_config"]
            reports.append(rc.ReplicaReport(
                replica_id=rid, deployment=dep, node_id=r["node_id"], phase=phase, rank=claim,
                world_size=r["world_size"], version=r["version"], user_config=config, lineage=r["lineage"],
            ))
            self.actors[rid] = (dep, actor)
            self.known[rid] = {"deployment": dep, "global_rank": grank, "lineage": r["lineage"],
                               "world_size": r["world_size"], "stage": "created"}
            if phase == "starting":
                starting.append((rid, actor))
            elif phase != "pending":
                self._initialized.add(rid)
        lost = []
        for rid, k in sorted(known.items()):
            if rid in self.actors:
                continue
            if k["stage"] == "reserving" and k["deployment"] in self.specs:
                # its start was under way (no actor yet): adopt it, resume the start
                reports.append(rc.ReplicaReport(
                    replica_id=rid, deployment=k["deployment"], node_id=None, phase="pending",
                    rank=k["global_rank"], world_size=k["world_size"], lineage=k["lineage"]))
                self.known[rid] = dict(k)
                resume.append(rid)
            elif rid not in named:
                lost.append((rid, k["deployment"]))
        self._checkpoint()
        self._adopt_placement_groups(resume)
        self.started, self.lineages = started, lineages
        now = self._now()
        if self.driver.trace is not None:
            for rid, dep in lost:
                self.driver.trace.fault(now, "replica_lost", replica=rid, deployment=dep,
                                        reason="gone when the controller recovered")
            self.driver.trace.fault(now, "controller_recovered", reports=len(reports),
                                    resumed=sorted(resume), lost=[rid for rid, _ in lost])
        # Resumed starts go first (they run once this returns), in rank order,
        # so their placements are reported before those of any new replica.
        for rid in sorted(resume, key=lambda x: (self.known[x]["global_rank"], x)):
            k = self.known[rid]
            self._spawn(self._start(rc.StartReplica(
                replica_id=rid, deployment=k["deployment"], global_rank=k["global_rank"],
                world_size=k["world_size"], lineage=k["lineage"])))
        self._feed(rc.ControllerRecovered(deployments=tuple(self.applied[n] for n in sorted(self.applied)),
                                          reports=tuple(reports), next_replica_number=started,
                                          next_lineage=lineages))
        # Watch only now: a replica that died while the others reported is then
        # a crash the core knows what to do with (before, it would be ignored).
        for rid, (_, actor) in sorted(self.actors.items()):
            self._spawn(self._watch(rid, actor))
        for rid, actor in starting:
            self._spawn(self._await_started(rid, actor))

    async def _await_started(self, rid: str, actor: Any) -> None:
        """A replica reported ``starting`` (its ``__init__`` was running when the
        controller restarted): answer ReplicaReady when it finishes."""
        try:
            await actor.started.remote()
        except Exception as exc:
            if rid in self.actors and rid not in self.stopping:
                self._kill(rid)
                self._feed(rc.ReplicaCrashed(replica_id=rid, reason=f"initialize failed: {exc}"))
            return
        if rid in self.actors:  # (not stopped meanwhile)
            self._initialized.add(rid)
            self._feed(rc.ReplicaReady(replica_id=rid))

    def _adopt_placement_groups(self, resume: list[str] = ()) -> None:  # type: ignore[assignment]
        """Take back the groups of the replicas found alive, and the placed
        groups of the starts to ``resume``; remove the rest (their replica died,
        or was never created, while no controller ran; a resumed start whose
        group is not placed yet makes a new one)."""
        from ray._raylet import PlacementGroupID
        from ray.util.placement_group import PlacementGroup

        mine = {pl.pg_name(dep, rid): (rid, dep) for rid, (dep, _) in self.actors.items()}
        resumed = {pl.pg_name(self.known[rid]["deployment"], rid): (rid, self.known[rid]["deployment"])
                   for rid in resume}
        for pg_id, info in ray.util.placement_group_table().items():
            name = info.get("name") or ""
            if not name.startswith("rankcore:") or info.get("state") == "REMOVED":
                continue
            pg = PlacementGroup(PlacementGroupID(bytes.fromhex(pg_id)))
            rid, dep = cast(tuple[Any, Any], mine.get(name) or (resumed.get(name) if info.get("state") == "CREATED"
                                                                 else None) or (None, None))
            if rid is not None and rid not in self.pgs:
                self.pgs[rid] = pg
                self._reserved[rid] = (dep, pl.per_node(info))
            else:
                try:
                    ray.util.remove_placement_group(pg)
                except Exception:  # gone meanwhile
                    pass

    # ---------------------------------------------------------------- plumbing
    def _now(self) -> float:
        """Seconds since the first controller started (so a trace's time never goes back)."""
        return max(0.0, time.time() - self.t0)

    def _spawn(self, coro: Any) -> None:
        task = asyncio.get_event_loop().create_task(coro)
        self.tasks.add(task)
        task.add_done_callback(self.tasks.discard)

    def _feed(self, event: object) -> None:
        if self._halted:  # about to be killed: what happens from now on is lost with it
            return
        try:
            self.driver.feed(event, self._now())
        except rc.RankcoreError as exc:  # a bug or a race we did not foresee: keep serving, but say so
            self._rejected(event, exc)

    def _rejected(self, event: object, exc: Exception) -> None:
        """The core refused an event: recorded in the trace (a ``rejected``
        record), logged with the event, and counted (``status()``)."""
        self.errors.append(f"{event!r}: {exc}")
        log.error("the core rejected %r: %s: %s", event, type(exc).__name__, exc)
        if self.driver.trace is not None:
            self.driver.trace.rejected(self._now(), event, exc)

    # ----------------------------------------------------------- commands
    async def _start(self, cmd: rc.StartReplica) -> None:
        n = rc.state.parse_replica_number(cmd.replica_id)
        self.started = max(self.started, (n or 0) + 1)
        self.lineages = max(self.lineages, (cmd.lineage or 0) + 1)
        self._persist()
        rid, dep = cmd.replica_id, cmd.deployment
        spec = self.specs[dep]
        self.known[rid] = {"deployment": dep, "global_rank": cmd.global_rank, "lineage": cmd.lineage,
                           "world_size": cmd.world_size, "stage": "reserving"}
        self._checkpoint()
        queue = self._placing.setdefault(dep, [])
        queue.append(rid)
        bundles = pl.replica_bundles(spec["actor_options"], spec.get("bundles"))
        opts = dict(spec["actor_options"])
        if bundles:
            task = asyncio.current_task()
            assert task is not None  # we are in one
            self._waiting_pg[rid] = task
            try:
                pg = self.pgs.get(rid)  # a resumed start whose group the old controller placed
                if pg is None:
                    pg = await self._reserve(rid, dep, bundles, spec)  # _stop cancels this if the replica goes first
            except Exception as exc:
                self._forget(rid)
                if rid in queue:
                    queue.remove(rid)
                self._feed(rc.ReplicaCrashed(replica_id=rid, reason=f"placement group failed: {exc}"))
                self._flush_placements(dep)
                return
            finally:
                self._waiting_pg.pop(rid, None)
            if rid in self.stopping:
                self._release_pg(rid)
                return
            from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

            opts = pl.actor_options_in_group(opts, bundles)
            opts["scheduling_strategy"] = PlacementGroupSchedulingStrategy(
                placement_group=pg, placement_group_bundle_index=0, placement_group_capture_child_tasks=True)
        if rid in self.known:  # from now on, a missing actor means a dead replica
            self.known[rid]["stage"] = "created"
            self._checkpoint()
        try:
            # An async actor: requests wait on a semaphore of max_ongoing_requests
            # inside it, so Ray's own limit only needs to leave room for them and
            # the controller's calls.
            actor: Any = ray.remote(ReplicaActor).options(
                name=actor_name(dep, rid), namespace=NAMESPACE, lifetime="detached",
                max_restarts=0, max_concurrency=max(1000, 2 * spec["max_ongoing_requests"] + 16), **opts,
            ).remote(dep, rid, spec["cls"], spec["args"], spec["kwargs"], cmd.lineage, cmd.global_rank,
                     cmd.world_size, spec["max_ongoing_requests"])
            self.actors[rid] = (dep, actor)
            node = await actor.node_id.remote()
        except Exception as exc:  # refused by Ray, or died starting
            self._forget(rid)
            if rid in queue:
                queue.remove(rid)
            if rid not in self.stopping:
                self._feed(rc.ReplicaCrashed(replica_id=rid, reason=f"failed to start: {exc}"))
            self._flush_placements(dep)
            return
        if rid in self.stopping:  # stopped while its actor started: _stop killed it
            self._release_pg(rid)
            return
        self._spawn(self._watch(rid, actor))
        self._placed_on[rid] = node
        self._flush_placements(dep)

    async def _reserve(self, rid: str, dep: str, bundles: list, spec: dict) -> Any:
        """Create the replica's placement group and wait until it is placed.

        A single-node group is pinned (by the ``ray.io/node-id`` label) to the
        node ``choose_node`` picks, so placement follows the rule exactly; if
        it is not placed within ``pin_wait_s`` (someone else took the room, or
        the node died), it is recreated unpinned for Ray to place anywhere.
        With no node having room now, it is unpinned from the start and waits.
        """
        strategy = spec.get("pg_strategy", "PACK")
        single = len(bundles) == 1 or strategy == "STRICT_PACK"
        total = pl.bundle_sum(bundles)
        target = None
        if single:
            strategy = "STRICT_PACK"  # the same thing for one bundle
            target = self._choose_node(dep, total, spec.get("placement", "spread"), rid)
        name = pl.pg_name(dep, rid)
        if target is not None:
            pg = ray.util.placement_group(bundles, strategy=strategy, name=name, lifetime="detached",
                                          bundle_label_selector=[{"ray.io/node-id": target}] * len(bundles))
            self.pgs[rid] = pg
            self._reserved[rid] = (dep, {target: total})
            self._pinning.add(rid)
            try:
                await asyncio.wait_for(pg.ready(), timeout=self.pin_wait_s)
                return pg
            except asyncio.TimeoutError:
                self._release_pg(rid)
            finally:
                self._pinning.discard(rid)
        # First come, first served: a group Ray may place anywhere must not
        # overtake the pinned ones started before it (they fit by our count;
        # each is placed or unpinned within pin_wait_s).
        while self._pinning:
            await asyncio.sleep(0.05)
        pg = ray.util.placement_group(bundles, strategy=strategy, name=name, lifetime="detached")
        self.pgs[rid] = pg
        await pg.ready()
        try:
            info = ray.util.placement_group_table(pg)
        except Exception:
            info = {}
        self._reserved[rid] = (dep, pl.per_node(info))
        return pg

    def _nodes(self) -> list[pl.NodeView]:
        out = []
        for n in sorted(ray.nodes(), key=lambda n: n["NodeID"]):
            if not n.get("Alive"):
                continue
            nid = n["NodeID"]
            self._node_seen.setdefault(nid, len(self._node_seen))
            out.append(pl.NodeView(nid, pl.node_order(n.get("Labels") or {}, self._node_seen[nid], nid),
                                   n.get("Resources") or {}))
        return out

    def _choose_node(self, deployment: str, need: dict, placement: str, rid: str | None = None) -> str | None:
        """The node to pin a new replica's group to (None: let Ray choose), by
        ``rankcore.placement.choose_node``, the simulator's rule too."""
        try:
            nodes = self._nodes()
        except Exception:  # GCS hiccup: Ray places it
            return None
        reserved: dict[str, dict] = {}
        counts: dict[str, int] = {}
        for dep, per_node in self._reserved.values():
            for node, res in per_node.items():
                held = reserved.setdefault(node, {})
                for k, v in res.items():
                    held[k] = held.get(k, 0.0) + v
                if dep == deployment:
                    counts[node] = counts.get(node, 0) + 1
        views = [rc.placement.NodeView(
            node_id=n.node_id, order=n.order, replicas=counts.get(n.node_id, 0),
            free={k: n.total.get(k, 0.0) - reserved.get(n.node_id, {}).get(k, 0.0)
                  for k in set(n.total) | set(need)}) for n in nodes]
        rank = rank_nodes = None
        if placement == "rank_packed" and rid is not None and rid in self.known:
            rank = self.known[rid]["global_rank"]
            rank_nodes = {k["global_rank"]: self._placed_on[r] for r, k in self.known.items()
                          if k["deployment"] == deployment and r in self._placed_on and r != rid}
        now = time.monotonic()
        fresh = {n for n, t in self._suspects.items() if now - t < self.suspect_s}
        healthy = [v for v in views if v.node_id not in fresh]
        choose = rc.placement.choose_node
        return (choose(healthy, need, placement, rank=rank, rank_nodes=rank_nodes)
                or choose(views, need, placement, rank=rank, rank_nodes=rank_nodes))

    def _release_pg(self, rid: str) -> None:
        self._reserved.pop(rid, None)
        pg = self.pgs.pop(rid, None)
        if pg is not None:
            try:
                ray.util.remove_placement_group(pg)
            except Exception:  # already gone
                pass

    def _flush_placements(self, deployment: str) -> None:
        """Report placements in the order the replicas were started (global-rank
        order), so each node's local ranks follow the global ranks: a downscale
        that stops the highest ranks then leaves no local-rank holes to compact.
        A replica still waiting for capacity holds nobody back."""
        queue = self._placing.get(deployment, [])
        for rid in list(queue):
            if rid in self._waiting_pg:
                continue
            if rid not in self.actors:  # died or stopped meanwhile
                queue.remove(rid)
                self._placed_on.pop(rid, None)
                continue
            node = self._placed_on.pop(rid, None)
            if node is None:
                return  # starting: the ones after it wait their turn
            queue.remove(rid)
            self._feed(rc.ReplicaPlaced(replica_id=rid, node_id=node))

    async def _watch(self, rid: str, actor: Any) -> None:
        error: BaseException | None = None
        try:
            await actor.watch.remote()
        except Exception as exc:
            error = exc
        if rid in self.stopping:
            return
        node = self._node_of(rid) or self._placed_on.get(rid)
        if node is None:
            self._crashed(rid, "actor died")
            return
        if "ray.kill" not in str(error):  # died on its own: the node may be going
            self._suspects[node] = time.monotonic()
        batch = self._dying.setdefault(node, [])
        batch.append(rid)
        if len(batch) == 1:
            self._spawn(self._deaths_on(node))

    async def _deaths_on(self, node: str) -> None:
        """Deaths on one node within ``death_batch_s`` are handled together: one
        ``NodeLost`` if Ray already declared the node dead, else a crash each in
        rank order, so replacements start in rank order (as in the simulator)
        whatever order Ray reported the deaths in."""
        await asyncio.sleep(self.death_batch_s)
        rids = self._dying.pop(node, [])
        if self._node_dead(node):
            self._lose_node(node)
        state = self.driver.state

        def rank(rid: str) -> tuple:
            dep = state.deployments.get(state.index.get(rid, ""))
            return (dep.ranks.global_rank(rid) if dep is not None and rid in dep.ranks else 1 << 30, rid)

        for rid in sorted(rids, key=rank):
            if rid not in self.stopping:
                self._crashed(rid, "actor died")

    def _forget(self, rid: str) -> tuple | None:
        """Drop what the controller holds for a replica that is gone or going
        (its actor handle, its group); returns its (deployment, actor) if known."""
        entry = self.actors.pop(rid, None)
        self._initialized.discard(rid)
        self._placed_on.pop(rid, None)
        self._release_pg(rid)
        if self.known.pop(rid, None) is not None:
            self._checkpoint()
        return entry

    def _crashed(self, rid: str, reason: str) -> None:
        entry = self._forget(rid)
        self._feed(rc.ReplicaCrashed(replica_id=rid, reason=reason))
        if entry is not None:
            self._flush_placements(entry[0])

    def _node_of(self, rid: str) -> str | None:
        dep = self.driver.state.deployments.get(self.driver.state.index.get(rid, ""))
        rep = dep.replicas.get(rid) if dep is not None else None
        return rep.node_id if rep is not None else None

    @staticmethod
    def _node_dead(node_id: str) -> bool:
        try:
            return any(n["NodeID"] == node_id and not n.get("Alive") for n in ray.nodes())
        except Exception:  # GCS hiccup: treat it as one replica's death
            return False

    def _lose_node(self, node_id: str) -> None:
        """A node died: one ``NodeLost`` for all its replicas (the core replaces
        them in rank order, as the simulator does) instead of a crash each in
        whatever order Ray reports the deaths."""
        deps, unreported = set(), []
        for rid, (dep, _) in sorted(self.actors.items()):
            known = self._node_of(rid) == node_id
            if known or self._placed_on.get(rid) == node_id:
                self.stopping.add(rid)  # their own watch calls fail too: already handled
                self._forget(rid)
                deps.add(dep)
                if not known:  # started there, placement not reported yet: a crash of its own
                    unreported.append(rid)
        self._feed(rc.NodeLost(node_id=node_id))
        for rid in unreported:
            self._feed(rc.ReplicaCrashed(replica_id=rid, reason=f"node {node_id} died"))
        for dep in sorted(deps):
            self._flush_placements(dep)

    def _kill(self, rid: str) -> None:
        entry = self._forget(rid)
        if entry is not None:
            self.stopping.add(rid)
            ray.kill(entry[1], no_restart=True)

    def _next_seq(self) -> tuple[int, int]:
        self._seq += 1
        return (self.incarnation, self._seq)

    async def _initialize(self, cmd: rc.InitializeReplica, seq: tuple[int, int] | None = None) -> None:
        entry = self.actors.get(cmd.replica_id)
        if entry is None:
            return
        try:
            await entry[1].initialize.remote(cmd.rank.as_tuple(), cmd.world_size, cmd.user_config,
                                             cmd.call_reconfigure, cmd.pass_rank, seq)
        except Exception as exc:
            self._kill(cmd.replica_id)
            self._feed(rc.ReplicaCrashed(replica_id=cmd.replica_id, reason=f"initialize failed: {exc}"))
            return
        if cmd.replica_id in self.actors:  # (not stopped meanwhile)
            self._initialized.add(cmd.replica_id)
        self._feed(rc.ReplicaReady(replica_id=cmd.replica_id))

    async def _reconfigure(self, cmd: rc.ReconfigureReplica, seq: tuple[int, int] | None = None) -> None:
        entry = self.actors.get(cmd.replica_id)
        if entry is None:
            return
        try:
            await entry[1].reconfigure.remote(cmd.rank.as_tuple(), cmd.world_size, cmd.user_config, cmd.version,
                                              cmd.call_user, cmd.pass_rank, seq)
        except Exception as exc:
            self._kill(cmd.replica_id)
            self._feed(rc.ReplicaCrashed(replica_id=cmd.replica_id, reason=f"reconfigure failed: {exc}"))
            return
        self._feed(rc.ReplicaReconfigured(replica_id=cmd.replica_id, version=cmd.version))

    async def _stop(self, cmd: rc.StopReplica) -> None:
        """Drain a replica that may hold calls, then kill it and free its group.
        One still waiting for its group or its start holds none: it goes at once."""
        rid = cmd.replica_id
        self.stopping.add(rid)
        entry = self.actors.pop(rid, None)
        waiting = self._waiting_pg.pop(rid, None)
        if waiting is not None:  # no actor yet: stop waiting for capacity
            waiting.cancel()
        if entry is not None:
            if rid in self._initialized:
                try:
                    await asyncio.wait_for(entry[1].prepare_stop.remote(), timeout=40)
                except Exception:
                    pass
            ray.kill(entry[1], no_restart=True)
        self._forget(rid)
        self._feed(rc.ReplicaStopped(replica_id=rid))
        self._flush_placements(cmd.deployment)

    # ------------------------------------------------------------------ API
    async def apply(self, name: str, num_replicas: int, user_config: Any, cls: type, args: tuple, kwargs: dict,
                    actor_options: dict, max_ongoing_requests: int, placement: dict | None = None,
                    max_replicas: int = rc.DEFAULT_MAX_REPLICAS) -> None:
        """Deploy or update ``name``. ``placement``: ``placement_group_bundles``,
        ``placement_group_strategy``, ``replica_placement`` (see api.deployment).
        A bad option or request raises to the caller (``InvalidConfig``,
        ``InvalidEvent``) and changes nothing."""
        placement = dict(placement or {})
        bundles = placement.get("placement_group_bundles")
        pg_strategy = placement.get("placement_group_strategy", "PACK")
        spread = placement.get("replica_placement", "spread")
        pl.validate(actor_options, bundles, pg_strategy, spread)
        reconfigure = getattr(cls, "reconfigure", None)
        has_reconfigure = callable(reconfigure)
        takes_rank = False
        if callable(reconfigure):
            import inspect

            takes_rank = "rank" in inspect.signature(reconfigure).parameters
        event = rc.DeploymentApplied(name=name, num_replicas=num_replicas, user_config=user_config,
                                     has_reconfigure=has_reconfigure, reconfigure_takes_rank=takes_rank,
                                     max_replicas=max_replicas)
        await self._ready()
        before = self.specs.get(name), self.applied.get(name)
        self.specs[name] = {"cls": cls, "args": args, "kwargs": kwargs, "actor_options": actor_options,
                            "max_ongoing_requests": max_ongoing_requests, "bundles": bundles,
                            "pg_strategy": pg_strategy, "placement": spread}
        self.applied[name] = event
        try:
            self.driver.feed(event, self._now())
        except Exception:
            tables: tuple[dict[str, Any], dict[str, Any]] = (self.specs, self.applied)
            for table, old in zip(tables, before):
                if old is None:
                    table.pop(name, None)
                else:
                    table[name] = old
            raise
        self._persist()

    async def scale(self, name: str, num_replicas: int, victims: tuple = ()) -> None:
        """Scale ``name`` in place. A bad request (a count above max_replicas, an
        unknown victim) raises to the caller and changes nothing."""
        await self._ready()
        if name not in self.applied:
            raise rc.InvalidEvent(f"unknown deployment {name!r}")
        applied = attrs.evolve(self.applied[name], num_replicas=num_replicas)
        event = rc.ScaleRequested(deployment=name, num_replicas=num_replicas, victims=victims)
        self.driver.feed(event, self._now())
        self.applied[name] = applied
        self._persist()

    async def wait_healthy(self, name: str, timeout: float = 120.0) -> bool:
        await self._ready()
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            dep = self.driver.state.deployments.get(name)
            if dep is not None and dep.healthy:
                return True
            await asyncio.sleep(0.05)
        return False

    async def endpoints(self, name: str) -> tuple[list, int]:
        """Serving replicas (id, actor handle) and max_ongoing_requests."""
        await self._ready()
        dep = self.driver.state.deployments.get(name)
        if dep is None:
            return [], 0
        out = []
        for rid, rep in sorted(dep.replicas.items()):
            if rep.phase in (rc.Phase.RUNNING, rc.Phase.RECONFIGURING) and rid in self.actors:
                out.append((rid, self.actors[rid][1]))
        return out, self.specs[name]["max_ongoing_requests"]

    async def ranks(self, name: str) -> dict:
        await self._ready()
        dep = self.driver.state.deployments.get(name)
        if dep is None:
            return {}
        # a replica not placed yet holds its global rank only: (rank, None, None)
        return {rid: (rk.as_tuple() if rk else (dep.ranks.global_rank(rid), None, None))
                for rid, rk in dep.ranks.items()}

    async def state(self) -> bytes:
        """The core's state now, pickled (``cloudpickle.loads`` it). Pickled here,
        on the event loop: Ray serialises return values on another thread, and
        a State's tables must not be read from two threads at once."""
        await self._ready()
        return cloudpickle.dumps(self.driver.state)

    async def state_errors(self) -> list[str]:
        """The events the core rejected, ``"repr(event): error"`` (see ``status``)."""
        return list(self.errors)

    async def status(self) -> dict:
        """What the controller is doing: ``rejected_events`` counts the events
        the core refused (each also a ``rejected`` trace record and an error in
        the controller's log; a normal run has none), ``rejected`` lists them."""
        import os

        await self._ready()
        return {"rejected_events": len(self.errors), "rejected": list(self.errors),
                "replicas": len(self.actors), "recording": self.driver.trace is not None, "pid": os.getpid()}

    async def feed_event(self, event: object) -> bool:
        """Feed ``event`` to the core as if the cluster had reported it (tools and
        tests). A rejected event is recorded, logged and counted like any
        other; returns whether it was accepted."""
        await self._ready()
        errors = len(self.errors)
        self._feed(event)
        return len(self.errors) == errors

    async def reset(self, timeout: float = 60.0) -> None:
        """Stop every replica and forget everything (deployments, ids, trace):
        the next run starts as on a new cluster."""
        await self.shutdown_replicas(timeout)
        for task in list(self.tasks):
            task.cancel()
        await asyncio.sleep(0)
        self.tasks.clear()
        self.actors.clear()
        self.stopping.clear()
        self._placing.clear()
        self._placed_on.clear()
        self._waiting_pg.clear()
        self._pinning.clear()
        self._dying.clear()
        self._suspects.clear()
        self._initialized.clear()
        for rid in list(self.pgs):
            self._release_pg(rid)
        self._adopt_placement_groups()  # (none adopted: no actors) removes any left from before
        self.specs.clear()
        self.applied.clear()
        self.known.clear()
        self.started = self.lineages = 0
        self.errors.clear()
        self._halted = False
        self.driver.state = rc.State()
        self.driver.trace = None
        self.metrics = None
        for key in (_KV_SPECS, _KV_COUNTERS, _KV_RECORDING, _KV_EPOCH, _KV_REPLICAS, _KV_FAULTS):
            internal_kv._internal_kv_del(key)
        self.t0 = time.time()
        internal_kv._internal_kv_put(_KV_EPOCH, repr(self.t0).encode())

    async def shutdown_replicas(self, timeout: float = 60.0) -> None:
        """Scale every deployment to 0 through the core and wait for the stops."""
        await self._ready()
        for name in self.applied:
            self.applied[name] = attrs.evolve(self.applied[name], num_replicas=0)
        self._persist()
        for name in sorted(self.driver.state.deployments.keys()):
            if self.driver.state.deployments[name].target:
                self._feed(rc.ScaleRequested(deployment=name, num_replicas=0))
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline and any(d.replicas for d in self.driver.state.deployments.values()):
            await asyncio.sleep(0.05)
        for rid in list(self.actors):  # anything left behind
            self._kill(rid)
