"""What the compiled data plane in front of the replicas holds: the core's decisions as a table (issue 65).

With direct ingress each replica serves HTTP itself and a compiled load balancer (HAProxy) routes
to it, so a request never passes through a Python proxy. The balancer decides nothing: what it
holds is computed here from the facts the executor has (the pool the control plane announced,
each replica's own server address, the deployment's limits) and changed through its runtime API.
The rules, one function each:

* ``route``: a serving replica whose address is known is a server **ready** for new requests; a
  draining one stays as a server in **drain** (it finishes what it holds, gets nothing new) until it
  leaves the pool; one whose address is not known yet is left out. Each server takes at most
  ``max_ongoing_requests`` at once (HAProxy's ``maxconn``); more wait in the balancer's queue, at
  most ``max_queued_requests`` of them (-1: no limit), each at most ``queue_timeout_s``; past either
  the answer is 503, the request never sent. A route is **direct** while one of its servers is
  ready, its class is not an ASGI app (which only the proxy relays) and its deployment has no router
  (``request_router``: the balancer balances by connections, and runs no router); else its requests go through
  the proxy (``Route.direct``), whose router queues them for a replica still coming or answers 503
  when none is. So do requests that need the proxy's router whatever the route: those naming a
  multiplexed model (its replica is chosen by the models it holds) and those asking for progress.
* ``changes``: what turns one table into another, as runtime commands where the balancer can take
  them without a restart (a server added, removed, set ready or drain, its ``maxconn``; a queue
  limit), and a ``Reload`` (a new process taking the listening sockets over, dropping no
  connection) only when the routes themselves changed. ``apply`` is what each command does to a
  table: ``apply(old, changes(old, new)) == new`` (tests/property/test_dataplane.py).

gRPC (when the balancer has a gRPC front): each replica may serve its deployment's gRPC services
itself too, at a second address (``Server.grpc_address``); a route's gRPC calls go straight to the
servers that have one, under the same rules (ready or drain, ``maxconn``, the queue), chosen by the
call's ``application`` metadata; the rest (an unknown application, a multiplexed model, the API and
health services) go through the proxy's gRPC server.

Retries: the balancer re-sends a request to another server only when it cannot have run: its connect
failed, so nothing was sent (``RETRY_ON``). One whose server's connection broke after it was sent
fails (500 ``replica_died``): that server may have begun it. A gRPC call is re-sent too when its
server ended with nothing sent back (``GRPC_RETRY_ON``): a replica's gRPC server sends the call's
initial metadata once the call holds a slot, before the user's method, so a call that got none
never began there (HTTP/1.1 has no such marker the balancer heeds: an interim 100 is not one).

A failed connect is a fact the balancer acts on at once, before the pool says the replica is gone
(as a router leaves out a replica a call saw die): the server is out of the balancing until a
connect to it succeeds again (``EJECT_AFTER``, ``EJECT_CHECK_S``). Without it, least-connections balancing picks a dead
server first (it holds no connection) for every request and every retry of one, and each fails.

A proxy that died leaves its balancer serving the table it held; the next proxy on the node adopts
it (its listening sockets). ``takes_over``: the new proxy's own balancer replaces it once the new
table is whole, every serving replica's address known (else its requests would go through the proxy
meanwhile), after ``TAKE_OVER_WAIT_S`` whatever it holds, or at once when the adopted one has gone.

Internal module: the Ray executor's ingress (``executors/ray_gpu/ingress/haproxy.py``) uses it.
"""

from __future__ import annotations

import re
import zlib
from collections.abc import Iterable, Mapping
from typing import Any

import attrs

from ..base.errors import InvalidConfig

__all__ = ["DATA_PLANES", "RETRY_ON", "GRPC_RETRY_ON", "EJECT_AFTER", "EJECT_CHECK_S", "Server", "Route", "Table", "AddServer", "SetServer", "RemoveServer", "SetQueue",
           "Reload", "server_name", "route", "table", "changes", "apply", "TAKE_OVER_WAIT_S", "takes_over"]

