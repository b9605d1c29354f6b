"""Tests added for mutmut's survivors in rankcore/tiers/choice.py (issue 36, `make mutate`;
docs/testing.md names each survivor and what killed it, or why it is equivalent).

Each test states a behaviour the module promises (its docstring, a caller's need), not a
mutant's text. Sizes are small numbers of bytes, so the expected cache arithmetic reads at a glance.
"""

from __future__ import annotations

import attrs
import pytest

from rankcore.base.errors import InvalidConfig
from rankcore.tiers.choice import (
    CacheEntry,
    Choice,
    Device,
    NodeTiers,
    Refusal,
    Resident,
    Tier,
    TierPlacement,
    Want,
    apply,
    choose,
    evictable,
    make_room,
    victims,
)


def _node(node_id: str, memory: int, gpus: int = 1, residents: tuple[Resident, ...] = (),
          cache: tuple[CacheEntry, ...] = (), budget: int = 0) -> NodeTiers:
    return NodeTiers(node_id=node_id, devices=[Device(index=i, memory=memory) for i in range(gpus)],
                     residents=residents, cache=cache, cache_budget=budget)


# ------------------------------------------------------------------ _why_not (a Refusal's reason)
def test_a_refusal_restricted_to_some_nodes_names_them_and_judges_only_them() -> None:
    """``Refusal.reason`` says what the replica needs and why none of the nodes it may go to
    can take it, naming those nodes (sorted, comma-separated); a node it may not go to, however
    large, is not what the reason judges. Kills ``_why_not__mutmut_1`` (the need shown as None),
    ``_why_not__mutmut_3`` (the allowed nodes lost: "no node" said of nodes that exist) and
    ``_why_not__mutmut_7`` (the names joined with another separator)."""
    nodes = [_node("n1", 24_000), _node("n0", 24_000), _node("big", 80_000)]
    got = choose(nodes, Want(deployment="m", model_bytes=40_000, nodes=frozenset({"n1", "n0"})))
    assert isinstance(got, Refusal)
    assert got.reason == ("m: needs 1 device(s) with 40,000 bytes each; the largest device has 24,000 bytes "
                          "(the model can never be HOT on node(s) n0, n1)")
    # (on any node, the large one takes it: the restriction is what refused it)
    assert choose(nodes, Want(deployment="m", model_bytes=40_000))


def test_a_refusal_on_any_node_says_none_is_free_when_a_device_could_hold_the_model() -> None:
    """``Refusal.reason``: "the model can never be HOT" only when every device is smaller than
    its share; a device of exactly that size could hold it, so the reason is that none is free
    after every allowed eviction, said of any node when the want names none. Kills
    ``_why_not__mutmut_9``, ``_why_not__mutmut_10`` and ``_why_not__mutmut_11`` (the "on any
    node" words None or changed) and ``_why_not__mutmut_19`` (``<=``: a device of exactly the
    model's share called too small)."""
    # a device exactly the model's size, held by a replica that may not go (dedicated)
    held = Resident(replica_id="d#0", deployment="d", devices=(0,), bytes_per_device=40_000, dedicated=True)
    got = choose([_node("n0", 40_000, residents=(held,))], Want(deployment="m", model_bytes=40_000))
    assert isinstance(got, Refusal)
    assert got.reason == ("m: needs 1 device(s) with 40,000 bytes each; none is free on any node, even after "
                          "evicting every replica that may be evicted (not dedicated, HOT for 3600 s or more)")


def test_a_refusal_among_nodes_without_devices_says_the_largest_has_zero_bytes() -> None:
    """A node may declare no GPU devices (``NodeTiers.devices`` empty): the refusal then says the
    largest device has 0 bytes rather than failing to find one. Kills ``_why_not__mutmut_15``
    (None as the default: a TypeError), ``_why_not__mutmut_17`` (no default: a ValueError) and
    ``_why_not__mutmut_18`` (1 byte claimed)."""
    got = choose([NodeTiers(node_id="n0", devices=())], Want(deployment="m", model_bytes=40_000))
    assert isinstance(got, Refusal)
    assert got.reason == ("m: needs 1 device(s) with 40,000 bytes each; the largest device has 0 bytes "
                          "(the model can never be HOT on any node)")


