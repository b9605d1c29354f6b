"""Which node a replica's placement group is aimed at, and placement option checks (no Ray needed)."""

from __future__ import annotations

import math

import pytest

from executors.ray_gpu import placement as pl


def nodes(*gpus: float, labels: dict | None = None) -> list[pl.NodeView]:
    return [pl.NodeView(f"n{i}", pl.node_order((labels or {}).get(i, {}), i, f"n{i}"), {"GPU": g, "CPU": 8.0})
            for i, g in enumerate(gpus)]


def test_spread_follows_the_simulators_rule():
    ns = nodes(4, 4, 4)
    need = {"GPU": 1.0, "CPU": 0.1}
    # most free GPUs first; ties go to the node first in order
    assert pl.choose_node(ns, {}, {}, need, "spread") == "n0"
    assert pl.choose_node(ns, {"n0": {"GPU": 1}}, {"n0": 1}, need, "spread") == "n1"
    # equal free GPUs: fewer replicas of this deployment wins
    two = ns[:2]
    assert pl.choose_node(two, {"n0": {"GPU": 1}, "n1": {"GPU": 1}}, {"n0": 1, "n1": 0}, need, "spread") == "n1"


def test_pack_fills_the_fullest_node_that_fits():
    ns = nodes(4, 4, 4)
    need = {"GPU": 1.0}
    assert pl.choose_node(ns, {"n1": {"GPU": 2}}, {}, need, "pack") == "n1"
    assert pl.choose_node(ns, {"n1": {"GPU": 4}}, {}, need, "pack") == "n0"  # n1 is full


def test_no_node_with_room_means_no_target():
    ns = nodes(2, 2)
    assert pl.choose_node(ns, {"n0": {"GPU": 2}, "n1": {"GPU": 1.5}}, {}, {"GPU": 1.0}, "spread") is None
    assert pl.choose_node(ns, {}, {}, {"TPU": 1.0}, "spread") is None  # a resource no node has


def test_cpu_only_replicas_spread_by_free_cpus():
    ns = [pl.NodeView("a", (math.inf, 0, "a"), {"CPU": 4.0}), pl.NodeView("b", (math.inf, 1, "b"), {"CPU": 4.0})]
    assert pl.choose_node(ns, {"a": {"CPU": 1}}, {}, {"CPU": 1.0}, "spread") == "b"


def test_the_order_label_decides_ties_before_first_seen():
    ns = nodes(4, 4, labels={0: {pl.ORDER_LABEL: "7"}, 1: {pl.ORDER_LABEL: "2"}})
    assert pl.choose_node(ns, {}, {}, {"GPU": 1.0}, "spread") == "n1"
    assert pl.node_order({pl.ORDER_LABEL: "x"}, 3, "id") == (math.inf, 3, "id")  # a bad label is ignored


def test_default_bundle_is_what_the_actor_asks_for():
    assert pl.replica_bundles({"num_gpus": 1, "num_cpus": 0.5}, None) == [{"CPU": 0.5, "GPU": 1.0}]
    assert pl.replica_bundles({"num_gpus": 1}, None) == [{"CPU": 1.0, "GPU": 1.0}]  # num_cpus defaults to 1
    assert pl.replica_bundles({"resources": {"accel": 2}}, None) == [{"CPU": 1.0, "accel": 2.0}]
    assert pl.replica_bundles({"num_cpus": 0}, None) == []  # nothing to reserve: no group
    assert pl.replica_bundles({}, [{"CPU": 1}, {"GPU": 2}]) == [{"CPU": 1.0}, {"GPU": 2.0}]
    assert pl.bundle_sum([{"CPU": 1}, {"CPU": 0.5, "GPU": 2}]) == {"CPU": 1.5, "GPU": 2}


@pytest.mark.parametrize("options, bundles, strategy, placement, message", [
    ({}, None, "PACK", "scatter", "replica_placement must be one of spread, pack, got 'scatter'"),
    ({}, None, "TIGHT", "spread", "placement_group_strategy must be one of"),
    ({"scheduling_strategy": "SPREAD"}, None, "PACK", "spread", "may not set scheduling_strategy"),
    ({"num_gpus": -1}, None, "PACK", "spread", "ray_actor_options['num_gpus'] must be a number >= 0, got -1"),
    ({}, [], "PACK", "spread", "placement_group_bundles must be a non-empty list"),
    ({}, [{"CPU": 1}, {}], "PACK", "spread", "placement_group_bundles[1] must be a non-empty dict"),
    ({}, [{"GPU": "one"}], "PACK", "spread", "placement_group_bundles[0]['GPU'] must be a number >= 0"),
    ({"num_gpus": 2}, [{"GPU": 1}, {"GPU": 4}], "PACK", "spread",
     "runs in placement_group_bundles[0], which has 1 GPU, but ray_actor_options asks for 2"),
])
def test_bad_placement_options_are_named(options, bundles, strategy, placement, message):
    with pytest.raises(ValueError) as exc:
        pl.validate(options, bundles, strategy, placement)
    assert message in str(exc.value)


def test_deployment_checks_its_placement_options_when_declared():
    from executors.ray_gpu import deployment

    with pytest.raises(ValueError, match="replica_placement"):
        @deployment(replica_placement="everywhere")
        class Nope:
            pass
    with pytest.raises(ValueError, match="max_ongoing_requests must be >= 1"):
        deployment(max_ongoing_requests=0)(type("X", (), {}))


def test_the_replica_actor_takes_what_it_asks_for_or_all_of_bundle_0():
    assert pl.actor_options_in_group({"num_gpus": 1}, [{"CPU": 2, "GPU": 1}]) == {"num_gpus": 1, "num_cpus": 1.0}
    assert pl.actor_options_in_group({"num_gpus": 1}, [{"GPU": 1}]) == {"num_gpus": 1, "num_cpus": 0.0}
    assert pl.actor_options_in_group({"max_restarts": 0}, [{"CPU": 2, "GPU": 1, "memory": 5, "accel": 1}]) == {
        "max_restarts": 0, "num_cpus": 2, "num_gpus": 1, "memory": 5, "resources": {"accel": 1}}


def test_a_groups_holdings_per_node_come_from_its_table_entry():
    info = {"bundles": {0: {"CPU": 1.0}, 1: {"CPU": 0.5, "GPU": 1.0}, 2: {"GPU": 1.0}},
            "bundles_to_node_id": {0: "a", 1: "b", 2: "b"}}
    assert pl.per_node(info) == {"a": {"CPU": 1.0}, "b": {"CPU": 0.5, "GPU": 2.0}}
    assert pl.per_node({}) == {}  # not placed
