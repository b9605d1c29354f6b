"""Every example scenario runs and meets every expectation it states.

The small examples run with ``check=True`` (every rank invariant after every
step). The 1,000-replica day is too slow for that, so it runs plain, with a
trace, and every snapshot in the trace is checked with
``rankcore.invariants.check_snapshot``. The week of churn (a day of 1,000
replicas under traffic) runs squeezed into an hour, its trace checked by
``rankcore check-trace``, in tests/integration/test_week_churn.py. Also:
determinism (same seed, same bytes; another seed, another trace) and the
``simulate`` command's exit codes, and every example's trace through ``check-trace``
with each departure explained (from the same checked run).
"""

from __future__ import annotations

import io
import json
import re
from pathlib import Path

import pytest
from click.testing import CliRunner

from executors.checktrace import check_trace_file
from executors.cli import main
from executors.sim import Simulation, load_scenario
from rankcore.invariants import check_snapshot
from tests.helpers import example_run

ROOT = Path(__file__).resolve().parents[2]
EXAMPLES = ROOT / "examples" / "scenarios"
DAY = "day-of-churn-1000.yaml"
WEEK = "week-of-churn-1000.yaml"  # (test_week_churn.py)
ALL = sorted(p.name for p in EXAMPLES.glob("*.yaml"))
SMALL = [n for n in ALL if n not in (DAY, WEEK)]

REQUIRED = {
    "seed-four-replicas.yaml",
    "rank-aware-model.yaml",
    "downscale-8-to-4.yaml",
    "crash-storm.yaml",
    "node-loss-3-nodes.yaml",
    "controller-crash.yaml",
    DAY,
}


def _failures(result) -> str:
    return "\n".join(f"{e.name}: {e.detail}" for e in result.failures)


def _assert_all_expectations_met(result) -> None:
    assert result.passed, f"{result.scenario.source}:\n{_failures(result)}"
    # every expectation in the file was actually evaluated (once)
    evaluated = sorted(e.expectation.index for e in result.expectations if e.expectation is not None)
    assert evaluated == list(range(len(result.scenario.expect)))


def test_the_required_examples_exist() -> None:
    assert set(ALL) >= REQUIRED


@pytest.mark.parametrize("name", ALL)
def test_example_is_commented_and_documented(name: str) -> None:
    text = (EXAMPLES / name).read_text()
    assert text.startswith("#"), f"{name} should open with a comment saying what it shows"
    sc = load_scenario(EXAMPLES / name)
    assert sc.expect, f"{name} states no expectation"
    assert name in (ROOT / "docs" / "scenarios.md").read_text(), f"docs/scenarios.md does not list {name}"


@pytest.mark.parametrize("name", SMALL)
def test_example_meets_its_expectations_with_invariants_checked(name: str) -> None:
    result, _ = example_run(EXAMPLES / name)  # (check=True: every invariant after every step)
    _assert_all_expectations_met(result)


#: examples where no replica leaves (no departure to explain)
NOTHING_LEAVES = ("seed-four-replicas.yaml", "rank-aware-model.yaml", "refused-placement.yaml",
                  "traffic-batching-host.yaml")


@pytest.mark.parametrize("name", SMALL)
def test_every_example_trace_passes_with_its_departures_explained(tmp_path: Path, name: str) -> None:
    """Every replica that leaves a simulator trace of an example leaves through a
    stop, a crash, a node loss, a fault or a recovery that explains it (``check-trace``
    on the trace of the checked run above: here, so an example is simulated once)."""
    trace = tmp_path / "trace.jsonl"
    trace.write_text(example_run(EXAMPLES / name)[1])
    report = check_trace_file(trace)
    assert report.ok, report.violations[:5]
    if name not in NOTHING_LEAVES:
        assert report.checks["presence"] > 0  # replicas did leave, each explained


def test_day_of_churn_meets_its_expectations_and_every_snapshot_is_valid() -> None:
    sc = load_scenario(EXAMPLES / DAY)
    # what the file promises: at least 1,000 replicas for one virtual day, with random crashes
    assert max(d.replicas for d in sc.deployments.values()) >= 1000
    assert sum(n.gpus for n in sc.nodes) >= 1000
    assert sc.duration == 86400
    assert sc.crash_rate_per_replica_hour > 0
    assert sc.snapshot_every >= 1000

    buf = io.StringIO()
    result = Simulation(sc, trace=buf).run()
    _assert_all_expectations_met(result)
    assert result.end_time == 86400
    crashes = result.metrics["deployments"]["llm"]["crashes"]
    assert 1000 <= crashes <= 10000, crashes  # "a few thousand" over the day

    snapshots = 0
    last = None
    for line in buf.getvalue().splitlines():
        rec = json.loads(line)
        if rec["kind"] == "snapshot":
            check_snapshot(rec)
            snapshots += 1
            last = rec
    assert snapshots >= 3
    assert last is not None and last["reason"] == "end"
    end = last["deployments"]["llm"]
    assert end["target"] == 1000
    assert sorted(r["global_rank"] for r in end["replicas"].values()) == list(range(1000))


# ------------------------------------------------------------- determinism
def _trace(name: str, seed: int | None = None) -> str:
    buf = io.StringIO()
    Simulation(load_scenario(EXAMPLES / name), seed=seed, trace=buf).run()
    return buf.getvalue()


@pytest.mark.parametrize("name", ["crash-storm.yaml", "controller-crash.yaml"])
def test_same_seed_gives_a_byte_identical_trace(name: str) -> None:
    first, second = _trace(name), _trace(name)
    assert first == second
    assert len(first.splitlines()) > 10


def test_another_seed_changes_the_trace_when_latencies_are_random() -> None:
    sc = load_scenario(EXAMPLES / "rank-aware-model.yaml")
    assert sc.latency["start"].dist == "uniform"  # random start-up times
    a, b = _trace("rank-aware-model.yaml", seed=sc.seed), _trace("rank-aware-model.yaml", seed=sc.seed + 1)
    assert a != b
    # ... but not the ranks: they do not depend on the order replicas come up
    end_a = [json.loads(x) for x in a.splitlines() if '"reason":"end"' in x][0]
    end_b = [json.loads(x) for x in b.splitlines() if '"reason":"end"' in x][0]
    ranks = {rid: r["rank"] for rid, r in end_a["deployments"]["model"]["replicas"].items()}
    assert ranks == {rid: r["rank"] for rid, r in end_b["deployments"]["model"]["replicas"].items()}


