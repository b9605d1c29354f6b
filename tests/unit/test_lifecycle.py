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


# ----------------------------------------------------------- every phase written comes from the table
_ROOT = __import__("pathlib").Path(__file__).resolve().parents[2]
#: the replica's phase is written only by the rules; testing.py and invariants.py read it, and
#: control/proxies.py writes a proxy's phase (its own small machine, not the replica lifecycle)
_SKIP = {"rankcore/testing.py", "rankcore/invariants.py", "rankcore/control/proxies.py"}
#: a recovery rebuilds each reported replica's record in the phase its report shows (a reconstruction
#: of a state, not a transition of one): the one function that writes a phase it is handed
_REBUILDS = {("rankcore/control/recovery.py", "_record")}


def _module_names(tree):
    """Module-level ``NAME = value`` (tuples unpacked) of a module."""
    import ast

    out = {}
    for node in tree.body:
        if isinstance(node, ast.Assign) and len(node.targets) == 1:
            t, v = node.targets[0], node.value
            if isinstance(t, ast.Tuple) and isinstance(v, ast.Tuple):
                out.update({n.id: e for n, e in zip(t.elts, v.elts) if isinstance(n, ast.Name)})
            elif isinstance(t, ast.Name):
                out[t.id] = v
    return out


def _from_table(value, names, local) -> bool:
    """Whether ``value`` is a phase the lifecycle gives: ``advance(...)``, a ``TABLE[...]`` read, the
    initial phase (``INITIAL``, ``Phase.PENDING``: a new replica), a local set from one of those, or
    a choice between them."""
    import ast

    if isinstance(value, ast.IfExp):
        return _from_table(value.body, names, local) and _from_table(value.orelse, names, local)
    if isinstance(value, ast.Call) and isinstance(value.func, ast.Name) and value.func.id == "advance":
        return True
    if isinstance(value, ast.Subscript) and isinstance(value.value, ast.Name) and value.value.id == "TABLE":
        return True
    if isinstance(value, ast.Attribute) and isinstance(value.value, ast.Name) and value.value.id == "Phase":
        return value.attr == "PENDING"
    if isinstance(value, ast.Name):
        if value.id in ("INITIAL",):
            return True
        if value.id in local:
            return all(_from_table(v, names, {}) for v in local[value.id])
        if value.id in names:
            return _from_table(names[value.id], names, {})
        return False  # (a name this check cannot trace fails)
    return isinstance(value, ast.Attribute) and value.attr == "phase"  # (a record's own phase, kept)


def _phase_writes():
    """Every place in rankcore/ that gives a record a phase: a ``phase=`` keyword, or the value of a
    phase updater (``updater(Replica, "phase", ...)``: ``_with_phase(rep, X)``)."""
    import ast

    for path in sorted((_ROOT / "rankcore").rglob("*.py")):
        rel = str(path.relative_to(_ROOT))
        if rel in _SKIP:
            continue
        tree = ast.parse(path.read_text())
        names = _module_names(tree)
        updaters = {n for n, v in names.items() if isinstance(v, ast.Call) and isinstance(v.func, ast.Name)
                    and v.func.id == "updater" and len(v.args) > 1 and isinstance(v.args[1], ast.Constant)
                    and v.args[1].value == "phase"}
        for fn in [n for n in ast.walk(tree) if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef))]:
            local: dict = {}
            for n in ast.walk(fn):
                if isinstance(n, ast.Assign) and len(n.targets) == 1 and isinstance(n.targets[0], ast.Name):
                    local.setdefault(n.targets[0].id, []).append(n.value)
            for n in ast.walk(fn):
                if not isinstance(n, ast.Call):
                    continue
                for kw in n.keywords:
                    if kw.arg == "phase" and not ((rel, fn.name) in _REBUILDS and isinstance(kw.value, ast.Name)):
                        yield f"{rel}:{n.lineno}", kw.value, names, local
                if isinstance(n.func, ast.Name) and n.func.id in updaters and len(n.args) > 1:
                    yield f"{rel}:{n.lineno}", n.args[1], names, local


def test_every_phase_a_rule_writes_comes_from_the_lifecycle_table():
    """Issue 66: the table wrote PLACED / READY / RECONFIGURED while a static rank's FAILED and the
    fast paths' STARTING / RUNNING were written as constants. (A crash's CRASHED and a stop's
    STOPPED are checked through ``advance`` and the record leaves the state in the same step.)"""
    seen, bad = 0, []
    for where, value, names, local in _phase_writes():
        seen += 1
        if not _from_table(value, names, local):
            bad.append(where)
    assert seen > 10
    assert bad == []


def test_the_phase_write_check_sees_a_constant(tmp_path):
    import ast

    tree = ast.parse("_RUNNING = Phase.RUNNING\n_READY = TABLE[Phase.STARTING, Trigger.READY]\n")
    names = _module_names(tree)
    for src, ok in [("Phase.FAILED", False), ("_RUNNING", False), ("_READY", True), ("Phase.PENDING", True),
                    ("advance(p, Trigger.STOP)", True), ("Phase.FAILED if x else INITIAL", False)]:
        assert _from_table(ast.parse(src, mode="eval").body, names, {}) is ok, src
