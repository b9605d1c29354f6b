"""Metrics and access logs on Ray (issue 37): a known load over HTTP, then ``/metrics`` scraped
and parsed with prometheus_client's own parser: every count must match the load exactly; the
controller's counts follow what the core decided (reconfigures after a user_config change, rank
reassignments after a downscale that compacts); one access record per request, with its
``X-Request-Id`` echoed, and none while they are turned off. The request id reaches the
replica's user code (``_get_serve_request_context()``): the HTTP request's, a handle call's own,
each concurrent call its own; the replicas' own metrics (Serve's replica counters, processing
latency, calls in flight) are in the same scrape, HTTP and handle calls alike. One Ray start for
the module."""

from __future__ import annotations

import asyncio
import json
import pathlib
import re
import time
from concurrent.futures import ThreadPoolExecutor

import httpx
import pytest
import ray
from prometheus_client.parser import text_string_to_metric_families

from executors.ray_gpu import deployment, get_deployment_handle, http_method, run
from executors.ray_gpu.base.context import _get_serve_request_context
from executors.ray_gpu.control.controller import NAMESPACE
from executors.ray_gpu.ingress.http import INGRESS_NAME, ingress_address, set_access_log

pytestmark = pytest.mark.usefixtures("local_ray")

OK, FAILS, MISSES = 20, 3, 2


@deployment(name="metered", num_replicas=2, user_config={"v": 1}, ray_actor_options={"num_cpus": 0.05})
class Metered:
    def reconfigure(self, user_config):
        self.v = user_config["v"]

    def __call__(self, x=0):
        return x

    @http_method
    def fail(self):
        raise ValueError("metered says no")

    @http_method
    def rid(self):
        return _get_serve_request_context().request_id

    @http_method
    def rid_twice(self, pause=0.3):
        """The id before and after a pause in which other calls run in other threads of this replica."""
        first = _get_serve_request_context().request_id
        time.sleep(pause)
        return [first, _get_serve_request_context().request_id]

    @http_method
    async def rid_twice_async(self, pause=0.3):
        first = _get_serve_request_context().request_id
        await asyncio.sleep(pause)
        return [first, _get_serve_request_context().request_id]

    @http_method
    def relay(self):
        """A handle call made inside a request carries its id on (Serve's handle does)."""
        return get_deployment_handle("metered").rid.remote().result(timeout=30)

    def hold(self, path):
        """Answer once ``path`` exists (the test's event): a call held in flight."""
        while not pathlib.Path(path).exists():
            time.sleep(0.02)
        return "released"


@pytest.fixture(scope="module")
def app():
    handle = run(Metered.bind(), route_prefix="/m", port=0)
    host, port = ingress_address()
    with httpx.Client(base_url=f"http://{host}:{port}", timeout=30.0) as client:
        yield handle, client


def scrape(client) -> dict[tuple[str, tuple], float]:
    """``/metrics`` as {(sample name, sorted labels): value}."""
    r = client.get("/metrics")
    assert r.status_code == 200 and r.headers["content-type"].startswith("text/plain")
    return {(s.name, tuple(sorted(s.labels.items()))): s.value
            for fam in text_string_to_metric_families(r.text) for s in fam.samples}


def total(samples: dict, name: str, **labels) -> float:
    """The sum of ``name``'s samples whose labels include ``labels``."""
    return sum(v for (n, ls), v in samples.items() if n == name and labels.items() <= dict(ls).items())


def records() -> list[dict]:
    return ray.get(ray.get_actor(INGRESS_NAME, namespace=NAMESPACE).access_records.remote())["records"]


def wait_records(n: int, timeout: float = 10.0) -> list[dict]:
    """The records once there are ``n`` (each is written as its answer ends, just after the client has it)."""
    deadline = time.monotonic() + timeout
    while len(got := records()) < n and time.monotonic() < deadline:
        time.sleep(0.05)
    return got


