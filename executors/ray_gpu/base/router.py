"""A handle's request path on Ray: ``rankcore.requests.RequestMachine`` carried out (issue 22).

Every handle of a deployment in a process shares one ``Router``. The router
decides nothing itself: its ``RequestMachine`` (pure, property-tested; docs/
requests.md) queues, dispatches to the least loaded serving replica, holds
at most ``max_ongoing_requests`` per replica, refuses at once past
``max_queued_requests`` (``rankcore.Overloaded``), retries a started request
whose replica died only when its method is idempotent (``@idempotent``),
else fails it naming the replica (``rankcore.ReplicaDied``), and fails every
waiting request at once when no replica serves and none is coming
(``rankcore.Unavailable``). The router only:

* feeds it the pool the control core pushed: the controller answers a long
  poll (``pool_after``) with its ``Driver.pools``, the view the core's
  ``PoolChanged`` / ``PoolComing`` / ``PoolReset`` commands made, as soon as a
  pool command for the deployment comes out of a step; the router turns each
  answer into a ``PoolReset`` (and a ``Configure`` when the limits changed);
* carries out ``Dispatch`` (``actor.handle_call.remote``, the call in one argument; a progress call's through
  ``handle_progress``, below; a plain call of a by-value handle, the proxy's by default, over the replica's
  gRPC server instead once its address is known: ``by_value``), ``Rejected`` and
  ``Failed`` (the caller's future gets the typed error), ``CancelOnReplica``
  (``ray.cancel``);
* reports what happened: ``Completed`` when a call returns (``ok=False`` for
  the application's exception: the caller gets it with its remote traceback),
  and a replica a call saw die is gone for the machine at once (``PoolChanged``
  gone, a fact the core confirms later); left out until the controller stops
  listing it.

``running`` costs nothing to calls that do not ask for it. A call made with ``progress=True``
(``handle.options(progress=True)``; the HTTP ingress's progress route) goes to the replica's
``handle_progress``, a Ray streaming generator whose first item is a start marker, yielded once the
call holds a slot and the user's method begins, and whose second is the answer: the router feeds
``Started`` at the marker (the request's status says ``running``) and ``Completed`` at the answer,
reading both on one event loop thread shared by every progress call of the process. A plain call
stays one ``handle_call`` and its status goes from ``dispatched`` to its end. A stream reports
``Started`` at its first item. A progress call is submitted with ``reports_started``: if its replica
dies before its marker came, it never began and is sent to another replica, not failed (Ray Serve's
router re-sends a request no replica accepted the same way; a replica that dies between yielding the
marker and its arrival has begun it, and it runs again: the marker's flight, a fraction of a
millisecond). Every other call counts as started once dispatched (the machine keeps
``reports_started=False``): when its replica dies it is retried only if idempotent, never run twice,
unless the replica's witness (``witness``) says it never entered the user's method. A plain call
carries a key the replica writes to its witness as the call takes a slot; when a call sees its
replica die, the router keeps that replica from new work (draining), reads its witness once its
process is gone (``witness.ask_node``, on another thread), feeds ``NotDelivered`` for its calls
the witness does not hold (sent to another replica) and then ``PoolChanged`` gone (the rest fail,
or retry if idempotent). A marker costs every call a Ray streaming generator instead of a plain
actor call: +0.65 ms at one client and half the calls a second at 16 on this project's 2-core
machine (``benchmarks/bench_start_marker.py``); the witness, two stores into shared memory. A plain
call sent by value needs no witness: its replica's server sends a begin marker once the call holds a
slot (``by_value.BEGAN``), and one cut off without it is ``NotDelivered`` at once (``_not_begun``).

The machine's clock (``Tick``) is fed as calls are sent and answered (``_tick``): a replica silent
while its peers answer is left out of new work (``rankcore.requests.outliers``).

Thread-safe: the machine is stepped under one lock, from callers' threads and
from Ray's completion callbacks. Nothing waits on Ray while holding it: Ray runs
those callbacks on the thread that also delivers answers to ``ray.get``, so a
callback waiting for the lock would stall the answer its holder waits for.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import itertools
import os
import threading
import time
import traceback
import weakref
from collections.abc import Callable, Iterator
from concurrent.futures import Future
from typing import Any

import grpc
import ray
from ray.exceptions import ActorUnavailableError, RayActorError, RaySystemError, RayTaskError, TaskCancelledError

import rankcore as rc
from rankcore.requests import (
    Cancel,
    CancelOnReplica,
    Completed,
    Configure,
    Dispatch,
    Failed,
    NotDelivered,
    Rejected,
    ReplicaLocated,
    ReplicaModels,
    RequestMachine,
    RequestStatus,
    Started,
    Submit,
    Tick,
)

from . import by_value
from .autoscale import LoadReporter
from .context import RequestContext, request_for_call, to_wire
from .routers import ensure_router, node_here, prompt_text
from .witness import ask_node

__all__ = ["Router", "Call", "LONG_POLL_S", "LONG_POLL_RETRY_S", "IDEMPOTENT_ATTR", "idempotent"]

#: how long the controller holds a long poll with no change before answering anyway
LONG_POLL_S = 10.0
#: after a failed long poll (the controller restarting), ask again this much later
LONG_POLL_RETRY_S = 0.5
IDEMPOTENT_ATTR = "__rankcore_idempotent__"

#: how many items a stream's replica may run ahead of its caller (Ray's generator back-pressure)
STREAM_BACKPRESSURE = 16
#: how often at most the request machine's clock is fed (``Router._tick``): a replica silent while its
#: peers answer is left out within ``outliers.QUIET_AFTER_S`` plus this
TICK_S = 0.25
#: how long a by-value call that failed on its way waits for Ray to say whether its replica lives
UNREACHABLE_PROBE_S = 30.0
#: how long a router tries to connect to a replica's by-value server once it learns its address; a
#: server it cannot reach by then (a firewall that lets Ray's ports alone through) gets Ray calls
REACHABLE_S = 5.0
#: how long after a failed connect a router tries that replica's server again (doubling each time, to
#: ``REACH_AGAIN_MOST_S``): one slow connect on a loaded host does not keep a replica on Ray calls for good
REACH_AGAIN_S = 30.0
REACH_AGAIN_MOST_S = 480.0
#: how many witness answers a router keeps for tests and benchmarks to read (``Router.witnessed``)
WITNESSED = 64
_ids = itertools.count()
_loop: asyncio.AbstractEventLoop | None = None  # the progress calls' event loop (``_progress_loop``)
_loop_lock = threading.Lock()


def _progress_loop() -> asyncio.AbstractEventLoop:
    """The one event loop (on a daemon thread, started on first use) that reads every progress
    call's stream in this process: no thread per call, nothing for plain calls."""
    global _loop
    with _loop_lock:
        if _loop is None or _loop.is_closed():
            _loop = asyncio.new_event_loop()
            threading.Thread(target=_loop.run_forever, name="rankcore-progress", daemon=True).start()
        return _loop


