"""The end-of-step pass that carries out the evictions chosen in the step
(``rankcore.tiers.devices``, issue 21), and the wakes that wait for room.

An evicted replica is a removal for the rank rules: it drains and stops
(``EvictReplica``, answered by ``ReplicaStopped``), keeping its ranks until
then; its deployment's target is unchanged, so a replacement is started at
once on the lowest free rank. That replacement may not evict in turn
(``Cluster.no_evict``): it waits for room, preferring the node that holds the
evicted replica's WARM copy (``tiers.Choice.WARM_FREE``). Cache entries
dropped to make room for the evicted weights are told with ``DropWarmCopy``.

Internal module: import its public names from ``rankcore`` (docs/embedding.md,
"What you may import").
"""

from __future__ import annotations

from ..base.books import free_gpus
from ..base.commands import DropWarmCopy, EvictReplica
from ..base.lifecycle import Phase, Residency, TierTrigger, Trigger, advance
from ..base.records import unchecked_copy
from ..base.transaction import Tx, put_replica
from ..placement.scheduling import requeue_as
from ..tiers import devices, residency
from .moves import reconcile

__all__ = ["carry_out", "retry_wakes"]

_copy = unchecked_copy


def carry_out(tx: Tx) -> None:
    """Send the evictions chosen this step (``Tx.evictions``), in the order chosen."""
    chosen, tx.evictions = tx.evictions, None
    if not chosen:
        return
    touched: list[str] = []
    for victim, for_rid, node_id, to, dropped in chosen:
        name = tx.index.get(victim)
        if name is None:  # pragma: no cover - a resident is a live replica of the index
            continue
        dep = tx.deps[name]
        rep = dep.replicas[victim]
        for entry in dropped:
            tx.emit(DropWarmCopy(node_id=node_id, deployment=entry.deployment, replica_id=entry.replica_id or ""))
        if rep.phase is Phase.STOPPING:  # stopped meanwhile (a recovery rebuilt it stopping): it leaves
            devices.forget_copy(tx.cl, node_id, victim)  # anyway, and keeps no copy (a StopReplica's)
            continue
        o = dep.config.shutdown
        tx.emit(EvictReplica(replica_id=victim, deployment=name, node_id=node_id, to=to, for_replica=for_rid,
                             graceful_shutdown_wait_loop_s=o.graceful_shutdown_wait_loop_s,
                             graceful_shutdown_timeout_s=o.graceful_shutdown_timeout_s))
        tx.put(put_replica(dep, rep, _copy(rep, phase=advance(rep.phase, Trigger.STOP, victim))))
        if name not in touched:
            touched.append(name)
    for name in touched:  # each victim's deployment once: its replacements start in ascending rank
        dep = tx.deps[name]
        before = set(dep.replicas.keys())
        dep = reconcile(tx, dep)
        fresh = [rid for rid in dep.replicas if rid not in before]
        if fresh:  # its replacement waits for room: it does not evict in turn
            cl = tx.cl
            with cl.no_evict.mutate() as m:
                for rid in fresh:
                    m.set(rid, None)
                cl.no_evict = m.finish()
            requeue_as(cl, fresh, lambda rid, old: (*old, "no_evict"))
        tx.put(dep)


def retry_wakes(tx: Tx) -> None:
    """A sleeping replica that waits for GPU room on its node to wake (its victims
    gone, or anything freed): tried again (``residency.settle`` books and loads)."""
    cl = tx.working
    if cl is None or not cl.evicting:
        return
    for rid in sorted(cl.evicting.keys()):
        if rid in cl.queued:
            continue  # a waiting placement: the placement pass tries it
        victims = cl.evicting[rid]
        if any(v in cl.hot for v in victims):
            continue
        name = tx.index.get(rid)
        if name is None:
            cl.evicting = cl.evicting.delete(rid)
            continue
        dep = tx.deps[name]
        rep = dep.replicas[rid]
        if residency.needs(dep, rep)[1] is not TierTrigger.WAKE:
            cl.evicting = cl.evicting.delete(rid)  # asleep again, stopping, ...: no longer waits,
            if rep.residency is Residency.WARM:  # and the room it claimed is free again
                free_gpus(cl, rid)
            continue
        new = residency.settle(tx, dep, rep)
        if new is not rep:
            tx.put(put_replica(dep, rep, new))
