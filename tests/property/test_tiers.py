"""Model tiers' choices (``rankcore.tiers.choice``) against brute force, on random
nodes: no device over-committed, no dedicated or young replica evicted (but
for a dedicated newcomer), no eviction that was not needed, the preference
order across nodes, the CPU cache never over its budget, dropped smallest first
and none more than needed, and the same answer whatever order the nodes come in."""

from __future__ import annotations

import itertools

from hypothesis import given, settings
from hypothesis import strategies as st

from rankcore.tiers.choice import (
    PREFERENCE,
    CacheEntry,
    Choice,
    Device,
    NodeTiers,
    Refusal,
    Resident,
    TierPlacement,
    Want,
    choose,
    evictable,
    fit_devices,
    make_room,
    victims,
)

GIB = 1 << 30
DEPLOYMENTS = ("a", "b", "c", "d")


@st.composite
def nodes_st(draw, n_min: int = 1, n_max: int = 4) -> list[NodeTiers]:
    """Nodes whose residents fit their devices (what a core's books hold)."""
    out = []
    serial = itertools.count()
    for n in range(draw(st.integers(n_min, n_max))):
        devices = [Device(index=i, memory=draw(st.sampled_from([16, 24, 40, 80])) * GIB)
                   for i in range(draw(st.integers(1, 4)))]
        free = {d.index: d.memory for d in devices}
        residents = []
        for _ in range(draw(st.integers(0, 6))):
            gpus = draw(st.integers(1, len(devices)))
            per = draw(st.sampled_from([4, 8, 12, 20, 40])) * GIB
            fit = fit_devices(free, per, gpus)
            if fit is None:
                continue
            for i in fit:
                free[i] -= per
            residents.append(Resident(replica_id=f"r{next(serial)}", deployment=draw(st.sampled_from(DEPLOYMENTS)),
                                      devices=fit, bytes_per_device=per, dedicated=draw(st.booleans()),
                                      hot_since=float(draw(st.integers(0, 7200)))))
        budget = draw(st.sampled_from([0, 32, 64, 128])) * GIB
        cache, used = [], 0
        for _ in range(draw(st.integers(0, 4))):
            size = draw(st.sampled_from([8, 16, 24, 40])) * GIB
            if used + size > budget:
                continue
            used += size
            cache.append(CacheEntry(deployment=draw(st.sampled_from(DEPLOYMENTS)), nbytes=size,
                                    replica_id=f"w{next(serial)}", pinned=draw(st.booleans())))
        out.append(NodeTiers(node_id=f"node-{n}", devices=devices, residents=residents, cache_budget=budget,
                             cache=cache, order=(draw(st.integers(0, 2)), n)))
    return out


@st.composite
def want_st(draw, nodes: list[NodeTiers]) -> Want:
    residents = [r for n in nodes for r in n.residents]
    rid = draw(st.one_of(st.none(), st.sampled_from([r.replica_id for r in residents] or ["x"])))
    dep = draw(st.sampled_from(DEPLOYMENTS))
    if rid is not None:  # (a replica that exists is of its own deployment)
        dep = next((r.deployment for r in residents if r.replica_id == rid), dep)
    only = draw(st.one_of(st.none(), st.frozensets(st.sampled_from([n.node_id for n in nodes]), min_size=1)))
    return Want(deployment=dep, model_bytes=draw(st.sampled_from([8, 16, 24, 40, 80, 160])) * GIB,
                gpus=draw(st.integers(1, 4)), dedicated=draw(st.booleans()), replica_id=rid,
                now=float(draw(st.integers(0, 9000))), min_deployment_time_s=draw(st.sampled_from([0.0, 3600.0])),
                nodes=only)


def _fits(free: dict[int, int], want: Want) -> bool:
    return sum(room >= want.per_device for room in free.values()) >= want.gpus


def _free_after(node: NodeTiers, gone: set[str]) -> dict[int, int]:
    free = node.free()
    for r in node.residents:
        if r.replica_id in gone:
            for i in r.devices:
                free[i] += r.bytes_per_device
    return free


