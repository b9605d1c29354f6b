"""The replica lifecycle, declared once and compiled to a dict.

The declaration below is the single source of truth. At import it is loaded
into one ``transitions.Machine`` (which validates it: every source and
destination must be a declared phase) and compiled to ``TABLE``, a plain
``(phase, trigger) -> phase`` dict: a lookup costs ~0.1 µs where a
transition through the library costs ~15 µs, and one Machine per replica
would cost ~0.5 ms and 20 KB each. Diagrams are rendered from the same
declaration (``rankcore diagram``), never drawn by hand.

Every phase a rule gives a replica comes from here: ``advance`` (or, on the
fast paths, a ``TABLE`` entry read once), or ``INITIAL`` for a new replica.
A crash's CRASHED and a stop's STOPPED are checked by ``advance`` and the
record leaves the state in the same step (tests/unit/test_lifecycle.py).

Internal module: import its public names from ``rankcore`` (docs/embedding.md,
"What you may import").
"""

from __future__ import annotations

import enum
from typing import Any

from transitions import Machine

from .errors import InvalidEvent

__all__ = ["Phase", "Trigger", "DECLARATION", "TABLE", "INITIAL", "LIVE", "advance", "mermaid", "graph_machine",
           "Residency", "TierTrigger", "TIER_DECLARATION", "TIER_TABLE", "advance_tier"]


class Phase(str, enum.Enum):
    """Where a replica is in its life (adjectives, like h11's states)."""

    PENDING = "pending"  # start commanded, not yet on a node; holds a global rank
    STARTING = "starting"  # placed on a node and initialising; holds all three ranks
    RUNNING = "running"  # ready and serving
    RECONFIGURING = "reconfiguring"  # serving, a reconfigure not yet acknowledged
    STOPPING = "stopping"  # stop commanded; ranks held until it has fully stopped
    STOPPED = "stopped"  # terminal: ranks released
    CRASHED = "crashed"  # terminal: global rank handed to the replacement, if any
    FAILED = "failed"  # static placement: a bundle's node was lost; holds its global rank, not replaced

    def __repr__(self) -> str:
        return f"Phase.{self.name}"

    __str__ = enum.Enum.__str__


class Trigger(str, enum.Enum):
    """What moves a replica: an executor's answer or the core's own command."""

    PLACED = "placed"
    READY = "ready"
    RECONFIGURE = "reconfigure"
    RECONFIGURED = "reconfigured"
    STOP = "stop"
    STOPPED = "stopped"
    BUNDLE_LOST = "bundle_lost"
    RESTART = "restart"
    CRASH = "crash"

    def __repr__(self) -> str:
        return f"Trigger.{self.name}"


P, T = Phase, Trigger
_ALIVE = [P.PENDING, P.STARTING, P.RUNNING, P.RECONFIGURING]

#: The lifecycle: (trigger, sources, destination). Answers that race with a
#: stop (placed / ready / reconfigured arriving after StopReplica was sent)
#: are accepted and change nothing: the stop wins.
DECLARATION: tuple[tuple[Trigger, tuple[Phase, ...], Phase], ...] = (
    (T.PLACED, (P.PENDING,), P.STARTING),
    (T.PLACED, (P.STOPPING,), P.STOPPING),
    (T.READY, (P.STARTING,), P.RUNNING),
    (T.READY, (P.STOPPING,), P.STOPPING),
    (T.RECONFIGURE, (P.RUNNING, P.RECONFIGURING), P.RECONFIGURING),
    (T.RECONFIGURED, (P.RECONFIGURING,), P.RUNNING),
    (T.RECONFIGURED, (P.STOPPING,), P.STOPPING),
    (T.STOP, tuple(_ALIVE), P.STOPPING),
    (T.STOPPED, (P.STOPPING,), P.STOPPED),
    (T.CRASH, (*_ALIVE, P.STOPPING), P.CRASHED),
    (T.BUNDLE_LOST, tuple(_ALIVE), P.FAILED),
    (T.RESTART, (P.FAILED,), P.CRASHED),
)

INITIAL = P.PENDING
TERMINAL = frozenset({P.STOPPED, P.CRASHED})
#: Phases in which a replica holds ranks (and counts in the state).
LIVE: tuple[Phase, ...] = (P.PENDING, P.STARTING, P.RUNNING, P.RECONFIGURING, P.STOPPING, P.FAILED)


