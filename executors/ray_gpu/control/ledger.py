"""What the Ray controller holds, shared by its jobs, and how they feed the core.

The controller's jobs (``carry.py`` carries commands out, ``observe.py``
watches Ray, ``recover.py`` rebuilds after a restart, ``record.py`` writes
the trace) work on one ``Ledger``: the core's driver, the clock, a
``ReplicaRecord`` per replica, the specs, the nodes the core was told of,
the spare pool. It also holds the plumbing all of them use: feeding an
event (a refused one is recorded, not raised), spawning a task, and letting
a replica go (``forget``: one record dropped, its tasks and group with it).
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Sequence
from typing import Any

import ray

import rankcore as rc

from ...driver import Driver
from ..base import persist
from ..base.replicas import ReplicaRecord
from .spares import SparePool

log = logging.getLogger("rankcore.ray.controller")


class _Unwired:
    """The driver's backend until the controller wires its ``Carrier`` in."""

    def execute(self, commands: Sequence[object], t: float) -> None:
        raise rc.InvariantViolation("the controller's driver has no backend yet")


class Ledger:
    """The controller's state that more than one of its jobs reads or writes."""

    def __init__(self) -> None:
        self.t0 = persist.epoch()
        self.incarnation = persist.next_incarnation()
        self.driver = Driver(_Unwired(), clock=True)
        #: deployment -> what the core does not hold: the class, its arguments, actor options
        #: (the deployments' specs are the core's: ``rc.query.desired_specs``, saved by ``persist.save_specs``)
        self.specs: dict[str, dict] = {}
        #: replica id -> what the controller holds about it (one record: ``forget`` drops it)
        self.replicas: dict[str, ReplicaRecord] = {}
        #: replicas the controller let go of (stopped, killed, lost with their node): their
        #: deaths and late answers are not news. Outlives their records (until ``reset``)
        self.stopping: set[str] = set()
        #: node id -> its total resources, as the core was last told (NodeJoined / NodeCapacityChanged)
        self.nodes: dict[str, tuple] = {}
        #: idle worker processes kept per node (KeepSpareProcesses)
        self.spares = SparePool()
        #: node id -> the replicas being placed or started there (a placement under way, or an
        #: actor whose ``__init__`` has not returned), and replica id -> that node: kept as they
        #: change (``starting_at``, ``forget``), so a spare top-up asks one node, not every record
        self.starting: dict[str, set[str]] = {}
        self.starting_node: dict[str, str] = {}
        self.tasks: set[asyncio.Task] = set()
        self.errors: list[str] = []  # events the core rejected, "repr(event): error"
        self.halted = False  # halt() was called: the controller is about to be killed
        self.started = 0  # one past the highest replica number ever started
        self.lineages = 0
        #: (deployment, weights version) -> the ObjectRef of those weights (``weights_store``: the store
        #: owns them; this is a cache of its answers)
        self.weights: dict[tuple[str, int], Any] = {}
        #: memory-booked placement (``api.book_memory``; None: GPUs counted), and each probed
        #: node's CUDA devices' memory (``Watcher.probe``); saved (``persist.save_booking``)
        self.booking: Any = None  # (the controller loads the saved ones: Controller.__init__)
        self.cuda: dict[str, tuple[int, ...]] = {}
        self.probing: dict[str, Any] = {}
        #: replica id -> the number of its last ``report_models`` taken (the models are the core's:
        #: ``Replica.models``); a report numbered no higher arrived late. Dropped with its record
        self.models_seq: dict[str, int] = {}
        #: the tier moves carried out (evictions, warm/cold loads, dropped copies): what tests read
        self.tier_log: list[dict] = []
        #: told of each weights move carried out (deployment, "offload" | "load" | "update", bytes): the metrics
        self.on_transfer: Any = None

    # ------------------------------------------------------------- the core
    def now(self) -> float:
        """Seconds since the first controller started (so a trace's time never goes back)."""
        return max(0.0, time.time() - self.t0)

    def feed(self, event: object) -> None:
        if self.halted:  # about to be killed: what happens from now on is lost with it
            return
        try:
            self.driver.feed(event, self.now())
        except rc.RankcoreError as exc:  # a bug or a race we did not foresee: keep serving, but say so
            self.rejected(event, exc)

    def rejected(self, event: object, exc: Exception) -> None:
        """The core refused an event: recorded in the trace (a ``rejected``
        record), logged with the event, and counted (``status()``)."""
        self.errors.append(f"{event!r}: {exc}")
        log.error("the core rejected %r: %s: %s", event, type(exc).__name__, exc)
        if self.driver.trace is not None:
            self.driver.trace.rejected(self.now(), event, exc)

    def spawn(self, coro: Any) -> None:
        task = asyncio.get_event_loop().create_task(coro)
        self.tasks.add(task)
        task.add_done_callback(self.tasks.discard)

    def save_booking(self) -> None:
        persist.save_booking(self.booking, self.cuda)

    def transferred(self, deployment: str, what: str, nbytes: int) -> None:
        if self.on_transfer is not None:
            self.on_transfer(deployment, what, nbytes)

    async def weights_ref(self, deployment: str, version: int) -> Any:
        """The ObjectRef of ``deployment``'s weights of ``version`` (None: version 0, the class's own, or
        none kept: a class that holds no weights was pushed a version without tensors)."""
        if version <= 0:
            return None
        key = (deployment, version)
        if key not in self.weights:
            from ..weights.store import store

            got = await store().get.remote(deployment, version)
            if got is None:
                return None
            self.weights[key] = got[0]
        return self.weights[key]

    # ------------------------------------------------------------ replicas
    def actor(self, rid: str) -> Any:
        """The replica's actor handle, or None (no record, or no actor created yet)."""
        rec = self.replicas.get(rid)
        return rec.actor if rec is not None else None

    def with_actors(self) -> list[tuple[str, ReplicaRecord]]:
        """(id, record) of every replica whose actor the controller holds."""
        return [(rid, rec) for rid, rec in self.replicas.items() if rec.actor is not None]

    def node_of(self, rid: str) -> str | None:
        """The replica's node as the core holds it (where it runs, or where a
        PlaceReplica sent it)."""
        state = self.driver.state
        dep = state.deployments.get(state.index.get(rid, ""))
        rep = dep.replicas.get(rid) if dep is not None else None
        return rep.node_id if rep is not None else None

    def starting_at(self, rid: str, node: str | None) -> None:
        """``rid`` is being placed or started on ``node`` from now on (None: not
        any more: it is ready, its placement failed, or it is gone)."""
        old = self.starting_node.pop(rid, None)
        if old is not None:
            here = self.starting[old]
            here.discard(rid)
            if not here:
                del self.starting[old]
        if node is not None:
            self.starting_node[rid] = node
            self.starting.setdefault(node, set()).add(rid)

    def starts_on(self, node: str) -> bool:
        """Is a replica of ours being placed or started on ``node``?"""
        return node in self.starting

    def checkpoint(self) -> None:
        """Save every replica of ours (``persist.save_replicas``)."""
        persist.save_replicas({rid: rec.checkpoint() for rid, rec in self.replicas.items() if rec.checkpointed})

    def release_pg(self, rec: ReplicaRecord) -> None:
        """Remove the replica's own placement group, if it has one."""
        pg, rec.pg = rec.pg, None
        if pg is not None:
            try:
                ray.util.remove_placement_group(pg)
            except Exception:  # already gone
                pass

    def forget(self, rid: str) -> ReplicaRecord | None:
        """Drop the record of a replica that is gone or going, and what it
        holds: its placement under way and its health checks are cancelled
        (unless the caller is that task), its group removed. Returns it, if known."""
        self.starting_at(rid, None)
        self.models_seq.pop(rid, None)
        rec = self.replicas.pop(rid, None)
        if rec is None:
            return None
        for task in (rec.placing[1] if rec.placing is not None else None, rec.checks):
            if task is not None and task is not asyncio.current_task():
                task.cancel()
        self.release_pg(rec)
        if rec.checkpointed:
            self.checkpoint()
        return rec
