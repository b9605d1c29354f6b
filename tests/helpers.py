"""A tiny in-test executor: answers commands at once, on nodes the test chooses."""

from __future__ import annotations

import functools
import importlib.util
import pathlib
import sys
from collections.abc import Callable, Iterable
from types import ModuleType
from typing import Any

import rankcore as rc
from rankcore.invariants import check_step
from rankcore.protocol import answers


class Driver:
    """Feeds events to the core, answers its commands (optionally holding some
    back), and checks every invariant after every step."""

    def __init__(self, nodes: Iterable[str] = ("n0", "n1"), state: rc.State | None = None) -> None:
        self.nodes = list(nodes)
        self.state = state or rc.State()
        self.turn = 0
        self.commands: list[object] = []
        self.held: list[object] = []  # commands not answered yet
        self.node_for: Callable[[rc.StartReplica], str] | None = None

    def step(self, event: object) -> rc.Step:
        before = self.state
        result = rc.step(before, event)
        check_step(before, event, result, full=True)
        self.state = result.state
        self.commands.extend(result.commands)
        return result

    def answer(self, cmd: object) -> list[object]:
        node = ""
        if isinstance(cmd, rc.StartReplica):
            if self.node_for is not None:
                node = self.node_for(cmd)
            else:
                node = self.nodes[self.turn % len(self.nodes)]
                self.turn += 1
        return answers(cmd, node)

    def run(self, event: object, hold: Callable[[object], bool] = lambda c: False) -> list[object]:
        """Apply ``event`` and answer every resulting command (transitively),
        except those ``hold`` keeps back in ``self.held``. Returns all commands."""
        out: list[object] = []
        queue = [event]
        while queue:
            result = self.step(queue.pop(0))
            for cmd in result.commands:
                out.append(cmd)
                if hold(cmd):
                    self.held.append(cmd)
                else:
                    queue.extend(self.answer(cmd))
        return out

    def release(self, pred: Callable[[object], bool] = lambda c: True) -> list[object]:
        """Answer held commands matching ``pred`` (and everything that follows)."""
        todo = [c for c in self.held if pred(c)]
        self.held = [c for c in self.held if not pred(c)]
        out: list[object] = []
        for cmd in todo:
            for ev in self.answer(cmd):
                out.extend(self.run(ev))
        return out

    def dep(self, name: str = "app") -> rc.Deployment:
        return self.state.deployments[name]

    def ranks(self, name: str = "app") -> dict[str, tuple[int, int, int] | None]:
        return {rid: (rk.as_tuple() if rk else None) for rid, rk in self.state.ranks(name).items()}

    def by_rank(self, name: str = "app") -> dict[int, str]:
        dep = self.dep(name)
        return {dep.ranks.global_rank(rid): rid for rid in dep.replicas}


def placed_answers(cmd: object) -> list[object]:
    """What an executor of a core that places replicas (nodes joined) answers at once: a
    PlaceReplica with ReplicaPlaced on that node (a StartReplica waits for it), then ready,
    reconfigured, stopped."""
    if isinstance(cmd, rc.PlaceReplica):
        return [rc.ReplicaPlaced(replica_id=cmd.replica_id, node_id=cmd.node_id)]
    if isinstance(cmd, rc.InitializeReplica):
        return [rc.ReplicaReady(replica_id=cmd.replica_id)]
    if isinstance(cmd, rc.StopReplica):
        return [rc.ReplicaStopped(replica_id=cmd.replica_id)]
    if isinstance(cmd, rc.ReconfigureReplica):
        return [rc.ReplicaReconfigured(replica_id=cmd.replica_id, version=cmd.version)]
    return []


def of(kind: type, commands: Iterable[object]) -> list:
    return [c for c in commands if isinstance(c, kind)]


def refused_before_a_child_starts(bench: ModuleType, argv: list[str], monkeypatch: Any, capsys: Any) -> str:
    """Run benchmark ``bench``'s ``main(argv)``, which must exit with status 2 (a bad option) before it
    starts any child; what it printed on stderr."""
    import pytest

    monkeypatch.setattr(bench, "spawn", lambda *a: pytest.fail("a child was started"))
    with pytest.raises(SystemExit) as exc:
        bench.main(argv)
    assert exc.value.code == 2
    return str(capsys.readouterr().err)


def load_benchmark(name: str) -> ModuleType:
    """``benchmarks/<name>.py`` as a module (benchmarks/ is scripts, not a package), with benchmarks/
    on ``sys.path`` as for a script run there: the scripts import ``common`` and each other by name."""
    folder = pathlib.Path(__file__).resolve().parents[1] / "benchmarks"
    if str(folder) not in sys.path:
        sys.path.insert(0, str(folder))
    spec = importlib.util.spec_from_file_location(name, folder / f"{name}.py")
    assert spec is not None and spec.loader is not None
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def checked_run(path: pathlib.Path, **kwargs: Any) -> tuple[Any, str]:
    """A simulation of scenario ``path`` (``kwargs`` go to ``Simulation``) with every invariant
    checked after every step (``check=True``) and its trace, each step's delta verified against a
    comparison of every replica (the writer raises if the delta it bounded missed a change).
    Returns (the ``RunResult``, the trace's text)."""
    import io

    from executors.sim import Simulation, load_scenario

    buf = io.StringIO()
    sim = Simulation(load_scenario(path), trace=buf, check=True, **kwargs)
    sim.trace.verify = True
    return sim.run(), buf.getvalue()


def example_run(path: pathlib.Path) -> tuple[Any, str]:
    """``checked_run`` of an example scenario, made once and shared by the tests that read it
    (three did the same run each, rollout-64-under-load.yaml 11 s every time); ~6 MB for all
    the examples."""
    return _example_run(pathlib.Path(path).resolve())


_example_run = functools.cache(checked_run)
