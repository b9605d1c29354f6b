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
    ReplicaLocated,
    RequestMachine,
    RouteRequest,
    RouterError,
    Submit,
    dataplane,
    make_router,
    register_router,
    serve_router,
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
    m = machine("prefix_affinity", n=3, ongoing=8, block_chars=8, imbalanced_threshold=2)
    system = "You are a helpful assistant. " * 4
    first = send(m, "p0", prefix=system + "q0")
    assert [send(m, f"p{i}", prefix=system + f"q{i}") for i in range(1, 3)] == [first, first]
    # three ahead of the idle others: past the threshold, power of two choices takes over
    assert send(m, "p3", prefix=system + "q3") != first


def test_prefix_affinity_s_stores_are_bounded_and_forget_a_replica_that_left():
    router = PrefixAffinity(block_chars=2, eviction_threshold_chars=10, eviction_target_chars=10)
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


def locate(m: RequestMachine, places: dict[str, tuple[str, str]]) -> None:
    for rid, (node, zone) in places.items():
        m.handle(ReplicaLocated(deployment="llm", replica_id=rid, node_id=node, zone=zone))


def test_locality_prefers_the_callers_node_then_its_zone_then_any():
    m = machine("locality", n=4, ongoing=2)
    locate(m, {"llm#0": ("a", "z1"), "llm#1": ("b", "z1"), "llm#2": ("c", "z2"), "llm#3": ("c", "z2")})
    assert {send(m, f"b{i}", caller_node="b", caller_zone="z1") for i in range(2)} == {"llm#1"}
    # llm#1 is full (2 of 2): the caller's zone next, llm#0 (the other z1 replica)
    assert send(m, "b2", caller_node="b", caller_zone="z1") == "llm#0"
    assert {send(m, f"c{i}", caller_node="c", caller_zone="z2") for i in range(4)} == {"llm#2", "llm#3"}
    # a caller on an unknown node in an unknown zone: any candidate (only llm#0 has room left)
    assert send(m, "x0", caller_node="d", caller_zone="z9") == "llm#0"
    assert send(m, "x1", caller_node="d", caller_zone="z9") is None  # (all full: queued, as without a router)
    assert m.status("x1").state == "queued"


def test_a_replica_located_outside_the_pool_changes_nothing_and_a_rejoin_keeps_no_stale_place():
    m = machine("locality", n=2)
    locate(m, {"llm#9": ("a", "z1")})  # (not in the pool: a late fact)
    assert "llm#9" not in m._deps["llm"].replicas
    locate(m, {"llm#1": ("a", "z1")})
    assert send(m, "r0", caller_node="a") == "llm#1"


def test_the_locality_router_draws_among_the_local_candidates():
    cands = tuple(Candidate(f"x{i}", 0, i, node_id="n0" if i < 3 else "n1") for i in range(6))
    router = make_router("locality")
    local = {router.choose(cands, RouteRequest(f"r{i}", caller_node="n0")) for i in range(60)}
    assert local <= {"x0", "x1", "x2"} and len(local) > 1  # (two drawn among n0's; ties: the earlier joined)
    assert len({router.choose(cands, RouteRequest(f"r{i}")) for i in range(60)}) > 3  # no caller node: all


def test_prefix_affinity_below_the_match_rate_goes_to_the_candidate_that_cached_least():
    router = make_router("prefix_affinity", {"block_chars": 4})
    router.dispatched("a", RouteRequest("r0", prefix="x" * 40))
    router.dispatched("b", RouteRequest("r1", prefix="y" * 8))
    cands = (Candidate("a", 0, 0), Candidate("b", 0, 1), Candidate("c", 0, 2))
    assert router.choose(cands, RouteRequest("r2", prefix="z" * 40)) == "c"  # (Serve's smallest tenant)
    assert router.choose(cands, RouteRequest("r3", prefix="x" * 40)) == "a"  # (the longest match)


