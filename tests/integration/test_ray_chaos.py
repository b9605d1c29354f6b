"""The chaos benchmark's short version in CI (issue 40): one of each fault class on rankcore under
load over HTTP, gRPC and the handle, on a real local multi-node Ray cluster (benchmarks/
bench_chaos.py, ours only, few clients).

What must hold for every fault, whatever the machine's speed: nothing lost (every request answered
or given an error before the timeout), every failure a clear error (the handle's typed
``ReplicaDied``, the ingress's HTTP 500 ``replica_died`` or gRPC ``INTERNAL``, or, for the
killed proxy only, the client's connection refused or cut), back to target (N replicas, none a victim, answering ranks
0..N-1 and world_size N, with the new config or code after a redeploy), and the controller's ranks
the ones the replicas themselves answer, its state checks clean. The full comparison with Ray Serve
(and its timings) is the benchmark's, not this test's."""

from __future__ import annotations

import json
import os
import pathlib
import subprocess
import sys

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[2]
BENCH = ROOT / "benchmarks" / "bench_chaos.py"
FAULTS = ("replica", "controller", "proxy", "node", "unresponsive", "slow", "light", "heavy")
#: what a failed request may say, per fault (the connection to a killed proxy is cut or refused)
CLEAR = {"ReplicaDied", "HTTP 500", "HTTP 503", "gRPC INTERNAL", "gRPC UNAVAILABLE"}
PROXY = CLEAR | {"ConnectionRefusedError", "IncompleteReadError", "ConnectionResetError"}


@pytest.fixture(scope="module")
def chaos(tmp_path_factory) -> dict:
    out = tmp_path_factory.mktemp("chaos") / "chaos.json"
    env = {**os.environ, "RAY_USAGE_STATS_ENABLED": "0", "RAY_AUTH_MODE": "disabled"}
    proc = subprocess.run(
        [sys.executable, str(BENCH), "--only", "ours", "--repeats", "1", "--replicas", "2", "--workers", "2",
         "--clients", "3", "--handle-clients", "2", "--grpc-clients", "2", "--gap", "0.5", "--warmup", "1", "--slow-s", "2",
         "--settle-timeout", "60", "--budget", "240", "--json", str(out)],
        env=env, capture_output=True, text=True, timeout=600)
    assert out.exists(), f"the benchmark wrote no result (exit {proc.returncode}): {proc.stderr[-3000:]}"
    got = json.loads(out.read_text())
    run = got["results"]["ours"][0]
    assert run["errors"] == [], run["errors"]
    return {f["fault"]: f for f in run["faults"]}


def test_every_fault_class_was_injected_under_load(chaos):
    assert list(chaos) == list(FAULTS)
    for fault, f in chaos.items():
        assert f["sent"] > 0 and f["answered"] > 0, fault


@pytest.mark.parametrize("fault", FAULTS)
def test_nothing_lost_and_every_failure_a_clear_error(chaos, fault):
    f = chaos[fault]
    assert f["lost"] == 0, f
    allowed = PROXY if fault == "proxy" else CLEAR
    assert set(f["failed_by"]) <= allowed, f["first_failures"]


@pytest.mark.parametrize("fault", FAULTS)
def test_back_to_target_with_whole_ranks_the_controller_agrees_with(chaos, fault):
    f = chaos[fault]
    if fault != "slow":  # (a slow replica is not replaced: no target was lost)
        assert f["back_s"] is not None, f
    assert f["answering"] == 2 and f["ranks"] == [0, 1], f
    assert f["holes"] == f["duplicates"] == f["bad_world_size"] == 0, f
    assert f["victims_answering"] == 0, f
    assert f["controller_agrees"] and f["state_errors"] == [], f


def test_the_faults_replaced_what_they_hit_and_kept_the_rest(chaos):
    assert chaos["replica"]["replaced"] == 1 and chaos["unresponsive"]["replaced"] == 1
    assert chaos["node"]["replaced"] == chaos["node"]["node_victims"] >= 1
    assert chaos["heavy"]["replaced"] == 2  # (new code: every replica rolled)
    for fault in ("controller", "proxy", "slow", "light"):  # nothing to replace: the same replicas, same ranks
        assert chaos[fault]["replaced"] == 0 and chaos[fault]["reassigned"] == 0, (fault, chaos[fault])
