"""Routers in the simulator (issue 68; no Ray): ``traffic.<d>.prefix_cache`` gives each request a
prompt (``Submit.prefix``) from the shared-prefix workload and each replica incarnation its own
prefix (KV) cache, whose hits shorten the time to first token; ``sessions`` gives each request a
session key (``Submit.routing_key``) and ``callers`` a caller's node (``Submit.caller_node``); the
simulator tells the request machine where each serving replica runs (``ReplicaLocated``). With the
same seed prefix_affinity finds more of the prompts cached than power_of_two_choices and the
machine's own rule, consistent_hash keeps a session on its replica, locality keeps a caller's
requests on its node; the keys refuse what is wrong naming the key; two runs give the same figures.
"""

from __future__ import annotations

import csv
import io
import json
from pathlib import Path

import pytest
from click.testing import CliRunner

from executors.cli import main
from executors.scenarios import ScenarioError, parse_scenario
from executors.sim import Simulation

BASE = """
seed: 5
duration: 30
cluster: {nodes: 2, gpus_per_node: 4}
latency: {place: 0.1, start: 1, stop: 0.5}
deployments:
  llm: {replicas: REPLICAS, max_ongoing_requests: 8ROUTER}
timeline:
  - deploy: llm
TIMELINE
traffic:
  llm:
    from: 3
    until: 29
    arrivals: {kind: poisson, rate: RATE}
TRAFFIC
"""

#: a skewed workload whose hot system prompts fit in the replicas' caches together, not in each one
PREFIX = "    prefix_cache: {system_prompts: 100, zipf_s: 1.1, capacity_blocks: 1000}\n"


def _text(traffic: str = PREFIX, router: str = "", replicas: int = 4, rate: float = 40, timeline: str = "") -> str:
    return (BASE.replace("REPLICAS", str(replicas)).replace("RATE", str(rate))
            .replace("ROUTER", f", request_router: {router}" if router else "")
            .replace("TIMELINE", timeline).replace("TRAFFIC", traffic.rstrip("\n")))


def _run(traffic: str = PREFIX, router: str = "", **kw) -> tuple[dict, dict]:
    """(the deployment's request figures, replica id -> its node at the end or when it left)."""
    result = Simulation(parse_scenario(_text(traffic, router, **kw), "<routing>"), check=True).run()
    assert result.passed, [e.detail for e in result.failures]
    q = result.metrics["deployments"]["llm"]["requests"]
    assert (q["lost"], q["machine_lost"], q["double_ends"]) == (0, 0, 0), q
    nodes = {rid: r.node_id for rid, r in result.state.deployments["llm"].replicas.items()}
    return q, nodes


def test_prefix_cache_figures_are_what_the_model_says():
    # (prefills: 0: a replica prefills any number at once, so nothing waits for a prefill here;
    # tests/integration/test_sim_router_fit.py checks the one-at-a-time line, the default)
    q, _ = _run(PREFIX.replace("capacity_blocks: 1000}", "capacity_blocks: 1000, prefills: 0}"))
    assert q["answered"] == q["submitted"] > 900  # (40 req/s for 26 s)
    prompt = 1600 + 96  # (the workload's defaults: a system prompt, then a question)
    assert q["prompt_chars"] == prompt * q["answered"]  # every request's prompt, prefilled once
    assert 0 < q["cached_chars"] < q["prompt_chars"]
    assert q["prefix_hit_share"] == pytest.approx(q["cached_chars"] / q["prompt_chars"], abs=1e-6)
    # nothing queues here: a time to first token is its prefill, 5 ms + 20 us a character not cached
    assert q["ttft_p99"] == pytest.approx(0.005 + 0.00002 * prompt, abs=1e-6)  # (a miss)
    assert q["latency_p99"] == pytest.approx(q["ttft_p99"] + 0.02, abs=1e-6)  # then decode_s
    assert sum(q["served_by_replica"].values()) == q["answered"] and len(q["served_by_replica"]) == 4
    counts = q["served_by_replica"].values()
    assert q["replica_imbalance"] == pytest.approx(max(counts) * 4 / sum(counts), abs=1e-5)