def _oracle(node: NodeTiers, want: Want) -> Choice | None:
    """The best class of one node, by brute force."""
    if want.nodes is not None and node.node_id not in want.nodes:
        return None
    if want.replica_id is not None and any(r.replica_id == want.replica_id for r in node.residents):
        return Choice.HOT_HERE
    warm = any(e.deployment == want.deployment and (not e.pinned or e.replica_id == want.replica_id)
               for e in node.cache)
    if _fits(node.free(), want):
        return Choice.WARM_FREE if warm else Choice.FREE
    if _fits(_free_after(node, {r.replica_id for r in node.residents if evictable(r, want)}), want):
        return Choice.WARM_FULL if warm else Choice.FULL
    return None


@settings(max_examples=400, deadline=None)
@given(st.data())
def test_choose_keeps_every_rule(data):
    nodes = data.draw(nodes_st())
    want = data.draw(want_st(nodes))
    got = choose(nodes, want)
    classes = {n.node_id: _oracle(n, want) for n in nodes}
    if isinstance(got, Refusal):
        assert all(c is None for c in classes.values()), classes
        assert want.deployment in got.reason and not got
        return
    assert isinstance(got, TierPlacement)
    node = next(n for n in nodes if n.node_id == got.node_id)
    # the class is the node's own, and no node offers a better one (the preference order)
    assert classes[got.node_id] is got.choice
    best = min(PREFERENCE.index(c) for c in classes.values() if c is not None)
    assert PREFERENCE.index(got.choice) == best
    if got.choice is Choice.HOT_HERE:
        assert got.evict == () and got.source.value == "hot"
        return
    # devices: distinct, as many as asked, each with room once the victims are gone (no over-commit)
    assert len(set(got.devices)) == len(got.devices) == want.gpus
    by_id = {r.replica_id: r for r in node.residents}
    free = _free_after(node, set(got.evict))
    assert all(free[i] >= want.per_device for i in got.devices)
    # victims: evictable ones only (never dedicated, never young for a non-dedicated newcomer,
    # never its own deployment), each one needed, and only in the *_FULL classes
    assert (got.evict != ()) == (got.choice in (Choice.FULL, Choice.WARM_FULL))
    for rid in got.evict:
        r = by_id[rid]
        assert not r.dedicated and r.deployment != want.deployment
        assert want.dedicated or want.now - r.hot_since >= want.min_deployment_time_s
        assert not _fits(_free_after(node, set(got.evict) - {rid}), want), f"{rid} was evicted for nothing"
    assert got.evicted_bytes == sum(by_id[rid].nbytes for rid in got.evict)
    assert (got.source.value == "warm") == (got.choice in (Choice.WARM_FREE, Choice.WARM_FULL))


@settings(max_examples=200, deadline=None)
@given(st.data())
def test_choose_is_the_same_whatever_the_node_order(data):
    nodes = data.draw(nodes_st(2, 5))
    want = data.draw(want_st(nodes))
    shuffled = data.draw(st.permutations(nodes))
    assert choose(shuffled, want) == choose(nodes, want)


@settings(max_examples=300, deadline=None)
@given(st.data())
def test_victims_agree_with_choose_and_fit(data):
    node = data.draw(nodes_st(1, 1))[0]
    want = data.draw(want_st([node]))
    out = victims(node, want)
    after_all = _free_after(node, {r.replica_id for r in node.residents if evictable(r, want)})
    assert (out is None) == (not _fits(after_all, want))
    if out is not None:
        assert _fits(_free_after(node, {r.replica_id for r in out}), want)


