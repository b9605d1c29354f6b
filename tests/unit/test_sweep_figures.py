"""The what-if week sweep's figures do not move when the sweep is made faster (issue 36): a small
sweep of examples/scenarios/capacity-plan-64.yaml (2 cluster sizes x 2 seeds) gives, on one
process and on two, exactly the figures pinned in tests/data/sweep-week-figures.json (written
before the speed-ups; a change to what the simulator or the core does writes it again, on purpose)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from executors.sweep import run_sweep, summarise

ROOT = Path(__file__).resolve().parents[2]
PLAN = ROOT / "examples" / "scenarios" / "capacity-plan-64.yaml"
PINNED = ROOT / "tests" / "data" / "sweep-week-figures.json"


def _figures(jobs: int) -> dict:
    recs = run_sweep(PLAN, [{"cluster.nodes": 8}, {"cluster.nodes": 11}], lambda v: [1, 2], jobs=jobs)
    out = {"runs": [{"variant": r.variant, "seed": r.seed, "events": r.events, "end_time": r.end_time,
                     "metrics": r.metrics, "expectations": list(r.expectations)} for r in recs],
           "summary": [{k: v for k, v in row.items() if k != "wall_s"} for row in summarise(recs)]}
    return json.loads(json.dumps(out, default=str))  # (tuples as the file has them: lists)


def _same(a: object, b: object) -> bool:
    """Equal as written (a NaN figure, one with no spread, equals itself)."""
    return json.dumps(a, sort_keys=True) == json.dumps(b, sort_keys=True)


@pytest.mark.parametrize("jobs", [1, 2])
def test_a_small_week_sweep_gives_the_pinned_figures(jobs):
    got, want = _figures(jobs), json.loads(PINNED.read_text())
    assert [(r["variant"], r["seed"]) for r in got["runs"]] == [(r["variant"], r["seed"]) for r in want["runs"]]
    for g, w in zip(got["runs"], want["runs"]):
        assert _same(g["metrics"], w["metrics"]), (g["variant"], g["seed"])
        assert (g["events"], g["end_time"], g["expectations"]) == (w["events"], w["end_time"], w["expectations"])
    assert _same(got["summary"], want["summary"])
    assert got["runs"][0]["metrics"]["deployments"]["llm"]["crashes"] > 900  # a week of crashes, not an empty run