def test_prefix_affinity_beats_power_of_two_and_the_default_on_hits_and_ttft():
    got = {router: _run(PREFIX, router)[0] for router in ("", "power_of_two_choices", "prefix_affinity")}
    assert len({q["submitted"] for q in got.values()}) == 1  # the same requests, the same prompts
    best = got["prefix_affinity"]
    for router in ("", "power_of_two_choices"):
        assert best["prefix_hit_share"] > got[router]["prefix_hit_share"] + 0.15, (router, got)
        assert best["ttft_p50"] < got[router]["ttft_p50"], (router, got)
    assert best["ttft_p50"] == pytest.approx(0.005 + 0.00002 * 96, abs=1e-6)  # its system prompt cached


def test_a_replica_that_restarts_starts_cold():
    """5 system prompts, evenly drawn, a cache that holds them all: a replica misses each once, its
    replacement after a crash each once again."""
    few = "    prefix_cache: {system_prompts: 5, zipf_s: 0, capacity_blocks: 100000}\n"
    crash = "  - at: 15\n    crash: {deployment: llm, rank: 0}"

    def misses(q: dict) -> int:
        served = q["prompt_chars"] // (1600 + 96)
        assert q["cached_chars"] % 1600 == 0  # (a system prompt's whole blocks, or nothing)
        return served - q["cached_chars"] // 1600

    warm, _ = _run(few, replicas=1, rate=20)
    cold, _ = _run(few, replicas=1, rate=20, timeline=crash)
    assert len(warm["served_by_replica"]) == 1 and len(cold["served_by_replica"]) == 2  # (and its replacement)
    assert (misses(warm), misses(cold)) == (5, 10)


def test_without_prefix_cache_requests_carry_no_prompt_and_service_is_required():
    q, _ = _run("    service: 0.05\n", "power_of_two_choices")
    assert "ttft_p50" not in q and "prefix_hit_share" not in q
    assert sum(q["served_by_replica"].values()) == q["answered"]  # (a router: the routing figures)
    plain, _ = _run("    service: 0.05\n")
    assert "replica_imbalance" not in plain  # (no router, no prefix cache: the figures of before)
    with pytest.raises(ScenarioError, match=r"traffic\.llm.*missing required field 'service'"):
        parse_scenario(_text("    idempotent: true\n"), "<routing>")


def test_consistent_hash_keeps_each_session_on_one_replica():
    # (short requests: the session's replica always has room, so it always is a candidate)
    one, _ = _run("    service: 0.01\n    sessions: 1\n", "consistent_hash")
    assert sorted(one["served_by_replica"].values())[:-1] == [0, 0, 0]  # one session: one replica
    three, _ = _run("    service: 0.01\n    sessions: 3\n", "consistent_hash")
    assert 1 <= sum(v > 0 for v in three["served_by_replica"].values()) <= 3
    many, _ = _run("    service: 0.01\n    sessions: 200\n", "consistent_hash")
    assert all(v > 0 for v in many["served_by_replica"].values())


def test_keyed_prompts_carry_their_system_prompt_as_session_key():
    """``prefix_cache.keyed``: each request's session key is its system prompt's (bench_router's
    ``ours-hash``), so consistent_hash keeps a system prompt on one replica; unkeyed, each request is
    hashed on its own id and spread."""
    one = "    prefix_cache: {system_prompts: 1, capacity_blocks: 1000, keyed: true}\n"
    keyed, _ = _run(one, "consistent_hash")
    assert sorted(keyed["served_by_replica"].values())[:-1] == [0, 0, 0], keyed["served_by_replica"]
    unkeyed, _ = _run(one.replace(", keyed: true", ""), "consistent_hash")
    assert all(v > 0 for v in unkeyed["served_by_replica"].values()), unkeyed["served_by_replica"]
    # (many system prompts: a system prompt's replica has it cached, as prefix affinity's has)
    hashed, _ = _run(PREFIX.replace("}", ", keyed: true}"), "consistent_hash")
    p2c, _ = _run(PREFIX, "power_of_two_choices")
    assert hashed["submitted"] == p2c["submitted"]  # (the same prompts: keyed draws nothing more)
    assert hashed["prefix_hit_share"] > p2c["prefix_hit_share"] + 0.15, (hashed, p2c)


