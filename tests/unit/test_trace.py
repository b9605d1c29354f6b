"""Traces: a simulator trace passes ``check_trace_file``; tampered copies are
caught with the right kind of error; the ``check-trace`` CLI's exit codes;
``plot_trace`` writes PNGs."""

from __future__ import annotations

import io
import json
import sys
from pathlib import Path

import pytest
from click.testing import CliRunner

import rankcore as rc
from executors.checktrace import TraceFormatError, TraceReport, check_trace_file
from executors.cli import main
from executors.sim import Simulation, load_scenario
from tests.helpers import checked_run

ROOT = Path(__file__).resolve().parents[2]
DOWNSCALE = ROOT / "examples" / "scenarios" / "downscale-8-to-4.yaml"
PNG_MAGIC = b"\x89PNG\r\n\x1a\n"

CRASH_YAML = """\
name: one crash then a config update
seed: 3
cluster: {nodes: 2, gpus_per_node: 4}
deployments:
  llm: {replicas: 4, user_config: {m: 1}}
timeline:
  - deploy: llm
  - wait_until_healthy: llm
  - after: 10
    crash: {deployment: llm, rank: 1}
  - wait_until_healthy: llm
  - after: 5
    update_config: {deployment: llm, user_config: {m: 2}}
  - wait_until_healthy: llm
expect:
  - contiguous: llm
"""


# ------------------------------------------------------------------ helpers
def _trace_text(scenario: Path, **kwargs) -> str:
    """The trace of a scenario, every step's delta verified (``tests.helpers.checked_run``)."""
    return checked_run(scenario, **kwargs)[1]


def _records(text: str) -> list[dict]:
    return [json.loads(line) for line in text.splitlines()]


def _dump(records: list[dict]) -> str:
    return "".join(json.dumps(r, separators=(",", ":")) + "\n" for r in records)


def _write(tmp_path: Path, text: str, name: str = "trace.jsonl") -> Path:
    p = tmp_path / name
    p.write_text(text)
    return p


@pytest.fixture(scope="module")
def downscale_text() -> str:
    return _trace_text(DOWNSCALE)


@pytest.fixture
def crash_scenario(tmp_path: Path) -> Path:
    p = tmp_path / "crash.yaml"
    p.write_text(CRASH_YAML)
    return p


def _first(records: list[dict], **match) -> int:
    """Index of the first record whose keys (and ``fields`` keys, prefixed f_) match."""
    for i, r in enumerate(records):
        if all((r.get("fields", {}).get(k[2:]) if k.startswith("f_") else r.get(k)) == v
               for k, v in match.items()):
            return i
    raise AssertionError(f"no record matches {match}")


# ------------------------------------------------------------- good traces
def test_simulator_trace_passes(tmp_path, downscale_text):
    report = check_trace_file(_write(tmp_path, downscale_text))
    assert isinstance(report, TraceReport)
    assert report.ok and report.violations == [], report.violations
    assert report.complete
    c = report.counts
    assert c["header"] == 1 and c["end"] == 1 and c["expectation"] >= 1
    assert c["steps"] == c["event"] > 0
    # a delta after every step that changed a deployment but the first (the nodes joining at t=0
    # change none; the deployment's first step is a full "sync" snapshot), full snapshots now and then
    joins = sum(1 for r in _records(downscale_text) if r["kind"] == "event" and r["type"] == "NodeJoined")
    assert joins == 2  # node-a, node-b
    assert c["delta"] == c["steps"] - joins - 1
    assert c["snapshots_checked"] == c["snapshot"] and 3 <= c["snapshot"] < c["delta"]
    assert report.checks["snapshot_equal"] == c["snapshot"] - 1  # all but the sync one
    assert report.checks["healthy_state"] == 2  # healthy at 8, then at 4
    assert report.checks["rank_reconfigure"] == 2  # llm#4 -> 0 and llm#7 -> 3
    assert report.checks["world_size"] > 0 and report.checks["rank_change"] > 0
    text = report.summary()
    assert isinstance(text, str) and "\n" not in text and "OK" in text


def test_thinned_and_crash_traces_pass(tmp_path, crash_scenario):
    for every in (1, 3, 1000):
        report = check_trace_file(_write(tmp_path, _trace_text(crash_scenario, snapshot_every=every)))
        assert report.ok, (every, report.violations)
        assert report.checks["replacement"] == 1  # the crash's replacement inherits rank 1
    assert report.counts["snapshot"] < report.counts["steps"]  # thinned: healthy + end only


