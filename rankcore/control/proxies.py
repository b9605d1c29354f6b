"""Proxies, one a node, decided here (issue 38; Ray Serve's ``ProxyStateManager``).

Where proxies run is ``wanted``: with ``ProxyLocation.EveryNode`` (Serve's default and
ours) the head node and every node the core has booked a replica on, less the nodes
being drained (``NodeDraining``); ``HeadOnly`` the head node; ``Disabled`` none. Serve
counts a node once a replica there has an actor; the core counts it from the booking
(``Node.tenants``), so the proxy starts while the replica is placed, not after.

The end-of-step pass ``reconcile`` makes the proxies match: a wanted node without one
gets ``StartProxy``; a proxy on a node no longer wanted drains (``DrainProxy``:
``/-/healthz`` answers 503, in-flight requests finish) and is stopped once its drain
has lasted ``min_draining_period_s`` *and* it reports nothing in flight
(``ProxyHealthChecked.ongoing``: a drain never cuts a request); a draining proxy whose
node is wanted again serves again. A proxy on a lost node is forgotten
(``StopProxy(reason="node_lost")``, for the executor's books).

Failures, each in one function: a proxy that dies (``died``), fails
``health_check_unhealthy_threshold`` health checks in a row (``health_checked``) or is
not ready in time (``ready_timeout_s``: Serve's ready checks, each ``ready_check_timeout_s`` x
(its restarts + 1), ``health_check_unhealthy_threshold`` of them; ``reconcile``) is started again, after the restart backoff a replica's failed
starts wait (``rankcore.placement.restarts``): at once the first time, then 1, 2, 4 ...
64 s while it never becomes ready.

Internal module: import its public names from ``rankcore`` (docs/embedding.md,
"What you may import").
"""

from __future__ import annotations

import math

from ..base.commands import DrainProxy, StartProxy, StopProxy
from ..base.errors import InvalidEvent, InvariantViolation, assert_never
from ..base.events import NodeDraining, ProxiesConfigured, ProxyCrashed, ProxyHealthChecked, ProxyStarted
from ..base.fields import shown
from ..base.proxybook import Proxy, ProxyBook, ProxyLocation, ProxyOptions, ProxyPhase, proxy_id
from ..base.records import unchecked_copy
from ..base.transaction import Tx
from ..placement.restarts import doubling

__all__ = ["wanted", "adopt", "configure", "started", "died", "health_checked", "node_draining", "reconcile",
           "backoff_s", "ready_timeout_s", "parse_proxy_id", "serving"]

_copy = unchecked_copy
_INF = math.inf
_STARTING, _HEALTHY, _DRAINING, _BACKOFF = ProxyPhase.STARTING, ProxyPhase.HEALTHY, ProxyPhase.DRAINING, \
    ProxyPhase.BACKOFF


def wanted(book: ProxyBook, nodes: object) -> frozenset[str]:
    """The nodes that should run a proxy now (``nodes``: the cluster's live nodes)."""
    o = book.options
    if o is None:
        return frozenset()
    head = {book.head} if book.head is not None and book.head in nodes else set()  # type: ignore[operator]
    location = o.proxy_location
    match location:
        case ProxyLocation.Disabled:
            return frozenset()
        case ProxyLocation.HeadOnly:
            return frozenset(head)
        case ProxyLocation.EveryNode:
            busy = {n for n, node in nodes.items() if node.tenants > 0 and n not in book.draining}  # type: ignore[attr-defined]
            return frozenset(busy | head)
        case _:
            assert_never(location)  # (ProxyOptions takes only PROXY_LOCATIONS)


def serving(book: ProxyBook) -> tuple[str, ...]:
    """The proxies that serve now (healthy: an outside load balancer sends them traffic), by node."""
    return tuple(p.proxy_id for _, p in sorted(book.proxies.items()) if p.phase is _HEALTHY)


def backoff_s(o: ProxyOptions, restarts: int) -> float:
    """How long a proxy's restart waits after ``restarts`` deaths in a row before it was ever
    ready: the replicas' rule (``restarts.backoff_s``), on the proxies' own options."""
    return 0.0 if restarts <= 1 else doubling(restarts, o.restart_backoff_s, o.restart_backoff_max_s)


