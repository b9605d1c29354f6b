"""A Ray Serve app ported by changing one import (issue 64): ``from ray import serve`` became
``from executors.ray_gpu import serve`` and nothing else, on one local Ray: ``serve.start``,
``serve.run(app, name=...)`` (HTTP at its route prefix, a handle back), ``__call__(self, request)``
getting a starlette ``Request`` for every path and method under the prefix, ``@serve.ingress`` of a
FastAPI app (class-based view, path parameters, a body model, a streaming answer, its lifespan),
``@serve.multiplexed`` and ``serve.get_multiplexed_model_id``, ``reconfigure`` from ``user_config``,
``serve.get_app_handle``, ``serve.delete``; a Serve name with no equivalent fails saying so."""

from __future__ import annotations

import httpx
import pytest
from fastapi import FastAPI
from prometheus_client.parser import text_string_to_metric_families
from pydantic import BaseModel
from starlette.requests import Request
from starlette.responses import PlainTextResponse, StreamingResponse

import rankcore as rc
from executors.ray_gpu import serve  # (was: from ray import serve)
from executors.ray_gpu.ingress.http import ingress_address

pytestmark = pytest.mark.usefixtures("local_ray")


@serve.deployment(num_replicas=2, ray_actor_options={"num_cpus": 0.05}, user_config={"greeting": "hello"})
class Greeter:
    def __init__(self):
        self.greeting = None

    def reconfigure(self, config):
        self.greeting = config["greeting"]

    @serve.multiplexed(max_num_models_per_replica=2)
    async def get_model(self, model_id):
        return f"model-{model_id}"

    async def greet(self, name="world"):
        model = serve.get_multiplexed_model_id()
        loaded = await self.get_model(model) if model else None
        return {"says": f"{self.greeting} {name}", "model": loaded, "rank": serve.get_replica_context().rank.rank}

    async def __call__(self, request: Request):
        if request.url.path.endswith("/text"):
            return PlainTextResponse(f"{self.greeting} as text", status_code=201)
        name = (await request.json()) if request.method == "POST" else request.query_params.get("name", "world")
        return {**await self.greet(name), "method": request.method, "path": request.url.path,
                "root_path": request.scope["root_path"]}


app = Greeter.bind()


def _scrape(base: str) -> dict[tuple[str, tuple], float]:
    r = httpx.get(f"{base}/metrics", timeout=60)
    assert r.status_code == 200
    return {(x.name, tuple(sorted(x.labels.items()))): x.value
            for fam in text_string_to_metric_families(r.text) for x in fam.samples}


def _total(samples: dict, name: str, **labels: str) -> float:
    return sum(v for (n, ls), v in samples.items() if n == name and labels.items() <= dict(ls).items())


def _base() -> str:
    host, port = ingress_address()
    return f"http://{host}:{port}"


def test_a_serve_app_runs_by_its_own_names():
    serve.start(http_options={"port": 0})
    handle = serve.run(app, name="greet", route_prefix="/greet")
    try:
        got = handle.greet.remote("ray").result(timeout=60)
        assert got["says"] == "hello ray" and got["model"] is None and got["rank"] in (0, 1)
        with_model = handle.options(multiplexed_model_id="m1").greet.remote("ray").result(timeout=60)
        assert with_model["model"] == "model-m1"
        base = _base()
        # (Serve: every path and method under the prefix reaches __call__ with a starlette Request)
        posted = httpx.post(f"{base}/greet", json="http", timeout=60).json()
        assert posted["says"] == "hello http" and posted["method"] == "POST" and posted["root_path"] == "/greet"
        got = httpx.get(f"{base}/greet/v1/predict", params={"name": "deep"}, timeout=60).json()
        assert got["says"] == "hello deep" and got["path"] == "/greet/v1/predict" and got["method"] == "GET"
        put = httpx.put(f"{base}/greet/anything", json="put", timeout=60).json()
        assert put["method"] == "PUT" and put["says"] == "hello world"
        text = httpx.get(f"{base}/greet/text", timeout=60)
        assert (text.status_code, text.text) == (201, "hello as text")
        assert text.headers["content-type"].startswith("text/plain") and text.headers["x-request-id"]
        r = httpx.post(f"{base}/greet", json="h", headers={"serve_multiplexed_model_id": "m2"}, timeout=60)
        assert r.json()["model"] == "model-m2"
        for hidden in ("reconfigure", "get_model"):  # (a path, not a method: __call__ answers it)
            got = httpx.post(f"{base}/greet/{hidden}", json={"greeting": "x"}, timeout=60).json()
            assert got["path"] == f"/greet/{hidden}" and got["model"] is None  # (__call__'s answer)
            assert handle.greet.remote("still").result(timeout=60)["says"] == "hello still"  # (no reconfigure)
        nowhere = httpx.get(f"{base}/nowhere", timeout=60)
        assert nowhere.status_code == 404
        assert nowhere.text == "Path '/nowhere' not found. Ping http://.../-/routes for available routes."
        assert httpx.get(f"{base}/-/healthz", timeout=60).text == "success"
        assert httpx.get(f"{base}/-/routes", timeout=60).json()["/greet"] == "greet"  # (route -> application)
        samples = _scrape(base)  # (Serve's application label: the app's name, not the deployment's)
        assert _total(samples, "ray_serve_num_http_requests_total", application="greet", route="/greet") >= 5
        assert _total(samples, "ray_serve_deployment_request_counter_total", application="greet",
                      deployment="Greeter") >= 5
        assert _total(samples, "ray_serve_num_http_requests_total", application="Greeter") == 0
        assert serve.get_app_handle("greet").greet.remote("again").result(timeout=60)["says"] == "hello again"
        got = serve.get_deployment_handle("Greeter", "greet").greet.remote().result(timeout=60)
        assert got["says"] == "hello world"
        with pytest.raises(rc.InvalidEvent, match="application 'greet' has no deployment 'Other'"):
            serve.get_deployment_handle("Other", "greet")
    finally:
        serve.delete("greet")
    with pytest.raises(rc.InvalidEvent, match="no application 'greet'"):
        serve.get_app_handle("greet")


