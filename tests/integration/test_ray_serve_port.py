"""A Ray Serve app ported by changing one import (issue 64): ``from ray import serve`` became
``from executors.ray_gpu import serve`` and nothing else, on one local Ray: ``serve.start``,
``serve.run(app, name=...)`` (HTTP at its route prefix, a handle back), ``@serve.multiplexed`` and
``serve.get_multiplexed_model_id``, ``reconfigure`` from ``user_config``, ``serve.get_app_handle``,
``serve.delete``; a Serve name with no equivalent fails saying so."""

from __future__ import annotations

import httpx
import pytest

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

    async def __call__(self, name="world"):
        model = serve.get_multiplexed_model_id()
        loaded = await self.get_model(model) if model else None
        return {"says": f"{self.greeting} {name}", "model": loaded, "rank": serve.get_replica_context().rank.rank}


app = Greeter.bind()


def test_a_serve_app_runs_by_its_own_names():
    serve.start(http_options={"port": 0})
    handle = serve.run(app, name="greet", route_prefix="/greet")
    try:
        got = handle.remote("ray").result(timeout=60)
        assert got["says"] == "hello ray" and got["model"] is None and got["rank"] in (0, 1)
        with_model = handle.options(multiplexed_model_id="m1").remote("ray").result(timeout=60)
        assert with_model["model"] == "model-m1"
        host, port = ingress_address()
        base = f"http://{host}:{port}"
        assert httpx.post(f"{base}/greet", json="http", timeout=60).json()["says"] == "hello http"
        r = httpx.post(f"{base}/greet", json="h", headers={"serve_multiplexed_model_id": "m2"}, timeout=60)
        assert r.json()["model"] == "model-m2"
        for hidden in ("reconfigure", "get_model"):  # (only what the app exposed: __call__)
            assert httpx.post(f"{base}/greet/{hidden}", json={"greeting": "x"}, timeout=60).status_code == 404
        assert httpx.get(f"{base}/-/healthz", timeout=60).text == "success"
        assert serve.get_app_handle("greet").remote("again").result(timeout=60)["says"] == "hello again"
        assert serve.get_deployment_handle("Greeter", "greet").remote().result(timeout=60)["says"] == "hello world"
        with pytest.raises(rc.InvalidEvent, match="application 'greet' has no deployment 'Other'"):
            serve.get_deployment_handle("Other", "greet")
    finally:
        serve.delete("greet")
    with pytest.raises(rc.InvalidEvent, match="no application 'greet'"):
        serve.get_app_handle("greet")


def test_a_serve_name_without_an_equivalent_says_so():
    with pytest.raises(serve.NoEquivalent, match=r"serve\.ingress .*no equivalent yet"):

        @serve.ingress(object())
        class Api:
            pass

    with pytest.raises(serve.NoEquivalent, match="_local_testing_mode"):
        serve.run(app, _local_testing_mode=True)
    with pytest.raises(AttributeError, match="no attribute 'not_a_serve_name'"):
        serve.not_a_serve_name  # noqa: B018
