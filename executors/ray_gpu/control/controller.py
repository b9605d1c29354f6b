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

This module holds the actor's API (its remote methods; its loops and the
observers of the core's steps are ``loops.py``) and wires its jobs
together, each in a module of its own on one ``Ledger`` (``ledger.py``: the
driver, a ``ReplicaRecord`` per replica, the specs): ``carry.py`` carries the
core's commands out, ``observe.py`` watches Ray, ``persist.py`` saves what a
restarted controller recovers from and ``recover.py`` rebuilds from it,
``record.py`` writes the trace and the metrics.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections import deque
from collections.abc import Callable
from typing import Any

import attrs
from ray import cloudpickle

import rankcore as rc
from rankcore.requests import zone_of

from ..base import persist
from ..base.autoscale import LoadBook
from ..base.fingerprint import class_fingerprint
from ..base.replicas import CONTROLLER_NAME, NAMESPACE, ReplicaRecord, actor_name
from . import placement as pl
from . import static as st
from .carry import Carrier
from .ledger import Ledger
from .loops import FAULTS_KEPT, ControllerLoops
from .observe import UNSEEN_GROUP_PREFIX, Watcher, group_removed, held_by_callers
from .proxies import INGRESS_NAME, ProxySettings
from .record import Recorder, queue_fault
from .recover import Recovery
from .spares import SparePool

__all__ = ["CONTROLLER_NAME", "CORE_OPTIONS", "controller_actor", "NAMESPACE", "UNSEEN_GROUP_PREFIX", "Controller", "ReplicaRecord",
           "actor_name", "held_by_callers", "queue_fault"]

#: the deployment options ``apply`` passes to ``DeploymentApplied`` (``@deployment(...)``'s)
CORE_OPTIONS: tuple[str, ...] = rc.options.as_is("ray")  # (what Ray takes as is: rankcore.base.options)

log = logging.getLogger("rankcore.ray.controller")


#: a router's load push while the controller recovers is answered at once with this interval
#: (nothing recorded; reports do not queue behind the recovery)
RECOVERING_RETRY_S = 1.0