def test_trace_is_byte_identical_for_same_seed(downscale_text):
    assert _trace_text(DOWNSCALE) == downscale_text


# ---------------------------------------------------------------- violations
def test_duplicate_rank_in_snapshot_is_a_violation(tmp_path, downscale_text):
    recs = _records(downscale_text)
    i = max(j for j, r in enumerate(recs) if r["kind"] == "snapshot" and r["reason"] == "end")
    reps = recs[i]["deployments"]["llm"]["replicas"]
    a, b = sorted(reps)[:2]
    reps[b]["rank"] = list(reps[a]["rank"])
    reps[b]["global_rank"] = reps[a]["global_rank"]
    report = check_trace_file(_write(tmp_path, _dump(recs)))
    assert not report.ok
    assert any(v.startswith(f"line {i + 1}: ") and "held twice" in v
               for v in report.violations), report.violations


def test_replacement_with_another_rank_is_a_violation(tmp_path, crash_scenario):
    recs = _records(_trace_text(crash_scenario))
    i = next(j for j, r in enumerate(recs) if r.get("type") == "StartReplica" and r["fields"]["replaces"])
    recs[i]["rank"][0] = 3
    recs[i]["fields"]["rank"] = 3
    report = check_trace_file(_write(tmp_path, _dump(recs)))
    assert any(v.startswith(f"line {i + 1}: ") and "replaces" in v and "held global rank 1" in v
               for v in report.violations), report.violations


def test_rank_reconfigure_repeating_the_old_rank_is_a_violation(tmp_path, downscale_text):
    recs = _records(downscale_text)
    i = _first(recs, type="ReconfigureReplica", replica="llm#4")
    recs[i]["rank"] = [4, 0, 2]  # what InitializeReplica gave llm#4
    recs[i]["fields"]["rank"] = [4, 0, 2]
    report = check_trace_file(_write(tmp_path, _dump(recs)))
    assert any(v.startswith(f"line {i + 1}: ") and "already given" in v for v in report.violations)
    assert any("the state after the step says [0, 0, 0]" in v for v in report.violations)


def test_missing_rank_reconfigure_is_a_violation(tmp_path, downscale_text):
    recs = _records(downscale_text)
    del recs[_first(recs, type="ReconfigureReplica", replica="llm#7")]
    report = check_trace_file(_write(tmp_path, _dump(recs)))
    assert any("llm/llm#7" in v and "without a rank reconfigure" in v
               for v in report.violations), report.violations


def test_world_size_violations(tmp_path, downscale_text):
    recs = _records(downscale_text)
    i = _first(recs, type="StartReplica", replica="llm#2")
    recs[i]["fields"]["world_size"] = 7
    j = _first(recs, type="UpdateWorldSize")
    del recs[j]
    report = check_trace_file(_write(tmp_path, _dump(recs)))
    assert any(v.startswith(f"line {i + 1}: ") and "world_size 7, the target is 8" in v
               for v in report.violations)
    assert any("target 8 -> 4 but UpdateWorldSize sent []" in v for v in report.violations), report.violations
    assert report.violation_count == len(report.violations) == 2  # all collected, nothing else


def test_violations_are_all_collected(tmp_path, downscale_text):
    recs = _records(downscale_text)
    n = 0
    for r in recs:
        if r["kind"] == "snapshot" and r["deployments"]["llm"]["healthy"]:
            reps = r["deployments"]["llm"]["replicas"]
            first = sorted(reps)[0]
            reps[first]["rank"][0] += 100  # not contiguous although healthy, global_rank disagrees
            n += 1
    report = check_trace_file(_write(tmp_path, _dump(recs)))
    assert n >= 2 and report.violation_count >= 2 * n
    assert all(v.startswith("line ") for v in report.violations)
    assert "FAILED" in report.summary()


# ------------------------------------------------------------------ malformed
def _malformed(tmp_path: Path, text: str | bytes) -> str:
    p = tmp_path / "bad.jsonl"
    if isinstance(text, bytes):
        p.write_bytes(text)
    else:
        p.write_text(text)
    with pytest.raises(TraceFormatError) as info:
        check_trace_file(p)
    msg = str(info.value)
    assert "\n" not in msg and msg.startswith(str(p))
    return msg


def test_missing_header(tmp_path, downscale_text):
    msg = _malformed(tmp_path, downscale_text.split("\n", 1)[1])
    assert "line 1" in msg and "header" in msg


