"""``@multiplexed`` without Ray (executors/ray_gpu/replica/multiplex.py, issue 39): Serve's checks and
words, the core's LRU carried out (loads, unloads with ``__del__``, one load at a time), what the
replica is told to report, and the model id read from the request context, the HTTP header and the
gRPC metadata key."""

from __future__ import annotations

import asyncio
from typing import ClassVar

import pytest

from executors.ray_gpu.base.context import RequestContext, _serve_request_context, request_for_call
from executors.ray_gpu.replica import multiplex
from executors.ray_gpu.replica.multiplex import get_multiplexed_model_id, multiplexed


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
    from executors.ray_gpu.base import grpc_proxy
    from executors.ray_gpu.ingress import calls

    assert calls.MODEL_ID_HEADER == b"serve_multiplexed_model_id"
    note = {"route": "/m", "request_id": "r", "deployment": "d", "model": "m1"}
    assert calls._request_of(note).multiplexed_model_id == "m1"

    class Ctx:
        def __init__(self, md):
            self.md = md

        def invocation_metadata(self):
            return self.md

        def set_trailing_metadata(self, md):
            self.trailing = md

    assert grpc_proxy.MODEL_ID_KEY == "multiplexed_model_id"
    assert grpc_proxy._model_of(Ctx((("application", "d"), ("multiplexed_model_id", "m3")))) == "m3"
    assert grpc_proxy._model_of(Ctx(None)) == ""
    ctx = Ctx((("application", "d"), ("multiplexed_model_id", "m3"), ("request_id", "rid-1")))
    note = grpc_proxy._note_of("d", ctx)  # (the call's request context: its model and id, the id sent back)
    assert (note["model"], note["request_id"], ctx.trailing) == ("m3", "rid-1", (("request_id", "rid-1"),))
    assert calls._request_of(note).multiplexed_model_id == "m3"


def test_a_request_cancelled_while_its_evictions_unload_leaves_the_loader_usable(reports):
    freed: list[str] = []

    class Slow:
        def __init__(self, name: str) -> None:
            self.name = name

        async def __del__(self) -> None:  # (awaited by the unload: a slow GPU free)
            await asyncio.sleep(0.05)
            freed.append(self.name)

    @multiplexed(max_num_models_per_replica=1)
    async def slow(model_id: str) -> Slow:
        return Slow(model_id)

    async def go() -> str:
        await slow("a")
        task = asyncio.ensure_future(slow("b"))  # evicts a: its __del__ takes 50 ms
        await asyncio.sleep(0.01)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        await asyncio.sleep(0.1)  # (the unload goes on, shielded)
        return (await slow("c")).name  # the loader still works: no load left half begun

    assert asyncio.run(go()) == "c"
    assert freed == ["a"]  # a was unloaded once, though its evicting request was cancelled
    assert reports[-1] == ("c",)


def test_a_del_that_raises_does_not_stop_the_load_and_the_model_is_gone(reports, caplog):
    class Bad:
        def __del__(self) -> None:
            raise OSError("cannot free")

    @multiplexed(max_num_models_per_replica=1)
    async def bad(model_id: str) -> Bad:
        return Bad()

    async def go() -> None:
        await bad("a")
        await bad("b")

    asyncio.run(go())
    assert reports[-1] == ("b",)
    assert "unloading multiplexed model 'a' failed" in caplog.text


def test_after_shutdown_no_load_begins_and_every_model_was_unloaded(reports):
    Model.freed.clear()
    o = Owner()

    async def go() -> None:
        await o.load("a")
        await o.load("b")
        await multiplex.shutdown_all()
        with pytest.raises(RuntimeError, match="the replica is stopping"):
            await o.load("a")

    asyncio.run(go())
    assert sorted(Model.freed) == ["a", "b"] and reports[-1] == ()


def test_plain_loaders_of_the_same_name_in_two_modules_keep_their_own_models(reports):
    async def fetch(model_id: str) -> str:
        return "one:" + model_id

    async def fetch2(model_id: str) -> str:
        return "two:" + model_id

    fetch2.__qualname__ = fetch.__qualname__
    fetch2.__module__ = "elsewhere"
    one, two = multiplexed(fetch), multiplexed(fetch2)

    async def go() -> tuple:
        return await one("m"), await two("m")

    assert asyncio.run(go()) == ("one:m", "two:m")