# ------------------------------------------------------------------ victims, choose
def test_among_victims_on_as_many_gpus_the_youngest_hot_goes_first() -> None:
    """``victims``: after the fewest GPUs, the replica HOT most recently goes first (the least
    settled; NDIF's order), whatever its id. Either of two one-GPU replicas would make room: the
    younger one goes, though its id sorts after the older one's. Kills ``_victim_order__mutmut_1``
    (the oldest first)."""
    old = Resident(replica_id="a#0", deployment="a", devices=(0,), bytes_per_device=5, hot_since=100.0)
    young = Resident(replica_id="b#0", deployment="b", devices=(0,), bytes_per_device=5, hot_since=200.0)
    node = _node("n", 10, residents=(old, young))
    want = Want(deployment="m", model_bytes=5, now=1e9)
    assert victims(node, want) == (young,)
    got = choose([node], want)
    assert isinstance(got, TierPlacement) and got.evict == ("b#0",)


def _three_on_device_0(young: int, middle: int, old: int) -> tuple[Resident, ...]:
    """Three one-GPU replicas on device 0 holding these many bytes, HOT since t=300, 200 and 100
    (``a#0``, ``b#0``, ``c#0``): the youngest is the first victim."""
    return tuple(Resident(replica_id=f"{dep}#0", deployment=dep, devices=(0,), bytes_per_device=nbytes,
                          hot_since=since)
                 for dep, nbytes, since in [("a", young, 300.0), ("b", middle, 200.0), ("c", old, 100.0)])


def test_a_victim_whose_eviction_turns_out_not_needed_is_kept_whichever_it_was() -> None:
    """``victims``: evicted in order (the youngest HOT first among one-GPU replicas) until the
    newcomer fits, then every earlier victim not needed after all is kept, not only the first.
    Here 2 + 2 bytes are not enough, the oldest's 8 are, and alone: only it goes. Kills
    ``_needed__mutmut_4`` (only the first victim tried for keeping)."""
    young, middle, old = _three_on_device_0(2, 2, 8)
    node = _node("n", 12, residents=(young, middle, old))
    want = Want(deployment="m", model_bytes=8, now=1e9)
    assert victims(node, want) == (old,)
    got = choose([node], want)
    assert isinstance(got, TierPlacement) and (got.evict, got.evicted_bytes) == (("c#0",), 8)


def test_keeping_a_victim_back_counts_every_other_victims_bytes_on_the_device() -> None:
    """``victims``: when an earlier victim is tried for keeping back, the room is what every
    remaining victim frees, added up per device. Here 2 + 4 bytes are not enough for 10, the
    oldest's 6 make 12; then the youngest (2) is not needed after all (4 + 6 = 10), the middle
    one is (2 + 6 = 8). Kills ``_needed__mutmut_9`` (each victim's bytes replacing the others'
    on its device instead of adding to them: 6 < 10, every victim kept, one evicted for
    nothing)."""
    young, middle, old = _three_on_device_0(2, 4, 6)
    node = _node("n", 12, residents=(young, middle, old))
    want = Want(deployment="m", model_bytes=10, now=1e9)
    assert victims(node, want) == (middle, old)
    got = choose([node], want)
    assert isinstance(got, TierPlacement) and (got.evict, got.evicted_bytes) == (("b#0", "c#0"), 10)