def _machine_kwargs(states: Any = Phase, declaration: Any = DECLARATION, initial: Any = INITIAL) -> dict[str, Any]:
    return dict(
        states=[p.value for p in states],
        transitions=[
            {"trigger": t.value, "source": [s.value for s in src], "dest": dst.value}
            for t, src, dst in declaration
        ],
        initial=initial.value,
        auto_transitions=False,
        send_event=False,
    )


def _compile(states: Any = Phase, triggers: Any = Trigger, declaration: Any = DECLARATION,
             initial: Any = INITIAL) -> dict:
    """Validate a declaration with ``transitions`` and flatten it to a dict."""
    machine = Machine(model=None, **_machine_kwargs(states, declaration, initial))
    table: dict = {}
    for trigger, event in machine.events.items():
        for source, transitions_ in event.transitions.items():
            for tr in transitions_:
                key = (states(source), triggers(trigger))
                if key in table:
                    raise ValueError(f"lifecycle: {key} is declared twice")
                table[key] = states(tr.dest)
    return table


TABLE: dict[tuple[Phase, Trigger], Phase] = _compile()


class Residency(str, enum.Enum):
    """Where a live replica's weights are (docs/tiers.md): a second coordinate
    beside its phase, so a replica can be running and asleep."""

    HOT = "hot"  # on its GPU (serving, once running)
    OFFLOADING = "offloading"  # OffloadReplica sent: going to CPU memory, process and ranks kept
    WARM = "warm"  # asleep: in its process's CPU memory, GPU memory free for others
    LOADING = "loading"  # LoadReplica sent: going back to its GPU

    def __repr__(self) -> str:
        return f"Residency.{self.name}"

    __str__ = enum.Enum.__str__


class TierTrigger(str, enum.Enum):
    """What moves a replica between tiers: the core's command or the executor's answer."""

    SLEEP = "sleep"
    WAKE = "wake"
    MOVED = "moved"
    MOVE_FAILED = "move_failed"

    def __repr__(self) -> str:
        return f"TierTrigger.{self.name}"


R, TT = Residency, TierTrigger
#: sleep and wake (issue 21): a failed move leaves the weights where they were
TIER_DECLARATION: tuple[tuple[TierTrigger, tuple[Residency, ...], Residency], ...] = (
    (TT.SLEEP, (R.HOT,), R.OFFLOADING),
    (TT.MOVED, (R.OFFLOADING,), R.WARM),
    (TT.MOVE_FAILED, (R.OFFLOADING,), R.HOT),
    (TT.WAKE, (R.WARM,), R.LOADING),
    (TT.MOVED, (R.LOADING,), R.HOT),
    (TT.MOVE_FAILED, (R.LOADING,), R.WARM),
)
TIER_TABLE: dict[tuple[Residency, TierTrigger], Residency] = _compile(Residency, TierTrigger, TIER_DECLARATION, R.HOT)


def advance_tier(residency: Residency, trigger: TierTrigger, replica: object = None) -> Residency:
    """The next residency, or :class:`InvalidEvent` naming where it is and what came."""
    try:
        return TIER_TABLE[residency, trigger]
    except KeyError:
        raise _not_allowed(TIER_TABLE, residency, trigger, replica) from None


def advance(phase: Phase, trigger: Trigger, replica: object = None) -> Phase:
    """The next phase, or :class:`InvalidEvent` naming the phase and trigger."""
    try:
        return TABLE[phase, trigger]
    except KeyError:
        raise _not_allowed(TABLE, phase, trigger, replica) from None


def _not_allowed(table: dict, state: Any, trigger: Any, replica: object) -> InvalidEvent:
    """The error for a trigger ``table`` has no move for from ``state``, naming what it allows."""
    who = f"replica {replica!r} " if replica is not None else ""
    allowed = sorted(t.value for (s, t) in table if s is state)
    return InvalidEvent(f"{who}is {state.value}: '{trigger.value}' is not allowed "
                        f"(allowed: {', '.join(allowed) or 'nothing, the phase is terminal'})")


def graph_machine(engine: str = "mermaid") -> Any:
    """A ``GraphMachine`` of the declaration (``engine``: mermaid or graphviz)."""
    from transitions.extensions import GraphMachine

    class _Model:
        pass

    model = _Model()
    GraphMachine(model=model, graph_engine=engine,  # type: ignore[arg-type]
                 title="replica lifecycle", **_machine_kwargs())
    return model.get_graph()  # type: ignore[attr-defined]


def mermaid() -> str:
    """The lifecycle as mermaid ``stateDiagram-v2`` text (needs no binaries)."""
    return str(graph_machine("mermaid").draw(None))
