"""The simulator's prefix-cache replica is the Ray bench's (issue 68; no Ray): a replica prefills one
request at a time (``prefix_cache.prefills``, 1 by default: benchmarks/bench_router.py's
``asyncio.Lock``), so of two requests arriving together at an empty replica the second's first
token comes one prefill after the first's; a request that leaves the line (its deadline) frees it
at once. ``prefix_cache.seed`` gives the bench's prompts in the bench's order.
examples/scenarios/router-bench.yaml, the bench's setup with its host fitted to this machine, loads
and runs, and in it prefix_affinity beats power_of_two_choices on hit share and TTFT p50.
``bench_router.py --sim ... --sim-against FILE`` prints the simulator beside an earlier Ray run,
flagging each figure within 15% or not.
"""

from __future__ import annotations

import itertools
import json
from pathlib import Path

import pytest

from executors.scenarios import ScenarioError, parse_scenario
from executors.sim import Simulation, load_scenario
from executors.sim.prefixcache import SharedPrefixWorkload
from tests.helpers import load_benchmark

ROOT = Path(__file__).resolve().parents[2]
BENCH = ROOT / "examples" / "scenarios" / "router-bench.yaml"

#: one replica; every prefill a miss (a block longer than any prompt: nothing is ever cached)
ONE = """
seed: 1
duration: 3
cluster: {nodes: 1, gpus_per_node: 1}
latency: {place: 0.1, start: 0.5, stop: 0.1}
deployments:
  llm: {replicas: 1, max_ongoing_requests: 8}
timeline:
  - deploy: llm
traffic:
  llm:
    from: 1
    arrivals: {kind: file, path: ARRIVALS}
    TIMEOUT
    prefix_cache: {block_chars: 100000, base_s: 0.005, prefill_s_per_char: 0.00002, decode_s: DECODE PREFILLS}
"""
PROMPT = 1600 + 96  # (the workload's default prompt: a system prompt and a question)
MISS = 0.005 + 0.00002 * PROMPT  # a prefill of the whole prompt


def _one(tmp_path: Path, times: list[float], prefills: int | None = None, timeout: float | None = None,
         decode: float = 0.02) -> dict:
    """One replica's request figures, requests arriving at ``times`` (absolute seconds)."""
    arrivals = tmp_path / "arrivals.txt"
    arrivals.write_text("".join(f"{t!r}\n" for t in times))
    text = (ONE.replace("ARRIVALS", str(arrivals)).replace("DECODE", str(decode))
            .replace("TIMEOUT", "" if timeout is None else f"timeout_s: {timeout!r}")
            .replace(" PREFILLS", "" if prefills is None else f", prefills: {prefills}"))
    result = Simulation(parse_scenario(text, "<one replica>"), check=True).run()
    q = result.metrics["deployments"]["llm"]["requests"]
    assert (q["lost"], q["machine_lost"], q["double_ends"]) == (0, 0, 0), q
    return q


def test_a_replica_prefills_one_request_at_a_time(tmp_path):
    q = _one(tmp_path, [1.0, 1.0])  # two requests together, an empty cache
    assert q["answered"] == 2 and q["cached_chars"] == 0
    # the first's first token after its prefill; the second's one prefill later (it waited for the first's)
    assert q["ttft_p50"] == pytest.approx(MISS, abs=1e-6)
    assert q["ttft_p99"] == pytest.approx(2 * MISS, abs=1e-6)
    assert q["latency_p99"] == pytest.approx(2 * MISS + 0.02, abs=1e-6)  # then its decode
    apart = _one(tmp_path, [1.0, 1.0 + MISS])  # the second when the first's prefill ends: no wait
    assert apart["ttft_p99"] == pytest.approx(MISS, abs=1e-6)
    # decodes overlap: three together answer at 1, 2 and 3 prefills (+ decode), not one after another's decode
    three = _one(tmp_path, [1.0, 1.0, 1.0])
    assert three["ttft_p99"] == pytest.approx(3 * MISS, abs=1e-6)
    assert three["latency_p99"] == pytest.approx(3 * MISS + 0.02, abs=1e-6)