def test_prefix_affinity_takes_ray_serves_keywords_and_evicts_down_to_the_target():
    router = PrefixAffinity(block_chars=2, imbalanced_threshold=5, eviction_threshold_chars=20,
                            eviction_target_chars=10, do_eviction=True, eviction_interval_secs=10)
    assert (router.imbalanced_threshold, router.max_blocks, router.keep_blocks) == (5.0, 10, 5)
    for i in range(11):  # 11 distinct one-block prefixes: past 10 blocks, down to 5
        router.dispatched("a", RouteRequest(f"r{i}", prefix=f"{i:02d}"))
    assert len(router.stores["a"]) == 5
    assert make_router("prefix_affinity").imbalanced_threshold == float("inf")  # (Serve's default)
    with pytest.raises(rc.InvalidConfig, match="eviction_target_chars must be an int from"):
        PrefixAffinity(eviction_threshold_chars=100, eviction_target_chars=200)


@pytest.mark.parametrize("cls, name", [
    ("ray.serve.llm.request_router:PrefixCacheAffinityRouter", "prefix_affinity"),
    ("ray.serve._private.request_router:PowerOfTwoChoicesRequestRouter", "power_of_two_choices"),
    ("locality", "locality"),
])
def test_serve_router_reads_serves_class_paths_as_the_routers_here(cls, name):
    assert serve_router(cls, {"imbalanced_threshold": 3}) == (name, {"imbalanced_threshold": 3})


def test_serve_router_refuses_a_class_it_does_not_have_naming_what_there_is():
    with pytest.raises(rc.InvalidConfig, match=r"'my\.Router' is no router here \(routers: consistent_hash, locality"):
        serve_router("my.Router")


def test_a_deployments_router_is_an_option_declared_once_that_configures_the_machine():
    applied = rc.DeploymentApplied(name="llm", num_replicas=2, request_router="prefix_affinity",
                                   request_router_kwargs={"block_chars": 4, "eviction_threshold_chars": 64})
    limits = applied.config.requests
    assert limits.request_router_kwargs == (("block_chars", 4), ("eviction_threshold_chars", 64))
    m = RequestMachine()
    m.handle(Configure(deployment="llm", request_router=limits.request_router,
                       request_router_kwargs=limits.request_router_kwargs))
    router = m._deps["llm"].router
    assert isinstance(router, PrefixAffinity) and (router.block_chars, router.max_blocks) == (4, 16)
    with pytest.raises(rc.InvalidConfig, match="request_router_kwargs must be a mapping of str to plain data"):
        rc.DeploymentApplied(name="llm", num_replicas=1, request_router_kwargs={"x": object()})


def test_a_routed_deployments_route_is_never_direct_the_balancer_runs_no_router():
    args = ("llm", "/llm", ["llm#0"], [], {"llm#0": "10.0.0.1:8000"}, 4, -1, None)
    assert dataplane.route(*args).direct
    routed = dataplane.route(*args, routed=True)
    assert not routed.direct and routed.shape() != dataplane.route(*args).shape()  # (a change is a reload)


def test_a_calls_prompt_is_read_as_serves_prefix_router_reads_it():
    from executors.ray_gpu.base.routers import prompt_text

    class Req:
        def __init__(self, **kw):
            self.__dict__.update(kw)

    assert prompt_text((Req(prompt="sys: hi"),), {}) == "sys: hi"
    chat = [{"role": "system", "content": "be brief"}, {"role": "user", "content": [{"type": "text", "text": "hi"}]}]
    assert prompt_text((Req(messages=chat),), {}) == "be briefhi"
    assert prompt_text(({"prompt": "from a JSON body"},), {}) == "from a JSON body"
    assert prompt_text((), {"messages": ["a", "b"]}) == "ab"
    assert prompt_text((1, "plain text"), {}) == ""  # (nothing named prompt or messages: no prefix)
