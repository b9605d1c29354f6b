"""A deploy that changes ``health_check_period_s`` or ``health_check_timeout_s`` reaches the replicas
running now (issue 64; Ray Serve's lightweight update, found by its test_deployment_state.py port):
the core tells the executor once (``UpdateHealthChecks``), none is restarted; the simulator checks
each live replica at the new timings from its next check. (The Ray executor's watcher reads them
before each check: executors/ray_gpu/control/observe.py.)"""

from __future__ import annotations

from pathlib import Path

import rankcore as rc
from executors.scenarios.format import load_scenario
from executors.sim.runner import Simulation
from tests.helpers import Driver

ROOT = Path(__file__).resolve().parents[2]


def _applied(**kw: float) -> rc.DeploymentApplied:
    return rc.DeploymentApplied(name="app", num_replicas=2, **kw)


def test_new_check_timings_are_told_once_and_restart_nothing() -> None:
    d = Driver(("n0", "n1"))
    d.run(_applied(health_check_period_s=10.0, health_check_timeout_s=30.0))
    running = set(d.dep().replicas)
    sent = d.step(_applied(health_check_period_s=2.0, health_check_timeout_s=5.0)).commands
    assert [c for c in sent if isinstance(c, rc.UpdateHealthChecks)] == [
        rc.UpdateHealthChecks(deployment="app", health_check_period_s=2.0, health_check_timeout_s=5.0)]
    assert not [c for c in sent if isinstance(c, (rc.StartReplica, rc.StopReplica, rc.ReconfigureReplica))]
    assert set(d.dep().replicas) == running and d.dep().status == "HEALTHY"
    again = d.step(_applied(health_check_period_s=2.0, health_check_timeout_s=5.0)).commands
    assert not [c for c in again if isinstance(c, rc.UpdateHealthChecks)]  # (unchanged: nothing told)


def test_the_simulator_checks_live_replicas_at_the_new_timings() -> None:
    sim = Simulation(load_scenario(ROOT / "examples" / "scenarios" / "seed-four-replicas.yaml"), seed=1)
    sim.run()
    backend = sim.backend
    name = next(iter({r.deployment for r in backend.replicas.values()}))
    live = [r for r in backend.replicas.values() if r.deployment == name and r.alive]
    assert live and all(r.checks != (7.0, 9.0) for r in live)
    backend.execute([rc.UpdateHealthChecks(deployment=name, health_check_period_s=7.0, health_check_timeout_s=9.0)],
                    sim.now)
    assert all(r.checks == (7.0, 9.0) for r in live)
