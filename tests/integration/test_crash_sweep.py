"""The controller crashed after every step of the example scenarios, in the simulator (issue 64):
every invariant holds after every step (the recovery's too), nothing is orphaned, and the end state
is the uncrashed run's (``executors.sim.crashsweep``; ``rankcore crash-sweep``). The long scenarios
are swept by ``rankcore crash-sweep --every K`` (docs/reliability.md), not here."""

from __future__ import annotations

from pathlib import Path

import pytest
from click.testing import CliRunner

from executors.cli import main
from executors.scenarios.format import load_scenario
from executors.sim.crashsweep import sweep
from executors.sim.world import SimBackend

ROOT = Path(__file__).resolve().parents[2]
#: every step of these (each under ~5 s here)
SMALL = ["controller-crash", "controller-crash-during-scale-up", "controller-crash-orphan-unresponsive",
         "crash-loop-backoff", "crash-storm", "downscale-8-to-4", "drain-on-downscale", "gangs",
         "hang-health-check", "node-loss-3-nodes", "rank-aware-model",
         "rank-packed-downscale", "refused-placement", "rl-sleep-wake", "rollout-8", "rollout-gangs",
         "seed-four-replicas", "spare-processes", "static-placement", "tiers-3-models"]


@pytest.mark.parametrize("name", SMALL)
def test_a_crash_after_any_step_recovers_to_the_same_end(name: str) -> None:
    report = sweep(load_scenario(ROOT / "examples" / "scenarios" / f"{name}.yaml"))
    assert report.steps > 0 and report.crashed == list(range(1, report.steps + 1))
    assert report.passed, dict(list(report.failures.items())[:5])
    assert report.local_only == [], report.local_only


def test_a_crash_while_placements_are_in_flight_ends_with_the_same_local_ranks() -> None:
    """(provision-4-to-16: three nodes join at t=120 and the core places 12 waiting replicas on them;
    a crash then finds 12 placements under way.) The recovery waits for them to land, as the Ray
    executor's does, and each reports the ranks its placement carried: the recovered controller keeps
    the old one's choice, local order included, instead of placing them again by its own rule."""
    report = sweep(load_scenario(ROOT / "examples" / "scenarios" / "provision-4-to-16.yaml"))
    assert report.passed, dict(list(report.failures.items())[:5])
    assert report.local_only == [], report.local_only


def test_the_sweep_sees_a_recovery_that_forgets_a_replica(monkeypatch: pytest.MonkeyPatch) -> None:
    """Not vacuous: a recovery that loses one live replica's report (it runs on, unknown) fails."""
    real = SimBackend.recovery_report

    def forgetful(self: SimBackend) -> tuple:
        reports, silent = real(self)
        return reports[:-1], silent

    monkeypatch.setattr(SimBackend, "recovery_report", forgetful)
    report = sweep(load_scenario(ROOT / "examples" / "scenarios" / "seed-four-replicas.yaml"))
    assert not report.passed
    assert any("orphans" in why or "differs" in why or "invariant" in why for why in report.failures.values())


def test_the_cli_sweeps_and_says_what_it_did() -> None:
    out = CliRunner().invoke(main, ["crash-sweep", str(ROOT / "examples" / "scenarios" / "controller-crash.yaml"),
                                    "--every", "5"])
    assert out.exit_code == 0, out.output
    assert "crashed after 6 (every 5), 0 different" in out.output
