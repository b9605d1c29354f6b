"""The controller's loops and the observers of the core's steps: what runs on its own in the
controller actor, apart from its remote methods (``controller.py``, the actor's face; issue 66).

* ``_cluster_loop``: every ``node_poll_s`` the cluster's nodes, the static groups' bundles and the
  time told to the core, the nodes' spare processes topped up now and then;
* ``_autoscale_loop``: every autoscaled deployment's ``AutoscalingMetrics`` from the routers' load;
* the driver's observers: the Prometheus metrics (``_start_metrics``), the recent faults
  (``_note_fault``), the pools' versions the routers' long polls wait on (``_count_pool``), a
  deleted deployment's leftovers (``_forget_deleted``);
* ``_ready``: the loops started, and a restart's recovery awaited before any answer.
"""

from __future__ import annotations

import asyncio
import logging
import math
import time
from collections import deque
from collections.abc import Callable

import attrs

import rankcore as rc

from ...driver import Driver
from ..base import persist
from ..base.autoscale import LoadBook
from ..base.metrics import ControllerMetrics
from .carry import Carrier
from .ledger import Ledger
from .observe import Watcher
from .record import Recorder
from .recover import Recovery

__all__ = ["ControllerLoops", "FAULTS_KEPT", "FAULT_EVENTS"]

log = logging.getLogger("rankcore.ray.controller")

#: how many recent faults ``recent_faults`` keeps (``rankcore status``)
FAULTS_KEPT = 50
#: the events that are faults (``rankcore status``'s recent faults)
FAULT_EVENTS = (rc.ReplicaCrashed, rc.NodeLost, rc.HealthChecked, rc.PlacementFailed)