def test_wrong_schema_and_version(tmp_path, downscale_text):
    recs = _records(downscale_text)
    recs[0]["version"] = 1
    assert "version 1" in _malformed(tmp_path, _dump(recs))
    recs[0]["version"], recs[0]["schema"] = 3, "other"
    assert "header" in _malformed(tmp_path, _dump(recs))


def test_not_json_line(tmp_path, downscale_text):
    lines = downscale_text.splitlines(True)
    lines.insert(5, "this is {not json\n")
    msg = _malformed(tmp_path, "".join(lines))
    assert "line 6" in msg and "not JSON" in msg


def test_time_going_backwards(tmp_path, downscale_text):
    recs = _records(downscale_text)
    i = _first(recs, type="ReplicaReady")
    recs[i]["t"] = 0.05
    msg = _malformed(tmp_path, _dump(recs))
    assert f"line {i + 1}" in msg and "backwards" in msg


def test_missing_or_mistyped_field(tmp_path, downscale_text):
    recs = _records(downscale_text)
    i = _first(recs, type="ReplicaPlaced")
    del recs[i]["stale"]
    msg = _malformed(tmp_path, _dump(recs))
    assert f"line {i + 1}" in msg and "'stale'" in msg
    recs = _records(downscale_text)
    i = _first(recs, type="ReconfigureReplica")
    recs[i]["rank"] = [0, None, 0]
    assert f"line {i + 1}" in _malformed(tmp_path, _dump(recs))


@pytest.mark.parametrize("edit, words", [
    (lambda recs: recs.append({"kind": "event", "t": 1e9, "type": "ReplicaReady", "deployment": "llm",
                               "replica": "llm#1", "node": None, "rank": None, "phase": None, "stale": True,
                               "fields": {}}), "after the end record"),
    (lambda recs: recs.insert(3, {"kind": "gossip", "t": 0.0}), "unknown record kind"),
    (lambda recs: recs.insert(1, dict(recs[0])), "second header"),
    (lambda recs: recs.insert(1, dict(next(r for r in recs if r["kind"] == "command"))), "outside a step"),
])
def test_structural_errors(tmp_path, downscale_text, edit, words):
    recs = _records(downscale_text)
    edit(recs)
    assert words in _malformed(tmp_path, _dump(recs))


def test_unreadable_inputs(tmp_path):
    assert "no header" in _malformed(tmp_path, "")
    assert "header" in _malformed(tmp_path, "[1, 2, 3]\n")
    assert "header" in _malformed(tmp_path, "42\n")
    header = '{"kind":"header","schema":"rankcore-trace","version":3}\n'
    assert "line 2: a record must be an object" in _malformed(tmp_path, header + "null\n")
    assert "UTF-8" in _malformed(tmp_path, b'{"kind":"header"\xff}\n')
    with pytest.raises(TraceFormatError, match="cannot read"):
        check_trace_file(tmp_path / "missing.jsonl")


# ------------------------------------------------------------------------ CLI
def test_check_trace_cli_exit_codes(tmp_path, downscale_text):
    good = _write(tmp_path, downscale_text, "good.jsonl")
    res = CliRunner().invoke(main, ["check-trace", str(good)])
    assert res.exit_code == 0, res.output
    assert "OK" in res.output

    recs = _records(downscale_text)
    del recs[_first(recs, type="UpdateWorldSize")]
    res = CliRunner().invoke(main, ["check-trace", str(_write(tmp_path, _dump(recs), "violation.jsonl"))])
    assert res.exit_code == 1, res.output

    res = CliRunner().invoke(main, ["check-trace", str(_write(tmp_path, "not json\n", "malformed.jsonl"))])
    assert res.exit_code == 2, res.output


# ----------------------------------------------------------------------- plot
def _assert_png(path: Path) -> None:
    data = path.read_bytes()
    assert data[:8] == PNG_MAGIC
    assert len(data) > 20_000


def test_plot_downscale(tmp_path, downscale_text):
    from executors.sim.plot import plot_trace

    out = plot_trace(_write(tmp_path, downscale_text), tmp_path / "downscale.png", title="downscale")
    assert out == tmp_path / "downscale.png"
    _assert_png(out)


def test_plot_crash_scenario_and_one_deployment(tmp_path, crash_scenario):
    from executors.sim.plot import _read, plot_trace

    trace = _write(tmp_path, _trace_text(crash_scenario))
    _assert_png(plot_trace(trace, tmp_path / "crash.png"))
    _assert_png(plot_trace(trace, tmp_path / "llm.png", deployment="llm"))
    with pytest.raises(ValueError, match="no deployment 'nope'"):
        plot_trace(trace, tmp_path / "nope.png", deployment="nope")
    d = _read(trace).deployments["llm"]
    assert len(d.crashes) == 1 and d.crashes[0][1] == 1  # the crash of rank 1
    assert {why for _, _, why, _ in d.reconfigures} == {"user_config"}
    assert [w for _, w in d.world] == [4]