def test_among_nodes_that_tie_on_everything_the_first_given_wins() -> None:
    """``choose``'s order of last resort is the order the nodes are given in: with two views that
    tie on every key (the same node given twice, here with different devices free), the first
    is chosen. Kills ``choose__mutmut_14`` (``<=``: the last of a tie won)."""
    first = NodeTiers(node_id="n", devices=[Device(index=0, memory=10), Device(index=1, memory=20)])
    second = NodeTiers(node_id="n", devices=[Device(index=0, memory=20), Device(index=1, memory=10)])
    want = Want(deployment="m", model_bytes=10)
    for nodes, device in [([first, second], 0), ([second, first], 1)]:
        got = choose(nodes, want)
        assert isinstance(got, TierPlacement) and got.devices == (device,)


# ------------------------------------------------------------------ validators
def test_a_bad_size_is_refused_naming_the_field_and_showing_the_value() -> None:
    """Bad input is refused where it is built, with a typed error naming the field and showing
    what was given. Kills ``_nonneg_bytes__mutmut_8`` and ``_positive_int__mutmut_8`` (None shown,
    not the value)."""
    with pytest.raises(InvalidConfig) as caught:
        Device(index=0, memory=-5)
    assert str(caught.value) == "Device.memory must be a number of bytes (an int >= 0), got -5"
    with pytest.raises(InvalidConfig) as caught:
        Want(deployment="m", model_bytes=1, gpus=0)
    assert str(caught.value) == "Want.gpus must be an int >= 1, got 0"


# ------------------------------------------------------------------ evictable
def _old(leaving: bool = False, claim: bool = False) -> Resident:
    """A one-GPU replica HOT since t=0, holding its whole 8-byte device."""
    return Resident(replica_id="b#0", deployment="b", devices=(0,), bytes_per_device=8, leaving=leaving,
                    claim=claim)


def test_a_want_that_may_not_evict_evicts_no_one() -> None:
    """``Want.may_evict`` False (an evicted replica's replacement): it only goes where it fits
    without evicting, however evictable the replicas there. Kills ``evictable__mutmut_1`` (``and``
    for ``or``: may_evict heeded only against a claim; in the run it timed out rather than failed)."""
    node = _node("n", 8, residents=(_old(),))
    may = Want(deployment="m", model_bytes=8, now=1e9)
    assert evictable(_old(), may) and choose([node], may)
    may_not = attrs.evolve(may, may_evict=False)
    assert not evictable(_old(), may_not)
    assert victims(node, may_not) is None and isinstance(choose([node], may_not), Refusal)


@pytest.mark.parametrize("kw", [{"leaving": True}, {"claim": True}])
def test_a_replica_leaving_or_a_claim_is_never_a_victim(kw: dict[str, bool]) -> None:
    """A replica being evicted already (``leaving``: no victim twice) and the room a newcomer
    claimed (``claim``: never a victim) are not evictable, each on its own. Kills
    ``evictable__mutmut_2`` (``and`` for ``or``: only one both leaving and a claim spared)."""
    want = Want(deployment="m", model_bytes=8, now=1e9)
    assert not evictable(_old(**kw), want)
    assert isinstance(choose([_node("n", 8, residents=(_old(**kw),))], want), Refusal)


# ------------------------------------------------------------------ make_room
@pytest.mark.parametrize("cache, entry", [
    ((CacheEntry(deployment="a", nbytes=4),), CacheEntry(deployment="big", nbytes=11)),  # over the whole budget
    ((CacheEntry(deployment="s", nbytes=8, replica_id="s#0", pinned=True),),  # a sleeper's 8 stay: 3 left
     CacheEntry(deployment="b", nbytes=5)),
])
def test_an_entry_that_cannot_go_warm_is_told_so_with_false(cache: tuple[CacheEntry, ...],
                                                            entry: CacheEntry) -> None:
    """``CacheOutcome.warm`` is a bool: False when the newcomer goes COLD (larger than the
    budget, or no room even after dropping every unpinned entry), the cache untouched. Kills
    ``make_room__mutmut_5`` and ``make_room__mutmut_54`` (None instead of False, on either
    path)."""
    node = _node("n", 100, cache=cache, budget=10)
    out = make_room(node, entry)
    assert out.warm is False
    assert out.cache == node.cache and out.dropped == ()