def test_locality_sends_callers_to_their_nodes_replicas():
    q, nodes = _run("    service: 0.05\n    callers: {node-0: 1}\n", "locality")
    assert sorted(set(nodes.values())) == ["node-0", "node-1"]  # (spread: replicas on both nodes)
    served = {rid: n for rid, n in q["served_by_replica"].items() if n}
    assert served and all(nodes[rid] == "node-0" for rid in served), (served, nodes)
    # callers on both nodes: each node's replicas take requests
    both, nodes = _run("    service: 0.05\n    callers: {node-0: 1, node-1: 3}\n", "locality")
    per_node = {n: sum(c for rid, c in both["served_by_replica"].items() if nodes[rid] == n)
                for n in ("node-0", "node-1")}
    assert per_node["node-1"] > 2 * per_node["node-0"] > 0, per_node
    # without the locality router the same callers go everywhere
    anywhere, nodes = _run("    service: 0.05\n    callers: {node-0: 1}\n", "power_of_two_choices")
    assert {nodes[rid] for rid, n in anywhere["served_by_replica"].items() if n} == {"node-0", "node-1"}


def test_the_same_seed_gives_the_same_figures():
    traffic = PREFIX + "    sessions: 7\n    callers: {node-0: 1, node-1: 1}\n"
    first, second = _run(traffic, "prefix_affinity")[0], _run(traffic, "prefix_affinity")[0]
    assert json.dumps(first, sort_keys=True) == json.dumps(second, sort_keys=True)
    other = Simulation(parse_scenario(_text(traffic, "prefix_affinity"), "<routing>"), seed=6).run()
    assert other.metrics["deployments"]["llm"]["requests"]["cached_chars"] != first["cached_chars"]


@pytest.mark.parametrize("traffic, words", [
    (PREFIX.replace("capacity_blocks", "capacity"), r"traffic\.llm\.prefix_cache\.capacity.*unknown field "
                                                    r"\(did you mean 'capacity_blocks'\?\)"),
    ("    prefix_cache: {block_chars: 0}\n", r"traffic\.llm\.prefix_cache\.block_chars.*at least 1"),
    ("    prefix_cache: {system_prompts: many}\n", r"traffic\.llm\.prefix_cache\.system_prompts.*whole number"),
    ("    prefix_cache: {zipf_s: -1}\n", r"traffic\.llm\.prefix_cache\.zipf_s.*>= 0"),
    ("    prefix_cache: {decode_s: fast}\n", r"traffic\.llm\.prefix_cache\.decode_s.*must be a number"),
    ("    prefix_cache: {system_prompts: 100000, system_chars: 100000}\n",
     r"traffic\.llm\.prefix_cache\.system_chars.*MAX_PREFIX_CHARS"),
    ("    prefix_cache: 12\n", r"traffic\.llm\.prefix_cache.*must be a mapping"),
    (PREFIX + "    service: 0.1\n", r"traffic\.llm\.service.*prefix cache's: ttft_s\(prompt, cached\) \+ decode_s"),
    (PREFIX + "    stream: {items: 3, item_interval_s: 0.1}\n", r"traffic\.llm\.stream.*prefix_cache and stream"),
    (PREFIX + "    batch: {fixed_s: 0.01}\n", r"traffic\.llm\.batch.*prefix_cache and batch"),
    (PREFIX + "    sessions: 0\n", r"traffic\.llm\.sessions.*whole number of sessions >= 1"),
    ("    prefix_cache: {keyed: 1}\n", r"traffic\.llm\.prefix_cache\.keyed.*must be true or false, got 1"),
    ("    prefix_cache: {keyed: true}\n    sessions: 3\n", r"traffic\.llm\.sessions.*give sessions or keyed"),
    (PREFIX + "    callers: {node-7: 1}\n", r"traffic\.llm\.callers\.node-7.*unknown node 'node-7'.*node-0, node-1"),
    (PREFIX + "    callers: {node-0: -1}\n", r"traffic\.llm\.callers\.node-0.*>= 0"),
    (PREFIX + "    callers: {node-0: 0}\n", r"traffic\.llm\.callers.*every weight is 0"),
    (PREFIX + "    callers: {}\n", r"traffic\.llm\.callers.*at least one node"),
])
def test_bad_routing_keys_are_refused_naming_the_key(traffic, words):
    with pytest.raises(ScenarioError, match=words):
        parse_scenario(_text(traffic), "<routing>")


