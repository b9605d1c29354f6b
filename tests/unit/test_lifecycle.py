"""The lifecycle table is the declaration; illegal transitions raise naming both sides."""

from __future__ import annotations

import pytest

from rankcore import InvalidEvent
from rankcore.base.lifecycle import DECLARATION, TABLE, TERMINAL, Phase, Trigger, advance, mermaid


def test_table_equals_declaration():
    declared = {(src, trig): dst for trig, sources, dst in DECLARATION for src in sources}
    assert declared == TABLE


def test_every_undeclared_pair_raises_naming_phase_and_trigger():
    for phase in Phase:
        for trigger in Trigger:
            if (phase, trigger) in TABLE:
                assert advance(phase, trigger) is TABLE[phase, trigger]
            else:
                with pytest.raises(InvalidEvent) as err:
                    advance(phase, trigger, "app#3")
                msg = str(err.value)
                assert phase.value in msg and trigger.value in msg and "app#3" in msg


def test_terminal_phases_have_no_way_out():
    assert all(src not in TERMINAL for src, _ in TABLE)


def test_seed_state_diagram_paths():
    """No rank -> assigned on start; crash from any live phase; release only via stopped."""
    path = [Trigger.PLACED, Trigger.READY, Trigger.RECONFIGURE, Trigger.RECONFIGURED, Trigger.STOP, Trigger.STOPPED]
    phase = Phase.PENDING
    for t in path:
        phase = advance(phase, t)
    assert phase is Phase.STOPPED
    for p in (Phase.PENDING, Phase.STARTING, Phase.RUNNING, Phase.RECONFIGURING, Phase.STOPPING):
        assert advance(p, Trigger.CRASH) is Phase.CRASHED
    assert [src for (src, t) in TABLE if t is Trigger.STOPPED] == [Phase.STOPPING]


def test_mermaid_is_rendered_from_the_declaration():
    text = mermaid()
    assert "stateDiagram-v2" in text
    drawn = set()
    for line in text.splitlines():
        if "-->" in line and ":" in line:
            edge, labels = line.split(":", 1)
            src, dst = (x.strip() for x in edge.split("-->"))
            drawn.update((src, dst, t.strip()) for t in labels.split("|"))
    declared = {(src.value, dst.value, trig.value) for trig, sources, dst in DECLARATION for src in sources}
    assert drawn == declared


def test_phase_repr_is_valid_python():
    assert eval(repr(Phase.RUNNING), {"Phase": Phase}) is Phase.RUNNING
