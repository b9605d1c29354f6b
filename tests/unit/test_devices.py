"""GPU memory in the step (issue 21, rankcore/tiers/devices.py): the rules the golden scripts
(tests/scenarios/eviction-*.txt, sleep-frees-gpu.txt) do not show, and the errors."""

from __future__ import annotations

import pytest

import rankcore as rc
from rankcore import invariants as inv

G = 10**9


def run(*events: object, state: rc.State | None = None) -> tuple[rc.State, list]:
    state = state or rc.State()
    commands: list = []
    for e in events:
        before = state
        result = rc.step(state, e)
        inv.check_step(before, e, result, full=True)
        state = result.state
        commands.extend(result.commands)
    return state, commands


def of(commands: list, kind: type) -> list:
    return [c for c in commands if isinstance(c, kind)]


def device_node(node: str = "n0", gpus: int = 1, gb: int = 80, cache_gb: int = 0) -> rc.NodeJoined:
    return rc.NodeJoined(node_id=node, resources={"GPU": gpus, "CPU": 8}, devices=(gb * G,) * gpus,
                         cpu_cache_bytes=cache_gb * G)


def model(name: str, gb: int, n: int = 1, **kw: object) -> rc.DeploymentApplied:
    return rc.DeploymentApplied(name=name, num_replicas=n, resources={"GPU": kw.pop("gpus", 1)},
                                model_bytes=gb * G, min_deployment_time_s=0.0, **kw)


def test_a_placement_names_its_devices_and_books_only_host_resources() -> None:
    state, cmds = run(device_node(gpus=2), model("a", 100, gpus=2))
    (place,) = of(cmds, rc.PlaceReplica)
    assert place.devices == (0, 1) and place.source == "cold" and dict(place.resources) == {}
    node, r = state.cluster.hot["a#0"]
    assert node == "n0" and r.bytes_per_device == 50 * G
    assert state.cluster.nodes["n0"].free["GPU"] == 2.0  # (counted GPUs are untouched: booked by memory)


def test_a_deployment_that_counts_gpus_keeps_off_device_nodes() -> None:
    plain = rc.NodeJoined(node_id="plain", resources={"GPU": 1})
    _, cmds = run(device_node(), plain, rc.DeploymentApplied(name="x", num_replicas=2, resources={"GPU": 1}))
    assert [c.node_id for c in of(cmds, rc.PlaceReplica)] == ["plain"]  # the second waits: no device node


def test_a_model_larger_than_any_device_waits_and_nothing_is_evicted() -> None:
    state, cmds = run(device_node(), model("a", 60), model("huge", 90))
    state, more = run(rc.ReplicaPlaced(replica_id="a#0", node_id="n0"), state=state)
    assert not of(cmds + more, rc.EvictReplica)
    assert state.cluster.queue == ("huge#1",) and "huge#1" in state.cluster.queued


def test_placement_failed_frees_the_gpu_memory_before_placing_again() -> None:
    state, _ = run(device_node("n0"), device_node("n1"), model("a", 60))
    state, cmds = run(rc.PlacementFailed(replica_id="a#0", node_id="n0"), state=state)
    (place,) = of(cmds, rc.PlaceReplica)
    assert place.node_id == "n1" and [n for n, _ in state.cluster.hot.values()] == ["n1"]


def test_a_model_placed_on_another_node_than_chosen_is_stopped_and_replaced() -> None:
    state, _ = run(device_node("n0"), device_node("n1"), model("a", 60))
    state, cmds = run(rc.ReplicaPlaced(replica_id="a#0", node_id="n1"), state=state)
    assert [c.replica_id for c in of(cmds, rc.StopReplica)] == ["a#0"]
    assert [c.replica_id for c in of(cmds, rc.StartReplica)] == ["a#1"]
    assert "a#0" not in state.cluster.hot


def test_a_live_deployment_keeps_its_model_size() -> None:
    state, _ = run(device_node(), model("a", 60))
    with pytest.raises(rc.InvalidEvent, match=r"model_bytes or GPUs cannot change while it has replicas"):
        rc.step(state, model("a", 70))


def test_node_joined_devices_must_match_its_gpus() -> None:
    with pytest.raises(rc.InvalidConfig, match=r"resources say GPU=2 but devices lists 1"):
        rc.NodeJoined(node_id="n0", resources={"GPU": 2}, devices=(80,))
    with pytest.raises(rc.InvalidConfig, match=r"devices must be each GPU's memory"):
        rc.NodeJoined(node_id="n0", resources={"GPU": 1}, devices=(0,))