def test_known_load_counted_exactly_and_recorded_once_each(app):
    handle, client = app
    before = len(records())
    sent_ids, echoed = [], []
    for i in range(OK):
        headers = {"X-Request-Id": f"client-{i}"} if i % 2 == 0 else {}
        r = client.post("/m", json=i, headers=headers)
        assert r.status_code == 200 and r.json() == i
        echoed.append(r.headers["x-request-id"])
        if headers:
            sent_ids.append(headers["X-Request-Id"])
            assert r.headers["x-request-id"] == headers["X-Request-Id"]  # propagated and returned
        else:
            assert re.fullmatch(r"[0-9a-f]{32}", r.headers["x-request-id"])  # one made for it
    bad = client.post("/m", json=0, headers={"X-Request-Id": "has spaces <and> markup"})
    assert bad.status_code == 200 and re.fullmatch(r"[0-9a-f]{32}", bad.headers["x-request-id"])  # replaced
    for _ in range(FAILS):
        r = client.get("/m/fail")
        assert r.status_code == 500 and r.json()["error"] == "application_error"
    for path in ("/nowhere", "/elsewhere/too"):
        r = client.get(path)
        assert r.status_code == 404 and "x-request-id" in r.headers

    got = wait_records(before + OK + 1 + FAILS + MISSES)[before:]
    s = scrape(client)

    # --- the metrics: Serve's names and labels, counts exact
    reqs = "ray_serve_num_http_requests_total"
    assert total(s, reqs, route="/m", method="POST", application="metered", status_code="200") == OK + 1
    assert total(s, reqs, route="/m", method="GET", status_code="500") == FAILS
    assert total(s, reqs, route="", application="", status_code="404") == MISSES
    assert total(s, "ray_serve_num_http_error_requests_total", route="/m", error_code="500") == FAILS
    assert total(s, "ray_serve_num_http_error_requests_total", route="", error_code="404") == MISSES
    assert total(s, "ray_serve_num_http_error_requests_total", error_code="200") == 0
    assert total(s, "ray_serve_num_deployment_http_error_requests_total", deployment="metered") == FAILS
    assert total(s, "ray_serve_http_request_latency_ms_count", route="/m", status_code="200") == OK + 1
    assert total(s, "ray_serve_http_request_latency_ms_count", status_code="500") == FAILS
    assert total(s, "ray_serve_http_request_latency_ms_bucket", status_code="200", le="+Inf") == OK + 1
    assert total(s, "ray_serve_http_request_latency_ms_sum", status_code="200") > 0
    assert total(s, "ray_serve_num_ongoing_http_requests") == 0  # (the scrape is not one of them)
    replicas = set(handle.ranks())
    # the replicas' counters (Serve 2.60: answered calls in one, failed ones in the other only)
    served = {dict(ls)["replica"]: v for (n, ls), v in s.items() if n == "ray_serve_deployment_request_counter_total"}
    assert set(served) <= replicas and sum(served.values()) == OK + 1
    assert total(s, "ray_serve_deployment_request_counter_total", route="/m", application="metered") == OK + 1
    assert total(s, "ray_serve_deployment_error_counter_total", deployment="metered", route="/m",
                 exception_type="ValueError") == FAILS
    assert total(s, "ray_serve_deployment_processing_latency_ms_count", deployment="metered") == OK + 1 + FAILS
    assert total(s, "rankcore_replica_metrics_up", deployment="metered") == 2
    assert total(s, "ray_serve_deployment_queued_queries", deployment="metered") == 0
    # --- the controller's, through the same scrape
    assert total(s, "rankcore_controller_metrics_up") == 1
    healthy = {dict(ls)["replica"]: v for (n, ls), v in s.items() if n == "ray_serve_deployment_replica_healthy"}
    assert healthy == dict.fromkeys(replicas, 1.0)
    assert total(s, "ray_serve_autoscaling_target_replicas", deployment="metered") == 2
    assert total(s, "rankcore_deployment_replicas", deployment="metered", phase="running") == 2
    assert total(s, "rankcore_core_steps_total") > 0

    # --- one access record per request, in order, with what happened
    assert [r["status"] for r in got] == [200] * (OK + 1) + [500] * FAILS + [404] * MISSES
    assert [r["request_id"] for r in got[:OK]] == echoed
    assert set(sent_ids) <= {r["request_id"] for r in got}
    ranks = {rid: rk[0] for rid, rk in handle.ranks().items()}
    for r in got[:OK + 1 + FAILS]:
        assert r["deployment"] == "metered" and r["route"] == "/m" and r["replica"] in replicas
        assert r["rank"] == ranks[r["replica"]], r
        assert r["latency_ms"] > 0 and r["bytes"] > 0 and r["time"] > 0
    assert [r["method"] for r in got[OK + 1:]] == ["GET"] * (FAILS + MISSES)
    for r in got[-MISSES:]:
        assert r["deployment"] is None and r["replica"] is None and r["rank"] is None and r["route"] == ""
    assert got[0]["bytes"] == len(b"0")
    # ... and the same records in the JSON-lines file under Ray's session logs
    path = ray.get(ray.get_actor(INGRESS_NAME, namespace=NAMESPACE).access_records.remote(0))["path"]
    assert path.endswith("/rankcore/access.jsonl")
    with open(path) as f:
        in_file = [json.loads(line)["request_id"] for line in f]
    assert [r["request_id"] for r in got] == in_file[-len(got):]


