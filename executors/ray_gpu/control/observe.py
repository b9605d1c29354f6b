"""What the Ray controller observes of Ray, told to the core as events.

The cluster's nodes (``NodeJoined`` / ``NodeCapacityChanged`` / ``NodeLost``,
from ``ray.nodes()``, less what the callers' placement groups hold), the nodes
Ray is draining (``NodeDraining``, from the GCS's drain list: its autoscaler or
``ray drain-node``), where a
static deployment's bundles are (``BundlesPlaced``), replica actors' deaths
(``ReplicaCrashed`` with the cause read from Ray's death record, or one
``NodeLost`` for deaths on a node Ray declared dead) and health checks
(``HealthChecked``). Observing only: what follows from each fact is the
core's decision.
"""

from __future__ import annotations

import asyncio
import logging
from collections import deque
from collections.abc import Callable
from typing import Any

import attrs
import ray

import rankcore as rc

from ..base.replicas import actor_name as actor_name_of
from . import placement as pl
from . import static as st
from .ledger import Ledger

log = logging.getLogger("rankcore.ray.controller")

#: Fault injection only (the scenario runner's ``unreported_gpus``): a placement group
#: whose name starts so is left out of ``held_by_callers``, so its node offers the core
#: GPUs the group holds; the core believes in room that is not there, and a placement
#: it aims there waits for room until its placement timeout. Never name a real group so.
UNSEEN_GROUP_PREFIX = "rankcore-fault-unseen:"


#: how many gone replicas each deployment's status lists (``recent_dead_replicas``: Ray Serve's
#: ``RAY_SERVE_RETAINED_DEAD_REPLICAS`` default), so their logs can still be found
DEAD_KEPT = 10
def held_by_callers(table: dict) -> dict[str, dict[str, float]]:
    """Node id -> resources the bundles of placement groups rankcore did not
    make hold there (``ray.util.placement_group_table()``: a trainer's group,
    a static deployment's caller's group). A removed group, or a bundle not
    placed, holds nothing. rankcore's own groups (``rankcore:<deployment>:<id>``)
    are left out: the core booked them itself; so are the fault-injection groups
    (``UNSEEN_GROUP_PREFIX``), which hold what the core must not be told about."""
    held: dict[str, dict[str, float]] = {}
    for info in table.values():
        if (info.get("name") or "").startswith(("rankcore:", UNSEEN_GROUP_PREFIX)) or info.get("state") == "REMOVED":
            continue
        where = info.get("bundles_to_node_id") or {}
        for index, bundle in (info.get("bundles") or {}).items():
            node = where.get(index)
            if node:
                mine = held.setdefault(node, {})
                for res, amount in bundle.items():
                    mine[res] = mine.get(res, 0.0) + float(amount)
    return held


def _less(total: dict[str, float], held: dict[str, float]) -> dict[str, float]:
    return {res: max(0.0, amount - held.get(res, 0.0)) for res, amount in total.items()}


def group_refused(pg: Any, node: str) -> str | None:
    """Why Ray will not place ``pg`` (removed, or infeasible: no node it may go
    to could ever hold it), or None while it may still be placed."""
    try:
        info = ray.util.placement_group_table(pg)
    except Exception:  # GCS hiccup: look again next time
        return None
    if not info or info.get("state") == "REMOVED":
        return "placement group removed"
    if (info.get("stats") or {}).get("scheduling_state") == "INFEASIBLE":
        return f"placement group infeasible on node {node}"
    return None


def group_removed(static: st.StaticPlacementConfig) -> bool:
    """The caller's group of a static deployment was removed."""
    try:
        return bool(ray.util.placement_group_table(static.placement_group).get("state") == "REMOVED")
    except Exception:
        return False


def actor_info(actor: Any) -> dict | None:
    """Ray's record of an actor (``ray._private.state.actors``), or None."""
    try:
        from ray._private.state import actors

        info = actors(actor_id=actor._actor_id.hex())
        return info if isinstance(info, dict) and info else None
    except Exception:
        return None


