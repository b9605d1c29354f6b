"""Proxies per node on a real 3-node Ray cluster (issue 38): the core decides where they run
(``EveryNode``: the head and each node holding a replica), the controller runs them, restarts
one that is killed, and drains one whose node holds no replica any more."""

from __future__ import annotations

import http.client
import json
import threading
import time

import pytest
import ray

import rankcore as rc
from executors.ray_gpu import deployment, get_controller, get_replica_context, run
from executors.ray_gpu.api.deployments import get_deployment_handle
from executors.ray_gpu.ingress.http import MAX_HEADER_BYTES, expose, proxies, start_ingress
from tests.integration.conftest import multi_node_cluster


@pytest.fixture(scope="module")
def cluster():
    yield from multi_node_cluster(2, 1, end="reset")


@deployment(name="where", num_replicas=1, ray_actor_options={"num_cpus": 0.1, "num_gpus": 1})
class Where:
    def __call__(self):
        time.sleep(0.02)
        return {"replica": get_replica_context().replica_id, "node": ray.get_runtime_context().get_node_id()}


def _get(address, path, timeout=10.0, headers=None):
    conn = http.client.HTTPConnection(address[0], address[1], timeout=timeout)
    try:
        conn.request("GET", path, headers=headers or {})
        r = conn.getresponse()
        return r.status, r.read()
    finally:
        conn.close()


def _wait(cond, timeout=60.0, every=0.2):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        got = cond()
        if got:
            return got
        time.sleep(every)
    return None


def _by_node():
    return {p["node_id"]: (pid, p) for pid, p in proxies().items()}


def test_every_node_with_a_replica_and_the_head_run_a_proxy_each_serving_every_route(cluster):
    _c, workers = cluster
    head = ray.get_runtime_context().get_node_id()
    start_ingress(port=0, worker_port=0, proxy_options=rc.ProxyOptions(min_draining_period_s=1.0))
    expose(run(Where.bind()), "/where")
    node = ray.get(get_controller().replica_nodes.remote("where"))[0]
    assert node != head
    ready = _wait(lambda: (b := _by_node()) and node in b and b[node][1]["phase"] == "healthy"
                  and b[node][1]["address"] and b)
    assert ready, proxies()
    other = next(w.node_id for w in workers if w.node_id != node)
    assert set(ready) == {head, node} and other not in ready  # none where no replica runs (Serve's default)
    assert ready[head][1]["actor_name"] == "rankcore-http"
    for n in (head, node):  # each proxy serves every route, on its own address
        status, body = _get(tuple(ready[n][1]["address"]), "/where")
        assert status == 200 and json.loads(body)["node"] == node
    assert _get(tuple(ready[node][1]["address"]), "/-/healthz")[0] == 200


def test_a_killed_proxy_is_restarted_by_the_core_while_the_others_keep_serving(cluster):
    head = ray.get_runtime_context().get_node_id()
    before = _by_node()
    node = next(n for n in before if n != head)
    pid, victim = before[node]
    head_address = tuple(before[head][1]["address"])
    results = {"head_ok": 0, "head_failed": 0}
    stop = threading.Event()

    def load():
        while not stop.is_set():
            try:
                status, _ = _get(head_address, "/where", timeout=10)
                results["head_ok" if status == 200 else "head_failed"] += 1
            except Exception:
                results["head_failed"] += 1

    t = threading.Thread(target=load, daemon=True)
    t.start()
    time.sleep(0.5)
    killed = time.monotonic()
    ray.kill(ray.get_actor(victim["actor_name"], namespace="rankcore"), no_restart=True)
    with pytest.raises(OSError):  # its connections end with an error at the client, never a hang
        _get(tuple(victim["address"]), "/where", timeout=5)
    back = _wait(lambda: (b := _by_node()) and node in b and b[node][0] != pid
                 and b[node][1]["phase"] == "healthy" and b[node][1]["address"] and b[node])
    took = time.monotonic() - killed
    stop.set()
    t.join(15)
    assert back, proxies()
    assert results["head_failed"] == 0 and results["head_ok"] > 10, results
    status, _ = _get(tuple(back[1]["address"]), "/where")
    assert status == 200
    print(f"proxy {pid} killed: {back[0]} serving again after {took:.2f} s")
    assert took < 30


