"""The loop every executor shares: hold the state, step, hand commands to a
backend, write the trace, tell observers.

The simulator and the Ray executor differ only in their backend (what
carrying out a command means and how answers come back), which is what lets
one scenario give the same rank history on both.
"""

from __future__ import annotations

import gc
from collections.abc import Callable, Sequence
from typing import Protocol

import attrs

import rankcore as rc
from rankcore.invariants import check_step

from .trace import TraceWriter

__all__ = ["Backend", "Driver", "FREEZE_MIN_CHANGE"]

#: Replicas the state must have gained or lost since the last freeze before the
#: driver freezes again (and at least a quarter of the size at that freeze).
FREEZE_MIN_CHANGE = 10_000


#: Events whose step may start a timer on the core's clock (a placement or start
#: deadline, a failed placement's retry, a restart backoff; a crash with
#: ``cause="exited"``): the clock must be up to date for these only,
#: so a run does not take a Tick step per event. Deadlines fire by the
#: ScheduleTick the core sends.
#: These carry the time themselves (``now``): the core moves its clock in the same step.
_CARRY_NOW = frozenset({rc.ReplicaPlaced, rc.PlacementFailed, rc.ReplicaCrashed, rc.ReplicaStopped,
                        rc.HealthChecked})
#: These are preceded by a Tick step (they are rare): a recovery, and what may place
#: replicas (each PlaceReplica arms a placement deadline on the clock).
_READS_CLOCK = frozenset({rc.ControllerRecovered, rc.DeploymentApplied, rc.ScaleRequested, rc.NodeLost,
                          rc.NodeJoined, rc.NodeCapacityChanged, rc.BundlesPlaced})


class Backend(Protocol):
    def execute(self, commands: Sequence[object], t: float) -> None:
        """Carry out commands (in order); answers come back later through ``Driver.feed``.

        A backend that routes requests may also have ``pool_changed(commands, t)``: it is
        given each step's ``Step.pool`` (``PoolChanged`` / ``PoolComing`` / ``PoolReset``),
        after ``execute``."""


Observer = Callable[[float, object, rc.State, rc.Step], None]


class Driver:
    """Feeds events to ``rankcore.step`` and commands to a backend.

    ``clock=True`` keeps the core's clock up to date for the events that may
    start a timer (start timeouts, suspect nodes and failed-placement retries
    run on it): a ``ReplicaPlaced``, ``PlacementFailed`` or ``ReplicaCrashed``
    is fed with ``now=t`` (the core moves its clock in that same step), a
    ``ControllerRecovered`` after a ``Tick(now=t)``; ``tick(t)`` feeds a Tick
    on its own (for a ``ScheduleTick``).

    ``check=True`` runs every invariant of :mod:`rankcore.invariants` after
    every step (the tests do; it costs O(N) per step).

    ``gc_freeze=True`` (the default) keeps a big state out of the cyclic
    collector's way: a state of N replicas holds ~1.7 N objects the collector
    tracks (replica records and the nodes of their ``immutables.Map``), so
    every generation-2 pass costs O(N) (~170 ms at 100,000 replicas). After
    a step that changed the replica count by at least ``FREEZE_MIN_CHANGE``
    and a quarter since the last freeze, the driver runs one ``gc.collect()``
    and ``gc.freeze()``: what is alive then is never scanned again (it is
    still freed by reference counting when a later state drops it; rankcore's
    states hold no cycles). Turn it off when the process's other objects
    must stay collectable after a freeze (it freezes them too).
    """

    def __init__(
        self,
        backend: Backend,
        *,
        trace: TraceWriter | None = None,
        check: bool = False,
        state: rc.State | None = None,
        gc_freeze: bool = True,
        clock: bool = False,
    ) -> None:
        self.backend = backend
        self.trace = trace
        self.check = check
        self.state = state or rc.State()
        self.observers: list[Observer] = []
        self.steps = 0
        self.gc_freeze = gc_freeze
        self.clock = clock
        self.freezes = 0  # how many times the driver froze the collector's view
        #: the pools as the core's pool commands told them (``rankcore.PoolView``): status pages read it
        self.pools = rc.PoolView()
        self._pool_changed = getattr(backend, "pool_changed", None)
        # the replica counts, outside of which the next freeze is due
        self._freeze_below, self._freeze_from = -FREEZE_MIN_CHANGE, FREEZE_MIN_CHANGE

    def feed(self, event: object, t: float) -> rc.Step:
        if self.clock:
            kind = type(event)
            if kind in _CARRY_NOW:
                if event.now is None:  # type: ignore[attr-defined]
                    event = attrs.evolve(event, now=t)  # type: ignore[misc]
            elif kind in _READS_CLOCK:
                cl = self.state.cluster
                if not cl.clock or t > cl.now:
                    self._step(rc.Tick(now=t), t)
        return self._step(event, t)

    def tick(self, t: float) -> rc.Step:
        """Tell the core the time is ``t`` (an executor's timer for a ScheduleTick)."""
        return self._step(rc.Tick(now=t), t)

    def _step(self, event: object, t: float) -> rc.Step:
        before = self.state
        result = rc.step(before, event)
        if self.check:
            check_step(before, event, result)
        after = self.state = result.state
        self.steps += 1
        if self.gc_freeze and after is not before:
            n = len(after.index)  # every replica the state holds (O(1))
            if n <= self._freeze_below or n >= self._freeze_from:
                self._freeze(n)
        if self.trace is not None:
            self.trace.step(t, event, before, result)
        for obs in self.observers:
            obs(t, event, before, result)
        self.backend.execute(result.commands, t)
        if result.pool:
            for cmd in result.pool:
                self.pools.apply(cmd)
            if self._pool_changed is not None:
                self._pool_changed(result.pool, t)
        return result

    def _freeze(self, n: int) -> None:
        """The state holds ``n`` replicas, far enough from the last freeze: freeze again."""
        gc.collect()
        gc.freeze()
        self.freezes += 1
        change = max(FREEZE_MIN_CHANGE, n // 4)
        self._freeze_below, self._freeze_from = n - change, n + change

    def restart(self) -> None:
        """The controller lost its memory (a crash): the next event must be a recovery."""
        self.state = rc.State()
