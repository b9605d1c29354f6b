"""The Ray controller's side of the proxies (issue 38): it carries out the core's proxy commands.

The core decides where proxies run (``rankcore.control.proxies``: ``proxy_location``, one a
node); this module runs them as Ray actors and reports what happened. ``StartProxy``: an
``ingress.http.HttpIngress`` actor pinned to the node (``NodeAffinitySchedulingStrategy``,
``soft=False``), detached, ``max_restarts=0`` (the core restarts a dead one, not Ray), named
``rankcore-http`` on the head node (the name the ingress always had) and
``rankcore-http:<node id>`` elsewhere; answered by ``ProxyStarted`` once it accepts
connections, or ``ProxyCrashed``. Each live proxy holds a pending ``watch`` call, which
fails the moment it dies (``ProxyCrashed``, at once, not after missed health checks); every
``health_period_s`` (Serve's ``PROXY_HEALTH_CHECK_PERIOD_S``, 10 s) and every
``drain_check_s`` while it drains (5 s) it is asked how many requests it has in flight
(``ProxyHealthChecked``; no answer within ``health_timeout_s``: unhealthy). ``DrainProxy``:
its ``/-/healthz`` answers 503 (or 200 again); ``StopProxy``: its server closes, then the
actor is killed.

Ports: every proxy binds ``port`` on its node, as Serve's do (a real cluster: one address per
node, an outside load balancer in front). On one host (a ``ray.cluster_utils.Cluster``) the
nodes share the host's ports: give ``worker_port=0`` and each worker node's proxy binds a free
port of its own (``proxies()`` lists each one's address); the head's keeps ``port``.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable
from typing import Any

import attrs
import ray

import rankcore as rc

from ..base import persist
from ..base.replicas import NAMESPACE
from .ledger import Ledger

log = logging.getLogger("rankcore.ray.controller")

__all__ = ["INGRESS_NAME", "ProxySettings", "Proxies", "proxy_actor_name", "PROXY_HEALTH_CHECK_PERIOD_S", "LIMITS",
           "CONFIGURABLE", "save_configured"]

#: the head node's proxy's actor name (the one ingress had it before proxies were per node)
INGRESS_NAME = "rankcore-http"
#: Ray Serve's PROXY_HEALTH_CHECK_PERIOD_S / PROXY_HEALTH_CHECK_TIMEOUT_S / PROXY_DRAIN_CHECK_PERIOD_S
PROXY_HEALTH_CHECK_PERIOD_S = 10.0
PROXY_HEALTH_CHECK_TIMEOUT_S = 10.0
PROXY_DRAIN_CHECK_PERIOD_S = 5.0


def proxy_actor_name(node_id: str, head: str | None) -> str:
    return INGRESS_NAME if node_id == head else f"{INGRESS_NAME}:{node_id}"


def grpc_port_of(settings: ProxySettings, head: bool) -> int | None:
    """The gRPC port a proxy binds: ``grpc_port`` (None: no gRPC); another node's any free one when
    ``worker_port`` is 0 (a one-host test cluster)."""
    if settings.grpc_port is None or head or settings.worker_port != 0:
        return settings.grpc_port
    return 0


#: the proxies' limits (``ingress.http``: each declared there, with its default and its check): every
#: proxy starts with them (the head's, a restarted one, another node's), each a keyword of
#: ``HttpIngress`` and of its ``configure``
LIMITS = ("max_body_bytes", "request_timeout_s", "header_timeout_s", "max_header_bytes", "max_connections")
#: what ``start_ingress`` may change on running proxies (``save_configured``): the limits, access records
CONFIGURABLE = (*LIMITS, "enable_access_log")


@attrs.frozen(kw_only=True)
class ProxySettings:
    """What every proxy is started with (``ingress.http.start_ingress``): its address, limits and
    access records, and where proxies run (``rankcore.ProxyOptions``, declared once there). The
    ``CONFIGURABLE`` fields are stored again when ``start_ingress`` changes them on the running
    proxies (``save_configured``); a proxy the controller starts reads them from there."""

    host: str
    port: int
    #: the port proxies on the other nodes bind (None: ``port``; 0: any free port, one host)
    worker_port: int | None = None
    max_body_bytes: int
    request_timeout_s: float | None
    #: the connection limits (issue 40): a request head's deadline and size, connections open at once
    header_timeout_s: float | None
    max_header_bytes: int
    max_connections: int | None
    enable_access_log: bool
    logs_dir: str | None = None
    options: rc.ProxyOptions = attrs.field(factory=rc.ProxyOptions)
    #: gRPC beside HTTP (base/grpc_proxy.py): its port (None: no gRPC; other nodes bind any free
    #: port when ``worker_port`` is 0) and the services' ``add_XServicer_to_server`` import paths
    grpc_port: int | None = None
    grpc_servicer_functions: tuple[str, ...] = ()
    #: what carries deployments' HTTP requests: "proxy" (this proxy's server and router) or "direct"
    #: (an HAProxy straight to the replicas' own servers: ``ingress.haproxy.DATA_PLANES``, checked there)
    data_plane: str = "proxy"
    #: the proxy actor's class (``ingress.http.HttpIngress``, given by ``start_ingress``: the control
    #: plane imports nothing of the ingress; pickled by reference)
    actor_class: Any = None

    def limits(self) -> dict[str, Any]:
        """``LIMITS`` by name (what a proxy is started with)."""
        return {name: getattr(self, name) for name in LIMITS}


def save_configured(values: dict[str, Any]) -> ProxySettings | None:
    """Store ``values`` (``CONFIGURABLE`` fields: what the running proxies were just configured with)
    in the proxies' settings, so that every proxy the controller starts from now on (one restarted
    after a crash, one on another node) starts with them; None (nothing stored): no proxies run."""
    saved = persist.load_proxies()
    if saved is None:
        return None
    settings = attrs.evolve(saved[0], **{k: v for k, v in values.items() if k in CONFIGURABLE})
    persist.save_proxies(settings, saved[1])
    return settings


def _stored(settings: ProxySettings) -> ProxySettings:
    """``settings`` with the ``CONFIGURABLE`` fields as stored now (``save_configured`` changes them
    there, not in the controller's copy)."""
    saved = persist.load_proxies()
    if saved is None:
        return settings
    return attrs.evolve(settings, **{k: getattr(saved[0], k, getattr(settings, k)) for k in CONFIGURABLE})


class _Live:
    __slots__ = ("proxy_id", "node_id", "name", "actor", "ready", "draining", "stopping", "checked")

    def __init__(self, proxy_id: str, node_id: str, name: str) -> None:
        self.proxy_id, self.node_id, self.name = proxy_id, node_id, name
        self.actor: Any = None
        self.ready = self.draining = self.stopping = False
        self.checked = 0.0  # (monotonic) when it was last asked


def _why(exc: BaseException) -> str:
    """An actor's creation error in one line: Ray's text of it ends with the traceback's last line,
    ``module.Class: message``, given as ``Class: message``."""
    lines = [line for line in str(getattr(exc, "cause", None) or exc).splitlines() if line.strip()]
    last = lines[-1].strip() if lines else repr(exc)
    kind, sep, message = last.partition(": ")
    return f"{kind.rsplit('.', 1)[-1]}: {message}" if sep and " " not in kind else last


class Proxies:
    """Every proxy the core started (module docstring), and the settings they start with."""

    health_period_s = PROXY_HEALTH_CHECK_PERIOD_S
    health_timeout_s = PROXY_HEALTH_CHECK_TIMEOUT_S
    drain_check_s = PROXY_DRAIN_CHECK_PERIOD_S
    #: how long a new proxy may wait for its name (its predecessor's, killed a moment ago)
    name_wait_s = 30.0

    def __init__(self, ledger: Ledger) -> None:
        self.ledger = ledger
        self.settings: ProxySettings | None = None
        self.head: str | None = None
        self.live: dict[str, _Live] = {}  # proxy id -> the proxy
        #: told (node id, ms) once a proxy it stopped is gone (``ControllerMetrics.proxy_stopped``)
        self.on_stopped: Callable[[str, float], None] | None = None
        #: why the head node's proxy last refused to start (its constructor's InvalidConfig: its port in use ...);
        #: ``start_proxies`` reports it. A crash while it started is not one: the core's restart may mend it
        self.head_error: str | None = None
        self._loop: asyncio.Task | None = None

    # ---------------------------------------------------------- configure
    def configured(self) -> rc.ProxiesConfigured | None:
        if self.settings is None:
            return None
        return rc.ProxiesConfigured(options=self.settings.options, head_node=self.head)

    def configure(self, settings: ProxySettings, head: str) -> None:
        """From now on the core runs the proxies with ``settings`` (persisted for a restart; proxies that
        run already keep the limits stored for them: ``save_configured``)."""
        if self.settings is not None:
            settings = _stored(settings)
        self.settings, self.head = settings, head
        persist.save_proxies(settings, head)
        self.ledger.feed(rc.ProxiesConfigured(options=settings.options, head_node=head, now=self.ledger.now()))
        self._start_loop()

    async def set_grpc(self, servicer_functions: tuple[str, ...], grpc_port: int | None,
                       timeout: float = 60.0) -> None:
        """Serve the services of ``servicer_functions`` over gRPC on every proxy from now on, the
        applications untouched (``Controller.start_proxies``): the running proxies' gRPC servers learn
        them at once (one started on ``grpc_port`` where none ran; HTTP keeps serving), and proxies
        started later get them (the settings stored). Services only add: a set that leaves out one the
        proxies serve is refused (``rankcore.InvalidConfig``), as is a proxy that cannot import them
        (the settings are then as they were)."""
        s, head = self.settings, self.head
        if s is None or head is None:
            raise rc.InvalidConfig("no proxies run: start them first")
        running = s.grpc_servicer_functions
        left_out = [f for f in running if f not in servicer_functions]
        if left_out:
            raise rc.InvalidConfig(
                f"the proxies serve grpc_servicer_functions={list(running)}; {list(servicer_functions)} leaves out "
                f"{left_out}: services are only added to running proxies (name them all, with the new ones); "
                f"to serve fewer, `rankcore shutdown` (it deletes every application) and start again")
        wanted = tuple(dict.fromkeys((*running, *servicer_functions)))
        if wanted == running:
            return
        new = _stored(attrs.evolve(s, grpc_servicer_functions=wanted,
                                   grpc_port=s.grpc_port if s.grpc_port is not None else grpc_port))
        self.settings = new  # (from here a proxy that starts, or is starting, gets them: ``_start``)
        persist.save_proxies(new, head)
        ready = [p for p in self.live.values() if p.ready and not p.stopping and p.actor is not None]
        answers = await asyncio.gather(*(asyncio.wait_for(p.actor.set_grpc_services.remote(
            grpc_port_of(new, p.node_id == head), wanted), timeout) for p in ready), return_exceptions=True)
        refused = [(p, a) for p, a in zip(ready, answers)
                   if isinstance(a, BaseException) and not isinstance(a, ray.exceptions.RayActorError)]
        if refused:  # (a dead one is restarted by the core, with the new settings)
            if self.settings is new:
                self.settings = _stored(s)
                persist.save_proxies(self.settings, head)
            p, why = refused[0]
            raise rc.InvalidConfig(f"proxy {p.proxy_id} cannot serve grpc_servicer_functions={list(wanted)}: "
                                   f"{_why(why)}")
        log.info("the proxies serve gRPC services %s now", list(wanted))

    def _start_loop(self) -> None:
        if self._loop is None or self._loop.done():
            self._loop = asyncio.get_event_loop().create_task(self._health_loop())

    # ----------------------------------------------------------- commands
    def execute(self, cmd: object) -> None:
        if isinstance(cmd, rc.StartProxy):
            self.start(cmd)
        elif isinstance(cmd, rc.DrainProxy):
            p = self.live.get(cmd.proxy_id)
            if p is not None and p.actor is not None:
                p.draining = cmd.draining
                p.actor.set_draining.remote(cmd.draining)
        elif isinstance(cmd, rc.StopProxy):
            # a drained one (or one never needed) closes its server first; one given up on (unhealthy,
            # not ready, its node gone) is killed at once: its successor needs its name now
            self.stop(cmd.proxy_id, graceful=cmd.reason in ("drained", "not_needed"))

    def start(self, cmd: rc.StartProxy) -> None:
        s = self.settings
        if s is None:
            log.error("StartProxy %s without proxy settings (no ProxiesConfigured from this controller)", cmd.proxy_id)
            return
        s = self.settings = _stored(s)  # (the limits as start_ingress last set them on the running proxies)
        p = self.live[cmd.proxy_id] = _Live(cmd.proxy_id, cmd.node_id, proxy_actor_name(cmd.node_id, self.head))
        persist.save_proxy_number(_number(cmd.proxy_id) + 1)
        self.ledger.spawn(self._start(p, s))

    async def _start(self, p: _Live, s: ProxySettings) -> None:
        from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

        head = p.node_id == self.head
        port = s.port if head or s.worker_port is None else s.worker_port
        deadline = time.monotonic() + self.name_wait_s
        while True:
            try:
                p.actor = _remote(s.actor_class).options(
                    name=p.name, namespace=NAMESPACE, lifetime="detached", max_restarts=0, max_concurrency=16,
                    num_cpus=0, scheduling_strategy=NodeAffinitySchedulingStrategy(node_id=p.node_id, soft=False),
                ).remote(s.host, port, enable_access_log=s.enable_access_log, logs_dir=s.logs_dir, **s.limits(),
                         proxy_id=p.proxy_id, remember_port=head, is_head=head, grpc_port=grpc_port_of(s, head),
                         grpc_servicer_functions=s.grpc_servicer_functions, data_plane=s.data_plane)
                break
            except ValueError:  # the name is still its predecessor's (killed a moment ago)
                if self.live.get(p.proxy_id) is not p or p.stopping:
                    return  # (stopped meanwhile: nothing was made)
                if time.monotonic() > deadline:
                    self._died(p, "its actor name stayed taken")
                    return
                await asyncio.sleep(0.1)
        try:
            await p.actor.ready.remote()
            # gRPC services added while it started (``set_grpc``: it asks the proxies that are ready):
            # given to it before it counts as ready (no await between the last look and ``ready``)
            while (now := self.settings) is not None and now.grpc_servicer_functions != s.grpc_servicer_functions:
                await p.actor.set_grpc_services.remote(grpc_port_of(now, head), now.grpc_servicer_functions)
                s = now
        except Exception as exc:
            self.ledger.spawn(_stop(p.actor, 0.0))  # (a half-started proxy may hold its ports)
            if self.live.get(p.proxy_id) is p and not p.stopping:
                if head and getattr(exc, "actor_init_failed", False) and "InvalidConfig" in str(exc):
                    self.head_error = _why(exc)  # (its own refusal, its port in use: not a crash a retry mends)
                self._died(p, f"did not start: {getattr(exc, 'cause', None) or exc}")
            return
        if self.live.get(p.proxy_id) is not p or p.stopping:
            self.ledger.spawn(_stop(p.actor))  # (stopped while it started: made all the same, so killed)
            return
        p.ready = True
        if head:
            self.head_error = None
        self.ledger.spawn(self._watch(p))
        self.ledger.feed(rc.ProxyStarted(proxy_id=p.proxy_id, now=self.ledger.now()))

    async def _watch(self, p: _Live) -> None:
        """A call pending on the proxy: it fails the moment the proxy dies."""
        try:
            await p.actor.watch.remote()
        except Exception:
            pass
        if self.live.get(p.proxy_id) is p and not p.stopping:
            self._died(p, "its actor died")

    def _died(self, p: _Live, reason: str) -> None:
        self.live.pop(p.proxy_id, None)
        self.ledger.feed(rc.ProxyCrashed(proxy_id=p.proxy_id, reason=reason, now=self.ledger.now()))

    def stop(self, proxy_id: str, graceful: bool = True) -> None:
        p = self.live.pop(proxy_id, None)
        if p is not None:
            p.stopping = True
            if p.actor is not None:
                self.ledger.spawn(self._timed_stop(p, 10.0 if graceful else 0.0))

    async def _timed_stop(self, p: _Live, timeout: float) -> None:
        """``_stop``, its time told to ``on_stopped`` (Serve's ``serve_proxy_shutdown_duration_ms``)."""
        began = time.monotonic()
        await _stop(p.actor, timeout)
        if self.on_stopped is not None:
            self.on_stopped(p.node_id, (time.monotonic() - began) * 1000.0)

    async def stop_all(self, timeout: float = 10.0) -> None:
        """Every proxy this controller knows, and any left by an earlier one (``reset``)."""
        live = [p for p in self.live.values() if p.actor is not None]
        for p in self.live.values():
            p.stopping = True
        self.live.clear()
        self.settings = self.head = self.head_error = None
        others = []  # (an earlier controller's: not timed, their nodes unknown here)
        for name in proxy_names():
            try:
                actor = ray.get_actor(name, namespace=NAMESPACE)
            except ValueError:
                continue
            if all(actor._actor_id != p.actor._actor_id for p in live):
                others.append(actor)
        await asyncio.gather(*(self._timed_stop(p, timeout) for p in live), *(_stop(a, timeout) for a in others))
        deadline = time.monotonic() + timeout
        while proxy_names() and time.monotonic() < deadline:
            await asyncio.sleep(0.05)
        persist.forget_proxies()

    # ------------------------------------------------------------ health
    async def _health_loop(self) -> None:
        while True:
            await asyncio.sleep(min(self.drain_check_s, self.health_period_s))
            if self.ledger.halted:
                continue
            now = time.monotonic()
            for p in list(self.live.values()):
                every = self.drain_check_s if p.draining else self.health_period_s
                if p.ready and not p.stopping and now - p.checked >= every:
                    p.checked = now
                    self.ledger.spawn(self._check(p))

    async def _check(self, p: _Live) -> None:
        try:
            ongoing = await asyncio.wait_for(p.actor.check_health.remote(), self.health_timeout_s)
            healthy = True
        except asyncio.TimeoutError:
            ongoing, healthy = 0, False
        except ray.exceptions.RayActorError:
            if self.live.get(p.proxy_id) is p and not p.stopping:
                self._died(p, "its actor died")
            return
        except Exception as exc:  # (its check raised: not serving)
            log.warning("proxy %s health check: %r", p.proxy_id, exc)
            ongoing, healthy = 0, False
        if self.live.get(p.proxy_id) is p and not p.stopping:
            self.ledger.feed(rc.ProxyHealthChecked(proxy_id=p.proxy_id, healthy=healthy, ongoing=int(ongoing),
                                                   now=self.ledger.now()))

    # ------------------------------------------------------------ status
    async def status(self) -> dict:
        """proxy id -> its node, actor name, phase (the core's) and address."""
        book = self.ledger.driver.state.proxies
        out = {}
        for node, q in sorted(book.proxies.items()):
            p = self.live.get(q.proxy_id)
            address = grpc_address = None
            if p is not None and p.ready:
                try:
                    address = list(await asyncio.wait_for(p.actor.ready.remote(), 5.0))
                    got = await asyncio.wait_for(p.actor.grpc_address.remote(), 5.0)
                    grpc_address = list(got) if got else None
                except Exception:
                    address = None
            out[q.proxy_id] = {"node_id": node, "actor_name": p.name if p is not None else None,
                               "phase": q.phase.value, "address": address, "grpc_address": grpc_address,
                               "head": node == self.head}
        return out

    # ----------------------------------------------------------- recovery
    async def recovered(self) -> dict[str, Any]:
        """A restarted controller's ``ControllerRecovered`` proxy fields: the settings persisted,
        the proxy actors alive (each asked who it is), the next proxy number."""
        saved = persist.load_proxies()
        if saved is None:
            return {}
        self.settings, self.head = saved
        numbers, ids = [-1], []
        for name in proxy_names():
            try:
                actor = ray.get_actor(name, namespace=NAMESPACE)
                pid, node = await asyncio.wait_for(actor.identity.remote(), 10.0)
            except Exception:
                continue
            p = self.live[pid] = _Live(pid, node, name)
            p.actor, p.ready = actor, True
            self.ledger.spawn(self._watch(p))
            ids.append(pid)
            numbers.append(_number(pid))
        self._start_loop()
        return {"proxies": self.configured(), "proxy_ids": tuple(sorted(ids)),
                "next_proxy_number": max(max(numbers) + 1, persist.load_proxy_number())}


def _number(pid: str) -> int:
    """The incarnation number of a proxy id the core made (``rankcore.query.parse_proxy_id``)."""
    parsed = rc.query.parse_proxy_id(pid)
    return -1 if parsed is None else parsed[1]


_REMOTE: dict[Any, Any] = {}


def _remote(cls: Any) -> Any:
    """``cls`` as a Ray actor class (made once), its ``watch`` in a concurrency group of its own: a
    threaded actor's pending ``watch`` must leave the other calls' threads free."""
    made = _REMOTE.get(cls)
    if made is None:
        made = _REMOTE[cls] = ray.remote(concurrency_groups={"watch": 1})(cls)  # type: ignore[call-overload]
    return made


def proxy_names() -> list[str]:
    """The proxy actors alive in rankcore's namespace, by name."""
    try:
        named = ray.util.list_named_actors(all_namespaces=True)
    except Exception:
        return []
    return sorted(a["name"] for a in named if a.get("namespace") == NAMESPACE
                  and (a["name"] == INGRESS_NAME or a["name"].startswith(INGRESS_NAME + ":")))


async def _stop(actor: Any, timeout: float = 10.0) -> None:
    """Close its server (its port is free again), then kill it (``timeout`` 0: kill it at once)."""
    if timeout > 0:
        try:
            await asyncio.wait_for(actor.stop.remote(), timeout)
        except Exception:  # (dead, or not answering: killed all the same)
            pass
    try:
        ray.kill(actor, no_restart=True)
    except Exception:
        pass