api = FastAPI()


class Payload(BaseModel):
    x: list[float]


@serve.deployment(ray_actor_options={"num_cpus": 0.05})
@serve.ingress(api)
class Api:
    def __init__(self, word):
        self.word = word
        self.started = False

    @api.get("/")
    def root(self):
        return {"word": self.word}

    @api.post("/v1/predict")
    async def predict(self, payload: Payload, scale: float = 1.0):
        return {"sum": sum(payload.x) * scale, "rank": serve.get_replica_context().rank.rank}

    @api.get("/items/{item_id}")
    def item(self, item_id: int):
        return {"item": item_id, "word": self.word}

    @api.get("/stream")
    def stream(self, n: int = 3):
        return StreamingResponse((f"{self.word}-{i}\n" for i in range(n)), media_type="text/plain")

    @api.get("/fail")
    def fail(self):
        raise ValueError("no such thing")


def test_a_fastapi_ingress_answers_its_routes_with_the_replicas_instance():
    serve.start(http_options={"port": 0})
    serve.run(Api.bind("ported"), name="api", route_prefix="/port")
    try:
        base = _base()
        assert httpx.get(f"{base}/port/", timeout=60).json() == {"word": "ported"}
        got = httpx.post(f"{base}/port/v1/predict", params={"scale": 2}, json={"x": [1, 2.5]}, timeout=60)
        assert got.status_code == 200 and got.json() == {"sum": 7.0, "rank": 0}
        assert httpx.get(f"{base}/port/items/7", timeout=60).json() == {"item": 7, "word": "ported"}
        bad = httpx.get(f"{base}/port/items/seven", timeout=60)  # (FastAPI's own validation: 422)
        assert bad.status_code == 422 and bad.json()["detail"][0]["loc"] == ["path", "item_id"]
        invalid = httpx.post(f"{base}/port/v1/predict", json={"x": "no"}, timeout=60)
        assert invalid.status_code == 422
        assert httpx.get(f"{base}/port/absent", timeout=60).status_code == 404  # (the app's 404)
        with httpx.stream("GET", f"{base}/port/stream", params={"n": 4}, timeout=60) as r:
            lines = [line for line in r.iter_lines() if line]
        assert lines == ["ported-0", "ported-1", "ported-2", "ported-3"]
        failed = httpx.get(f"{base}/port/fail", timeout=60)
        assert failed.status_code == 500 and "Traceback" not in failed.text and "no such thing" not in failed.text
    finally:
        serve.delete("api")


@serve.deployment(name="port-fn", ray_actor_options={"num_cpus": 0.1})
async def greeting(request: Request) -> str:
    """A function deployment, as Serve's: the function gets each HTTP request (and a handle's arguments)."""
    return f"hi {request.query_params.get('who', 'there')}" if isinstance(request, Request) else f"hi {request}"


def test_a_function_deployment_answers_http_and_handle_calls():
    serve.start(http_options={"port": 0})
    handle = serve.run(greeting.bind(), name="fn", route_prefix="/fn")
    try:
        assert httpx.get(f"{_base()}/fn", params={"who": "http"}, timeout=60).text == "hi http"
        assert handle.remote("handle").result(timeout=60) == "hi handle"
    finally:
        serve.delete("fn")


def test_a_serve_name_without_an_equivalent_says_so():
    with pytest.raises(rc.InvalidConfig, match=r"serve\.ingress takes an ASGI app"):
        serve.ingress(object())
    with pytest.raises(serve.NoEquivalent, match="run_many"):
        serve.run_many([app])

    with pytest.raises(serve.NoEquivalent, match="_local_testing_mode"):
        serve.run(app, _local_testing_mode=True)
    with pytest.raises(AttributeError, match="no attribute 'not_a_serve_name'"):
        serve.not_a_serve_name  # noqa: B018