def test_plot_is_the_same_with_thinned_snapshots(tmp_path, crash_scenario):
    from executors.sim.plot import _read

    def timeline(every: int):
        d = _read(_write(tmp_path, _trace_text(crash_scenario, snapshot_every=every))).deployments["llm"]
        return sorted(d.segments), sorted(d.holdings), d.crashes, d.reconfigures, d.world

    assert timeline(1000) == timeline(1)


def test_simulate_plot_cli(tmp_path, crash_scenario):
    out = tmp_path / "cli.png"
    res = CliRunner().invoke(main, ["simulate", str(crash_scenario), "--plot", str(out), "--quiet"])
    assert res.exit_code == 0, res.output
    _assert_png(out)


def test_plot_without_matplotlib_says_what_to_install(tmp_path, downscale_text, monkeypatch):
    from executors.sim.plot import plot_trace

    monkeypatch.setitem(sys.modules, "matplotlib", None)  # makes `import matplotlib` fail
    with pytest.raises(ImportError, match=r"pip install matplotlib.*rankcore\[plot\]"):
        plot_trace(_write(tmp_path, downscale_text), tmp_path / "x.png")


# ------------------------------------------------- replicas that vanish (issue 8, point 5)
CONTROLLER_CRASH = ROOT / "examples" / "scenarios" / "controller-crash.yaml"


# (Every example's trace, its departures explained: tests/integration/test_scenarios.py, beside the
# checked run it reads, so an example is simulated once in the process that runs both.)


def test_a_replica_gone_from_a_delta_without_a_stop_is_flagged(tmp_path, downscale_text):
    """Hand-edited: a stopping victim disappears one step before its ReplicaStopped
    (its departure moved to the delta before)."""
    recs = _records(downscale_text)
    stopped = _first(recs, type="ReplicaStopped", replica="llm#6")
    at = next(i for i in range(stopped, len(recs)) if recs[i]["kind"] == "delta")
    earlier = max(i for i, r in enumerate(recs[:stopped]) if r["kind"] == "delta")
    assert recs[at]["deployments"]["llm"]["replicas"].pop("llm#6") is None
    assert "llm#6" not in recs[earlier]["deployments"]["llm"]["replicas"]
    recs[earlier]["deployments"]["llm"]["replicas"]["llm#6"] = None
    report = check_trace_file(_write(tmp_path, _dump(recs)))
    assert report.violations == [
        f"line {earlier + 1}: llm/llm#6 (stopping before line {earlier + 1}) is gone without a "
        "ReplicaStopped, ReplicaCrashed or NodeLost event, a fault naming it or its node, or a recovery "
        "while it was stopping"], report.violations


def test_a_crash_while_the_controller_is_down_needs_its_fault_record(tmp_path):
    """controller-crash.yaml: two replicas die while the controller is down; the
    trace shows only their ``crash`` faults (the events are lost). Without one of
    them, that replica vanishes at the recovery unexplained."""
    recs = _records(_trace_text(CONTROLLER_CRASH))
    assert check_trace_file(_write(tmp_path, _dump(recs))).ok
    crash = _first(recs, kind="fault", type="crash", replica="llm#5")
    del recs[crash]
    report = check_trace_file(_write(tmp_path, _dump(recs)))
    assert report.violation_count == 1 and "llm/llm#5 (running before line" in report.violations[0]


def test_node_loss_explains_its_replicas_by_event_or_fault(tmp_path):
    """The three replicas of the lost node leave through the NodeLost event, or
    the node_lost fault; with neither (and no replacement naming them), each is
    flagged."""
    path = ROOT / "examples" / "scenarios" / "node-loss-3-nodes.yaml"
    recs = _records(_trace_text(path))
    fault = recs.pop(_first(recs, kind="fault", type="node_lost"))
    lost = _first(recs, type="NodeLost")
    for r in recs:
        if r.get("type") == "StartReplica" and r["fields"]["replaces"]:
            r["fields"]["replaces"] = None
    assert check_trace_file(_write(tmp_path, _dump(recs))).ok  # the NodeLost event explains them
    recs[lost].update(type="ReplicaReady", node=None)  # (a no-op step now)
    report = check_trace_file(_write(tmp_path, _dump(recs)))
    assert report.violation_count == 3 and all("is gone without" in v for v in report.violations)
    recs.insert(lost, fault)
    assert check_trace_file(_write(tmp_path, _dump(recs))).ok  # the fault explains them


