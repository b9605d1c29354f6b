"""Which node a replica goes to (rankcore.placement.policies, both executors' rule) and the Ray
executor's placement option checks (no Ray needed)."""

from __future__ import annotations

import math

import pytest

import rankcore as rc
from executors.ray_gpu.control import placement as pl
from rankcore.placement.policies import NodeView, choose_node


def nodes(*gpus: float, held: dict | None = None, mine: dict | None = None, order: dict | None = None) -> list[NodeView]:
    """Nodes n0, n1, ... with ``gpus`` each and 8 CPUs; ``held``: GPUs already taken; ``mine``: the deployment's replicas."""
    held, mine, order = held or {}, mine or {}, order or {}
    return [NodeView(node_id=f"n{i}", order=order.get(i, (math.inf, i, f"n{i}")),
                     free={"GPU": g - held.get(f"n{i}", 0), "CPU": 8.0}, replicas=mine.get(f"n{i}", 0))
            for i, g in enumerate(gpus)]


def test_spread_takes_the_most_free_gpus_then_the_fewest_of_its_own_replicas_then_order():
    need = {"GPU": 1.0, "CPU": 0.1}
    assert choose_node(nodes(4, 4, 4), need, "spread") == "n0"
    assert choose_node(nodes(4, 4, 4, held={"n0": 1}), need, "spread") == "n1"
    # equal free GPUs: fewer replicas of this deployment wins (other deployments' do not count:
    # they already show as less free room)
    assert choose_node(nodes(4, 4, held={"n0": 1, "n1": 1}, mine={"n0": 1}), need, "spread") == "n1"


def test_pack_fills_the_fullest_node_that_fits():
    need = {"GPU": 1.0}
    assert choose_node(nodes(4, 4, 4, held={"n1": 2}), need, "pack") == "n1"
    assert choose_node(nodes(4, 4, 4, held={"n1": 4}), need, "pack") == "n0"  # n1 is full


def test_rank_packed_puts_consecutive_ranks_together():
    need = {"GPU": 1.0}
    # rank 5's predecessor (rank 4) is on n2, which has room: n2, though spread or pack would differ
    ns = nodes(4, 4, 4, held={"n0": 3, "n2": 1})
    assert choose_node(ns, need, "rank_packed", rank=5, rank_nodes={4: "n2", 3: "n0"}) == "n2"
    assert choose_node(ns, need, "pack") == "n0"
    # the predecessor's node is full: the pack choice (the next node fills up from its first rank)
    full = nodes(2, 4, 4, held={"n0": 2, "n1": 1})
    assert choose_node(full, need, "rank_packed", rank=2, rank_nodes={1: "n0"}) == "n1"
    assert choose_node(nodes(4, 4), need, "rank_packed", rank=0) == "n0"


def test_rank_packed_placement_in_rank_order_gives_blocks_of_ranks_per_node():
    """Ranks 0..k-1 on one node, k..2k-1 on the next: node ranks follow global ranks."""
    free = {"n0": 4.0, "n1": 4.0, "n2": 4.0}
    where: dict[int, str] = {}
    for rank in range(12):
        ns = [NodeView(node_id=n, order=i, free={"GPU": free[n]}) for i, n in enumerate(free)]
        node = choose_node(ns, {"GPU": 1.0}, "rank_packed", rank=rank, rank_nodes=where)
        assert node is not None
        where[rank] = node
        free[node] -= 1
    assert [where[r] for r in range(12)] == ["n0"] * 4 + ["n1"] * 4 + ["n2"] * 4


def test_no_node_with_room_means_none():
    assert choose_node(nodes(2, 2, held={"n0": 2, "n1": 1.5}), {"GPU": 1.0}, "spread") is None
    assert choose_node(nodes(2, 2), {"TPU": 1.0}, "spread") is None  # a resource no node has


def test_cpu_only_replicas_spread_by_free_cpus():
    ns = [NodeView(node_id="a", order=0, free={"CPU": 3.0}), NodeView(node_id="b", order=1, free={"CPU": 4.0})]
    assert choose_node(ns, {"CPU": 1.0}, "spread") == "b"


