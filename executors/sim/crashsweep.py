"""The controller crashed at every step (issue 64): run a scenario once as written, then once more
for each step k = 1..N with the controller crashed right after step k and recovered at once from
what the live replicas report, and compare.

Ray Serve's users report rank state corrupted by a controller kill (ray#64103 "Rank system is in an
invalid state", ray#63139 a rank left ``None``). Here each crashed run is checked three ways:

* every invariant after every step, the recovery's included (``Driver(check=True)``:
  ``rankcore.invariants.check_step``);
* nothing orphaned at the end: every replica process alive in the simulated cluster is one the
  core holds, and every replica the core holds is alive there;
* the end state equals the uncrashed run's: per deployment its target, status and, by global rank,
  each replica's ``(rank, node_rank, local_rank)``, phase and node (``end_view``). Replica ids are
  not compared: a replica whose start was lost with the controller is started again under a new id.
  An end that differs only in local ranks (the same replicas on the same nodes, numbered in another
  order on a node) is reported apart (``SweepReport.local_only``): a crash while placements are in
  flight lets the recovered controller place its pending replicas again by its own rule, and the old
  controller's placements land where it sent them; every rank stays valid and contiguous.

``rankcore crash-sweep SCENARIO`` runs it (``--every K`` crashes after every K-th step only);
tests/integration/test_crash_sweep.py over the small example scenarios.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import rankcore as rc

from ..scenarios.format import Scenario
from .runner import Simulation

__all__ = ["SweepReport", "end_view", "sweep"]


def end_view(state: rc.State, local: bool = True) -> dict:
    """What a crashed run must end with, as the uncrashed one did (see the module's docstring);
    ``local=False``: without the local ranks."""
    out = {}
    for name, dep in sorted(state.deployments.items()):
        reps = []
        for rid, rep in dep.replicas.items():
            rank = dep.ranks.rank_of(rid)
            ranks = None if rank is None else rank.as_tuple() if local else rank.as_tuple()[:2]
            reps.append((ranks, rep.phase.name, rep.node_id))
        out[name] = {"target": dep.target, "status": dep.status, "replicas": sorted(reps, key=repr)}
    return out


def _orphans(sim: Simulation) -> list[str]:
    """Replicas alive in the simulated cluster the core does not hold, and the reverse."""
    held = {rid for dep in sim.driver.state.deployments.values() for rid, r in dep.replicas.items()
            if r.node_id is not None and r.phase is not rc.Phase.PENDING}
    alive = {r.replica_id for r in sim.backend.replicas.values() if r.alive}
    return [f"{rid}: alive, unknown to the core" for rid in sorted(alive - held)] + \
           [f"{rid}: held by the core, not alive" for rid in sorted(held - alive)]


@dataclass
class SweepReport:
    scenario: str
    steps: int
    crashed: list[int] = field(default_factory=list)
    #: k -> what went wrong after a crash at step k (an invariant, an orphan, the end differing)
    failures: dict[int, str] = field(default_factory=dict)
    #: the steps after whose crash the end differed in local ranks only (see the module's docstring)
    local_only: list[int] = field(default_factory=list)

    @property
    def passed(self) -> bool:
        return not self.failures


def _run(scenario: Scenario, crash_at: int | None) -> Simulation:
    sim = Simulation(scenario, check=True)
    if crash_at is not None:
        count = [0]

        def after_step(t: float, event: object, before: rc.State, step: rc.Step) -> None:
            count[0] += 1
            if count[0] == crash_at:  # (crashed once the step's commands are carried out, recovered at once)
                sim.schedule(0.0, sim.crash_controller, 0.0)

        sim.driver.observers.append(after_step)
    sim.run()
    return sim


def sweep(scenario: Scenario, every: int = 1, progress: Callable[[int, int], Any] | None = None) -> SweepReport:
    """Crash after every ``every``-th step of ``scenario`` (its uncrashed run's steps) and compare."""
    base = _run(scenario, None)
    steps = base.metrics.events
    want, coarse = end_view(base.driver.state), end_view(base.driver.state, local=False)
    report = SweepReport(scenario=scenario.name, steps=steps)
    for k in range(1, steps + 1, every):
        report.crashed.append(k)
        try:
            sim = _run(scenario, k)
        except rc.InvariantViolation as exc:
            report.failures[k] = f"invariant: {exc}"
        else:
            lost = _orphans(sim)
            got = end_view(sim.driver.state)
            if lost:
                report.failures[k] = "orphans: " + "; ".join(lost[:5])
            elif got != want and end_view(sim.driver.state, local=False) == coarse:
                report.local_only.append(k)
            elif got != want:
                diff = {n: (want.get(n), got.get(n)) for n in sorted(set(want) | set(got)) if want.get(n) != got.get(n)}
                report.failures[k] = f"end state differs: {diff!r:.600}"
        if progress is not None:
            progress(k, steps)
    return report
