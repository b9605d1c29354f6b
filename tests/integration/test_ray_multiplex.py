"""``@multiplexed`` in real replicas (issue 39): a model's requests stick to the replica that loaded
it (the replica reports what it holds, the router's machine routes by it), a cold model goes to the
replica holding fewer, the least recently used model is unloaded beyond the bound with its
``__del__`` called, the handle option and the HTTP header name the model, the status and the
metrics show what each replica holds, and a replica's crash moves its models' traffic."""

from __future__ import annotations

import asyncio
import time

import httpx
import pytest
import ray

from executors.ray_gpu import (
    deployment,
    get_multiplexed_model_id,
    get_replica_context,
    http_method,
    multiplexed,
    run,
)
from executors.ray_gpu.base.replicas import NAMESPACE

pytestmark = pytest.mark.usefixtures("local_ray")

OPTS = {"num_cpus": 0.05}


class Model:
    def __init__(self, model_id: str, unloaded: list) -> None:
        self.model_id, self.unloaded = model_id, unloaded

    def __del__(self) -> None:
        self.unloaded.append(self.model_id)


@deployment(name="mux", num_replicas=2, max_ongoing_requests=4, ray_actor_options=OPTS)
class Mux:
    def __init__(self) -> None:
        self.loads: list[str] = []
        self.unloaded: list[str] = []

    @multiplexed(max_num_models_per_replica=2)
    async def get_model(self, model_id: str) -> Model:
        await asyncio.sleep(0.05)
        self.loads.append(model_id)
        return Model(model_id, self.unloaded)

    async def __call__(self, x: int = 0) -> dict:
        model = await self.get_model(get_multiplexed_model_id())
        return {"model": model.model_id, "asked": get_multiplexed_model_id(), "x": x,
                "replica": get_replica_context().replica_id}

    @http_method
    async def history(self) -> dict:
        return {"loads": list(self.loads), "unloaded": list(self.unloaded),
                "replica": get_replica_context().replica_id}


@pytest.fixture(scope="module")
def handle():
    return run(Mux.bind(), route_prefix="/mux", port=0)


def _ask(h, model: str, n: int = 1) -> list[dict]:
    return [h.options(multiplexed_model_id=model).remote(i).result(timeout=60) for i in range(n)]


def _settle(h, rid: str, model: str, present: bool = True, timeout: float = 10.0) -> None:
    """Wait until the controller shows ``model`` on ``rid`` (the replica's report reached it)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        held = h.status()["replicas"].get(rid, {}).get("multiplexed_model_ids", [])
        if (model in held) == present:
            return
        time.sleep(0.05)
    raise AssertionError(f"{model} {'never reached' if present else 'never left'} {rid}: {h.status()['replicas']}")


def _history(h, rid: str) -> dict:
    for _ in range(40):  # (a plain call goes to either replica: ask until the one wanted answers)
        got = h.history.remote().result(timeout=60)
        if got["replica"] == rid:
            return got
    raise AssertionError(f"{rid} never answered")


def test_a_models_requests_stick_to_the_replica_that_loaded_it_and_a_cold_one_goes_to_the_other(handle):
    first = _ask(handle, "a")[0]
    assert first["model"] == first["asked"] == "a"
    home = first["replica"]
    _settle(handle, home, "a")
    again = _ask(handle, "a", 6)
    assert {g["replica"] for g in again} == {home}, again  # sequential calls: its holder has room
    other = _ask(handle, "b")[0]["replica"]
    assert other != home  # fewest models: the replica holding none
    assert _history(handle, home)["loads"].count("a") == 1  # loaded once, then hits


def test_beyond_the_bound_the_least_recently_used_model_is_unloaded_and_its_del_called(handle):
    home = _ask(handle, "c")[0]["replica"]
    _settle(handle, home, "c")
    # (with the other replica busy holding its own models, route c's neighbours here one by one)
    held = set(handle.status()["replicas"][home]["multiplexed_model_ids"])
    for model in ("d", "e"):
        got = _ask(handle, model)[0]
        if got["replica"] != home:
            continue
        _settle(handle, home, model)
    hist = _history(handle, home)
    status = handle.status()["replicas"][home]["multiplexed_model_ids"]
    assert len(status) <= 2, status  # never beyond the bound
    evicted = set(hist["loads"]) - set(status)
    assert evicted and evicted <= set(hist["unloaded"]), (hist, status, held)  # each unload ran __del__


def test_the_http_header_names_the_model(handle):
    from executors.ray_gpu.ingress.http import ingress_address

    host, port = ingress_address()
    r = httpx.post(f"http://{host}:{port}/mux", json=7, headers={"serve_multiplexed_model_id": "h1"}, timeout=60)
    assert r.status_code == 200 and r.json()["asked"] == "h1" and r.json()["model"] == "h1", r.text
    home = r.json()["replica"]
    _settle(handle, home, "h1")
    r2 = httpx.post(f"http://{host}:{port}/mux", json=8, headers={"serve_multiplexed_model_id": "h1"}, timeout=60)
    assert r2.json()["replica"] == home
    plain = httpx.post(f"http://{host}:{port}/mux/history", json=None, timeout=60)
    assert plain.status_code == 200


def test_a_call_without_a_model_id_gets_servees_error_from_the_loader(handle):
    with pytest.raises(Exception, match="The model ID cannot be empty"):
        handle.remote(0).result(timeout=60)


def test_a_bad_handle_option_is_refused_at_once(handle):
    import rankcore as rc

    with pytest.raises(rc.InvalidConfig, match="multiplexed_model_id"):
        handle.options(multiplexed_model_id=3)


def test_the_replicas_metrics_count_loads_and_show_the_models_held(handle):
    from executors.ray_gpu.ingress.http import ingress_address

    host, port = ingress_address()
    text = httpx.get(f"http://{host}:{port}/metrics", timeout=60).text
    loads = sum(float(line.rsplit(" ", 1)[1]) for line in text.splitlines()
                if line.startswith("ray_serve_multiplexed_models_load_counter_total{") and 'deployment="mux"' in line)
    assert loads >= 3, [line for line in text.splitlines() if "multiplexed" in line]
    assert 'ray_serve_registered_multiplexed_model_id{' in text and 'model_id="a"' in text


def test_a_replicas_crash_moves_its_models_traffic_to_a_live_replica(handle):
    home = _ask(handle, "z")[0]["replica"]
    _settle(handle, home, "z")
    ray.kill(ray.get_actor(f"ModelActor:mux:{home}", namespace=NAMESPACE), no_restart=True)
    # (a call sent before this process's router hears of the death fails: it is not idempotent)
    router = handle._router
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        router.refresh()
        with router.lock:
            if home not in [v.replica_id for v in router.machine.pool("mux")]:
                break
        time.sleep(0.05)
    got = _ask(handle, "z", 3)
    assert all(g["model"] == "z" and g["replica"] != home for g in got), (home, got)


def test_a_restarted_controller_reads_each_replicas_models_back_and_routing_still_sticks(handle):
    from executors.ray_gpu import ask, get_controller

    home = _ask(handle, "r1")[0]["replica"]
    _settle(handle, home, "r1")
    ray.kill(get_controller(), no_restart=False)
    assert ask(get_controller(), "wait_healthy", "mux", 30)
    assert "r1" in handle.status()["replicas"][home]["multiplexed_model_ids"]  # from the replica's report
    assert {g["replica"] for g in _ask(handle, "r1", 4)} == {home}
    assert ask(get_controller(), "state_errors") == []
