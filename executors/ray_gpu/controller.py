"""The controller: a named, detached, restartable Ray actor running the core.

It carries out rankcore's commands on real replica actors (named
``ModelActor:<deployment>:<replica_id>``) and turns what Ray reports into
core events, through the same ``Driver`` as the simulator. Every Ray call is
awaited in its own asyncio task; the core is stepped only from the actor's
event loop, so there is no locking.

The core decides placement: the controller tells it the cluster's nodes
(``NodeJoined`` / ``NodeCapacityChanged`` / ``NodeLost``, from ``ray.nodes()``)
and the time (``Tick``), and carries each ``PlaceReplica`` out on exactly the
node it names, answering ``ReplicaPlaced`` or ``PlacementFailed``. It chooses
no node and orders nothing itself.

A static deployment (``StaticPlacementConfig``) runs on the caller's placement
group: each ``PlaceReplica`` names the group and the rank's bundles, and the
replica actor is created in the first of them (no group of rankcore's). The
controller tells the core where the group's bundles are (``DeploymentApplied``
at first, ``BundlesPlaced`` when Ray moved them) and never creates, resizes
or removes that group.
"""

from __future__ import annotations

import asyncio
import logging
import os
import time
from collections.abc import Set
from typing import Any

import attrs
import ray
from ray import cloudpickle
from ray.experimental import internal_kv

import rankcore as rc

from ..driver import Driver
from . import placement as pl
from . import static as st
from .replica import ReplicaActor
from .spares import SparePool

NAMESPACE = "rankcore"
CONTROLLER_NAME = "rankcore-controller"
_KV_SPECS = b"rankcore/specs"  # what was applied, to recover after a restart (ranks are not stored)
_KV_COUNTERS = b"rankcore/counters"  # id and lineage high-water marks, so no id is reused
_KV_RECORDING = b"rankcore/recording"  # a trace is being recorded (survives a restart)
_KV_EPOCH = b"rankcore/epoch"  # wall-clock origin of trace time, shared by every controller incarnation
_KV_INCARNATION = b"rankcore/incarnation"  # how many controllers have started (orders their commands)
#: every replica the controller started and has not forgotten, with how far its
#: start got (Ray Serve checkpoints its replica list too): a restarted controller
#: adopts the starts under way and knows which replicas died while it was down
_KV_REPLICAS = b"rankcore/replicas"
_KV_FAULTS = b"rankcore/faults"  # faults injected while no controller ran, for the trace
#: Fault injection only (the scenario runner's ``unreported_gpus``): a placement group
#: whose name starts so is left out of ``held_by_callers``, so its node offers the core
#: GPUs the group holds; the core believes in room that is not there, and a placement
#: it aims there waits for room until its placement timeout. Never name a real group so.
UNSEEN_GROUP_PREFIX = "rankcore-fault-unseen:"
#: the deployment options ``apply`` passes to ``DeploymentApplied`` (``@deployment(...)``'s)
CORE_OPTIONS: tuple[str, ...] = (*rc.options.OPTION_NAMES, "start_timeout_s")

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


def held_by_callers(table: dict) -> dict[str, dict[str, float]]:
    """Node id -> resources the bundles of placement groups rankcore did not
    make hold there (``ray.util.placement_group_table()``: a trainer's group,
    a static deployment's caller's group). A removed group, or a bundle not
    placed, holds nothing. rankcore's own groups (``rankcore:<deployment>:<id>``)
    are left out: the core booked them itself; so are the fault-injection groups
    (``UNSEEN_GROUP_PREFIX``), which hold what the core must not be told about."""
    held: dict[str, dict[str, float]] = {}
    for info in table.values():
        if (info.get("name") or "").startswith(("rankcore:", UNSEEN_GROUP_PREFIX)) or info.get("state") == "REMOVED":
            continue
        where = info.get("bundles_to_node_id") or {}
        for index, bundle in (info.get("bundles") or {}).items():
            node = where.get(index)
            if node:
                mine = held.setdefault(node, {})
                for res, amount in bundle.items():
                    mine[res] = mine.get(res, 0.0) + float(amount)
    return held


def _less(total: dict[str, float], held: dict[str, float]) -> dict[str, float]:
    return {res: max(0.0, amount - held.get(res, 0.0)) for res, amount in total.items()}


async def _after(prev: asyncio.Task, coro: Any) -> Any:
    """Await ``coro`` once ``prev`` has finished, whatever became of it."""
    try:
        if not prev.done():
            await asyncio.wait([prev])
    except asyncio.CancelledError:
        coro.close()
        raise
    return await coro


def _group_refused(pg: Any, node: str) -> str | None:
    """Why Ray will not place ``pg`` (removed, or infeasible: no node it may go
    to could ever hold it), or None while it may still be placed."""
    try:
        info = ray.util.placement_group_table(pg)
    except Exception:  # GCS hiccup: look again next time
        return None
    if not info or info.get("state") == "REMOVED":
        return "placement group removed"
    if (info.get("stats") or {}).get("scheduling_state") == "INFEASIBLE":
        return f"placement group infeasible on node {node}"
    return None


def _actor_info(actor: Any) -> dict | None:
    """Ray's record of an actor (``ray._private.state.actors``), or None."""
    try:
        from ray._private.state import actors

        info = actors(actor_id=actor._actor_id.hex())
        return info if isinstance(info, dict) and info else None
    except Exception:
        return None


#: ActorDiedErrorContext.Reason -> ReplicaCrashed.cause
_DIED_REASON = {"RAY_KILL": "killed", "NODE_DIED": "node_lost"}


_replica_class: Any = None


def replica_class() -> Any:
    """``ray.remote(ReplicaActor)``, made once per process: a new one for each
    replica exported the class again at every start (~30 ms of the controller's
    loop, on the way from a crash to its replacement)."""
    global _replica_class
    if _replica_class is None:
        _replica_class = ray.remote(ReplicaActor)
    return _replica_class


def _death_cause(error: BaseException | None, actor: Any) -> str:
    """``ReplicaCrashed.cause`` of a replica actor that died (the controller
    did not kill it), from structured facts: the error's own flags (its
    creation raised: ``error``; its node was drained/preempted: ``node_lost``)
    and Ray's death record of the actor (``DeathCause``: killed by
    ``ray.kill`` or the OOM killer: ``killed``; its node died: ``node_lost``;
    its process exited otherwise: ``exited``)."""
    if error is not None and getattr(error, "preempted", False):
        return "node_lost"
    if error is not None and getattr(error, "actor_init_failed", False):
        return "error"
    info = _actor_info(actor) if actor is not None else None
    death = (info or {}).get("DeathCause")
    if death is None:
        return "exited" if error is not None else "unknown"
    try:
        if death.HasField("oom_context"):
            return "killed"
        if death.HasField("creation_task_failure_context"):
            return "error"
        if death.HasField("actor_died_error_context"):
            ctx = death.actor_died_error_context
            reason = type(ctx).Reason.Name(ctx.reason)
            return _DIED_REASON.get(reason, "exited")
    except Exception:  # a record of another shape: what was seen is a process gone
        pass
    return "exited"


