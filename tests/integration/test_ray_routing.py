"""Routers on Ray (issue 68): a deployment's ``request_router_config`` (Ray Serve's keys) chooses the
core's router, which the handle's request machine asks on each dispatch: prefix affinity keeps a
shared prompt prefix on one replica until the load is imbalanced, consistent hashing keeps a
session key on its replica, power of two choices spreads, a user's own router class runs by its
import path, and a config file's ``request_router_config`` reaches the same option. (Locality, a
caller on node B reaching node B's replica, runs on the shared cluster of test_ray_proxies.py.)"""

from __future__ import annotations

import collections
import time
from collections.abc import Sequence

import pytest

import rankcore as rc
from executors.ray_gpu import delete, deployment, get_replica_context, run
from rankcore.requests import Candidate, RouteRequest

pytestmark = pytest.mark.usefixtures("local_ray")

OPTS = {"num_cpus": 0.05}
PREFIX = "ray.serve.llm.request_router:PrefixCacheAffinityRouter"
SYSTEM = "You are a careful assistant who answers in one line. " * 3


class Prompt:
    """A request object as Serve's LLM router reads it: an attribute ``prompt``."""

    def __init__(self, prompt: str) -> None:
        self.prompt = prompt


@deployment(name="routed", num_replicas=3, max_ongoing_requests=8, ray_actor_options=OPTS)
class Routed:
    def __call__(self, request: object = None, pause: float = 0.0) -> str:
        time.sleep(pause)
        return get_replica_context().replica_id


class FirstByName:
    """A user's router (rankcore.requests.Router): always the candidate whose id sorts last."""

    def __init__(self, last: bool = True) -> None:
        self.last = last
        self.sent: list[str] = []

    def choose(self, candidates: Sequence[Candidate], request: RouteRequest) -> str | None:
        ids = sorted(c.replica_id for c in candidates)
        return ids[-1] if self.last else ids[0]

    def dispatched(self, replica_id: str, request: RouteRequest) -> None:
        self.sent.append(replica_id)

    def forget(self, replica_id: str) -> None:
        pass


def _deployed(**options: object):
    return run(Routed.options(**options).bind())


def test_prefix_affinity_keeps_a_shared_prefix_on_one_replica_until_the_load_is_imbalanced():
    h = _deployed(request_router_config={"request_router_class": PREFIX,
                                         "request_router_kwargs": {"imbalanced_threshold": 2}})
    try:
        one_by_one = [h.remote(Prompt(SYSTEM + f"question {i}")).result(timeout=30) for i in range(6)]
        assert len(set(one_by_one)) == 1, one_by_one  # (loads even: the longest match, every time)
        other = [h.remote({"prompt": f"A different system prompt entirely, number {i}. " * 3}).result(timeout=30)
                 for i in range(3)]
        assert other[0] != one_by_one[0] and len(set(other)) == 1  # (the replica that cached least, then its match)
        # eight at once, each holding its replica 0.5 s: past 2 ahead of an idle one, power of two choices
        burst = [h.remote(Prompt(SYSTEM + f"burst {i}"), pause=0.5) for i in range(8)]
        spread = collections.Counter(r.result(timeout=30) for r in burst)
        assert len(spread) > 1 and spread[one_by_one[0]] >= 3, spread
    finally:
        delete("routed")


def test_consistent_hash_keeps_a_session_key_on_its_replica():
    h = _deployed(request_router="consistent_hash")
    try:
        homes = {k: {h.options(routing_key=k).remote().result(timeout=30) for _ in range(4)} for k in "abcdef"}
        assert all(len(v) == 1 for v in homes.values()), homes
        assert len({next(iter(v)) for v in homes.values()}) > 1, homes  # (keys spread over the replicas)
        with pytest.raises(rc.InvalidConfig, match=r"routing_key=\.\.\.\) of 'routed' must be a str"):
            h.options(routing_key=3)
    finally:
        delete("routed")


def test_serves_default_class_is_power_of_two_choices_and_spreads_concurrent_calls():
    h = _deployed(request_router_config={"request_router_class":
                                         "ray.serve._private.request_router:PowerOfTwoChoicesRequestRouter",
                                         "request_routing_stats_period_s": 5})
    try:
        calls = [h.remote(pause=0.3) for _ in range(9)]
        assert len({c.result(timeout=30) for c in calls}) == 3
        assert h._router.limits[3] == "power_of_two_choices"
    finally:
        delete("routed")


