"""The simulator as an ``ExecutorSubject`` for ``rankcore.testing.make_timeline_machine``.

Random timelines from hypothesis are carried out on a small simulated cluster
(every core step checked with every invariant), and the trace's snapshots are
handed back to the machine to check.
"""

from __future__ import annotations

import io
import json
from typing import Any

from ..scenarios import parse_scenario
from ..scenarios.timeline import AddNode, Crash, Deploy, LoseNode, Scale, UpdateConfig
from .runner import Simulation

__all__ = ["SimSubject"]

_SCENARIO = """
name: property timeline
seed: 3
cluster: {nodes: 3, gpus_per_node: 8}
latency:
  place: {dist: uniform, low: 0, high: 0.5}
  start: {dist: uniform, low: 1, high: 6}
  reconfigure: {dist: uniform, low: 0.1, high: 1}
  stop: {dist: uniform, low: 0.2, high: 2}
deployments:
  llm: {replicas: 1, gpus: 0, reconfigure: with_rank, user_config: {model: v1}}
  embed: {replicas: 1, gpus: 0, reconfigure: plain}
timeline: []
"""


class SimSubject:
    capabilities = frozenset({"node_loss", "controller_crash"})

    def __init__(self, scenario_text: str = _SCENARIO, *, check: bool = True) -> None:
        self.buf = io.StringIO()
        self.sim = Simulation(parse_scenario(scenario_text, "<property>"), trace=self.buf, check=check)
        self._read = 0
        self._added = 0

    def _controller(self) -> None:
        """Wait (in virtual time) until the controller is up."""
        while not self.sim.controller_up and not self.sim.quiet():
            self.sim.run_until(self.sim._queue[0][0], advance_clock=False)

    def deploy(self, name: str, replicas: int, user_config: Any) -> None:
        self._controller()
        self.sim.act(Deploy(deployment=name, replicas=replicas, user_config=user_config))

    def scale(self, name: str, replicas: int) -> None:
        self._controller()
        self.sim.act(Scale(deployment=name, replicas=replicas))

    def update_config(self, name: str, user_config: Any) -> None:
        self._controller()
        self.sim.act(UpdateConfig(deployment=name, user_config=user_config))

    def crash_rank(self, name: str, rank: int) -> None:
        self.sim.act(Crash(deployment=name, rank=rank))

    def lose_node(self) -> None:
        alive = sorted(self.sim.backend.nodes.values(), key=lambda n: n.order)
        if len(alive) > 1:
            self.sim.act(LoseNode(node=alive[0].name))

    def add_node(self) -> None:
        self._added += 1
        self.sim.act(AddNode(node=f"extra-{self._added}", gpus=8))

    def crash_controller(self) -> None:
        self.sim.crash_controller(5.0)

    def advance(self, seconds: float) -> None:
        self.sim.run_until(self.sim.now + seconds)

    def settle(self) -> bool:
        for _ in range(100):
            if self.sim.quiet():
                break
            self.sim.run_until(self.sim.now + 3600.0, advance_clock=False)
        state = self.sim.driver.state
        return self.sim.controller_up and all(d.healthy for d in state.deployments.values())

    def state(self) -> Any:
        return self.sim.driver.state

    def snapshots(self) -> list:
        text = self.buf.getvalue()
        new, self._read = text[self._read:], len(text)
        return [json.loads(line) for line in new.splitlines() if line.startswith('{"kind":"snapshot"')]

    def fingerprint(self) -> str:
        return self.buf.getvalue()