# A recovering controller must not hand out the id of a replica that died
# while it was down (controller-crash.yaml: llm#5 dies at t=36, the controller
# is back at t=50); the executor tells it how far ids have gone.
@pytest.mark.parametrize("name", SMALL)
def test_replica_ids_are_never_reused(name: str) -> None:
    started = [json.loads(x)["replica"] for x in example_run(EXAMPLES / name)[1].splitlines()
               if '"type":"StartReplica"' in x]
    assert started
    reused = sorted({r for r in started if started.count(r) > 1})
    assert not reused, f"started more than once: {reused}"


# --------------------------------------------------------------------- CLI
def _flat(text: str) -> str:
    """The text with line wrapping undone (rich wraps long lines)."""
    return re.sub(r"\s+", " ", text)


def test_cli_simulate_an_example_exits_0_and_prints_the_summary() -> None:
    # (piped, no COLUMNS: the summary is 100 columns wide, boxed)
    result = CliRunner(env={"COLUMNS": None}).invoke(main, ["simulate", str(EXAMPLES / "seed-four-replicas.yaml")])
    assert result.exit_code == 0, result.output
    out = result.stdout
    assert "seed example - four replicas" in out  # the summary table's title
    for column in ("deployment", "target", "healthy", "contiguous", "crashes"):
        assert column in out
    assert re.search(r"│ model\s+│\s+4 │\s+yes │\s+yes │", out), out
    assert "expectations" in out and "FAIL" not in out
    assert result.stderr == ""


def test_cli_quiet_prints_the_verdict_only() -> None:
    result = CliRunner().invoke(main, ["simulate", "--quiet", str(EXAMPLES / "seed-four-replicas.yaml")])
    assert result.exit_code == 0, result.output
    assert result.stdout.strip() == "ok: 1 run(s), every expectation met"


def test_cli_failed_expectation_exits_1_naming_it_and_what_was_seen(tmp_path: Path) -> None:
    path = tmp_path / "wrong.yaml"
    path.write_text(
        "cluster: {nodes: 1, gpus_per_node: 8}\n"
        "latency: {start: 1}\n"
        "deployments:\n"
        "  llm: {replicas: 4}\n"
        "timeline:\n"
        "  - deploy: llm\n"
        "  - wait_until_healthy: {deployment: llm, timeout: 30}\n"
        "expect:\n"
        "  - world_size: {deployment: llm, equals: 99}\n"
        "  - world_size: {deployment: llm, equals: 4}\n"
    )
    result = CliRunner().invoke(main, ["simulate", str(path)])
    assert result.exit_code == 1, result.output
    err = _flat(result.stderr)
    assert "expectation failed" in err
    assert "expect[0] world_size of llm" in err
    assert "expected 99, saw 4" in err
    # the one that held is not reported as a failure
    assert "expect[1]" not in err
    assert "Traceback" not in result.output
    # the table still shows both
    assert "FAIL" in result.stdout and "pass" in result.stdout


def test_cli_what_if_sweep_runs_every_combination() -> None:
    result = CliRunner().invoke(main, [
        "simulate", str(EXAMPLES / "crash-storm.yaml"),
        "--set", "faults.crash_rate_per_replica_hour=0,1", "--set", "cluster.nodes=2,3",
    ])
    assert result.exit_code == 0, result.output
    out = result.stdout
    assert "what-if: crash storm" in out
    rows = [line for line in out.splitlines() if re.match(r"│\s+[01] │\s+[23] │", line)]
    from executors.sweep import DEFAULT_GROUPS

    assert len(rows) == 4 * len(DEFAULT_GROUPS), out  # the 4 variants in each table (one per group of columns)