class _Backend:
    def __init__(self, ctl: Controller) -> None:
        self.ctl = ctl

    def execute(self, commands: Any, t: float) -> None:
        """Carry commands out, in the order the core emitted them. The commands
        about one replica run one after another (``Controller._in_order``: each
        starts once the one before it has finished), so a replica sees them in
        the core's order; those about different replicas run side by side. A
        ``StopReplica`` does not wait: it cancels what is under way for its
        replica (a placement waiting for its group, an ``__init__`` awaited)
        and, with ``graceful_shutdown_timeout_s=0``, kills the process here,
        before the step's next command (its room then really is free for the
        replacement the same step places). Each command that carries a world
        size gets a sequence number here ((controller incarnation, n): a later
        controller's are larger): ``UpdateWorldSize`` goes to every replica at
        once, so a replica keeps the world size of the newest it has seen."""
        c = self.ctl
        for cmd in commands:
            if isinstance(cmd, rc.StartReplica):
                c._start(cmd)
            elif isinstance(cmd, rc.PlaceReplica):
                c._in_order(cmd.replica_id, c._place(cmd))
            elif isinstance(cmd, rc.ScheduleTick):
                c._schedule_tick(cmd.at)
            elif isinstance(cmd, rc.InitializeReplica):
                c._in_order(cmd.replica_id, c._initialize(cmd, c._next_seq()))
            elif isinstance(cmd, rc.ReconfigureReplica):
                c._in_order(cmd.replica_id, c._reconfigure(cmd, c._next_seq()))
            elif isinstance(cmd, rc.StopReplica):
                c._stop_now(cmd)
            elif isinstance(cmd, rc.GangChanged):
                c._gang_changed(cmd)
            elif isinstance(cmd, rc.KeepSpareProcesses):
                c._keep_spares(cmd)
            elif isinstance(cmd, rc.UpdateWorldSize):
                seq = c._next_seq()
                for _rid, (dep, actor) in list(c.actors.items()):
                    if dep == cmd.deployment:
                        actor.update_world_size.remote(cmd.world_size, seq)


