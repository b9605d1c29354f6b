"""GPU memory tiers in the simulator (issue 21): the core decides every placement, eviction
and dropped copy; the simulator carries them out (loads take model_bytes over the link, an
evicted replica drains then leaves a WARM copy in its node's CPU cache) and counts them."""

from __future__ import annotations

import io
import json
from pathlib import Path

import pytest

from executors.scenarios import ScenarioError, load_scenario, parse_scenario
from executors.scenarios.metrics import tier_history
from executors.sim.runner import Simulation

ROOT = Path(__file__).resolve().parents[2]
EXAMPLE = ROOT / "examples" / "scenarios" / "tiers-3-models.yaml"
G = 10**9

#: one 80 GB GPU; a (60 GB) serves, b (60 GB) comes at t=100 and evicts it, b goes at t=200
EVICT = """
cluster:
  nodes: [{name: n, gpus: 1, gpu_memory: 80GB, cpu_cache: CACHE}]
latency: {place: 0.5, start: 2, stop: 1}
deployments:
  a: {replicas: 1, model_bytes: 60GB, min_deployment_time_s: 0 DEDICATED}
  b: {replicas: 1, model_bytes: 60GB, min_deployment_time_s: 0}
timeline:
  - deploy: a
  - at: 100
    deploy: b
  - at: 200
    scale: {deployment: b, replicas: 0}
duration: 300
"""


def _run(text: str):
    buf = io.StringIO()
    sim = Simulation(parse_scenario(text, "<t>"), trace=buf, check=True)
    result = sim.run()
    return sim, result, [json.loads(line) for line in buf.getvalue().splitlines()]


def _evict(cache: str = "100GB", dedicated: bool = False) -> str:
    return EVICT.replace("CACHE", cache).replace(" DEDICATED", ", dedicated: true" if dedicated else "")


def _within_budgets(sim: Simulation) -> None:
    for node in sim.backend.nodes.values():
        assert all(b <= m + 1e-6 for b, m in zip(node.booked, node.memory)), (node.name, node.booked)
        assert node.cached <= node.cache_bytes, (node.name, node.cached)


def test_evicted_model_drains_keeps_a_warm_copy_and_reloads_from_it() -> None:
    sim, result, recs = _run(_evict())
    m = result.metrics["deployments"]
    assert (m["a"]["evictions"], m["a"]["cold_loads"], m["a"]["warm_loads"]) == (1, 1, 1)
    assert (m["b"]["evictions"], m["b"]["cold_loads"], m["b"]["warm_loads"]) == (0, 1, 0)
    hist = tier_history(recs)
    a_ids = sorted(k for k in hist if k.startswith("a#"))
    assert [hist[k] for k in a_ids] == [["hot<-cold", "evicted->warm"], ["hot<-warm"]]
    # b was placed only once a had drained (stop latency 1 s) and left its GPU
    stopped = next(r["t"] for r in recs if r.get("type") == "ReplicaStopped" and r["replica"] == a_ids[0])
    placed = next(r["t"] for r in recs if r.get("type") == "PlaceReplica" and r["replica"].startswith("b#"))
    assert stopped == pytest.approx(101.0) and placed == stopped
    # the copy went back to the GPU: the cache is empty again, a serves
    assert sim.backend.nodes["n"].cache == []
    assert result.state.deployments["a"].healthy
    _within_budgets(sim)


def test_load_time_is_model_bytes_over_disk_or_host_to_device_bandwidth() -> None:
    _, result, recs = _run(_evict())
    ready = {r["replica"]: r["t"] for r in recs if r.get("type") == "ReplicaReady"}
    start = {r["replica"]: r["t"] for r in recs if r.get("type") == "StartReplica"}
    cold = 60 * G / (14.5 * G)
    warm = 60 * G / (54.8 * G)
    assert ready["a#0"] - start["a#0"] == pytest.approx(0.5 + 2 + cold)  # place + start + disk load
    (a2,) = [k for k in ready if k.startswith("a#") and k != "a#0"]
    placed = next(r["t"] for r in recs if r.get("type") == "ReplicaPlaced" and r["replica"] == a2)
    assert ready[a2] - placed == pytest.approx(2 + warm)  # from the WARM copy: 3.8x faster
    m = result.metrics["deployments"]["a"]
    assert m["wait_to_hot_max"] == pytest.approx(ready[a2] - start[a2])  # waited for b to go (~100 s)
    assert m["wait_to_hot_max"] > 100


