"""Routers (issue 68, rankcore/requests/routing.py): a deployment's pure policy the request machine
asks on each dispatch; it picks among the machine's candidates only."""

from __future__ import annotations

import pytest

import rankcore as rc
from rankcore.requests import (
    ROUTERS,
    Candidate,
    Completed,
    Configure,
    Dispatch,
    PrefixAffinity,
    RequestMachine,
    RouteRequest,
    RouterError,
    Submit,
    make_router,
    register_router,
)


def machine(router: str = "", n: int = 4, ongoing: int = 4, **kwargs: object) -> RequestMachine:
    m = RequestMachine()
    m.handle(Configure(deployment="llm", max_ongoing_requests=ongoing, request_router=router,
                       request_router_kwargs=kwargs))
    m.handle(rc.PoolReset(deployment="llm", serving=[f"llm#{i}" for i in range(n)], draining=[], coming=False))
    return m


def send(m: RequestMachine, rid: str, **fields: object) -> str | None:
    out = m.handle(Submit(request_id=rid, deployment="llm", **fields))
    sent = [a.replica_id for a in out if isinstance(a, Dispatch)]
    return sent[0] if sent else None


def test_the_default_rule_is_unchanged_least_in_flight_round_robin():
    m = machine()
    assert [send(m, f"r{i}") for i in range(6)] == ["llm#0", "llm#1", "llm#2", "llm#3", "llm#0", "llm#1"]


def test_consistent_hash_keeps_a_key_on_its_replica_and_a_departure_moves_only_its_keys():
    m = machine("consistent_hash")
    homes = {}
    for k in "abcdefgh":
        homes[k] = send(m, f"{k}-1", routing_key=k)
        m.handle(Completed(request_id=f"{k}-1", ok=True))
    assert len(set(homes.values())) > 1  # (keys spread over the replicas)
    for k in "abcdefgh":  # the same key, the same replica
        assert send(m, f"{k}-2", routing_key=k) == homes[k]
        m.handle(Completed(request_id=f"{k}-2", ok=True))
    gone = homes["a"]
    m.handle(rc.PoolChanged(deployment="llm", replica_id=gone, membership="gone"))
    for k in "abcdefgh":
        now = send(m, f"{k}-3", routing_key=k)
        assert now != gone and (homes[k] == gone or now == homes[k]), (k, homes[k], now)
        m.handle(Completed(request_id=f"{k}-3", ok=True))


def test_power_of_two_choices_takes_the_less_loaded_of_its_two():
    router = make_router("power_of_two_choices")
    cands = (Candidate("a", 3, 0), Candidate("b", 0, 1))
    assert {router.choose(cands, RouteRequest(f"r{i}")) for i in range(20)} == {"b"}  # (two of two: the idle one)
    many = tuple(Candidate(f"x{i}", i, i) for i in range(8))
    picks = {router.choose(many, RouteRequest(f"r{i}")) for i in range(200)}
    assert "x7" not in picks and len(picks) > 3  # never the busiest of all; spread over several


def test_prefix_affinity_sends_a_shared_prefix_to_one_replica_until_the_imbalance():
    m = machine("prefix_affinity", n=3, ongoing=8, block_chars=8, imbalance_threshold=2)
    system = "You are a helpful assistant. " * 4
    first = send(m, "p0", prefix=system + "q0")
    assert [send(m, f"p{i}", prefix=system + f"q{i}") for i in range(1, 3)] == [first, first]
    # three ahead of the idle others: past the threshold, power of two choices takes over
    assert send(m, "p3", prefix=system + "q3") != first


def test_prefix_affinity_s_stores_are_bounded_and_forget_a_replica_that_left():
    router = PrefixAffinity(block_chars=2, max_blocks=5)
    for i in range(10):
        router.dispatched("a", RouteRequest(f"r{i}", prefix=f"{i:02d}" * 8))
    assert len(router.stores["a"]) == 5
    router.forget("a")
    assert "a" not in router.stores


def test_a_router_picking_no_candidate_is_refused_and_the_request_kept():
    class Rogue:
        def choose(self, candidates, request):
            return "llm#99"

        def dispatched(self, replica_id, request):
            pass

        def forget(self, replica_id):
            pass

    register_router("rogue-68", Rogue)
    try:
        m = machine("rogue-68", n=1, ongoing=1)
        with pytest.raises(RouterError, match=r"picked 'llm#99' for 'new', which is no candidate"):
            m.handle(Submit(request_id="new", deployment="llm"))
        assert m.status("new") is None and m.counters("llm").submitted == 0  # refused whole: never accepted
        m.handle(Configure(deployment="llm", max_ongoing_requests=1))
        send(m, "busy")
        m.handle(Configure(deployment="llm", max_ongoing_requests=1, request_router="rogue-68"))
        assert send(m, "waits") is None  # (queued: nothing free to route)
        # the answer stands (``busy`` is done); the dispatch it would have made is refused, ``waits`` kept
        with pytest.raises(RouterError, match=r"picked 'llm#99' for 'waits', which is no candidate"):
            m.handle(Completed(request_id="busy", ok=True))
        assert m.status("busy").state == "done" and m.status("waits").state == "queued"
        assert m.counters("llm").lost == 0
        m.handle(Configure(deployment="llm", max_ongoing_requests=1))  # back to the machine's rule: it goes out
        assert m.status("waits").state == "dispatched"
    finally:
        ROUTERS.pop("rogue-68")


def test_a_router_returning_none_leaves_the_choice_to_the_machine():
    class Shy:
        def __init__(self):
            self.seen = []

        def choose(self, candidates, request):
            return None

        def dispatched(self, replica_id, request):
            self.seen.append(replica_id)

        def forget(self, replica_id):
            pass

    register_router("shy-68", Shy)
    try:
        m = machine("shy-68", n=2)
        assert [send(m, f"r{i}") for i in range(3)] == ["llm#0", "llm#1", "llm#0"]
        assert m._deps["llm"].router.seen == ["llm#0", "llm#1", "llm#0"]
    finally:
        ROUTERS.pop("shy-68")


@pytest.mark.parametrize("name, kwargs, words", [
    ("nope", {}, "unknown request router 'nope'"),
    ("prefix_affinity", {"block": 3}, "unexpected keyword argument 'block'"),
    ("prefix_affinity", {"block_chars": 0}, "block_chars must be an int >= 1"),
    ("prefix_affinity", {"match_rate_threshold": 2}, "match_rate_threshold must be in"),
])
def test_a_bad_router_is_refused_when_configured_and_changes_nothing(name, kwargs, words):
    m = machine()
    send(m, "r0")
    with pytest.raises(rc.InvalidConfig, match=words):
        m.handle(Configure(deployment="llm", max_ongoing_requests=4, request_router=name,
                           request_router_kwargs=kwargs))
    assert send(m, "r1") == "llm#1"  # (still the machine's rule)


def test_register_router_refuses_a_taken_name_and_a_non_router():
    with pytest.raises(rc.InvalidConfig, match="exists already"):
        register_router("consistent_hash", object)
    register_router("not-a-router-68", object)
    try:
        with pytest.raises(rc.InvalidConfig, match="has no choose"):
            make_router("not-a-router-68")
    finally:
        ROUTERS.pop("not-a-router-68")


def test_configure_refuses_kwargs_that_are_no_mapping():
    with pytest.raises(rc.InvalidConfig, match="request_router_kwargs must be a mapping"):
        Configure(deployment="llm", request_router="consistent_hash", request_router_kwargs=[1])