#: ActorDiedErrorContext.Reason -> ReplicaCrashed.cause
_DIED_REASON = {"RAY_KILL": "killed", "NODE_DIED": "node_lost"}


def death_cause(error: BaseException | None, actor: Any) -> str:
    """``ReplicaCrashed.cause`` of a replica actor that died (the controller
    did not kill it), from structured facts: the error's own flags (its
    creation raised: ``error``; its node was drained/preempted: ``node_lost``)
    and Ray's death record of the actor (``DeathCause``: killed by
    ``ray.kill`` or the OOM killer: ``killed``; its node died: ``node_lost``;
    its process exited otherwise: ``exited``)."""
    if error is not None and getattr(error, "preempted", False):
        return "node_lost"
    if error is not None and getattr(error, "actor_init_failed", False):
        return "error"
    info = actor_info(actor) if actor is not None else None
    death = (info or {}).get("DeathCause")
    if death is None:
        return "exited" if error is not None else "unknown"
    try:
        if death.HasField("oom_context"):
            return "killed"
        if death.HasField("creation_task_failure_context"):
            return "error"
        if death.HasField("actor_died_error_context"):
            ctx = death.actor_died_error_context
            reason = type(ctx).Reason.Name(ctx.reason)
            return _DIED_REASON.get(reason, "exited")
    except Exception:  # a record of another shape: what was seen is a process gone
        pass
    return "exited"


def node_dead(node_id: str) -> bool:
    """Ray lists the node as dead."""
    try:
        return any(n["NodeID"] == node_id and not n.get("Alive") for n in ray.nodes())
    except Exception:  # GCS hiccup: treat it as one replica's death
        return False


def draining_nodes() -> set[str]:
    """The nodes Ray's GCS is draining (its autoscaler's idle or preemption drains, ``ray
    drain-node``): what Ray Serve's controller reads to drain their proxies. A GCS that does not
    answer: none this pass (the next pass asks again)."""
    try:
        gcs = ray._private.worker.global_worker.gcs_client  # type: ignore[attr-defined]
        return set(gcs.get_draining_nodes(timeout=5))
    except Exception as exc:  # GCS hiccup, or a Ray without the call
        log.debug("could not read the draining nodes: %r", exc)
        return set()