# ------------------------------------------------------ rejected events (issue 8, point 7)
def test_a_rejected_event_record_is_reported(tmp_path, downscale_text):
    import rankcore as rc
    from executors.trace import TraceWriter

    buf = io.StringIO()
    TraceWriter(buf, header=False).rejected(
        1.0, rc.ReplicaReady(replica_id="llm#0"), rc.InvalidEvent("replica 'llm#0' is running: 'ready' is not allowed"))
    rec = json.loads(buf.getvalue())
    assert rec == {"kind": "rejected", "t": 1.0, "type": "ReplicaReady", "deployment": None, "replica": "llm#0",
                   "error": "replica 'llm#0' is running: 'ready' is not allowed", "error_type": "InvalidEvent",
                   "fields": {"replica_id": "llm#0"}}
    recs = _records(downscale_text)
    at = _first(recs, type="ScaleRequested")
    rec["t"] = recs[at]["t"]
    recs.insert(at, rec)
    report = check_trace_file(_write(tmp_path, _dump(recs)))
    assert report.counts["rejected"] == 1
    assert report.violations == [f"line {at + 1}: the core rejected a ReplicaReady event about llm#0: replica "
                                 f"'llm#0' is running: 'ready' is not allowed (the executor carried on without it)"]
    res = CliRunner().invoke(main, ["check-trace", str(tmp_path / "trace.jsonl")])
    assert res.exit_code == 1 and "rejected" in res.output
    del recs[at]["error"]
    assert "'error'" in _malformed(tmp_path, _dump(recs))


def test_plot_time_unit_and_window(tmp_path, downscale_text):
    """A long run's axis is in hours or days; a window shows part of a run and a
    window outside it is refused by name."""
    import pytest

    from executors.sim.plot import _time_unit, plot_trace

    assert _time_unit(600)[1] == "s" and _time_unit(6 * 3600)[1] == "h" and _time_unit(7 * 86400)[1] == "d"
    trace = _write(tmp_path, downscale_text)
    _assert_png(plot_trace(trace, tmp_path / "part.png", window=(0.0, 5.0)))
    with pytest.raises(ValueError, match="lies outside the run"):
        plot_trace(trace, tmp_path / "none.png", window=(1e9, 2e9))
    with pytest.raises(ValueError, match="start < end"):
        plot_trace(trace, tmp_path / "none.png", window=(5.0, 1.0))


# ------------------------------------------------------ availability panel
def test_availability_panel_on_a_hand_built_timeline():
    """Serving 0..10 starting, 3 of 3 from 10 to 40, one down 40..50, 3 of 3 to 100,
    target 3 throughout: availability after start-up is (90*3 - 10) / (90*3)."""
    from executors.sim.plot import _Deployment, _worst_per_bin, serving_curve, window_availability

    d = _Deployment("llm")
    d.world = [(0.0, 3)]
    d.segments = [(0, 0.0, 10.0, "starting", 0), (0, 10.0, 100.0, "serving", 0),
                  (1, 0.0, 5.0, "starting", 1), (1, 5.0, 40.0, "serving", 1),
                  (1, 40.0, 50.0, "starting", 1), (1, 50.0, 100.0, "serving", 1),
                  (2, 0.0, 8.0, "starting", 2), (2, 8.0, 100.0, "serving", 2)]
    assert serving_curve(d) == [(5.0, 1), (8.0, 2), (10.0, 3), (40.0, 2), (50.0, 3), (100.0, 0)]
    pct, full = window_availability(d, 0.0, 100.0)
    assert pct == pytest.approx(100.0 * (270 - 10) / 270)
    assert full == pytest.approx(100.0 * 80 / 90)
    assert window_availability(d, 45.0, 100.0) == (pytest.approx(100.0), pytest.approx(100.0))  # starts at 50
    assert window_availability(d, 0.0, 9.0) == (None, None)  # never at full strength
    # the shortfall as the worst value per slice: a shortfall lands in every slice it touches
    xs, ys = _worst_per_bin([0.0, 40.0, 50.0, 100.0], [0, 1, 0, 0], 0.0, 100.0, bins=8)
    assert (xs, ys) == ([0.0, 40.0, 50.0, 100.0], [0, 1, 0, 0])  # few points: unchanged
    xs, ys = _worst_per_bin([0.0, 40.0, 50.0, 100.0], [0, 1, 0, 0], 0.0, 100.0, bins=2)
    assert (xs, ys) == ([0.0, 50.0, 100.0], [1, 0, 0])  # 40..50 lies in the first half only
    xs, ys = _worst_per_bin([0.0, 40.0, 41.0, 60.0, 61.0, 100.0], [0, 1, 0, 2, 0, 0], 0.0, 100.0, bins=4)
    assert xs == [0.0, 25.0, 50.0, 75.0, 100.0] and ys == [0, 1, 2, 0, 0]