def test_limits_set_on_running_proxies_reach_another_node_and_its_next_proxy(cluster):
    """``start_ingress``'s limits on running proxies: the worker node's proxy applies them at once,
    and the one the core starts there after it is killed starts with them (the controller's
    ``ProxySettings`` carry them): a head above ``max_header_bytes`` is 431 on both (it was served by
    the next one, which started with the 16 KiB default)."""
    head = ray.get_runtime_context().get_node_id()
    fat = {"X-Fat": "v" * 3000}
    start_ingress(max_header_bytes=2048)
    try:
        before = _by_node()
        node = next(n for n in before if n != head)
        pid, victim = before[node]
        assert _get(tuple(victim["address"]), "/where", headers=fat)[0] == 431
        ray.kill(ray.get_actor(victim["actor_name"], namespace="rankcore"), no_restart=True)
        back = _wait(lambda: (b := _by_node()) and node in b and b[node][0] != pid
                     and b[node][1]["phase"] == "healthy" and b[node][1]["address"] and b[node])
        assert back, proxies()
        status, body = _get(tuple(back[1]["address"]), "/where", headers=fat)
        assert status == 431 and b"max_header_bytes=2048" in body, (status, body[:300])
        assert _get(tuple(back[1]["address"]), "/where")[0] == 200
    finally:
        start_ingress(max_header_bytes=MAX_HEADER_BYTES)


def test_a_restarted_controller_adopts_the_running_proxies(cluster):
    """The controller dies (Ray restarts it): its recovery asks each proxy actor who it is and the
    core takes them back (``ControllerRecovered.proxy_ids``): the same proxies serve on, none doubled."""
    before = _by_node()
    ctl = get_controller()
    ray.kill(ctl, no_restart=False)
    after = _wait(lambda: (b := _by_node()) and all(n in b and b[n][1]["phase"] == "healthy" and b[n][1]["address"]
                                                    for n in before) and b, timeout=60)
    assert after, proxies()
    assert {n: pid for n, (pid, _) in after.items()} == {n: pid for n, (pid, _) in before.items()}
    names = [a["name"] for a in ray.util.list_named_actors(all_namespaces=True) if a["name"].startswith("rankcore-http")]
    assert sorted(names) == sorted(p["actor_name"] for _, p in after.values())
    for _, p in after.values():
        assert _get(tuple(p["address"]), "/where")[0] == 200


def test_a_node_left_without_replicas_drains_its_proxy_then_stops_it(cluster):
    head = ray.get_runtime_context().get_node_id()
    node = next(n for n in _by_node() if n != head)
    _pid, p = _by_node()[node]
    address = tuple(p["address"])
    get_deployment_handle("where").scale(0)
    saw_503 = _wait(lambda: _get(address, "/-/healthz")[0] == 503, timeout=30, every=0.1)
    assert saw_503, "the draining proxy kept answering 200 on /-/healthz"
    gone = _wait(lambda: node not in _by_node(), timeout=30)
    assert gone, proxies()
    assert set(_by_node()) == {head}
    assert _wait(lambda: not [a for a in ray.util.list_named_actors(all_namespaces=True)
                              if a["name"] == p["actor_name"]], timeout=15)


def test_a_node_ray_drains_has_its_proxy_drained_then_stopped_while_its_replica_serves_on(cluster):
    """Ray's GCS drains a node (what its autoscaler does before a preemption or an idle
    termination; here ``drain_node`` with a deadline, as ``ray drain-node`` sends): the controller
    reads the GCS's drain list and tells the core (``NodeDraining``); the proxy there answers 503
    on ``/-/healthz`` and then stops, as Serve's does. The replica there is not moved by it."""
    from ray.core.generated import autoscaler_pb2

    head = ray.get_runtime_context().get_node_id()
    get_deployment_handle("where").scale(1)
    ready = _wait(lambda: (b := _by_node()) and len(b) == 2 and all(
        p["phase"] == "healthy" and p["address"] for _, p in b.values()) and b)
    assert ready, proxies()
    node = next(n for n in ready if n != head)
    address, name = tuple(ready[node][1]["address"]), ready[node][1]["actor_name"]
    assert _get(address, "/-/healthz")[0] == 200
    gcs = ray._private.worker.global_worker.gcs_client
    accepted, why = gcs.drain_node(node, autoscaler_pb2.DrainNodeReason.Value("DRAIN_NODE_REASON_PREEMPTION"),
                                   "rankcore test", int(time.time() * 1000) + 600_000)
    assert accepted, why
    saw_503 = _wait(lambda: _get(address, "/-/healthz")[0] == 503, timeout=30, every=0.1)
    assert saw_503, "the proxy on the node Ray drains kept answering 200 on /-/healthz"
    assert _wait(lambda: node not in _by_node(), timeout=30), proxies()
    assert set(_by_node()) == {head}
    assert _wait(lambda: not [a for a in ray.util.list_named_actors(all_namespaces=True) if a["name"] == name],
                 timeout=15)
    assert ray.get(get_controller().replica_nodes.remote("where")) == [node]  # not moved by the drain
    status, body = _get(tuple(_by_node()[head][1]["address"]), "/where")
    assert status == 200 and json.loads(body)["node"] == node
