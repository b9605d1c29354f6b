"""The loop every executor shares: hold the state, step, hand commands to a
backend, write the trace, tell observers.

The simulator and the Ray executor differ only in their backend (what
carrying out a command means and how answers come back), which is what lets
one scenario give the same rank history on both.
"""

from __future__ import annotations

from typing import Callable, Protocol, Sequence

import rankcore as rc
from rankcore.invariants import check_step

from .trace import TraceWriter

__all__ = ["Backend", "Driver"]


class Backend(Protocol):
    def execute(self, commands: Sequence[object], t: float) -> None:
        """Carry out commands (in order); answers come back later through ``Driver.feed``."""


Observer = Callable[[float, object, rc.State, rc.Step], None]


class Driver:
    """Feeds events to ``rankcore.step`` and commands to a backend.

    ``check=True`` runs every invariant of :mod:`rankcore.invariants` after
    every step (the tests do; it costs O(N) per step).
    """

    def __init__(
        self,
        backend: Backend,
        *,
        trace: TraceWriter | None = None,
        check: bool = False,
        state: rc.State | None = None,
    ) -> None:
        self.backend = backend
        self.trace = trace
        self.check = check
        self.state = state or rc.State()
        self.observers: list[Observer] = []
        self.steps = 0

    def feed(self, event: object, t: float) -> rc.Step:
        before = self.state
        result = rc.step(before, event)
        if self.check:
            check_step(before, event, result)
        self.state = result.state
        self.steps += 1
        if self.trace is not None:
            self.trace.step(t, event, before, result)
        for obs in self.observers:
            obs(t, event, before, result)
        self.backend.execute(result.commands, t)
        return result

    def restart(self) -> None:
        """The controller lost its memory (a crash): the next event must be a recovery."""
        self.state = rc.State()