def test_cache_too_small_evicts_to_cold_and_reloads_from_disk() -> None:
    sim, result, recs = _run(_evict(cache="50GB"))
    evicts = [r for r in recs if r.get("type") == "EvictReplica"]
    assert [e["fields"]["to"] for e in evicts] == ["cold"]
    m = result.metrics["deployments"]["a"]
    assert (m["evictions"], m["cold_loads"], m["warm_loads"]) == (1, 2, 0)
    assert sim.backend.nodes["n"].cache == []
    _within_budgets(sim)


def test_dedicated_model_is_never_evicted() -> None:
    _, result, recs = _run(_evict(dedicated=True))
    assert not [r for r in recs if r.get("type") == "EvictReplica"]
    m = result.metrics["deployments"]
    assert m["a"]["evictions"] == 0 and m["a"]["cold_loads"] == 1
    assert m["b"]["cold_loads"] == 0 and m["b"]["never_hot"] == 1  # b waited for room in vain, then was scaled off
    assert m["a"]["hot_seconds"] == pytest.approx(300 - (0.5 + 2 + 60 / 14.5))


def test_warm_placement_with_no_copy_loads_cold_and_the_trace_says_so() -> None:
    buf = io.StringIO()
    sim = Simulation(parse_scenario(_evict(), "<t>"), trace=buf, check=True)
    node = sim.backend.nodes["n"]
    seen = []

    def lose_copy() -> None:  # the copy is lost behind the core's back
        seen.extend(c.deployment for c in node.cache)
        node.cache.clear()

    sim.schedule(150, lose_copy)  # a evicted, its WARM copy on n
    result = sim.run()
    assert seen == ["a"]
    recs = [json.loads(line) for line in buf.getvalue().splitlines()]
    sources = [r["fields"]["source"] for r in recs if r.get("type") == "PlaceReplica" and r["replica"].startswith("a#")]
    assert sources == ["cold", "warm"]  # the core asked for warm ...
    m = result.metrics["deployments"]["a"]
    assert (m["cold_loads"], m["warm_loads"], m["warm_fallbacks"]) == (2, 0, 1)  # ... it loaded from disk
    notes = [r for r in recs if r.get("kind") == "fault" and r["type"] == "warm_copy_missing"]
    assert len(notes) == 1 and notes[0]["loads_from"] == "cold" and notes[0]["deployment"] == "a"


def test_nodes_join_with_their_devices_and_cache() -> None:
    sc = parse_scenario("cluster: {nodes: 2, gpus_per_node: 2, gpu_memory: 80GiB, cpu_cache: 64GiB}\n"
                        "deployments: {a: {model_bytes: 16GiB}}\ntimeline: []", "<t>")
    sim = Simulation(sc)
    joined = sim.backend.joined()
    assert [(j.devices, j.cpu_cache_bytes) for j in joined] == [((80 * 2**30,) * 2, 64 * 2**30)] * 2
    assert sc.deployments["a"].applied().model_bytes == 16 * 2**30


def test_the_example_meets_its_expectations() -> None:
    sim = Simulation(load_scenario(EXAMPLE), check=True)
    result = sim.run()
    assert result.passed, [(e.name, e.detail) for e in result.failures]
    m = result.metrics["deployments"]
    assert sum(d["evictions"] for d in m.values()) >= 2
    _within_budgets(sim)


