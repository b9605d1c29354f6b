"""Deleting one deployment (``DeploymentDeleted``; Ray Serve's ``serve.delete``).

Why a rule of its own and not "scale to 0": a deployment at 0 replicas is
still declared (a later scale brings it back, its spec is persisted, its
WARM copies may serve it again), while a deleted one must leave everything it
held behind: its record, its WARM copies in the nodes' CPU caches, its spare
processes, its place in what the embedder persists. And it cannot leave at
once: its replicas drain first (an in-flight request is finished, never cut),
so deletion is a state (``Deployment.deleting``) ended by an end-of-step
pass (``sweep``) once the last replica has stopped, in whichever step that
is (a stop, a crash, a lost node, a recovery that found none).

Meanwhile the deployment is at target 0 (the request path is told nothing is
coming: waiting requests fail at once, ``rankcore.control.pool``), a scale is refused,
and a ``DeploymentApplied`` of the same name takes it back (``cancel``). Once
gone, its name is kept in ``State.deleted`` so that late news about its
replicas is stale rather than unknown; the embedder persists both kinds with
``desired_deleted``.

Internal module: import its public names from ``rankcore`` (docs/embedding.md,
"What you may import").
"""

from __future__ import annotations

from ..base.commands import DropWarmCopy
from ..base.errors import InvalidEvent
from ..base.records import unchecked_copy
from ..base.state import Deployment
from ..base.transaction import Tx
from . import bluegreen
from .moves import scale

__all__ = ["begin", "cancel", "revive", "refuse_scale", "sweep"]

_copy = unchecked_copy


def begin(tx: Tx, dep: Deployment) -> None:
    """Target 0, marked deleting; its replicas are stopped by the downscale rules
    (drained by its graceful-shutdown options; the sweep removes it when none is left)."""
    # (a person's scale to 0, the one path: a static deployment at 0 is shut down, FAILED replicas too)
    tx.put(scale(tx, bluegreen.disband(_copy(dep, deleting=True)), 0))


def cancel(dep: Deployment) -> Deployment:
    """A ``DeploymentApplied`` for a deployment being deleted takes it back (its handler applies the rest)."""
    return _copy(dep, deleting=False) if dep.deleting else dep


def revive(tx: Tx, name: str) -> None:
    """A deployment applied anew under a deleted one's name is not deleted (its
    replicas' ids are new: news about the old ones stays stale by their numbers)."""
    if name in tx.deleted:
        tx.deleted = tx.deleted.delete(name)


def refuse_scale(dep: Deployment) -> None:
    """A scale of a deployment being deleted would undo the deletion behind the caller's back."""
    if dep.deleting:
        raise InvalidEvent(f"ScaleRequested: deployment {dep.name!r} is being deleted (DeploymentDeleted); "
                           f"a DeploymentApplied of it takes it back")


def sweep(tx: Tx) -> None:
    """End-of-step pass: each deployment the step touched that is being deleted and has
    no replica left goes: its record, and the WARM copies of its model in the nodes'
    CPU caches (``DropWarmCopy`` each: no replica of it is left to be placed from one)."""
    gone = [name for name in tx.touched if (dep := tx.deps.get(name)) is not None and dep.deleting
            and not dep.replicas and not dep.unresponsive]
    for name in sorted(gone):
        tx.deps = tx.deps.delete(name)
        tx.deleted = tx.deleted.set(name, None)
        _drop_copies(tx, name)


def _drop_copies(tx: Tx, name: str) -> None:
    caches = tx.view.caches
    for node_id in sorted(caches.keys()):
        mine = [e for e in caches[node_id] if e.deployment == name]
        if not mine:
            continue
        cl = tx.cl
        cl.caches = cl.caches.set(node_id, tuple(e for e in cl.caches[node_id] if e.deployment != name))
        cl.changed = True
        for entry in mine:
            tx.emit(DropWarmCopy(node_id=node_id, deployment=name, replica_id=entry.replica_id or ""))