@settings(max_examples=400, deadline=None)
@given(st.data())
def test_make_room_never_goes_over_budget_and_drops_smallest_first(data):
    node = data.draw(nodes_st(1, 1))[0]
    entry = CacheEntry(deployment="z", nbytes=data.draw(st.sampled_from([8, 16, 40, 64, 200])) * GIB,
                       replica_id="new")
    out = make_room(node, entry)
    assert sum(e.nbytes for e in out.cache) <= node.cache_budget
    assert all(e in out.cache for e in node.cache if e.pinned)  # a sleeper's weights are never dropped
    if not out.warm:
        assert out.cache == node.cache and out.dropped == ()
        pinned = sum(e.nbytes for e in node.cache if e.pinned)
        assert pinned + entry.nbytes > node.cache_budget  # even dropping every unpinned entry was not enough
        return
    assert out.cache[-1] is entry
    assert sorted(out.dropped + out.cache[:-1], key=id) == sorted(node.cache, key=id)
    # dropped: among the smallest unpinned entries (by size, then place in the cache), up to the
    # first that made room; and none more than needed: keeping any one back would not fit
    order = sorted((e.nbytes, i) for i, e in enumerate(node.cache) if not e.pinned)
    used, k = node.cached(), 0
    while used + entry.nbytes > node.cache_budget:
        used -= order[k][0]
        k += 1
    dropped_at = {(e.nbytes, node.cache.index(e)) for e in out.dropped}
    assert dropped_at <= set(order[:k])
    kept = sum(e.nbytes for e in out.cache)
    assert all(kept + e.nbytes > node.cache_budget for e in out.dropped)


@settings(max_examples=150, deadline=None)
@given(st.data())
def test_a_sequence_of_placements_never_breaks_the_tier_invariants(data):
    """Random wants placed one after another (``choose`` then ``apply``, the
    clock moving on): no device is ever over-committed, no replica is HOT
    twice, the cache stays within budget, dedicated replicas never leave."""
    from rankcore.invariants import check_tiers
    from rankcore.tiers.choice import apply

    nodes = tuple(data.draw(nodes_st(1, 3)))
    check_tiers(nodes)
    dedicated = {r.replica_id for n in nodes for r in n.residents if r.dedicated}
    now = 0.0
    for k in range(data.draw(st.integers(1, 12))):
        now += data.draw(st.sampled_from([0.0, 600.0, 4000.0]))
        want = Want(deployment=data.draw(st.sampled_from(DEPLOYMENTS)), gpus=data.draw(st.integers(1, 2)),
                    model_bytes=data.draw(st.sampled_from([8, 16, 40, 80])) * GIB,
                    dedicated=data.draw(st.booleans()), now=now)
        got = choose(nodes, want)
        if not got:
            continue
        assert isinstance(got, TierPlacement)
        nodes = apply(nodes, got, want, f"new{k}")
        check_tiers(nodes)
        if want.dedicated:
            dedicated.add(f"new{k}")
        hot = {r.replica_id for n in nodes for r in n.residents}
        assert dedicated <= hot and f"new{k}" in hot
        assert not hot & set(got.evict)


def test_check_tiers_names_what_is_wrong():
    import pytest

    from rankcore.base.errors import InvariantViolation
    from rankcore.invariants import check_tiers

    big = Resident(replica_id="r", deployment="a", devices=(0,), bytes_per_device=90 * GIB)
    node = NodeTiers(node_id="n0", devices=[Device(index=0, memory=80 * GIB)], residents=[big])
    with pytest.raises(InvariantViolation, match="device 0 of node 'n0' is over-committed"):
        check_tiers([node])
    ok = Resident(replica_id="r", deployment="a", devices=(0,), bytes_per_device=GIB)
    twice = [NodeTiers(node_id=f"n{i}", devices=[Device(index=0, memory=80 * GIB)], residents=[ok]) for i in (0, 1)]
    with pytest.raises(InvariantViolation, match="'r' is HOT twice"):
        check_tiers(twice)
    over = NodeTiers(node_id="n0", devices=[], cache_budget=GIB, cache=[CacheEntry(deployment="a", nbytes=2 * GIB)])
    with pytest.raises(InvariantViolation, match="over its budget"):
        check_tiers([over])