@pytest.mark.parametrize(("where", "text", "field", "message"), [
    ("cluster", "gpu_memory: 80GiBs", "cluster.gpu_memory", "must be a number of bytes, got '80GiBs'"),
    ("cluster", "cpu_cache: -1", "cluster.cpu_cache", "must be >= 0, got -1"),
    ("cluster", "gpu_memory: 80GB, gpus_per_node: 1.5", "cluster.gpus_per_node", "a whole number of GPUs"),
    ("node", "cpu_cache: lots", "cluster.nodes[0].cpu_cache", "must be a number of bytes, got 'lots'"),
    ("node", "gpu_mem: 80GB", "cluster.nodes[0].gpu_mem", "unknown field (did you mean 'gpu_memory'?)"),
    ("deployment", "model_bytes: 7XB", "deployments.a.model_bytes", "must be a number of bytes, got '7XB'"),
    ("deployment", "model_bytes: 10GiB, gpus: 0.5", "deployments.a.model_bytes", "whole number of GPUs"),
    ("deployment", "dedicated: maybe", "deployments.a.dedicated", "dedicated must be a bool"),
    ("deployment", "min_deployment_time_s: -1", "deployments.a.min_deployment_time_s", "min_deployment_time_s must"),
])
def test_bad_tier_keys_are_refused_naming_the_key(where: str, text: str, field: str, message: str) -> None:
    cluster = "{nodes: 1, " + text + "}" if where == "cluster" else (
        "{nodes: [{name: n, " + text + "}]}" if where == "node" else "{nodes: 1}")
    dep = "{" + text + "}" if where == "deployment" else "{}"
    with pytest.raises(ScenarioError) as err:
        parse_scenario(f"cluster: {cluster}\ndeployments: {{a: {dep}}}\ntimeline: []", "<s>")
    assert err.value.field == field and message in err.value.message, str(err.value)


def test_sizes_read_as_bytes() -> None:
    sc = parse_scenario("cluster: {nodes: [{name: n, gpus: 1, gpu_memory: 80GB, cpu_cache: 1.5TiB}]}\n"
                        "deployments: {a: {model_bytes: 16e9}, b: {model_bytes: 512MiB}, c: {model_bytes: 1000}}\n"
                        "timeline: []", "<t>")
    assert (sc.nodes[0].gpu_memory, sc.nodes[0].cpu_cache) == (80 * G, int(1.5 * 2**40))
    assert [sc.deployments[k].model_bytes for k in "abc"] == [16 * G, 512 * 2**20, 1000]


def test_the_example_s_evicting_replica_is_placed_on_the_room_it_freed() -> None:
    """Chat's third replica (t=1200) evicts code and embed from one GPU of node-1 and is placed
    there once they drained; the victims' replacements wait (they never take that room)."""
    buf = io.StringIO()
    result = Simulation(load_scenario(EXAMPLE), trace=buf, check=True).run()
    recs = [json.loads(line) for line in buf.getvalue().splitlines()]
    evicts = [r for r in recs if r.get("type") == "EvictReplica"]
    assert {r["deployment"] for r in evicts} == {"code", "embed"} and {r["t"] for r in evicts} == {1200.0}
    victims = {r["replica"] for r in evicts}
    stopped = max(r["t"] for r in recs if r.get("type") == "ReplicaStopped" and r["replica"] in victims)
    starts = [r for r in recs if r.get("type") == "StartReplica" and r["t"] == 1200.0]
    chat = next(r["replica"] for r in starts if r["deployment"] == "chat")
    place = next(r for r in recs if r.get("type") == "PlaceReplica" and r["replica"] == chat)
    assert place["t"] == stopped and place["node"] == evicts[0]["node"]
    # the victims' replacements are placed only after chat's downscale (t=1800) or never
    replacements = {r["replica"] for r in starts if r["deployment"] != "chat"}
    assert len(replacements) == 2
    assert all(r["t"] > 1800 for r in recs if r.get("type") == "PlaceReplica" and r["replica"] in replacements)
    assert result.metrics["deployments"]["chat"]["never_hot"] == 0


def test_a_controller_crash_keeps_the_warm_copies_the_nodes_hold() -> None:
    """The recovering core learns the nodes' WARM copies (``ControllerRecovered.warm_copies``):
    a's reload after the crash still comes from its copy, not from disk."""
    text = _evict().replace("  - at: 200\n", "  - at: 150\n    crash_controller: {recover_after: 5}\n  - at: 200\n")
    sim, result, recs = _run(text)
    m = result.metrics["deployments"]["a"]
    assert (m["evictions"], m["warm_loads"], m["cold_loads"]) == (1, 1, 1)
    assert any(r.get("type") == "ControllerRecovered" or r.get("fault") == "controller_recovered" for r in recs)
    assert result.state.deployments["a"].healthy
    _within_budgets(sim)
