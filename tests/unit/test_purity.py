"""rankcore/ stays side-effect free, and its output does not depend on hash order."""

from __future__ import annotations

import ast
import os
import pathlib
import subprocess
import sys

import rankcore

BANNED = {"ray", "torch", "time", "random", "os", "asyncio", "threading", "subprocess", "socket", "numpy"}
# The one exception: persistent.py takes a lock around rerooting (thread safety
# of every version, docs/embedding.md); nothing else in rankcore/ may.
ALLOWED = {("base/persistent.py", "threading")}
CORE = pathlib.Path(rankcore.__file__).parent


def test_core_imports_nothing_effectful():
    paths = sorted(CORE.rglob("*.py"))
    assert len(paths) > 40 and CORE / "base" / "persistent.py" in paths  # every plane's folder is read
    for path in paths:
        rel = path.relative_to(CORE).as_posix()
        tree = ast.parse(path.read_text())
        for node in ast.walk(tree):
            names = []
            if isinstance(node, ast.Import):
                names = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                names = [node.module]
            for name in names:
                top = name.split(".")[0]
                assert top not in BANNED or (rel, top) in ALLOWED, f"{rel} imports {name}"


def test_the_lock_is_all_that_threading_gives_the_core():
    """persistent.py uses threading for RLock only: no threads, timers or events."""
    tree = ast.parse((CORE / "base" / "persistent.py").read_text())
    used = {n.attr for n in ast.walk(tree) if isinstance(n, ast.Attribute) and isinstance(n.value, ast.Name) and n.value.id == "threading"}
    assert used == {"RLock"}


SCRIPT = r"""
import rankcore as rc
from rankcore.invariants import reports_from
s = rc.State()
out = []
def go(ev):
    global s
    r = rc.step(s, ev); s = r.state; out.extend(r.commands)
    return r
go(rc.DeploymentApplied(name="app", num_replicas=12, user_config={"m": 1}, has_reconfigure=True))
for i in range(12):
    go(rc.ReplicaPlaced(replica_id=f"app#{i}", node_id=f"node-{i % 5}"))
    go(rc.ReplicaReady(replica_id=f"app#{i}"))
go(rc.ScaleRequested(deployment="app", num_replicas=5))
for c in [c for c in out if isinstance(c, rc.StopReplica)]:
    go(rc.ReplicaStopped(replica_id=c.replica_id))
go(rc.NodeLost(node_id="node-3"))
go(rc.DeploymentApplied(name="app", num_replicas=7, user_config={"m": 2}, has_reconfigure=True))
r = rc.step(rc.State(), reports_from(s))
print(repr(out)); print(repr(r.commands)); print(sorted(s.ranks("app").items()))
"""


def test_same_events_same_commands_across_processes():
    """String hashes differ between processes; commands must not."""
    outs = []
    for seed in ("0", "1", "12345"):
        env = dict(os.environ, PYTHONHASHSEED=seed)
        outs.append(subprocess.run([sys.executable, "-c", SCRIPT], env=env, capture_output=True, text=True, check=True).stdout)
    assert outs[0] == outs[1] == outs[2]
    assert "ReconfigureReplica" in outs[0] and "StopReplica" in outs[0]


def test_core_has_no_bare_assert():
    """An ``assert`` vanishes under ``python -O``: a broken internal rule raises
    InvariantViolation instead (issue 20). rankcore.testing, the property
    machines' helper, asserts what a test expects: it may."""
    found = []
    for path in sorted(CORE.rglob("*.py")):
        if path.name == "testing.py":
            continue
        found += [f"{path.relative_to(CORE)}:{node.lineno}" for node in ast.walk(ast.parse(path.read_text()))
                  if isinstance(node, ast.Assert)]
    assert found == []


def test_a_broken_internal_rule_raises_even_under_python_O():
    code = ("import rankcore as rc\n"
            "from rankcore import static\n"
            "dep = rc.step(rc.State(), rc.DeploymentApplied(name='a', num_replicas=1)).state.deployments['a']\n"
            "try:\n"
            "    static.place(None, dep, 'a#0')\n"
            "except rc.InvariantViolation as e:\n"
            "    print('raised:', e)\n")
    out = subprocess.run([sys.executable, "-O", "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.startswith("raised: a static-placement rule ran on a deployment without static placement")


def test_the_core_installs_and_imports_without_the_command_line_s_libraries():
    """``pip install rankcore`` is attrs, immutables and transitions (issue 66): click, rich and
    PyYAML are the ``cli`` extra (the command line, the scenario files), and the core's public
    modules load none of them."""
    import tomllib

    project = tomllib.loads((CORE.parent / "pyproject.toml").read_text())["project"]
    names = {d.split(">")[0].split("=")[0].strip().lower() for d in project["dependencies"]}
    assert names == {"attrs", "immutables", "transitions"}
    assert {"click>=8.1", "rich>=13", "pyyaml>=6"} <= set(project["optional-dependencies"]["cli"])
    loaded = subprocess.run(
        [sys.executable, "-c", "import sys, rankcore, rankcore.invariants, rankcore.protocol, rankcore.requests; "
                               "print(sorted({'click', 'rich', 'yaml'} & set(sys.modules)))"],
        capture_output=True, text=True, check=True, cwd=CORE.parent).stdout.strip()
    assert loaded == "[]"
