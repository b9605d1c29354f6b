"""How a restarted Ray controller rebuilds what it held, and tells the core.

Ray restarts the controller actor; the new one answers nothing until it has
recovered (``Recovery.ready``): from what ``persist.py`` saved (the specs,
the id counters, the replica checkpoint, the evicted replicas' replacements
still waiting), the replica actors' own reports and the nodes' WARM caches
(``warm_cache.held_copies``) it builds one ``ControllerRecovered`` event
(ranks are not stored), adopts
the live actors, their groups and the starts under way, and watches them
again. What happens to each replica is the core's decision.
"""

from __future__ import annotations

import asyncio
import logging
import os
from collections.abc import Mapping, Sequence, Set

import ray

import rankcore as rc

from ..base import persist
from ..base.replicas import CREATED, NAMESPACE, RESERVING, ReplicaRecord
from ..weights import warm_cache as wc
from . import placement as pl
from . import static as st
from .carry import Carrier
from .ledger import Ledger
from .observe import Watcher, actor_info
from .record import Recorder

log = logging.getLogger("rankcore.ray.controller")


class Recovery:
    #: how long a recovering controller waits for a replica's report; one that has
    #: not answered by then is reported unresponsive (``RANKCORE_REPORT_TIMEOUT_S``)
    report_timeout_s = float(os.environ.get("RANKCORE_REPORT_TIMEOUT_S", "30"))

    def __init__(self, ledger: Ledger, watcher: Watcher, carrier: Carrier, recorder: Recorder) -> None:
        self.ledger = ledger
        self.watcher = watcher
        self.carrier = carrier
        self.recorder = recorder
        self.done = False  # recovered (or nothing to recover): the controller may answer
        self._lock: asyncio.Lock | None = None
        ledger.driver.observers.append(self._save_no_evict)

    @staticmethod
    def _save_no_evict(t: float, event: object, before: rc.State, result: rc.Step) -> None:
        """Persist ``rc.query.desired_no_evict`` whenever a step changes it (an eviction starts a
        replacement in any step, not only on a call that saves the specs)."""
        if result.state.cluster.no_evict is not before.cluster.no_evict:
            persist.save_no_evict(result.state)

    async def ready(self) -> None:
        """After a restart (Ray restarts this actor), rebuild ranks from the
        replicas' own reports before answering anything."""
        if self.done:
            return
        if self._lock is None:
            self._lock = asyncio.Lock()
        async with self._lock:
            if self.done:
                return
            specs = persist.load_specs()
            recording = persist.recording()
            if recording is not None:  # continue the trace after a restart
                self.recorder.start(None, header=False, snapshot_every=recording)
            named = self.recorder.write_queued_faults()  # what happened while no controller ran
            if specs is not None or persist.load_proxies() is not None:  # (proxies alone: adopted too)
                await self.recover(specs if specs is not None else {}, named)
            else:  # a fresh controller: the core learns the nodes before any deployment
                self.watcher.sync_nodes()
            self.done = True

    async def recover(self, specs: dict, named: Set[str] = frozenset()) -> None:
        """Rebuild the ranks from the replicas' own reports (ranks are not
        stored), and the core's view of the cluster from ``ray.nodes()``.
        Replicas whose start was under way are adopted with their global
        rank: an actor not yet initialised is reported pending on its node
        (the core initialises it), one whose ``__init__`` runs is reported
        starting (and answered ready when it finishes), and one with no actor
        yet (checkpoint stage ``reserving``: waiting for a node, or for its
        group) is reported pending on no node: its old group is removed and
        the core places it again (a new ``PlaceReplica``). Only replicas that
        died are replaced; each checkpointed one that is gone gets a ``replica_lost``
        fault record (unless ``named``, the faults queued meanwhile, already
        name it). Every live replica actor found is reported, those of
        deployments the specs do not name too (the core stops them:
        ``stop_unknown``; the controller kills nothing on its own); one that
        does not answer its report within ``report_timeout_s`` is reported
        ``unresponsive`` (the core stops it before giving its rank away)."""
        from ray.exceptions import RayActorError

        led = self.ledger
        nodes = self.watcher.alive_nodes()  # (first: a GCS hiccup here leaves nothing half done)
        started, lineages = persist.load_counters()
        known = persist.load_replicas()
        led.specs = {name: {k: v for k, v in spec.items() if k != "applied"} for name, spec in specs.items()}
        desired = {name: spec["applied"] for name, spec in specs.items()}  # rc.query.desired_specs, as persisted
        alive = {n.node_id for n in nodes}
        for name, spec in led.specs.items():  # where the caller's group's bundles are now
            held = desired[name].static_placement
            if spec.get("static") is not None and held is not None:
                try:
                    where = st.bundle_nodes(spec["static"].placement_group, alive)
                except Exception as exc:  # the group is gone, say
                    log.warning("could not read placement group of %r: %r", name, exc)
                    continue
                desired[name] = desired[name].replace(static_placement=held.with_nodes(where))
        names = [a["name"] for a in ray.util.list_named_actors(all_namespaces=True)
                 if a.get("namespace") == NAMESPACE and a["name"].startswith("ModelActor:")]

        async def ask_report(name: str) -> tuple:
            try:
                actor = ray.get_actor(name, namespace=NAMESPACE)
            except Exception:
                return None, None  # died meanwhile: its rank is a gap the core refills
            try:
                # (an actor still being created answers once it is up)
                return actor, await asyncio.wait_for(actor.report.remote(), timeout=self.report_timeout_s)
            except asyncio.TimeoutError:
                return actor, None  # alive but silent: unresponsive
            except RayActorError:
                return None, None  # died meanwhile
            except Exception as exc:  # its report failed: its rank is unknown
                log.warning("replica actor %s did not report: %r", name, exc)
                return actor, None

        reports, starting, requeued, silent = [], [], [], []
        for name, (actor, r) in zip(sorted(names), await asyncio.gather(*(ask_report(n) for n in sorted(names)))):
            if actor is None:
                continue
            rank = r["rank"] if r is not None else None
            grank = rank[0] if rank is not None else r.get("global_rank") if r is not None else None
            if r is None or grank is None:  # no rank known: the core stops it before any rank is reused
                dep, _, rid = name[len("ModelActor:"):].partition(":")
                info = actor_info(actor)
                node = ((info or {}).get("Address") or {}).get("NodeID") or None
                silent.append(rc.UnresponsiveReplica(replica_id=rid, deployment=dep, node_id=node))
                led.replicas[rid] = ReplicaRecord(deployment=dep, checkpointed=False, stage=CREATED, actor=actor)
                led.starting_at(rid, node)
                continue
            rid, dep = r["replica_id"], r["deployment"]
            if rank is None:  # created, placed, never initialised: the core initialises it
                phase, claim, config = "pending", grank, rc.UNKNOWN
                reserved = r.get("reserved")
                if reserved and reserved[0] == r["node_id"]:  # the ranks its placement reserved there: kept
                    claim = {"rank": grank, "node_rank": reserved[1], "local_rank": reserved[2]}
            else:
                phase, claim = r["phase"], {"rank": rank[0], "node_rank": rank[1], "local_rank": rank[2]}
                config = r["user_config"]
            reports.append(rc.ReplicaReport(
                replica_id=rid, deployment=dep, node_id=r["node_id"], phase=phase, rank=claim,
                world_size=r["world_size"], version=r["version"], user_config=config, lineage=r["lineage"],
                revision=r.get("revision") or None,  # (None: not said, taken as the current one)
                tier=r.get("tier", "hot"), weights_version=r.get("weights_version", 0),
                devices=tuple(r.get("devices", ())) if r.get("tier", "hot") == "hot" else (),
                models=tuple(r.get("models", ())),  # (its multiplexed models: routers route by them again)
                **_group_fields(r.get("group")),  # (its collective group's epoch: the core's again)
            ))
            if dep not in led.specs:  # not ours: the core stops it (drained as any replica)
                led.replicas[rid] = ReplicaRecord(deployment=dep, checkpointed=False, stage=CREATED, actor=actor,
                                                  initialized=True)
                continue
            led.replicas[rid] = ReplicaRecord(deployment=dep, global_rank=grank, lineage=r["lineage"],
                                              world_size=r["world_size"], stage=CREATED, actor=actor,
                                              revision=r.get("revision") or "",
                                              initialized=phase not in ("starting", "pending"))
            led.starting_at(rid, r["node_id"] if phase in ("starting", "pending") else None)
            led.models_seq[rid] = int(r.get("models_seq", 0))  # (its models are in its report: the core's)
            if phase == "starting":
                starting.append((rid, actor))
        lost = []
        for rid, k in sorted(known.items()):
            if led.actor(rid) is not None:
                continue
            if k["stage"] == RESERVING and k["deployment"] in led.specs:
                # no actor yet: adopted (same id, rank, lineage); the core places it again
                reports.append(rc.ReplicaReport(
                    replica_id=rid, deployment=k["deployment"], node_id=None, phase="pending",
                    rank=k["global_rank"], world_size=k["world_size"], lineage=k["lineage"]))
                led.replicas[rid] = ReplicaRecord.from_checkpoint(k)
                requeued.append(rid)
            elif rid not in named:
                lost.append((rid, k["deployment"]))
        warm = await self.warm_copies(nodes, desired)
        led.checkpoint()
        self.adopt_placement_groups()
        led.started, led.lineages = started, lineages
        now = led.now()
        # stop_unknown: the specs are persisted on every change (persist.save_specs), so a replica
        # of a deployment they do not name is a leftover (a reset, a deleted deployment)
        event = rc.ControllerRecovered(deployments=tuple(desired[n] for n in sorted(desired)),
                                       reports=tuple(reports), next_replica_number=started,
                                       next_lineage=lineages, nodes=tuple(nodes), stop_unknown=True,
                                       unresponsive=tuple(silent), asleep=persist.load_asleep(),
                                       weights_versions=persist.load_weights_versions(), warm_copies=warm,
                                       no_evict=persist.load_no_evict(), deleted=persist.load_deleted(),
                                       **await self.carrier.proxies.recovered())
        trace = led.driver.trace
        if trace is not None:
            for rid, dep in lost:
                trace.fault(now, "replica_lost", replica=rid, deployment=dep,
                            reason="gone when the controller recovered")
            trace.fault(now, "controller_recovered", reports=len(reports),
                        resumed=sorted(requeued), lost=[rid for rid, _ in lost],
                        unresponsive=sorted(u.replica_id for u in silent), unknown=event.unknown_ids())
        led.nodes = {n.node_id: n.resources for n in nodes}
        self.carrier.recovered()  # (before the event: the stops it orders wait for the routers)
        led.feed(event)
        state = led.driver.state
        self.carry_on_stops(state)
        # Watch only now: a replica that died while the others reported is then
        # a crash the core knows what to do with (before, it would be ignored).
        for rid in requeued:  # (no actor yet: it starts on the specs read, the revision the core holds for it)
            rec = led.replicas[rid]
            d = state.deployments.get(rec.deployment)
            rep = d.replicas.get(rid) if d is not None else None
            if rep is not None:
                rec.revision = rep.revision
        for rid, rec in sorted(led.with_actors(), key=lambda e: e[0]):
            led.spawn(self.watcher.watch(rid, rec.actor))
            d = state.deployments.get(rec.deployment)
            rep = d.replicas.get(rid) if d is not None else None
            if rep is not None and rep.phase in (rc.Phase.RUNNING, rc.Phase.RECONFIGURING):
                self.watcher.start_checks(rid, rec.actor)
        for rid, actor in starting:
            led.spawn(self.carrier.await_started(rid, actor))

    def carry_on_stops(self, state: rc.State) -> None:
        """Carry on the stops the dead controller had begun: a replica that reported itself stopping
        is STOPPING in the core, which waits for its ``ReplicaStopped``, but only a controller ends
        its process. Each is stopped as a ``StopReplica`` of its deployment's options would stop it
        (``Carrier.stop_now``: drained again, ``graceful_shutdown_wait_loop_s`` first, while the
        routers take this controller's pool, where it is draining; then killed, ``ReplicaStopped``).
        Without it the replica was watched as a serving one, its watch call returned once the old
        drain ended, and that was taken for its death: a ``ReplicaCrashed`` ("actor died (exited)")
        of a live replica, killed then with no drain of this controller's
        (tests/integration/test_ray_controller_kills.py). A replica the recovery's step stopped is
        being stopped already."""
        led = self.ledger
        for rid, rec in sorted(led.with_actors(), key=lambda e: e[0]):
            if rid in led.stopping:
                continue
            d = state.deployments.get(rec.deployment)
            if d is None:
                continue
            rep = d.replicas.get(rid)
            if rep is None or rep.phase is not rc.Phase.STOPPING:
                continue
            o = d.config.shutdown
            self.carrier.stop_now(rc.StopReplica(
                replica_id=rid, deployment=d.name, graceful_shutdown_wait_loop_s=o.graceful_shutdown_wait_loop_s,
                graceful_shutdown_timeout_s=o.graceful_shutdown_timeout_s))

    async def warm_copies(self, nodes: Sequence[rc.NodeJoined],
                          desired: Mapping[str, rc.DeploymentApplied]) -> tuple[rc.WarmCopy, ...]:
        """The WARM copies the caches of the nodes that declared devices hold (in the order they
        came), so the core keeps using them (and does not evict back for an evicted model's
        replacement). Each is given in the core's bytes: what it booked for that copy, the
        deployment's ``model_bytes`` over its GPUs (the cache's real bytes may differ: the core's
        CPU-cache budget counts the declared size); a copy of a deployment with no declared size
        counts its real bytes."""
        held = await wc.held_copies([n.node_id for n in nodes if n.devices], self.report_timeout_s)
        copies = []
        for node_id, dep, rid, real in held:
            spec = desired.get(dep)
            if spec is not None and spec.model_bytes:
                gpus = int(dict(spec.resources).get("GPU") or 1)
                booked = rc.tiers.device_bytes(spec.config.tier)  # (as the core booked it: per device, on each)
                real = -(-booked // gpus) * gpus
            copies.append(rc.WarmCopy(node_id=node_id, deployment=dep, replica_id=rid, nbytes=real))
        if copies:
            log.info("recovered %d WARM cop%s: %s", len(copies), "y" if len(copies) == 1 else "ies",
                     ", ".join(f"{c.deployment}/{c.replica_id}@{c.node_id}" for c in copies))
        return tuple(copies)

    def adopt_placement_groups(self) -> None:
        """Take back the groups of the replicas found alive; remove every other
        ``rankcore:`` group (its replica died, or had no actor yet, while no
        controller ran: the core places such a replica again, on a new group)."""
        from ray._raylet import PlacementGroupID
        from ray.util.placement_group import PlacementGroup

        led = self.ledger
        mine = {pl.pg_name(rec.deployment, rid): rid for rid, rec in led.with_actors()}
        for pg_id, info in ray.util.placement_group_table().items():
            name = info.get("name") or ""
            if not name.startswith("rankcore:") or info.get("state") == "REMOVED":
                continue
            pg = PlacementGroup(PlacementGroupID(bytes.fromhex(pg_id)))
            rid = mine.get(name)
            rec = led.replicas.get(rid) if rid is not None else None
            if rec is not None and rec.pg is None:
                rec.pg = pg
            else:
                try:
                    ray.util.remove_placement_group(pg)
                except Exception:  # gone meanwhile
                    pass


def _group_fields(group: dict | None) -> dict:
    """A replica report's collective-group fields (``ReplicaActor.report``'s ``group``)."""
    if not group:
        return {}
    return {"group_id": group["group_id"], "group_epoch": group["epoch"], "group_members": tuple(group["members"])}