class Controller(ControllerLoops):
    """The controller actor's face: its remote methods (deploy, scale, delete, sleep and wake, weights,
    proxies, what it reports), each answered after a restart's recovery (``ControllerLoops._ready``).
    Its loops and the observers of the core's steps are ``ControllerLoops`` (``loops.py``)."""

    def __init__(self) -> None:
        self.ledger = Ledger()
        self.ledger.booking, self.ledger.cuda = persist.load_booking()  # (a restart declares the same memory)
        self.recorder = Recorder(self.ledger)
        self.watcher = Watcher(self.ledger)
        self.carrier = Carrier(self.ledger, self.watcher)
        self.ledger.driver.backend = self.carrier
        self.recovery = Recovery(self.ledger, self.watcher, self.carrier, self.recorder)
        #: deployment -> how many of the core's pool commands named it (``pool_after``'s version, with the
        #: controller's incarnation: a restarted controller's answers differ from the last one's)
        self._pool_versions: dict[str, int] = {}
        self._pool_changed: asyncio.Event | None = None
        self.ledger.driver.observers.append(self._count_pool)
        self.ledger.driver.observers.append(self._forget_deleted)
        self._spares_checked = time.monotonic()
        self._cluster_task: asyncio.Task | None = None
        self.loads = LoadBook()  # the routers' load (autoscaling; a restarted controller starts empty)
        self._autoscale_task: asyncio.Task | None = None
        self.metrics = self._start_metrics()
        self.faults: deque[dict] = deque(maxlen=FAULTS_KEPT)  # (``rankcore status``: recent_faults)
        self.ledger.driver.observers.append(self._note_fault)

    # ------------------------------------------------------------ metrics (issue 37)
    async def metrics_text(self) -> bytes:
        """The controller's metrics in Prometheus's text format (the ingress's ``/metrics`` serves
        them after its own). Read as they are, the recovery not waited for: a scrape changes nothing."""
        return self.metrics.exposition(self.driver.state, len(self.ledger.errors))

    async def report_load(self, name: str, key: str, queued: int, ongoing: tuple, urgent: bool = False) -> float | None:
        """A router's load (``autoscale.LoadReporter``): kept until the next sample. Answers the
        deployment's ``metrics_interval_s``, None when it is not autoscaled. ``urgent`` (queued with
        no replica serving): a deployment at target 0 is fed at once (scale from zero)."""
        if not self.recovery.done:  # (restarting: no wait for the recovery here, the router asks again soon)
            return RECOVERING_RETRY_S
        dep = self.driver.state.deployments.get(name)
        if dep is None or not dep.config.autoscaler.autoscaling:
            return None
        now = time.monotonic()
        interval = dep.config.autoscaler.metrics_interval_s
        self.loads.report(name, key, queued, ongoing, now)
        if urgent and dep.target == 0 and not dep.deleting and not self.ledger.halted:
            self._feed_load(name, now, interval)
        return interval

    async def report_models(self, name: str, replica_id: str, seq: int, models: tuple) -> None:
        """What a replica's multiplexed models are now (``replica.multiplex``: loaded and loading), numbered
        by the replica (``seq``: an older report crossing a newer one is dropped): told to the core
        (``ModelsReported``), which keeps them on the replica's record and tells the pool
        (``ReplicaModels``); routers get them with the pool (``_pool``: ``models``), their machines
        route by them (``rankcore.requests.route_model``)."""
        await self._ready()
        if replica_id not in self.ledger.replicas or self.ledger.models_seq.get(replica_id, -1) >= seq:
            return  # (a replica let go of, or a report crossing a newer one)
        self.ledger.models_seq[replica_id] = seq
        self.ledger.feed(rc.ModelsReported(replica_id=replica_id, model_ids=tuple(models)))

    # ------------------------------------------------------------ faults (issue 37: ``rankcore status``)
    async def recent_faults(self) -> list[dict]:
        """The latest faults (``FAULTS_KEPT``), oldest first, and the events the core rejected."""
        await self._ready()
        return list(self.faults) + [{"t": None, "event": "rejected", "detail": e} for e in self.ledger.errors]

    # ------------------------------------------------------------ recording
    async def record(self, meta: dict, snapshot_every: int = 1) -> None:
        """Write a trace (docs/trace-format.md) from now on, a snapshot every
        ``snapshot_every`` steps (a scenario's ``trace.snapshot_every``);
        ``drain_trace`` reads it."""
        await self._ready()
        persist.set_recording(snapshot_every)
        self.recorder.start({"executor": "ray", **meta}, header=True, snapshot_every=snapshot_every)

    async def drain_trace(self) -> str:
        """The trace text written since the last call."""
        await self._ready()
        return self.recorder.drain()

    async def fault(self, type_: str, fields: dict) -> None:
        """Record a fault the scenario runner injected (a ``fault`` trace record)."""
        await self._ready()
        self.recorder.fault(type_, fields)

    async def halt(self) -> str:
        """Stop stepping the core and hand back the trace not yet drained: call it
        just before killing the controller (a crash from then on). Nothing the
        controller wrote is lost between the last drain and the kill; answers
        arriving after it are lost, as with any crash."""
        await self._ready()
        self.ledger.halted = True
        if self._cluster_task is not None:
            self._cluster_task.cancel()
        for rec in list(self.ledger.replicas.values()):
            if rec.checks is not None:
                rec.checks.cancel()
        self.carrier.cancel_timers()
        for task in list(self.ledger.tasks):  # starts, stops, watches: left where a crash would leave them
            task.cancel()
        return self.recorder.drain()

    async def check(self, expectation: Any, settle: float = 30.0) -> dict:
        """Check one expectation now, re-checking for up to ``settle`` seconds
        until it holds (Ray has no virtual clock: "at t" means "by the time the
        timeline got there and things settled"). Returns its trace record."""
        await self._ready()
        deadline = time.monotonic() + settle
        result = self.recorder.check(expectation)
        while not result.passed and time.monotonic() < deadline:
            await asyncio.sleep(0.1)
            result = self.recorder.check(expectation)
        return result.as_record()

    async def finish_trace(self, expectations: list, earlier: list | None = None) -> tuple[str, list]:
        """Check ``expectations`` now, write the end records (after ``earlier``
        results, from ``check``), stop recording."""
        await self._ready()
        records = list(earlier or []) + [self.recorder.check(e).as_record() for e in expectations]
        text = self.recorder.end(records)
        return text, [(r["name"], r["passed"], r["detail"]) for r in records]

    # ------------------------------------------------------------------ API
    async def apply(self, name: str, num_replicas: int, user_config: Any, cls: type, args: tuple, kwargs: dict,
                    actor_options: dict, max_ongoing_requests: int, placement: dict | None = None,
                    max_replicas: int = rc.DEFAULT_MAX_REPLICAS, options: dict | None = None,
                    version: str | None = None, modules: dict[str, str] | None = None) -> None:
        """Deploy or update ``name``. ``options``: the core's deployment options
        (``rankcore.base.options.OPTION_NAMES``: health checks, graceful shutdown,
        placement timeout, restart backoff; and ``start_timeout_s``), passed to
        ``DeploymentApplied`` as given. ``placement``: ``placement_group_bundles``,
        ``placement_group_strategy``, ``replica_placement`` (see api.deployment).
        The core places its replicas: it is told what one replica reserves on
        its node (``placement.replica_need``: the whole group when the group is
        on one node, else bundle 0 only) and the policy. ``placement`` may also
        hold ``static`` (a ``StaticPlacementConfig``: the caller's group, whose
        bundles' nodes the core is told; nothing is reserved) and the gang
        options ``gang_size``, ``gang_placement``, ``gang_failure``. ``version``: the
        code's (a new one rolls every replica onto ``cls``: docs/rollouts.md), a fingerprint
        of what the replicas run when the user gave none, with the project ``modules`` it was
        taken over (``fingerprint.stamp``, by ``api.run``, ``rankcore deploy`` and the scenario
        runner: where the code was imported; never here, whose copy of the class may be
        stale); each replica checks them when it starts (``fingerprint.check_modules``). None
        (callers inside the project only): ``cls``'s own fingerprint, unchecked. Every
        replica started from now on runs ``cls``, ``args`` and ``kwargs``. A bad
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
                                     static_placement=static.to_core(None) if static is not None else None,
                                     version=version if version is not None else class_fingerprint(cls), **gang)
        if static is not None:
            static.check_actor_fits(pl.actor_resources(pl.static_actor_options(actor_options)))
            await self._group_ready(name, static)
        await self._ready()
        self.watcher.sync_nodes()  # the nodes first (after a reset the core knows none)
        if static is not None:  # where the caller's bundles are (on nodes the core knows)
            event = event.replace(static_placement=static.to_core(
                st.bundle_nodes(static.placement_group, set(self.ledger.nodes))))
        before = self.ledger.specs.get(name)
        self.ledger.specs[name] = {"cls": cls, "args": args, "kwargs": kwargs, "actor_options": actor_options,
                            # (the request limits: the core's config, declared once in rankcore.base.options;
                            # ``max_ongoing_requests`` the caller passes is that one's too)
                            "max_ongoing_requests": event.config.max_ongoing_requests, "bundles": bundles,
                            **_methods(cls),
                            "pg_strategy": pg_strategy, "placement": spread, "static": static, **gang,
                            # (what its replicas check at their start: fingerprint.check_modules)
                            "modules": modules if version is not None else None}
        try:
            self.driver.feed(event, self.ledger.now())
        except Exception:
            if before is None:
                self.ledger.specs.pop(name, None)
            else:
                self.ledger.specs[name] = before
            raise
        self._pool_versions[name] = self._pool_versions.get(name, 0) + 1  # (its limits may have changed)
        self._wake_pools()
        self._persist()

    async def _group_ready(self, name: str, static: st.StaticPlacementConfig, timeout: float = 60.0) -> None:
        """The caller's group must exist: wait for it to be placed (its bundles'
        nodes are what the core is told)."""
        pg = static.placement_group
        if group_removed(static):
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
        if name not in self.ledger.specs:
            raise rc.InvalidEvent(f"unknown deployment {name!r}")
        event = rc.ScaleRequested(deployment=name, num_replicas=num_replicas, victims=victims)
        self.driver.feed(event, self.ledger.now())  # (first: the core's own words for a count it refuses)
        self._persist()

    async def delete(self, name: str) -> None:
        """Delete ``name`` and leave the others be (``DeploymentDeleted``): the core drains and
        stops its replicas and forgets it once they have gone (``_forget_deleted``; its HTTP
        route is dropped by ``api.delete``). An unknown name raises ``InvalidEvent`` and changes
        nothing."""
        await self._ready()
        dep = self.driver.state.deployments.get(name)
        if name not in self.ledger.specs or dep is None:
            raise rc.InvalidEvent(f"delete: unknown deployment {name!r} "
                                  f"(known: {', '.join(sorted(self.ledger.specs)) or 'none'})")
        if dep.deleting:
            return
        self.driver.feed(rc.DeploymentDeleted(deployment=name), self.ledger.now())
        self._persist()

    async def wait_deleted(self, name: str, timeout: float = 60.0) -> bool:
        """Wait until the core has forgotten ``name`` (its last replica stopped)."""
        return await _until(lambda: name not in self.driver.state.deployments, timeout)

    # ------------------------------------------------- memory-booked placement
    async def book_memory(self, booking: Any) -> list:
        """Memory-booked placement from now on (``memory.MemoryBooking``; None: GPUs counted
        again): every node with GPUs declares its devices and CPU cache to the core
        (``Watcher.declared``; memory read from CUDA is probed here first). Only while no
        deployment is applied (a node the core knows cannot change what it declared): the
        core is then told the nodes again. Returns each node as told: (id, devices, cpu cache)."""
        await self._ready()
        if self.driver.state.deployments:
            raise rc.InvalidConfig("book_memory: deployments are applied; call it before the first run() "
                                   "(or after a reset)")
        led = self.ledger
        led.booking = booking
        led.cuda.clear()
        led.save_booking()
        if booking is not None:
            import ray

            for n in ray.nodes():
                if n.get("Alive") and booking.wants_cuda(pl.node_joined(n)):
                    await self.watcher.probe(n["NodeID"])
        led.nodes.clear()
        self.driver.state = rc.State()  # (no deployment: nothing but the nodes, told again now)
        joined = self.watcher.alive_nodes()
        self.watcher.sync_nodes()
        return [(j.node_id, tuple(j.devices), j.cpu_cache_bytes) for j in joined]

    async def tiers_status(self) -> dict:
        """The tier moves carried out (``Ledger.tier_log``: evictions, starts from WARM or COLD,
        dropped copies) and each node's WARM cache (entries, bytes held)."""
        await self._ready()
        return {"log": list(self.ledger.tier_log), "caches": await self.carrier.caches.info(),
                "booking": self.ledger.booking, "cuda": dict(self.ledger.cuda)}

    # -------------------------------------------------- sleep, wake, weights
    def _known(self, name: str) -> None:
        if name not in self.ledger.specs:
            raise rc.UnknownDeployment(f"unknown deployment {name!r}")

    async def _keep_weights(self, name: str, version: int, weights: list | None) -> None:
        """Put ``weights`` (``[ref]`` of a state_dict, or None) in the store as ``version``. A class
        that holds weights (``replica_weights.holds_weights``) needs them for a new version."""
        from ..weights.replica import holds_weights
        from ..weights.store import store

        if weights is None:
            if holds_weights(self.ledger.specs[name]["cls"]):
                raise rc.InvalidEvent(f"weights version {version} for {name!r}: its class holds weights "
                                      f"(state_dict/load_state_dict), so the new version needs its state_dict")
            return
        ref = await store().put.remote(name, version, weights[0])
        self.ledger.weights[(name, version)] = ref[0]

    async def _drop_weights(self, name: str, version: int) -> None:
        from ..weights.store import store

        self.ledger.weights.pop((name, version), None)
        await store().drop.remote(name, version)

    async def sleep(self, name: str) -> None:
        """``SleepRequested``: every replica's weights to CPU memory; processes, ranks, bundles kept."""
        await self._ready()
        self._known(name)
        self.driver.feed(rc.SleepRequested(deployment=name), self.ledger.now())
        self._persist()

    async def push_weights(self, name: str, version: int, weights: list | None) -> None:
        """``WeightsPushed``: ``weights`` (``[ref]`` of the state_dict; None for a class that holds
        none) kept in the store as ``version``, then every replica is sent them. A version the
        core refuses (not newer) raises its ``InvalidEvent`` and is not kept."""
        await self._ready()
        self._known(name)
        await self._keep_weights(name, version, weights)
        try:
            self.driver.feed(rc.WeightsPushed(deployment=name, version=version), self.ledger.now())
        except Exception:
            if weights is not None:
                await self._drop_weights(name, version)
            raise
        self._persist()  # (the version pushed, rc.query.desired_weights: kept even if no replica holds it yet)

    async def wake(self, name: str, weights_version: int | None = None, weights: list | None = None) -> None:
        """``WakeRequested``: every sleeper's weights back on its device; with ``weights_version``
        newer than the deployment's, with those weights (``weights``, kept as for a push)."""
        await self._ready()
        self._known(name)
        dep = self.driver.state.deployments.get(name)
        new = weights_version is not None and dep is not None and weights_version > dep.weights_version
        if new:
            await self._keep_weights(name, weights_version, weights)  # type: ignore[arg-type]
        try:
            self.driver.feed(rc.WakeRequested(deployment=name, weights_version=weights_version), self.ledger.now())
        except Exception:
            if new and weights is not None:
                await self._drop_weights(name, weights_version)  # type: ignore[arg-type]
            raise
        self._persist()

    async def wait_serving(self, name: str, timeout: float = 120.0) -> bool:
        """Return True once ``name`` is healthy, awake, and every replica serves (running, HOT,
        holding the last version pushed); False after ``timeout``."""
        await self._ready()

        def serving() -> bool:
            dep = self.driver.state.deployments.get(name)
            return dep is not None and rc.query.fully_serving(dep)

        return await _until(serving, timeout)

    async def wait_asleep(self, name: str, timeout: float = 120.0) -> bool:
        """Return True once ``name`` is meant to sleep and every live replica's weights are WARM."""
        await self._ready()

        def asleep() -> bool:
            dep = self.driver.state.deployments.get(name)
            return dep is not None and dep.asleep and all(
                r.residency is rc.Residency.WARM for r in dep.replicas.values() if r.phase in rc.LIVE)

        return await _until(asleep, timeout)

    async def pools(self) -> dict:
        """The pools as the core's pool commands told them (``Driver.pools``: what the request
        path follows): ``{"members": {deployment: {replica: "serving"|"draining"}}, "coming":
        {deployment: bool}, "mismatch": None or how they differ from the core's state}``."""
        await self._ready()
        view = self.driver.pools
        return {"members": {k: dict(v) for k, v in view.members.items()}, "coming": dict(view.wanted),
                "mismatch": view.mismatch(self.driver.state)}

    async def replica_nodes(self, name: str) -> list[str]:
        """The nodes the core holds ``name``'s replicas on (a push by share needs a copy for the others)."""
        await self._ready()
        self._known(name)
        dep = self.driver.state.deployments.get(name)
        reps = dep.replicas.values() if dep is not None else ()
        return sorted({r.node_id for r in reps if r.node_id is not None})

    async def weights_status(self, name: str) -> dict:
        """Per replica id: what its actor says of its weights (``tier``, ``version``, ``nbytes``,
        ``host_nbytes``, ``device``; ``replica_weights.ReplicaWeights.info``) and what the core
        holds (``residency``, ``core_version``, ``pending``); ``deployment``: the deployment's
        ``asleep`` and ``weights_version``."""
        await self._ready()
        self._known(name)
        dep = self.driver.state.deployments.get(name)
        out: dict[str, Any] = {"deployment": {"asleep": dep.asleep if dep else False,
                                              "weights_version": dep.weights_version if dep else 0}}
        reps = dict(dep.replicas) if dep is not None else {}
        for rid, rep in sorted(reps.items()):
            actor = self.ledger.actor(rid)
            info: dict[str, Any] = {}
            if actor is not None:
                try:
                    info = await asyncio.wait_for(actor.weights_info.remote(), 10)
                except Exception as exc:
                    info = {"error": repr(exc)}
            out[rid] = {**info, "residency": rep.residency.value, "core_version": rep.weights_version,
                        "pending": rep.weights_pending}
        return out

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
                self.watcher.sync_nodes()
            except Exception as exc:  # GCS hiccup: next pass
                log.warning("could not read the cluster's nodes: %r", exc)
            await asyncio.sleep(0.1)
        return True

    async def wait_healthy(self, name: str, timeout: float = 120.0) -> bool:
        await self._ready()

        def healthy() -> bool:
            dep = self.driver.state.deployments.get(name)
            return dep is not None and dep.healthy

        return await _until(healthy, timeout)

    def _pool(self, name: str) -> dict:
        """``name``'s pool as the core's pool commands made it (``Driver.pools``), with the actors of
        its serving replicas and the request limits (what ``router.Router`` feeds its machine)."""
        members = self.driver.pools.members.get(name, {})
        spec = self.ledger.specs.get(name, {})
        serving, draining = [], []
        for rid in sorted(members):
            actor = self.ledger.actor(rid)
            if members[rid] == "serving" and actor is not None:
                serving.append((rid, actor))
            else:
                draining.append(rid)
        dep = self.driver.state.deployments.get(name)
        limits = (dep.config if dep is not None else rc.options.DEFAULTS).requests  # (declared once: rankcore.base.options)
        held = self.driver.pools.models  # (the core's ReplicaModels, as its pool commands said them)
        models = {rid: held.get(rid, ()) for rid, _ in serving}  # (every one: () says it holds none)
        reps = dep.replicas if dep is not None else {}
        nodes = {rid: reps[rid].node_id for rid, _ in serving if rid in reps and reps[rid].node_id is not None}
        live = self.driver.state.cluster.nodes
        zones = {n: z for n in live if (z := zone_of(live[n].labels))}  # (the locality router's)
        return {"version": (self.ledger.incarnation, self._pool_versions.get(name, 0)), "serving": serving,
                "models": models, "nodes": nodes,  # (where each one's witness is read: base.witness)
                "zones": zones, "request_router": limits.request_router,
                "request_router_kwargs": dict(limits.request_router_kwargs),
                "draining": draining, "coming": self.driver.pools.wanted.get(name, False),
                "max_ongoing_requests": limits.max_ongoing_requests,
                "max_queued_requests": limits.max_queued_requests, "max_retries": limits.max_retries,
                "idempotent": spec.get("idempotent", ()), "streams": spec.get("streams", ())}

    async def pool(self, name: str) -> dict:
        """``name``'s request pool (``_pool``); an unknown deployment raises ``UnknownDeployment``."""
        await self._ready()
        self._known(name)
        return self._pool(name)

    async def pool_after(self, name: str, version: Any, timeout: float) -> dict:
        """A router's long poll (Ray Serve's ``listen_for_change``): ``pool(name)`` as soon as its
        version differs from ``version`` (a pool command for ``name`` came out of a step, its limits
        changed, or this is another controller), else after ``timeout`` s."""
        await self._ready()
        self._known(name)
        deadline = time.monotonic() + timeout
        while True:
            pool = self._pool(name)
            left = deadline - time.monotonic()
            if left <= 0 or pool["version"] != version:
                return pool
            if self._pool_changed is None:
                self._pool_changed = asyncio.Event()
            try:
                await asyncio.wait_for(self._pool_changed.wait(), left)
            except asyncio.TimeoutError:
                pass

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
        ``bundles`` (a static rank's bundle indices), ``gang`` (its gang's id),
        ``revision`` (the deployment's revision it was started with; the deployment's
        own is ``revision``, another is outdated: docs/rollouts.md) and ``blue_green``
        (during a blue-green switch: ``"blue"``, an old replica serving the ranks it was
        told, shown as its rank; ``"standby"``, a new one not serving yet; else None), and
        ``multiplexed_model_ids`` (the models it holds or loads, as it last said; sorted)."""
        gang_id = rc.gangs.gang_id

        await self._ready()
        dep = self.driver.state.deployments.get(name)
        if dep is None:
            raise rc.UnknownDeployment(f"unknown deployment {name!r}")
        replicas = {}
        for rid, _ in dep.ranks.items():  # (in the table's order)
            g = dep.ranks.global_rank(rid)
            rep = dep.replicas[rid]
            replicas[rid] = {
                "phase": rep.phase.value, "node_id": rep.node_id, "rank": rc.query.shown_ranks(dep, rid),
                "bundles": dep.static.bundles_of(g) if dep.static is not None else None,
                "gang": gang_id(name, g // dep.gang_size) if dep.gang_size > 1 else None,
                "revision": rep.revision, "blue_green": rc.query.blue_green_role(dep, rep),
                "multiplexed_model_ids": list(rep.models)}
        return {"name": name, "healthy": dep.healthy, "target": dep.target, "status": dep.status,
                "status_message": dep.status_message, "revision": dep.revision,
                "failed": sorted(r for r, v in replicas.items() if v["phase"] == rc.Phase.FAILED.value),
                "replicas": replicas}

    async def replica_details(self) -> dict:
        """What ``rankcore status`` shows of the replicas beside the core's state (``Watcher.details``,
        gathered once per replica, when its watch began: no replica is asked here): ``replicas``
        (replica -> its ``pid``, ``actor_id``, ``actor_name``, ``worker_id``, ``node_id``, ``node_ip``,
        ``start_time_s``, ``log_file_path``), ``gone`` (deployment -> its last replicas whose actors
        are gone, state ``STOPPED``) and ``unhealthy`` (deployment -> the message of one UNHEALTHY
        since a serving replica of it died, as Ray Serve shows it)."""
        await self._ready()
        return self.watcher.details()

    async def state(self) -> bytes:
        """The core's state now, pickled (``cloudpickle.loads`` it). Pickled here,
        on the event loop: Ray serialises return values on another thread, and
        a State's tables must not be read from two threads at once."""
        await self._ready()
        return cloudpickle.dumps(self.driver.state)

    async def state_errors(self) -> list[str]:
        """The events the core rejected, ``"repr(event): error"`` (see ``status``)."""
        return list(self.ledger.errors)

    async def status(self) -> dict:
        """What the controller is doing: ``rejected_events`` counts the events
        the core refused (each also a ``rejected`` trace record and an error in
        the controller's log; a normal run has none), ``rejected`` lists them."""
        import os

        await self._ready()
        return {"rejected_events": len(self.ledger.errors), "rejected": list(self.ledger.errors),
                "replicas": len(self.ledger.with_actors()), "recording": self.driver.trace is not None, "pid": os.getpid(),
                "spare_processes": self.ledger.spares.status()}

    async def feed_event(self, event: object) -> bool:
        """Feed ``event`` to the core as if the cluster had reported it (tools and
        tests). A rejected event is recorded, logged and counted like any
        other; returns whether it was accepted."""
        await self._ready()
        errors = len(self.ledger.errors)
        self.ledger.feed(event)
        return len(self.ledger.errors) == errors

    async def start_proxies(self, settings: ProxySettings, timeout: float = 30.0, set_options: bool = True) -> str:
        """Run the proxies with ``settings`` from now on (``ingress.http.start_ingress``): the core is
        told where they run (``ProxiesConfigured``, with this controller's node as the head) and starts
        them; returns the head proxy's actor name once it serves. Proxies already running with another
        address: ``rankcore.InvalidConfig`` (one set of proxies a cluster); with other gRPC services:
        those that ``settings`` adds are served by the running proxies from now on (``Proxies.set_grpc``:
        no application is touched; one that leaves a service out is refused)."""
        await self.recovery.ready()
        pr = self.carrier.proxies
        if pr.settings is not None and (pr.settings.host, pr.settings.port) != (settings.host, settings.port) \
                and settings.port != 0:
            failure = await self.head_proxy_failure()
            if failure is not None:  # (configured, but the head's never served: say why)
                raise rc.InvalidConfig(f"{failure}, such as {settings.host}:{settings.port}")
            raise rc.InvalidConfig(f"the proxies already run on {pr.settings.host}:{pr.settings.port}, not "
                                   f"{settings.host}:{settings.port} (one set of proxies per cluster)")
        if pr.settings is not None and settings.grpc_servicer_functions and \
                set(pr.settings.grpc_servicer_functions) != set(settings.grpc_servicer_functions):
            await pr.set_grpc(settings.grpc_servicer_functions, settings.grpc_port)
        if pr.settings is not None and not set_options:
            settings = attrs.evolve(settings, options=pr.settings.options)  # (where they run stays as set)
        pr.head_error = None  # (a start that fails from now on is this call's answer: its port in use ...)
        if pr.settings is None or pr.settings.options != settings.options:
            if not self.ledger.nodes:
                self.watcher.sync_nodes()  # (the core learns the nodes before it places proxies)
            import ray

            pr.configure(settings if pr.settings is None else attrs.evolve(pr.settings, options=settings.options),
                         ray.get_runtime_context().get_node_id())
        if settings.options.proxy_location is rc.ProxyLocation.Disabled:
            return ""

        def head_serves() -> bool:
            head = self.driver.state.proxies.proxies.get(pr.head) if pr.head is not None else None
            return head is not None and head.phase is rc.ProxyPhase.HEALTHY

        ok = await _until(lambda: head_serves() or pr.head_error is not None, timeout)
        if not head_serves() and pr.head_error is not None:
            raise rc.InvalidConfig(f"the head node's proxy did not start: {pr.head_error}")
        if not ok:
            raise rc.InvalidConfig(f"the head node's proxy did not start within {timeout:g} s "
                                   f"({self.ledger.errors[-1] if self.ledger.errors else 'see the controller log'})")
        return INGRESS_NAME

    async def head_proxy_failure(self) -> str | None:
        """Why the head node's proxy does not serve, where its last start failed (its port in use ...),
        and how to start over: ``start_ingress``'s answer while it fails; None while it serves."""
        pr = self.carrier.proxies
        if pr.head_error is None or pr.settings is None:
            return None
        return (f"the proxies are set to {pr.settings.host}:{pr.settings.port}, where the head node's proxy did not "
                f"start ({pr.head_error}); free that port (the core starts it again there, with its restart "
                f"backoff), or `rankcore shutdown` (it deletes every application; from Python: the controller's "
                f"reset) to set another")

    async def set_proxy_options(self, options: rc.ProxyOptions) -> None:
        """Where proxies run changes (a config file's ``proxy_location``): the core is told."""
        await self.recovery.ready()
        pr = self.carrier.proxies
        if pr.settings is not None and pr.settings.options != options and pr.head is not None:
            pr.configure(attrs.evolve(pr.settings, options=options), pr.head)

    async def proxy_settings(self) -> ProxySettings | None:
        """The settings the proxies run with (None: none runs)."""
        await self.recovery.ready()
        return self.carrier.proxies.settings

    async def proxies(self) -> dict:
        """Each proxy the core runs: its node, actor name, phase and address (``ingress.http.proxies``)."""
        return await self.carrier.proxies.status()

    async def reset(self, timeout: float = 60.0) -> None:
        """Stop every replica and forget everything (deployments, ids, trace, the HTTP ingress with
        its routes and port): the next run starts as on a new cluster."""
        await self.shutdown_replicas(timeout)
        led = self.ledger
        for task in list(led.tasks):
            task.cancel()
        await asyncio.sleep(0)
        for rec in list(led.replicas.values()):
            if rec.checks is not None:
                rec.checks.cancel()
        led.tasks.clear()
        self.carrier.chains.clear()
        self.watcher.dying.clear()
        self.carrier.cancel_timers()
        led.stopping.clear()
        led.nodes.clear()  # the core forgets them too: the next apply() tells it again
        led.spares.cancel()
        led.spares = SparePool()  # (the core is told nothing more: its state goes below)
        for rec in list(led.replicas.values()):
            led.release_pg(rec)
        led.replicas.clear()
        led.starting.clear()
        led.starting_node.clear()
        self.recovery.adopt_placement_groups()  # (none adopted: no actors) removes any left from before
        led.specs.clear()
        led.weights.clear()
        from ..weights.store import store

        await store().forget_all.remote()
        await self.carrier.caches.forget_all()
        await self.carrier.caches.remove_cold()  # (this epoch's: the next run starts another)
        led.tier_log.clear()
        led.booking, led.cuda = None, {}
        led.started = led.lineages = 0
        led.errors.clear()
        led.halted = False
        self.driver.state = rc.State()
        self.driver.trace = None
        self.recorder.metrics = None
        await self.carrier.proxies.stop_all()  # (before their keys go: a stopping proxy saves nothing more)
        persist.forget_all()
        led.t0 = persist.new_epoch()

    async def remove_cold_files(self) -> None:
        """The run is over (``run_locally``, a scenario run, a test's end): remove the COLD files
        its evictions wrote (``Caches.remove_cold``; a ``reset`` does too). A deployment scaled up
        afterwards starts from its class's own weights."""
        await self.carrier.caches.remove_cold()

    async def shutdown_replicas(self, timeout: float = 60.0) -> None:
        """Scale every deployment to 0 through the core (a static one too: 0 shuts
        it down; an autoscaled one is deleted) and wait for the stops."""
        await self._ready()
        for name in sorted(self.driver.state.deployments.keys()):
            dep = self.driver.state.deployments[name]
            if dep.config.autoscaler.autoscaling and not dep.deleting:  # (its target is the autoscaler's: a
                self.ledger.feed(rc.DeploymentDeleted(deployment=name))  # scale is refused, so it is deleted)
            elif dep.target:
                self.ledger.feed(rc.ScaleRequested(deployment=name, num_replicas=0))
        self._persist()
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline and any(d.replicas for d in self.driver.state.deployments.values()):
            await asyncio.sleep(0.05)
        for rid, _ in self.ledger.with_actors():  # anything left behind
            self.carrier.kill(rid)