def ready_timeout_s(o: ProxyOptions, restarts: int) -> float:
    """How long a proxy may take to be ready: Serve's ready check, ``ready_check_timeout_s`` x
    (its restarts + 1) a try, failing ``health_check_unhealthy_threshold`` times before the proxy
    is given up (5 x 3 = 15 s, then 30 s, 45 s ... after restarts)."""
    return o.ready_check_timeout_s * (restarts + 1) * o.health_check_unhealthy_threshold


def parse_proxy_id(pid: str) -> tuple[str, int] | None:
    """(node id, number) of a proxy id the core makes (``proxy:<node>#<n>``); None otherwise."""
    if not pid.startswith("proxy:"):
        return None
    node, sep, n = pid[6:].rpartition("#")
    if not sep or not node or not n.isdigit() or (len(n) > 1 and n[0] == "0"):
        return None
    return node, int(n)


def _options(book: ProxyBook) -> ProxyOptions:
    if book.options is None:
        raise InvariantViolation("a proxy rule ran while the core runs no proxies")
    return book.options


def _now(tx: Tx) -> tuple[float, bool]:
    cl = tx.view
    return cl.now, cl.clock


def _put(tx: Tx, p: Proxy | None, node_id: str) -> None:
    book = tx.proxies
    proxies = book.proxies.delete(node_id) if p is None else book.proxies.set(node_id, p)
    tx.proxies = _copy(book, proxies=proxies)


def _current(tx: Tx, pid: str, what: str) -> Proxy | None:
    """The proxy ``pid`` names if it is the current one on its node; None for news of an
    older incarnation or one already gone (stale); ``InvalidEvent`` for an id the core never made."""
    book = tx.proxies
    parsed = parse_proxy_id(pid)
    if parsed is None or parsed[1] >= book.started:
        raise InvalidEvent(f"{what}: unknown proxy {shown(pid)}: the core never started it "
                           f"(ids are proxy:<node>#<n>, from StartProxy)")
    p = book.proxies.get(parsed[0])
    return p if p is not None and p.proxy_id == pid else None


def _start(tx: Tx, node_id: str, restarts: int) -> Proxy:
    """A new incarnation on ``node_id``: StartProxy, and its ready deadline when there is a clock."""
    book = tx.proxies
    pid = proxy_id(node_id, book.started)
    tx.proxies = _copy(book, started=book.started + 1)
    now, clock = _now(tx)
    o = _options(book)
    tx.emit(StartProxy(proxy_id=pid, node_id=node_id))
    return Proxy(proxy_id=pid, node_id=node_id, phase=_STARTING, restarts=restarts,
                 deadline=now + ready_timeout_s(o, restarts) if clock else _INF)


def _restart(tx: Tx, p: Proxy) -> Proxy:
    """``p`` is gone (died, stopped as unhealthy or not ready in time): its next
    incarnation waits out the backoff (``reconcile`` starts it, or forgets it when
    its node needs none any more)."""
    o = _options(tx.proxies)
    restarts = p.restarts + 1
    now, clock = _now(tx)
    wait = backoff_s(o, restarts)
    return Proxy(proxy_id=p.proxy_id, node_id=p.node_id, phase=_BACKOFF, restarts=restarts,
                 deadline=now + wait if clock else now)  # (no clock: no backoff to measure)


# ------------------------------------------------------------------ events
def configure(tx: Tx, e: ProxiesConfigured) -> bool:
    """Proxies run where ``e.options`` says from now on; False when nothing changed (stale)."""
    o = e.options
    if o.proxy_location is ProxyLocation.HeadOnly and e.head_node is None:
        raise InvalidEvent("ProxiesConfigured: proxy_location=HeadOnly needs head_node (the node the "
                           "controller runs on)")
    book = tx.proxies
    if book.options == o and book.head == e.head_node:
        return False
    tx.proxies = _copy(book, options=o, head=e.head_node)
    return True


