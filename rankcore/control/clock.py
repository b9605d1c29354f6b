"""Time's rules: what the core's clock moving makes happen, and suspect nodes.

The core has no clock of its own: ``Tick(now)`` and answers carrying ``now``
move it (``advance``). Moving it does more only when work comes due
(``cluster.clock_work_due``), each rule in one function here:

* ``deadlines_due``: a restart backoff ends (the replacement's StartReplica
  now, ``moves.start_delayed``); a placement not answered in time (the
  incarnation is stopped at once and replaced elsewhere, avoiding that node);
  a start not answered in time (stopped at once, counted as a failed start,
  replaced: its gang too under ``restart_gang``). The deadlines themselves are
  armed where their commands go out (``rankcore.placement.deadlines``).
* placement failures are forgotten ``retry_s`` after the first
  (``scheduling.forget_failures``): every replica may try every node again;
* a suspect node (``suspect``: a replica there vanished on its own,
  ``ReplicaCrashed(cause="exited")``) is avoided for ``Cluster.suspect_s``
  while another node has room, then trusted again.

Internal module: import its public names from ``rankcore`` (docs/embedding.md,
"What you may import").
"""

from __future__ import annotations

import math

from ..base.clustertx import ClusterTx
from ..base.lifecycle import Phase
from ..base.records import unchecked_copy
from ..base.state import Replica
from ..base.transaction import Tx, by_rank, stop_command
from ..placement import deadlines, restarts
from ..placement.scheduling import forget_failures
from .moves import crash, fail, start_delayed

__all__ = ["advance", "deadlines_due", "suspect"]

_copy = unchecked_copy  # rankcore.base.records: not validated, no per-call introspection


def advance(tx: Tx, now: float, work_due: bool) -> None:
    """Move the core's clock to ``now`` (later than it was). No working copy of
    the cluster when only the clock moves (``work_due`` False: the common case);
    else suspects past their time are trusted again, failures past ``retry_s``
    forgotten and due deadlines acted on."""
    if not work_due:  # (called first in its step: no working copy is open yet)
        tx.cluster = _copy(tx.cluster, now=float(now), clock=True)
        return
    cl = tx.cl
    cl.now, cl.clock, cl.changed = float(now), True, True
    if cl.suspects and any(t <= cl.now for t in cl.suspects.values()):
        cl.suspects = type(cl.suspects)({n: t for n, t in cl.suspects.items() if t > cl.now})
    if cl.now >= cl.retry_at:
        forget_failures(tx)
    if cl.now >= cl.evictable_at:  # a replica too young to evict is old enough now: the queue tries again
        cl.evictable_at, cl.blocked = math.inf, None
    if cl.now >= cl.next_deadline:
        deadlines_due(tx, cl)


def deadlines_due(tx: Tx, cl: ClusterTx) -> None:
    """Every deadline the clock reached, per deployment in rank order: a restart
    backoff ends (StartReplica now), a placement or a start timed out (the
    incarnation is stopped at once and replaced: a placement elsewhere, a start
    counted as failed)."""
    due: dict[str, list[Replica]] = {}
    for rid in deadlines.expired(cl):
        found = tx.lookup(rid)
        if found is not None:
            due.setdefault(found[0].name, []).append(found[1])
    for name in sorted(due):
        dep = tx.deps[name]
        for rep in by_rank(dep, due[name]):
            rid = rep.replica_id
            current = dep.replicas.get(rid)
            if current is None:
                continue  # restarted with its gang already
            if rid in cl.delayed:  # its backoff is over
                dep = start_delayed(tx, dep, current)
            elif current.phase is Phase.STARTING:  # its process hung in __init__
                tx.emit(stop_command(dep, rid, now=True))
                dep = fail(tx, restarts.failed_start(dep, current, "start_timeout", "not ready within start_timeout_s"), current)
            elif current.phase is Phase.PENDING and current.node_id is not None:  # never placed there
                tx.emit(stop_command(dep, rid, now=True))
                if dep.gang_size > 1:
                    dep = fail(tx, dep, current)
                else:
                    dep = crash(tx, dep, current, avoid=current.node_id)
        tx.put(dep)
    at = cl.next_deadline
    if at < math.inf:
        tx.tick_at(at)  # (a backoff begun in this step may have asked for it already)


def suspect(tx: Tx, rep: Replica, cause: str) -> None:
    """A replica's process vanished on its own (``cause="exited"``), no failed
    check to explain it: its node may be going down, and is avoided for
    ``suspect_s`` (needs the clock and a managed cluster)."""
    if cause == "exited" and rep.node_id is not None and tx.managed and tx.view.clock:
        cl = tx.cl
        cl.suspects = cl.suspects.set(rep.node_id, cl.now + cl.suspect_s)
        cl.changed = True