#: what may carry a deployment's HTTP requests (an executor's option, declared here once): "proxy", a
#: proxy process and its request machine; "direct", a compiled balancer straight to the replicas
DATA_PLANES = ("proxy", "direct")
#: when the balancer re-sends a request to another server: only when no connection was made (nothing
#: was sent, so the request cannot have run); HAProxy's ``retry-on`` words
RETRY_ON = "conn-failure"
#: when the balancer re-sends a gRPC call to another server: as ``RETRY_ON``, and when the server's
#: connection ended with nothing of the call's answer received (no initial metadata: the call never
#: began there, module docstring)
GRPC_RETRY_ON = "conn-failure empty-response"
#: when the balancer takes a server out before the table does, and how it finds it back: out at its
#: ``EJECT_AFTER``-th failed connect in a row, back once a connect (tried every ``EJECT_CHECK_S``) succeeds
EJECT_AFTER = 1
EJECT_CHECK_S = 1.0
#: how long a proxy that adopted a dead proxy's balancer waits for its own table to be whole before its
#: own balancer takes over whatever it holds (the adopted one serves meanwhile: ``takes_over``)
TAKE_OVER_WAIT_S = 10.0


def takes_over(pending: int, waited_s: float, adopted_serving: bool = True) -> bool:
    """Whether a proxy's first balancer replaces the one it adopted now: once no serving replica's
    address is still awaited (``pending``: its table whole), ``TAKE_OVER_WAIT_S`` after it began
    waiting (``waited_s``), or at once when the adopted one no longer serves (it died, or its grace
    ran out: nobody would accept the connections meanwhile)."""
    return pending <= 0 or waited_s >= TAKE_OVER_WAIT_S or not adopted_serving


#: a server address: ``host:port``, the host a name or an IPv4 address
_ADDRESS = re.compile(r"^[A-Za-z0-9.\-]+:[0-9]{1,5}$")
_UNSAFE = re.compile(r"[^A-Za-z0-9_]")


def server_name(replica_id: str) -> str:
    """The balancer's name for ``replica_id``'s server: its id with anything but letters, digits and
    ``_`` made ``_`` (HAProxy's variable names take no more), and a checksum of the id, so two ids
    never share a name."""
    return f"{_UNSAFE.sub('_', replica_id)[:48]}_{zlib.crc32(replica_id.encode()):08x}"


def _check_address(inst: Any, attribute: attrs.Attribute, value: Any) -> None:
    if not isinstance(value, str) or not _ADDRESS.match(value) or not 0 < int(value.rpartition(":")[2]) < 65536:
        raise InvalidConfig(f"{type(inst).__name__}.{attribute.name} must be 'host:port', got {value!r}")


def _check_grpc_address(inst: Any, attribute: attrs.Attribute, value: Any) -> None:
    if value is not None:
        _check_address(inst, attribute, value)


def _positive(inst: Any, attribute: attrs.Attribute, value: Any) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise InvalidConfig(f"{type(inst).__name__}.{attribute.name} must be an int >= 1, got {value!r}")


def _queue_limit(inst: Any, attribute: attrs.Attribute, value: Any) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or value < -1:
        raise InvalidConfig(f"{type(inst).__name__}.{attribute.name} must be an int >= -1 (-1: no limit), "
                            f"got {value!r}")


def _timeout(inst: Any, attribute: attrs.Attribute, value: Any) -> None:
    if value is not None and (isinstance(value, bool) or not isinstance(value, (int, float)) or not value > 0
                              or value == float("inf")):
        raise InvalidConfig(f"{type(inst).__name__}.{attribute.name} must be a number > 0 or None, got {value!r}")


def _prefix(inst: Any, attribute: attrs.Attribute, value: Any) -> None:
    if not isinstance(value, str) or not value.startswith("/") or (len(value) > 1 and value.endswith("/")) \
            or any(c.isspace() or c in "#?%\\\"'" for c in value):
        raise InvalidConfig(f"{type(inst).__name__}.{attribute.name} must be a path such as '/echo', got {value!r}")