def _head_node() -> str | None:
    import ray

    for n in ray.nodes():
        if n.get("Alive") and "node:__internal_head__" in (n.get("Resources") or {}):
            return n["NodeID"]
    return None


def controller_actor() -> Any:
    """The controller actor, started (detached, restartable) if it is not running.

    It lives on the head node (as Ray Serve's does), so losing a worker node
    never takes it along; without a head node in view, it prefers this
    process's node.
    """
    import ray
    from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

    head = _head_node()
    where = (NodeAffinitySchedulingStrategy(node_id=head, soft=False) if head else
             NodeAffinitySchedulingStrategy(node_id=ray.get_runtime_context().get_node_id(), soft=True))
    return ray.remote(Controller).options(
        name=CONTROLLER_NAME, namespace=NAMESPACE, lifetime="detached", get_if_exists=True,
        max_restarts=-1, max_concurrency=1000, num_cpus=0, scheduling_strategy=where,
    ).remote()


async def _until(ready: Callable[[], bool], timeout: float, every: float = 0.05) -> bool:
    """Whether ``ready()`` became true within ``timeout`` (looked at every ``every`` s; the waits
    callers ask of the controller: healthy, serving, asleep, deleted)."""
    deadline = time.monotonic() + timeout
    while not ready():
        if time.monotonic() >= deadline:
            return False
        await asyncio.sleep(every)
    return True


def _methods(cls: type) -> dict:
    """The class's ``@idempotent`` methods and its generator methods (streams), read once at apply
    (they were read from the class at every pool answer): every pool answer carries them to the
    routers; saved with the spec, so a restarted controller has them too."""
    from ..base.exposed import stream_methods
    from ..base.router import IDEMPOTENT_ATTR

    return {"idempotent": tuple(m for m in dir(cls) if getattr(getattr(cls, m, None), IDEMPOTENT_ATTR, False)),
            "streams": stream_methods(cls)}
