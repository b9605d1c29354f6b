"""The replica actor: hosts one instance of the user's class.

An **async** Ray actor, as Ray Serve's replica is, with two event loops on threads of their
own: the actor's default one only answers the controller (``ping``, ``watch``, ``report``,
...); the user's code runs on the other, the *user event loop*, as in Ray Serve 2.60:

* ``async def`` methods (``__call__``, ``reconfigure``, ``check_health`` and
  any other, and an ``async def __init__``) are awaited on the user event loop,
  so several requests of one replica run concurrently (Ray Serve: "the replica
  will not wait for the handler to run") and a handler that blocks its loop
  does not block health checks. That loop is the one of the actor's
  concurrency group ``USER``, which runs the requests (``handle_call`` and the
  other ``handle_*``) and ``initialize``: a request's handler is awaited where
  the request arrives, with no hop between threads (Serve's separate user thread
  costs two: about 0.3 ms a call on this project's 2-core machine); the
  controller's methods reach the user's code through ``_on_user_loop``;
* plain ``def`` methods run in a thread pool of ``max_ongoing_requests``
  threads (requests) or a small one of their own (``reconfigure``,
  ``check_health``), so they never block either loop; a plain method that
  returns a coroutine has it awaited too;
* the constructor runs on the user loop's thread (Ray Serve's "main user code
  thread"), before any request.

At most ``max_ongoing_requests`` requests run at once (a semaphore; more wait
their turn), whatever number of handles send them. A call pending on
``watch`` fails the moment the actor dies: death is noticed from Ray itself,
not from a poll.

Each request comes with its ``context.RequestContext`` (the caller's request id and route),
set in a ``ContextVar`` in the thread or task that runs the user's method, so concurrent calls
each read their own (``_get_serve_request_context()``), and a handle call made there carries
the id on. The replica counts its calls as Ray Serve's does (``metrics.ReplicaMetrics``: its own
registry, read by the ingress's scrape through ``metrics_families``).
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import contextvars
import functools
import inspect
import os
import sys
import threading
import time
from typing import Any

import attrs
import ray
from ray.exceptions import AsyncioActorExit, TaskCancelledError

import rankcore as rc

from ..base import by_value, context, direct, exposed
from ..base.access import AccessLog, default_logs_dir
from ..base.access import record as access_record
from ..base.context import RequestContext, _serve_request_context
from ..base.fingerprint import check_modules
from ..base.metrics import ReplicaMetrics, router_families
from ..base.router import routed
from ..base.witness import SWEEP_EVERY_S, Witness, sweep
from ..weights.replica import ReplicaWeights
from . import asgi, batching, collective, multiplex, user_metrics

#: the actor's concurrency group that runs requests and ``initialize``: its event loop is the user's
#: (module docstring). A group's size is the class's (``remote_class``), not an actor's option
USER = "user"
#: how many calls that group runs at once (the replica's own ``max_ongoing_requests`` semaphore
#: holds the rest of the calls a router sent; more than this wait in Ray's queue, never begun)
USER_CONCURRENCY = 10_000


@functools.cache
def remote_class() -> Any:
    """``ray.remote(ReplicaActor)`` with its ``USER`` concurrency group (a replica made without it
    could not run its requests): every replica actor is made from this. Made once per process: a new
    one for each replica exported the class again at every start (~30 ms of the controller's loop, on
    the way from a crash to its replacement)."""
    return ray.remote(concurrency_groups={USER: USER_CONCURRENCY})(ReplicaActor)  # type: ignore[call-overload]


def _takes_rank(fn: Any) -> bool:
    try:
        return "rank" in inspect.signature(fn).parameters
    except (TypeError, ValueError):
        return False


class ReplicaActor:
    def __init__(self, deployment: str, replica_id: str, cls: type, args: tuple, kwargs: dict,
                 lineage: int | None = None, global_rank: int | None = None, world_size: int = 0,
                 max_ongoing_requests: int = 5, bundle_indices: tuple[int, ...] | None = None,
                 placement_group: Any = None, gang: rc.GangContext | None = None, devices: tuple[int, ...] = (),
                 source: str = "", revision: str = "", modules: dict[str, str] | None = None,
                 reserved: tuple[str, int, int] | None = None) -> None:
        self.deployment, self.replica_id, self.lineage = deployment, replica_id, lineage
        self.started_at = time.time()  # (its actor's start: ``identity``'s ``start_time_s``)
        #: the deployment revision it runs (``StartReplica.revision``; "": not said), for a recovering controller
        self.revision = revision
        #: the project modules its revision's fingerprint was taken over (None: a version the user gave):
        #: checked before and after the user's constructor runs (``fingerprint.check_modules``)
        self.modules = modules
        #: (node, node rank, local rank) its PlaceReplica reserved: told to a recovering controller while it
        #: has not been initialised, so the new controller keeps the old one's choice (docs/reliability.md)
        self.reserved = reserved
        # static placement: this rank's bundles of the caller's group; a gang member's gang
        self.bundle_indices = tuple(bundle_indices) if bundle_indices is not None else None
        self.placement_group, self.gang = placement_group, gang
        self.group: rc.GroupContext | None = None  # its collective group's epoch (ReformGroup)
        self.cls, self.args, self.kwargs = cls, args, kwargs
        self.global_rank = global_rank  # from StartReplica: known before the user's __init__ runs
        self.instance: Any = None
        #: the object whose constructor runs (``__new__`` made it), and whether its ``__del__`` ran
        #: (``abort_start``: stopped before it was constructed)
        self._constructing: Any = None
        self._del_ran = False
        self.user_config: Any = rc.UNKNOWN
        self.version = 0
        self.phase = "pending"
        self.world_size = world_size
        self._world_size_seq: tuple[int, int] = (0, 0)  # the newest command that set world_size
        self.rank: rc.ReplicaRank | None = None
        self.max_ongoing_requests = max_ongoing_requests
        self._requests = concurrent.futures.ThreadPoolExecutor(max_ongoing_requests,
                                                               thread_name_prefix="rankcore-request")
        self._control = concurrent.futures.ThreadPoolExecutor(2, thread_name_prefix="rankcore-control")
        #: the user's event loop (the ``USER`` group's: ``initialize`` learns it); None before
        self._user_loop: asyncio.AbstractEventLoop | None = None
        # asyncio objects, made on first use: the slots and the idle condition the user loop's,
        # the stop event the actor's own loop's
        self._slots: asyncio.Semaphore | None = None
        self._stop: asyncio.Event | None = None
        self._idle: asyncio.Condition | None = None
        self._init: asyncio.Task | None = None
        self._inflight = 0
        #: its by-value server (``by_value_address``) once a router asked: a task giving (server, address)
        self._by_value: asyncio.Future | None = None
        self._direct: asyncio.Future | None = None  # (its own HTTP server, once asked: ``direct_address``)
        self._direct_server: Any = None
        #: its own gRPC server (``direct_grpc_address``), once asked: a task giving its ``GrpcFront``
        self._direct_grpc: asyncio.Future | None = None
        #: its access records of the requests its own server answered (``direct_address``'s limits say
        #: whether, and where: the node's ``access.jsonl``, beside its proxy's)
        self._access: AccessLog | None = None
        #: its weights' tier and version (and the tensors, when the class holds weights: replica_weights.py)
        self.weights = ReplicaWeights(replica_id)
        #: booked by memory (``PlaceReplica.devices`` / ``.source``): its GPUs on the node (used as
        #: torch's device index when CUDA is there, recorded otherwise) and where its weights come from
        self.devices, self.source = tuple(devices), source
        #: Serve's replica metrics (calls, errors, time in the user's method, calls in flight)
        self.metrics = ReplicaMetrics(deployment, replica_id)
        #: the multiplexed models it holds or loads (``replica.multiplex``), told to the controller when
        #: they change, numbered (``_models_seq``) so a late report never undoes a newer one
        self._models: tuple[str, ...] = ()
        self._models_seq = 0
        self._models_lock = threading.Lock()
        self._controller: Any = None
        #: the calls whose user method it entered, kept where a router can read them after this
        #: process dies (``base.witness``): made now, so one frozen before its first call has one too
        self._swept = float("-inf")  # (when it last swept its node's stale witnesses: ``_sweep``)
        self._witness = self._new_witness()
        self._sweep()
        multiplex.attach(self._push_models, self.metrics)
        batching.attach_metrics(self.metrics)

    # -------------------------------------------------------------- plumbing
    def _loop_objects(self) -> None:
        if self._stop is None:
            self._slots = asyncio.Semaphore(self.max_ongoing_requests)
            self._stop = asyncio.Event()
            self._idle = asyncio.Condition()

    async def _on_user_loop(self, coro: Any) -> Any:
        """Await ``coro`` on the user loop: where it is awaited already when called from there (a
        request, ``initialize``) or before that loop is known, else sent there from the actor's."""
        loop = self._user_loop
        if loop is None or loop is asyncio.get_running_loop():
            return await coro
        return await asyncio.wrap_future(asyncio.run_coroutine_threadsafe(coro, loop))

    async def _until_started(self) -> None:
        """Wait for the start under way (raise if it failed), from either loop: its task is the
        user loop's."""
        init = self._init
        assert init is not None
        await self._on_user_loop(_shielded(init))

    async def _call(self, fn: Any, args: tuple = (), kwargs: dict | None = None, *, pool: Any = None,
                    request: RequestContext | None = None) -> Any:
        """Call a user method the way Ray Serve does: a coroutine function is
        awaited on the user loop, a plain one runs in ``pool`` (its result
        awaited if it is a coroutine). ``request``: what its code reads from
        ``_get_serve_request_context()`` (set in its own thread's or task's context)."""
        kwargs = kwargs or {}
        if inspect.iscoroutinefunction(fn):
            return await self._on_user_loop(_in_request(request, fn(*args, **kwargs)))
        loop = asyncio.get_running_loop()
        result = await loop.run_in_executor(pool or self._control, _in_context(request),
                                            functools.partial(fn, *args, **kwargs))
        if inspect.isawaitable(result):
            result = await self._on_user_loop(_in_request(request, _awaited(result)))
        return result

    def _set_context(self) -> None:
        assert self.rank is not None
        context._set(context.ReplicaContext(deployment=self.deployment, replica_id=self.replica_id,
                                            rank=self.rank, world_size=self.world_size,
                                            user_config=self.user_config, bundle_indices=self.bundle_indices,
                                            placement_group=self.placement_group, gang=self.gang,
                                            weights_version=self.weights.version, tier=self.weights.tier,
                                            group=self.group))

    def _push_models(self, models: tuple[str, ...]) -> None:
        """Its multiplexed models changed (on the user loop's thread): numbered, and told to the
        controller from a control thread (finding the controller is a GCS call: not on the user's
        loop), not waiting for the answer (routers get them with the pool;
        ``Controller.report_models``)."""
        with self._models_lock:
            if models == self._models:
                return
            self._models_seq += 1
            self._models = models
        self._control.submit(self._send_models)

    def _send_models(self) -> None:
        """Send the newest models (a send that finds a newer number sends that one: none is lost,
        stale ones are dropped by the controller). With no controller now, a recovering one reads
        them from ``report``."""
        with self._models_lock:
            models, seq = self._models, self._models_seq
        try:
            if self._controller is None:
                from ..base.replicas import CONTROLLER_NAME, NAMESPACE

                self._controller = ray.get_actor(CONTROLLER_NAME, namespace=NAMESPACE)
            self._controller.report_models.remote(self.deployment, self.replica_id, seq, models)
        except Exception:  # (no controller now: a recovering one asks ``report``)
            self._controller = None

    # ------------------------------------------------------------ controller
    async def node_id(self) -> str:
        return ray.get_runtime_context().get_node_id()

    async def pid(self) -> int:
        """The process it runs in (the controller asks whether it was a spare)."""
        return os.getpid()

    async def identity(self) -> dict:
        """Who and where it is, as Ray Serve's ``ReplicaDetails`` says it (asked once, by the
        controller's watch of it: ``observe.Watcher.watch``): its ``pid``, Ray's ``actor_id`` and
        ``worker_id``, ``node_id`` and ``node_ip``, when its actor started (``start_time_s``) and
        ``log_file_path``: the file its stdout goes to (what it prints; its stderr goes to the
        same name ending ``.err``), below the node's Ray logs directory as Serve gives it (it
        starts with ``/``; None: not known)."""
        ctx = ray.get_runtime_context()
        return {"pid": os.getpid(), "actor_id": ctx.get_actor_id(), "worker_id": ctx.get_worker_id(),
                "node_id": ctx.get_node_id(), "node_ip": ray.util.get_node_ip_address(),
                "start_time_s": self.started_at, "log_file_path": _log_file_path()}

    def _newer(self, seq: tuple[int, int] | None) -> bool:
        """Whether a command numbered ``seq`` may set the world size (None: unnumbered, always)."""
        if seq is None:
            return True
        if tuple(seq) < self._world_size_seq:
            return False
        self._world_size_seq = tuple(seq)  # type: ignore[assignment]
        return True

    @ray.method(concurrency_group=USER)
    async def initialize(self, rank: tuple, world_size: int, user_config: Any, call_reconfigure: bool,
                         pass_rank: bool, seq: tuple[int, int] | None = None, weights_version: int = 0,
                         weights: Any = None, warm: Any = None, cold_path: str | None = None) -> None:
        """Run the user's ``__init__`` (and ``reconfigure`` when asked) with the
        context set; then, with ``weights_version`` above 0, load ``weights``
        (``InitializeReplica.weights_version``: a replica started after a push
        serves the pushed weights). A replica booked by memory first takes the node's
        WARM copy (``warm``, resolved by Ray from the cache's answer) or its COLD file
        (``cold_path``), as ``PlaceReplica.source`` said. Called once per replica; a second call (a
        restarted controller's, for the same start) waits for the first and
        then applies its rank, world size and weights. Runs on the user loop (the ``USER`` group),
        which it makes the user's."""
        self._user_loop = asyncio.get_running_loop()
        self._loop_objects()
        new = rc.ReplicaRank(rank=rank[0], node_rank=rank[1], local_rank=rank[2])
        if self._init is not None:
            await asyncio.shield(self._init)
            if weights_version > self.weights.version:
                await self.update_weights(weights_version, weights)
            if (new, world_size) != (self.rank, self.world_size):
                await self.reconfigure(rank, world_size, user_config, self.version,
                                       call_reconfigure and pass_rank and new != self.rank, pass_rank, seq)
            return
        if self._newer(seq):
            self.world_size = world_size
        self.rank, self.user_config = new, user_config
        self.phase = "starting"
        self._set_context()
        self._init = asyncio.ensure_future(self._construct(user_config, call_reconfigure, pass_rank,
                                                           weights_version, weights, warm, cold_path))
        await asyncio.shield(self._init)

    async def _construct(self, user_config: Any, call_reconfigure: bool, pass_rank: bool,
                         weights_version: int = 0, weights: Any = None, warm: Any = None,
                         cold_path: str | None = None) -> None:
        cls: Any = self.cls
        device = self._device()
        args, kwargs = self.args, self.kwargs

        async def construct() -> Any:  # on the user loop, as Ray Serve runs constructors
            obj = self._constructing = cls.__new__(cls)
            res = obj.__init__(*args, **kwargs)
            if inspect.isawaitable(res):  # an async def __init__
                await res
            return obj

        self._check_code()  # (no constructor of other code runs: a model load of minutes, say)
        began = time.perf_counter()
        self.instance = await self._on_user_loop(construct())
        self._check_code()  # (and what the constructor imported)
        await self._on_user_loop(asgi.started(self.instance))  # (an ASGI ingress's app: its lifespan startup)
        # (Serve's serve_replica_initialization_latency_ms: the constructor and its ASGI app's startup, once)
        self.metrics.initialized((time.perf_counter() - began) * 1000.0)
        await self._in_control(self._take_weights, self.instance, weights_version, weights, device, warm, cold_path)
        if call_reconfigure:
            await self._call_reconfigure(user_config, pass_rank)
        self.phase = "running"

    def _check_code(self) -> None:
        """The start fails (``CodeChanged``: the core backs off and retries, the deployment says why)
        when a project module this process imported is not the one its revision was fingerprinted
        over: edited on this node since the deploy, it would serve other code under that revision."""
        if self.modules is not None:
            check_modules(self.deployment, self.revision, self.modules)

    def _device(self) -> Any:
        """The torch device of a replica booked by memory: ``cuda:<its first GPU index>`` (made
        current, before the user's constructor) when CUDA is there; None otherwise (the usual
        choice; the indices are only recorded)."""
        if not self.devices:
            return None
        try:
            import torch
        except ImportError:
            return None
        if not torch.cuda.is_available() or torch.cuda.device_count() <= self.devices[0]:
            return None
        torch.cuda.set_device(self.devices[0])
        return torch.device("cuda", self.devices[0])

    def _take_weights(self, instance: Any, version: int, weights: Any, device: Any = None, warm: Any = None,
                      cold_path: str | None = None) -> None:
        self.weights.attach(instance, device)
        self.weights.fill(self.source, warm, cold_path, version)
        if version > self.weights.version:
            self.weights.update(version, weights)
        self._set_context()

    async def _in_control(self, fn: Any, *args: Any) -> Any:
        """Run ``fn(*args)`` (a weights move: tensor copies) off the actor's loop, so it keeps answering."""
        return await asyncio.get_running_loop().run_in_executor(self._control, functools.partial(fn, *args))

    # ------------------------------------------------------------- weights
    async def _initialised(self) -> None:
        """Wait for the start under way (a command for a starting replica is applied once it is ready)."""
        if self._init is None:
            raise RuntimeError(f"replica {self.replica_id} is not initialised: it holds no weights yet")
        await self._until_started()

    async def offload(self) -> int:
        """``OffloadReplica``: its weights to CPU memory (process, rank and bundle kept); bytes moved."""
        await self._initialised()
        n = await self._in_control(self.weights.offload)
        self._set_context()
        return n

    async def load(self) -> int:
        """``LoadReplica``: its weights back on its device; bytes moved."""
        await self._initialised()
        n = await self._in_control(self.weights.load)
        self._set_context()
        return n

    async def update_weights(self, version: int, weights: Any) -> int:
        """``UpdateWeights``: hold ``weights`` as ``version``, in place, wherever they are; bytes written."""
        await self._initialised()
        n = await self._in_control(self.weights.update, version, weights)
        self._set_context()
        return n

    async def weights_info(self) -> dict:
        """Tier, version, bytes (held on the host too), device, GPU indices, where they came from."""
        return {**self.weights.info(), "devices": self.devices, "source": self.source}

    async def evict_weights(self, to: str, path: str | None) -> Any:
        """``EvictReplica`` (after its drain): its weights as ``FlatWeights`` for the node's WARM
        cache (``to="warm"``), or written to the node's COLD file ``path`` (bytes written)."""
        await self._initialised()
        return await self._in_control(self.weights.evict, to, path)

    async def export_weights(self) -> dict:
        """A CPU copy of the weights it serves from (only while HOT)."""
        await self._initialised()
        return await self._in_control(self.weights.export)

    async def started(self) -> None:
        """Return once the start under way finishes (raise if it failed): what a
        restarted controller waits on for a replica that reported ``starting``."""
        while self._init is None:
            await asyncio.sleep(0.05)
        await self._until_started()

    async def _call_reconfigure(self, user_config: Any, pass_rank: bool) -> None:
        fn = getattr(self.instance, "reconfigure", None)
        if fn is None:
            return
        if pass_rank and _takes_rank(fn):
            await self._call(fn, (user_config,), {"rank": self.rank})
        else:
            await self._call(fn, (user_config,))

    async def reconfigure(self, rank: tuple, world_size: int, user_config: Any, version: int, call_user: bool,
                          pass_rank: bool, seq: tuple[int, int] | None = None) -> int:
        self.rank = rc.ReplicaRank(rank=rank[0], node_rank=rank[1], local_rank=rank[2])
        if self._newer(seq):
            self.world_size = world_size
        self.user_config, self.version = user_config, version
        self._set_context()  # the context shows the new rank before user code runs
        if call_user:
            await self._call_reconfigure(user_config, pass_rank)
        return version

    async def update_world_size(self, world_size: int, seq: tuple[int, int] | None = None) -> None:
        if not self._newer(seq):
            return  # an older command than one already applied (calls may arrive out of order)
        self.world_size = world_size
        if self.rank is not None:
            self._set_context()

    async def set_gang(self, gang_id: str, members: tuple[str, ...]) -> None:
        """GangChanged: the gang's members now (a member was replaced); this
        replica keeps its rank in the gang. Once its context shows them, the
        user's ``on_gang_changed(gang)`` runs if the class has one, so a member
        rebuilds its communication group without polling: after its
        constructor (a replica not initialised yet gets no call: its
        constructor reads the members from its context). Its exception is
        raised to the controller (logged there)."""
        if self.gang is None or self.gang.gang_id != gang_id:
            return
        gang = self.gang = rc.GangContext(gang_id=gang_id, rank_in_gang=self.gang.rank_in_gang,
                                          gang_size=self.gang.gang_size, members=tuple(members))
        if self.rank is not None:
            self._set_context()
        if self._init is None:
            return
        try:
            await self._until_started()
        except Exception:
            return  # its start failed: the controller reports that
        fn = getattr(self.instance, "on_gang_changed", None)
        if fn is not None:
            await self._call(fn, (gang,))

    async def set_group(self, group: rc.GroupContext) -> None:
        """ReformGroup: its collective group's new epoch. The context shows it at once (a newer
        epoch only: calls may arrive out of order); then the user's ``on_group_changed(group)``
        runs if the class has one (after its constructor), where it may re-form its
        ``torch.distributed`` group (``executors.ray_gpu.collective.ProcessGroup.ensure``), or
        a loop of its own sees the new epoch and re-forms there. Its exception is raised to the
        controller (logged there)."""
        if self.group is not None and group.epoch <= self.group.epoch:
            return
        self.group = group
        if self.rank is not None:
            self._set_context()
        collective.told(group)
        if self._init is None:
            return
        try:
            await self._until_started()
        except Exception:
            return
        fn = getattr(self.instance, "on_group_changed", None)
        if fn is not None and self.group is group:
            await self._call(fn, (group,))

    async def report(self) -> dict:
        """What this replica tells a recovering controller."""
        with self._models_lock:  # (its models and their number together: a push may be under way)
            models, models_seq = self._models, self._models_seq
        return {
            "replica_id": self.replica_id,
            "deployment": self.deployment,
            "rank": self.rank.as_tuple() if self.rank is not None else None,
            "global_rank": self.rank.rank if self.rank is not None else self.global_rank,
            "reserved": self.reserved,
            "node_id": await self.node_id(),
            "phase": self.phase,
            "world_size": self.world_size,
            "version": self.version,
            "user_config": self.user_config,
            "lineage": self.lineage,
            "revision": self.revision,
            "tier": self.weights.tier,
            "weights_version": self.weights.version,
            "devices": self.devices,
            "models": models,
            "models_seq": models_seq,
            "group": attrs.asdict(self.group) if self.group is not None else None,
        }

    async def ping(self) -> bool:
        """Health check: answers while requests run; calls the user's
        ``check_health()`` if the class has one (raise = unhealthy). Now and then it also sweeps its
        node's witnesses of replicas long dead (``_sweep``)."""
        self._sweep()
        fn = getattr(self.instance, "check_health", None)
        if fn is not None:
            await self._call(fn)
        return True

    async def watch(self) -> None:
        """Never returns while the replica lives: the controller keeps one call
        pending so the actor's death surfaces at once as an error."""
        self._loop_objects()
        assert self._stop is not None
        await self._stop.wait()

    async def prepare_stop(self, wait_loop_s: float, timeout_s: float) -> None:
        """Graceful stop (``StopReplica``'s ``graceful_shutdown_wait_loop_s`` /
        ``graceful_shutdown_timeout_s``, Ray Serve's): let the calls in flight
        finish, first waiting ``wait_loop_s`` (calls on their way arrive), then looking at
        least every ``wait_loop_s`` (and whenever one ends), for up to ``timeout_s``; then the
        user's ``__del__``. The controller
        kills the actor at ``timeout_s`` whatever this has done by then."""
        self._loop_objects()
        assert self._stop is not None
        self.phase = "stopping"
        deadline = asyncio.get_running_loop().time() + timeout_s
        # Ray Serve sleeps first ("make sure all the routers receive the notification to remove this
        # replica first"): a call routed here before the pool dropped it may still be on its way, and
        # would find the drain over and die with the process
        await asyncio.sleep(min(max(wait_loop_s, 0.05), timeout_s))
        await self._on_user_loop(self._drained(deadline, wait_loop_s))  # (the calls end there)
        try:  # (its multiplexed models are unloaded, as Serve's replica does at shutdown)
            await self._on_user_loop(multiplex.shutdown_all())
        except Exception:  # pragma: no cover - best effort
            pass
        try:  # (an ASGI ingress's app: its lifespan shutdown)
            await self._on_user_loop(asgi.stopped(self.instance))
        except Exception:  # pragma: no cover - best effort
            pass
        if self._witness is not None:  # (a call that still comes counts as begun if this dies)
            self._witness.close()
            self._witness = None
        fn = getattr(self.instance, "__del__", None)
        self._stop.set()
        if fn is not None:
            try:
                await self._call(fn)
            except Exception:  # pragma: no cover - best effort
                pass

    async def abort_start(self) -> bool:
        """Stopped while its constructor still runs (the controller kills it next): the user's
        ``__del__`` runs once on the object being constructed, as Serve's replica calls its
        destructor at shutdown whether or not ``__init__`` returned. False: none to run (no
        constructor began, or it returned: ``prepare_stop`` then does it)."""
        obj = self._constructing
        if obj is None or self.instance is not None or self._del_ran:
            return False
        self._del_ran = True
        fn = getattr(obj, "__del__", None)
        if fn is None:
            return False
        try:
            await self._call(fn)
        except Exception:  # pragma: no cover - best effort, as prepare_stop's
            pass
        return True

    async def _drained(self, deadline: float, wait_loop_s: float) -> None:
        """(On the user loop, where calls end and notify ``_idle``.) Return once no call is in flight
        or at ``deadline`` (``loop.time()``: both loops read the same monotonic clock)."""
        self._loop_objects()
        assert self._idle is not None
        loop = asyncio.get_running_loop()
        async with self._idle:
            while self._inflight and loop.time() < deadline:
                try:
                    await asyncio.wait_for(self._idle.wait(), max(0.0, min(max(wait_loop_s, 0.05), deadline - loop.time())))
                except asyncio.TimeoutError:
                    pass

    async def metrics_families(self) -> list:
        """Its Prometheus metric families (``ReplicaMetrics.families``), and what its handles' routers
        routed (a replica calling another: ``metrics.router_families``), and the user's own
        (``serve.metrics``: ``replica.user_metrics``): the ingress's ``/metrics``
        gathers every serving replica's and merges them (``metrics.merged``)."""
        own = self.metrics.families() + user_metrics.families()
        calls = routed()
        if not calls:
            return own
        return own + router_families(calls, ray.get_runtime_context().get_actor_id() or "")

    # --------------------------------------------------------------- requests
    def _new_witness(self) -> Witness | None:
        """Its witness (``base.witness``); None outside an actor or where no file can be made (its
        calls then count as begun)."""
        actor_id = ray.get_runtime_context().get_actor_id() if ray.is_initialized() else None
        if actor_id is None:
            return None
        try:
            return Witness(actor_id)
        except OSError:
            return None

    def _sweep(self) -> None:
        """Remove its node's witnesses of replicas long dead (at most every ``SWEEP_EVERY_S``;
        none once it has no witness of its own: outside an actor, or stopping)."""
        now = time.monotonic()
        if self._witness is None or now - self._swept < SWEEP_EVERY_S:
            return
        self._swept = now
        try:
            sweep()
        except OSError:  # pragma: no cover - (a folder gone: nothing to sweep)
            pass

    @contextlib.asynccontextmanager
    async def _request(self, method: str, request: RequestContext | None, key: int = 0,
                       on_begin: Any = None) -> Any:
        """The user's method, counted in flight (a drain waits for it; the in-flight gauge shows
        it) while it holds one of the ``max_ongoing_requests`` slots; once it ends, counted as
        answered or failed (its exception's type) with the time it ran (Serve's replica metrics).
        ``key`` (not 0): written to its witness once it holds a slot, before the method is
        entered, so its router can tell after this process died that it began (``base.witness``);
        ``on_begin`` (a coroutine function), awaited then too: a by-value call's begin marker
        (``base.by_value.BEGAN``). A stream its caller closed (``GeneratorExit`` at a ``yield``: a
        progress call's router once it has the answer, a client gone mid-stream) counts as answered:
        the method did not fail."""
        if self.instance is None:
            raise RuntimeError(f"replica {self.replica_id} is not initialised yet")
        self._loop_objects()
        assert self._slots is not None and self._idle is not None
        fn = getattr(self.instance, method)
        route = request.route if request is not None else ""
        self._inflight += 1
        self.metrics.began()
        try:
            async with self._slots:  # at most max_ongoing_requests at once
                began = time.perf_counter()
                failed: str | None = None
                witness = self._witness if key else None
                slot = witness.begin(key) if witness is not None else -1
                try:
                    if on_begin is not None:
                        await on_begin()
                    yield fn
                except GeneratorExit:  # (its caller closed the stream: not the method's failure)
                    raise
                except BaseException as exc:  # (counted, then raised as is)
                    failed = type(exc).__name__
                    raise
                finally:
                    if witness is not None:
                        witness.end(slot)
                    self.metrics.answered(route, (time.perf_counter() - began) * 1000.0, failed)
        finally:
            self.metrics.ended()
            async with self._idle:
                self._inflight -= 1
                self._idle.notify_all()

    @ray.method(concurrency_group=USER)
    async def handle_request(self, method: str, args: tuple, kwargs: dict,
                             request: RequestContext | None = None, key: int = 0) -> Any:
        """One call of the user's ``method`` (``request``: the caller's request id and route;
        ``key``: its witness key, ``base.witness``). A ``KeyboardInterrupt`` the method raises is the
        call's ``TaskCancelledError``, what Ray's caller sees: raised out of the actor's task it also
        stopped the replica's user loop, and every later call hung."""
        return await self._run(method, args, kwargs, request, key)

    async def _run(self, method: str, args: tuple, kwargs: dict, request: RequestContext | None, key: int,
                   on_begin: Any = None) -> Any:
        """``handle_request``'s work (``on_begin``: ``_request``'s)."""
        async with self._request(method, request, key, on_begin) as fn:
            try:
                return await self._call(fn, args, kwargs, pool=self._requests, request=request)
            except KeyboardInterrupt:
                raise TaskCancelledError(error_message=f"KeyboardInterrupt in {method!r}") from None

    @ray.method(concurrency_group=USER)
    async def handle_call(self, call: tuple) -> Any:
        """``handle_request`` as a router sends it: one argument, ``(method, args, kwargs, request,
        key)``, ``request`` as ``context.to_wire`` made it. One argument of plain types is one msgpack
        object for Ray to send, where five arguments and a pickled ``RequestContext`` cost about 0.4 ms
        more a call at one client on this project's 2-core machine (docs/benchmarks.md)."""
        method, args, kwargs, request, key = call
        return await self._run(method, args, kwargs, context.from_wire(request), key)

    @ray.method(concurrency_group=USER)
    async def by_value_address(self) -> str:
        """Where a router sends calls by value (``base.by_value``): ``host:port`` of this replica's
        gRPC server, started on the user loop on the first ask (a replica nobody asks has none)."""
        if self._by_value is None:
            self._by_value = asyncio.ensure_future(by_value.start_server(
                self._answer_by_value, ray.util.get_node_ip_address()))
        _server, address = await asyncio.shield(self._by_value)
        return address

    @ray.method(concurrency_group=USER)
    async def direct_address(self, prefix: str, limits: dict) -> str:
        """Where the data plane's balancer sends this replica's HTTP requests (direct ingress:
        ``base.direct``): ``host:port`` of its own HTTP server, started on the user loop on the first
        ask (``prefix``: its route's, when the balancer does not name it; ``limits``: the ingress's,
        ``haproxy.DataPlane.limits``)."""
        if self._direct is None:  # (set before any await: two asks at once start one server)
            self._direct = asyncio.ensure_future(self._start_direct(prefix, limits))
        return await asyncio.shield(self._direct)

    async def _start_direct(self, prefix: str, limits: dict) -> str:
        await self._until_started()
        assert self.instance is not None
        cls = type(self.instance)
        self._access = AccessLog(limits["enable_access_log"], limits["logs_dir"] or default_logs_dir())
        server = direct.DirectServer(self.deployment, exposed.reachable(cls), frozenset(exposed.stream_methods(cls)),
                                     self._run_direct, self._stream_direct, prefix, limits["max_body_bytes"],
                                     limits["max_header_bytes"], observe=self._http_observed,
                                     request_timeout_s=limits.get("request_timeout_s"))
        self._direct_server = server
        return await server.start(ray.util.get_node_ip_address())

    @ray.method(concurrency_group=USER)
    async def direct_grpc_address(self, limits: dict) -> str:
        """Where the data plane's balancer sends this replica's gRPC calls: ``host:port`` of its own
        gRPC server of ``limits["grpc_servicer_functions"]`` (``replica.direct_grpc``), started on the
        user loop on the first ask."""
        if self._direct_grpc is None:  # (set before any await: two asks at once start one server)
            self._direct_grpc = asyncio.ensure_future(self._start_direct_grpc(limits))
        front = await asyncio.shield(self._direct_grpc)
        return f"{front.address[0]}:{front.address[1]}"

    async def _start_direct_grpc(self, limits: dict) -> Any:
        from . import direct_grpc

        await self._until_started()
        assert self.instance is not None
        return await direct_grpc.start(self.deployment, exposed.reachable(type(self.instance)), self._run_direct,
                                       self._stream_direct, self.metrics, limits, limits["grpc_servicer_functions"],
                                       ray.util.get_node_ip_address())

    @ray.method(concurrency_group=USER)
    async def direct_limits(self, limits: dict) -> None:
        """The ingress's limits changed: its own HTTP server (if started) applies them to what comes
        next, and writes access records or not as they say; its own gRPC server (if started) too, and
        serves the services they name."""
        if self._direct is not None:
            await asyncio.shield(self._direct)
            self._direct_server.max_body_bytes = limits["max_body_bytes"]
            self._direct_server.max_header_bytes = limits["max_header_bytes"]
            self._direct_server.request_timeout_s = limits.get("request_timeout_s")
            assert self._access is not None
            self._access.enabled = limits["enable_access_log"]
        if self._direct_grpc is not None:
            front = await asyncio.shield(self._direct_grpc)
            front.ingress.set_limits(limits)
            if limits.get("grpc_servicer_functions") and tuple(limits["grpc_servicer_functions"]) != \
                    front.servicer_functions:
                front.set_services(tuple(limits["grpc_servicer_functions"]))

    @ray.method(concurrency_group=USER)
    async def access_records(self, n: int | None = None) -> list[dict]:
        """The last ``n`` access records of the requests its own server answered (all it keeps:
        ``access.KEEP``); the ingress's ``access_records`` merges them with its own."""
        return [] if self._access is None else self._access.last(n)

    def _http_observed(self, a: direct.Answered) -> None:
        """One request its own server answered: counted in its HTTP metrics, and recorded as the
        proxy records the requests it carries (``base.access``), with this replica and its rank."""
        self.metrics.http_request(route=a.route, method=a.method, status=a.status, latency_ms=a.latency_ms)
        access = self._access
        if access is not None and access.enabled:
            access.write(access_record(request_id=a.request_id, method=a.method, route=a.route, path=a.path,
                                       deployment=self.deployment, replica=self.replica_id,
                                       rank=self.rank.rank if self.rank is not None else None, status=a.status,
                                       latency_ms=a.latency_ms, nbytes=a.nbytes))

    async def _run_direct(self, method: str, args: tuple, kwargs: dict, request: RequestContext,
                          on_begin: Any = None) -> Any:
        """A call its own server took (``on_begin``: its gRPC server's begin marker, ``_request``)."""
        return await self._run(method, args, kwargs, request, 0, on_begin)

    def _stream_direct(self, method: str, args: tuple, kwargs: dict, request: RequestContext,
                       on_begin: Any = None) -> Any:
        return self._stream(method, args, kwargs, request, on_begin)

    async def _answer_by_value(self, data: bytes, began: Any) -> bytes:
        """One call sent by value: ``handle_call``'s argument pickled, answered ``(True, value)`` or
        ``(False, RayTaskError)`` pickled; ``began()`` sends the begin marker once it holds a slot
        (``by_value.BEGAN``). Its caller cancelling the gRPC call cancels this task."""
        method = "handle_call"
        try:
            method, args, kwargs, request, key = by_value.decode(data)  # (a class missing here: the caller's error)
            value = await self._run(method, args, kwargs, context.from_wire(request), key, began)
            # (an answer that does not pickle, or one too large for gRPC: the caller gets why)
            return by_value.encode((True, value), most=by_value.MAX_ANSWER_BYTES)
        except (SystemExit, AsyncioActorExit) as exc:
            _exit_now(exc)  # (raised here it would stop the user loop, and every call on it would hang)
            raise
        except BaseException as exc:  # (a CancelledError of the user's own too: its caller's error)
            cancelling = getattr(asyncio.current_task(), "cancelling", None)  # (Python 3.11+; before: as cancelled)
            if isinstance(exc, asyncio.CancelledError) and (cancelling is None or cancelling()):
                raise  # (its caller cancelled the call: gRPC cancelled this task)
            return by_value.failure(f"{type(self.instance).__name__}.{method}", exc)

    @ray.method(concurrency_group=USER)
    async def handle_progress(self, method: str, args: tuple, kwargs: dict,
                              request: RequestContext | None = None) -> Any:
        """``handle_request`` for a caller who watches its progress (a Ray streaming generator): first
        ``STARTED`` once the call holds a slot and the user's method begins (the router then says
        ``running``), then the answer. Plain calls go to ``handle_request``: they pay nothing for it."""
        async with self._request(method, request) as fn:
            yield STARTED
            yield await self._call(fn, args, kwargs, pool=self._requests, request=request)

    @ray.method(concurrency_group=USER)
    async def handle_stream(self, method: str, args: tuple, kwargs: dict,
                            request: RequestContext | None = None) -> Any:
        """A generator method's items, one by one (a Ray streaming generator: the caller calls it with
        ``num_returns="streaming"``, the handle's ``options(stream=True)``). A sync generator's each
        ``next`` runs in the request pool, an async generator on the user loop; the stream holds one of
        the ``max_ongoing_requests`` slots until it ends."""
        items = self._stream(method, args, kwargs, request)
        try:
            async for item in items:
                yield item
        finally:
            await items.aclose()  # (its caller closed the stream: the slot is freed now, not when collected)

    async def _stream(self, method: str, args: tuple, kwargs: dict, request: RequestContext | None,
                      on_begin: Any = None) -> Any:
        """``handle_stream``'s items (the direct data plane's servers call it too: ``base.direct``,
        ``replica.direct_grpc``; ``on_begin``: ``_request``'s)."""
        async with self._request(method, request, 0, on_begin) as fn:
            if inspect.isasyncgenfunction(fn):
                agen = fn(*args, **kwargs)
                while (item := await self._on_user_loop(_in_request(request, _next_async(agen)))) is not _END:
                    yield item
            else:
                loop = asyncio.get_running_loop()
                ctx = _in_context(request)  # (one context for the stream: its nexts run one at a time)
                gen = await loop.run_in_executor(self._requests, ctx, functools.partial(fn, *args, **kwargs))
                if not inspect.isgenerator(gen):
                    raise TypeError(f"{type(self.instance).__name__}.{method} is not a generator: call it "
                                    f"without stream=True")
                while (item := await loop.run_in_executor(self._requests, ctx, functools.partial(
                        next, gen, _END))) is not _END:
                    yield item


