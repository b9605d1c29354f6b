"""The simulator's driver follows the core's pool commands (issue 22): after every example scenario
(crashes, node loss, controller restarts, downscales, tiers, sleep and wake), the pools they describe
are the core's own, and each run sent some."""

from __future__ import annotations

from pathlib import Path

import pytest

from executors.sim import Simulation, load_scenario

ROOT = Path(__file__).resolve().parents[2]
SCENARIOS = ["crash-storm.yaml", "node-loss-3-nodes.yaml", "controller-crash.yaml", "drain-on-downscale.yaml",
             "tiers-3-models.yaml", "rl-sleep-wake.yaml", "gangs.yaml", "controller-crash-during-scale-up.yaml"]


@pytest.mark.parametrize("name", SCENARIOS)
def test_the_pools_the_commands_describe_are_the_cores(name: str) -> None:
    sim = Simulation(load_scenario(ROOT / "examples" / "scenarios" / name))
    sim.run()
    driver = sim.driver
    assert driver.pools.members, f"{name}: no pool command reached the driver"
    assert driver.pools.mismatch(driver.state) is None, driver.pools.mismatch(driver.state)
