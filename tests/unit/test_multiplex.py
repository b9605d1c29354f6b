"""Multiplexing's two rules (rankcore/requests/multiplex.py, issue 39): which replica gets a request
for model m (``route_model``, through ``RequestMachine``), and which models a replica keeps
(``ModelCache``: LRU beyond ``max_num_models_per_replica``, loads one at a time)."""

from __future__ import annotations

import pytest

import rankcore as rc
from rankcore.requests import (
    MAX_NUM_MODELS_PER_REPLICA,
    Completed,
    Configure,
    Dispatch,
    Hit,
    Load,
    ModelCache,
    MultiplexOptions,
    PoolChanged,
    PoolReset,
    ReplicaModels,
    RequestMachine,
    Submit,
    route_model,
)


def machine(replicas: tuple[str, ...] = ("a", "b", "c"), max_ongoing: int = 2) -> RequestMachine:
    m = RequestMachine()
    m.handle(Configure(deployment="d", max_ongoing_requests=max_ongoing))
    m.handle(PoolReset(deployment="d", serving=replicas, draining=(), coming=False))
    return m


def send(m: RequestMachine, rid: str, model: str = "") -> str | None:
    out = m.handle(Submit(request_id=rid, deployment="d", model_id=model))
    return out[0].replica_id if out and isinstance(out[0], Dispatch) else None


# ---------------------------------------------------------------- routing


def test_a_request_goes_to_the_replica_that_holds_its_model_even_when_it_is_busier():
    m = machine()
    m.handle(ReplicaModels(deployment="d", replica_id="c", model_ids=("m1",)))
    assert send(m, "plain", "") == "a"  # (a model-less request: least loaded, round-robin)
    assert send(m, "r1", "m1") == "c"
    assert send(m, "r2", "m1") == "c"  # c holds 1 already, a and b none: the model wins


def test_a_cold_model_goes_to_the_replica_with_fewest_models_then_it_sticks():
    m = machine()
    m.handle(ReplicaModels(deployment="d", replica_id="a", model_ids=("x", "y")))
    m.handle(ReplicaModels(deployment="d", replica_id="b", model_ids=("z",)))
    assert send(m, "r1", "new") == "c"  # c holds no model
    assert m.pool("d")[2].models == ("new",)  # held from the dispatch on, before any report
    m.handle(Completed(request_id="r1", replica_id="c"))
    assert send(m, "r2", "new") == "c"
    # fewest models: b (z) and c (new) hold one each, a two; c's next to go (new) was asked for
    # twice, b's (z) never: b
    assert send(m, "r3", "other") == "b"


def test_a_model_whose_holders_are_all_busy_gets_another_copy_on_a_free_replica():
    m = machine(max_ongoing=1)
    m.handle(ReplicaModels(deployment="d", replica_id="a", model_ids=("hot",)))
    assert send(m, "r1", "hot") == "a"
    assert send(m, "r2", "hot") == "b"  # a is full: the hot model spreads at once
    assert "hot" in m.pool("d")[1].models
    assert send(m, "r3", "hot") == "c"
    assert send(m, "r4", "hot") is None  # nobody free: it waits
    m.handle(Completed(request_id="r2", replica_id="b"))  # b frees first: the head goes there
    assert m.status("r4").replica_id == "b"


def test_a_queued_request_waits_for_any_replica_and_keeps_fifo_order():
    m = machine(replicas=("a", "b"), max_ongoing=1)
    m.handle(ReplicaModels(deployment="d", replica_id="a", model_ids=("m1",)))
    m.handle(ReplicaModels(deployment="d", replica_id="b", model_ids=("m2",)))
    assert send(m, "r1", "m1") == "a"
    assert send(m, "r2", "m2") == "b"
    assert send(m, "q1", "m2") is None
    assert send(m, "q2", "m1") is None
    out = m.handle(Completed(request_id="r1", replica_id="a"))  # a frees: the head (q1, m2) goes there
    assert [(d.request_id, d.replica_id) for d in out] == [("q1", "a")]


