"""What-if sweeps on a Ray cluster (issue 68): ``rankcore simulate --address`` runs each (variant,
seed) as a Ray task of one CPU and writes the local sweep's figures, bit for bit but the wall
times, in the same order; an invalid variant is reported as locally; an address with no Ray
cluster is exit 2 naming it. One local Ray (2 CPUs) for the module."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
from click.testing import CliRunner

from executors import sweep
from executors.cli import main

from .conftest import ROOT, ray_env

SCENARIO = ROOT / "examples" / "scenarios" / "crash-storm.yaml"
#: 3 variants x 2 seeds, of 10 virtual minutes each; latency.start=-1 is refused by the scenario
#: (an invalid variant, reported and skipped): 4 runs
SWEEP = ["simulate", str(SCENARIO), "--seeds", "2", "--set", "duration=600", "--set", "latency.start=-1,2,4"]

#: The only wall-clock fields of a sweep's output: each run's ``wall_s`` (JSON ``runs[*]`` and the
#: CSV's column) and each summary row's ``wall_s`` (the runs' walls summed). Everything else is a
#: figure of the simulated runs and must match exactly.
_WALL_JSON = re.compile(r'"wall_s": [0-9.e+-]+')


def _no_wall_json(text: str) -> str:
    return _WALL_JSON.sub('"wall_s": -', text)


def _no_wall_csv(text: str) -> str:
    rows = [line.split(",") for line in text.splitlines()]
    col = rows[0].index("wall_s")
    return "\n".join(",".join(r[:col] + r[col + 1:]) for r in rows)


@pytest.fixture(scope="module")
def ray_address():
    import ray

    ray_env()
    if ray.is_initialized():  # (a module before failed without letting its Ray go)
        ray.shutdown()
    ray.init(address="local", num_cpus=2, include_dashboard=False, log_to_driver=False)
    try:
        yield ray.get_runtime_context().gcs_address
    finally:
        ray.shutdown()


def _sweep(*args: str):
    return CliRunner(env={"COLUMNS": "200"}).invoke(main, [*SWEEP, *args])


def test_a_sweep_on_ray_writes_the_local_sweeps_figures(ray_address: str, tmp_path: Path,
                                                        monkeypatch: pytest.MonkeyPatch) -> None:
    local = _sweep("--format", "json", "--output", str(tmp_path / "local.json"))
    local_csv = _sweep("--format", "csv")

    def not_here(*args, **kwargs):
        raise AssertionError("a run of a sweep on Ray ran in the driver")

    monkeypatch.setattr(sweep, "run_one", not_here)  # (the driver's module only: Ray's workers import their own)
    on_ray = _sweep("--format", "json", "--output", str(tmp_path / "ray.json"), "--address", ray_address)
    on_ray_csv = _sweep("--format", "csv", "--address", ray_address)
    # the invalid variant is exit 2 both ways, reported the same, the others' figures written
    invalid = "error: variant duration=600, latency.start=-1: --set latency.start=-1: latency.start: "
    for result in (local, local_csv, on_ray, on_ray_csv):
        assert result.exit_code == 2, result.output
        assert "Traceback" not in result.output
        assert [ln for ln in result.stderr.splitlines() if ln.startswith("error:")] == \
            [ln for ln in local.stderr.splitlines() if ln.startswith("error:")]
        assert invalid in result.stderr, result.stderr
    assert "(local processes)" in local.stdout and "on 2 CPUs (local processes)" in local_csv.stderr
    assert f"runs/s on 2 CPUs (Ray tasks at {ray_address})" in " ".join(on_ray.stdout.split()), on_ray.stdout
    assert f"(Ray tasks at {ray_address})" in on_ray_csv.stderr
    local_text = (tmp_path / "local.json").read_text()
    ray_text = (tmp_path / "ray.json").read_text()
    data = json.loads(ray_text)
    assert [(r["variant"], r["seed"]) for r in data["runs"]] == [
        ({"duration": 600, "latency.start": 2}, 3), ({"duration": 600, "latency.start": 2}, 4),
        ({"duration": 600, "latency.start": 4}, 3), ({"duration": 600, "latency.start": 4}, 4)]
    assert [i["variant"] for i in data["invalid_variants"]] == [{"duration": 600, "latency.start": -1}]
    assert all(r["events"] > 0 and r["wall_s"] > 0 for r in data["runs"])
    assert _no_wall_json(ray_text) == _no_wall_json(local_text)
    assert _no_wall_csv(on_ray_csv.stdout) == _no_wall_csv(local_csv.stdout)
    assert on_ray_csv.stdout.count("\n") == 5  # the header and the 4 runs' rows (one deployment)


def test_run_sweep_on_ray_reports_progress_as_runs_finish_and_keeps_the_order(ray_address: str) -> None:
    """The first run (a virtual week, ~0.5 s) ends after the three short ones the other CPU runs
    meanwhile: the records still come back in the variants' order, the progress counting up."""
    variants = [{"duration": d} for d in (7 * 86400, 60, 120, 180)]
    seen: list[tuple[int, int]] = []
    records = sweep.run_sweep(SCENARIO, variants, lambda v: [5], progress=lambda d, n: seen.append((d, n)),
                              on_ray=True)
    assert seen == [(1, 4), (2, 4), (3, 4), (4, 4)]
    assert [r.variant for r in records] == variants and [r.end_time for r in records] == [7 * 86400, 60, 120, 180]
    assert sweep.sweep_cpus(len(records), on_ray=True) == 2 and sweep.sweep_cpus(1, on_ray=True) == 1
    with pytest.raises(ValueError, match="no traces or plots"):
        sweep.run_sweep(SCENARIO, variants, lambda v: [5], trace_dir=Path("/nonexistent"), on_ray=True)


def test_an_address_with_no_ray_cluster_is_exit_2_naming_it(ray_address: str) -> None:
    # a fresh process (this one is connected): nothing listens on port 1, refused at once
    env = {k: v for k, v in os.environ.items() if k != "RAY_ADDRESS"}
    proc = subprocess.run([sys.executable, "-m", "executors.cli", *SWEEP, "--address", "127.0.0.1:1",
                           "--connect-timeout", "10"], cwd=ROOT, env=env, capture_output=True, text=True,
                          timeout=60)
    assert proc.returncode == 2, proc.stderr
    assert "error: no Ray cluster at 127.0.0.1:1 (" in proc.stderr, proc.stderr
    assert "Traceback" not in proc.stderr and proc.stdout == ""
    # this process, connected to another cluster, is refused too, naming both
    other = _sweep("--address", "127.0.0.1:1")
    assert other.exit_code == 2 and "Traceback" not in other.output
    assert f"--address 127.0.0.1:1: this process is already connected to the Ray cluster at {ray_address}" \
        in other.stderr, other.stderr


def test_address_is_refused_with_the_local_only_options(tmp_path: Path) -> None:
    traces = _sweep("--address", "local", "--trace-dir", str(tmp_path / "t"))
    assert traces.exit_code == 2 and "--trace-dir / --plot-dir are not written with --address" in traces.output
    jobs = _sweep("--address", "local", "--jobs", "2")
    assert jobs.exit_code == 2 and "--jobs is for a sweep on local processes" in jobs.output
    assert not (tmp_path / "t").exists()
