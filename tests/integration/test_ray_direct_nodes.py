"""The direct data plane on a real 3-node Ray cluster (issue 65): each node's proxy runs its own
HAProxy, which holds the same core table and sends a route's requests straight to its replicas on
every node, over HTTP and gRPC. A proxy's own answers carry uvicorn's ``server`` header, a replica's
none; a gRPC call the proxy answered is in its ``grpc_codes()``."""

from __future__ import annotations

import json
import socket

import grpc
import httpx
import pytest
import ray

import rankcore as rc
from executors.ray_gpu import deployment, get_replica_context, run
from executors.ray_gpu.control.controller import NAMESPACE
from executors.ray_gpu.ingress.http import proxies, start_ingress
from tests.integration.conftest import multi_node_cluster
from tests.integration.protos import echo_pb2, echo_pb2_grpc
from tests.integration.waiting import wait_for

SERVICERS = ["tests.integration.protos.echo_pb2_grpc.add_EchoServicer_to_server"]


@pytest.fixture(scope="module")
def cluster():
    """The head in zone ``a``, both workers in zone ``b``; the head and the first worker have a
    ``zoned`` slot each (where ``Zoned``'s two replicas must run)."""
    yield from multi_node_cluster(2, 1, end="reset", zones=("a", "b", "b"), resources=({"zoned": 1}, {"zoned": 1}))


@deployment(name="spread", num_replicas=2, ray_actor_options={"num_cpus": 0.1, "num_gpus": 1})
class Spread:
    def __call__(self, x=None):
        return {"node": ray.get_runtime_context().get_node_id(), "replica": get_replica_context().replica_id}

    def Say(self, request):
        return echo_pb2.EchoReply(text=ray.get_runtime_context().get_node_id(),
                                  replica=get_replica_context().replica_id)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _direct_everywhere():
    """Every running proxy's data plane holds ``spread``'s route direct with two ready servers, each with
    a gRPC address: ``{node: (proxy record, its actor)}``, else None."""
    out = {}
    for p in proxies().values():
        if p["phase"] != "healthy" or not p["address"]:
            return None
        actor = ray.get_actor(p["actor_name"], namespace=NAMESPACE)
        info = ray.get(actor.data_plane.remote())
        route = next((r for r in info.get("routes", []) if r["deployment"] == "spread"), None)
        if route is None or not route["direct"] or len([s for s in route["servers"] if s[2] and s[4]]) != 2:
            return None
        out[p["node_id"]] = (p, actor)
    return out


@pytest.fixture(scope="module")
def spread(cluster):
    """The direct data plane on every node (each worker's proxy on a free port of its own), ``Spread``
    at ``/spread`` on both workers, every proxy's HAProxy holding it direct: ``_direct_everywhere()``."""
    start_ingress(port=0, worker_port=0, grpc_port=_free_port(), grpc_servicer_functions=SERVICERS,
                  data_plane="direct", proxy_options=rc.ProxyOptions(min_draining_period_s=1.0))
    run(Spread.bind(), route_prefix="/spread")
    # (the head's proxy and both replicas' nodes')
    assert wait_for(lambda: len(_direct_everywhere() or ()) == 3, 90, 0.2), proxies()
    ready = _direct_everywhere()
    assert ready is not None
    return ready


def test_each_node_s_haproxy_sends_straight_to_replicas_on_every_node(cluster, spread):
    _c, workers = cluster
    assert wait_for(lambda: len(_direct_everywhere() or ()) == 3, 90, 0.2), proxies()
    ready = _direct_everywhere()
    assert ready is not None
    replica_nodes = {w.node_id for w in workers}
    for node, (p, actor) in ready.items():
        seen = set()
        with httpx.Client(base_url=f"http://{p['address'][0]}:{p['address'][1]}", timeout=30) as c:
            for _ in range(12):
                r = c.post("/spread", json=1)
                assert r.status_code == 200 and r.headers.get("server") != "uvicorn", (node, r.text)
                seen.add(json.loads(r.content)["node"])
            assert c.get("/-/healthz").headers.get("server") == "uvicorn"  # (the check tells the two apart)
        assert seen == replica_nodes, (node, seen)  # (every node's replica, whichever node's proxy)
        host, port = ray.get(actor.grpc_address.remote())
        before = ray.get(actor.grpc_codes.remote())
        with grpc.insecure_channel(f"{host}:{port}") as ch:
            stub = echo_pb2_grpc.EchoStub(ch)
            nodes = {stub.Say(echo_pb2.EchoRequest(text="x"), timeout=30).text for _ in range(12)}
        assert nodes == replica_nodes and ray.get(actor.grpc_codes.remote()) == before, node


