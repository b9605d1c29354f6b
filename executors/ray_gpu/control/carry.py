"""How the Ray controller carries out the core's commands.

``Carrier`` is the driver's backend: each command becomes Ray calls
(``PlaceReplica``: a placement group pinned to the node the core chose, then
the replica actor in it; ``InitializeReplica`` / ``ReconfigureReplica``:
calls into the replica; ``StopReplica``: a drain, then a kill;
``ScheduleTick``: a timer), and each outcome goes back to the core as an
event (``ReplicaPlaced`` or ``PlacementFailed``, ``ReplicaReady``,
``ReplicaCrashed``, ``ReplicaStopped``; the weights' moves
``OffloadReplica`` / ``LoadReplica`` / ``UpdateWeights`` answered by
``TierMoved`` / ``TierMoveFailed`` / ``WeightsUpdated``; the proxies' commands: control/proxies.py;
``RequestResources``:
``ray.autoscaler.sdk.request_resources``, unanswered; memory-booked
placement: ``PlaceReplica.devices`` / ``.source``, ``EvictReplica``
answered by ``ReplicaStopped`` once the weights are in the node's WARM cache
or COLD file, ``DropWarmCopy`` unanswered). It chooses no node and orders
nothing itself; the commands about one replica run in the core's order.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable, Sequence
from typing import Any

import attrs
import ray

import rankcore as rc

from ..base import persist
from ..base.replicas import CREATED, NAMESPACE, NOSET_CUDA, RESERVING, ReplicaRecord, actor_name
from ..replica.actor import remote_class
from ..weights.warm_cache import Caches
from . import placement as pl
from . import static as st
from .ledger import Ledger
from .observe import Watcher, death_cause, group_refused, group_removed
from .proxies import Proxies

log = logging.getLogger("rankcore.ray.controller")


async def _after(prev: asyncio.Task, coro: Any) -> Any:
    """Await ``coro`` once ``prev`` has finished, whatever became of it."""
    try:
        if not prev.done():
            await asyncio.wait([prev])
    except asyncio.CancelledError:
        coro.close()
        raise
    return await coro


#: how long after a restarted controller's recovery a router may still route by the dead controller's
#: pool: it takes the new one once Ray has failed its long poll to the dead one, and Ray fails a call
#: sent to the dead controller's address up to ~2 s after it was sent (Ray 2.60, a 2-core machine:
#: routers took the new pool up to 1.3 s after the recovery). A drain does not begin before then.
ROUTERS_RESYNC_S = 2.0


class Carrier:
    """The driver's backend on Ray (``execute``), and the answers to its commands."""

    #: seconds between two readings of a pending placement group's state (a group
    #: Ray reports infeasible or removed is a refusal: ``PlacementFailed``)
    group_poll_s = 0.5

    def __init__(self, ledger: Ledger, watcher: Watcher) -> None:
        self.ledger = ledger
        self.watcher = watcher
        #: replica id -> its commands' tasks not yet finished, in order (``in_order``);
        #: outlives the replica's record (its ``ReplicaStopped`` is answered in order)
        self.chains: dict[str, list[asyncio.Task]] = {}
        self.timers: dict[float, asyncio.TimerHandle] = {}  # ScheduleTick's time -> its timer
        self.caches = Caches(ledger)  # each node's WARM cache and COLD file
        self._seq = 0
        #: the proxies the core runs (control/proxies.py): their commands are carried out there
        self.proxies = Proxies(ledger)
        #: (monotonic) until when routers may hold a dead controller's pool (``recovered``)
        self.resynced_at = 0.0

    def recovered(self) -> None:
        """This controller recovered from a dead one's replicas: until ``ROUTERS_RESYNC_S`` from now a
        router may still send calls to a replica this controller stops, by the dead one's pool."""
        self.resynced_at = time.monotonic() + ROUTERS_RESYNC_S

    async def _routers_resynced(self) -> None:
        """Wait until no router can hold a dead controller's pool (``recovered``) before a drain begins:
        a replica drained and killed sooner is sent calls by such a router meanwhile, and they die with
        it (``graceful_shutdown_wait_loop_s`` is the wait for routers that follow this controller)."""
        hold = self.resynced_at - time.monotonic()
        if hold > 0:
            await asyncio.sleep(hold)

    def execute(self, commands: Sequence[object], t: float) -> None:
        """Carry commands out, in the order the core emitted them. The commands
        about one replica run one after another (``in_order``: each
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
        for cmd in commands:
            carry = CARRIES.get(type(cmd))
            if carry is None:  # (every command type has its entry: tests/unit/test_dispatch_tables.py)
                raise TypeError(f"the Ray executor carries out no {type(cmd).__name__} (carry.CARRIES)")
            carry(self, cmd)

    # ---------------------------------------------------------------- the carriers without a method of their own
    def _place(self, cmd: rc.PlaceReplica) -> None:
        self.in_order(cmd.replica_id, self.place(cmd))

    def _tick(self, cmd: rc.ScheduleTick) -> None:
        self.schedule_tick(cmd.at)

    def _initialize(self, cmd: rc.InitializeReplica) -> None:
        self.in_order(cmd.replica_id, self.initialize(cmd, self.next_seq()))

    def _reconfigure(self, cmd: rc.ReconfigureReplica) -> None:
        self.in_order(cmd.replica_id, self.reconfigure(cmd, self.next_seq()))

    def _move(self, cmd: rc.OffloadReplica | rc.LoadReplica) -> None:
        self.in_order(cmd.replica_id, self.move(cmd))

    def _update_weights(self, cmd: rc.UpdateWeights) -> None:
        self.in_order(cmd.replica_id, self.update_weights(cmd))

    def _proxy(self, cmd: rc.StartProxy | rc.DrainProxy | rc.StopProxy) -> None:
        self.proxies.execute(cmd)

    def _world_size(self, cmd: rc.UpdateWorldSize) -> None:
        seq = self.next_seq()
        for _rid, rec in self.ledger.with_actors():
            if rec.deployment == cmd.deployment:
                rec.actor.update_world_size.remote(cmd.world_size, seq)

    def _health_checks(self, cmd: rc.UpdateHealthChecks) -> None:
        """The watcher reads them before each check."""
        for _rid, rec in self.ledger.with_actors():
            if rec.deployment == cmd.deployment:
                rec.check_every = (cmd.health_check_period_s, cmd.health_check_timeout_s)

    def request_resources(self, cmd: rc.RequestResources) -> None:
        """The core's demand (``rankcore.placement.demand``) to Ray's autoscaler, KubeRay's
        too: ``ray.autoscaler.sdk.request_resources`` (GCS internal KV with autoscaler v1,
        the GCS's cluster resource constraints with v2), which replaces the previous request;
        no bundles clears it. Called here, on the loop, so that two requests land in the
        core's order; one GCS write, sent only when the demand changes. A failure is logged,
        not raised: the request is a hint, the replicas wait in the core's queue either way."""
        from ray.autoscaler.sdk import request_resources

        bundles = cmd.bundles()
        try:
            request_resources(bundles=bundles)
        except Exception:  # (a hint: see above)
            log.exception("request_resources(%d bundles) failed", len(bundles))

    def next_seq(self) -> tuple[int, int]:
        self._seq += 1
        return (self.ledger.incarnation, self._seq)

    # ----------------------------------------------------------------- time
    def schedule_tick(self, at: float) -> None:
        """A ScheduleTick: feed the core a Tick once the clock reads ``at``."""
        if at in self.timers:
            return
        delay = max(0.0, at - self.ledger.now())
        self.timers[at] = asyncio.get_event_loop().call_later(delay, self._timer_fired, at)

    def cancel_timers(self) -> None:
        for handle in self.timers.values():
            handle.cancel()
        self.timers.clear()

    def _timer_fired(self, at: float) -> None:
        self.timers.pop(at, None)
        if self.ledger.halted:
            return
        if self.ledger.now() < at:  # (the loop's clock and the wall clock differ a little)
            self.schedule_tick(at)
            return
        self.ledger.feed(rc.Tick(now=self.ledger.now()))

    # ------------------------------------------------------- command order
    def in_order(self, rid: str, coro: Any) -> None:
        """Run ``coro`` (a command about replica ``rid``) once the commands about
        ``rid`` sent before it have finished: a replica sees its commands in the
        core's order (docs/architecture.md). A stop cancels the chain
        (``cancel_chain``)."""
        chain = self.chains.setdefault(rid, [])
        prev = chain[-1] if chain else None
        task = asyncio.get_event_loop().create_task(coro if prev is None else _after(prev, coro))
        chain.append(task)
        self.ledger.tasks.add(task)

        def done(t: asyncio.Task) -> None:
            self.ledger.tasks.discard(t)
            left = self.chains.get(rid)
            if left is not None:
                if t in left:
                    left.remove(t)
                if not left:
                    del self.chains[rid]

        task.add_done_callback(done)

    def cancel_chain(self, rid: str) -> None:
        """Cancel the commands under way or waiting for ``rid`` (its placement
        waiting for a group, its ``__init__`` awaited, a reconfigure): the core
        has given the replica up, and their answers would change nothing."""
        me = asyncio.current_task()
        for task in self.chains.pop(rid, []):
            if task is not me:
                task.cancel()
        rec = self.ledger.replicas.get(rid)
        if rec is not None:
            rec.placing = None
            if rec.actor is None:  # (one with an actor is starting until it is killed: ``forget``)
                self.ledger.starting_at(rid, None)

    # -------------------------------------------------------------- starts
    def start(self, cmd: rc.StartReplica) -> None:
        """Record the replica (stage ``reserving``: no actor yet); the core
        places it with a PlaceReplica once a node has room."""
        led = self.ledger
        n = rc.query.parse_replica_number(cmd.replica_id)
        led.started = max(led.started, (n or 0) + 1)
        led.lineages = max(led.lineages, (cmd.lineage or 0) + 1)
        persist.save_counters(led.started, led.lineages)
        rec = led.replicas.setdefault(cmd.replica_id, ReplicaRecord(deployment=cmd.deployment))
        # (a record already there is given this start's fields, as the checkpoint keeps them)
        rec.deployment, rec.checkpointed, rec.stage, rec.gang = cmd.deployment, True, RESERVING, cmd.gang
        rec.global_rank, rec.lineage, rec.world_size = cmd.global_rank, cmd.lineage, cmd.world_size
        rec.revision = cmd.revision  # (its actor runs the spec applied last: that revision's code)
        led.checkpoint()

    def _placed(self, rid: str) -> None:
        """The placement under way for ``rid`` (this task's) is over (without an
        actor: it is not starting anywhere any more)."""
        rec = self.ledger.replicas.get(rid)
        if rec is not None and rec.placing is not None and rec.placing[1] is asyncio.current_task():
            rec.placing = None
            if rec.actor is None:
                self.ledger.starting_at(rid, None)

    async def place(self, cmd: rc.PlaceReplica) -> None:
        """Put the replica on ``cmd.node_id``, the core's choice: its group
        pinned there (a replica reserving nothing: its actor, by hard node
        affinity), then its actor in bundle 0. Answers ReplicaPlaced as soon as
        the group is placed (a static replica: once its actor runs, saying
        where), or PlacementFailed when Ray refuses (the group
        infeasible there, or removed). A group that merely waits for room waits:
        the core's ``placement_timeout_s`` decides when to give the node up (it
        sends StopReplica, which cancels this)."""
        from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy, PlacementGroupSchedulingStrategy

        led = self.ledger
        rid, dep, node = cmd.replica_id, cmd.deployment, cmd.node_id
        rec = led.replicas.get(rid)
        if rec is None or not rec.checkpointed or rid in led.stopping or rec.actor is not None \
                or dep not in led.specs:
            return  # stopped (or placed) meanwhile
        rec.placing = (node, asyncio.current_task())  # type: ignore[assignment]
        led.starting_at(rid, node)
        spec = led.specs[dep]
        bundles = pl.replica_bundles(spec["actor_options"], spec.get("bundles"))
        opts = dict(spec["actor_options"])
        static: st.StaticPlacementConfig | None = spec.get("static")
        extra: dict[str, Any] = {"gang": rec.gang, "revision": rec.revision,
                                 "reserved": (node, cmd.rank.node_rank, cmd.rank.local_rank)}
        if spec.get("modules") is not None:  # (a fingerprinted version: the replica checks its code)
            extra["modules"] = spec["modules"]
        if cmd.devices or cmd.source:  # booked by memory (memory.py): the core holds its GPUs
            bundles, opts = pl.without_gpus(bundles, opts)
            if led.cuda.get(node):  # it sees every GPU and uses the core's indices
                opts["runtime_env"] = pl.with_env(opts.get("runtime_env"), {NOSET_CUDA: "1"})
            extra.update(devices=tuple(cmd.devices), source=cmd.source)
            rec.devices, rec.source = tuple(cmd.devices), cmd.source
            if cmd.source == "warm" and rec.warm is None:  # the copy is used up now, as in the core's books
                rec.warm = self.caches.get(node).take.options(num_returns=2).remote(dep)
        if cmd.group is not None:  # the caller's group: the rank's first bundle, no group of ours
            if static is None or static.group != cmd.group or not cmd.bundles:
                self._placed(rid)
                led.feed(rc.PlacementFailed(replica_id=rid, node_id=node,
                                            reason=f"no placement group {cmd.group!r} for {dep!r}"))
                return
            opts = pl.static_actor_options(opts)
            opts["scheduling_strategy"] = PlacementGroupSchedulingStrategy(
                placement_group=static.placement_group, placement_group_bundle_index=cmd.bundles[0],
                placement_group_capture_child_tasks=cmd.capture_child_tasks)
            extra.update(bundle_indices=tuple(cmd.bundles), placement_group=static.placement_group)
        elif bundles:
            failed = await self._reserve(rec, rid, dep, bundles, spec.get("pg_strategy", "PACK"), node)
            if failed is not None:
                led.release_pg(rec)
                self._placed(rid)
                led.feed(rc.PlacementFailed(replica_id=rid, node_id=node, reason=failed))
                return
            opts = pl.actor_options_in_group(opts, bundles)
            opts["scheduling_strategy"] = PlacementGroupSchedulingStrategy(
                placement_group=rec.pg, placement_group_bundle_index=0,
                placement_group_capture_child_tasks=True)
        else:
            opts["scheduling_strategy"] = NodeAffinitySchedulingStrategy(node_id=node, soft=False)
        rec.stage = CREATED  # from now on, a missing actor means a dead replica
        rec.global_rank = cmd.rank.rank
        led.checkpoint()
        try:
            # An async actor: requests wait on a semaphore of max_ongoing_requests
            # inside it, so Ray's own limit only needs to leave room for them and
            # the controller's calls.
            actor: Any = remote_class().options(
                name=actor_name(dep, rid), namespace=NAMESPACE, lifetime="detached",
                max_restarts=0, max_concurrency=max(1000, 2 * spec["max_ongoing_requests"] + 16), **opts,
            ).remote(dep, rid, spec["cls"], spec["args"], spec["kwargs"], rec.lineage, cmd.rank.rank,
                     rec.world_size, spec["max_ongoing_requests"], **extra)
            rec.actor = actor
            # Placed once its room is held there: its own group pinned to the node (or a hard
            # affinity) is where it is; its process starting up is part of its start (the
            # core's start_timeout_s, not its placement_timeout_s). A caller's bundle may have
            # moved: there the actor says where it runs.
            where = await actor.node_id.remote() if cmd.group is not None else node
        except Exception as exc:  # refused by Ray, or died starting
            self._placed(rid)
            gone = led.forget(rid)
            if rid in led.stopping:
                return
            if static is not None and cmd.group is not None and group_removed(static):
                # the caller removed its group: no bundle is anywhere (every replica FAILED), not a crash loop
                led.feed(rc.BundlesPlaced(deployment=dep, bundle_nodes=(None,) * static.placement_group.bundle_count))
                return
            cause = death_cause(exc, gone.actor if gone is not None else None)
            led.feed(rc.ReplicaCrashed(replica_id=rid, reason=f"failed to start: {exc}"[:2000], cause=cause))
            return
        self._placed(rid)
        if rid in led.stopping or led.actor(rid) is None:  # stopped while its actor started: the stop killed it
            return
        led.starting_at(rid, where)  # (a caller's bundle may have moved)
        led.spawn(self.watcher.watch(rid, actor))
        led.feed(rc.ReplicaPlaced(replica_id=rid, node_id=where))

    async def _reserve(self, rec: ReplicaRecord, rid: str, dep: str, bundles: list, strategy: str,
                       node: str) -> str | None:
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
        rec.pg = pg
        ready = asyncio.ensure_future(pg.ready())
        try:
            while True:
                done, _ = await asyncio.wait([ready], timeout=self.group_poll_s)
                if done:
                    ready.result()
                    return None
                refused = group_refused(pg, node)
                if refused is not None:
                    return refused
        except Exception as exc:
            return f"placement group failed: {exc}"
        finally:
            if not ready.done():
                ready.cancel()

    async def initialize(self, cmd: rc.InitializeReplica, seq: tuple[int, int] | None = None) -> None:
        led = self.ledger
        rid = cmd.replica_id
        rec = led.replicas.get(rid)
        if rec is None or rec.actor is None or rid in led.stopping:
            return
        actor = rec.actor
        rec.check_every = (cmd.health_check_period_s, cmd.health_check_timeout_s)
        try:
            weights = await led.weights_ref(cmd.deployment, cmd.weights_version)
            warm, cold = None, None
            if rec.source:
                warm, cold = await self._warm_copy(rid, rec), self.caches.cold_path(led.node_of(rid), cmd.deployment)
            rec.del_on_abort = callable(getattr(led.specs.get(cmd.deployment, {}).get("cls"), "__del__", None))
            await actor.initialize.remote(cmd.rank.as_tuple(), cmd.world_size, cmd.user_config,
                                          cmd.call_reconfigure, cmd.pass_rank, seq, cmd.weights_version, weights,
                                          warm, cold)
            if rec.source:
                led.spawn(self._loaded(rid, actor, cmd.deployment))
        except Exception as exc:
            self.failed(rid, "__init__" if not cmd.call_reconfigure else "__init__/reconfigure", exc)
            return
        if self._ready(rid, actor):
            node = led.node_of(rid)
            if node is not None and led.spares.target(node):
                led.spawn(self._spare_taken(rid, node, actor))

    async def _warm_copy(self, rid: str, rec: ReplicaRecord) -> Any:
        """The ObjectRef of the WARM copy taken for ``rid`` when it was placed (Ray resolves it
        in the replica: ``FlatWeights``), or None: none on its node (it loads COLD: said in the
        trace), or its source is cold."""
        refs, rec.warm = rec.warm, None
        if refs is None:
            return None
        try:
            came_from = await refs[0]
        except Exception as exc:  # the cache's node or process is gone
            came_from = None
            log.warning("replica %s: its node's WARM cache did not answer: %r", rid, exc)
        if came_from is None:
            self.caches.missing(rid, self.ledger.node_of(rid), rec.deployment)
            return None
        return refs[1]

    async def _loaded(self, rid: str, actor: Any, deployment: str) -> None:
        """Note where a replica booked by memory took its weights from (``Ledger.tier_log``)."""
        try:
            info = await actor.weights_info.remote()
        except Exception:
            return
        self.ledger.tier_log.append({"replica": rid, "deployment": deployment, "move": "start",
                                     "source": info["source"], "loaded_from": info["loaded_from"],
                                     "note": info["note"], "nbytes": info["nbytes"], "devices": info["devices"]})

    async def await_started(self, rid: str, actor: Any) -> None:
        """A replica reported ``starting`` (its ``__init__`` was running when the
        controller restarted): answer ReplicaReady when it finishes."""
        try:
            await actor.started.remote()
        except Exception as exc:
            self.failed(rid, "initialize", exc)
            return
        self._ready(rid, actor)

    def _ready(self, rid: str, actor: Any) -> bool:
        """Its ``__init__`` returned: ReplicaReady, and its health checks from now
        on; False (nothing done) if it was stopped meanwhile."""
        rec = self.ledger.replicas.get(rid)
        if rec is None or rec.actor is None or rid in self.ledger.stopping:
            return False
        rec.initialized = True
        self.ledger.starting_at(rid, None)
        self.ledger.feed(rc.ReplicaReady(replica_id=rid))
        self.watcher.start_checks(rid, actor)
        return True

    async def reconfigure(self, cmd: rc.ReconfigureReplica, seq: tuple[int, int] | None = None) -> None:
        actor = self.ledger.actor(cmd.replica_id)
        if actor is None or cmd.replica_id in self.ledger.stopping:
            return
        try:
            await actor.reconfigure.remote(cmd.rank.as_tuple(), cmd.world_size, cmd.user_config, cmd.version,
                                           cmd.call_user, cmd.pass_rank, seq)
        except Exception as exc:
            self.failed(cmd.replica_id, "reconfigure", exc)
            return
        self.ledger.feed(rc.ReplicaReconfigured(replica_id=cmd.replica_id, version=cmd.version))

    # ------------------------------------------------------------- weights
    async def move(self, cmd: rc.OffloadReplica | rc.LoadReplica) -> None:
        """Sleep (``OffloadReplica``: weights to CPU memory) or wake (``LoadReplica``: back on
        its device): ``TierMoved`` with the bytes moved, ``TierMoveFailed`` if the move raised
        (the weights stay where they were). A replica that died meanwhile is its watch's news."""
        from ray.exceptions import RayActorError

        led = self.ledger
        rid = cmd.replica_id
        actor = led.actor(rid)
        if actor is None or rid in led.stopping:
            return
        sleep = isinstance(cmd, rc.OffloadReplica)
        try:
            nbytes = await (actor.offload if sleep else actor.load).remote()
        except RayActorError:
            return
        except Exception as exc:
            if led.actor(rid) is not None and rid not in led.stopping:
                detail = getattr(exc, "cause", None) or exc
                led.feed(rc.TierMoveFailed(replica_id=rid, reason=f"{'offload' if sleep else 'load'} raised: "
                                                                  f"{detail!r}"[:2000]))
            return
        if led.actor(rid) is not None and rid not in led.stopping:
            led.transferred(cmd.deployment, "offload" if sleep else "load", int(nbytes))
            led.feed(rc.TierMoved(replica_id=rid, tier="warm" if sleep else "hot", nbytes=int(nbytes)))

    async def update_weights(self, cmd: rc.UpdateWeights) -> None:
        """New weights (the version's ObjectRef from the store, resolved by Ray in the replica),
        written in place wherever its weights are: ``WeightsUpdated``. A replica that cannot
        take them (wrong names or shapes, none kept) crashes (``cause="error"``): it must not
        serve other weights than the core believes."""
        led = self.ledger
        rid = cmd.replica_id
        actor = led.actor(rid)
        if actor is None or rid in led.stopping:
            return
        try:
            ref = await led.weights_ref(cmd.deployment, cmd.version)
            nbytes = await actor.update_weights.remote(cmd.version, ref)
        except Exception as exc:
            self.failed(rid, f"update_weights({cmd.version})", exc)
            return
        if led.actor(rid) is not None and rid not in led.stopping:
            led.transferred(cmd.deployment, "update", int(nbytes))
            led.feed(rc.WeightsUpdated(replica_id=rid, version=cmd.version))

    def failed(self, rid: str, what: str, exc: BaseException) -> None:
        """A call into the user's code (``__init__``, ``reconfigure``) raised:
        ``ReplicaCrashed(cause="error")``; its process, of no use now, is killed.
        A call that failed because the actor died is left to its watch."""
        from ray.exceptions import RayActorError

        led = self.ledger
        if led.actor(rid) is None or rid in led.stopping or isinstance(exc, RayActorError):
            return
        self.kill(rid)
        detail = getattr(exc, "cause", None) or exc
        led.feed(rc.ReplicaCrashed(replica_id=rid, reason=f"{what} raised: {said(detail)}"[:2000], cause="error",
                                   now=led.now()))

    # --------------------------------------------------------------- gangs
    def gang_changed(self, cmd: rc.GangChanged) -> None:
        """A gang's members changed (``restart_replica`` replaced one): every
        member's context shows the new list, then its ``on_gang_changed(gang)``
        runs if the class has one (those not created yet get the list at
        creation, and no call)."""
        led = self.ledger
        for rid in cmd.members:
            rec = led.replicas.get(rid)
            if rec is None:
                continue
            if rec.checkpointed and rec.gang is not None:
                rec.gang = attrs.evolve(rec.gang, members=tuple(cmd.members))
            if rec.actor is not None:
                led.spawn(self._tell_gang(rid, rec.actor, cmd))
        led.checkpoint()

    async def _tell_gang(self, rid: str, actor: Any, cmd: rc.GangChanged) -> None:
        """GangChanged to one member; a hook that raised is logged here, with the replica."""
        try:
            await actor.set_gang.remote(cmd.gang_id, tuple(cmd.members))
        except Exception as exc:
            if self.ledger.actor(rid) is not None:
                log.error("replica %s: on_gang_changed for %s failed: %r", rid, cmd.gang_id, exc)

    # -------------------------------------------------------------- groups
    def reform_group(self, cmd: rc.ReformGroup) -> None:
        """A collective group's new epoch, to one member: its context shows it, its
        ``on_group_changed(group)`` runs if the class has one (``ReplicaActor.set_group``)."""
        actor = self.ledger.actor(cmd.replica_id)
        if actor is not None:
            self.ledger.spawn(self._tell_group(cmd.replica_id, actor, cmd))

    async def _tell_group(self, rid: str, actor: Any, cmd: rc.ReformGroup) -> None:
        try:
            await actor.set_group.remote(cmd.group)
        except Exception as exc:
            if self.ledger.actor(rid) is not None:
                log.error("replica %s: on_group_changed for %s epoch %d failed: %r", rid, cmd.group.group_id,
                          cmd.group.epoch, exc)

    # -------------------------------------------------------------- spares
    def keep_spares(self, cmd: rc.KeepSpareProcesses) -> None:
        """Keep the count the core asks of the node; top it up now unless a
        replica of ours is starting there (it may be about to take an idle
        process: the refill after it has started tops up then)."""
        self.ledger.spares.keep(cmd)
        self.top_up_spares(cmd.node_id)

    def top_up_spares(self, node: str) -> None:
        """Top the node's spares up, unless a replica of ours is being placed or
        started there: it may be about to take an idle process, and the pool
        could take its new process for a spare (the last one to start tops up).
        One look at the node's replicas starting (``Ledger.starting``), not a scan
        of every replica: a bulk deploy's ReplicaReadys cost each the same."""
        if not self.ledger.starts_on(node):
            self.ledger.spares.refill(node)

    async def _spare_taken(self, rid: str, node: str, actor: Any) -> None:
        """A replica started on a node that keeps spares: was its process one? Then top the node up."""
        try:
            self.ledger.spares.took(node, await actor.pid.remote())
        except Exception:  # (gone meanwhile: the top-up below still runs)
            pass
        self.top_up_spares(node)

    # --------------------------------------------------------------- stops
    def kill(self, rid: str) -> Any:
        """Kill the replica's process now (it is then no news when it dies) and
        let go of it; returns its actor handle, or None if it had none."""
        self.ledger.stopping.add(rid)
        rec = self.ledger.forget(rid)
        if rec is None or rec.actor is None:
            return None
        try:
            ray.kill(rec.actor, no_restart=True)
        except Exception as exc:  # already gone
            log.debug("ray.kill(%s): %r", rid, exc)
        return rec.actor

    def stop_now(self, cmd: rc.StopReplica) -> None:
        """Carry a StopReplica out: what is under way for the replica is
        cancelled; one that may hold calls (initialised) is drained for up to
        ``graceful_shutdown_timeout_s`` (``_drain``); one whose constructor runs, of a class with a
        ``__del__``, has it run first (``_abort_start``); any other, or with a 0 s
        timeout, is killed here and now, its group removed, before the step's
        next command runs. ``ReplicaStopped`` follows."""
        rid = cmd.replica_id
        self.ledger.stopping.add(rid)
        self.cancel_chain(rid)
        rec = self.ledger.replicas.get(rid)
        if rec is not None and rec.actor is not None and rec.initialized and cmd.graceful_shutdown_timeout_s > 0:
            check, rec.checks = rec.checks, None  # (not checked while it drains)
            if check is not None:
                check.cancel()
            self.in_order(rid, self._drain(rid, rec.actor, cmd))
            return
        if rec is not None and rec.actor is not None and rec.del_on_abort and cmd.graceful_shutdown_timeout_s > 0:
            self.in_order(rid, self._abort_start(rid, rec.actor, cmd))
            return
        actor = self.kill(rid)
        self.in_order(rid, self._stopped(rid, actor))

    async def _abort_start(self, rid: str, actor: Any, cmd: rc.StopReplica) -> None:
        """Stopped while its constructor runs: the user's ``__del__`` first (``abort_start``; within
        ``graceful_shutdown_timeout_s``), as Serve's replica runs its destructor at shutdown; then the
        kill."""
        await _within(actor.abort_start.remote(), cmd.graceful_shutdown_timeout_s)
        await self._stopped(rid, self.kill(rid))

    def evict(self, cmd: rc.EvictReplica) -> None:
        """Carry an ``EvictReplica`` out: a stop (``stop_now``'s drain), and between the drain and
        the kill the weights leave: into the node's WARM cache (``to="warm"``: the replica hands
        them over, the cache keeps its own copy) or to the node's COLD file (``"cold"``).
        ``ReplicaStopped`` follows, as for a stop (the core then places the replica it made
        room for). A replica that never started holds no weights: killed as by a stop."""
        rid = cmd.replica_id
        self.ledger.stopping.add(rid)
        self.cancel_chain(rid)
        rec = self.ledger.replicas.get(rid)
        if rec is None or rec.actor is None or not rec.initialized:
            self.in_order(rid, self._stopped(rid, self.kill(rid)))
            return
        check, rec.checks = rec.checks, None
        if check is not None:
            check.cancel()
        self.in_order(rid, self._evict(rid, rec.actor, cmd))

    async def _evict(self, rid: str, actor: Any, cmd: rc.EvictReplica) -> None:
        led = self.ledger
        await self._routers_resynced()
        await _drained(actor, cmd.graceful_shutdown_wait_loop_s, cmd.graceful_shutdown_timeout_s)
        entry = {"replica": rid, "deployment": cmd.deployment, "move": "evict", "to": cmd.to, "nbytes": 0,
                 "error": ""}
        try:
            if cmd.to == "warm":
                entry["nbytes"] = await self.caches.get(cmd.node_id).keep.remote(
                    cmd.deployment, rid, actor.evict_weights.remote("warm", None))
            else:
                entry["nbytes"] = await actor.evict_weights.remote(
                    "cold", self.caches.cold_path(cmd.node_id, cmd.deployment))
        except Exception as exc:  # its weights are lost with it: a later start there loads COLD (and says so)
            entry["error"] = repr(exc)[:500]
            log.warning("replica %s: its eviction to %s failed: %r", rid, cmd.to, exc)
        led.tier_log.append(entry)
        await self._stopped(rid, self.kill(rid))

    def drop_warm_copy(self, cmd: rc.DropWarmCopy) -> None:
        """``DropWarmCopy``: the node's cache writes that copy to the node's COLD file, then frees it."""
        self.ledger.spawn(self.caches.drop(cmd.node_id, cmd.deployment, cmd.replica_id))

    async def _drain(self, rid: str, actor: Any, cmd: rc.StopReplica) -> None:
        """Let the calls in flight finish (the replica looks every
        ``graceful_shutdown_wait_loop_s``), for up to
        ``graceful_shutdown_timeout_s``; then kill it. Within ``ROUTERS_RESYNC_S`` of a recovery the
        drain begins only then (``_routers_resynced``)."""
        await self._routers_resynced()
        await _drained(actor, cmd.graceful_shutdown_wait_loop_s, cmd.graceful_shutdown_timeout_s)
        await self._stopped(rid, self.kill(rid))

    async def _stopped(self, rid: str, actor: Any) -> None:
        """Answer ``ReplicaStopped``: the kill and the removal of its group are
        sent (Ray frees the group's resources, and kills what runs in it, with
        the removal)."""
        self.ledger.feed(rc.ReplicaStopped(replica_id=rid, now=self.ledger.now()))


#: command type -> what carries it out (the core's commands are final classes: a type, not an
#: ``isinstance`` chain); ``Carrier.execute`` refuses a type that has none. Beside the simulator's
#: ``world.CARRIES``: the two cover every command (tests/unit/test_dispatch_tables.py)
CARRIES: dict[type, Callable[[Carrier, Any], None]] = {
    rc.StartReplica: Carrier.start, rc.PlaceReplica: Carrier._place, rc.ScheduleTick: Carrier._tick,
    rc.InitializeReplica: Carrier._initialize, rc.ReconfigureReplica: Carrier._reconfigure,
    rc.StopReplica: Carrier.stop_now, rc.EvictReplica: Carrier.evict, rc.DropWarmCopy: Carrier.drop_warm_copy,
    rc.GangChanged: Carrier.gang_changed, rc.ReformGroup: Carrier.reform_group,
    rc.KeepSpareProcesses: Carrier.keep_spares,
    rc.OffloadReplica: Carrier._move, rc.LoadReplica: Carrier._move, rc.UpdateWeights: Carrier._update_weights,
    rc.RequestResources: Carrier.request_resources, rc.StartProxy: Carrier._proxy, rc.DrainProxy: Carrier._proxy,
    rc.StopProxy: Carrier._proxy, rc.UpdateWorldSize: Carrier._world_size,
    rc.UpdateHealthChecks: Carrier._health_checks,
}


def said(exc: BaseException) -> str:
    """An exception as ``Type: its words`` (``repr`` when it has none): a ``RuntimeEnvSetupError``'s
    ``repr`` is ``RuntimeEnvSetupError()``, its words ("Failed to set up runtime environment" and why)
    only in its text."""
    text = str(exc).strip()
    return f"{type(exc).__name__}: {text}" if text else repr(exc)


async def _drained(actor: Any, wait_loop_s: float, timeout_s: float) -> None:
    """Let a stopping replica's calls in flight finish (it looks every ``wait_loop_s``),
    for up to ``timeout_s`` (a stop and an eviction drain alike)."""
    await _within(actor.prepare_stop.remote(wait_loop_s, timeout_s), timeout_s)


async def _within(ref: Any, timeout_s: float) -> None:
    """Wait for a stopping replica's call ``ref`` for up to ``timeout_s``: its kill follows whatever it did."""
    try:
        await asyncio.wait_for(ref, timeout=timeout_s)
    except Exception:  # (timed out, or died meanwhile)
        pass