def test_a_users_router_class_runs_by_its_import_path_and_a_serve_request_router_is_refused():
    h = _deployed(request_router_config={"request_router_class": FirstByName})
    try:
        got = {h.remote().result(timeout=30) for _ in range(5)}
        assert h._router.limits[3] == f"{__name__}:FirstByName"
        assert got == {max(h._router.actors)}  # (its rule: the id that sorts last, every time)
        assert h._router.machine._deps["routed"].router.sent == [max(h._router.actors)] * 5
    finally:
        delete("routed")
    class ServeStyle:  # (Serve's RequestRouter's shape: importing Serve's own needs all of ray[serve])
        async def choose_replicas(self, candidate_replicas, pending_request=None):
            return [candidate_replicas]

    with pytest.raises(rc.InvalidConfig, match=r"is a Ray Serve RequestRouter .* docs/routing\.md maps each"):
        Routed.options(request_router_config={"request_router_class": ServeStyle})
    with pytest.raises(rc.InvalidConfig, match="cannot import router class 'no_such_module:R'"):
        Routed.options(request_router_config={"request_router_class": "no_such_module:R"})
    with pytest.raises(rc.InvalidConfig, match="request_router_config has no key\\(s\\) request_router_typo"):
        Routed.options(request_router_config={"request_router_typo": 1})
    with pytest.raises(rc.InvalidConfig, match="unexpected keyword argument 'imbalance'"):
        deployment(Routed.cls, name="x", request_router_config={"request_router_class": PREFIX,
                                                               "request_router_kwargs": {"imbalance": 1}})


def test_a_config_files_request_router_config_is_the_same_option(tmp_path):
    from executors.ray_gpu.api.config import load as load_config

    path = tmp_path / "serve.yaml"
    path.write_text(
        "applications:\n- name: routed\n  import_path: tests.integration.test_ray_routing:APP\n"
        "  deployments:\n  - name: routed\n    request_router_config:\n"
        f"      request_router_class: {PREFIX}\n      request_router_kwargs: {{imbalanced_threshold: 4}}\n")
    config = load_config(path)
    entry = config.applications[0].deployments[0]
    changed = Routed.options(**entry.to_options())
    assert changed.core_options["request_router"] == "prefix_affinity"
    assert changed.core_options["request_router_kwargs"] == {"imbalanced_threshold": 4}


APP = Routed.bind()


def test_the_routing_example_runs():
    """examples/ray/routing.py (quoted in docs/routing.md)."""
    from examples.ray import routing

    got = routing.main()
    assert len(got["shared"]) == 1 and sum(got["shared"].values()) == 6  # (one replica: the prefix's)
    assert all(len(replicas) == 1 for replicas in got["sessions"].values())


def test_an_http_request_s_json_prompt_is_its_prefix_through_the_proxy():
    """Through the HTTP ingress (its process's router): a JSON body's ``prompt`` is what the prefix
    router reads, as Serve's reads the request object's."""
    import httpx

    from executors.ray_gpu.ingress.http import ingress_address

    run(Routed.options(request_router="prefix_affinity").bind(), route_prefix="/routed", port=0)
    try:
        host, port = ingress_address()
        with httpx.Client(base_url=f"http://{host}:{port}", timeout=30.0) as c:
            got = [c.post("/routed", json={"prompt": SYSTEM + f"q{i}"}) for i in range(5)]
        assert all(r.status_code == 200 for r in got), [r.text for r in got]
        assert len({r.json() for r in got}) == 1, [r.text for r in got]
    finally:
        delete("routed")


def test_an_http_request_s_x_routing_key_header_is_its_session_key_through_the_proxy():
    """Through the HTTP ingress, the ``x-routing-key`` header is the call's ``routing_key`` (the
    handle's option): ``consistent_hash`` keeps each key on one replica and spreads the keys (the gRPC
    metadata key of the same name: test_ray_grpc.py)."""
    import httpx

    from executors.ray_gpu.ingress.http import ingress_address

    run(Routed.options(request_router="consistent_hash").bind(), route_prefix="/routed", port=0)
    try:
        host, port = ingress_address()
        with httpx.Client(base_url=f"http://{host}:{port}", timeout=30.0) as c:
            def replica(**headers: str) -> str:
                r = c.post("/routed", headers=headers)
                assert r.status_code == 200, r.text
                return r.json()

            homes = {k: {replica(**{"x-routing-key": k}) for _ in range(4)} for k in "abcdef"}
            assert all(len(v) == 1 for v in homes.values()), homes
            assert len({next(iter(v)) for v in homes.values()}) > 1, homes
            assert len({replica() for _ in range(12)}) > 1  # (no key: each call hashed on its own id)
    finally:
        delete("routed")
