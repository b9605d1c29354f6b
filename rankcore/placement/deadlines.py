"""The deadline book: when an answer is owed by, armed where the command goes out.

Two commands owe an answer on the core's clock: ``InitializeReplica`` owes
``ReplicaReady`` within the deployment's ``start_timeout_s``, a ``PlaceReplica``
on a node the core chose owes ``ReplicaPlaced`` within ``placement_timeout_s``
(a caller's group has no other node to try: no deadline). A restart backoff
(``rankcore.placement.restarts``) keeps its end in the same book. Each deadline is armed
by the move that emits its command (``start``, ``placement``), taken off by the
answer (``answered``) or when its replica goes (``books.release``), and
what happens when one comes due is a rule of time (``rankcore.control.clock``).

The ``ScheduleTick`` for each deadline armed in a step is emitted by the
end-of-step pass ``ticks`` (``rankcore.control.passes``), once per distinct time the
step has not asked for already, in time order. The pure ``with_deadline`` / ``disarm`` are what the fast paths
call (``rankcore.fastpaths``): one copy of the arithmetic.

Internal module: import its public names from ``rankcore`` (docs/embedding.md,
"What you may import").
"""

from __future__ import annotations

import math

import immutables

from ..base.cluster import Cluster
from ..base.clustertx import ClusterTx
from ..base.state import Deployment
from ..base.transaction import Tx

__all__ = ["start_timeout", "placement_timeout", "with_deadline", "disarm", "arm", "start", "placement",
           "answered", "expired", "ticks"]

_INF = math.inf


def start_timeout(dep: Deployment) -> float | None:
    """How long an ``InitializeReplica`` of ``dep`` may go unanswered (None: forever)."""
    return dep.config.start.start_timeout_s


def placement_timeout(dep: Deployment) -> float | None:
    """How long a ``PlaceReplica`` of ``dep`` on a node the core chose may go unanswered."""
    return dep.config.scheduling.placement_timeout_s


def with_deadline(deadlines: immutables.Map, next_deadline: float, rid: str,
                  at: float) -> tuple[immutables.Map, float]:
    """The book with ``rid`` due at ``at``, and the next deadline."""
    return deadlines.set(rid, at), min(next_deadline, at)


def disarm(cl: Cluster | ClusterTx, rid: str) -> tuple[immutables.Map, float]:
    """``cl``'s deadlines without ``rid``'s (answered in time), and the next deadline
    (refreshed when ``rid``'s was the earliest)."""
    deadlines = cl.deadlines
    at = deadlines[rid]
    deadlines = deadlines.delete(rid)
    nxt = min(deadlines.values(), default=_INF) if at <= cl.next_deadline else cl.next_deadline
    return deadlines, nxt


def arm(tx: Tx, rid: str, timeout: float | None) -> None:
    """``rid`` owes an answer ``timeout`` seconds from now (needs the clock; None: no deadline)."""
    if timeout is None or not tx.view.clock:
        return
    cl = tx.cl
    at = cl.now + timeout
    cl.deadlines, cl.next_deadline = with_deadline(cl.deadlines, cl.next_deadline, rid, at)
    cl.changed = True
    if tx.armed is None:
        tx.armed = [at]
    else:
        tx.armed.append(at)


def start(tx: Tx, dep: Deployment, rid: str) -> None:
    """``rid``'s ``InitializeReplica`` went out: its start timeout runs."""
    arm(tx, rid, start_timeout(dep))


def placement(tx: Tx, dep: Deployment, rid: str) -> None:
    """``rid``'s ``PlaceReplica`` on a node the core chose went out: its placement timeout runs."""
    arm(tx, rid, placement_timeout(dep))


def answered(tx: Tx, rid: str) -> None:
    """``rid`` answered in time (placed, ready, refused): its deadline goes (no
    working copy of the cluster when it has none)."""
    view = tx.view
    if view.deadlines and rid in view.deadlines:
        cl = tx.cl
        cl.deadlines, cl.next_deadline = disarm(cl, rid)
        cl.changed = True


def expired(cl: ClusterTx) -> list[str]:
    """Replicas whose deadline passed, in (deadline, id) order; refreshes ``next_deadline``."""
    due = sorted((t, rid) for rid, t in cl.deadlines.items() if t <= cl.now)
    with cl.deadlines.mutate() as m:
        for _, rid in due:
            del m[rid]
        cl.deadlines = m.finish()
    cl.next_deadline = min(cl.deadlines.values(), default=_INF)
    cl.changed = True
    return [rid for _, rid in due]


def ticks(tx: Tx) -> None:
    """End of step: a ``ScheduleTick`` for each distinct time armed in this step, earliest first."""
    if tx.armed:
        for at in sorted(set(tx.armed)):
            tx.tick_at(at)  # (not again when this step asked for that time already)
