"""The week of churn (issue 40, "Long runs"; benchmarks/bench_week.py over
examples/scenarios/week-of-churn-1000.yaml) kept honest in CI, cheaply: its day squeezed into an
hour of virtual time (``scenario_text(day_s=3600)``: 1,000 replicas, every fault at 24 times its
rate) through the benchmark's own ``run_once`` and ``check_trace`` (``rankcore check-trace`` in a
process of its own). The trace must pass, the scenario's expectations hold, and every kind of
trouble the scenario injects must show in the trace itself, so that one silently no longer injected
fails here. Also: the week is the day repeated, and the request figures keep bounded memory."""

from __future__ import annotations

import math
import random
from collections import Counter

import attrs
import pytest

from executors.scenarios import parse_scenario
from executors.scenarios.metrics import percentile
from executors.scenarios.timeline import Rollout
from executors.sim import load_scenario, traffic
from executors.trace import read_trace
from tests.helpers import load_benchmark

bench = load_benchmark("bench_week")


def _from_trace(path) -> Counter:
    """What happened, read back from the trace's own records."""
    seen: Counter = Counter()
    event: str | None = None
    size: dict[str, int] = {}
    end: dict = {}
    for rec in read_trace(path):
        kind = rec["kind"]
        if kind == "event":
            event = rec["type"]
        elif kind == "fault":
            seen[rec["type"], bool(rec.get("random") or rec.get("repaired"))] += 1
        elif kind == "command":
            f = rec["fields"]
            if rec["type"] == "EvictReplica":
                seen["evictions"] += 1
            elif rec["type"] == "PlaceReplica" and f.get("source") == "warm":
                seen["warm_loads"] += 1
            elif rec["type"] == "UpdateWorldSize":
                before = size.get(f["deployment"])
                if event == "AutoscalingMetrics" and before is not None:  # (the autoscaler's decision)
                    seen["scale_ups" if f["world_size"] > before else "scale_downs"] += 1
                size[f["deployment"]] = f["world_size"]
            elif rec["type"] == "StartReplica":
                size.setdefault(f["deployment"], f["world_size"])
        elif kind == "end":
            end = rec
    seen["rollouts_done"] = sum(d["rollouts_done"] for d in end["metrics"]["deployments"].values())
    return seen


def test_a_day_in_an_hour_passes_check_trace_and_does_everything_it_says(tmp_path):
    trace = tmp_path / "day.jsonl"
    res = bench.run_once(1, trace, day_s=3600)
    assert res["span_s"] == 3600 and res["passed"], res["failures"]
    check = bench.check_trace(trace)
    assert check["rc"] == 0 and check["summary"].endswith("OK: no invariant violated."), check["summary"]

    happened = res["happened"]
    assert all(happened[k] >= 1 for k in bench.KINDS), happened
    assert happened["requests"] > 10_000 and happened["requests_lost"] == 0
    assert happened["random_crashes"] > 1000  # ~0.1 x 24 per replica-hour at 1,000 replicas

    seen = _from_trace(trace)
    assert seen["random_crash", False] == happened["random_crashes"]
    assert seen["node_lost", True] == happened["nodes_lost"] >= 1
    assert seen["node_added", True] == happened["nodes_repaired"] >= 1
    assert seen["controller_crash", False] == seen["controller_recovered", False] == 2
    assert seen["evictions"] == happened["evictions"] >= 1
    assert seen["warm_loads"] >= 1  # an evicted model back from its WARM copy
    assert seen["scale_ups"] == happened["scale_ups"] >= 1
    assert seen["scale_downs"] == happened["scale_downs"] >= 1
    assert seen["rollouts_done"] == happened["rollouts_done"] == 1


def _unplaced(sc):
    """``sc`` without where each entry was written (the generated YAML has its own lines)."""
    return attrs.evolve(sc, timeline=tuple(attrs.evolve(a, where="") for a in sc.timeline),
                        expect=tuple(attrs.evolve(e, where="") for e in sc.expect))


def test_the_week_is_the_day_repeated():
    day = load_scenario(bench.TEMPLATE)
    assert _unplaced(parse_scenario(bench.scenario_text(1), "<day>")) == _unplaced(
        parse_scenario(bench.TEMPLATE.read_text(), "<day>"))  # (a day: the file as written)
    week = parse_scenario(bench.scenario_text(7), "<week>")
    assert day.duration == 86400 and week.duration == 7 * 86400
    first = next(i for i, a in enumerate(day.timeline) if a.at is not None)  # (the deploys run once)
    daily = Counter(a.key for a in day.timeline[first:])
    assert daily["rollout"] == 1 and daily["crash_controller"] == 2
    assert Counter(a.key for a in week.timeline) == Counter(a.key for a in day.timeline[:first]) + Counter(
        {k: 7 * n for k, n in daily.items()})
    assert [a.version for a in week.timeline if isinstance(a, Rollout)] == [f"v{i}" for i in range(2, 9)]
    ats = [a.at for a in week.timeline if a.at is not None]
    assert ats == sorted(ats) and ats[-1] == 6 * 86400 + 54000
    # the same random faults and daily traffic: they repeat by themselves
    assert (week.crash_rate_per_replica_hour, week.cluster_node_loss_rate) == (
        day.crash_rate_per_replica_hour, day.cluster_node_loss_rate)


def test_a_squeezed_day_scales_times_of_day_and_rates_and_replicas_resize_the_big_deployment():
    hour = parse_scenario(bench.scenario_text(2, day_s=3600), "<hour>")
    day = load_scenario(bench.TEMPLATE)
    assert hour.duration == 7200
    assert hour.crash_rate_per_replica_hour == pytest.approx(24 * day.crash_rate_per_replica_hour)
    assert hour.cluster_node_loss_rate == pytest.approx(24 * day.cluster_node_loss_rate)
    assert hour.traffic["chat"].arrivals.day_s == 3600
    assert [a.at for a in hour.timeline if a.at is not None] == [450, 1500, 2250, 4050, 5100, 5850]
    big = parse_scenario(bench.scenario_text(1, replicas=500), "<500>")
    assert big.deployments["llm"].replicas == 500 - 96 - 64
    assert sum(1 for n in big.nodes if n.name.startswith("gpu-")) == math.ceil(340 * 112 / 840)


def test_request_figures_are_exact_up_to_the_bound_then_within_the_accuracy(monkeypatch):
    rng = random.Random(5)
    values = [0.0] * 300 + [rng.lognormvariate(0, 1.5) for _ in range(2700)]
    rng.shuffle(values)
    exact = traffic._Sample()
    for v in values[:2000]:
        exact.append(v)
    for q in (50, 99, 100):
        assert exact.percentile(q) == percentile(values[:2000], q)  # as before: every value kept
    monkeypatch.setattr(traffic, "EXACT_VALUES", 1000)
    sketch = traffic._Sample()
    for v in values:
        sketch.append(v)
    assert sketch.exact is None and len(sketch) == len(values) and sketch.max() == max(values)
    assert len(sketch.buckets) < 5000  # (bounded by the values' range, not their count)
    for p in (5, 50, 90, 99, 99.9):
        want = percentile(values, p)
        assert sketch.percentile(p) == pytest.approx(want, rel=traffic.SAMPLE_ACCURACY), p
    assert sketch.percentile(5) == 0.0  # the 300 zeros (requests dispatched at once) are exact
    assert traffic._Sample().percentile(50) is None and traffic._Sample().max() is None