@pytest.mark.parametrize("scenario", ["node-loss-3-nodes.yaml", "crash-storm.yaml"])
def test_availability_panel_agrees_with_the_summary(scenario):
    """The panel's figures, read from the trace, are the summary's availability and
    full-strength percentages, computed live from the core's steps."""
    from executors.sim.plot import _Timeline, window_availability

    buf = io.StringIO()
    res = Simulation(load_scenario(ROOT / "examples" / "scenarios" / scenario), trace=buf).run()
    tl = _Timeline()
    for rec in _records(buf.getvalue()):
        tl.feed(rec)
    tl.finish()
    for name, m in res.metrics["deployments"].items():
        pct, full = window_availability(tl.deployments[name], tl.t_start or 0.0, tl.t_end)
        assert pct == pytest.approx(m["availability_pct"], abs=1e-4), name
        assert full == pytest.approx(m["full_strength_pct"], abs=1e-4), name
        assert pct < 100.0  # these scenarios lose replicas after start-up


def test_plot_has_an_availability_panel_per_deployment(tmp_path, crash_scenario, monkeypatch):
    import matplotlib.figure

    from executors.sim.plot import plot_trace

    seen = []
    monkeypatch.setattr(matplotlib.figure.Figure, "savefig", lambda fig, *a, **k: seen.append(fig))
    plot_trace(_write(tmp_path, _trace_text(crash_scenario)), tmp_path / "x.png")
    titles = [ax.get_title(loc="left") for ax in seen[0].axes]
    assert any(t.startswith("llm: serving replicas vs target; after start-up: availability") for t in titles)
    assert sum(ax.get_ylabel() == "short by (log)" for ax in seen[0].axes) == 1


@pytest.mark.parametrize("example, after", [
    ("gangs.yaml", "    gang: {size: 2, placement: pack, failure: restart_gang}\n"),
    ("static-placement.yaml", "    reconfigure: with_rank\n"),
])
def test_a_gang_or_static_rank_backing_off_passes_check_trace(tmp_path, example, after):
    """A gang or static rank backing off passes check-trace. In the gang case a
    gang-mate stopped at once while its replacement waits leaves with only a
    StopReplica (no StartReplica replacing it yet): the presence check takes
    the new replica of its lineage as its explanation. (A static rank's failed
    start leaves through its own ReplicaCrashed: that case checks the timing.)"""
    text = (Path("examples/scenarios") / example).read_text()
    assert after in text
    scenario = _write(tmp_path, text.replace(after, after + "    start_failures: 4\n"), "s.yaml")
    out = _trace_text(scenario)
    recs = _records(out)
    cmds = [r for r in recs if r["kind"] == "command"]
    starts = [r for r in cmds if r["type"] == "StartReplica" and r["fields"]["replaces"]]
    failed = [r for r in recs if r["kind"] == "event" and r["type"] == "ReplicaCrashed"
              and r["fields"]["cause"] == "error"]
    assert len(failed) >= 2
    second = failed[1]["t"]  # the second failed start in a row: its replacement waits 1 s
    assert not [s for s in starts if s["t"] == second] and any(s["t"] >= second + 1.0 for s in starts)
    if example == "gangs.yaml":  # the rule's case is really in the trace
        stopped = {r["replica"] for r in cmds if r["type"] == "StopReplica" and r["t"] == second}
        replaced_then = {s["fields"]["replaces"] for s in starts if s["t"] == second}
        assert stopped and not stopped & replaced_then
    report = check_trace_file(_write(tmp_path, out))
    assert report.ok, report.violations