@pytest.mark.parametrize("prefills, second", [(1, 2 * MISS), (2, MISS), (0, MISS)])
def test_prefills_bounds_the_prefills_a_replica_runs_at_once(tmp_path, prefills, second):
    q = _one(tmp_path, [1.0, 1.0], prefills=prefills)  # (0: no bound, the model before the bench's)
    assert q["ttft_p50"] == pytest.approx(MISS, abs=1e-6)
    assert q["ttft_p99"] == pytest.approx(second, abs=1e-6)


def test_a_request_leaving_the_line_frees_it_at_once(tmp_path):
    """A, B, C together, deadline 1.5 prefills: A is answered; B (prefilling) and C (waiting) time out
    at 1.5 prefills, B's prefill cut there and C never prefilled; D, arriving just after, is prefilled
    at once (were B's prefill still holding the replica, D's first token would come after its deadline)."""
    t = 1.0
    q = _one(tmp_path, [t, t, t, t + 1.5 * MISS + 0.001], timeout=1.5 * MISS, decode=0.001)
    assert (q["answered"], q["failed"]) == (2, 2), q
    assert q["ttft_p50"] == q["ttft_p99"] == pytest.approx(MISS, abs=1e-6)  # A's and D's: no wait
    assert q["prompt_chars"] == 3 * PROMPT  # A, B (cut) and D prefilled; C left before its turn


def test_the_workload_seed_gives_the_benchs_prompts_in_its_order():
    wl = SharedPrefixWorkload(seed=0)  # (bench_router's ``workload(0)``)
    bench = wl.prompts(1000)
    listed = list(itertools.islice(wl.iter_listed(), 1000))
    assert [p[:wl.system_chars] for p in listed] == [p[:wl.system_chars] for p in bench]
    assert [len(p) for p in listed] == [len(p) for p in bench] and len(set(listed)) == 1000
    other = list(itertools.islice(SharedPrefixWorkload(seed=1).iter_listed(), 1000))
    assert [p[:wl.system_chars] for p in other] != [p[:wl.system_chars] for p in bench]


@pytest.mark.parametrize("key, value, words", [
    ("prefills", -1, r"prefix_cache\.prefills.*must not be negative"),
    ("seed", "zero", r"prefix_cache\.seed.*must be a whole number"),
    ("prefill_overhead_s", {"dist": "exponential"}, r"prefix_cache\.prefill_overhead_s"),
    ("prefill_overheads", 0.001, r"unknown field.*did you mean 'prefill_overhead_s'"),
])
def test_the_new_keys_refuse_what_is_wrong_naming_the_key(key, value, words):
    with pytest.raises(ScenarioError, match=words):
        load_scenario(BENCH, overrides={f"traffic.llm.prefix_cache.{key}": value})


def _bench_run(router: str, seed: int = 0) -> dict:
    kwargs = {"imbalanced_threshold": 4} if router == "prefix_affinity" else {}
    sc = load_scenario(BENCH, overrides={"deployments.llm.request_router": router,
                                         "deployments.llm.request_router_kwargs": kwargs})
    result = Simulation(sc, seed=seed).run()
    assert result.passed, [e.detail for e in result.failures]
    q = result.metrics["deployments"]["llm"]["requests"]
    assert (q["lost"], q["machine_lost"], q["double_ends"]) == (0, 0, 0), q
    return q