def test_rank_packed_example_puts_consecutive_ranks_on_one_node_and_downscales_without_moves() -> None:
    """placement: rank_packed: node rank = global rank // 4 and local rank = global rank % 4,
    before and after the top-rank downscale (which reassigns nothing at any level);
    spread deals the same replicas round-robin."""
    import attrs

    sc = load_scenario(EXAMPLES / "rank-packed-downscale.yaml")
    result = Simulation(sc, check=True).run()
    _assert_all_expectations_met(result)
    ranks = result.state.ranks("moe")
    assert len(ranks) == 8
    for rank in ranks.values():
        assert (rank.node_rank, rank.local_rank) == (rank.rank // 4, rank.rank % 4), ranks
    spread_deps = {n: attrs.evolve(d, placement="spread") for n, d in sc.deployments.items()}
    spread = Simulation(attrs.evolve(sc, deployments=spread_deps, timeline=sc.timeline[:2]), check=True).run()
    dealt = spread.state.ranks("moe")
    assert any(r.node_rank != r.rank // 4 for r in dealt.values())
    assert sorted(r.node_rank for r in dealt.values() if r.rank < 3) == [0, 1, 2]  # ranks 0..2 on three nodes


def _states_at(sim: Simulation, *times: float) -> dict[float, object]:
    """The core's state at each virtual time (probes scheduled before ``run``)."""
    seen: dict[float, object] = {}
    for t in times:
        sim.schedule(t, lambda t=t: seen.__setitem__(t, sim.driver.state), last=True)
    return seen


def test_static_placement_example_keeps_each_rank_on_its_bundles() -> None:
    """Rank N runs on the first bundle of mapping[N] (node-0 for rank 0; node-1,
    then node-2 after the caller's group moved, for rank 1); a crash and a node
    loss never move a rank elsewhere, and rank 1 keeps its lineage throughout."""
    sc = load_scenario(EXAMPLES / "static-placement.yaml")
    assert sc.deployments["engine"].static.mapping == ((0, 1), (2, 3))
    sim = Simulation(sc, check=True)
    seen = _states_at(sim, 20, 80)
    result = sim.run()
    _assert_all_expectations_met(result)

    def layout(state) -> dict:
        dep = state.deployments["engine"]
        return {dep.ranks.global_rank(r): (rep.node_id, rep.lineage, rep.phase.value) for r, rep in dep.replicas.items()}

    first = layout(seen[20])
    assert {g: v[0] for g, v in first.items()} == {0: "node-0", 1: "node-1"}
    # the group holds its GPUs: node-0 and node-1 offer the core nothing, node-2 its 2 GPUs
    assert {n: node.free["GPU"] for n, node in seen[20].cluster.nodes.items()} == {
        "node-0": 0.0, "node-1": 0.0, "node-2": 2.0}
    assert layout(seen[80]) == {0: first[0], 1: (None, first[1][1], "failed")}
    assert layout(result.state) == {0: first[0], 1: ("node-2", first[1][1], "running")}


def test_gangs_example_places_each_gang_on_one_node_and_restarts_it_whole() -> None:
    sim = Simulation(load_scenario(EXAMPLES / "gangs.yaml"), check=True)
    seen = _states_at(sim, 15, 39, 60)
    result = sim.run()
    _assert_all_expectations_met(result)

    def by_rank(state) -> dict:
        dep = state.deployments["engine"]
        return {dep.ranks.global_rank(r): (r, rep.node_id) for r, rep in dep.replicas.items()}

    assert {g: n for g, (_, n) in by_rank(seen[15]).items()} == {
        0: "node-0", 1: "node-0", 2: "node-0", 3: "node-0", 4: None, 5: None}  # gang 2 waits whole
    before, after = by_rank(seen[39]), by_rank(seen[60])
    assert before[4][1] == before[5][1] == "node-2"
    assert after[0] == before[0] and after[1] == before[1]  # gang 0 untouched
    assert after[2][0] != before[2][0] and after[3][0] != before[3][0]  # gang 1 restarted whole, on its ranks
    assert after[2][1] == after[3][1] == "node-0"


@pytest.mark.parametrize("name", ["static-placement.yaml", "gangs.yaml"])
def test_static_and_gang_traces_pass_check_trace(name: str) -> None:
    """The trace of a run with FAILED replicas, bundles and gangs checks clean
    (a FAILED replica losing its node ranks is not a rank change to report)."""
    import io

    from executors.checktrace import check_trace_lines

    buf = io.StringIO()
    Simulation(load_scenario(EXAMPLES / name), trace=buf).run()
    report = check_trace_lines(buf.getvalue().splitlines())
    assert report.ok, report.violations[:3]
    assert sum(report.checks.values()) > 0


GANG_RECOVERY = """
name: controller crash during a gang's start
seed: {seed}
cluster: {{nodes: [{{name: node-0, gpus: 4}}, {{name: node-1, gpus: 4}}]}}
latency:
  place: {{dist: uniform, low: 0.1, high: 3}}
  start: {{dist: uniform, low: 2, high: 6}}
deployments:
  engine: {{replicas: 2, user_config: {{}}, gang: {{size: 2, failure: {failure}}}}}
timeline:
  - deploy: engine
  - wait_until_healthy: {{deployment: engine, timeout: 60}}
  - scale: {{deployment: engine, replicas: 6}}
  - after: {crash_after}
    crash_controller: {{recover_after: 5}}
  - wait_until_healthy: {{deployment: engine, timeout: 120}}
expect:
  - contiguous: engine
  - ranks: {{deployment: engine, global: [0, 1, 2, 3, 4, 5]}}
"""


@pytest.mark.parametrize("crash_after", [0.05, 1.0, 2.5, 4.0, 7.0])
@pytest.mark.parametrize("failure", ["restart_gang", "restart_replica"])
def test_controller_crash_at_any_point_of_a_gang_start_recovers_whole_gangs(crash_after: float, failure: str) -> None:
    """Whenever the controller dies while two gangs start (members pending,
    placed, starting or running), the recovery ends with three whole gangs on
    ranks 0..5, each gang's members started with a gang context naming the
    gang's ranks, and no member of an incomplete gang left running from before."""
    import io
    import json

    from executors.scenarios.format import parse_scenario

    for seed in range(3):
        buf = io.StringIO()
        sc = parse_scenario(GANG_RECOVERY.format(seed=seed, failure=failure, crash_after=crash_after))
        result = Simulation(sc, trace=buf, check=True).run()
        _assert_all_expectations_met(result)
        dep = result.state.deployments["engine"]
        assert dep.healthy
        starts = [json.loads(line)["fields"] for line in buf.getvalue().splitlines()
                  if '"kind":"command"' in line and '"type":"StartReplica"' in line]
        assert len(starts) >= 6, "fewer StartReplica commands than replicas"
        for f in starts:
            gang = f["gang"]
            assert gang is not None, f"a StartReplica without its gang context: {f}"
            assert (gang["gang_id"], gang["rank_in_gang"], gang["gang_size"]) == (
                f"engine/gang-{f['global_rank'] // 2}", f["global_rank"] % 2, 2)
            assert f["replica_id"] in gang["members"] and len(gang["members"]) == 2
        # every gang ends whole: its two members running, on consecutive ranks
        by_rank = {dep.ranks.global_rank(r): rep for r, rep in dep.replicas.items()}
        assert sorted(by_rank) == list(range(6)) and all(r.phase.value == "running" for r in by_rank.values())


def test_start_timeouts_are_counted_apart_from_crashes() -> None:
    """Hand-computed: one replica whose start always takes 350 s under a 300 s
    timeout. Placed at 0.1 (place latency 0.1), initialised then; timed out at
    300.1, 600.2 and 900.3 (each replacement placed 0.1 s later): 3 timeouts by
    t=1000, no crash."""
    from executors.scenarios.format import parse_scenario

    sc = parse_scenario("cluster: {nodes: 1}\nduration: 1000\nlatency: {place: 0.1, start: 350}\n"
                        "deployments:\n  llm: {replicas: 1}\ntimeline:\n  - deploy: llm\n")
    assert any("starts take up to ~350 s" in w for w in sc.warnings)
    m = Simulation(sc, check=True).run().metrics["deployments"]["llm"]
    assert (m["timeouts"], m["crashes"], m["starts"]) == (3, 0, 4)


CRN = """
cluster: {{nodes: {nodes}, gpus_per_node: 8}}
duration: 21600
seed: 4
latency: {{start: {{dist: uniform, low: {low}, high: 120}}}}
faults: {{crash_rate_per_replica_hour: 0.1{node_faults}}}
deployments:
  llm: {{replicas: 64}}
timeline:
  - deploy: llm
"""


def _faults(sc_text: str) -> tuple[list, list]:
    """(random crashes as (t, rank), node faults as (t, kind, node)) from a traced run."""
    import io
    import json

    from executors.scenarios.format import parse_scenario

    buf = io.StringIO()
    Simulation(parse_scenario(sc_text), trace=buf).run()
    rank_of: dict[str, int] = {}
    crashes, nodes = [], []
    for line in buf.getvalue().splitlines():
        rec = json.loads(line)
        if rec.get("kind") == "command" and rec.get("type") == "StartReplica":
            rank_of[rec["replica"]] = rec["fields"]["global_rank"]
        elif rec.get("kind") == "fault" and rec.get("type") == "random_crash":
            crashes.append((round(rec["t"], 6), rank_of[rec["replica"]]))
        elif rec.get("kind") == "fault" and rec.get("type") in ("node_lost", "node_added"):
            nodes.append((round(rec["t"], 6), rec["type"], rec["node"]))
    return crashes, nodes


def test_common_random_numbers_crashes_do_not_move_with_the_cluster_size_or_start_latency() -> None:
    """Each rank has its own crash clock: 8, 9 or 11 nodes, or other start
    latencies, give the very same random crashes (time and rank)."""
    base, _ = _faults(CRN.format(nodes=8, low=60, node_faults=""))
    assert len(base) > 10
    assert _faults(CRN.format(nodes=9, low=60, node_faults=""))[0] == base
    assert _faults(CRN.format(nodes=11, low=90, node_faults=""))[0] == base


def test_random_node_loss_and_repair() -> None:
    """node_mtbf_hours and a constant repair time: every random loss is followed
    by the same node back exactly node_repair later (unless the run ends first),
    and the losses of the first 8 nodes do not move when spare nodes are added."""
    text = CRN.format(nodes=8, low=60, node_faults=", node_mtbf_hours: 12, node_repair: 900")
    _, nodes = _faults(text)
    lost = [(t, n) for t, kind, n in nodes if kind == "node_lost"]
    back = {(t, n) for t, kind, n in nodes if kind == "node_added"}
    assert len(lost) >= 3
    for t, n in lost:
        assert (round(t + 900, 6), n) in back or t + 900 > 21600
    _, more = _faults(CRN.format(nodes=10, low=60, node_faults=", node_mtbf_hours: 12, node_repair: 900"))
    first8 = {f"node-{i}" for i in range(8)}
    assert [x for x in more if x[2] in first8] == nodes


def test_node_loss_needs_a_duration_and_one_rate() -> None:
    from executors.scenarios.format import parse_scenario
    from executors.sim import ScenarioError

    with pytest.raises(ScenarioError, match="node_mtbf_hours: give node_loss_per_node_day or node_mtbf_hours"):
        parse_scenario("cluster: {nodes: 1}\nduration: 10\nfaults: {node_mtbf_hours: 1, node_loss_per_node_day: 1}\n"
                       "deployments: {llm: {}}\ntimeline: []\n")
    with pytest.raises(ScenarioError, match="needs a 'duration'"):
        parse_scenario("cluster: {nodes: 1}\nfaults: {node_loss_per_node_day: 1}\ndeployments: {llm: {}}\n"
                       "timeline: []\n")


HAND = """
cluster: {nodes: 1, gpus_per_node: 2}
duration: 110
latency: {place: 0, start: 10, ready: 0, stop: 0}
deployments:
  llm: {replicas: 2}
timeline:
  - deploy: llm
  - at: 50
    crash: {deployment: llm, rank: 0}
expect:
  - availability: {deployment: llm, at_least: 95}
  - full_strength: {deployment: llm, at_least: 90}
  - to_full_strength: {deployment: llm, max_at_most: 10}
  - non_contiguous: {deployment: llm, level: any, at_most_fraction: 0}
"""


def test_availability_metrics_against_a_hand_computed_timeline() -> None:
    """Both replicas serve from t=10 (first full strength); rank 0 crashes at 50
    and its replacement serves from 60; the run ends at 110. After start-up:
    100 s observed, 200 target replica-seconds, 190 serving: 95 % available,
    90 % of the time at full strength, 10 s one replica short, one drop that
    took 10 s to recover, never non-contiguous (the replacement keeps the rank)."""
    from executors.scenarios.format import parse_scenario

    result = Simulation(parse_scenario(HAND), check=True).run()
    _assert_all_expectations_met(result)
    m = result.metrics["deployments"]["llm"]
    assert m["first_healthy"] == 10.0 and m["observed_seconds"] == 100.0
    assert (m["availability_pct"], m["full_strength_pct"]) == (95.0, 90.0)
    assert m["seconds_short_by"] == {"1": 10.0}
    assert (m["to_full_strength_p50"], m["to_full_strength_max"], m["drops_below_full_strength"]) == (10.0, 10.0, 1)
    assert m["noncontiguous_fraction"] == {"rank": 0.0, "node_rank": 0.0, "local_rank": 0.0, "any": 0.0}
    # the same SLOs, a hair stricter, are missed (and say what was seen)
    strict = HAND.replace("at_least: 95}", "at_least: 95.1}").replace("max_at_most: 10}", "max_at_most: 9}")
    failures = {e.expectation.kind: e.detail for e in Simulation(parse_scenario(strict)).run().failures}
    assert set(failures) == {"availability", "to_full_strength"}
    assert "saw 95.0000%" in failures["availability"] and "max 10.0 s > 9 s" in failures["to_full_strength"]


RAMP = """
cluster: {nodes: 1, gpus_per_node: 4}
duration: 100
latency: {place: 0, start: 10, ready: 0, stop: 0}
deployments:
  llm: {replicas: 2}
timeline:
  - deploy: llm
  - at: 50
    scale: {deployment: llm, replicas: 4}
"""


def test_a_new_target_is_not_a_drop_below_full_strength() -> None:
    """Healthy at 10; at 50 the target goes 2 -> 4 and the new replicas serve
    from 60: the ramp up to a new target is no fault, so no drop. A crash of
    rank 0 during the ramp (55; its replacement serves from 65) is one: it
    lasts until full strength again, 10 s. Another at 80 (after full
    strength) is a second drop of 10 s."""
    from executors.scenarios.format import parse_scenario

    plain = Simulation(parse_scenario(RAMP), check=True).run().metrics["deployments"]["llm"]
    assert (plain["drops_below_full_strength"], plain["to_full_strength_max"]) == (0, None)
    assert plain["seconds_short_by"] == {"2": 10.0}  # the ramp still counts as time short
    crashes = RAMP + "  - at: 55\n    crash: {deployment: llm, rank: 0}\n" \
                     "  - at: 80\n    crash: {deployment: llm, rank: 1}\n"
    m = Simulation(parse_scenario(crashes), check=True).run().metrics["deployments"]["llm"]
    assert m["drops_below_full_strength"] == 2
    assert (m["to_full_strength_p50"], m["to_full_strength_max"]) == (10.0, 10.0)


BELOW = """
cluster: {nodes: 1, gpus_per_node: 4}
duration: 110
latency: {place: 0, start: 10, ready: 0, stop: 0}
deployments:
  llm: {replicas: 3}
timeline:
  - deploy: llm
  - at: 50
    crash: {deployment: llm, rank: 0}
  - at: 70
    scale: {deployment: llm, replicas: 1}
  - at: 90
    scale: {deployment: llm, replicas: 3}
expect:
  - below: {deployment: llm, replicas: 3, at_most_fraction: 0.25, at_most_seconds: 20}
  - below: {deployment: llm, replicas: 2, at_most_fraction: 0.125}
  - below: {deployment: llm, replicas: 1, at_most_seconds: 0}
"""


def test_time_below_k_replicas_against_a_hand_computed_timeline() -> None:
    """After start-up (t=10): 3 of 3 to 50, 2 of 3 to 60 (a crash), 3 of 3 to 70,
    1 of 1 to 90 (the nightly downscale: not a shortfall), 1 of 3 to 100 (the
    upscale starting), 3 of 3 to 110. The target asks for 3 during 80 s: below
    3 for 20 s (0.25), below 2 for 10 s (0.125), never below 1."""
    from executors.scenarios.format import ScenarioError, parse_scenario
    from executors.sim.runner import Simulation as Sim

    sim = Sim(parse_scenario(BELOW), check=True)
    result = sim.run()
    _assert_all_expectations_met(result)
    m = sim.metrics.deployments["llm"]
    assert (m.seconds_below(3), m.below_fraction(3)) == (20.0, 0.25)
    assert (m.seconds_below(2), m.below_fraction(2)) == (10.0, 0.125)
    assert (m.seconds_below(1), m.below_fraction(1)) == (0.0, 0.0)
    assert m.below_fraction(4) is None  # the target never asked for 4
    assert result.metrics["deployments"]["llm"]["seconds_at_strength"] == {
        "1/1": 20.0, "3/1": 10.0, "3/2": 10.0, "3/3": 60.0}
    strict = BELOW.replace("at_most_fraction: 0.25, at_most_seconds: 20}", "at_most_fraction: 0.2}")
    failures = [e.detail for e in Simulation(parse_scenario(strict)).run().failures]
    assert failures == ["below 3 serving for 20.0 s, 0.250000 of the time the target asked for 3+: "
                        "fraction 0.250000 > 0.2"]
    with pytest.raises(ScenarioError, match=r"expect\[0\]\.below: needs one of at_most_fraction, at_most_seconds"):
        parse_scenario(BELOW.replace(", at_most_fraction: 0.25, at_most_seconds: 20", ""))
    with pytest.raises(ScenarioError, match=r"below\.replicas: must be at least 1"):
        parse_scenario(BELOW.replace("replicas: 1, at_most_seconds", "replicas: 0, at_most_seconds"))


def test_non_contiguous_time_is_split_by_level() -> None:
    """node-loss-3-nodes: node ranks have a hole from the loss at 60 until the
    compaction at 90 (30 s); global and local ranks never do."""
    result = Simulation(load_scenario(EXAMPLES / "node-loss-3-nodes.yaml"), check=True).run()
    m = result.metrics["deployments"]["llm"]
    seconds = {lv: f * m["observed_seconds"] for lv, f in m["noncontiguous_fraction"].items()}
    assert abs(seconds["node_rank"] - 30.0) < 1e-3 and abs(seconds["any"] - 30.0) < 1e-3
    assert seconds["rank"] == 0.0 and seconds["local_rank"] == 0.0


def test_sweep_seeds_zip_json_and_csv(tmp_path: Path) -> None:
    """--seeds N runs each variant N times (seeds s..s+N-1); --zip pairs the
    --set values; --format json has every run's figures and a per-variant
    summary, csv a row per run and deployment."""
    import csv
    import json

    out = tmp_path / "sweep.json"
    result = CliRunner().invoke(main, [
        "simulate", str(EXAMPLES / "crash-storm.yaml"), "--seeds", "3", "--zip", "--jobs", "2",
        "--set", "latency.start.low=1,3", "--set", "latency.start.high=2,6", "--format", "json", "--output", str(out),
    ])
    assert result.exit_code in (0, 1), result.output
    data = json.loads(out.read_text())
    variants = [(r["variant"]["latency.start.low"], r["variant"]["latency.start.high"], r["seed"]) for r in data["runs"]]
    seed = load_scenario(EXAMPLES / "crash-storm.yaml").seed
    assert variants == [(1, 2, seed), (1, 2, seed + 1), (1, 2, seed + 2), (3, 6, seed), (3, 6, seed + 1), (3, 6, seed + 2)]
    assert [s["runs"] for s in data["summary"]] == [3, 3]
    fig = data["summary"][0]["figures"]["availability_pct"]
    avail = [r["metrics"]["deployments"]["llm"]["availability_pct"] for r in data["runs"][:3]]
    assert fig["min"] == min(avail) and fig["max"] == max(avail) and abs(fig["mean"] - sum(avail) / 3) < 1e-9
    assert data["invalid_variants"] == []
    result = CliRunner().invoke(main, ["simulate", str(EXAMPLES / "crash-storm.yaml"), "--seeds", "2",
                                       "--format", "csv", "--jobs", "1"])
    rows = list(csv.DictReader(result.stdout.splitlines()))
    assert [r["seed"] for r in rows] == [str(seed), str(seed + 1)] and all(r["deployment"] == "llm" for r in rows)
    assert float(rows[0]["availability_pct"]) > 90


def test_sweep_zip_needs_as_many_values() -> None:
    result = CliRunner().invoke(main, ["simulate", str(EXAMPLES / "crash-storm.yaml"), "--zip",
                                       "--set", "seed=1,2", "--set", "cluster.nodes=2,3,4"])
    assert result.exit_code == 2 and "as many values each" in result.output


def test_an_invalid_variant_is_reported_and_the_others_run() -> None:
    result = CliRunner().invoke(main, ["simulate", str(EXAMPLES / "crash-storm.yaml"),
                                       "--set", "faults.start_timeout=-1,300", "--format", "csv"])
    assert result.exit_code == 2
    assert "error: variant faults.start_timeout=-1: --set faults.start_timeout=-1: faults.start_timeout: " \
           "must be >= 0.001, got -1" in result.stderr
    assert result.stdout.count("\n") == 2  # the header and the one valid variant's run


# ---------------------------------------------- issue 19: what a planner prices
def test_sweep_summary_has_reassignments_reconfigures_crash_to_ready_and_per_level_contiguity(tmp_path: Path) -> None:
    """The JSON summary and the CSV carry, per variant, reassignments per level,
    rank and user_config reconfigures, crash-to-ready p50/p99 and non-contiguous
    time per level (fraction and seconds), each the runs' own figures."""
    import csv

    from executors.sweep import FIGURES

    out = tmp_path / "sweep.json"
    result = CliRunner().invoke(main, ["simulate", str(EXAMPLES / "node-loss-3-nodes.yaml"), "--seeds", "2",
                                       "--jobs", "1", "--set", "latency.start=2,4", "--format", "json",
                                       "--output", str(out)])
    assert result.exit_code in (0, 1), result.output
    data = json.loads(out.read_text())
    want = {"reassignments_rank", "reassignments_node_rank", "reassignments_local_rank", "reassignments_any",
            "reconfigures_rank", "reconfigures_user_config", "crash_to_ready_p50", "crash_to_ready_p99",
            "noncontig_rank", "noncontig_node_rank", "noncontig_local_rank", "noncontig_any",
            "noncontig_s_rank", "noncontig_s_node_rank", "noncontig_s_local_rank", "noncontig_s_any"}
    for row in data["summary"]:
        assert want <= set(row["figures"]), want - set(row["figures"])
    runs = [r["metrics"]["deployments"]["llm"] for r in data["runs"][:2]]
    fig = data["summary"][0]["figures"]

    def mean(values: list) -> float:
        return sum(values) / len(values)

    assert fig["reconfigures_rank"]["mean"] == mean([m["reconfigures"]["rank"] for m in runs])
    assert fig["reassignments_node_rank"]["mean"] == mean([m["reassignments"]["node_rank"] for m in runs])
    assert fig["crash_to_ready_p99"]["mean"] == mean([m["crash_to_ready_p99"] for m in runs])
    assert fig["noncontig_node_rank"]["max"] == max(m["noncontiguous_fraction"]["node_rank"] for m in runs)
    secs = [m["noncontiguous_fraction"]["node_rank"] * m["observed_seconds"] for m in runs]
    assert abs(fig["noncontig_s_node_rank"]["mean"] - mean(secs)) < 1e-9
    assert fig["noncontig_s_node_rank"]["mean"] > 0  # the node loss leaves node ranks non-contiguous a while
    result = CliRunner().invoke(main, ["simulate", str(EXAMPLES / "node-loss-3-nodes.yaml"), "--seeds", "2",
                                       "--jobs", "1", "--format", "csv"])
    header = next(csv.reader(result.stdout.splitlines()))
    assert [f.key for f in FIGURES] == [h for h in header if h in {f.key for f in FIGURES}]
    assert want <= set(header)


def test_sweep_tables_are_grouped_and_columns_can_be_chosen() -> None:
    """One narrow table per group of columns; --columns picks groups or figures; a typo is exit 2."""
    args = ["simulate", str(EXAMPLES / "node-loss-3-nodes.yaml"), "--seeds", "2", "--jobs", "1"]
    out = CliRunner().invoke(main, args).stdout
    for title in ("avail. %", "crash→ready p50 s", "crash→ready p99 s", "reassigned", "reconfigures", "node frac."):
        assert title in out, title
    for group in ("availability", "recovery", "ranks", "contiguity"):
        assert re.search(rf"\b{group}\s+\(mean", out), group
    assert "non-contig" in out and "contiguity_s" not in out  # seconds: in JSON/CSV, or asked for
    assert max(len(line) for line in out.splitlines()) <= 200
    only = CliRunner().invoke(main, [*args, "--columns", "ranks,noncontig_s_node_rank"]).stdout
    assert re.search(r"\branks\s+\(mean", only) and re.search(r"\bcontiguity_s\s+\(mean", only)
    assert "node s" in only and not re.search(r"\bavailability\s+\(mean", only)
    assert not re.search(r"┃\s+avail\. %\s+┃", only) and not re.search(r"┃\s+any s\s+┃", only)
    assert re.search(r"┃\s+avail\. %\s+┃", out)
    bad = CliRunner().invoke(main, [*args, "--columns", "rankz"])
    assert bad.exit_code == 2 and "unknown column 'rankz'" in bad.output and "ranks" in bad.output


CLUSTER_LOSS = """
cluster: {{nodes: {nodes}, gpus_per_node: 2}}
duration: {days}d
seed: 7
latency: {{start: 5}}
faults: {{{faults}, node_repair: 60}}
deployments:
  llm: {{replicas: 2}}
timeline:
  - deploy: llm
"""


def _losses(nodes: int, faults: str, days: int = 100) -> list:
    text = CLUSTER_LOSS.format(nodes=nodes, faults=faults, days=days).replace(f"{days}d", str(days * 86400))
    return [(t, n) for t, kind, n in _faults(text)[1] if kind == "node_lost"]


def test_a_cluster_wide_node_loss_rate_loses_nodes_at_that_rate_whatever_the_node_count() -> None:
    """node_loss_per_cluster_day: 2 over 100 days is ~200 losses on 4 nodes and
    on 16 (the very same times: one clock for the cluster), spread over the
    nodes; node_loss_per_node_day: 0.5 (the same 2 a day on 4 nodes) makes 16
    nodes lose ~4 times as many."""
    four = _losses(4, "node_loss_per_cluster_day: 2")
    sixteen = _losses(16, "node_loss_per_cluster_day: 2")
    assert abs(len(four) - 200) < 4 * 200 ** 0.5, len(four)  # Poisson: sd = sqrt(200) ~ 14
    assert [t for t, _ in sixteen] == [t for t, _ in four]
    assert len({n for _, n in sixteen}) == 16 and len({n for _, n in four}) == 4
    per_node = _losses(16, "node_loss_per_node_day: 0.5")
    assert abs(len(per_node) - 800) < 4 * 800 ** 0.5, len(per_node)


def test_cluster_wide_node_loss_is_validated_and_refused_on_ray() -> None:
    from executors.ray_gpu.scenario import UnsupportedOnRay, check_supported
    from executors.scenarios.format import parse_scenario
    from executors.sim import ScenarioError

    body = "deployments: {llm: {}}\ntimeline: []\n"
    with pytest.raises(ScenarioError, match=r"faults\.node_loss_per_cluster_day: must be >= 0"):
        parse_scenario("cluster: {nodes: 1}\nduration: 10\nfaults: {node_loss_per_cluster_day: -1}\n" + body)
    with pytest.raises(ScenarioError, match=r"node_loss_per_cluster_day: a random node loss rate needs a 'duration'"):
        parse_scenario("cluster: {nodes: 1}\nfaults: {node_loss_per_cluster_day: 1}\n" + body)
    sc = parse_scenario("cluster: {nodes: 2}\nduration: 10\nfaults: {node_loss_per_cluster_day: 1}\n" + body)
    assert sc.cluster_node_loss_rate == 1 / 86400 and sc.node_loss_rate == 0 and sc.node_repair is not None
    with pytest.raises(UnsupportedOnRay, match=r"faults\.node_loss_per_cluster_day"):
        check_supported(sc, multi_node=True)
    result = CliRunner().invoke(main, ["simulate", str(EXAMPLES / "crash-storm.yaml"),
                                       "--set", "faults.node_loss_per_cluster_dya=1"])
    assert result.exit_code == 2 and "node_loss_per_cluster_day" in result.output  # did you mean


def test_a_crash_loop_is_unhealthy_while_its_starts_keep_failing_and_backs_off() -> None:
    """crash-loop-backoff.yaml in the simulator: StartReplicas at 0, 2.1, then 1, 2, 4, 8 s after each
    failure; UNHEALTHY from the third failure in a row (7.3) to the sixth start's ready (27.6)."""
    import io
    import json

    from executors.sim import load_scenario

    sc = load_scenario(ROOT / "examples" / "scenarios" / "crash-loop-backoff.yaml")
    buf = io.StringIO()
    sim = Simulation(sc, trace=buf)
    statuses = []
    sim.driver.observers.append(lambda t, e, before, result: statuses.append(
        (t, result.state.deployments["llm"].status) if "llm" in result.state.deployments else (t, None)))
    assert sim.run().passed
    starts = [round(r["t"], 1) for r in map(json.loads, buf.getvalue().splitlines())
              if r.get("type") == "StartReplica"]
    assert starts == [0.0, 2.1, 5.2, 9.3, 15.4, 25.5]
    unhealthy = [t for t, s in statuses if s == "UNHEALTHY"]
    assert unhealthy and min(unhealthy) == pytest.approx(7.3) and max(unhealthy) < 27.6
    assert statuses[-1][1] == "HEALTHY"


# ------------------------------------------ recovery: orphans and unresponsive replicas
ORPHAN_EXAMPLE = EXAMPLES / "controller-crash-orphan-unresponsive.yaml"


def _recs(text: str) -> list[dict]:
    return [json.loads(line) for line in text.splitlines() if line.strip()]


def _recovery_order(recs: list[dict], hung: str, orphan: str, rank: int) -> None:
    """The core was told (ControllerRecovered lists the hung replica as unresponsive and
    the orphan as unknown) and stopped both in that step; the hung one at once, and its
    rank started again only after its ReplicaStopped."""
    (rec,) = [i for i, r in enumerate(recs) if r.get("type") == "ControllerRecovered"]
    assert recs[rec]["fields"]["unresponsive"] == [hung] and recs[rec]["fields"]["unknown"] == [orphan]
    stops = {r["replica"]: i for i, r in enumerate(recs) if r.get("kind") == "command" and r["type"] == "StopReplica"}
    assert rec < stops[hung] and rec < stops[orphan]
    assert recs[stops[hung]]["fields"]["graceful_shutdown_timeout_s"] == 0
    (stopped,) = [i for i, r in enumerate(recs) if r.get("type") == "ReplicaStopped" and r["replica"] == hung]
    again = [i for i, r in enumerate(recs[rec:], rec) if r.get("kind") == "command" and r["type"] == "StartReplica"
             and r["fields"]["global_rank"] == rank]
    assert len(again) == 1 and stops[hung] < stopped < again[0]


def test_a_recovery_reports_a_hung_replica_unresponsive_and_an_orphan_unknown_and_the_core_stops_both() -> None:
    buf = io.StringIO()
    sim = Simulation(load_scenario(ORPHAN_EXAMPLE), trace=buf, check=True)
    result = sim.run()
    _assert_all_expectations_met(result)
    recs = _recs(buf.getvalue())
    _recovery_order(recs, "llm#1", "llm-old#0", 1)
    (found,) = [r for r in recs if r.get("kind") == "fault" and r["type"] == "controller_recovered"]
    assert found["unresponsive"] == ["llm#1"] and found["unknown"] == ["llm-old#0"] and found["reports"] == 4
    # the orphan is gone from the world, and the hung replica with it; nothing else was stopped
    assert sorted(sim.backend.replicas) == ["llm#0", "llm#2", "llm#3", "llm#4"]
    stopped = sorted(r["replica"] for r in recs if r.get("kind") == "command" and r["type"] == "StopReplica")
    assert stopped == ["llm#1", "llm-old#0"]
    assert sorted(result.state.ranks("llm")) == ["llm#0", "llm#2", "llm#3", "llm#4"]


HANG_THEN_CRASH = """
name: hang then crash
cluster: {nodes: 2, gpus_per_node: 2}
deployments:
  llm: {replicas: 2, health_check_period_s: 2, health_check_timeout_s: 1, health_check_failure_threshold: 3}
timeline:
  - deploy: llm
  - wait_until_healthy: llm
  - at: 30
    hang: {deployment: llm, rank: 0}
  - at: 30.5
    crash_controller: {recover_after: 5}
  - wait_until_healthy: llm
expect:
  - running: {deployment: llm, equals: 2}
"""


def test_a_replica_that_hung_before_the_controller_crash_is_unresponsive_to_the_recovery() -> None:
    """A hang with the controller up, the crash before its first failed check: the core
    never counted a failure; the recovery finds the replica silent and stops it first."""
    from executors.scenarios.format import parse_scenario

    buf = io.StringIO()
    result = Simulation(parse_scenario(HANG_THEN_CRASH), trace=buf, check=True).run()
    assert result.passed, _failures(result)
    recs = _recs(buf.getvalue())
    assert not [r for r in recs if r.get("type") == "HealthChecked"]  # (the failures fell in the downtime)
    (rec,) = [r for r in recs if r.get("type") == "ControllerRecovered"]
    assert rec["fields"]["unresponsive"] == ["llm#0"] and rec["fields"]["unknown"] == []
    (stop,) = [r for r in recs if r.get("kind") == "command" and r["type"] == "StopReplica"]
    assert stop["replica"] == "llm#0" and stop["t"] == 35.5


@pytest.mark.parametrize("action, error", [
    ("orphan: {deployment: llm}", r"timeline\[1\]\.orphan\.deployment: 'llm' is a declared deployment"),
    ("orphan: {deployment: old, replica: 'llm#3'}", r"timeline\[1\]\.orphan\.replica: must be 'old#<number>'"),
    ("orphan: {deployment: old, replica: 'old#x'}", r"timeline\[1\]\.orphan\.replica: must be 'old#<number>'"),
    ("orphan: {deployment: 'a:b'}", r"timeline\[1\]\.orphan\.deployment: must not contain ':'"),
    ("orphan: {deployment: old, node: node-0}", r"timeline\[1\]\.orphan\.node: unknown field"),
])
def test_an_orphan_names_a_deployment_no_spec_names(action: str, error: str) -> None:
    from executors.scenarios.format import ScenarioError, parse_scenario

    with pytest.raises(ScenarioError, match=error):
        parse_scenario(f"cluster: {{nodes: 1}}\ndeployments: {{llm: {{}}}}\ntimeline:\n  - deploy: llm\n  - {action}\n"
                       f"  - crash_controller: {{}}\n")


def test_an_orphan_is_given_by_name_and_warned_about_when_no_recovery_would_find_it() -> None:
    from executors.scenarios.format import parse_scenario

    sc = parse_scenario("cluster: {nodes: 1}\ndeployments: {llm: {}}\ntimeline:\n  - orphan: old\n"
                        "  - crash_controller: {}\n  - orphan: {deployment: old, replica: 'old#7'}\n")
    from executors.scenarios.timeline import Orphan

    assert [(a.deployment, a.replica) for a in sc.timeline if isinstance(a, Orphan)] == [("old", "old#0"),
                                                                                         ("old", "old#7")]
    assert [w for w in sc.warnings if "orphan" in w] == [
        "timeline[2] orphan: no crash_controller after it, so no recovery finds old#7 (an orphan is seen only by "
        "a recovering controller)"]


def test_unreported_gpus_runs_on_a_scenario_shaped_ray_cluster_only() -> None:
    from executors.ray_gpu.scenario import UnsupportedOnRay, check_supported, needs_cluster

    sc = load_scenario(EXAMPLES / "refused-placement.yaml")
    assert needs_cluster(sc)  # (so `rankcore run --executor ray` starts one: --cluster auto)
    check_supported(sc, multi_node=True)
    with pytest.raises(UnsupportedOnRay, match=r"cluster\.nodes node-0: unreported_gpus .*--cluster scenario"):
        check_supported(sc, multi_node=False)
    check_supported(load_scenario(ORPHAN_EXAMPLE))  # hang and orphan run on one local node


def test_the_controller_does_not_subtract_a_fault_injection_group_from_its_node() -> None:
    from executors.ray_gpu.control.controller import UNSEEN_GROUP_PREFIX, held_by_callers

    def group(name: str) -> dict:
        return {"name": name, "state": "CREATED", "bundles": {0: {"GPU": 1.0}}, "bundles_to_node_id": {0: "n0"}}

    table = {"a": group("trainer"), "b": group(f"{UNSEEN_GROUP_PREFIX}node-0"), "c": group("rankcore:llm:llm#0")}
    assert held_by_callers(table) == {"n0": {"GPU": 1.0}}  # the trainer's only


ORPHAN_DIES = """
name: orphans die unheard
cluster: {nodes: 2, gpus_per_node: 2}
deployments:
  llm: {replicas: 2}
timeline:
  - deploy: llm
  - wait_until_healthy: llm
  - orphan: old
  - lose_node: node-0
  - orphan: {deployment: old, replica: "old#3"}
  - orphan: {deployment: old, replica: "old#4"}
  - crash: {replica: "old#3"}
  - hang: {replica: "old#4"}
  - wait_until_healthy: llm
  - wait: 30
  - crash_controller: {}
  - wait_until_healthy: llm
expect:
  - running: {deployment: llm, equals: 2}
"""


def test_the_controller_hears_nothing_of_an_orphan_until_a_recovery_finds_it() -> None:
    """An orphan's death (a crash, its node lost) and its health are news to nobody
    (on Ray the controller does not watch an actor it never started); a recovery
    finds the survivors (old#4 hung: unresponsive, and stopped)."""
    from executors.scenarios.format import parse_scenario

    buf = io.StringIO()
    sim = Simulation(parse_scenario(ORPHAN_DIES), trace=buf, check=True)
    result = sim.run()
    assert result.passed, _failures(result)
    recs = _recs(buf.getvalue())
    about = [r for r in recs if r.get("kind") in ("event", "command") and (r.get("replica") or "").startswith("old#")]
    (rec,) = [r for r in recs if r.get("type") == "ControllerRecovered"]
    # old#0 died with node-0 (then the first node), old#3 was crashed: neither is reported
    assert rec["fields"]["unknown"] == ["old#4"] and rec["fields"]["unresponsive"] == ["old#4"]
    assert [(r["type"], r["replica"]) for r in about] == [("StopReplica", "old#4"), ("ReplicaStopped", "old#4")]
    assert about[0]["t"] == rec["t"] and not sim.backend.orphans and "old#4" not in sim.backend.replicas


def test_a_hung_replica_answers_no_reconfigure_and_drains_nothing_in_the_simulator():
    """As on Ray (a frozen process): a config update leaves the hung replica
    reconfiguring (no ReplicaReconfigured), and a downscale's graceful stop of
    it lasts the whole graceful_shutdown_timeout_s."""
    import io as _io

    from executors.scenarios.format import parse_scenario
    from executors.sim import Simulation as _Sim

    text = """
name: hung
seed: 1
cluster: {nodes: 1, gpus_per_node: 2}
latency: {place: 0.1, start: 1, reconfigure: 0.5, stop: 1}
deployments:
  llm: {replicas: 2, user_config: {v: 1}, health_check_period_s: 100, health_check_timeout_s: 100,
        graceful_shutdown_timeout_s: 7}
timeline:
  - deploy: llm
  - wait_until_healthy: {deployment: llm, timeout: 30}
  - at: 10
    hang: {deployment: llm, rank: 1}
  - at: 11
    update_config: {deployment: llm, user_config: {v: 2}}
  - at: 20
    scale: {deployment: llm, replicas: 1}
"""
    buf = _io.StringIO()
    _Sim(parse_scenario(text, "hung.yaml"), trace=buf).run()
    recs = [json.loads(line) for line in buf.getvalue().splitlines()]
    hung = next(r for r in recs if r["kind"] == "fault" and r["type"] == "hang")["replica"]
    answered = [r["replica"] for r in recs if r.get("type") == "ReplicaReconfigured"]
    assert answered and hung not in answered  # the other one answered its reconfigure
    stop = next(r for r in recs if r.get("kind") == "command" and r["type"] == "StopReplica" and r["replica"] == hung)
    gone = next(r for r in recs if r.get("type") == "ReplicaStopped" and r["replica"] == hung)
    assert stop["t"] == 20.0 and gone["t"] == pytest.approx(27.0)
