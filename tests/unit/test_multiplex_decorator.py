"""``@multiplexed`` without Ray (executors/ray_gpu/api/multiplex.py, issue 39): Serve's checks and
words, the core's LRU carried out (loads, unloads with ``__del__``, one load at a time), what the
replica is told to report, and the model id read from the request context, the HTTP header and the
gRPC metadata key."""

from __future__ import annotations

import asyncio
from typing import ClassVar

import pytest

from executors.ray_gpu.api import multiplex
from executors.ray_gpu.api.context import RequestContext, _serve_request_context, request_for_call
from executors.ray_gpu.api.multiplex import get_multiplexed_model_id, multiplexed


@pytest.fixture
def reports():
    seen: list[tuple[str, ...]] = []
    multiplex.attach(seen.append)
    multiplex._every.clear()
    multiplex._plain.clear()
    yield seen
    multiplex._sink.clear()
    multiplex._every.clear()
    multiplex._plain.clear()


class Model:
    freed: ClassVar[list[str]] = []

    def __init__(self, name: str) -> None:
        self.name = name

    def __del__(self) -> None:
        Model.freed.append(self.name)


class Owner:
    def __init__(self) -> None:
        self.loads: list[str] = []
        self.running = 0
        self.most = 0

    @multiplexed(max_num_models_per_replica=2)
    async def load(self, model_id: str) -> Model:
        self.running += 1
        self.most = max(self.most, self.running)
        await asyncio.sleep(0.01)
        self.running -= 1
        self.loads.append(model_id)
        return Model(model_id)


def test_serves_checks_and_words():
    with pytest.raises(TypeError, match="can only be used to decorate async functions"):
        multiplexed(lambda model_id: None)
    with pytest.raises(TypeError, match="at least one 'model_id: str' argument"):
        async def none() -> None: ...
        multiplexed(none)
    with pytest.raises(TypeError, match="must be an integer"):
        multiplexed(max_num_models_per_replica=2.5)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="must be positive"):
        multiplexed(max_num_models_per_replica=0)
    assert Owner.load.multiplex_options.max_num_models_per_replica == 2


def test_lru_eviction_calls_del_loads_run_one_at_a_time_and_each_change_is_reported(reports):
    Model.freed.clear()
    o = Owner()

    async def go() -> list:
        got = await asyncio.gather(o.load("a"), o.load("b"), o.load("a"))
        await o.load("a")  # a is now the most recent: b goes next
        await o.load("c")
        return [m.name for m in got]

    assert asyncio.run(go()) == ["a", "b", "a"]
    assert o.loads == ["a", "b", "c"] and o.most == 1  # a loaded once; never two loads at once
    assert Model.freed == ["b"]
    assert reports[-1] == ("a", "c") and ("a", "b") in reports  # what the replica said it holds
    assert any(set(r) == {"a", "b", "c"} for r in reports)  # c reported as soon as it missed


def test_a_failed_load_raises_to_its_caller_and_leaves_nothing_held(reports):
    calls = []

    @multiplexed
    async def flaky(model_id: str) -> str:
        calls.append(model_id)
        if len(calls) == 1:
            raise RuntimeError("disk gone")
        return model_id.upper()

    async def go() -> str:
        with pytest.raises(RuntimeError, match="disk gone"):
            await flaky("x")
        return await flaky("x")

    assert asyncio.run(go()) == "X"
    assert reports[-1] == ("x",)


def test_bad_model_ids_get_serves_errors(reports):
    async def go(model_id):
        return await Owner().load(model_id)

    with pytest.raises(ValueError, match="The model ID cannot be empty"):
        asyncio.run(go(""))
    with pytest.raises(TypeError, match="The model ID must be a string"):
        asyncio.run(go(7))


def test_the_model_id_comes_from_the_request_context_and_is_not_inherited_by_a_nested_call():
    assert get_multiplexed_model_id() == ""
    token = _serve_request_context.set(RequestContext(request_id="r1", multiplexed_model_id="m7"))
    try:
        assert get_multiplexed_model_id() == "m7"
        nested = request_for_call("other")
        assert nested.request_id == "r1" and nested.multiplexed_model_id == ""  # (Serve: from the handle only)
        assert request_for_call("other", "m2").multiplexed_model_id == "m2"
    finally:
        _serve_request_context.reset(token)


def test_the_http_header_and_the_grpc_key_have_serves_names():
    from executors.ray_gpu.ingress import grpc_proxy, http

    assert http.MODEL_ID_HEADER == b"serve_multiplexed_model_id"
    note = {"route": "/m", "request_id": "r", "deployment": "d", "model": "m1"}
    assert http._request_of(note).multiplexed_model_id == "m1"

    class Ctx:
        def __init__(self, md):
            self.md = md

        def invocation_metadata(self):
            return self.md

    assert grpc_proxy.MODEL_ID_KEY == "multiplexed_model_id"
    assert grpc_proxy._model_of(Ctx((("application", "d"), ("multiplexed_model_id", "m3")))) == "m3"
    assert grpc_proxy._model_of(Ctx(None)) == ""
    assert grpc_proxy._model_request("d", "") is None
    assert grpc_proxy._model_request("d", "m3").multiplexed_model_id == "m3"