def test_router_bench_runs_the_benchs_setup_and_prefix_affinity_wins_there():
    sc = load_scenario(BENCH)
    llm, traffic = sc.deployments["llm"], sc.traffic["llm"]
    assert llm.replicas == 4 and dict(traffic.limits)["max_ongoing_requests"] == 8
    assert dict(traffic.limits)["request_router_kwargs"] == {"imbalanced_threshold": 4}  # (the bench's)
    assert (traffic.arrivals.kind, traffic.arrivals.clients) == ("closed", 16)
    assert traffic.prefix_cache is not None and traffic.prefix_cache.seed == 0  # the bench's prompts
    assert dict(traffic.prefix_cache.model)["prefills"] == 1  # the bench's lock
    p2c, affinity = _bench_run("power_of_two_choices"), _bench_run("prefix_affinity")
    assert 800 <= p2c["answered"] <= 1300  # (~1,000 requests, as the bench's)
    assert p2c["prompt_chars"] == PROMPT * p2c["answered"]
    assert affinity["prefix_hit_share"] > p2c["prefix_hit_share"] + 0.1, (affinity, p2c)
    assert affinity["ttft_p50"] < p2c["ttft_p50"], (affinity, p2c)
    assert affinity["answered"] > p2c["answered"]  # (the closed loop: faster first tokens, more requests)
    # the replicas' one-at-a-time prefill queues: a TTFT p99 well above a miss's prefill
    assert p2c["ttft_p99"] > 2 * MISS


def test_bench_router_sim_prints_the_simulator_beside_an_earlier_ray_run(tmp_path, monkeypatch, capsys):
    bench = load_benchmark("bench_router")
    monkeypatch.setattr(bench.childrun, "ray_env", lambda *a: None)
    monkeypatch.setattr(bench, "spawn", lambda *a: pytest.fail("a child was started"))
    ray = {"ours-default": {"figures": bench.figures([], 4)}, "ours-p2c": {"figures": bench.figures([], 4)}}
    ray["ours-default"]["figures"].update(ttft_p50_ms=45.0, ttft_p99_ms=140.0, hit_share=0.58, imbalance=1.05,
                                          rps=200.0)
    ray["ours-p2c"]["figures"].update(ttft_p50_ms=5.0, ttft_p99_ms=140.0, hit_share=0.58, imbalance=1.05)
    # (ours-p2c: its p50 far off, its req/s none)
    saved = tmp_path / "ray.json"
    saved.write_text(json.dumps({"config": {"replicas": 4, "max_ongoing_requests": 8, "concurrency": 16,
                                            "imbalanced_threshold": 4.0, "seed": 0, "requests": 1000},
                                 "results": ray}))
    out = tmp_path / "out.json"
    assert bench.main(["--sim", str(BENCH), "--sim-against", str(saved), "--sim-seeds", "1", "--json", str(out)]) == 0
    printed = capsys.readouterr().out
    assert "the simulator against the bench" in printed
    rows = {(r["contender"], r["key"]): r for r in json.loads(out.read_text())["sim"]["rows"]}
    assert {c for c, _ in rows} == {"ours-default", "ours-p2c"}  # (only ours' routers measured)
    assert rows[("ours-p2c", "ttft_p50_ms")]["within"] is False and rows[("ours-p2c", "rps")]["within"] is None
    d = rows[("ours-default", "ttft_p50_ms")]
    assert d["ratio"] == pytest.approx(d["sim"] / 45.0) and d["within"] == (abs(d["ratio"] - 1) <= 0.15)
    assert rows[("ours-default", "hit_share")]["within"] is True  # (58% either way)
    assert "not: ours-p2c TTFT p50 ms" in printed


def test_bench_router_sim_options_are_checked(monkeypatch, capsys):
    bench = load_benchmark("bench_router")
    monkeypatch.setattr(bench, "spawn", lambda *a: pytest.fail("a child was started"))
    for argv, says in ((["--sim", "nowhere.yaml"], "--sim: no such file"),
                       (["--sim-against", "x.json"], "--sim-against needs --sim"),
                       (["--sim", str(BENCH), "--sim-seeds", "0"], "--sim-seeds must be >= 1")):
        with pytest.raises(SystemExit) as exc:
            bench.main(argv)
        assert exc.value.code == 2 and says in capsys.readouterr().err