@attrs.frozen(kw_only=True)
class Server:
    """One replica's server in a route: its HTTP ``address`` and, when it serves gRPC itself, its
    ``grpc_address``; ``ready`` (False: draining) and its ``maxconn``."""

    replica_id: str = attrs.field(validator=attrs.validators.instance_of(str))
    address: str = attrs.field(validator=_check_address)
    ready: bool = attrs.field(validator=attrs.validators.instance_of(bool))
    maxconn: int = attrs.field(validator=_positive)
    grpc_address: str | None = attrs.field(default=None, validator=_check_grpc_address)

    @property
    def name(self) -> str:
        return server_name(self.replica_id)


def _by_replica(servers: Iterable[Server]) -> tuple[Server, ...]:
    return tuple(sorted(servers, key=lambda s: s.replica_id))


@attrs.frozen(kw_only=True)
class Route:
    """A deployment's route: its ``prefix``, its servers (by replica id) and its queue's limits."""

    deployment: str = attrs.field(validator=attrs.validators.instance_of(str))
    prefix: str = attrs.field(validator=_prefix)
    servers: tuple[Server, ...] = attrs.field(converter=_by_replica)
    max_queued: int = attrs.field(validator=_queue_limit)
    queue_timeout_s: float | None = attrs.field(validator=_timeout)
    #: the application it belongs to (what its requests' context says)
    app_name: str = attrs.field(default="", validator=attrs.validators.instance_of(str))
    #: its class takes ASGI requests (any path, any method), which only the proxy relays
    asgi: bool = attrs.field(default=False, validator=attrs.validators.instance_of(bool))
    #: its deployment has a router (``request_router``), which the balancer cannot run: the proxy relays
    routed: bool = attrs.field(default=False, validator=attrs.validators.instance_of(bool))

    def __attrs_post_init__(self) -> None:
        ids = [s.replica_id for s in self.servers]
        if len(set(ids)) != len(ids):
            twice = sorted({i for i in ids if ids.count(i) > 1})
            raise InvalidConfig(f"Route.servers: replica {twice[0]!r} is there twice")

    @property
    def direct(self) -> bool:
        """Whether its requests go straight to its replicas (not an ASGI app, no router of its own, and
        one is ready); else through the proxy."""
        return not self.asgi and not self.routed and any(s.ready for s in self.servers)

    @property
    def backend(self) -> str:
        """The balancer's name for this route's servers."""
        return f"d_{server_name(self.deployment)}"

    @property
    def grpc_backend(self) -> str:
        """The balancer's name for this route's servers' gRPC addresses."""
        return f"g_{server_name(self.deployment)}"

    def shape(self) -> tuple[str, str, float | None, str, bool, bool]:
        """What only a reload changes: the deployment, its prefix, its queue's timeout, its application,
        whether it is an ASGI app, whether it has a router."""
        return (self.deployment, self.prefix, self.queue_timeout_s, self.app_name, self.asgi, self.routed)


def _longest_first(routes: Iterable[Route]) -> tuple[Route, ...]:
    return tuple(sorted(routes, key=lambda r: (-len(r.prefix), r.prefix)))


@attrs.frozen(kw_only=True)
class Table:
    """Every route the data plane holds, longest prefix first (the first that matches a path wins)."""

    routes: tuple[Route, ...] = attrs.field(converter=_longest_first)

    def __attrs_post_init__(self) -> None:
        for attr, what in (("prefix", "prefix"), ("deployment", "deployment")):
            seen = [getattr(r, attr) for r in self.routes]
            twice = sorted({v for v in seen if seen.count(v) > 1})
            if twice:
                raise InvalidConfig(f"Table.routes: two routes share the {what} {twice[0]!r}")

    def of(self, deployment: str) -> Route | None:
        return next((r for r in self.routes if r.deployment == deployment), None)