def test_a_worker_node_s_killed_proxy_leaves_its_haproxy_serving_and_its_successor_keeps_the_port(cluster, spread):
    """A worker node's proxy (its port any free one: ``worker_port=0``) killed: its HAProxy serves on,
    and the proxy the core starts there adopts it by the node's key, so it keeps the address."""
    _c, workers = cluster
    assert wait_for(lambda: len(_direct_everywhere() or ()) == 3, 90, 0.2), proxies()
    node = workers[0].node_id
    p, actor = _direct_everywhere()[node]
    address = tuple(p["address"])
    pid = ray.get(actor.data_plane.remote())["haproxy_pid"]
    ray.kill(actor, no_restart=True)
    with httpx.Client(base_url=f"http://{address[0]}:{address[1]}", timeout=30) as c:
        for _ in range(6):  # (no proxy on that node now: its HAProxy answers, straight from the replicas)
            r = c.post("/spread", json=1)
            assert r.status_code == 200 and r.headers.get("server") != "uvicorn", r.text

    def serving() -> tuple[dict, int | None] | None:  # (the node's proxy record and its own HAProxy's pid)
        ready = (_direct_everywhere() or {}).get(node)
        return None if ready is None else (ready[0], ray.get(ready[1].data_plane.remote())["haproxy_pid"])

    assert wait_for(lambda: (now := serving()) is not None and now[1] not in (None, pid), 90, 0.2), proxies()
    now = serving()
    assert now is not None and tuple(now[0]["address"]) == address


@deployment(name="near", num_replicas=3, ray_actor_options={"num_cpus": 0.1}, request_router="locality")
class Near:
    def __call__(self):
        return {"replica": get_replica_context().replica_id, "node": ray.get_runtime_context().get_node_id()}


@ray.remote(num_cpus=0.1)
class Caller:
    """A caller on one node: its handle's router runs here (its node is the calls' ``caller_node``)."""

    def call(self, handle, n: int) -> list:
        return [handle.remote().result(timeout=30) for _ in range(n)]


def test_the_locality_router_sends_a_caller_on_node_b_to_node_b_s_replica(cluster):
    """Issue 68: ``request_router="locality"``: each call goes to a replica on the caller's node while one
    there can take it (Serve's LocalityMixin: node, then zone, then any); without it the calls spread."""
    from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

    from executors.ray_gpu import delete

    _c, workers = cluster
    try:
        h = run(Near.bind())
        where = {r["node_id"] for r in h.status()["replicas"].values()}
        head = ray.get_runtime_context().get_node_id()
        if head in where:  # (the driver is a caller on the head)
            assert {r["node"] for r in (h.remote().result(timeout=30) for _ in range(6))} == {head}
        for w in workers:
            if w.node_id not in where:
                continue
            caller = Caller.options(scheduling_strategy=NodeAffinitySchedulingStrategy(w.node_id, soft=False)).remote()
            got = ray.get(caller.call.remote(h, 8), timeout=60)
            assert {r["node"] for r in got} == {w.node_id}, (w.node_id, got)
            ray.kill(caller)
        assert any(w.node_id in where for w in workers), where
        plain = run(Near.options(request_router="").bind())  # (the machine's own rule: least in flight, round-robin)
        caller = Caller.options(scheduling_strategy=NodeAffinitySchedulingStrategy(workers[0].node_id,
                                                                                   soft=False)).remote()
        assert len({r["node"] for r in ray.get(caller.call.remote(plain, 8), timeout=60)}) > 1
        ray.kill(caller)
    finally:
        delete("near")


@deployment(name="zoned", num_replicas=2, ray_actor_options={"num_cpus": 0.1, "resources": {"zoned": 1}},
            request_router="locality")
class Zoned:
    def __call__(self):
        return {"replica": get_replica_context().replica_id, "node": ray.get_runtime_context().get_node_id()}


def test_the_locality_router_sends_a_caller_whose_node_has_no_replica_to_its_zone_s(cluster):
    """Issue 68, the zone step (Serve's LocalityMixin: node, then zone, then any): a caller on the second
    worker (zone ``b``, no replica there) reaches the first worker's replica (zone ``b``), never the head's
    (zone ``a``); without the router its calls go to both. The zones are Ray's own node labels
    (``ray.io/availability-zone``), which the controller reads and tells the handle's router."""
    from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

    from executors.ray_gpu import delete

    _c, (first, second) = cluster
    head = ray.get_runtime_context().get_node_id()
    zone_of = {n["NodeID"]: n.get("Labels", {}).get(rc.requests.ZONE_LABEL) for n in ray.nodes() if n["Alive"]}
    assert (zone_of[head], zone_of[first.node_id], zone_of[second.node_id]) == ("a", "b", "b"), zone_of
    try:
        h = run(Zoned.bind())
        assert {r["node_id"] for r in h.status()["replicas"].values()} == {head, first.node_id}
        caller = Caller.options(scheduling_strategy=NodeAffinitySchedulingStrategy(second.node_id, soft=False)).remote()
        got = ray.get(caller.call.remote(h, 8), timeout=60)
        assert {r["node"] for r in got} == {first.node_id}, got
        plain = run(Zoned.options(request_router="").bind())  # (the machine's own rule: least in flight, round-robin)
        assert {r["node"] for r in ray.get(caller.call.remote(plain, 8), timeout=60)} == {head, first.node_id}
        ray.kill(caller)
    finally:
        delete("zoned")