def test_access_log_off_by_the_flag_metrics_still_counted(app):
    _, client = app
    before_records = len(records())
    before = total(scrape(client), "ray_serve_num_http_requests_total", route="/m", status_code="200")
    set_access_log(False)
    try:
        for i in range(3):
            r = client.post("/m", json=i, headers={"X-Request-Id": f"quiet-{i}"})
            assert r.status_code == 200 and r.headers["x-request-id"] == f"quiet-{i}"  # still returned
        time.sleep(0.3)
        assert len(records()) == before_records
        assert total(scrape(client), "ray_serve_num_http_requests_total", route="/m", status_code="200") == before + 3
    finally:
        set_access_log(True)
    client.post("/m", json=1, headers={"X-Request-Id": "loud-again"})
    assert wait_records(before_records + 1)[-1]["request_id"] == "loud-again"


def test_request_id_reaches_the_replica(app):
    handle, client = app
    r = client.get("/m/rid", headers={"X-Request-Id": "abc-123"})
    assert r.status_code == 200 and r.json() == "abc-123"
    r = client.get("/m/rid")  # none sent: the one the ingress made, the one it returns
    assert r.json() == r.headers["x-request-id"] and re.fullmatch(r"[0-9a-f]{32}", r.json())
    a, b = handle.rid.remote().result(timeout=30), handle.rid.remote().result(timeout=30)
    assert a and b and a != b  # a handle call from Python: a new id each (Serve's: a UUID4)
    assert re.fullmatch(r"[0-9a-f]{8}-[0-9a-f]{4}-4[0-9a-f]{3}-[0-9a-f]{4}-[0-9a-f]{12}", a)
    r = client.get("/m/relay", headers={"X-Request-Id": "relay-7"})
    assert r.status_code == 200 and r.json() == "relay-7"  # carried on by a handle call made inside it


@pytest.mark.parametrize("method", ["rid_twice", "rid_twice_async"])
def test_concurrent_calls_each_see_their_own_id(app, method):
    """8 calls at once on 2 replicas (5 slots each): calls share a replica and overlap there; each
    reads its own id before and after the others ran (a plain method in its thread, an async one in
    its task)."""
    handle, client = app
    ids = [f"conc-{method}-{i}" for i in range(8)]

    def send(rid):
        t0 = time.monotonic()
        r = client.post(f"/m/{method}", json=0.5, headers={"X-Request-Id": rid})
        return r.json(), t0, time.monotonic()

    with ThreadPoolExecutor(len(ids)) as pool:
        got = list(pool.map(send, ids))
    assert [g[0] for g in got] == [[rid, rid] for rid in ids]
    assert max(g[1] for g in got) < min(g[2] for g in got)  # (they all overlapped)
    via_handle = [getattr(handle, method).remote(0.3) for _ in range(6)]
    seen = [r.result(timeout=30) for r in via_handle]
    assert all(x == y for x, y in seen) and len({x for x, _ in seen}) == 6