def route(deployment: str, prefix: str, serving: Iterable[str], draining: Iterable[str],
          addresses: Mapping[str, str], max_ongoing_requests: int, max_queued_requests: int,
          queue_timeout_s: float | None, app_name: str = "", asgi: bool = False,
          grpc_addresses: Mapping[str, str] | None = None, routed: bool = False) -> Route:
    """``deployment``'s route (module docstring): its serving replicas ready, its draining ones in drain,
    those without a known address left out; each with its gRPC address where ``grpc_addresses`` has one."""
    serving, draining = tuple(dict.fromkeys(serving)), tuple(dict.fromkeys(draining))
    grpc = grpc_addresses or {}
    servers = [Server(replica_id=rid, address=addresses[rid], ready=True, maxconn=max_ongoing_requests,
                      grpc_address=grpc.get(rid)) for rid in serving if rid in addresses]
    servers += [Server(replica_id=rid, address=addresses[rid], ready=False, maxconn=max_ongoing_requests,
                       grpc_address=grpc.get(rid)) for rid in draining if rid in addresses and rid not in serving]
    return Route(deployment=deployment, prefix=prefix, servers=servers, max_queued=max_queued_requests,
                 queue_timeout_s=queue_timeout_s, app_name=app_name, asgi=asgi, routed=routed)


def table(routes: Iterable[Route]) -> Table:
    return Table(routes=tuple(routes))


@attrs.frozen(kw_only=True)
class AddServer:
    """A replica's server joins its route (its address became known, or changed: its gRPC one too)."""

    deployment: str
    server: Server


@attrs.frozen(kw_only=True)
class SetServer:
    """A server's state (ready or drain) or ``maxconn`` changed; its addresses did not."""

    deployment: str
    server: Server


@attrs.frozen(kw_only=True)
class RemoveServer:
    """A replica left the pool (or its address changed): its server goes, after what it held ended."""

    deployment: str
    replica_id: str


@attrs.frozen(kw_only=True)
class SetQueue:
    """A route's ``max_queued_requests`` changed (-1: no limit)."""

    deployment: str
    max_queued: int


@attrs.frozen(kw_only=True)
class Reload:
    """The routes changed (one added or removed, a prefix or a queue timeout): a new configuration."""

    table: Table


Change = AddServer | SetServer | RemoveServer | SetQueue | Reload


def changes(old: Table | None, new: Table) -> tuple[Change, ...]:
    """The commands that turn ``old`` (None: nothing running yet) into ``new`` (module docstring):
    a ``Reload`` alone when the routes' shapes differ, else runtime commands, removals first (a
    replica's address may be taken by its successor)."""
    if old is None or [r.shape() for r in old.routes] != [r.shape() for r in new.routes]:
        return (Reload(table=new),)
    out: list[Change] = []
    for was, now in zip(old.routes, new.routes):
        before = {s.replica_id: s for s in was.servers}
        after = {s.replica_id: s for s in now.servers}
        out += [RemoveServer(deployment=now.deployment, replica_id=rid) for rid in before
                if rid not in after or _where(after[rid]) != _where(before[rid])]
        for rid, s in after.items():
            b = before.get(rid)
            if b is None or _where(b) != _where(s):
                out.append(AddServer(deployment=now.deployment, server=s))
            elif b != s:
                out.append(SetServer(deployment=now.deployment, server=s))
        if was.max_queued != now.max_queued:
            out.append(SetQueue(deployment=now.deployment, max_queued=now.max_queued))
    return tuple(out)


def _where(s: Server) -> tuple[str, str | None]:
    """What only a new server changes: its addresses."""
    return (s.address, s.grpc_address)


def apply(old: Table | None, commands: Iterable[Change]) -> Table:
    """``old`` with ``commands`` carried out, as the balancer does them."""
    current = old if old is not None else Table(routes=())
    for cmd in commands:
        if isinstance(cmd, Reload):
            current = cmd.table
            continue
        r = current.of(cmd.deployment)
        if r is None:
            raise InvalidConfig(f"{type(cmd).__name__}: no route for deployment {cmd.deployment!r}")
        servers = {s.replica_id: s for s in r.servers}
        if isinstance(cmd, RemoveServer):
            servers.pop(cmd.replica_id, None)
        elif isinstance(cmd, (AddServer, SetServer)):
            servers[cmd.server.replica_id] = cmd.server
        if isinstance(cmd, SetQueue):
            r = attrs.evolve(r, max_queued=cmd.max_queued)
        r = attrs.evolve(r, servers=tuple(servers.values()))
        current = Table(routes=tuple(r if x.deployment == cmd.deployment else x for x in current.routes))
    return current