def test_an_unknown_policy_is_refused_by_name():
    with pytest.raises(rc.InvalidConfig, match="placement policy must be one of spread, pack, rank_packed, got 'x'"):
        choose_node(nodes(1), {"GPU": 1.0}, "x")


def test_a_ray_node_joins_the_core_with_its_totals_labels_and_order_label():
    info = {"NodeID": "ab12", "Alive": True, "Resources": {"CPU": 2, "GPU": 4.0, "node:10.0.0.1": 1.0},
            "Labels": {pl.ORDER_LABEL: "7", "ray.io/node-id": "ab12"}}
    joined = pl.node_joined(info)
    assert joined == rc.NodeJoined(node_id="ab12", resources={"CPU": 2.0, "GPU": 4.0, "node:10.0.0.1": 1.0},
                                   labels={pl.ORDER_LABEL: "7", "ray.io/node-id": "ab12"}, order=7)
    # no order label, or one that is not an int >= 0: the order the nodes joined in
    assert pl.node_joined({"NodeID": "cd", "Resources": {"CPU": 1}}).order is None
    assert pl.order_label({pl.ORDER_LABEL: "x"}) is None and pl.order_label({pl.ORDER_LABEL: "-1"}) is None


def test_what_one_replica_reserves_on_its_node():
    """The core's need for a replica: its whole group when the group is on one node, else bundle 0."""
    assert pl.replica_need({"num_gpus": 1, "num_cpus": 0.5}, None, "PACK") == {"CPU": 0.5, "GPU": 1.0}
    assert pl.replica_need({"num_cpus": 0, "num_gpus": 2}, None, "PACK") == {"GPU": 2.0}  # no CPU at all
    assert pl.replica_need({"num_cpus": 0}, None, "PACK") == {}  # reserves nothing: no group
    two = [{"CPU": 1}, {"CPU": 0.5, "GPU": 1}]
    assert pl.replica_need({}, two, "STRICT_PACK") == {"CPU": 1.5, "GPU": 1.0}
    # bundles that may land on other nodes: only bundle 0 (the replica's own) is the core's to place
    assert pl.replica_need({}, two, "PACK") == {"CPU": 1.0}


def test_default_bundle_is_what_the_actor_asks_for():
    assert pl.replica_bundles({"num_gpus": 1, "num_cpus": 0.5}, None) == [{"CPU": 0.5, "GPU": 1.0}]
    assert pl.replica_bundles({"num_gpus": 1}, None) == [{"CPU": 1.0, "GPU": 1.0}]  # num_cpus defaults to 1
    assert pl.replica_bundles({"resources": {"accel": 2}}, None) == [{"CPU": 1.0, "accel": 2.0}]
    assert pl.replica_bundles({"num_cpus": 0}, None) == []  # nothing to reserve: no group
    assert pl.replica_bundles({}, [{"CPU": 1}, {"GPU": 2}]) == [{"CPU": 1.0}, {"GPU": 2.0}]
    assert pl.bundle_sum([{"CPU": 1}, {"CPU": 0.5, "GPU": 2}]) == {"CPU": 1.5, "GPU": 2}


@pytest.mark.parametrize("options, bundles, strategy, placement, message", [
    ({}, None, "PACK", "scatter", "replica_placement must be one of spread, pack, rank_packed, got 'scatter'"),
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
    with pytest.raises(ValueError, match="max_ongoing_requests must be an int >= 1"):
        deployment(max_ongoing_requests=0)(type("X", (), {}))


def test_the_replica_actor_takes_what_it_asks_for_or_all_of_bundle_0():
    assert pl.actor_options_in_group({"num_gpus": 1}, [{"CPU": 2, "GPU": 1}]) == {"num_gpus": 1, "num_cpus": 1.0}
    assert pl.actor_options_in_group({"num_gpus": 1}, [{"GPU": 1}]) == {"num_gpus": 1, "num_cpus": 0.0}
    assert pl.actor_options_in_group({"max_restarts": 0}, [{"CPU": 2, "GPU": 1, "memory": 5, "accel": 1}]) == {
        "max_restarts": 0, "num_cpus": 2, "num_gpus": 1, "memory": 5, "resources": {"accel": 1}}