def _sizes(entries: tuple[CacheEntry, ...]) -> list[tuple[str, int]]:
    return [(e.deployment, e.nbytes) for e in entries]


@pytest.mark.parametrize("budget, dropped, kept", [
    # 16 in the cache, 10 more wanted, room for 6: dropping 2 and 3 is not enough, 10 is;
    # then 3 and 2 both come back (1 + 2 + 3 + 10 = 16: the budget exactly)
    (16, [("c", 10)], [("p", 1), ("a", 2), ("b", 3), ("new", 10)]),
    # one byte less: 3 comes back (1 + 3 + 10 = 14), then 2 no longer fits (16 > 15)
    (15, [("a", 2), ("c", 10)], [("p", 1), ("b", 3), ("new", 10)]),
])
def test_make_room_keeps_back_every_entry_that_need_not_go_largest_first(budget: int, dropped: list,
                                                                       kept: list) -> None:
    """``make_room``: unpinned entries are dropped smallest first until the newcomer fits, then
    those that need not go after all stay, largest first, up to the budget exactly and never
    over it: none is dropped that could have stayed. Kills ``make_room__mutmut_30`` (only the
    smallest dropped one tried for keeping back), ``make_room__mutmut_35`` (``<``: an entry that
    fits the budget exactly dropped), ``make_room__mutmut_37``, ``make_room__mutmut_38`` and
    ``make_room__mutmut_39`` (the bytes in use after keeping one back miscounted: set to it,
    lessened by it, or counted as its place in the cache, so the next one kept overfills the
    cache)."""
    cache = (CacheEntry(deployment="p", nbytes=1, replica_id="p#0", pinned=True), CacheEntry(deployment="a", nbytes=2),
             CacheEntry(deployment="b", nbytes=3), CacheEntry(deployment="c", nbytes=10))
    node = _node("n", 100, cache=cache, budget=budget)
    out = make_room(node, CacheEntry(deployment="new", nbytes=10))
    assert out.warm is True
    assert _sizes(out.dropped) == dropped and _sizes(out.cache) == kept
    held = sum(e.nbytes for e in out.cache)
    assert held <= budget
    assert all(held + e.nbytes > budget for e in out.dropped), "an entry dropped that could have stayed"


# ------------------------------------------------------------------ apply
def _wake_node(cache: tuple[CacheEntry, ...]) -> NodeTiers:
    return _node("n", 100, cache=cache, budget=100)


def test_a_sleeper_that_wakes_takes_its_own_weights_out_of_the_cache() -> None:
    """``apply``: the WARM copy a replica loads from leaves the cache; a sleeper's own (pinned)
    weights are its copy, before any other of its deployment. Kills ``apply__mutmut_9`` and
    ``apply__mutmut_21`` (its own copy never looked for: another copy of the model left instead),
    ``apply__mutmut_12`` (its own copy looked for among other deployments' entries),
    ``apply__mutmut_13`` (looked for among the other replicas' copies: its own stayed) and
    ``apply__mutmut_23`` (the second copy found taken: an IndexError with one)."""
    own = CacheEntry(deployment="a", nbytes=10, replica_id="a#0", pinned=True)
    evicted = CacheEntry(deployment="a", nbytes=10, replica_id="a#7")
    other = CacheEntry(deployment="b", nbytes=10, replica_id="b#0")
    for cache, left in [((own,), ()), ((evicted, own, other), (evicted, other))]:
        node = _wake_node(cache)
        want = Want(deployment="a", model_bytes=10, replica_id="a#0")
        got = choose([node], want)
        assert isinstance(got, TierPlacement) and (got.choice, got.source) == (Choice.WARM_FREE, Tier.WARM)
        (after,) = apply([node], got, want, "a#0")
        assert after.cache == left
        assert [r.replica_id for r in after.residents] == ["a#0"]