def test_bench_router_sim_runs_after_the_contenders_in_the_same_run(monkeypatch, capsys):
    """``--only ours-default --sim ...``: the contender (here a stand-in for its child) first, then the
    simulator beside it, in the same printout."""
    bench = load_benchmark("bench_router")
    monkeypatch.setattr(bench.childrun, "ray_env", lambda *a: None)
    figures = bench.figures([], 4)
    figures.update(ttft_p50_ms=43.9, ttft_p99_ms=138.0, hit_share=0.567, imbalance=1.052, rps=192.7)
    spawned = []
    monkeypatch.setattr(bench, "spawn", lambda name, args: spawned.append(name) or {"figures": figures, "errors": []})
    monkeypatch.setattr(bench, "decision_cost", lambda *a, **k: {"": {"us_per_dispatch": 5.0, "replicas_reached": 64}})
    assert bench.main(["--only", "ours-default", "--sim", str(BENCH), "--sim-seeds", "1"]) == 0
    printed = capsys.readouterr().out
    assert spawned == ["ours-default"]
    ray_table, sim_table = printed.index("routers for a prefix cache"), printed.index("the simulator against the bench")
    assert ray_table < sim_table and "Ray: this run" in printed
    assert printed.count("ours-default  TTFT p50 ms") == 1 and "ours-p2c  TTFT" not in printed  # (only what ran)
    assert "figures" in printed[sim_table:] and "of 5 figures" in printed


def test_a_replica_that_dies_with_a_prefill_line_loses_nothing_and_stops_cleanly():
    """A crash while its prefill line is long: the requests it held are retried or failed by the
    machine (none lost), its replacement starts cold, and nothing the dead one never answered is
    held on its account (``holds``: a graceful stop would wait for it)."""
    text = """
seed: 3
duration: 12
cluster: {nodes: 1, gpus_per_node: 3}
latency: {place: 0.1, start: 0.5, stop: 0.1}
deployments:
  llm: {replicas: 2, max_ongoing_requests: 8}
timeline:
  - deploy: llm
  - at: 3
    crash: {deployment: llm, rank: 0}
  - at: 8
    scale: {deployment: llm, replicas: 1}
traffic:
  llm:
    from: 1
    until: 7
    idempotent: true
    arrivals: {kind: closed, clients: 16, think_s: 0}
    prefix_cache: {system_prompts: 20, capacity_blocks: 4096}
expect:
  - healthy: {deployment: llm, by: 8.5}
"""
    sim = Simulation(parse_scenario(text, "<crash in line>"), check=True)
    result = sim.run()
    assert result.passed, [e.detail for e in result.failures]
    q = result.metrics["deployments"]["llm"]["requests"]
    assert (q["lost"], q["machine_lost"], q["double_ends"]) == (0, 0, 0), q
    assert q["retried"] > 0 and q["answered"] > 500  # (the crash caught requests in its line)
    assert len(q["served_by_replica"]) == 3  # the two, and the replacement
    assert q["in_flight"] == q["in_queue"] == 0
    assert not any(sim.traffic.holds(rid) for rid in q["served_by_replica"])  # (the dead one's line: let go)


def test_bench_router_sim_keys_ours_hash_by_system_prompt():
    """``ours-hash`` keys each call by its system prompt on Ray; ``--sim`` gives the simulator's requests
    the same key (``prefix_cache.keyed``), so consistent_hash piles the Zipf-hot system prompts on their
    replicas there too (imbalance well above the other routers'), and the others stay unkeyed."""
    bench = load_benchmark("bench_router")
    args = bench.parse(["--sim", str(BENCH), "--sim-seeds", "1"])
    assert bench.sim_overrides("consistent_hash", args)["traffic.llm.prefix_cache.keyed"] is True
    assert bench.sim_overrides("prefix_affinity", args)["traffic.llm.prefix_cache.keyed"] is False
    got = bench.sim_run(str(BENCH), ["ours-hash", "ours-p2c"], args)
    assert got["ours-hash"]["router"] == "consistent_hash"
    assert got["ours-hash"]["imbalance"]["median"] > 1.3 > got["ours-p2c"]["imbalance"]["median"], got
    assert got["ours-hash"]["hit_share"]["median"] > got["ours-p2c"]["hit_share"]["median"] + 0.1, got