def idempotent(method: Any) -> Any:
    """Mark a deployment's method idempotent: a call to it that a dying replica had started runs again
    elsewhere (at most ``max_retries`` times). Off by default, as in Ray Serve."""
    setattr(method, IDEMPOTENT_ATTR, True)
    return method


class Call:
    """One request: what to send, and the future its end resolves (the result, or an exception)."""

    __slots__ = ("request_id", "method", "args", "kwargs", "future", "ref", "replica_id", "router", "stream",
                 "progress", "request", "key", "by_value")

    def __init__(self, router: Router, request_id: str, method: str, args: tuple, kwargs: dict,
                 stream: bool = False, progress: bool = False, request: RequestContext | None = None,
                 key: int = 0, by_value: bool = False) -> None:
        self.router, self.request_id, self.method = router, request_id, method
        #: sent over the replica's gRPC server when it can be (``by_value``), else as a Ray actor call
        self.by_value = by_value
        self.key = key  # what its replica's witness records as it begins (``witness``; 0: none)
        self.args, self.kwargs, self.stream = args, kwargs, stream
        self.progress = progress  # the replica reports when it begins (status ``running``)
        #: what the replica's user code sees (``_get_serve_request_context()``): the caller's request id
        #: and route. ``request_id`` above is the machine's own (Serve's internal request id)
        self.request = request if request is not None else request_for_call(router.name)
        #: the answer; for a stream, its Ray ``ObjectRefGenerator`` once dispatched (the items follow)
        self.future: Future = Future()
        self.ref: Any = None
        self.replica_id: str | None = None

    def status(self) -> RequestStatus | None:
        """Where the request is (``queued`` with its position, ``loading``, ``dispatched``, ...)."""
        return self.router.status(self.request_id)

    def cancel(self) -> None:
        self.router.cancel(self.request_id)


#: every router of this process (``routed``: what the scraped process exports of them)
_ALL: weakref.WeakSet[Router] = weakref.WeakSet()
_ALL_LOCK = threading.Lock()


def routed() -> list[tuple[str, str, str, str, int]]:
    """What this process's routers routed: ``(deployment, route, application, handle id, calls)``
    (Serve's router and handle request counters; the process that is scraped exports them: the
    ingress, a replica: ``base.metrics.router_families``)."""
    with _ALL_LOCK:
        routers = list(_ALL)
    out: list[tuple[str, str, str, str, int]] = []
    for router in routers:
        with router.lock:
            counts = list(router.routed.items())
        out.extend((router.name, route, app, router.handle_id, n) for (route, app), n in counts)
    return out


