"""records.copier / maker / updater: the core's unvalidated copies and
constructors give exactly what attrs.evolve and the constructors give."""

from __future__ import annotations

import attrs
import immutables
import pytest

import rankcore as rc
from rankcore.base.cluster import Cluster
from rankcore.base.lifecycle import Phase
from rankcore.base.records import copier, maker, updater
from rankcore.base.state import Deployment, Replica, State


def _dep() -> Deployment:
    rep = Replica(replica_id="llm#0", deployment="llm", phase=Phase.PENDING, lineage=0)
    return Deployment(name="llm", target=2, user_config={"a": 1}, replicas=immutables.Map({"llm#0": rep}))


def test_copier_is_evolve_without_validation() -> None:
    dep = _dep()
    assert copier(Deployment)(dep, target=5, config_version=2) == attrs.evolve(dep, target=5, config_version=2)
    assert copier(Deployment)(dep) == dep and copier(Deployment)(dep) is not dep
    with pytest.raises(TypeError):
        copier(Deployment)(dep, no_such_field=1)


def test_updater_changes_its_fields_and_copies_the_rest() -> None:
    dep = _dep()
    counts = (0, 1, 0, 0, 0)
    got = updater(Deployment, "target", "counts")(dep, 3, counts)
    assert got == attrs.evolve(dep, target=3, counts=counts)
    assert got.replicas is dep.replicas and got.ranks is dep.ranks  # shared, not copied
    cl = Cluster()
    assert updater(Cluster, "now", "clock")(cl, 12.5, True) == attrs.evolve(cl, now=12.5, clock=True)
    st = State()
    assert updater(State, "next_replica")(st, 7) == attrs.evolve(st, next_replica=7)
    assert updater(Cluster, "now", "clock") is updater(Cluster, "now", "clock")  # made once


def test_updater_names_a_field_the_record_lacks() -> None:
    with pytest.raises(TypeError, match=r"updater\(Cluster, now, colck\): no field colck"):
        updater(Cluster, "now", "colck")
    with pytest.raises(TypeError, match="a field twice"):
        updater(Cluster, "now", "now")


def test_maker_is_the_constructor_with_defaults_and_factories() -> None:
    made = maker(rc.StartReplica)(replica_id="llm#3", deployment="llm", global_rank=1, world_size=2)
    assert made == rc.StartReplica(replica_id="llm#3", deployment="llm", global_rank=1, world_size=2)
    assert maker(Deployment)(name="llm", target=2) == Deployment(name="llm", target=2)
    assert maker(Deployment)(name="a", target=1).replicas == immutables.Map()


def test_the_cores_records_come_out_real_frozen_and_weak_referenceable() -> None:
    """What a copy or a maker returns is an instance of the record's own class (no stand-in), frozen,
    equal to the constructor's, and, like any attrs record, takes a weak reference (issue 36: the
    records no longer give up their __weakref__ slot for a class switch)."""
    import weakref

    for cls in (State, Deployment, Replica, Cluster, rc.StartReplica, rc.ReplicaPlaced, rc.ReplicaRank):
        assert "__weakref__" in cls.__slots__, cls
    got = updater(Deployment, "target")(_dep(), 9)
    assert type(got) is Deployment and got.target == 9 and got == attrs.evolve(_dep(), target=9)
    assert weakref.ref(got)() is got
    with pytest.raises(attrs.exceptions.FrozenInstanceError):
        got.target = 1  # type: ignore[misc]
    made = maker(rc.StartReplica)(replica_id="llm#3", deployment="llm", global_rank=1, world_size=2)
    assert type(made) is rc.StartReplica and weakref.ref(made)() is made
    with pytest.raises(attrs.exceptions.FrozenInstanceError):
        made.global_rank = 0  # type: ignore[misc]


def test_a_record_declared_outside_the_core_is_copied_the_same_way() -> None:
    """Any slotted frozen attrs class, with or without a __weakref__ slot: the same result as attrs."""

    @attrs.frozen(kw_only=True)
    class Weak:
        a: int
        b: str = "x"

    @attrs.frozen(kw_only=True, weakref_slot=False)
    class NoWeak:
        a: int
        b: str = "x"

    for cls in (Weak, NoWeak):
        w = maker(cls)(a=1)
        assert type(w) is cls and w == cls(a=1) and updater(cls, "b")(w, "y") == cls(a=1, b="y")
        assert copier(cls)(w, a=2) == cls(a=2)


def test_a_class_whose_copy_would_not_be_valid_is_refused_when_generated() -> None:
    """A converter (skipped by a copy), __attrs_post_init__ (never run) or a
    cached hash (carried over stale): TypeError naming the class, at once."""
    from rankcore.base.records import unchecked_copy

    @attrs.frozen(kw_only=True)
    class Conv:
        a: int = attrs.field(converter=int)

    @attrs.frozen(kw_only=True)
    class Post:
        a: int

        def __attrs_post_init__(self) -> None:
            pass

    @attrs.frozen(kw_only=True, cache_hash=True)
    class Cached:
        a: int

    for cls, words in ((Conv, "has a converter"), (Post, "__attrs_post_init__"), (Cached, "caches its hash")):
        for make in (maker, copier, lambda c: updater(c, "a")):
            with pytest.raises(TypeError, match=words):
                make(cls)
    with pytest.raises(TypeError, match="caches its hash"):
        unchecked_copy(Cached(a=1), a=2)