def test_simulate_prints_the_routing_figures_and_the_sweep_carries_them(tmp_path: Path):
    path = tmp_path / "routing.yaml"
    path.write_text(_text(PREFIX, "prefix_affinity", rate=20))
    one = CliRunner(env={"COLUMNS": "200"}).invoke(main, ["simulate", str(path)])
    assert one.exit_code == 0, one.output
    assert "routing" in one.stdout and "TTFT" in one.stdout and "hit share" in one.stdout
    out = CliRunner().invoke(main, ["simulate", str(path), "--format", "csv",
                                    "--set", "deployments.llm.request_router=power_of_two_choices,prefix_affinity"])
    assert out.exit_code == 0, out.output
    rows = list(csv.DictReader(io.StringIO(out.stdout)))
    share = {r["deployments.llm.request_router"]: float(r["requests_prefix_hit_share"]) for r in rows}
    assert share["prefix_affinity"] > share["power_of_two_choices"] > 0, share
    assert all(float(r["requests_ttft_p50"]) > 0 and float(r["requests_replica_imbalance"]) >= 1 for r in rows)
    js = CliRunner().invoke(main, ["simulate", str(path), "--format", "json", "--seeds", "2"])
    assert js.exit_code == 0, js.output
    summary = json.loads(js.stdout)["summary"][0]["figures"]
    assert summary["requests_ttft_p99"]["n"] == 2 and summary["requests_prefix_hit_share"]["mean"] > 0


def test_locality_widens_to_the_callers_zone_when_its_node_has_no_replica():
    """``cluster.nodes[].zone`` is the node's zone label: a caller on a node with no replica (no GPUs)
    reaches the replicas of its zone; without zones, any replica."""
    zoned = ("cluster: {nodes: [{name: gw, gpus: 0, zone: east}, {name: e1, gpus: 4, zone: east}, "
             "{name: w1, gpus: 4, zone: west}]}")
    text = _text("    service: 0.05\n    callers: {gw: 1}\n", "locality").replace(
        "cluster: {nodes: 2, gpus_per_node: 4}", zoned)
    result = Simulation(parse_scenario(text, "<zones>"), check=True).run()
    q = result.metrics["deployments"]["llm"]["requests"]
    nodes = {rid: r.node_id for rid, r in result.state.deployments["llm"].replicas.items()}
    assert sorted(set(nodes.values())) == ["e1", "w1"]
    assert {nodes[rid] for rid, n in q["served_by_replica"].items() if n} == {"e1"}, (q["served_by_replica"], nodes)
    plain = Simulation(parse_scenario(text.replace(", zone: east", "").replace(", zone: west", ""), "<no zones>"),
                       check=True).run()
    q = plain.metrics["deployments"]["llm"]["requests"]
    assert {nodes[rid] for rid, n in q["served_by_replica"].items() if n} == {"e1", "w1"}
    with pytest.raises(ScenarioError, match=r"cluster\.nodes\[0\]\.zone: must be a non-empty string"):
        parse_scenario(text.replace("zone: east}", "zone: 3}", 1), "<bad zone>")


def test_a_zone_needs_the_scenario_shaped_cluster_on_ray():
    from executors.ray_gpu.scenario import UnsupportedOnRay, check_supported, needs_cluster

    text = _text("    service: 0.05\n").replace(
        "cluster: {nodes: 2, gpus_per_node: 4}", "cluster: {nodes: [{name: a, gpus: 4, zone: east}]}")
    sc = parse_scenario(text.split("traffic:")[0], "<zone on ray>")  # (traffic is the simulator's only)
    assert needs_cluster(sc)
    check_supported(sc, multi_node=True)
    with pytest.raises(UnsupportedOnRay, match=r"cluster\.nodes a: zone"):
        check_supported(sc)