class Router:
    """The request path of one deployment in this process (module docstring)."""

    def __init__(self, name: str, controller: Any, ask: Any = None) -> None:
        """``ask(controller, method, *args)``: a call to the controller that waits out its restart
        (``api.ask``; passed in, so this module imports nothing of the handle's)."""
        self.name, self.controller, self._ask = name, controller, ask
        self.machine = RequestMachine()
        self._ticked = float("-inf")  # (when the machine's clock was last fed: ``_tick``)
        self.lock = threading.RLock()
        self.actors: dict[str, Any] = {}  # serving replica id -> actor handle, as the controller last said
        self.dead: set[str] = set()  # replicas a call saw die, left out until the controller stops listing them
        #: serving replica id -> its node (the controller's pool answer), where its witness is read
        self.nodes: dict[str, str] = {}
        #: dead replicas whose witness is being asked which of their calls began (held as draining)
        self.asking: set[str] = set()
        self._key_base = int.from_bytes(os.urandom(4), "little") << 32  # (this router's calls' keys)
        self.calls: dict[str, Call] = {}
        self.limits: tuple | None = None  # (max_ongoing, max_queued, max_retries, router, its keywords)
        #: the deployment's router reads prefixes (``Submit.prefix``: a call's prompt, ``prompt_text``)
        self.reads_prefix = False
        #: serving replica id -> (node, zone) the machine was told (``ReplicaLocated``); this process's
        #: node and zone, a call's ``caller_node`` / ``caller_zone`` (the locality router's)
        self.located: dict[str, tuple[str, str]] = {}
        self.here: tuple[str, str] = (node_here(), "")
        self.version: Any = None  # the last pool answer's version (None: never asked)
        #: a pool answer has named a serving replica once (Serve's ``running_replicas_populated``)
        self.populated = False
        self.idempotent: frozenset[str] = frozenset()
        self.streams: frozenset[str] = frozenset()  # the class's generator methods (``options(stream=True)``)
        #: replica id -> the multiplexed models it last said it holds (fed to the machine when they change)
        self.models: dict[str, tuple[str, ...]] = {}
        self.poll: Any = None
        self.retry_at = 0.0
        #: by value (``by_value``): serving replica id -> its server's ``host:port``, once it answered; the
        #: replicas asked now; those that could not say or whose server failed (by reference from then on)
        self.addresses: dict[str, str] = {}
        self.asking_address: set[str] = set()
        self.no_by_value: set[str] = set()
        self.unreached: dict[str, int] = {}  # of those, the ones no connect reached: failed connects so far
        self.wants_by_value = False  # (a by-value call came: every serving replica is asked its address)
        self.sent_by_value = 0  # calls sent by value (the ingress's status shows it; tests)
        self.resent_by_reference = 0  # calls by value that never left (no connection), sent by Ray call then
        #: calls by value whose replica or node was lost before they began (no ``by_value.BEGAN``): sent on
        self.not_begun = 0
        #: address -> [a gRPC channel, its calls in flight]; those of replicas gone from the pool close
        #: once their calls ended (``_closing``): a draining replica finishes what it has
        self._channels: dict[str, list] = {}
        self._closing: set[str] = set()
        self.polls = 0  # long-poll answers taken (tests)
        #: the last WITNESSED witnesses asked (tests, benchmarks): (replica, calls asked about, of them never
        #: begun; None: unknown); bounded, as a router lives as long as its handle, through any number of deaths
        self.witnessed: collections.deque[tuple[str, int, int | None]] = collections.deque(maxlen=WITNESSED)
        self._prefix = f"{name}:{id(self):x}:"
        #: Serve's ``handle`` label of what this router counts (``routed``): its id in this process
        self.handle_id = f"{id(self):x}"
        #: (route, application) -> calls submitted here with that route in their request context, and the
        #: application their deployment was in then (Serve's router and handle request counters, exported by
        #: the scraped process: ``routed``; labelled when counted, as Serve's are)
        self.routed: dict[tuple[str, str], int] = {}
        #: pushes this router's load to the controller while it has some (autoscaling: ``autoscale.py``)
        self.load = LoadReporter(self._load, self._push_load)
        #: the draining replicas the last pool answer named (with those whose witness is asked)
        self.draining: tuple[str, ...] = ()
        #: called (under the lock: they must not block) after each pool answer is taken: the direct data
        #: plane's (``ingress/haproxy.py``), which follows the pool
        self.listeners: list[Callable[[], None]] = []
        with _ALL_LOCK:
            _ALL.add(self)

    # ------------------------------------------------------------ the pool
    def refresh(self, force: bool = False) -> None:
        """Take the long poll's answer if it came, and keep one pending; with ``force``, or before
        the first answer, ask the controller now (waiting out a restart)."""
        if self.controller is not None and not ray.is_initialized():
            return  # (Ray was shut down: a call now would start a new local Ray)
        with self.lock:
            poll = self.poll
            if poll is not None and poll.done():
                self.poll = None
                try:
                    self._take(poll.result())
                    self.polls += 1
                except Exception:  # (the controller restarting): ask again soon, whoever calls or not
                    self.retry_at = time.monotonic() + LONG_POLL_RETRY_S
                    self._after(LONG_POLL_RETRY_S + 0.01, self.refresh)
            if not (force or self.version is None):
                self._keep_polling()
                return
        # Not under the lock: Ray delivers this answer on the thread that also runs the calls'
        # completion callbacks (``_done``), which take the lock; one of them waiting for it
        # while we held it would stall the answer until ``ask`` timed out (60 s).
        pool = self._ask(self.controller, "pool", self.name)
        with self.lock:
            self._take(pool)
            self._keep_polling()

    def _keep_polling(self) -> None:
        """One long poll pending, unless a failed one is waiting out its retry (under the lock)."""
        if self.poll is None and time.monotonic() >= self.retry_at:
            self.poll = self.controller.pool_after.remote(self.name, self.version, LONG_POLL_S).future()
            self.poll.add_done_callback(lambda _f: self._later(self.refresh))

    def _later(self, fn: Any) -> None:
        threading.Thread(target=fn, daemon=True).start()  # (not on Ray's callback thread: refresh may block)

    def _after(self, seconds: float, fn: Any, *args: Any) -> None:
        """``fn(*args)`` in ``seconds``, on a thread of its own that does not keep the process alive."""
        timer = threading.Timer(seconds, fn, args)
        timer.daemon = True
        timer.start()

    def _take(self, pool: dict) -> None:
        """A pool answer: ``{"version", "serving": [(rid, actor)], "nodes": {rid: node}, "draining": [rid], "coming",
        "max_ongoing_requests", "max_queued_requests", "idempotent"}``. One older than the
        answer taken last (a forced ask and the long poll crossing) is dropped: versions are
        (controller incarnation, pool changes), both counting up for this router's controller."""
        if self.version is not None and pool["version"] < self.version:
            return
        self.version = pool["version"]
        serving = [(rid, actor) for rid, actor in pool["serving"]]
        self.dead.intersection_update(rid for rid, _ in serving)
        self.dead |= self.asking
        self.actors = {rid: actor for rid, actor in serving if rid not in self.dead}
        self.populated = self.populated or bool(serving)
        self.nodes = {**{rid: n for rid, n in pool.get("nodes", {}).items() if rid in self.actors},
                      **{rid: n for rid, n in self.nodes.items() if rid in self.asking}}
        self.idempotent = frozenset(pool.get("idempotent", ()))
        self.streams = frozenset(pool.get("streams", ()))
        out: list = []
        kwargs = pool.get("request_router_kwargs", {})
        limits = (pool["max_ongoing_requests"], pool["max_queued_requests"], pool.get("max_retries", 3),
                  pool.get("request_router", ""), tuple(sorted(kwargs.items())))
        if limits != self.limits:
            ensure_router(limits[3], f"deployment {self.name!r}")  # (a user's router: imported here too)
            out += self.machine.handle(Configure(deployment=self.name, max_ongoing_requests=limits[0],
                                                 max_queued_requests=limits[1], max_retries=limits[2],
                                                 request_router=limits[3], request_router_kwargs=kwargs))
            self.limits = limits
            self.reads_prefix = bool(limits[3])
        draining = tuple(pool["draining"]) + tuple(r for r in sorted(self.asking) if r not in pool["draining"])
        self.draining = draining
        out += self.machine.handle(rc.PoolReset(deployment=self.name, serving=tuple(self.actors),
                                                draining=draining, coming=bool(pool["coming"])))
        for rid, models in pool.get("models", {}).items():  # (what each replica said it holds, if it changed)
            if rid in self.actors and self.models.get(rid) != models:
                self.machine.handle(ReplicaModels(deployment=self.name, replica_id=rid, model_ids=tuple(models)))
        self.models = {rid: m for rid, m in pool.get("models", {}).items() if rid in self.actors}
        zones = pool.get("zones", {})
        self.here = (self.here[0], zones.get(self.here[0], ""))
        for rid in self.actors:  # (where each serving replica runs: the locality router reads it)
            node = self.nodes.get(rid, "")
            place = (node, zones.get(node, ""))
            if self.located.get(rid) != place:
                self.machine.handle(ReplicaLocated(deployment=self.name, replica_id=rid, node_id=place[0],
                                                   zone=place[1]))
                self.located[rid] = place
        self.located = {rid: p for rid, p in self.located.items() if rid in self.actors}
        for rid in [r for r in self.addresses if r not in self.actors]:
            self._forget_address(rid)
        self.no_by_value.intersection_update(self.actors)
        self.unreached = {rid: n for rid, n in self.unreached.items() if rid in self.actors}
        self._ask_addresses()
        self._carry(out)
        for listener in self.listeners:
            listener()

    # ------------------------------------------------------------ by value
    def _ask_addresses(self) -> None:
        """Ask each serving replica without a known address where its by-value server is (under the
        lock; once a by-value call came). The answer comes on Ray's thread; calls go by reference
        until it does."""
        if not self.wants_by_value:
            return
        for rid, actor in self.actors.items():
            if rid in self.addresses or rid in self.asking_address or rid in self.no_by_value:
                continue
            self.asking_address.add(rid)
            actor.by_value_address.remote().future().add_done_callback(
                lambda f, rid=rid, actor=actor: self._address(rid, actor, f))

    def _address(self, rid: str, actor: Any, fut: Future) -> None:
        """``rid``'s server address came (on Ray's thread): tried on a thread of its own (``_reach``)."""
        try:
            address = fut.result()
        except Exception:  # (it died, or could not start a server: by reference)
            with self.lock:
                self.asking_address.discard(rid)
                self.no_by_value.add(rid)
            return
        self._later(lambda: self._reach(rid, actor, address))

    def _reach(self, rid: str, actor: Any, address: str) -> None:
        """Connect to ``rid``'s server before any call goes there by value (a channel of its own: one the
        router holds may close meanwhile): one this router cannot reach within ``REACHABLE_S`` gets Ray
        calls (its calls would fail on their way otherwise) until it is tried again (``_reach_again``)."""
        ch = ready = None
        reached = False
        try:
            ch = by_value.channel(address)
            ready = grpc.channel_ready_future(ch)
            ready.result(timeout=REACHABLE_S)
            reached = True
        except Exception:  # (grpc.FutureTimeoutError: no connection in time; or no channel could be made)
            pass
        finally:
            if ready is not None:
                ready.cancel()
        kept, again = False, 0.0
        with self.lock:
            self.asking_address.discard(rid)
            if not reached:
                self.no_by_value.add(rid)
                if self.actors.get(rid) == actor:
                    self.unreached[rid] = tries = self.unreached.get(rid, 0) + 1
                    again = min(REACH_AGAIN_S * 2 ** (tries - 1), REACH_AGAIN_MOST_S)
            elif self.actors.get(rid) == actor and rid not in self.no_by_value:  # (still serving: the same actor)
                self.unreached.pop(rid, None)
                self.addresses[rid] = address
                self._closing.discard(address)  # (a replica back in the pool: the channel held stays open)
                if address not in self._channels:  # (one held is open: ``_close_idle`` drops it before closing)
                    self._channels[address] = [ch, 0]
                    kept = True
        if ch is not None and not kept:
            ch.close()
        if again:
            self._after(again, self._reach_again, rid, actor)

    def _reach_again(self, rid: str, actor: Any) -> None:
        """Ask ``rid`` where its server is again and try to connect, if it still serves and was not
        reached since."""
        if not ray.is_initialized():
            return  # (Ray was shut down: a call now would start a new local Ray)
        with self.lock:
            if self.actors.get(rid) != actor or rid not in self.unreached:  # (reached since: no longer in it)
                return
            self.no_by_value.discard(rid)
            self._ask_addresses()

    def _forget_address(self, rid: str) -> None:
        """``rid`` left the pool, or its server failed (under the lock): no new call goes there by
        value, and its channel closes once the calls on it ended (a draining replica's finish)."""
        address = self.addresses.pop(rid, None)
        if address is not None and address not in self.addresses.values():
            self._closing.add(address)
            self._close_idle(address)

    def _close_idle(self, address: str) -> None:
        """Close ``address``'s channel if it is to close and no call is on it (under the lock)."""
        held = self._channels.get(address)
        if address in self._closing and (held is None or held[1] == 0):
            self._closing.discard(address)
            if held is not None:
                del self._channels[address]
                held[0].close()

    def _send_by_reference(self, call: Call, rid: str, actor: Any) -> None:
        """Send ``call`` to ``rid`` as a Ray actor call (under the lock); ``_done`` answers it."""
        call.ref = ref = actor.handle_call.remote((call.method, call.args, call.kwargs, to_wire(call.request),
                                                  call.key))
        req = call.request_id
        ref.future().add_done_callback(lambda f, req=req, rid=rid: self._done(req, rid, f))

    def _by_value_bytes(self, call: Call) -> bytes | None:
        """``call`` pickled for its replica's server, or None when it goes by reference (``by_value``'s
        docstring: a Ray ``ObjectRef`` anywhere in its arguments, bytes that do not pickle or would be
        more than ``MAX_BY_VALUE_BYTES``: pickling stops there)."""
        try:
            return by_value.encode((call.method, call.args, call.kwargs, to_wire(call.request), call.key),
                                   most=by_value.MAX_BY_VALUE_BYTES)
        except Exception:  # (by_value.NotByValue, or what pickling raised)
            return None

    def _send_by_value(self, call: Call, rid: str, address: str, data: bytes, actor: Any) -> bool:
        """Send ``call`` over its replica's gRPC server (under the lock; gRPC's own threads carry it, so
        no event loop is needed and any thread may send or cancel: ``call.ref`` is gRPC's future).
        ``_by_value_ended`` answers it, whatever happens. False if it could not be sent (the caller
        sends it by reference)."""
        held = self._channels.get(address)
        try:
            if held is None:
                held = self._channels[address] = [by_value.channel(address), 0]
            fut = held[0].unary_unary(by_value.METHOD).future(data)
        except Exception:  # (gRPC refused to start it: as a Ray call, and that replica by reference now)
            self.no_by_value.add(rid)
            self._forget_address(rid)
            return False
        held[1] += 1
        self.sent_by_value += 1
        call.ref = fut
        fut.add_done_callback(lambda f, c=call, rid=rid, a=address, actor=actor: self._by_value_ended(
            f, c, rid, a, actor))
        return True

    def _by_value_ended(self, fut: Any, call: Call, rid: str, address: str, actor: Any) -> None:
        """A call by value ended (on gRPC's thread): the value, the user's error as Ray raises it
        (``RayTaskError(<cause>)``), a call its caller cancelled as Ray's ``TaskCancelledError``; a
        failure on its way is sorted on another thread (``_failed_on_way`` asks Ray)."""
        with self.lock:
            held = self._channels.get(address)
            if held is not None:
                held[1] -= 1
                self._close_idle(address)
        value: Any = None
        exc: BaseException | None = None
        if fut.cancelled():  # (``CancelOnReplica``: gRPC cancels the replica's task)
            exc = TaskCancelledError(error_message=f"call to {self.name!r} cancelled on replica {rid}")
        elif (err := fut.exception()) is not None:
            self._later(lambda: self._failed_on_way(call, rid, address, actor, fut, err))
            return
        else:
            try:
                ok, value = by_value.decode(fut.result())
            except Exception as e:  # (an answer this process cannot unpickle: a class it lacks): Ray's error
                exc = RaySystemError(f"the answer of {self.name!r} replica {rid} to {call.method!r} could not be "
                                     f"unpickled here: {type(e).__name__}: {e}", traceback.format_exc())
            else:
                if not ok:
                    value, exc = None, value.as_instanceof_cause()
        self._answer(call.request_id, rid, value, exc)

    def _failed_on_way(self, call: Call, rid: str, address: str, actor: Any, fut: Any, exc: BaseException) -> None:
        """A by-value call to ``rid`` failed on its way (on a thread of its own: it may ask Ray); that
        replica gets Ray calls from now on. If the replica could not be reached and is dead (Ray says
        so), the call ends with the error a Ray call would have had (``_answer``: the witness, retries).
        If it lives and the call never left (gRPC could not connect), the call goes to it by reference,
        where the machine sent it (unless it went elsewhere meanwhile: ``fut`` is no longer its way).
        Else its server failed the call after it may have begun: it fails (``rankcore.Unavailable``,
        naming the gRPC status), and its calls by reference are untouched. Before all that: a call cut
        off that had not begun (no begin marker: ``_not_begun``) goes to another replica, whatever
        became of this one or its node."""
        code = exc.code() if isinstance(exc, grpc.Call) else None
        if code == by_value.UNAVAILABLE:
            # (cut off before it began, not for want of a connection: sent on before Ray is asked)
            sent_on = not by_value.never_sent(exc) and by_value.never_began(fut) and self._not_begun(call, rid, fut)
            try:
                ray.get(actor.pid.remote(), timeout=UNREACHABLE_PROBE_S)
            except (RayActorError, ActorUnavailableError) as dead:
                if sent_on or (by_value.never_began(fut) and self._not_begun(call, rid, fut)):
                    with self.lock:  # (its other calls: sorted as a Ray call's death sorts them)
                        self._lost(rid, dead)
                else:
                    self._answer(call.request_id, rid, None, dead)
                return
            except Exception:  # (no answer in time: as alive)
                pass
            if sent_on:
                return
        with self.lock:
            self.no_by_value.add(rid)
            self._forget_address(rid)
            ours = self.calls.get(call.request_id) is call
            if ours and call.ref is not fut:
                return  # (it went another way meanwhile, its replica having left the pool: that way answers it)
            if by_value.never_sent(exc) and ours and call.replica_id == rid and not call.future.done() \
                    and self.actors.get(rid) == actor:
                try:
                    self._send_by_reference(call, rid, actor)
                except Exception as e:  # (Ray refused it: the call fails, saying why)
                    exc, code = e, None
                else:
                    self.resent_by_reference += 1
                    return
        why = f"{code.name}: {exc.details()}" if isinstance(exc, grpc.Call) and code is not None else repr(exc)
        self._answer(call.request_id, rid, None, rc.Unavailable(
            f"call to {self.name!r} sent by value to replica {rid} at {address} failed on its way ({why}); its "
            f"calls go by reference from now on", deployment=self.name, request_id=call.request_id, replica_id=rid))

    def _not_begun(self, call: Call, rid: str, fut: Any) -> bool:
        """By-value ``call`` to ``rid`` was cut off before it began (``by_value.never_began``): unless it
        went another way meanwhile, the machine's ``NotDelivered`` (sent to another replica; ``rid`` gets
        nothing new until the pool names it again, and by reference then). True when it was sent on."""
        with self.lock:
            st = self.machine.status(call.request_id)
            if self.calls.get(call.request_id) is not call or call.ref is not fut or st is None \
                    or st.state != "dispatched" or st.replica_id != rid:
                return False
            self.no_by_value.add(rid)
            self._forget_address(rid)
            self.not_begun += 1
            self._carry(self.machine.handle(NotDelivered(request_id=call.request_id, replica_id=rid)))
            return True

    # ------------------------------------------------------------ requests
    def submit(self, method: str, args: tuple, kwargs: dict, *, stream: bool = False,
               progress: bool = False, request: RequestContext | None = None, by_value: bool = False,
               routing_key: str = "") -> Call:
        """Queue a call; it is dispatched as the machine says. Its ``future`` ends with the answer.
        ``progress``: its status says ``running`` once the replica begins it (module docstring).
        ``request``: the request context the replica shows its user code (None: the current
        request's id, else a new one: ``context.request_for_call``). ``by_value``: sent over the
        replica's gRPC server where it can be (``base.by_value``; a stream or progress call never is).
        ``routing_key``: the call's session key (the ``consistent_hash`` router's); where the deployment
        has a router, the call's prompt (``prompt_text``) is its prefix, and this process's node and
        zone its caller's."""
        self.refresh()
        with self.lock:
            if method in self.streams and not stream:
                raise TypeError(f"{self.name}.{method} is a generator method: call it through "
                                f"handle.options(stream=True)")
            n = next(_ids)
            by_value = by_value and not stream and not progress
            call = Call(self, f"{self._prefix}{n}", method, args, kwargs, stream, progress, request,
                        self._key_base | (n & 0xFFFFFFFF), by_value)
            if by_value and not self.wants_by_value:
                self.wants_by_value = True
                self._ask_addresses()
            self.calls[call.request_id] = call
            self._tick()
            key = (call.request.route, call.request.app_name)
            self.routed[key] = self.routed.get(key, 0) + 1
            self._carry(self.machine.handle(Submit(request_id=call.request_id, deployment=self.name,
                                                   idempotent=method in self.idempotent, stream=stream,
                                                   model_id=call.request.multiplexed_model_id,
                                                   reports_started=progress and not stream,
                                                   routing_key=routing_key,
                                                   prefix=prompt_text(args, kwargs) if self.reads_prefix else "",
                                                   caller_node=self.here[0], caller_zone=self.here[1])))
            cold = not self.actors
        if self.controller is not None:
            self.load.kick(urgent=cold)
        return call

    def _load(self) -> tuple[int, tuple[tuple[str, int], ...]]:
        """What this router holds of its deployment: queued requests, in flight per replica."""
        with self.lock:
            return self.machine.load(self.name)

    def _push_load(self, key: str, queued: int, ongoing: tuple, urgent: bool) -> Any:
        return self.controller.report_load.remote(self.name, key, queued, ongoing, urgent)

    def cancel(self, request_id: str) -> None:
        with self.lock:
            if request_id in self.calls:
                self._carry(self.machine.handle(Cancel(request_id=request_id)))

    def status(self, request_id: str) -> RequestStatus | None:
        with self.lock:
            return self.machine.status(request_id)

    def counters(self) -> Any:
        with self.lock:
            return self.machine.counters(self.name) if self.limits is not None else None

    def _tick(self) -> None:
        """The machine's clock, at most every ``TICK_S``, fed as calls come and go (under the lock): what
        its rule of quiet replicas (``rankcore.requests.outliers``) reads. No call, no tick: with nothing
        sent or answered there is no silence to judge."""
        now = time.monotonic()
        if now - self._ticked >= TICK_S:
            self._ticked = now
            self._carry(self.machine.handle(Tick(now=now)))

    def _carry(self, actions: list) -> None:
        """Carry out the machine's actions (under the lock)."""
        for a in actions:
            kind = type(a)
            if kind is Dispatch:
                call = self.calls[a.request_id]
                actor = self.actors[a.replica_id]
                call.replica_id = a.replica_id
                if call.stream:  # (its items are read by the caller: ``stream_items``; it reports the end)
                    call.ref = actor.handle_stream.options(
                        num_returns="streaming", _generator_backpressure_num_objects=STREAM_BACKPRESSURE,
                    ).remote(call.method, call.args, call.kwargs, call.request)
                    call.future.set_result(call.ref)
                    continue
                if call.progress:  # (a start marker, then the answer: ``_follow``)
                    call.ref = gen = actor.handle_progress.options(num_returns="streaming").remote(
                        call.method, call.args, call.kwargs, call.request)
                    asyncio.run_coroutine_threadsafe(self._follow(a.request_id, a.replica_id, gen),
                                                     _progress_loop())
                    continue
                if call.by_value and (address := self.addresses.get(a.replica_id)) is not None and (
                        data := self._by_value_bytes(call)) is not None and self._send_by_value(
                            call, a.replica_id, address, data, actor):
                    continue
                self._send_by_reference(call, a.replica_id, actor)
            elif kind is Rejected or kind is Failed:
                ended = self.calls.pop(a.request_id, None)
                if ended is not None and not ended.future.done():
                    ended.future.set_exception(self._error(a))
            elif kind is CancelOnReplica:
                held = self.calls.pop(a.request_id, None)
                if held is not None and held.ref is not None:
                    if isinstance(held.ref, grpc.Future):  # (by value: gRPC cancels the replica's task)
                        held.ref.cancel()
                    else:
                        ray.cancel(held.ref)
                    if held.stream:  # (nobody reads its end now: the machine frees its slot when the task ends)
                        held.ref.completed().future().add_done_callback(
                            lambda f, req=a.request_id, rid=a.replica_id: self._done(req, rid, f))
                    if not held.future.done():
                        held.future.set_exception(rc.RequestCancelled(
                            f"call to {self.name!r} cancelled on replica {a.replica_id}", deployment=self.name,
                            request_id=a.request_id, replica_id=a.replica_id))

    def stream_items(self, call: Call, timeout: float | None = None) -> Any:
        """A stream's items, as the replica yields them (Ray's back-pressure: the replica runs at most
        ``STREAM_BACKPRESSURE`` items ahead). Its end, an application error, or its replica's death is
        told to the machine (``_reading``); a replica dying mid-stream raises ``rankcore.ReplicaDied``
        after the items already given, never a silent truncation. A stream closed early is cancelled
        on the replica."""
        gen = call.future.result(timeout)  # (Rejected / Failed before dispatch raise here)
        with self._reading(call, gen) as got:
            for ref in gen:
                yield got(ray.get(ref))

    async def stream_items_async(self, call: Call) -> Any:
        """``stream_items`` for async code (``async for``); the same bookkeeping (``_reading``)."""
        gen = await asyncio.wrap_future(call.future)
        with self._reading(call, gen) as got:
            async for ref in gen:
                yield got(await ref)

    @contextlib.contextmanager
    def _reading(self, call: Call, gen: Any) -> Iterator[Callable[[Any], Any]]:
        """What both stream readers tell the machine while a caller reads ``call``'s items from ``gen``
        (Ray's ``ObjectRefGenerator``). The body passes each item through the function it is given:
        the first one is ``Started`` (status ``running``). An application error ends the stream
        (``Completed(ok=False)``) and is raised as its cause; the replica dying is ``_stream_died``;
        the consuming task cancelled (async) cancels the request, whose slot the machine frees when
        Ray's generator ends; closed early by its caller, it is cancelled on the replica and ends
        answered; the last item read, it ends answered."""
        rid = call.replica_id
        first = True

        def got(item: Any) -> Any:
            nonlocal first
            if first:
                first = False
                self._started(call.request_id, rid)
            return item

        try:
            yield got
        except RayTaskError as exc:  # the application raised: the caller gets it, the stream ends
            self._stream_end(call, rid, ok=False)
            raise exc.as_instanceof_cause() from None
        except (RayActorError, ActorUnavailableError) as exc:
            raise self._stream_died(call, rid, exc) from None
        except asyncio.CancelledError:  # the consuming task was cancelled: so is the stream (slot freed)
            self.cancel(call.request_id)
            raise
        except GeneratorExit:  # (closed early by its caller)
            ray.cancel(gen)
            self._stream_end(call, rid, ok=True)
            raise
        self._stream_end(call, rid, ok=True)

    def _started(self, request_id: str, replica_id: str | None) -> None:
        """The replica began the call: ``Started`` (its status says ``running``). A marker from an
        earlier dispatch, or for a call already ended, changes nothing."""
        with self.lock:
            if request_id in self.calls:
                try:
                    self.machine.handle(Started(request_id=request_id, replica_id=replica_id))
                except rc.InvalidEvent:  # (already running: a stale marker of an earlier dispatch there)
                    pass

    async def _follow(self, request_id: str, replica_id: str, gen: Any) -> None:
        """A progress call's stream (on the progress loop): the replica's start marker, then its answer."""
        value: Any = None
        exc: BaseException | None = None
        try:
            await (await gen.__anext__())  # the marker: the call holds a slot, the user's method begins
            self._started(request_id, replica_id)
            value = await (await gen.__anext__())
        except RayTaskError as e:  # the application raised: with its remote traceback
            exc = e.as_instanceof_cause()
        except BaseException as e:  # (the replica died, the call was cancelled: sorted by ``_answer``)
            exc = e
        self._answer(request_id, replica_id, value, exc)

    def _lost(self, rid: str, exc: BaseException) -> None:
        """A call saw ``rid`` die (under the lock): gone for the machine (requeue, retry or fail),
        once its witness said which of its plain calls began (``_ask_witness``); an unavailable one
        (it may come back) is gone at once, without being marked dead."""
        if rid in self.asking:
            return  # (settled with the others when the witness answers)
        if not isinstance(exc, ActorUnavailableError):
            if self._ask_witness(rid):
                return
            self.dead.add(rid)
        self.actors.pop(rid, None)
        self._carry(self.machine.handle(rc.PoolChanged(deployment=self.name, replica_id=rid, membership="gone")))

    def _ask_witness(self, rid: str) -> bool:
        """``rid`` died (under the lock): if it holds plain calls and its node is known, keep it
        from new work (draining) and ask its witness, on another thread, which of them began
        (``witness``); False when there is nothing to ask (the caller says gone at once)."""
        node, actor = self.nodes.get(rid), self.actors.get(rid)
        keys = {c.key: c.request_id for c in self.calls.values()
                if c.replica_id == rid and c.key and not c.stream and not c.progress}
        if node is None or actor is None or not keys:
            return False
        self.dead.add(rid)
        self.actors.pop(rid, None)
        self.asking.add(rid)
        self._carry(self.machine.handle(rc.PoolChanged(deployment=self.name, replica_id=rid,
                                                       membership="draining")))
        actor_id = actor._actor_id.hex()

        def ask() -> None:
            try:
                began = ask_node(node, actor_id, list(keys))
            except Exception:  # (counted as begun: fail as without a witness)
                began = None
            self._witnessed(rid, keys, began)

        self._later(ask)
        return True

    def _witnessed(self, rid: str, keys: dict[int, str], began: list[int] | None) -> None:
        """The witness of dead ``rid`` answered: its calls that never began go to another replica
        (``NotDelivered``), then it is gone (its other calls fail, or retry if idempotent)."""
        with self.lock:
            self.asking.discard(rid)
            self.witnessed.append((rid, len(keys), None if began is None else len(keys) - len(began)))
            if began is not None:
                done = set(began)
                for key, request_id in keys.items():
                    st = self.machine.status(request_id)
                    if key in done or st is None or st.state != "dispatched" or st.replica_id != rid:
                        continue  # (began, or already ended / moved on)
                    self._carry(self.machine.handle(NotDelivered(request_id=request_id, replica_id=rid)))
            self._carry(self.machine.handle(rc.PoolChanged(deployment=self.name, replica_id=rid,
                                                           membership="gone")))

    def _stream_end(self, call: Call, rid: str | None, ok: bool) -> None:
        with self.lock:
            if self.calls.pop(call.request_id, None) is not None:
                self._carry(self.machine.handle(Completed(request_id=call.request_id, ok=ok, replica_id=rid)))

    def _stream_died(self, call: Call, rid: str | None, exc: BaseException) -> Exception:
        """The stream's replica died: gone for the machine (which fails the stream: it had started)."""
        with self.lock:
            if rid is not None:
                self.calls.pop(call.request_id, None)
                self._lost(rid, exc)
        return rc.ReplicaDied(f"stream from {self.name!r}.{call.method}: replica {rid} died mid-stream "
                              f"({type(exc).__name__}); the items before it were delivered",
                              deployment=self.name, request_id=call.request_id, replica_id=rid)

    def _error(self, a: Rejected | Failed) -> Exception:
        if a.reason == "unknown_deployment":
            return rc.UnknownDeployment(f"unknown deployment {self.name!r}")
        cls = rc.REQUEST_ERRORS.get(a.reason, rc.RequestError)
        replica = getattr(a, "replica_id", None)
        where = f" on replica {replica}" if replica else ""
        return cls(f"call to {self.name!r}{where}: {a.reason}: {a.detail}", deployment=self.name,
                   request_id=a.request_id, replica_id=replica)

    def _done(self, request_id: str, replica_id: str, fut: Future) -> None:
        """A call's ObjectRef resolved (on Ray's thread)."""
        try:
            value, exc = fut.result(), None
        except BaseException as e:  # (sorted by ``_answer``)
            value, exc = None, e
        self._answer(request_id, replica_id, value, exc)

    def _answer(self, request_id: str, replica_id: str, value: Any, exc: BaseException | None) -> None:
        """A call's answer (``value``, or ``exc``): report it to the machine, carry out what follows."""
        with self.lock:
            self._tick()
            call = self.calls.get(request_id)
            if isinstance(exc, (RayActorError, ActorUnavailableError)) and not isinstance(exc, TaskCancelledError):
                self._lost(replica_id, exc)  # (the call is settled with the replica's others)
                return
            actions = self.machine.handle(Completed(request_id=request_id, ok=exc is None, replica_id=replica_id))
            st = self.machine.status(request_id)
            answered = st is not None and (st.state == "done" or st.reason == "app_error")
            if call is not None and answered and call.replica_id == replica_id:  # (else a late answer)
                self.calls.pop(request_id, None)
                if not call.future.done():
                    if exc is None:
                        call.future.set_result(value)
                    else:
                        call.future.set_exception(exc)
            self._carry(actions)