# ------------------------------------------------- deltas and snapshots (issue 20)
def test_a_change_a_delta_dropped_is_caught_by_the_next_snapshot(tmp_path, downscale_text):
    """A writer that drops a change: the replica's entry is taken out of a delta
    that a full snapshot follows later; the snapshot no longer equals the state the
    deltas rebuild, and check-trace says which replica differs."""
    recs = _records(downscale_text)
    snap = next(i for i, r in enumerate(recs) if r["kind"] == "snapshot" and r["reason"] == "step")
    at = max(i for i in range(snap) if recs[i]["kind"] == "delta" and recs[i]["deployments"]["llm"]["replicas"])
    reps = recs[at]["deployments"]["llm"]["replicas"]
    rid = sorted(reps)[0]
    dropped = reps.pop(rid)
    report = check_trace_file(_write(tmp_path, _dump(recs)))
    assert not report.ok
    wrong = [v for v in report.violations if "differs from the state rebuilt from the deltas" in v]
    assert wrong and wrong[0].startswith(f"line {snap + 1}: ") and f"llm/{rid} is {dropped}" in wrong[0], wrong
    reps[rid] = dropped  # put back: passes again
    assert check_trace_file(_write(tmp_path, _dump(recs))).ok


def test_the_state_rebuilt_when_a_deployment_becomes_healthy_is_checked(tmp_path, downscale_text):
    """No full snapshot is written when a deployment becomes healthy; the state the
    deltas rebuilt is checked there: a delta giving a replica another's rank fails."""
    recs = _records(downscale_text)
    at = next(i for i, r in enumerate(recs) if r["kind"] == "delta" and r["deployments"]["llm"]["healthy"])
    reps = recs[at]["deployments"]["llm"]["replicas"]
    rid = next(iter(reps))
    assert reps[rid]["rank"] != [0, 0, 0]
    reps[rid].update(rank=[0, 0, 0], global_rank=0)
    report = check_trace_file(_write(tmp_path, _dump(recs)))
    assert any(v.startswith(f"line {at + 1}: state rebuilt from deltas (became healthy)") and "held twice" in v
               for v in report.violations), report.violations


def test_delta_outside_its_place_is_malformed(tmp_path, downscale_text):
    recs = _records(downscale_text)
    at = _first(recs, kind="delta")
    assert "a command record after its step's delta" in _malformed(
        tmp_path, _dump(recs[:at + 1] + [recs[at - 1]] + recs[at + 1:]))
    assert "second delta" in _malformed(tmp_path, _dump(recs[:at + 1] + [recs[at]] + recs[at + 1:]))
    bad = dict(recs[at], deployments={"llm": {"target": 8, "replicas": {}}})
    assert "'healthy'" in _malformed(tmp_path, _dump(recs[:at] + [bad] + recs[at + 1:]))


def test_states_rebuilds_every_snapshot(downscale_text):
    """``executors.trace.states``: the state rebuilt from deltas equals each full snapshot."""
    from executors.trace import states

    recs = _records(downscale_text)
    rebuilt = list(states(recs))
    assert len(rebuilt) == sum(r["kind"] in ("delta", "snapshot") for r in recs)
    prev = None
    for r, s in zip((r for r in recs if r["kind"] in ("delta", "snapshot")), rebuilt):
        if r["kind"] == "snapshot" and prev is not None:
            assert s["deployments"] == prev["deployments"] == r["deployments"]
        prev = s
    assert [s["deployments"]["llm"]["target"] for s in rebuilt if s["reason"] == "healthy"] == [8, 4]


def test_snapshots_cost_at_most_what_the_deltas_cost(tmp_path):
    """By default a full snapshot follows once the deltas since the last one add up
    to its size; with ``snapshot_every`` N, one every N steps."""
    path = ROOT / "examples" / "scenarios" / "crash-storm.yaml"
    recs = _records(_trace_text(path))
    size = {k: sum(len(json.dumps(r, separators=(",", ":"))) for r in recs if r["kind"] == k)
            for k in ("delta", "snapshot")}
    snaps = [r for r in recs if r["kind"] == "snapshot"]
    assert len(snaps) >= 5 and {s["reason"] for s in snaps} == {"sync", "step", "end"}
    biggest = max(len(json.dumps(s, separators=(",", ":"))) for s in snaps)
    assert size["snapshot"] <= size["delta"] + 3 * biggest  # (the sync, the end and the last one)
    recs = _records(_trace_text(path, snapshot_every=7))
    steps = [r for r in recs if r["kind"] in ("event", "snapshot")]
    periodic = [i for i, r in enumerate(steps) if r["kind"] == "snapshot" and r["reason"] == "step"]
    assert periodic and all(sum(r["kind"] == "event" for r in steps[:i]) % 7 == 0 for i in periodic)
    assert check_trace_file(_write(tmp_path, _dump(recs))).ok


