"""``rankcore.tiers.choice`` on hand-built nodes: NDIF's eviction rules, the
preference for a WARM copy, refusals that say why, and bad input refused
where it is built."""

from __future__ import annotations

import pytest

import rankcore as rc
from rankcore.tiers.choice import (
    CacheEntry,
    Choice,
    Device,
    NodeTiers,
    Refusal,
    Resident,
    Tier,
    Want,
    choose,
    make_room,
)

GIB = 1 << 30


def node(node_id: str, gpus: int = 2, memory_gib: int = 80, residents=(), cache=(), budget_gib: int = 0,
         order: int = 0) -> NodeTiers:
    return NodeTiers(node_id=node_id, devices=[Device(index=i, memory=memory_gib * GIB) for i in range(gpus)],
                     residents=residents, cache=cache, cache_budget=budget_gib * GIB, order=order)


def hot(rid: str, dep: str, devices, gib: int, since: float = 0.0, dedicated: bool = False) -> Resident:
    return Resident(replica_id=rid, deployment=dep, devices=devices, bytes_per_device=gib * GIB,
                    hot_since=since, dedicated=dedicated)


def test_the_victim_using_fewest_gpus_goes_first():
    """A full node: a 2-GPU model and a 1-GPU model are old enough; the newcomer
    needs one device: the 1-GPU replica is evicted, the 2-GPU one stays."""
    n = node("n0", gpus=3, residents=[hot("big", "llama70b", (0, 1), 80), hot("small", "gpt2", (2,), 80)])
    got = choose([n], Want(deployment="new", model_bytes=60 * GIB, now=7200.0))
    assert got and got.choice is Choice.FULL and got.evict == ("small",) and got.devices == (2,)
    assert got.evicted_bytes == 80 * GIB and got.source is Tier.COLD


def test_young_and_dedicated_replicas_are_spared_unless_the_newcomer_is_dedicated():
    n = node("n0", gpus=1, residents=[hot("young", "m1", (0,), 80, since=1000.0)])
    want = Want(deployment="new", model_bytes=40 * GIB, now=1500.0)  # HOT for 500 s < 3600 s
    refused = choose([n], want)
    assert isinstance(refused, Refusal) and not refused
    assert "evicting every replica that may be evicted" in refused.reason and "3600" in refused.reason
    got = choose([n], Want(deployment="new", model_bytes=40 * GIB, now=1500.0, dedicated=True))
    assert got and got.evict == ("young",)
    n = node("n0", gpus=1, residents=[hot("pinned", "m1", (0,), 80, dedicated=True)])
    assert not choose([n], Want(deployment="new", model_bytes=40 * GIB, now=1e9, dedicated=True))


def test_a_warm_copy_beats_a_freer_node_and_free_room_beats_a_warm_copy_that_needs_evictions():
    warm = node("warm", gpus=1, cache=[CacheEntry(deployment="m", nbytes=40 * GIB)], budget_gib=64, order=1,
                residents=[hot("x", "other", (0,), 30)])
    empty = node("empty", gpus=4, order=0)
    got = choose([empty, warm], Want(deployment="m", model_bytes=40 * GIB))
    assert got and (got.node_id, got.choice, got.source) == ("warm", Choice.WARM_FREE, Tier.WARM)
    full_warm = node("warm", gpus=1, cache=[CacheEntry(deployment="m", nbytes=40 * GIB)], budget_gib=64,
                     residents=[hot("x", "other", (0,), 70)])
    got = choose([full_warm, empty], Want(deployment="m", model_bytes=40 * GIB, now=1e9))
    assert got and (got.node_id, got.choice) == ("empty", Choice.FREE)
    got = choose([full_warm], Want(deployment="m", model_bytes=40 * GIB, now=1e9))
    assert got and (got.choice, got.evict) == (Choice.WARM_FULL, ("x",))


def test_a_sleepers_pinned_weights_are_a_warm_copy_for_itself_only():
    sleeping = CacheEntry(deployment="m", nbytes=40 * GIB, replica_id="m#3", pinned=True)
    n = node("n0", cache=[sleeping], budget_gib=64)
    assert choose([n], Want(deployment="m", model_bytes=40 * GIB, replica_id="m#3")).source is Tier.WARM
    assert choose([n], Want(deployment="m", model_bytes=40 * GIB, replica_id="m#4")).source is Tier.COLD


def test_a_replica_already_hot_stays_where_it_is():
    n0, n1 = node("n0"), node("n1", residents=[hot("m#1", "m", (1,), 40)])
    got = choose([n0, n1], Want(deployment="m", model_bytes=40 * GIB, replica_id="m#1"))
    assert got and (got.node_id, got.choice, got.devices, got.evict) == ("n1", Choice.HOT_HERE, (1,), ())