def test_a_new_replica_loads_from_an_evicted_copy_never_from_a_sleepers_weights() -> None:
    """``apply``: a replica with no copy of its own loads from the smallest unpinned copy of its
    model; a sleeper's pinned weights (another replica of the same deployment) stay in the cache.
    Kills ``apply__mutmut_11`` (``or`` for ``and``: any copy of the model, the sleeper's first,
    read as the replica's own) and ``apply__mutmut_13`` (another replica's copy read as its own)."""
    sleeper = CacheEntry(deployment="a", nbytes=10, replica_id="a#0", pinned=True)
    larger = CacheEntry(deployment="a", nbytes=12, replica_id="a#3")
    evicted = CacheEntry(deployment="a", nbytes=10, replica_id="a#5")
    node = _wake_node((sleeper, larger, evicted))
    want = Want(deployment="a", model_bytes=10)
    got = choose([node], want)
    assert isinstance(got, TierPlacement) and got.source is Tier.WARM
    (after,) = apply([node], got, want, "a#1")
    assert after.cache == (sleeper, larger)


def test_a_placement_whose_warm_copy_is_gone_still_places_the_replica() -> None:
    """``apply`` carries out a placement chosen earlier: when the node's cache no longer holds a
    copy of the model (dropped since), nothing leaves the cache and the replica is still HOT on
    the chosen devices. Kills ``apply__mutmut_25`` (the smallest copy taken even when there is
    none: an IndexError)."""
    copy = CacheEntry(deployment="a", nbytes=10, replica_id="a#3")
    kept = CacheEntry(deployment="b", nbytes=10, replica_id="b#0")
    want = Want(deployment="a", model_bytes=10)
    got = choose([_wake_node((copy, kept))], want)
    assert isinstance(got, TierPlacement) and got.source is Tier.WARM
    (after,) = apply([_wake_node((kept,))], got, want, "a#1")
    assert after.cache == (kept,)
    assert [(r.replica_id, r.devices) for r in after.residents] == [("a#1", got.devices)]


def test_an_evicted_replicas_weights_go_warm_under_its_replica_id() -> None:
    """``apply``: a victim's weights go into the node's cache (``make_room``) as a copy naming the
    replica whose weights they are (``CacheEntry.replica_id``: an evicted replica's). Kills
    ``apply__mutmut_56`` and ``apply__mutmut_59`` (the copy's replica id left None)."""
    node = _node("n", 10, budget=100, residents=(
        Resident(replica_id="b#4", deployment="b", devices=(0,), bytes_per_device=8),))
    want = Want(deployment="a", model_bytes=6, now=1e9)
    got = choose([node], want)
    assert isinstance(got, TierPlacement) and got.evict == ("b#4",)
    (after,) = apply([node], got, want, "a#0")
    assert after.cache == (CacheEntry(deployment="b", nbytes=8, replica_id="b#4"),)


def test_a_replica_placed_is_hot_since_want_now_and_spared_for_its_minimum_time() -> None:
    """``apply``: the replica is HOT since ``want.now``, so it is not evicted for another model
    before its minimum deployment time, and is once that has passed. Kills ``apply__mutmut_72``
    (``hot_since`` left at 0: a replica placed at t=10,000 evictable at once) and
    ``evictable__mutmut_14`` (``>`` for ``>=``: one HOT for exactly its minimum time spared)."""
    now = 10_000.0
    want = Want(deployment="a", model_bytes=8, now=now)
    node = _node("n", 10)
    got = choose([node], want)
    assert isinstance(got, TierPlacement)
    (after,) = apply([node], got, want, "a#0")
    (placed,) = after.residents
    assert placed.hot_since == now
    soon = Want(deployment="b", model_bytes=8, now=now + 60.0)
    assert not evictable(placed, soon)
    assert isinstance(choose([after], soon), Refusal)
    later = Want(deployment="b", model_bytes=8, now=now + want.min_deployment_time_s)
    assert evictable(placed, later)
    got_later = choose([after], later)
    assert isinstance(got_later, TierPlacement) and got_later.evict == ("a#0",)