# ------------------------------------------------ the writer's hand-made JSON
def test_fields_json_writes_what_the_encoder_writes():
    """The generated per-class writer picks its inline case from the first
    instance's field types; every later value, of any type, must still come out
    as ``json.dumps`` writes it (non-finite floats, bools in int fields, nested
    tuples reused or not, dicts with int keys, non-ASCII text, enums)."""
    import enum

    import attrs

    from executors.trace import fields_json, jsonable

    class Level(enum.IntEnum):
        HIGH = 7

    @attrs.frozen
    class Rec:
        s: object
        i: object
        f: object
        b: object
        n: object
        r: object
        t: object

    rank = rc.ReplicaRank(1, 2, 3)
    shared = (("GPU", 1.0), ("CPU", 2))
    first = Rec("a", 1, 0.5, True, None, rank, shared)
    odd = [
        Rec(None, None, None, None, None, None, None),
        Rec(1, "x", float("inf"), 0, "now text", (1, None, 2), ()),
        Rec("é\n\"q\"", True, float("nan"), False, 3.25, "not a rank", shared),
        Rec(-0.0, Level.HIGH, -float("inf"), 2, [1, {"k": (1, 2)}], rank, ((1,), ("a", (2.5,)))),
        Rec({1: "int key"}, 2**70, 1e300, None, False, None, shared),
    ]
    for rec in [first, *odd, first]:
        assert fields_json(rec) == json.dumps(jsonable(rec), separators=(",", ":")), rec


@pytest.mark.parametrize("name", ["crash-storm.yaml", "static-placement.yaml", "gangs.yaml",
                                  "controller-crash.yaml", "node-loss-3-nodes.yaml"])
def test_every_trace_line_is_the_compact_json_of_what_it_says(name):
    """The writer builds its lines by hand (f-strings, not the encoder): each line
    must be exactly ``json.dumps(json.loads(line), separators=(",", ":"))``, so a
    reader and a re-encoder see the same bytes."""
    text = _trace_text(ROOT / "examples" / "scenarios" / name)
    for n, line in enumerate(text.splitlines(), 1):
        assert json.dumps(json.loads(line), separators=(",", ":")) == line, f"line {n}: {line[:200]}"


# ------------------------------------------------------------------ every command
GANG_YAML = """\
name: a gang member crashes and only it restarts
seed: 5
cluster: {nodes: 2, gpus_per_node: 2}
deployments:
  engine: {replicas: 4, user_config: {}, gang: {size: 2, placement: pack, failure: restart_replica}}
timeline:
  - deploy: engine
  - wait_until_healthy: engine
  - after: 10
    crash: {deployment: engine, rank: 3}
  - wait_until_healthy: engine
expect:
  - contiguous: engine
"""


def test_a_trace_with_a_gang_changed_command_is_read_and_checked(tmp_path):
    """Issue 36: GangChanged is a command of the trace (docs/trace-format.md) that
    check-trace knows: read, its fields checked, the trace passes."""
    scenario = tmp_path / "gang.yaml"
    scenario.write_text(GANG_YAML)
    text = _trace_text(scenario)
    recs = _records(text)
    changed = [r for r in recs if r["kind"] == "command" and r["type"] == "GangChanged"]
    assert len(changed) == 1
    (gc,) = changed
    assert gc["deployment"] == "engine" and gc["replica"] is None and gc["rank"] is None
    assert gc["fields"]["gang_id"] and len(gc["fields"]["members"]) == 2
    report = check_trace_file(_write(tmp_path, text))
    assert report.ok and report.violations == [] and report.complete, report.violations
    assert report.counts["command"] == sum(1 for r in recs if r["kind"] == "command")
    # its fields are checked: one without its members is malformed
    i = recs.index(gc)
    del recs[i]["fields"]["members"]
    assert "GangChanged command's fields" in _malformed(tmp_path, _dump(recs))


def test_every_command_is_in_check_traces_list_and_in_the_docs_table():
    """A command the core can emit that check-trace or docs/trace-format.md does not know
    (GangChanged was missing from both once)."""
    import typing

    from executors.checktrace import _COMMAND_FIELDS

    names = [c.__name__ for c in typing.get_args(rc.Command) + typing.get_args(rc.PoolCommand)]
    doc = (ROOT / "docs" / "trace-format.md").read_text()
    section = doc[doc.index("### `command`"):doc.index("### `delta`")]
    rows = {line.split("|")[1].strip().strip("`") for line in section.splitlines() if line.startswith("| `")}
    assert "GangChanged" in names
    assert [n for n in names if n not in _COMMAND_FIELDS] == []
    assert [n for n in names if n not in rows] == []
    assert sorted(_COMMAND_FIELDS) == sorted(names)  # (and nothing it lists is not a command)