def test_devices_are_chosen_best_fit_then_lowest_index():
    n = node("n0", gpus=4, residents=[hot("a", "x", (1,), 60), hot("b", "y", (3,), 60)])
    got = choose([n], Want(deployment="m", model_bytes=20 * GIB))  # fits anywhere: the tightest, lowest
    assert got and got.devices == (1,)
    got = choose([n], Want(deployment="m", model_bytes=60 * GIB, gpus=2))  # 30 GiB each: only 0 and 2 fit
    assert got and got.devices == (0, 2)


@pytest.mark.parametrize("nodes, want, words", [
    ([node("n0", gpus=2, memory_gib=24)], Want(deployment="m", model_bytes=40 * GIB),
     ["largest device has", "never be HOT"]),
    ([node("n0", gpus=2)], Want(deployment="m", model_bytes=40 * GIB, gpus=4), ["no node has 4 devices"]),
    ([node("n0")], Want(deployment="m", model_bytes=40 * GIB, nodes=frozenset({"gone"})), ["no node on node(s) gone"]),
])
def test_a_refusal_says_why(nodes, want, words):
    got = choose(nodes, want)
    assert isinstance(got, Refusal) and got.deployment == "m"
    for w in words:
        assert w in got.reason, got.reason


def test_make_room_drops_the_smallest_unpinned_entries_or_goes_cold():
    cache = [CacheEntry(deployment="a", nbytes=30 * GIB), CacheEntry(deployment="b", nbytes=10 * GIB),
             CacheEntry(deployment="c", nbytes=20 * GIB, replica_id="c#0", pinned=True)]
    n = node("n0", cache=cache, budget_gib=64)
    out = make_room(n, CacheEntry(deployment="d", nbytes=14 * GIB))  # 60 + 14 > 64: the smallest goes
    assert out.warm and [e.deployment for e in out.dropped] == ["b"]
    assert [e.deployment for e in out.cache] == ["a", "c", "d"]
    out = make_room(n, CacheEntry(deployment="d", nbytes=20 * GIB))  # b is not enough, a is: b stays
    assert out.warm and [e.deployment for e in out.dropped] == ["a"]
    assert [e.deployment for e in out.cache] == ["b", "c", "d"]
    out = make_room(n, CacheEntry(deployment="d", nbytes=40 * GIB))  # both unpinned go
    assert out.warm and [e.deployment for e in out.dropped] == ["a", "b"]
    out = make_room(n, CacheEntry(deployment="d", nbytes=50 * GIB))  # 20 GiB pinned: no room even then
    assert not out.warm and out.cache == n.cache and out.dropped == ()


@pytest.mark.parametrize("build, words", [
    (lambda: Device(index=0, memory=-1), "Device.memory must be a number of bytes"),
    (lambda: Device(index=0, memory=1.5), "Device.memory must be a number of bytes"),
    (lambda: Want(deployment="m", model_bytes=GIB, gpus=0), "Want.gpus must be an int >= 1"),
    (lambda: hot("r", "m", (), 1), "devices must be distinct and at least one"),
    (lambda: hot("r", "m", (0, 0), 1), "devices must be distinct"),
    (lambda: node("n0", gpus=2, residents=[hot("r", "m", (5,), 1)]), "device(s) [5], which the node does not have"),
    (lambda: NodeTiers(node_id="n0", devices=[Device(index=0, memory=1), Device(index=0, memory=1)]),
     "device indices repeat"),
])
def test_bad_input_is_refused_where_it_is_built(build, words):
    with pytest.raises(rc.InvalidConfig, match=words.replace("[", r"\[").replace("]", r"\]").replace("(", r"\(")
                       .replace(")", r"\)")):
        build()


def test_tiers_is_a_public_namespace():
    assert rc.tiers.choose is choose and "tiers" in rc.__all__


def test_apply_takes_the_source_copy_out_before_the_victims_go_into_the_cache():
    """Loading from a WARM copy frees its room first: the victim's weights then fit
    without dropping another model's copy (found in review: ``c`` went COLD)."""
    from rankcore.tiers.choice import apply

    n = NodeTiers(node_id="n", devices=[Device(index=0, memory=10)], cache_budget=14,
                  residents=[Resident(replica_id="b#0", deployment="b", devices=(0,), bytes_per_device=8)],
                  cache=[CacheEntry(deployment="a", nbytes=6), CacheEntry(deployment="c", nbytes=3)])
    want = Want(deployment="a", model_bytes=6, now=1e9)
    got = choose([n], want)
    assert got and (got.choice, got.evict, got.source) == (Choice.WARM_FULL, ("b#0",), Tier.WARM)
    (after,) = apply([n], got, want, "a#0")
    assert [(e.deployment, e.nbytes) for e in after.cache] == [("c", 3), ("b", 8)]
    assert [r.replica_id for r in after.residents] == ["a#0"]