def test_a_report_replaces_what_the_machine_believed_and_a_late_report_changes_nothing():
    m = machine()
    send(m, "r1", "m1")
    assert m.pool("d")[0].models == ("m1",)
    m.handle(ReplicaModels(deployment="d", replica_id="a", model_ids=("m9",)))  # it evicted m1
    assert m.pool("d")[0].models == ("m9",)
    m.handle(PoolChanged(deployment="d", replica_id="a", membership="gone"))
    assert m.handle(ReplicaModels(deployment="d", replica_id="a", model_ids=("m1",))) == []
    assert m.handle(ReplicaModels(deployment="nobody", replica_id="a", model_ids=())) == []
    assert [v.replica_id for v in m.pool("d")] == ["b", "c"]


def test_a_replica_that_dies_takes_its_models_with_it_and_their_traffic_moves():
    m = machine()
    m.handle(ReplicaModels(deployment="d", replica_id="b", model_ids=("m1",)))
    assert send(m, "r1", "m1") == "b"
    m.handle(PoolChanged(deployment="d", replica_id="b", membership="gone"))
    assert send(m, "r2", "m1") in ("a", "c")
    m.handle(PoolChanged(deployment="d", replica_id="b", membership="serving"))
    assert m.pool("d")[-1].models == ()  # back, holding nothing until it says so


def test_route_model_ranks_holders_then_fewest_models_then_the_least_asked_victim_then_load_then_round_robin():
    assert route_model([], -1) is None
    # (join, in_flight, models, holds, how often its least recently used model was asked for lately)
    assert route_model([(0, 0, 0, False, -1), (1, 4, 3, True, 9)], -1) == 1
    assert route_model([(0, 2, 1, True, 1), (1, 1, 2, True, 9)], -1) == 1
    assert route_model([(0, 0, 3, False, 1), (1, 3, 1, False, 9)], -1) == 1
    assert route_model([(0, 0, 3, False, 7), (1, 3, 3, False, 2)], -1) == 1  # evicts the less asked for
    assert route_model([(0, 1, 1, False, 5), (1, 1, 1, False, 5), (2, 1, 1, False, 5)], 0) == 1
    assert route_model([(0, 1, 1, False, 5), (1, 1, 1, False, 5), (2, 1, 1, False, 5)], 2) == 0


def test_a_cold_model_evicts_the_least_asked_for_of_the_models_the_replicas_would_drop_next():
    m = machine(replicas=("a", "b"), max_ongoing=4)
    for rid, model in (("q1", "x"), ("q2", "y"), ("q3", "x")):  # x on a, y on b, x asked for more
        send(m, rid, model)
    m.handle(ReplicaModels(deployment="d", replica_id="a", model_ids=("x",)))
    m.handle(ReplicaModels(deployment="d", replica_id="b", model_ids=("y",)))
    assert send(m, "q4", "z") == "b"  # both hold one: b's y was asked for less than a's x
    assert m.pool("d")[1].models == ("y", "z")
    send(m, "q5", "y")  # y is b's most recent now, z its least
    assert m.pool("d")[1].models == ("z", "y")
    m.handle(ReplicaModels(deployment="d", replica_id="b", model_ids=("y", "z")))  # (a report keeps that order)
    assert m.pool("d")[1].models == ("z", "y")


def test_bad_model_ids_are_refused_by_name():
    with pytest.raises(rc.InvalidConfig, match=r"Submit\.model_id must be a str"):
        Submit(request_id="r", deployment="d", model_id=3)  # type: ignore[arg-type]
    with pytest.raises(rc.InvalidConfig, match=r"ReplicaModels\.model_ids.s items must be a non-empty string"):
        ReplicaModels(deployment="d", replica_id="a", model_ids=("",))
    with pytest.raises(rc.InvalidConfig, match="names a model twice"):
        ReplicaModels(deployment="d", replica_id="a", model_ids=("m", "m"))
    with pytest.raises(rc.InvalidConfig, match=r"ModelCache\.use.s model_id"):
        ModelCache().use("")


# ---------------------------------------------------------------- the LRU cache