def started(tx: Tx, e: ProxyStarted) -> bool:
    """A proxy passed its ready check: it serves (its restarts in a row are over)."""
    p = _current(tx, e.proxy_id, "ProxyStarted")
    if p is None or p.phase is not _STARTING:
        return False  # (an older incarnation, or told twice)
    _put(tx, _copy(p, phase=_HEALTHY, deadline=_INF, restarts=0, failures=0), p.node_id)
    return True


def died(tx: Tx, e: ProxyCrashed) -> bool:
    """A proxy died: started again after the backoff while its node wants one."""
    p = _current(tx, e.proxy_id, "ProxyCrashed")
    if p is None or p.phase is _BACKOFF:
        return False
    _put(tx, _restart(tx, p), p.node_id)
    return True


def health_checked(tx: Tx, e: ProxyHealthChecked) -> bool:
    """Failures in a row make a proxy unhealthy (stopped, started again); a draining one
    reporting nothing in flight once its drain may end is stopped."""
    p = _current(tx, e.proxy_id, "ProxyHealthChecked")
    if p is None or p.phase is _BACKOFF:
        return False
    o = _options(tx.proxies)
    failures = 0 if e.healthy else p.failures + 1
    if failures >= o.health_check_unhealthy_threshold:
        tx.emit(StopProxy(proxy_id=p.proxy_id, node_id=p.node_id, reason="unhealthy"))
        _put(tx, _restart(tx, p), p.node_id)
        return True
    if p.phase is _DRAINING and p.deadline == _INF and e.healthy and e.ongoing == 0:  # (a failed check says nothing)
        tx.emit(StopProxy(proxy_id=p.proxy_id, node_id=p.node_id, reason="drained"))
        _put(tx, None, p.node_id)
        return True
    ongoing = e.ongoing if p.phase is _DRAINING else None
    if failures != p.failures or ongoing != p.ongoing:
        _put(tx, _copy(p, failures=failures, ongoing=ongoing), p.node_id)
        return True
    return False


def node_draining(tx: Tx, e: NodeDraining) -> bool:
    """The cluster drains ``e.node_id``: its proxy drains (``reconcile``)."""
    book = tx.proxies
    if e.node_id not in tx.view.nodes or e.node_id in book.draining:
        return False
    tx.proxies = _copy(book, draining=book.draining | {e.node_id})
    return True


def adopt(tx: Tx, config: ProxiesConfigured | None, ids: tuple[str, ...], next_number: int) -> None:
    """A recovery (``ControllerRecovered``): the proxies alive are the core's again, each told
    whether it serves (``DrainProxy(draining=False)``) or drains (a drain begun afresh): whether
    it was draining is not known; a second one on a node, or one on a node the event does not
    list, is stopped."""
    if config is None:
        if ids:
            raise InvalidEvent(f"ControllerRecovered.proxy_ids names live proxies {', '.join(map(shown, ids[:3]))} "
                               f"but its proxies is None: no proxies config (pass the last ProxiesConfigured "
                               f"as proxies=)")
        return
    configure(tx, config)
    numbers = [next_number - 1]
    found: dict[str, list[tuple[int, str]]] = {}
    for pid in ids:
        parsed = parse_proxy_id(pid)
        if parsed is None:
            raise InvalidEvent(f"ControllerRecovered.proxy_ids: {shown(pid)} is not a proxy id the core makes "
                               f"(proxy:<node>#<n>)")
        numbers.append(parsed[1])
        found.setdefault(parsed[0], []).append((parsed[1], pid))
    tx.proxies = _copy(tx.proxies, started=max(numbers) + 1)
    nodes = tx.view.nodes
    want = wanted(tx.proxies, nodes)
    o = _options(tx.proxies)
    now, clock = _now(tx)
    for node_id in sorted(found):
        older, (_, keep) = sorted(found[node_id])[:-1], sorted(found[node_id])[-1]
        for _, pid in older:
            tx.emit(StopProxy(proxy_id=pid, node_id=node_id, reason="not_needed"))
        if node_id not in nodes:
            tx.emit(StopProxy(proxy_id=keep, node_id=node_id, reason="node_lost"))
            continue
        # whether it was draining is not known: it is told which it is now (a drain starts afresh)
        serving = node_id in want
        tx.emit(DrainProxy(proxy_id=keep, node_id=node_id, draining=not serving))
        end = now + o.min_draining_period_s if clock and o.min_draining_period_s > 0 else _INF
        _put(tx, Proxy(proxy_id=keep, node_id=node_id, phase=_HEALTHY) if serving else
             Proxy(proxy_id=keep, node_id=node_id, phase=_DRAINING, deadline=end), node_id)