def test_replica_metrics_count_http_and_handle_calls(app, tmp_path):
    """A known mix: the replicas count every call once, whichever way it came (route "/m" over
    HTTP, "" for a handle call made from Python); the latency histogram counts each; the in-flight
    gauge is 1 while a call is held, 0 after."""
    handle, client = app

    def replica_totals():
        s = scrape(client)
        return s, {k: total(s, k, deployment="metered") for k in (
            "ray_serve_deployment_request_counter_total", "ray_serve_deployment_error_counter_total",
            "ray_serve_deployment_processing_latency_ms_count")}

    s0, before = replica_totals()
    ingress_ok = total(s0, "ray_serve_num_http_requests_total", route="/m", status_code="200")
    http_ok, http_fail, handle_ok, handle_fail = 4, 1, 3, 2
    for i in range(http_ok):
        assert client.post("/m", json=i).status_code == 200
    for _ in range(http_fail):
        assert client.get("/m/fail").status_code == 500
    assert [handle.remote(i).result(timeout=30) for i in range(handle_ok)] == list(range(handle_ok))
    for _ in range(handle_fail):
        with pytest.raises(ValueError, match="metered says no"):
            handle.fail.remote().result(timeout=30)
    s1, after = replica_totals()
    delta = {k: after[k] - before[k] for k in after}
    assert delta == {"ray_serve_deployment_request_counter_total": http_ok + handle_ok,
                     "ray_serve_deployment_error_counter_total": http_fail + handle_fail,
                     "ray_serve_deployment_processing_latency_ms_count": http_ok + http_fail + handle_ok + handle_fail}
    by_route = {r: total(s1, "ray_serve_deployment_request_counter_total", route=r)
                - total(s0, "ray_serve_deployment_request_counter_total", route=r) for r in ("/m", "")}
    assert by_route == {"/m": http_ok, "": handle_ok}
    assert total(s1, "ray_serve_deployment_error_counter_total", route="", exception_type="ValueError") \
        - total(s0, "ray_serve_deployment_error_counter_total", route="", exception_type="ValueError") == handle_fail
    # the ingress counts only what came over HTTP (no double counting of the replicas' counters)
    assert total(s1, "ray_serve_num_http_requests_total", route="/m", status_code="200") - ingress_ok == http_ok
    assert total(s1, "ray_serve_replica_processing_queries", deployment="metered") == 0

    release = tmp_path / "release"
    held = handle.hold.remote(str(release))
    deadline = time.monotonic() + 15
    while total(s := scrape(client), "ray_serve_replica_processing_queries", deployment="metered") != 1:
        assert time.monotonic() < deadline, "the held call never showed in flight"
        time.sleep(0.05)
    assert sorted(v for (n, ls), v in s.items() if n == "ray_serve_replica_processing_queries") == [0, 1]
    release.touch()
    assert held.result(timeout=30) == "released"
    s2 = scrape(client)
    assert total(s2, "ray_serve_replica_processing_queries", deployment="metered") == 0
    assert total(s2, "ray_serve_deployment_processing_latency_ms_count", deployment="metered") \
        == after["ray_serve_deployment_processing_latency_ms_count"] + 1
    assert total(s2, "rankcore_replica_metrics_up", deployment="metered") == 2


def test_controller_counts_what_the_core_decided(app):
    """A user_config change: one reconfigure per replica (reason user_config). A downscale that
    stops rank 0: the survivor is compacted from rank 1 to rank 0 (one reassignment at each
    level it changed, one reconfigure with reason rank)."""
    handle, client = app
    s = scrape(client)
    user = total(s, "rankcore_reconfigures_total", deployment="metered", reason="user_config")
    run(Metered.options(user_config={"v": 2}).bind(), route_prefix="/m")
    s = scrape(client)
    assert total(s, "rankcore_reconfigures_total", deployment="metered", reason="user_config") == user + 2
    assert total(s, "rankcore_compactions_total", deployment="metered") == 0

    ranks = handle.ranks()
    zero = next(rid for rid, rk in ranks.items() if rk[0] == 0)
    one = next(rid for rid, rk in ranks.items() if rk[0] == 1)
    handle.scale(1, victims=(zero,))
    deadline = time.monotonic() + 30
    while total(s := scrape(client), "rankcore_compactions_total", deployment="metered") < 1:
        assert time.monotonic() < deadline, "no compaction counted"
        time.sleep(0.1)
    after = handle.ranks()
    assert after[one][0] == 0
    moved = sum(1 for a, b in zip(ranks[one], after[one]) if a != b)
    assert total(s, "rankcore_rank_reassignments_total", deployment="metered", level="rank") == 1
    assert total(s, "rankcore_rank_reassignments_total", deployment="metered") == moved
    assert total(s, "rankcore_reconfigures_total", deployment="metered", reason="rank") == 1
    assert total(s, "ray_serve_autoscaling_target_replicas", deployment="metered") == 1
    healthy = {dict(ls)["replica"]: v for (n, ls), v in s.items() if n == "ray_serve_deployment_replica_healthy"}
    assert healthy == {one: 1.0}
    deadline = time.monotonic() + 10  # (a cluster pass every node_poll_s = 2 s)
    while total(s, "ray_serve_controller_num_control_loops") < 1 and time.monotonic() < deadline:
        time.sleep(0.5)
        s = scrape(client)
    assert total(s, "ray_serve_controller_num_control_loops") >= 1
    assert total(s, "ray_serve_controller_control_loop_duration_s") > 0
    n = len(records())
    assert client.post("/m", json=5).status_code == 200  # the survivor's new rank reaches the access records
    last = wait_records(n + 1)[-1]
    deadline = time.monotonic() + 5
    while last["rank"] != 0 and time.monotonic() < deadline:  # (the ingress's ranks are at most RANKS_TTL_S old)
        time.sleep(0.5)
        client.post("/m", json=5)
        last = records()[-1]
    assert last["replica"] == one and last["rank"] == 0
