"""What the Ray controller records: the trace, the metrics, the faults.

Recording only watches: the trace (docs/trace-format.md) is written by the
driver at every step, the metrics count what happened, and faults injected
by a scenario are written as ``fault`` records (those injected while no
controller ran are queued in the KV store, ``queue_fault``, and written by
the next controller at the time they happened). Nothing here feeds the core.
"""

from __future__ import annotations

import io
import time
from typing import Any

import rankcore as rc

from ..base import persist
from .ledger import Ledger


def queue_fault(type_: str, fields: dict) -> None:
    """Record a fault injected while the controller is down (from any process
    connected to the cluster): the next controller writes it to the trace, at
    the time it happened, before its recovery."""
    persist.push_fault(type_, fields, time.time())


class Recorder:
    def __init__(self, ledger: Ledger) -> None:
        self.ledger = ledger
        self.metrics: Any = None
        self._buf = io.StringIO()
        self._read = 0  # how much of ``_buf`` ``drain`` has handed out
        self._tiers_read = 0  # how much of ``ledger.tier_log`` the metrics counted
        ledger.on_transfer = self._transferred

    def _transferred(self, deployment: str, what: str, nbytes: int) -> None:
        """A weights move carried out (offload, load, update): the metrics count it, as the simulator's."""
        if self.metrics is not None:
            self.metrics.transferred(deployment, what, nbytes)

    def start(self, meta: dict | None, header: bool, snapshot_every: int = 1) -> None:
        """Write a trace from now on (``header``: a new one; else one a
        restarted controller continues), with metrics."""
        from ...scenarios import Metrics
        from ...trace import TraceWriter

        driver = self.ledger.driver
        self._buf = io.StringIO()
        self._read = 0
        driver.trace = TraceWriter(self._buf, meta=meta, header=header, snapshot_every=snapshot_every)
        self.metrics = Metrics()
        self._tiers_read = len(self.ledger.tier_log)
        if self._observe not in driver.observers:
            driver.observers.append(self._observe)

    def _observe(self, t: float, event: object, before: rc.State, result: rc.Step) -> None:
        if self.metrics is not None:
            self.metrics(t, event, before, result)

    def drain(self) -> str:
        """The trace text written since the last call."""
        if self.ledger.driver.trace is None:
            return ""
        text = self._buf.getvalue()
        new, self._read = text[self._read:], len(text)
        return new

    def fault(self, type_: str, fields: dict) -> None:
        """A fault the scenario runner injected, after those queued meanwhile."""
        self.write_queued_faults()
        if self.ledger.driver.trace is not None:
            self.ledger.driver.trace.fault(self.ledger.now(), type_, **fields)

    def write_queued_faults(self) -> set[str]:
        """Write the faults queued (``queue_fault``) while no controller ran, at
        the time each happened; returns the replica ids they name."""
        named = set()
        now = self.ledger.now()
        trace = self.ledger.driver.trace
        for type_, fields, when in persist.take_faults():
            if fields.get("replica"):
                named.add(fields["replica"])
            if trace is not None:
                trace.fault(min(now, max(0.0, when - self.ledger.t0)), type_, **fields)
        return named

    def _count_tier_moves(self) -> None:
        """The tier moves carried out since the last call (``Ledger.tier_log``), counted as the
        simulator counts them: evictions, and each start's load from the WARM copy or from disk
        (``warm_fallbacks``: the core said warm, the copy was not there)."""
        log = self.ledger.tier_log
        if len(log) < self._tiers_read:  # (cleared by a reset)
            self._tiers_read = 0
        for entry in log[self._tiers_read:]:
            if entry["move"] == "evict":
                self.metrics.evicted(entry["deployment"])
            elif entry["move"] == "start":
                warm = entry.get("loaded_from") == "warm"
                self.metrics.loaded(entry["deployment"], "warm" if warm else "cold",
                                    fell_back=entry.get("source") == "warm" and not warm)
        self._tiers_read = len(log)

    def metrics_now(self) -> Any:
        from ...scenarios import Metrics

        if self.metrics is None:
            self.metrics = Metrics()
        self._count_tier_moves()
        self.metrics.advance(self.ledger.now())
        return self.metrics

    def check(self, e: Any) -> Any:
        """One expectation checked against the core's state and the metrics now."""
        from ...scenarios import check_expectation

        return check_expectation(e, self.ledger.driver.state, self.metrics_now(), self.ledger.now())

    def end(self, records: list) -> str:
        """Write the end records (the expectations' ``records``), stop
        recording; returns the trace not drained yet."""
        driver = self.ledger.driver
        if driver.trace is not None:
            driver.trace.end(self.ledger.now(), driver.state, self.metrics_now().as_dict(), records)
        text = self.drain()
        driver.trace = None
        persist.clear_recording()
        return text