class Controller:
    # Observation details only (docs/architecture.md, "what is left in
    # executors/"): how often and how long the controller looks at Ray. Every
    # decision (health, timeouts, backoff, drains) comes from the core's commands.
    #: seconds between two readings of Ray's node table (joined, changed, lost nodes)
    node_poll_s = 2.0
    #: deaths on one node this close together are observed together: if Ray has
    #: declared the node dead by then, they are one NodeLost
    death_batch_s = 0.25
    #: seconds between two readings of a pending placement group's state (a group
    #: Ray reports infeasible or removed is a refusal: ``PlacementFailed``)
    group_poll_s = 0.5
    #: how long a recovering controller waits for a replica's report; one that has
    #: not answered by then is reported unresponsive (``RANKCORE_REPORT_TIMEOUT_S``)
    report_timeout_s = float(os.environ.get("RANKCORE_REPORT_TIMEOUT_S", "30"))

    def __init__(self) -> None:
        raw = internal_kv._internal_kv_get(_KV_EPOCH)
        self.t0 = float(raw) if raw else time.time()
        if not raw:
            internal_kv._internal_kv_put(_KV_EPOCH, repr(self.t0).encode())
        raw = internal_kv._internal_kv_get(_KV_INCARNATION)
        self.incarnation = int(raw) + 1 if raw else 1
        internal_kv._internal_kv_put(_KV_INCARNATION, str(self.incarnation).encode(), overwrite=True)
        self._seq = 0
        self.driver = Driver(_Backend(self), clock=True)
        #: set (then dropped) at every step of the core: wakes the handles' long polls (``endpoints_after``)
        self._stepped: asyncio.Event | None = None
        self.driver.observers.append(self._wake_long_polls)
        #: deployment -> what the core does not hold: the class, its arguments, actor options
        #: (the deployments' specs are the core's: ``rc.desired_specs``, persisted by ``_persist``)
        self.specs: dict[str, dict] = {}
        self.actors: dict[str, tuple[str, Any]] = {}  # replica id -> (deployment, handle)
        self.stopping: set[str] = set()
        #: replicas this controller killed itself (a stop, a start that failed): their
        #: deaths are not news (other deaths are classified from Ray's death cause)
        self._killed: set[str] = set()
        #: replica id -> its commands' tasks not yet finished, in order (``_in_order``)
        self._chains: dict[str, list[asyncio.Task]] = {}
        #: replica id -> its health checks (started once it is ready)
        self._checks: dict[str, asyncio.Task] = {}
        #: replica id -> (period, timeout) of its health checks, from its InitializeReplica
        self._check_every: dict[str, tuple[float, float]] = {}
        #: replica id -> (node, task): a PlaceReplica under way, until ReplicaPlaced or PlacementFailed is fed
        self._placing: dict[str, tuple[str, asyncio.Task]] = {}
        self._initialized: set[str] = set()  # initialize() returned: may hold calls, so drained on stop
        self.pgs: dict[str, Any] = {}  # replica id -> its placement group
        #: idle worker processes kept per node (KeepSpareProcesses)
        self.spares = SparePool()
        self._spares_checked = time.monotonic()
        #: node -> [(replica, cause)] whose deaths are being observed together
        self._dying: dict[str, list[tuple[str, str]]] = {}
        #: node id -> its total resources, as the core was last told (NodeJoined / NodeCapacityChanged)
        self._nodes: dict[str, tuple] = {}
        self._timers: dict[float, asyncio.TimerHandle] = {}  # ScheduleTick's time -> its timer
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
        self._cluster_task: asyncio.Task | None = None
        self.metrics: Any = None

    # ------------------------------------------------------------- recovery
    def _persist(self) -> None:
        """Store what a restarted controller recovers from: the deployments as the
        core means them now (``rc.desired_specs``, the one copy of the specs: a
        scale is folded in) and, per deployment, what the core does not hold (its
        class, arguments and actor options)."""
        desired = {d.name: d for d in rc.desired_specs(self.driver.state)}
        specs = {name: {**spec, "applied": desired[name]} for name, spec in self.specs.items() if name in desired}
        internal_kv._internal_kv_put(_KV_SPECS, cloudpickle.dumps(specs), overwrite=True)
        self._persist_counters()

    def _persist_counters(self) -> None:
        internal_kv._internal_kv_put(_KV_COUNTERS, cloudpickle.dumps((self.started, self.lineages)), overwrite=True)

    def _checkpoint(self) -> None:
        internal_kv._internal_kv_put(_KV_REPLICAS, cloudpickle.dumps(self.known), overwrite=True)

    async def _cluster_loop(self) -> None:
        """Every ``node_poll_s``: tell the core the cluster's nodes (joined,
        changed, lost), where static deployments' bundles are, and the time.
        (Health checks are per replica: ``_health_checks``.)"""
        while True:
            await asyncio.sleep(self.node_poll_s)
            if not self._recovered or self._halted:
                continue
            if self._nodes:  # (after a reset, the next apply() tells the core the nodes first)
                try:
                    self._sync_nodes()
                    self._sync_bundles()
                except Exception as exc:  # GCS hiccup: next pass
                    log.warning("could not read the cluster's nodes: %r", exc)
            self._feed(rc.Tick(now=self._now()))
            now = time.monotonic()
            if now >= self._spares_checked + self.spares.check_s:
                self._spares_checked = now
                for node in list(self.spares.wanted):
                    self._top_up_spares(node)

    def _start_checks(self, rid: str, actor: Any) -> None:
        """A replica is ready: check its health from now on, at the period and
        with the timeout its InitializeReplica carried (a replica adopted by a
        recovery: its deployment's)."""
        if rid in self._checks or rid not in self.actors:
            return
        every = self._check_every.get(rid)
        if every is None:
            dep = self.driver.state.deployments.get(self.driver.state.index.get(rid, ""))
            o = dep.options if dep is not None else rc.Options()
            every = (o.health_check_period_s, o.health_check_timeout_s)
        task = asyncio.get_event_loop().create_task(self._health_checks(rid, actor, *every))
        self._checks[rid] = task

        def done(t: asyncio.Task) -> None:
            if self._checks.get(rid) is t:
                del self._checks[rid]

        task.add_done_callback(done)

    async def _health_checks(self, rid: str, actor: Any, period: float, timeout: float) -> None:
        """Every ``period`` s, ping the replica (its ``check_health`` if it has
        one), waiting up to ``timeout`` s, and report the outcome to the core:
        ``HealthChecked``, healthy or not (raised: the error; no answer in time:
        "timed out"). The core counts and decides; the controller carries its
        ``StopReplica`` out. A dead actor is not a failed check: its death is
        reported by its watch (``ReplicaCrashed``)."""
        from ray.exceptions import RayActorError

        while True:
            await asyncio.sleep(period)
            if self._halted or rid not in self.actors or rid in self.stopping:
                return
            try:
                await asyncio.wait_for(actor.ping.remote(), timeout)
                healthy, detail = True, ""
            except asyncio.TimeoutError:
                healthy, detail = False, "timed out"
            except RayActorError:
                return  # died: the watch reports it
            except Exception as exc:
                healthy, detail = False, f"check_health raised: {getattr(exc, 'cause', None) or exc!r}"[:500]
            if self._halted or rid not in self.actors or rid in self.stopping:
                return
            self._feed(rc.HealthChecked(replica_id=rid, healthy=healthy, detail=detail))

    def _start_recording(self, meta: dict | None, header: bool, snapshot_every: int = 1) -> None:
        import io

        from ..scenarios import Metrics
        from ..trace import TraceWriter

        self._trace_buf = io.StringIO()
        self._trace_read = 0
        self.driver.trace = TraceWriter(self._trace_buf, meta=meta, header=header, snapshot_every=snapshot_every)
        self.metrics = Metrics()
        if self._observe not in self.driver.observers:
            self.driver.observers.append(self._observe)

    def _observe(self, t: float, event: object, before: rc.State, result: rc.Step) -> None:
        if self.metrics is not None:
            self.metrics(t, event, before, result)

    async def record(self, meta: dict, snapshot_every: int = 1) -> None:
        """Write a trace (docs/trace-format.md) from now on, a snapshot every
        ``snapshot_every`` steps (a scenario's ``trace.snapshot_every``);
        ``drain_trace`` reads it."""
        await self._ready()
        internal_kv._internal_kv_put(_KV_RECORDING, str(snapshot_every).encode(), overwrite=True)
        self._start_recording({"executor": "ray", **meta}, header=True, snapshot_every=snapshot_every)

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
        if self._cluster_task is not None:
            self._cluster_task.cancel()
        for task in list(self._checks.values()):
            task.cancel()
        self._cancel_timers()
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
        if self._cluster_task is None:
            self._cluster_task = asyncio.get_event_loop().create_task(self._cluster_loop())
        if self._recovered:
            return
        if self._recovering is None:
            self._recovering = asyncio.Lock()
        async with self._recovering:
            if self._recovered:
                return
            raw = internal_kv._internal_kv_get(_KV_SPECS)
            recording = internal_kv._internal_kv_get(_KV_RECORDING)
            if recording:  # continue the trace after a restart
                self._start_recording(None, header=False, snapshot_every=int(recording))
            named = self._write_queued_faults()  # what happened while no controller ran
            if raw:
                await self._recover(cloudpickle.loads(raw), named)
            else:  # a fresh controller: the core learns the nodes before any deployment
                self._sync_nodes()
            self._recovered = True

    async def _recover(self, specs: dict, named: Set[str] = frozenset()) -> None:
        """Rebuild the ranks from the replicas' own reports (ranks are not
        stored), and the core's view of the cluster from ``ray.nodes()``.
        Replicas whose start was under way are adopted with their global
        rank: an actor not yet initialised is reported pending on its node
        (the core initialises it), one whose ``__init__`` runs is reported
        starting (and answered ready when it finishes), and one with no actor
        yet (``known`` stage ``reserving``: waiting for a node, or for its
        group) is reported pending on no node: its old group is removed and
        the core places it again (a new ``PlaceReplica``). Only replicas that
        died are replaced; each known one that is gone gets a ``replica_lost``
        fault record (unless ``named``, the faults queued meanwhile, already
        name it). Every live replica actor found is reported, those of
        deployments the specs do not name too (the core stops them:
        ``stop_unknown``; the controller kills nothing on its own); one that
        does not answer its report within ``report_timeout_s`` is reported
        ``unresponsive`` (the core stops it before giving its rank away)."""
        from ray.exceptions import RayActorError

        nodes = self._alive_nodes()  # (first: a GCS hiccup here leaves nothing half done)
        counters = internal_kv._internal_kv_get(_KV_COUNTERS)
        started, lineages = cloudpickle.loads(counters) if counters else (0, 0)
        raw = internal_kv._internal_kv_get(_KV_REPLICAS)
        known: dict[str, dict] = cloudpickle.loads(raw) if raw else {}
        self.specs = {name: {k: v for k, v in spec.items() if k != "applied"} for name, spec in specs.items()}
        desired = {name: spec["applied"] for name, spec in specs.items()}  # rc.desired_specs, as persisted
        alive = {n.node_id for n in nodes}
        for name, spec in self.specs.items():  # where the caller's group's bundles are now
            held = desired[name].static_placement
            if spec.get("static") is not None and held is not None:
                try:
                    where = st.bundle_nodes(spec["static"].placement_group, alive)
                except Exception as exc:  # the group is gone, say
                    log.warning("could not read placement group of %r: %r", name, exc)
                    continue
                desired[name] = attrs.evolve(desired[name], static_placement=held.with_nodes(where))
        names = [a["name"] for a in ray.util.list_named_actors(all_namespaces=True)
                 if a.get("namespace") == NAMESPACE and a["name"].startswith("ModelActor:")]

        async def ask_report(name: str) -> tuple:
            try:
                actor = ray.get_actor(name, namespace=NAMESPACE)
            except Exception:
                return None, None  # died meanwhile: its rank is a gap the core refills
            try:
                # (an actor still being created answers once it is up)
                return actor, await asyncio.wait_for(actor.report.remote(), timeout=self.report_timeout_s)
            except asyncio.TimeoutError:
                return actor, None  # alive but silent: unresponsive
            except RayActorError:
                return None, None  # died meanwhile
            except Exception as exc:  # its report failed: its rank is unknown
                log.warning("replica actor %s did not report: %r", name, exc)
                return actor, None

        reports, starting, requeued, silent = [], [], [], []
        for name, (actor, r) in zip(sorted(names), await asyncio.gather(*(ask_report(n) for n in sorted(names)))):
            if actor is None:
                continue
            rank = r["rank"] if r is not None else None
            grank = rank[0] if rank is not None else r.get("global_rank") if r is not None else None
            if r is None or grank is None:  # no rank known: the core stops it before any rank is reused
                dep, _, rid = name[len("ModelActor:"):].partition(":")
                info = _actor_info(actor)
                node = ((info or {}).get("Address") or {}).get("NodeID") or None
                silent.append(rc.UnresponsiveReplica(replica_id=rid, deployment=dep, node_id=node))
                self.actors[rid] = (dep, actor)
                continue
            rid, dep = r["replica_id"], r["deployment"]
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
            if dep not in self.specs:
                self._initialized.add(rid)  # not ours: the core stops it (drained as any replica)
                continue
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
                # no actor yet: adopted (same id, rank, lineage); the core places it again
                reports.append(rc.ReplicaReport(
                    replica_id=rid, deployment=k["deployment"], node_id=None, phase="pending",
                    rank=k["global_rank"], world_size=k["world_size"], lineage=k["lineage"]))
                self.known[rid] = dict(k)
                requeued.append(rid)
            elif rid not in named:
                lost.append((rid, k["deployment"]))
        self._checkpoint()
        self._adopt_placement_groups()
        self.started, self.lineages = started, lineages
        now = self._now()
        # stop_unknown: the specs are persisted on every change (_persist), so a replica
        # of a deployment they do not name is a leftover (a reset, a deleted deployment)
        event = rc.ControllerRecovered(deployments=tuple(desired[n] for n in sorted(desired)),
                                       reports=tuple(reports), next_replica_number=started,
                                       next_lineage=lineages, nodes=tuple(nodes), stop_unknown=True,
                                       unresponsive=tuple(silent))
        if self.driver.trace is not None:
            for rid, dep in lost:
                self.driver.trace.fault(now, "replica_lost", replica=rid, deployment=dep,
                                        reason="gone when the controller recovered")
            self.driver.trace.fault(now, "controller_recovered", reports=len(reports),
                                    resumed=sorted(requeued), lost=[rid for rid, _ in lost],
                                    unresponsive=sorted(u.replica_id for u in silent), unknown=event.unknown_ids())
        self._nodes = {n.node_id: n.resources for n in nodes}
        self._feed(event)
        # Watch only now: a replica that died while the others reported is then
        # a crash the core knows what to do with (before, it would be ignored).
        state = self.driver.state
        for rid, (dep, actor) in sorted(self.actors.items()):
            self._spawn(self._watch(rid, actor))
            d = state.deployments.get(dep)
            rep = d.replicas.get(rid) if d is not None else None
            if rep is not None and rep.phase in (rc.Phase.RUNNING, rc.Phase.RECONFIGURING):
                self._start_checks(rid, actor)
        for rid, actor in starting:
            self._spawn(self._await_started(rid, actor))

    async def _await_started(self, rid: str, actor: Any) -> None:
        """A replica reported ``starting`` (its ``__init__`` was running when the
        controller restarted): answer ReplicaReady when it finishes."""
        try:
            await actor.started.remote()
        except Exception as exc:
            self._failed(rid, "initialize", exc)
            return
        if rid in self.actors and rid not in self.stopping:  # (not stopped meanwhile)
            self._initialized.add(rid)
            self._feed(rc.ReplicaReady(replica_id=rid))
            self._start_checks(rid, actor)

    def _adopt_placement_groups(self) -> None:
        """Take back the groups of the replicas found alive; remove every other
        ``rankcore:`` group (its replica died, or had no actor yet, while no
        controller ran: the core places such a replica again, on a new group)."""
        from ray._raylet import PlacementGroupID
        from ray.util.placement_group import PlacementGroup

        mine = {pl.pg_name(dep, rid): rid for rid, (dep, _) in self.actors.items()}
        for pg_id, info in ray.util.placement_group_table().items():
            name = info.get("name") or ""
            if not name.startswith("rankcore:") or info.get("state") == "REMOVED":
                continue
            pg = PlacementGroup(PlacementGroupID(bytes.fromhex(pg_id)))
            rid = mine.get(name)
            if rid is not None and rid not in self.pgs:
                self.pgs[rid] = pg
            else:
                try:
                    ray.util.remove_placement_group(pg)
                except Exception:  # gone meanwhile
                    pass

    # ------------------------------------------------------------------ nodes
    def _alive_nodes(self) -> list[rc.NodeJoined]:
        """The cluster's live nodes as ``NodeJoined`` events: nodes with an
        order label first, in its order, then the others by id (the order the
        core breaks ties in after the label). Each offers what the core may
        book there: its total less what the callers' placement groups hold on
        it (``held_by_callers``; rankcore's own groups are the core's bookings
        already), as the simulator's nodes do."""
        alive = [pl.node_joined(n) for n in ray.nodes() if n.get("Alive")]
        held = held_by_callers(ray.util.placement_group_table())
        alive = [attrs.evolve(j, resources=_less(dict(j.resources), held[j.node_id])) if j.node_id in held else j
                 for j in alive]
        return sorted(alive, key=lambda j: (j.order is None, j.order or 0, j.node_id))

    def _sync_bundles(self) -> None:
        """Tell the core where each static deployment's bundles are now
        (``BundlesPlaced``) when Ray moved them (a bundle whose node was lost
        rescheduled on a live node, or the caller's group removed: nowhere).
        A node the core does not know alive counts as nowhere."""
        state = self.driver.state
        for name, spec in sorted(self.specs.items()):
            cfg = spec.get("static")
            dep = state.deployments.get(name)
            if cfg is None or dep is None or dep.static is None:
                continue
            where = st.bundle_nodes(cfg.placement_group, set(self._nodes))
            if len(where) == dep.static.bundle_count and where != dep.static.bundle_nodes:
                self._feed(rc.BundlesPlaced(deployment=name, bundle_nodes=where))

    def _sync_nodes(self) -> None:
        """Tell the core what changed in the cluster since it was last told: a
        new node joins (``NodeJoined``), a node whose total resources changed
        says so (``NodeCapacityChanged``), a node it knows that Ray reports dead
        (or no longer lists) is lost (``NodeLost``, through ``_lose_node``)."""
        alive = {j.node_id: j for j in self._alive_nodes()}
        for node_id in sorted(set(self._nodes) - set(alive)):
            self._lose_node(node_id)
        for node_id, joined in alive.items():
            if node_id not in self._nodes:
                self._nodes[node_id] = joined.resources
                self._feed(joined)
            elif self._nodes[node_id] != joined.resources:
                self._nodes[node_id] = joined.resources
                self._feed(rc.NodeCapacityChanged(node_id=node_id, resources=joined.resources))

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

    def _schedule_tick(self, at: float) -> None:
        """A ScheduleTick: feed the core a Tick once the clock reads ``at``."""
        if at in self._timers:
            return
        delay = max(0.0, at - self._now())
        self._timers[at] = asyncio.get_event_loop().call_later(delay, self._timer_fired, at)

    def _cancel_timers(self) -> None:
        for handle in self._timers.values():
            handle.cancel()
        self._timers.clear()

    def _timer_fired(self, at: float) -> None:
        self._timers.pop(at, None)
        if self._halted:
            return
        if self._now() < at:  # (the loop's clock and the wall clock differ a little)
            self._schedule_tick(at)
            return
        self._feed(rc.Tick(now=self._now()))

    # ----------------------------------------------------------- commands
    def _start(self, cmd: rc.StartReplica) -> None:
        """Record the replica (stage ``reserving``: no actor yet); the core
        places it with a PlaceReplica once a node has room."""
        n = rc.parse_replica_number(cmd.replica_id)
        self.started = max(self.started, (n or 0) + 1)
        self.lineages = max(self.lineages, (cmd.lineage or 0) + 1)
        self._persist_counters()
        self.known[cmd.replica_id] = {"deployment": cmd.deployment, "global_rank": cmd.global_rank,
                                      "lineage": cmd.lineage, "world_size": cmd.world_size, "stage": "reserving",
                                      "gang": cmd.gang}
        self._checkpoint()

    def _keep_spares(self, cmd: rc.KeepSpareProcesses) -> None:
        """Keep the count the core asks of the node; top it up now unless a
        replica of ours is starting there (it may be about to take an idle
        process: the refill after it has started tops up then)."""
        self.spares.keep(cmd)
        self._top_up_spares(cmd.node_id)

    def _top_up_spares(self, node: str) -> None:
        """Top the node's spares up, unless a replica of ours is being placed or
        started there: it may be about to take an idle process, and the pool
        could take its new process for a spare (the last one to start tops up)."""
        if not any(self._node_of(rid) == node for rid in self.actors if rid not in self._initialized) and not any(
                where == node for where, _ in self._placing.values()):
            self.spares.refill(node)

    def _gang_changed(self, cmd: rc.GangChanged) -> None:
        """A gang's members changed (``restart_replica`` replaced one): every
        member's context shows the new list, then its ``on_gang_changed(gang)``
        runs if the class has one (those not created yet get the list at
        creation, and no call)."""
        for rid in cmd.members:
            k = self.known.get(rid)
            if k is not None and k.get("gang") is not None:
                k["gang"] = attrs.evolve(k["gang"], members=tuple(cmd.members))
            entry = self.actors.get(rid)
            if entry is not None:
                self._spawn(self._tell_gang(rid, entry[1], cmd))
        self._checkpoint()

    async def _tell_gang(self, rid: str, actor: Any, cmd: rc.GangChanged) -> None:
        """GangChanged to one member; a hook that raised is logged here, with the replica."""
        try:
            await actor.set_gang.remote(cmd.gang_id, tuple(cmd.members))
        except Exception as exc:
            if rid in self.actors:
                log.error("replica %s: on_gang_changed for %s failed: %r", rid, cmd.gang_id, exc)

    # ------------------------------------------------------- command order
    def _in_order(self, rid: str, coro: Any) -> None:
        """Run ``coro`` (a command about replica ``rid``) once the commands about
        ``rid`` sent before it have finished: a replica sees its commands in the
        core's order (docs/architecture.md). A stop cancels the chain
        (``_cancel_chain``)."""
        chain = self._chains.setdefault(rid, [])
        prev = chain[-1] if chain else None
        task = asyncio.get_event_loop().create_task(coro if prev is None else _after(prev, coro))
        chain.append(task)
        self.tasks.add(task)

        def done(t: asyncio.Task) -> None:
            self.tasks.discard(t)
            left = self._chains.get(rid)
            if left is not None:
                if t in left:
                    left.remove(t)
                if not left:
                    del self._chains[rid]

        task.add_done_callback(done)

    def _cancel_chain(self, rid: str) -> None:
        """Cancel the commands under way or waiting for ``rid`` (its placement
        waiting for a group, its ``__init__`` awaited, a reconfigure): the core
        has given the replica up, and their answers would change nothing."""
        me = asyncio.current_task()
        for task in self._chains.pop(rid, []):
            if task is not me:
                task.cancel()
        self._placing.pop(rid, None)

    def _placed(self, rid: str) -> None:
        """The placement under way for ``rid`` (this task's) is over."""
        entry = self._placing.get(rid)
        if entry is not None and entry[1] is asyncio.current_task():
            del self._placing[rid]

    def _cancel_placing(self, rid: str) -> None:
        entry = self._placing.get(rid)
        if entry is not None and entry[1] is not asyncio.current_task():
            del self._placing[rid]
            entry[1].cancel()

    async def _place(self, cmd: rc.PlaceReplica) -> None:
        """Put the replica on ``cmd.node_id``, the core's choice: its group
        pinned there (a replica reserving nothing: its actor, by hard node
        affinity), then its actor in bundle 0. Answers ReplicaPlaced as soon as
        the group is placed (a static replica: once its actor runs, saying
        where), or PlacementFailed when Ray refuses (the group
        infeasible there, or removed). A group that merely waits for room waits:
        the core's ``placement_timeout_s`` decides when to give the node up (it
        sends StopReplica, which cancels this)."""
        from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy, PlacementGroupSchedulingStrategy

        rid, dep, node = cmd.replica_id, cmd.deployment, cmd.node_id
        k = self.known.get(rid)
        if k is None or rid in self.stopping or rid in self.actors or dep not in self.specs:
            return  # stopped (or placed) meanwhile
        self._placing[rid] = (node, asyncio.current_task())  # type: ignore[assignment]
        spec = self.specs[dep]
        bundles = pl.replica_bundles(spec["actor_options"], spec.get("bundles"))
        opts = dict(spec["actor_options"])
        static: st.StaticPlacementConfig | None = spec.get("static")
        extra: dict[str, Any] = {"gang": k.get("gang")}
        if cmd.group is not None:  # the caller's group: the rank's first bundle, no group of ours
            if static is None or static.group != cmd.group or not cmd.bundles:
                self._placed(rid)
                self._feed(rc.PlacementFailed(replica_id=rid, node_id=node,
                                              reason=f"no placement group {cmd.group!r} for {dep!r}"))
                return
            opts = pl.static_actor_options(opts)
            opts["scheduling_strategy"] = PlacementGroupSchedulingStrategy(
                placement_group=static.placement_group, placement_group_bundle_index=cmd.bundles[0],
                placement_group_capture_child_tasks=cmd.capture_child_tasks)
            extra.update(bundle_indices=tuple(cmd.bundles), placement_group=static.placement_group)
        elif bundles:
            failed = await self._reserve(rid, dep, bundles, spec.get("pg_strategy", "PACK"), node)
            if failed is not None:
                self._release_pg(rid)
                self._placed(rid)
                self._feed(rc.PlacementFailed(replica_id=rid, node_id=node, reason=failed))
                return
            opts = pl.actor_options_in_group(opts, bundles)
            opts["scheduling_strategy"] = PlacementGroupSchedulingStrategy(
                placement_group=self.pgs[rid], placement_group_bundle_index=0,
                placement_group_capture_child_tasks=True)
        else:
            opts["scheduling_strategy"] = NodeAffinitySchedulingStrategy(node_id=node, soft=False)
        k["stage"] = "created"  # from now on, a missing actor means a dead replica
        k["global_rank"] = cmd.rank.rank
        self._checkpoint()
        try:
            # An async actor: requests wait on a semaphore of max_ongoing_requests
            # inside it, so Ray's own limit only needs to leave room for them and
            # the controller's calls.
            actor: Any = replica_class().options(
                name=actor_name(dep, rid), namespace=NAMESPACE, lifetime="detached",
                max_restarts=0, max_concurrency=max(1000, 2 * spec["max_ongoing_requests"] + 16), **opts,
            ).remote(dep, rid, spec["cls"], spec["args"], spec["kwargs"], k["lineage"], cmd.rank.rank,
                     k["world_size"], spec["max_ongoing_requests"], **extra)
            self.actors[rid] = (dep, actor)
            # Placed once its room is held there: its own group pinned to the node (or a hard
            # affinity) is where it is; its process starting up is part of its start (the
            # core's start_timeout_s, not its placement_timeout_s). A caller's bundle may have
            # moved: there the actor says where it runs.
            where = await actor.node_id.remote() if cmd.group is not None else node
        except Exception as exc:  # refused by Ray, or died starting
            self._placed(rid)
            entry = self._forget(rid)
            if rid in self.stopping:
                return
            if static is not None and cmd.group is not None and self._group_removed(static):
                # the caller removed its group: no bundle is anywhere (every replica FAILED), not a crash loop
                self._feed(rc.BundlesPlaced(deployment=dep, bundle_nodes=(None,) * static.placement_group.bundle_count))
                return
            cause = _death_cause(exc, entry[1] if entry is not None else None)
            self._feed(rc.ReplicaCrashed(replica_id=rid, reason=f"failed to start: {exc}"[:2000], cause=cause))
            return
        self._placed(rid)
        if rid in self.stopping or rid not in self.actors:  # stopped while its actor started: the stop killed it
            return
        self._spawn(self._watch(rid, actor))
        self._feed(rc.ReplicaPlaced(replica_id=rid, node_id=where))

    @staticmethod
    def _group_removed(static: st.StaticPlacementConfig) -> bool:
        try:
            return bool(ray.util.placement_group_table(static.placement_group).get("state") == "REMOVED")
        except Exception:
            return False

    async def _reserve(self, rid: str, dep: str, bundles: list, strategy: str, node: str) -> str | None:
        """Create the replica's placement group pinned to ``node`` (the
        ``ray.io/node-id`` label selector: every bundle of a single-node group,
        bundle 0 of any other) and wait until it is placed, reading its state
        every ``group_poll_s``. Returns why Ray refused it (infeasible there, or
        removed; the group is left for the caller to release), or None. No
        time limit of its own: the core's placement timeout stops it."""
        pin = {"ray.io/node-id": node}
        if pl.single_node(bundles, strategy):
            strategy = "STRICT_PACK"  # the same thing for one bundle
            selectors = [pin] * len(bundles)
        else:
            selectors = [pin] + [{} for _ in bundles[1:]]
        try:
            pg = ray.util.placement_group(bundles, strategy=strategy, name=pl.pg_name(dep, rid),
                                          lifetime="detached", bundle_label_selector=selectors)
        except Exception as exc:
            return f"placement group refused: {exc}"
        self.pgs[rid] = pg
        ready = asyncio.ensure_future(pg.ready())
        try:
            while True:
                done, _ = await asyncio.wait([ready], timeout=self.group_poll_s)
                if done:
                    ready.result()
                    return None
                refused = _group_refused(pg, node)
                if refused is not None:
                    return refused
        except Exception as exc:
            return f"placement group failed: {exc}"
        finally:
            if not ready.done():
                ready.cancel()

    def _release_pg(self, rid: str) -> None:
        pg = self.pgs.pop(rid, None)
        if pg is not None:
            try:
                ray.util.remove_placement_group(pg)
            except Exception:  # already gone
                pass

    async def _watch(self, rid: str, actor: Any) -> None:
        """Keep a call pending on the replica: it fails when the actor dies. A
        death the controller did not cause is reported with its cause, read
        from Ray's death record (``_death_cause``). Deaths that may be a node's
        (not killed on purpose, not the user's error) are observed together
        for ``death_batch_s`` (``_deaths_on``)."""
        error: BaseException | None = None
        try:
            await actor.watch.remote()
        except Exception as exc:
            error = exc
        if rid in self.stopping or rid in self._killed:
            return
        cause = _death_cause(error, actor)
        reason = f"actor died ({cause})"
        node = self._node_of(rid)
        if node is None or cause in ("killed", "error"):  # not a node going down: at once
            self._crashed(rid, reason, cause)
            return
        batch = self._dying.setdefault(node, [])
        batch.append((rid, cause))
        if len(batch) == 1:
            self._spawn(self._deaths_on(node))

    async def _deaths_on(self, node: str) -> None:
        """Deaths on one node within ``death_batch_s`` are observed together:
        if Ray has declared the node dead by then, they are one ``NodeLost``
        (the core replaces the node's replicas in rank order); else each is a
        crash with its cause, in the order Ray reported them."""
        await asyncio.sleep(self.death_batch_s)
        batch = self._dying.pop(node, [])
        if node in self._nodes and self._node_dead(node):  # (not if _sync_nodes has lost it meanwhile)
            self._lose_node(node)
        for rid, cause in batch:
            if rid not in self.stopping:
                self._crashed(rid, f"actor died ({cause})", cause)

    def _forget(self, rid: str) -> tuple | None:
        """Drop what the controller holds for a replica that is gone or going
        (its placement under way, its actor handle, its group, its health
        checks); returns its (deployment, actor) if known."""
        self._cancel_placing(rid)
        entry = self.actors.pop(rid, None)
        self._initialized.discard(rid)
        self._check_every.pop(rid, None)
        check = self._checks.pop(rid, None)
        if check is not None and check is not asyncio.current_task():
            check.cancel()
        self._release_pg(rid)
        if self.known.pop(rid, None) is not None:
            self._checkpoint()
        return entry

    def _crashed(self, rid: str, reason: str, cause: str) -> None:
        self._forget(rid)
        self._feed(rc.ReplicaCrashed(replica_id=rid, reason=reason, cause=cause, now=self._now()))

    def _failed(self, rid: str, what: str, exc: BaseException) -> None:
        """A call into the user's code (``__init__``, ``reconfigure``) raised:
        ``ReplicaCrashed(cause="error")``; its process, of no use now, is killed.
        A call that failed because the actor died is left to its watch."""
        from ray.exceptions import RayActorError

        if rid not in self.actors or rid in self.stopping or isinstance(exc, RayActorError):
            return
        self._kill(rid)
        detail = getattr(exc, "cause", None) or exc
        self._feed(rc.ReplicaCrashed(replica_id=rid, reason=f"{what} raised: {detail!r}"[:2000], cause="error",
                                     now=self._now()))

    def _node_of(self, rid: str) -> str | None:
        """The replica's node as the core holds it (where it runs, or where a
        PlaceReplica sent it)."""
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
        """A node died: one ``NodeLost`` (the core crashes every replica it
        placed or reserved there and replaces them in rank order, as the
        simulator does). The controller only lets go of them: their actors,
        their placements under way, their groups."""
        placing_there = {rid for rid, (node, _) in self._placing.items() if node == node_id}
        for rid in sorted(set(self.actors) | placing_there):
            if rid in placing_there or self._node_of(rid) == node_id:
                self.stopping.add(rid)  # their own watch calls fail too: already handled
                self._forget(rid)
        self._nodes.pop(node_id, None)
        self.spares.forget(node_id)
        self._feed(rc.NodeLost(node_id=node_id))

    def _kill(self, rid: str) -> Any:
        """Kill the replica's process now (it is then no news when it dies) and
        let go of it; returns its actor handle, or None if it had none."""
        self.stopping.add(rid)
        self._killed.add(rid)
        entry = self._forget(rid)
        if entry is None:
            return None
        try:
            ray.kill(entry[1], no_restart=True)
        except Exception as exc:  # already gone
            log.debug("ray.kill(%s): %r", rid, exc)
        return entry[1]

    def _next_seq(self) -> tuple[int, int]:
        self._seq += 1
        return (self.incarnation, self._seq)

    async def _initialize(self, cmd: rc.InitializeReplica, seq: tuple[int, int] | None = None) -> None:
        rid = cmd.replica_id
        entry = self.actors.get(rid)
        if entry is None or rid in self.stopping:
            return
        self._check_every[rid] = (cmd.health_check_period_s, cmd.health_check_timeout_s)
        try:
            await entry[1].initialize.remote(cmd.rank.as_tuple(), cmd.world_size, cmd.user_config,
                                             cmd.call_reconfigure, cmd.pass_rank, seq)
        except Exception as exc:
            self._failed(rid, "__init__" if not cmd.call_reconfigure else "__init__/reconfigure", exc)
            return
        if rid in self.actors and rid not in self.stopping:  # (not stopped meanwhile)
            self._initialized.add(rid)
            self._feed(rc.ReplicaReady(replica_id=rid))
            self._start_checks(rid, entry[1])
            node = self._node_of(rid)
            if node is not None and self.spares.target(node):
                self._spawn(self._spare_taken(rid, node, entry[1]))

    async def _spare_taken(self, rid: str, node: str, actor: Any) -> None:
        """A replica started on a node that keeps spares: was its process one? Then top the node up."""
        try:
            self.spares.took(node, await actor.pid.remote())
        except Exception:  # (gone meanwhile: the top-up below still runs)
            pass
        self._top_up_spares(node)

    async def _reconfigure(self, cmd: rc.ReconfigureReplica, seq: tuple[int, int] | None = None) -> None:
        entry = self.actors.get(cmd.replica_id)
        if entry is None or cmd.replica_id in self.stopping:
            return
        try:
            await entry[1].reconfigure.remote(cmd.rank.as_tuple(), cmd.world_size, cmd.user_config, cmd.version,
                                              cmd.call_user, cmd.pass_rank, seq)
        except Exception as exc:
            self._failed(cmd.replica_id, "reconfigure", exc)
            return
        self._feed(rc.ReplicaReconfigured(replica_id=cmd.replica_id, version=cmd.version))

    def _stop_now(self, cmd: rc.StopReplica) -> None:
        """Carry a StopReplica out: what is under way for the replica is
        cancelled; one that may hold calls (initialised) is drained for up to
        ``graceful_shutdown_timeout_s`` (``_drain``); any other, or with a 0 s
        timeout, is killed here and now, its group removed, before the step's
        next command runs. ``ReplicaStopped`` follows."""
        rid = cmd.replica_id
        self.stopping.add(rid)
        self._cancel_chain(rid)
        entry = self.actors.get(rid)
        if entry is not None and rid in self._initialized and cmd.graceful_shutdown_timeout_s > 0:
            check = self._checks.pop(rid, None)  # (not checked while it drains)
            if check is not None:
                check.cancel()
            self._in_order(rid, self._drain(rid, entry[1], cmd))
            return
        actor = self._kill(rid)
        self._in_order(rid, self._stopped(rid, actor))

    async def _drain(self, rid: str, actor: Any, cmd: rc.StopReplica) -> None:
        """Let the calls in flight finish (the replica looks every
        ``graceful_shutdown_wait_loop_s``), for up to
        ``graceful_shutdown_timeout_s``; then kill it."""
        try:
            await asyncio.wait_for(actor.prepare_stop.remote(cmd.graceful_shutdown_wait_loop_s,
                                                             cmd.graceful_shutdown_timeout_s),
                                   timeout=cmd.graceful_shutdown_timeout_s)
        except Exception:  # (timed out, or died meanwhile)
            pass
        await self._stopped(rid, self._kill(rid))

    async def _stopped(self, rid: str, actor: Any) -> None:
        """Answer ``ReplicaStopped``: the kill and the removal of its group are
        sent (Ray frees the group's resources, and kills what runs in it, with
        the removal)."""
        self._feed(rc.ReplicaStopped(replica_id=rid, now=self._now()))

    # ------------------------------------------------------------------ API
    async def apply(self, name: str, num_replicas: int, user_config: Any, cls: type, args: tuple, kwargs: dict,
                    actor_options: dict, max_ongoing_requests: int, placement: dict | None = None,
                    max_replicas: int = rc.DEFAULT_MAX_REPLICAS, options: dict | None = None) -> None:
        """Deploy or update ``name``. ``options``: the core's deployment options
        (``rankcore.options.OPTION_NAMES``: health checks, graceful shutdown,
        placement timeout, restart backoff; and ``start_timeout_s``), passed to
        ``DeploymentApplied`` as given. ``placement``: ``placement_group_bundles``,
        ``placement_group_strategy``, ``replica_placement`` (see api.deployment).
        The core places its replicas: it is told what one replica reserves on
        its node (``placement.replica_need``: the whole group when the group is
        on one node, else bundle 0 only) and the policy. ``placement`` may also
        hold ``static`` (a ``StaticPlacementConfig``: the caller's group, whose
        bundles' nodes the core is told; nothing is reserved) and the gang
        options ``gang_size``, ``gang_placement``, ``gang_failure``. A bad
        option or request raises to the caller (``InvalidConfig``,
        ``InvalidEvent``) and changes nothing."""
        options = dict(options or {})
        bad = sorted(set(options) - set(CORE_OPTIONS))
        if bad:
            raise rc.InvalidConfig(f"deployment {name!r}: unknown option(s) {', '.join(bad)} "
                                   f"(options: {', '.join(CORE_OPTIONS)})")
        placement = dict(placement or {})
        bundles = placement.get("placement_group_bundles")
        pg_strategy = placement.get("placement_group_strategy", "PACK")
        spread = placement.get("replica_placement", "spread")
        static: st.StaticPlacementConfig | None = placement.get("static")
        gang = {"gang_size": placement.get("gang_size", 1),
                "gang_placement": placement.get("gang_placement", "pack"),
                "gang_failure": placement.get("gang_failure", "restart_gang")}
        pl.validate(actor_options, bundles, pg_strategy, spread)
        if static is not None and not isinstance(static, st.StaticPlacementConfig):
            raise rc.InvalidConfig(f"deployment {name!r}: static_placement must be a StaticPlacementConfig, "
                                   f"got {static!r:.80}")
        reconfigure = getattr(cls, "reconfigure", None)
        has_reconfigure = callable(reconfigure)
        takes_rank = False
        if callable(reconfigure):
            import inspect

            takes_rank = "rank" in inspect.signature(reconfigure).parameters
        need = {} if static is not None else pl.replica_need(actor_options, bundles, pg_strategy)
        event = rc.DeploymentApplied(**options, name=name, num_replicas=num_replicas, user_config=user_config,
                                     has_reconfigure=has_reconfigure, reconfigure_takes_rank=takes_rank,
                                     max_replicas=max_replicas, resources=need, placement=spread,
                                     static_placement=static.to_core(None) if static is not None else None, **gang)
        if static is not None:
            static.check_actor_fits(pl.actor_resources(pl.static_actor_options(actor_options)))
            await self._group_ready(name, static)
        await self._ready()
        self._sync_nodes()  # the nodes first (after a reset the core knows none)
        if static is not None:  # where the caller's bundles are (on nodes the core knows)
            event = attrs.evolve(event, static_placement=static.to_core(
                st.bundle_nodes(static.placement_group, set(self._nodes))))
        before = self.specs.get(name)
        self.specs[name] = {"cls": cls, "args": args, "kwargs": kwargs, "actor_options": actor_options,
                            "max_ongoing_requests": max_ongoing_requests, "bundles": bundles,
                            "pg_strategy": pg_strategy, "placement": spread, "static": static, **gang}
        try:
            self.driver.feed(event, self._now())
        except Exception:
            if before is None:
                self.specs.pop(name, None)
            else:
                self.specs[name] = before
            raise
        self._persist()

    async def _group_ready(self, name: str, static: st.StaticPlacementConfig, timeout: float = 60.0) -> None:
        """The caller's group must exist: wait for it to be placed (its bundles'
        nodes are what the core is told)."""
        pg = static.placement_group
        if self._group_removed(static):
            raise rc.InvalidConfig(f"deployment {name!r}: its placement group {static.group} was removed")
        try:
            await asyncio.wait_for(pg.ready(), timeout=timeout)
        except asyncio.TimeoutError:
            raise rc.InvalidConfig(f"deployment {name!r}: placement group {static.group} is not placed after "
                                   f"{timeout:g}s (ray.get(pg.ready()) before deploying)") from None

    async def scale(self, name: str, num_replicas: int, victims: tuple = ()) -> None:
        """Scale ``name`` in place. A request the core refuses (a count above
        max_replicas, an unknown victim, a count that is not whole gangs, a
        static deployment's count other than 0 or its mapping's length) raises
        its ``InvalidConfig`` / ``InvalidEvent`` to the caller and changes nothing."""
        await self._ready()
        if name not in self.specs:
            raise rc.InvalidEvent(f"unknown deployment {name!r}")
        event = rc.ScaleRequested(deployment=name, num_replicas=num_replicas, victims=victims)
        self.driver.feed(event, self._now())  # (first: the core's own words for a count it refuses)
        self._persist()

    async def wait_gone(self, replica_id: str, timeout: float = 60.0) -> bool:
        """Return once the core no longer holds ``replica_id`` as a replica (the
        controller fed its death: ``ReplicaCrashed``, ``NodeLost``, or its
        stop), False after ``timeout``: a scenario's ``crash`` completes only
        once the controller has seen it."""
        await self._ready()
        deadline = time.monotonic() + timeout
        while replica_id in self.driver.state.index:
            if time.monotonic() > deadline:
                return False
            await asyncio.sleep(0.02)
        return True

    async def wait_node(self, node_id: str, alive: bool, timeout: float = 60.0) -> bool:
        """Return once the core holds ``node_id`` as alive (``NodeJoined``) or
        not (``NodeLost``), reading Ray's nodes meanwhile (not waiting for the
        next health check); False after ``timeout``."""
        await self._ready()
        deadline = time.monotonic() + timeout
        while (node_id in self.driver.state.cluster.nodes) != alive:
            if time.monotonic() > deadline:
                return False
            try:
                self._sync_nodes()
            except Exception as exc:  # GCS hiccup: next pass
                log.warning("could not read the cluster's nodes: %r", exc)
            await asyncio.sleep(0.1)
        return True

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
        return self._serving(name)

    async def endpoints_after(self, name: str, known: tuple, timeout: float) -> tuple[list, int]:
        """A handle's long poll (Ray Serve's ``listen_for_change``): what
        ``endpoints`` answers, as soon as the serving replicas' ids differ from
        ``known`` (the handle's), or after ``timeout`` s unchanged. Looked at
        again after every step of the core (a replica ready, crashed, stopped),
        so a handle learns of a change in the step that made it."""
        await self._ready()
        deadline = time.monotonic() + timeout
        while True:
            serving = self._serving(name)
            left = deadline - time.monotonic()
            if left <= 0 or tuple(rid for rid, _ in serving[0]) != tuple(known):
                return serving
            if self._stepped is None:
                self._stepped = asyncio.Event()
            try:
                await asyncio.wait_for(self._stepped.wait(), left)
            except asyncio.TimeoutError:
                pass

    def _wake_long_polls(self, t: float, event: object, before: rc.State, result: rc.Step) -> None:
        if result.state.deployments is before.deployments:
            return  # (a Tick, a passing health check: no replica changed, nobody serves anew)
        stepped, self._stepped = self._stepped, None
        if stepped is not None:
            stepped.set()

    def _serving(self, name: str) -> tuple[list, int]:
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

    async def deployment_status(self, name: str) -> dict:
        """What the core holds about ``name``: ``healthy``, ``target``,
        ``status`` (``"HEALTHY"``, ``"UPDATING"``, ``"UNHEALTHY"``: e.g. its
        replicas keep failing to start) with ``status_message``, and per
        replica its ``phase`` (``"running"``, ``"failed"``: a static replica
        whose bundle's node was lost, ...), ``rank`` (rank, node_rank,
        local_rank; node and local None until placed), ``node_id``,
        ``bundles`` (a static rank's bundle indices) and ``gang`` (its gang's id)."""
        gang_id = rc.gangs.gang_id

        await self._ready()
        dep = self.driver.state.deployments.get(name)
        if dep is None:
            raise rc.UnknownDeployment(f"unknown deployment {name!r}")
        replicas = {}
        for rid, rk in dep.ranks.items():
            g = dep.ranks.global_rank(rid)
            rep = dep.replicas[rid]
            replicas[rid] = {
                "phase": rep.phase.value, "rank": rk.as_tuple() if rk else (g, None, None), "node_id": rep.node_id,
                "bundles": dep.static.bundles_of(g) if dep.static is not None else None,
                "gang": gang_id(name, g // dep.gang_size) if dep.gang_size > 1 else None}
        return {"name": name, "healthy": dep.healthy, "target": dep.target, "status": dep.status,
                "status_message": dep.status_message,
                "failed": sorted(r for r, v in replicas.items() if v["phase"] == rc.Phase.FAILED.value),
                "replicas": replicas}

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
                "replicas": len(self.actors), "recording": self.driver.trace is not None, "pid": os.getpid(),
                "spare_processes": self.spares.status()}

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
        for task in list(self._checks.values()):
            task.cancel()
        self.tasks.clear()
        self._chains.clear()
        self._checks.clear()
        self._check_every.clear()
        self._killed.clear()
        self.actors.clear()
        self.stopping.clear()
        self._placing.clear()
        self._dying.clear()
        self._cancel_timers()
        self._nodes.clear()  # the core forgets them too: the next apply() tells it again
        self._initialized.clear()
        self.spares.cancel()
        self.spares = SparePool()  # (the core is told nothing more: its state goes below)
        for rid in list(self.pgs):
            self._release_pg(rid)
        self._adopt_placement_groups()  # (none adopted: no actors) removes any left from before
        self.specs.clear()
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
        """Scale every deployment to 0 through the core (a static one too: 0 shuts
        it down) and wait for the stops."""
        await self._ready()
        for name in sorted(self.driver.state.deployments.keys()):
            if self.driver.state.deployments[name].target:
                self._feed(rc.ScaleRequested(deployment=name, num_replicas=0))
        self._persist()
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline and any(d.replicas for d in self.driver.state.deployments.values()):
            await asyncio.sleep(0.05)
        for rid in list(self.actors):  # anything left behind
            self._kill(rid)