# ------------------------------------------------------------- the pass
def reconcile(tx: Tx) -> None:
    """The end-of-step pass: make the proxies match ``wanted``, and act on the deadlines
    due. Skipped unless the core runs proxies and the step changed the proxies, the nodes,
    or reached a proxy's deadline (O(nodes) when it runs: never on the fast paths' steps)."""
    book = tx.proxies
    if book.options is None:
        return
    cl = tx.view
    nodes = cl.nodes
    if not (book is not tx.initial_proxies or nodes is not tx.cluster.nodes or cl.now >= cl.proxies_at):
        return
    now, clock = cl.now, cl.clock
    if book.draining and any(n not in nodes for n in book.draining):
        tx.proxies = book = _copy(book, draining=frozenset(n for n in book.draining if n in nodes))
    want = wanted(book, nodes)
    o = _options(book)
    for node_id in sorted(book.proxies.keys()):
        p = tx.proxies.proxies[node_id]
        if node_id not in nodes:  # its node is gone, and the proxy with it
            if p.phase is not _BACKOFF:
                tx.emit(StopProxy(proxy_id=p.proxy_id, node_id=node_id, reason="node_lost"))
            _put(tx, None, node_id)
            continue
        due = clock and now >= p.deadline
        if node_id not in want:
            phase: ProxyPhase = p.phase
            match phase:
                case ProxyPhase.BACKOFF:
                    _put(tx, None, node_id)  # (nothing runs: nothing to stop)
                case ProxyPhase.STARTING:
                    tx.emit(StopProxy(proxy_id=p.proxy_id, node_id=node_id, reason="not_needed"))  # never served
                    _put(tx, None, node_id)
                case ProxyPhase.HEALTHY:
                    tx.emit(DrainProxy(proxy_id=p.proxy_id, node_id=node_id, draining=True))
                    end = now + o.min_draining_period_s if clock and o.min_draining_period_s > 0 else _INF
                    _put(tx, _copy(p, phase=_DRAINING, deadline=end, ongoing=None), node_id)
                case ProxyPhase.DRAINING:
                    if due:  # its drain may end now: at the next report of nothing in flight
                        _put(tx, _copy(p, deadline=_INF, ongoing=None), node_id)
                case _:
                    assert_never(phase)
            continue
        if p.phase is _STARTING and due:  # not ready in time: stopped, started again after the backoff
            tx.emit(StopProxy(proxy_id=p.proxy_id, node_id=node_id, reason="ready_timeout"))
            p = _restart(tx, p)
            _put(tx, p, node_id)
        if p.phase is _DRAINING:  # wanted again: it serves again
            tx.emit(DrainProxy(proxy_id=p.proxy_id, node_id=node_id, draining=False))
            _put(tx, _copy(p, phase=_HEALTHY, deadline=_INF, ongoing=None), node_id)
        elif p.phase is _BACKOFF and p.deadline <= now:
            _put(tx, _start(tx, node_id, p.restarts), node_id)
    for node_id in sorted(want - set(tx.proxies.proxies.keys())):
        _put(tx, _start(tx, node_id, 0), node_id)
    _deadlines(tx)


def _deadlines(tx: Tx) -> None:
    """Keep the proxies' earliest deadline (``Cluster.proxies_at``, which ``clock_work_due`` reads)
    and ask for a Tick then."""
    nxt = min((p.deadline for p in tx.proxies.proxies.values()), default=_INF)
    if tx.view.proxies_at != nxt:
        cl = tx.cl
        cl.proxies_at, cl.changed = nxt, True
        if nxt != _INF and cl.clock:
            tx.tick_at(nxt)