class Watcher:
    """Turns what Ray reports (nodes, bundles, deaths, health checks) into core events."""

    # Observation details only (docs/architecture.md, "what is left in
    # executors/"): every decision (health, timeouts, drains) comes from the core.
    #: deaths on one node this close together are observed together: if Ray has
    #: declared the node dead by then, they are one NodeLost
    death_batch_s = 0.25

    def __init__(self, ledger: Ledger) -> None:
        self.ledger = ledger
        #: node -> [(replica, cause)] whose deaths are being observed together
        self.dying: dict[str, list[tuple[str, str]]] = {}
        #: replica -> its deployment and what it said of itself when its watch began
        #: (``ReplicaActor.identity``: pid, actor id, log file, ...), until its actor is gone; then
        #: it is in its deployment's ``gone``
        self.identities: dict[str, tuple[str, dict]] = {}
        #: deployment -> its last ``DEAD_KEPT`` replicas whose actors are gone (stopped or died), oldest first
        self.gone: dict[str, deque[dict]] = {}

    # ------------------------------------------------------------------ nodes
    def alive_nodes(self) -> list[rc.NodeJoined]:
        """The cluster's live nodes as ``NodeJoined`` events: nodes with an
        order label first, in its order, then the others by id (the order the
        core breaks ties in after the label). Each offers what the core may
        book there: its total less what the callers' placement groups hold on
        it (``held_by_callers``; rankcore's own groups are the core's bookings
        already), as the simulator's nodes do."""
        alive = [pl.node_joined(n) for n in ray.nodes() if n.get("Alive")]
        held = held_by_callers(ray.util.placement_group_table())
        alive = [attrs.evolve(j, resources=_less(dict(j.resources), held[j.node_id])) if j.node_id in held else j
                 for j in alive]
        declared = [d for d in map(self.declared, alive) if d is not None]
        return sorted(declared, key=lambda j: (j.order is None, j.order or 0, j.node_id))

    def declared(self, joined: rc.NodeJoined) -> rc.NodeJoined | None:
        """``joined`` with its GPU memory and CPU cache when the user asked for memory-booked
        placement (``memory.MemoryBooking``, ``api.book_memory``); None while a node whose
        memory is read from CUDA has not been probed yet (a probe is started: it joins on a
        later pass)."""
        led = self.ledger
        booking = led.booking
        if booking is None:
            return joined
        if booking.wants_cuda(joined):
            if joined.node_id not in led.cuda:
                led.spawn(self.probe(joined.node_id))
                return None
            return booking.declare(joined, led.cuda[joined.node_id])
        return booking.declare(joined)

    async def probe(self, node_id: str) -> tuple[int, ...]:
        """Read each CUDA device's memory on ``node_id`` (a task there that sees every GPU)."""
        from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

        from ..base.replicas import NOSET_CUDA
        from .memory import probe_cuda

        led = self.ledger
        if node_id in led.probing:
            return await asyncio.shield(led.probing[node_id])
        task = asyncio.ensure_future(ray.remote(probe_cuda).options(
            num_cpus=0, scheduling_strategy=NodeAffinitySchedulingStrategy(node_id=node_id, soft=False),
            runtime_env={"env_vars": {NOSET_CUDA: "1"}}).remote())
        led.probing[node_id] = task
        try:
            found = tuple(await task)
        finally:
            led.probing.pop(node_id, None)
        led.cuda[node_id] = found
        led.save_booking()
        return found

    def sync_bundles(self) -> None:
        """Tell the core where each static deployment's bundles are now
        (``BundlesPlaced``) when Ray moved them (a bundle whose node was lost
        rescheduled on a live node, or the caller's group removed: nowhere).
        A node the core does not know alive counts as nowhere."""
        led = self.ledger
        state = led.driver.state
        for name, spec in sorted(led.specs.items()):
            cfg = spec.get("static")
            dep = state.deployments.get(name)
            if cfg is None or dep is None or dep.static is None:
                continue
            where = st.bundle_nodes(cfg.placement_group, set(led.nodes))
            if len(where) == dep.static.bundle_count and where != dep.static.bundle_nodes:
                led.feed(rc.BundlesPlaced(deployment=name, bundle_nodes=where))

    def sync_nodes(self) -> None:
        """Tell the core what changed in the cluster since it was last told: a
        new node joins (``NodeJoined``), a node whose total resources changed
        says so (``NodeCapacityChanged``), a node it knows that Ray reports dead
        (or no longer lists) is lost (``NodeLost``, through ``lose_node``), a node
        Ray has begun to drain is draining (``NodeDraining``, once: the core keeps
        it; after a recovery the core is told again)."""
        led = self.ledger
        alive = {j.node_id: j for j in self.alive_nodes()}
        for node_id in sorted(set(led.nodes) - set(alive)):
            self.lose_node(node_id)
        for node_id, joined in alive.items():
            if node_id not in led.nodes:
                led.nodes[node_id] = joined.resources
                led.feed(joined)
            elif led.nodes[node_id] != joined.resources:
                led.nodes[node_id] = joined.resources
                led.feed(rc.NodeCapacityChanged(node_id=node_id, resources=joined.resources))
        known = led.driver.state.proxies.draining
        for node_id in sorted((draining_nodes() & set(led.nodes)) - known):
            led.feed(rc.NodeDraining(node_id=node_id, now=led.now()))

    def lose_node(self, node_id: str) -> None:
        """A node died: one ``NodeLost`` (the core crashes every replica it
        placed or reserved there and replaces them in rank order, as the
        simulator does). The controller only lets go of them: their actors,
        their placements under way, their groups."""
        led = self.ledger
        placing_there = {rid for rid, rec in led.replicas.items()
                         if rec.placing is not None and rec.placing[0] == node_id}
        for rid in sorted({rid for rid, _ in led.with_actors()} | placing_there):
            if rid in placing_there or led.node_of(rid) == node_id:
                led.stopping.add(rid)  # their own watch calls fail too: already handled
                led.forget(rid)
                self._let_go(rid)
        led.nodes.pop(node_id, None)
        led.spares.forget(node_id)
        led.feed(rc.NodeLost(node_id=node_id))

    # ----------------------------------------------------------------- deaths
    async def watch(self, rid: str, actor: Any) -> None:
        """Keep a call pending on the replica: it fails when the actor dies. A
        death the controller did not cause is reported with its cause, read
        from Ray's death record (``death_cause``). Deaths that may be a node's
        (not killed on purpose, not the user's error) are observed together
        for ``death_batch_s`` (``deaths_on``). First the replica is asked who it is
        (``identify``, once: what ``status`` shows of it); once it is gone and the core told, that
        moves to its deployment's ``gone`` (``_let_go``)."""
        error: BaseException | None = None
        await self.identify(rid, actor)
        try:
            await actor.watch.remote()
        except Exception as exc:
            error = exc
        if rid in self.ledger.stopping:
            self._let_go(rid)
            return
        cause = death_cause(error, actor)
        reason = f"actor died ({cause})"
        node = self.ledger.node_of(rid)
        if node is None or cause in ("killed", "error"):  # not a node going down: at once
            self.crashed(rid, reason, cause)
            return
        batch = self.dying.setdefault(node, [])
        batch.append((rid, cause))
        if len(batch) == 1:
            self.ledger.spawn(self.deaths_on(node))

    async def deaths_on(self, node: str) -> None:
        """Deaths on one node within ``death_batch_s`` are observed together:
        if Ray has declared the node dead by then, they are one ``NodeLost``
        (the core replaces the node's replicas in rank order); else each is a
        crash with its cause, in the order Ray reported them."""
        await asyncio.sleep(self.death_batch_s)
        batch = self.dying.pop(node, [])
        if node in self.ledger.nodes and node_dead(node):  # (not if sync_nodes has lost it meanwhile)
            self.lose_node(node)
        for rid, cause in batch:
            if rid not in self.ledger.stopping:
                self.crashed(rid, f"actor died ({cause})", cause)
            else:
                self._let_go(rid)

    # -------------------------------------------------- what status shows of replicas
    async def identify(self, rid: str, actor: Any) -> None:
        """Ask the replica once who it is (``identity``: its pid, actor id, log file, ...), kept in
        ``identities`` for ``status``; a replica that does not answer (dead) is left unknown."""
        try:
            info = await actor.identity.remote()
        except Exception:  # (dead: its watch call fails too, and says so)
            return
        rec = self.ledger.replicas.get(rid)
        if rec is not None and rec.actor is actor:  # (not let go of meanwhile)
            self.identities[rid] = (rec.deployment, {"actor_name": actor_name_of(rec.deployment, rid), **info})

    def _let_go(self, rid: str) -> None:
        """Its actor is gone (stopped, killed or died) and the core is told (its stop was the
        core's, or its death is fed now): what it said moves to its deployment's ``gone`` (state
        ``STOPPED``, as Ray Serve lists it), the last ``DEAD_KEPT`` of each kept while the core
        holds the deployment. (Not before the core is told: till then ``status`` shows it as the
        core holds it, with its pid, not also gone.)"""
        known = self.identities.pop(rid, None)
        if known is None:
            return
        name, info = known
        state = self.ledger.driver.state
        for dep in [d for d in self.gone if d not in state.deployments]:  # (deleted meanwhile)
            del self.gone[dep]
        if name in state.deployments:
            self.gone.setdefault(name, deque(maxlen=DEAD_KEPT)).append(
                {**info, "replica_id": rid, "state": "STOPPED"})

    def details(self) -> dict:
        """What ``status`` shows beside the core's state: ``replicas`` (each live replica's
        identity) and ``gone`` (deployment -> its recent gone replicas). (A deployment UNHEALTHY
        since a serving replica died is the core's: ``rankcore.base.unhealthy``.)"""
        deps = self.ledger.driver.state.deployments
        return {"replicas": {rid: info for rid, (_, info) in self.identities.items()},
                "gone": {d: list(q) for d, q in self.gone.items() if d in deps}}

    def crashed(self, rid: str, reason: str, cause: str) -> None:
        self.ledger.forget(rid)
        self._let_go(rid)
        self.ledger.feed(rc.ReplicaCrashed(replica_id=rid, reason=reason, cause=cause, now=self.ledger.now()))

    # ---------------------------------------------------------- health checks
    def start_checks(self, rid: str, actor: Any) -> None:
        """A replica is ready: check its health from now on, at the period and
        with the timeout its InitializeReplica carried (a replica adopted by a
        recovery: its deployment's)."""
        rec = self.ledger.replicas.get(rid)
        if rec is None or rec.actor is None or rec.checks is not None:
            return
        every = rec.check_every
        if every is None:
            state = self.ledger.driver.state
            dep = state.deployments.get(state.index.get(rid, ""))
            h = (dep.config if dep is not None else rc.DeploymentConfig()).health
            every = (h.health_check_period_s, h.health_check_timeout_s)
        task = asyncio.get_event_loop().create_task(self.health_checks(rid, actor, *every))
        rec.checks = task

        def done(t: asyncio.Task) -> None:
            if rec.checks is t:
                rec.checks = None

        task.add_done_callback(done)

    def _checked(self, rid: str) -> bool:
        """The replica is still to be checked (not stopping, not let go, the controller not halted)."""
        led = self.ledger
        return not led.halted and led.actor(rid) is not None and rid not in led.stopping

    #: told how long each health check took (the replica's deployment, ms), answered or timed out
    #: (Serve's ``serve_health_check_latency_ms``: a check that raised is not timed): the controller's
    #: metrics, ``ControllerMetrics.health_checked``; None: no one is told
    on_check_time: Callable[[str, float], None] | None = None

    async def health_checks(self, rid: str, actor: Any, period: float, timeout: float) -> None:
        """Every ``period`` s, ping the replica (its ``check_health`` if it has
        one), waiting up to ``timeout`` s, and report the outcome to the core:
        ``HealthChecked``, healthy or not (raised: the error; no answer in time:
        "timed out"), and its time to ``on_check_time``. The core counts and decides; the
        controller carries its ``StopReplica`` out. A dead actor is not a failed check: its death is
        reported by its watch (``ReplicaCrashed``)."""
        from ray.exceptions import RayActorError

        loop = asyncio.get_running_loop()
        while True:
            await asyncio.sleep(period)
            if not self._checked(rid):
                return
            rec = self.ledger.replicas.get(rid)  # (an UpdateHealthChecks since: its period and timeout from now)
            if rec is not None and rec.check_every is not None:
                period, timeout = rec.check_every
            began, took = loop.time(), None
            try:
                await asyncio.wait_for(actor.ping.remote(), timeout)
                healthy, detail, took = True, "", loop.time() - began
            except asyncio.TimeoutError:
                healthy, detail, took = False, "timed out", loop.time() - began
            except RayActorError:
                return  # died: the watch reports it
            except Exception as exc:
                healthy, detail = False, f"check_health raised: {getattr(exc, 'cause', None) or exc!r}"[:500]
            if not self._checked(rid):
                return
            if took is not None:
                self._check_took(rid, took)
            self.ledger.feed(rc.HealthChecked(replica_id=rid, healthy=healthy, detail=detail))

    def _check_took(self, rid: str, seconds: float) -> None:
        told, name = self.on_check_time, self.ledger.driver.state.index.get(rid)
        if told is not None and name is not None:
            told(name, seconds * 1000.0)
