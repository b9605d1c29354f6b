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


def test_the_cores_records_are_filled_through_a_twin_and_stay_frozen() -> None:
    """The hot records have a same-layout twin (no __weakref__ slot), so their
    copies are plain attribute stores; what comes out is a real, frozen record."""
    from rankcore.base.records import _twin

    for cls in (State, Deployment, Replica, Cluster, rc.StartReplica, rc.ReplicaPlaced, rc.ReplicaRank):
        assert _twin(cls) is not None, cls
    got = updater(Deployment, "target")(_dep(), 9)
    assert type(got) is Deployment and got.target == 9
    with pytest.raises(attrs.exceptions.FrozenInstanceError):
        got.target = 1  # type: ignore[misc]


def test_a_record_with_a_weakref_slot_is_copied_through_its_setters() -> None:
    """CPython refuses the twin's class switch for a class with __weakref__:
    those records are written slot by slot instead, with the same result."""
    from rankcore.base.records import _twin

    @attrs.frozen(kw_only=True)
    class Weak:
        a: int
        b: str = "x"

    assert "__weakref__" in Weak.__slots__ and _twin(Weak) is None
    w = maker(Weak)(a=1)
    assert w == Weak(a=1) and updater(Weak, "b")(w, "y") == Weak(a=1, b="y")
    assert copier(Weak)(w, a=2) == Weak(a=2)


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