def test_model_bytes_only_sizes_moves_for_a_gang() -> None:
    state, cmds = run(device_node(gpus=2), rc.NodeJoined(node_id="plain", resources={"GPU": 2}),
                      rc.DeploymentApplied(name="g", num_replicas=2, gang_size=2, resources={"GPU": 1},
                                           model_bytes=10 * G))
    assert {c.node_id for c in of(cmds, rc.PlaceReplica)} == {"plain"} and not state.cluster.hot


def test_recovery_books_the_reported_devices_and_refuses_a_hot_report_without_them() -> None:
    state, _ = run(device_node(gpus=2, cache_gb=100), model("a", 60), model("b", 60))
    for rid in ("a#0", "b#1"):
        state, _ = run(rc.ReplicaPlaced(replica_id=rid, node_id="n0"), rc.ReplicaReady(replica_id=rid), state=state)
    event = inv.reports_from(state)
    recovered, _ = run(event)
    assert {rid: r.devices for rid, (_, r) in recovered.cluster.hot.items()} == \
        {rid: r.devices for rid, (_, r) in state.cluster.hot.items()}
    bad = event.reports[0].__class__(**{**{a: getattr(event.reports[0], a) for a in (
        "replica_id", "deployment", "rank", "node_id", "phase", "world_size", "lineage", "version", "tier",
        "weights_version")}, "devices": ()})
    import attrs
    with pytest.raises(rc.InvalidEvent, match=r"is HOT on device node 'n0' but reports devices \(\)"):
        rc.step(rc.State(), attrs.evolve(event, reports=(bad, *event.reports[1:])))


def test_recovery_keeps_the_warm_copies_the_executor_reports() -> None:
    state, _ = run(device_node(cache_gb=100), model("a", 60))
    b = rc.DeploymentApplied(name="b", num_replicas=1, resources={"GPU": 1}, model_bytes=60 * G,
                             min_deployment_time_s=1000.0, dedicated=True)
    state, _ = run(rc.ReplicaPlaced(replica_id="a#0", node_id="n0"), rc.ReplicaReady(replica_id="a#0"),
                   b, state=state)
    state, _ = run(rc.ReplicaStopped(replica_id="a#0"), rc.ReplicaPlaced(replica_id="b#1", node_id="n0"),
                   rc.ReplicaReady(replica_id="b#1"), state=state)
    assert [e.replica_id for e in state.cluster.caches["n0"]] == ["a#0"]
    event = inv.reports_from(state)
    assert [(w.node_id, w.replica_id) for w in event.warm_copies] == [("n0", "a#0")]
    recovered, cmds = run(event)
    assert [e.replica_id for e in recovered.cluster.caches["n0"]] == ["a#0"] and not of(cmds, rc.EvictReplica)
    assert recovered.cluster.queue == ("a#2",)  # (b is dedicated: a's replacement waits for room)



def test_the_memory_set_aside_for_multiplexed_models_is_booked_with_the_model() -> None:
    # 30 GB of model and 10 GB for its multiplexed models (issue 39): 40 GB a replica, two on a 100 GB GPU
    state, cmds = run(device_node(gb=100), model("lora", 30, n=3, multiplexed_bytes=10 * G))
    placed = of(cmds, rc.PlaceReplica)
    assert [p.replica_id for p in placed] == ["lora#0", "lora#1"]  # the third does not fit
    assert state.cluster.hot["lora#0"][1].bytes_per_device == 40 * G
    assert state.cluster.queue == ("lora#2",)
    alone, _ = run(device_node(gb=100), model("lora", 30, n=3))
    assert len(alone.cluster.hot) == 3  # without it, three 30 GB replicas fit


def test_multiplexed_bytes_needs_a_model_size_and_cannot_change_under_live_replicas() -> None:
    with pytest.raises(rc.InvalidConfig, match="multiplexed_bytes needs model_bytes > 0"):
        rc.DeploymentApplied(name="x", num_replicas=1, multiplexed_bytes=G)
    with pytest.raises(rc.InvalidConfig, match="multiplexed_bytes must be a number of bytes"):
        model("x", 30, multiplexed_bytes=-1)
    state, _ = run(device_node(), model("lora", 30, multiplexed_bytes=10 * G))
    with pytest.raises(rc.InvalidEvent, match="multiplexed_bytes cannot change while it has replicas"):
        rc.step(state, model("lora", 30, multiplexed_bytes=20 * G))


def test_a_recovery_books_the_multiplexed_memory_again() -> None:
    state, _ = run(device_node(gb=80), model("lora", 30, n=2, multiplexed_bytes=10 * G))
    state, _ = run(*(rc.ReplicaPlaced(replica_id=r, node_id="n0") for r in ("lora#0", "lora#1")), state=state)
    back, _ = run(inv.reports_from(state))
    assert back.cluster.hot["lora#1"][1].bytes_per_device == 40 * G