def load(cache: ModelCache, model: str) -> Hit | Load:
    assert cache.use(model) is None
    act = cache.begin(model)
    if isinstance(act, Load):
        cache.loaded(model)
    return act


def test_the_default_bound_is_serves_and_the_least_recently_used_model_goes_first():
    assert MultiplexOptions().max_num_models_per_replica == MAX_NUM_MODELS_PER_REPLICA == 3
    c = ModelCache()
    for m in ("a", "b", "c"):
        assert load(c, m) == Load(model_id=m, evict=())
    assert c.use("a") == Hit(model_id="a")  # a is now the most recent: b is the oldest
    assert load(c, "d") == Load(model_id="d", evict=("b",))
    assert c.loaded_ids() == ("c", "a", "d")
    assert (c.loads, c.hits, c.evictions) == (4, 1, 1)


def test_no_bound_keeps_every_model_and_bad_bounds_are_refused():
    c = ModelCache(MultiplexOptions(max_num_models_per_replica=-1))
    for i in range(50):
        load(c, f"m{i}")
    assert len(c.loaded_ids()) == 50
    for bad in (0, -2, 1.5, True):
        with pytest.raises(rc.InvalidConfig, match="max_num_models_per_replica must be an integer >= 1, or -1"):
            MultiplexOptions(max_num_models_per_replica=bad)


def test_a_missed_model_is_resident_while_it_waits_and_loads_and_a_second_miss_finds_it_loaded():
    c = ModelCache(MultiplexOptions(max_num_models_per_replica=1))
    load(c, "a")
    assert c.use("b") is None and c.use("b") is None  # two requests miss b
    assert c.resident() == ("a", "b")  # reported at once (Serve pushes loading ids too)
    act = c.begin("b")
    assert act == Load(model_id="b", evict=("a",)) and c.loading == "b"
    assert c.resident() == ("b",)
    with pytest.raises(rc.InvalidEvent, match="loads run one at a time"):
        c.begin("b")
    c.loaded("b")
    assert c.begin("b") == Hit(model_id="b")  # the second request: loaded meanwhile
    with pytest.raises(rc.InvalidEvent, match="no miss waits for it"):
        c.begin("b")
    assert c.resident() == ("b",)


def test_a_failed_load_leaves_nothing_and_the_next_waiter_tries_again():
    c = ModelCache()
    assert c.use("x") is None and c.use("x") is None
    assert isinstance(c.begin("x"), Load)
    c.failed("x")
    assert c.loaded_ids() == () and c.resident() == ("x",)  # one still waits
    assert isinstance(c.begin("x"), Load)
    c.loaded("x")
    assert c.resident() == ("x",) and c.failures == 1
    with pytest.raises(rc.InvalidEvent, match="is not loading"):
        c.loaded("x")


def test_a_request_that_gives_up_before_its_load_is_forgotten():
    c = ModelCache()
    assert c.use("x") is None
    c.gave_up("x")
    assert c.resident() == ()
    with pytest.raises(rc.InvalidEvent, match="no miss waits"):
        c.gave_up("x")


def test_how_often_a_model_is_asked_for_fades_so_the_choice_follows_what_is_popular_now(monkeypatch):
    from rankcore.requests import machine as machine_module

    monkeypatch.setattr(machine_module, "MODEL_ASKS_HALF_LIFE", 4)
    m = machine(replicas=("a", "b"), max_ongoing=16)
    m.handle(ReplicaModels(deployment="d", replica_id="a", model_ids=("x",)))
    m.handle(ReplicaModels(deployment="d", replica_id="b", model_ids=("y",)))
    for i in range(10):
        assert send(m, f"x{i}", "x") == "a"
    assert send(m, "y0", "y") == "b"
    assert send(m, "z0", "z") == "b"  # x was popular: y (b's next to go) is evicted
    m.handle(ReplicaModels(deployment="d", replica_id="b", model_ids=("y",)))  # (b dropped z again)
    for i in range(1, 9):
        send(m, f"y{i}", "y")  # now y is, and x's count has halved away (without fading: 20 asks to 18)
    assert send(m, "z1", "z") == "a"