class ControllerLoops:
    """What the controller does on its own; its state is set by ``Controller.__init__``."""

    # Observation details only (docs/architecture.md, "what is left in
    # executors/"): how often the controller looks at Ray. Every decision
    # (health, timeouts, backoff, drains) comes from the core's commands.
    # (The others: ``Watcher.death_batch_s``, ``Carrier.group_poll_s``,
    # ``Recovery.report_timeout_s``.)
    #: seconds between two readings of Ray's node table (joined, changed, lost nodes)
    node_poll_s = 2.0
    ledger: Ledger
    recorder: Recorder
    watcher: Watcher
    carrier: Carrier
    recovery: Recovery
    loads: LoadBook
    metrics: ControllerMetrics
    faults: deque[dict]
    _pool_versions: dict[str, int]
    _pool_changed: asyncio.Event | None
    _spares_checked: float
    _cluster_task: asyncio.Task | None
    _autoscale_task: asyncio.Task | None

    def _start_metrics(self) -> ControllerMetrics:
        """Prometheus metrics (``metrics.ControllerMetrics``): told every step (a driver observer),
        every health check's time (the watcher's) and every weights move carried out (beside the
        recorder, which is told them too)."""
        import ray

        actor_id = ray.get_runtime_context().get_actor_id() if ray.is_initialized() else None
        metrics = ControllerMetrics(actor_id=actor_id or "")
        self.ledger.driver.observers.append(metrics.observe)
        self.watcher.on_check_time = metrics.health_checked
        self.carrier.proxies.on_stopped = metrics.proxy_stopped
        metrics.node_ip = _node_ips()
        recorder_told = self.ledger.on_transfer

        def transferred(deployment: str, what: str, nbytes: int) -> None:
            metrics.transferred(deployment, what, nbytes)
            if recorder_told is not None:
                recorder_told(deployment, what, nbytes)

        self.ledger.on_transfer = transferred
        return metrics

    @property
    def driver(self) -> Driver:
        return self.ledger.driver

    def _persist(self) -> None:
        """Save what a restarted controller recovers from (``persist.save_specs``: with the deployments
        meant to sleep and their weights versions) and the id counters."""
        persist.save_specs(self.driver.state, self.ledger.specs)
        persist.save_counters(self.ledger.started, self.ledger.lineages)

    async def _ready(self) -> None:
        """Start looking at the cluster; after a restart (Ray restarts this
        actor), recover before answering anything (``Recovery.ready``)."""
        if self._cluster_task is None:
            self._cluster_task = asyncio.get_event_loop().create_task(self._cluster_loop())
        if self._autoscale_task is None:
            self._autoscale_task = asyncio.get_event_loop().create_task(self._autoscale_loop())
        await self.recovery.ready()

    async def _cluster_loop(self) -> None:
        """Every ``node_poll_s``: tell the core the cluster's nodes (joined,
        changed, lost), where static deployments' bundles are, and the time;
        top up the nodes' spare processes now and then. (Health checks are per
        replica: ``Watcher.health_checks``.)"""
        led = self.ledger
        while True:
            await asyncio.sleep(self.node_poll_s)
            if not self.recovery.done or led.halted:
                continue
            began = time.perf_counter()
            if led.nodes:  # (after a reset, the next apply() tells the core the nodes first)
                try:
                    self.watcher.sync_nodes()
                    self.watcher.sync_bundles()
                except Exception as exc:  # GCS hiccup: next pass
                    log.warning("could not read the cluster's nodes: %r", exc)
            led.feed(rc.Tick(now=led.now()))
            self.metrics.loop(time.perf_counter() - began)
            now = time.monotonic()
            if now >= self._spares_checked + led.spares.check_s:
                self._spares_checked = now
                for node in list(led.spares.wanted):
                    self.carrier.top_up_spares(node)

    async def _autoscale_loop(self) -> None:
        """Every autoscaled deployment's ``metrics_interval_s`` (the core's config): one
        ``AutoscalingMetrics`` of the routers' summed load (``autoscale.LoadBook``); none while
        the controller recovers or is halted (autoscaling pauses, the routers keep routing)."""
        while True:
            await asyncio.sleep(self.loads.wait_s(time.monotonic()))
            if not self.recovery.done or self.ledger.halted:
                continue
            now = time.monotonic()
            for name, interval in self.loads.due(self.driver.state, now):
                self._feed_load(name, now, interval)

    def _feed_load(self, name: str, now: float, interval: float) -> None:
        queued, ongoing = self.loads.sample(name, now, interval)
        before = self.driver.state.deployments.get(name)
        self.ledger.feed(rc.AutoscalingMetrics(deployment=name, now=self.ledger.now(), queued=queued,
                                               ongoing=ongoing))
        after = self.driver.state.deployments.get(name)
        if before is not None and after is not None and after.target != before.target:
            self._persist()  # (the autoscaled target survives a restart: rankcore.query.desired_specs)

    def _note_fault(self, t: float, event: object, before: rc.State, result: rc.Step) -> None:
        """Keep the latest fault events the core took (crashes, lost nodes, failed health checks
        and placements), as what was observed: ``recent_faults``."""
        if not isinstance(event, FAULT_EVENTS) or (isinstance(event, rc.HealthChecked) and event.healthy):
            return
        fields = {k: v for k, v in attrs.asdict(event, recurse=False).items() if k != "now"}
        self.faults.append({"t": round(t, 3), "event": type(event).__name__, **fields})

    def _forget_deleted(self, t: float, event: object, before: rc.State, result: rc.Step) -> None:
        """A deleted deployment's record left the core in this step (its last replica stopped):
        its class and options go too, and what a restarted controller recovers from is saved."""
        after = result.state.deployments
        if len(after) >= len(before.deployments):
            return
        for name in [n for n in before.deployments if n not in after]:
            self.ledger.specs.pop(name, None)
            self.ledger.spawn(self.carrier.caches.remove_cold(name))  # (its COLD files: no one reads them now)
            self._pool_versions[name] = self._pool_versions.get(name, 0) + 1
        self._wake_pools()
        self._persist()

    def _count_pool(self, t: float, event: object, before: rc.State, result: rc.Step) -> None:
        """A step's pool commands (``Step.pool``): bump each named deployment's version, wake the
        routers' long polls (``pool_after``)."""
        if not result.pool:
            return
        for cmd in result.pool:
            self._pool_versions[cmd.deployment] = self._pool_versions.get(cmd.deployment, 0) + 1
        self._wake_pools()

    def _wake_pools(self) -> None:
        changed, self._pool_changed = self._pool_changed, None
        if changed is not None:
            changed.set()


def _node_ips(every_s: float = 5.0) -> Callable[[str], str]:
    """node id -> its IP address, from ``ray.nodes()``: read again for a node not known yet, at most
    every ``every_s`` ("" for one Ray does not list, or outside Ray)."""
    known: dict[str, str] = {}
    read = -math.inf

    def ip(node_id: str) -> str:
        nonlocal read
        if node_id not in known and time.monotonic() - read >= every_s:
            read = time.monotonic()
            import ray

            if ray.is_initialized():
                known.update({n["NodeID"]: n.get("NodeManagerAddress", "") for n in ray.nodes()})
        return known.get(node_id, "")
    return ip
