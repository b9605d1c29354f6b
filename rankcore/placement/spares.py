"""Spare processes: started, idle worker processes kept where a deployment runs.

Why: on Ray most of crash -> same rank serving is a new worker process
starting (interpreter, ``import ray``, registering with the raylet: 0.9-1.6 s
of 1.45 s measured, docs/benchmarks.md); a process that already exists on the
node takes the replacement at once. Idle processes cost memory on every node
that keeps them, so how many is the deployment's choice
(``spare_processes``, default 0), and which nodes is the core's rule: every
node that holds a replica of the deployment (``wanted``), told to the
executor as ``KeepSpareProcesses`` whenever that changes (``announce``, an
end-of-step pass). The executor keeps the largest count any deployment asks
of a node and refills after a replica there takes one; the count decides no
rank, placement or timeout.

Internal module: import its public names from ``rankcore`` (docs/embedding.md,
"What you may import").
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from ..base.commands import KeepSpareProcesses
from ..base.transaction import Tx

if TYPE_CHECKING:
    from ..base.state import Deployment

__all__ = ["wanted", "told", "announce", "asks"]


def wanted(dep: Deployment | None) -> dict[str, int]:
    """node id -> spare processes the deployment wants kept there: its
    ``spare_processes`` on every node holding one of its replicas (placed, or
    reserved by a PlaceReplica); nothing for a deployment that asks for none
    (or is gone)."""
    if dep is None:
        return {}
    k = dep.config.spares.spare_processes
    if not k:
        return {}
    ranks = dep.ranks
    return {str(node): k for node in ranks.nodes() if ranks.replicas_on(node)}


def told(name: str, before: dict[str, int], after: dict[str, int]) -> list[KeepSpareProcesses]:
    """The commands that take an executor told ``before`` to ``after``: every
    node whose count changed, 0 for a node left, in node order."""
    return [KeepSpareProcesses(deployment=name, node_id=node, count=after.get(node, 0))
            for node in sorted(before.keys() | after.keys()) if before.get(node, 0) != after.get(node, 0)]


def announce(tx: Tx) -> None:
    """End-of-step pass: tell the executor where each deployment the step
    touched now wants spare processes, when that changed (a replica landed on a
    new node, a node's last replica left, the option changed, the deployment
    went). O(nodes of the deployment), only for deployments that ask for any."""
    initial, deps = tx.initial, tx.deps
    asking = [name for name in tx.touched if asks(initial.get(name)) or asks(deps.get(name))]
    for name in sorted(asking) if len(asking) > 1 else asking:  # (every step comes here: most ask for none)
        for cmd in told(name, wanted(initial.get(name)), wanted(deps.get(name))):
            tx.emit(cmd)


def asks(dep: Deployment | None) -> bool:
    """Whether ``dep`` keeps spare processes (a step that changes its nodes tells them)."""
    return dep is not None and dep.config.spares.spare_processes > 0