_END = object()  # (a stream's end: StopIteration does not cross a thread pool's future)
#: ``handle_progress``'s first item: the user's method begins
STARTED = "started"



def _log_file_path() -> str | None:
    """This worker's stdout file (Ray redirects it there) below the node's Ray logs directory, as
    Serve's ``log_file_path`` (``/worker-<worker id>-<job id>-<pid>.out``); None when Ray did not
    redirect it there (a worker started with its output left on the console)."""
    try:
        from ray._private import worker

        path = worker.global_worker.get_out_file_path()
        logs = worker._global_node.get_logs_dir_path()  # type: ignore[attr-defined]
    except Exception:  # (a Ray without these: not known)
        return None
    return path[len(logs):] if path and path.startswith(logs + os.sep) else None


async def _in_request(request: RequestContext | None, awaitable: Any) -> Any:
    """Await ``awaitable`` with ``request`` as the request context (of this task alone: a task runs
    in a copy of its creator's context)."""
    _serve_request_context.set(request)
    return await awaitable


def _in_context(request: RequestContext | None) -> Any:
    """A runner (``ctx.run``) for a pool thread: a fresh copy of the context with ``request`` set
    (a thread pool does not carry the caller's context; two calls never share one)."""
    ctx = contextvars.copy_context()
    ctx.run(_serve_request_context.set, request)
    return ctx.run


async def _shielded(task: Any) -> Any:
    return await asyncio.shield(task)


async def _next_async(agen: Any) -> Any:
    try:
        return await agen.__anext__()
    except StopAsyncIteration:
        return _END


async def _awaited(awaitable: Any) -> Any:
    return await awaitable


def _exit_now(exc: BaseException) -> None:
    """The user's code asked the process to end (``sys.exit``, ``ray.actor.exit_actor()``) in a call
    that came by value: end it, as a Ray call's would. Its callers then see the replica's death (their
    calls fail on their way, and Ray says it is dead), and the controller replaces it. The exit status
    as Python's: ``sys.exit()`` 0, ``sys.exit(n)`` n, ``sys.exit("why")`` 1."""
    asked = exc.code if isinstance(exc, SystemExit) else None
    code = asked if isinstance(asked, int) else 0 if asked is None else 1
    print(f"replica exiting: {type(exc).__name__} in a call by value", flush=True)
    for stream in (sys.stdout, sys.stderr):
        with contextlib.suppress(Exception):
            stream.flush()
    os._exit(code)
