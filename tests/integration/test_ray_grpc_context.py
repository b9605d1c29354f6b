"""Serve's ``grpc_context`` over rankcore's gRPC front, and services added to running proxies (issue 64).

A method that declares ``grpc_context`` gets a ``RayServegRPCContext`` (base/grpc_context.py): its
``invocation_metadata()`` is the client's metadata; the code and details it sets end the call (a code
other than OK: the client's ``RpcError``, the response unsent; set and then raised: that code, the
error's message); the trailing metadata it sets reaches the client beside ``request_id``; a generator
method (server streaming) too, after its items. A method without ``grpc_context`` is called as before
(its own name, not the entry). A new ``grpc_servicer_functions`` set that adds a service reaches the
running proxies: no application deleted, HTTP answering throughout; one that leaves a service out is
refused, saying why.

The first tests run the proxy's gRPC server in this process, in front of a stand-in handle that calls
the class's methods here (the request and the context pickled as Ray would send them); the rest run on
Ray (a local Ray, the module's ``local_ray``)."""

from __future__ import annotations

import asyncio
import inspect
import pickle
import threading
import time
from typing import Any

import grpc
import pytest
import requests
from grpc import aio

import rankcore as rc
from executors.ray_gpu import deployment, run, serve
from executors.ray_gpu.base.context import _get_serve_request_context
from executors.ray_gpu.base.grpc_context import RayServegRPCContext, attach, entry_name
from executors.ray_gpu.base.grpc_proxy import GrpcFront
from executors.ray_gpu.ingress.calls import _cancel
from executors.ray_gpu.ingress.http import IngressState, expose, proxies, public_methods, start_ingress
from tests.integration.protos import echo_pb2, echo_pb2_grpc

ECHO = "tests.integration.protos.echo_pb2_grpc.add_EchoServicer_to_server"
SHOUT = "tests.integration.protos.echo_pb2_grpc.add_ShoutServicer_to_server"
OPTS = {"num_cpus": 0.05}


class Contextual:
    """Every shape of method: plain, async, generator, async generator; with and without ``grpc_context``."""

    def Say(self, request, grpc_context: RayServegRPCContext):
        if request.text == "missing":
            grpc_context.set_code(grpc.StatusCode.NOT_FOUND)
            grpc_context.set_details("no such thing")
            return echo_pb2.EchoReply(text="never sent")
        if request.text == "trailing":
            grpc_context.set_trailing_metadata([("foo", "bar")])
            return echo_pb2.EchoReply(text="with trailing")
        if request.text == "raise":
            grpc_context.set_code(grpc.StatusCode.DATA_LOSS)
            raise RuntimeError("the data is gone")
        if request.text == "plain-raise":
            raise ValueError("a plain error")
        if request.text == "rid":
            return echo_pb2.EchoReply(text=_get_serve_request_context().request_id)
        seen = dict(grpc_context.invocation_metadata())
        return echo_pb2.EchoReply(text=f"{seen.get('who', '')}|{seen.get('application', '')}",
                                  replica=type(grpc_context).__name__)

    async def Nap(self, request, grpc_context):
        await asyncio.sleep(request.seconds)
        grpc_context.set_trailing_metadata([("napped", str(request.seconds))])
        return echo_pb2.EchoReply(text="awake")

    def Count(self, request, grpc_context):
        for i in range(request.n):
            yield echo_pb2.EchoReply(text=str(i))
        grpc_context.set_trailing_metadata([("counted", str(request.n))])
        if request.text == "fail":
            grpc_context.set_code(grpc.StatusCode.RESOURCE_EXHAUSTED)
            grpc_context.set_details("counted too far")

    def Loud(self, request):  # (no grpc_context: called as it always was)
        return echo_pb2.EchoReply(text=request.text.upper() + "!")


class AsyncStream:
    async def Count(self, request, grpc_context):
        for i in range(request.n):
            yield echo_pb2.EchoReply(text=f"a{i}")
        grpc_context.set_trailing_metadata([("async", "yes")])


# ------------------------------------------------------------------ in this process
class _Here:
    """A ``DeploymentHandle`` stand-in calling ``instance``'s methods in this process, what it is sent
    pickled both ways (as Ray sends it); ``sent``: the method names it was asked to call."""

    def __init__(self, instance: Any, sent: list[str], method: str = "__call__", stream: bool = False) -> None:
        self.instance, self.sent, self.method, self.stream = instance, sent, method, stream

    def __getattr__(self, method: str) -> _Here:
        if method.startswith("_"):
            raise AttributeError(method)
        return _Here(self.instance, self.sent, method, self.stream)

    def knows_pool(self) -> bool:
        return True

    def options(self, stream: bool | None = None, method_name: str | None = None, **_: Any) -> _Here:
        return _Here(self.instance, self.sent, method_name or self.method, self.stream if stream is None else stream)

    def remote(self, *args: Any) -> Any:
        self.sent.append(self.method)
        fn = getattr(self.instance, self.method)
        args = pickle.loads(pickle.dumps(args))
        if self.stream:
            async def items() -> Any:
                out = fn(*args)
                if inspect.isasyncgen(out):
                    async for item in out:
                        yield pickle.loads(pickle.dumps(item))
                else:
                    for item in out:
                        yield pickle.loads(pickle.dumps(item))
            return items()

        async def answer() -> Any:
            value = fn(*args)
            return await value if inspect.isawaitable(value) else value
        return answer()


def _front(cls: type, servicers: list[str], sent: list[str]) -> tuple[IngressState, Any]:
    attach(cls)
    ingress = IngressState({"/ctx": "ctx"}, {"ctx": _Here(cls(), sent)}, 1 << 20, 30.0)
    ingress.methods = {"ctx": public_methods(cls)}
    return ingress, GrpcFront(ingress, servicers, _cancel)


async def _outcome(call: Any) -> tuple[Any, Any, str, dict]:
    """(the answer or None, its code, details, trailing metadata as a dict)."""
    try:
        answer = await call
        code, details = grpc.StatusCode.OK, ""
    except aio.AioRpcError as exc:
        return None, exc.code(), exc.details() or "", dict(exc.trailing_metadata() or ())
    return answer, code, details, dict(await call.trailing_metadata() or ())


def test_the_entries_are_for_methods_taking_grpc_context_alone() -> None:
    attach(Contextual)
    reach = public_methods(Contextual)
    assert reach.grpc_context == frozenset({"Say", "Nap", "Count"})
    assert "Loud" in (reach.grpc or ()) and not hasattr(Contextual, entry_name("Loud"))
    for name in ("Say", "Nap", "Count"):  # (entries are never reachable by a client)
        assert reach.refusal("ctx", entry_name(name), "grpc") is not None
    assert inspect.isgeneratorfunction(getattr(Contextual, entry_name("Say")))
    assert inspect.isasyncgenfunction(getattr(Contextual, entry_name("Nap")))
    before = dict(vars(Contextual))
    attach(Contextual)  # (twice: nothing changes)
    assert dict(vars(Contextual)) == before


def test_a_method_taking_grpc_context_sets_what_the_client_sees_in_process() -> None:
    sent: list[str] = []
    ingress, front = _front(Contextual, [ECHO, SHOUT], sent)

    async def main() -> dict[str, Any]:
        host, port = await front.start("127.0.0.1", 0)
        out: dict[str, Any] = {}
        try:
            async with aio.insecure_channel(f"{host}:{port}") as channel:
                stub, shout = echo_pb2_grpc.EchoStub(channel), echo_pb2_grpc.ShoutStub(channel)
                for text in ("missing", "trailing", "raise", "plain-raise"):
                    out[text] = await _outcome(stub.Say(echo_pb2.EchoRequest(text=text), metadata=(("request_id", f"id-{text}"),)))
                out["seen"] = await _outcome(stub.Say(echo_pb2.EchoRequest(text="x"),
                                                      metadata=(("who", "me"), ("application", "ctx"))))
                out["nap"] = await _outcome(stub.Nap(echo_pb2.EchoRequest(seconds=0.01)))
                out["loud"] = await _outcome(shout.Loud(echo_pb2.EchoRequest(text="hi")))
                for n, text in ((3, ""), (2, "fail")):
                    call = stub.Count(echo_pb2.EchoRequest(n=n, text=text))
                    items = []
                    try:
                        async for item in call:
                            items.append(item.text)
                        code = grpc.StatusCode.OK
                    except aio.AioRpcError as exc:
                        code = exc.code()
                    out[f"count-{n}"] = (items, code, await call.details(), dict(await call.trailing_metadata()))
        finally:
            await front.stop(0)
        return out

    got = asyncio.run(main())
    assert got["missing"][1:3] == (grpc.StatusCode.NOT_FOUND, "no such thing")  # (the response is not sent)
    assert got["missing"][3]["request_id"] == "id-missing"
    answer, code, _, trailing = got["trailing"]
    assert answer.text == "with trailing" and code == grpc.StatusCode.OK
    assert trailing == {"request_id": "id-trailing", "foo": "bar"}
    assert got["raise"][1:3] == (grpc.StatusCode.DATA_LOSS, "RuntimeError: the data is gone")  # (Serve's: the code kept)
    assert got["plain-raise"][1:3] == (grpc.StatusCode.INTERNAL, "ValueError: a plain error")
    answer, code, _, _ = got["seen"]
    assert (answer.text, answer.replica) == ("me|ctx", "RayServegRPCContext")
    assert got["nap"][0].text == "awake" and got["nap"][3]["napped"] == "0.01"
    assert got["loud"][0].text == "HI!"
    items, code, _, trailing = got["count-3"]
    assert (items, code, trailing["counted"]) == (["0", "1", "2"], grpc.StatusCode.OK, "3") and "request_id" in trailing
    items, code, details, trailing = got["count-2"]
    assert (items, code, details, trailing["counted"]) == (["0", "1"], grpc.StatusCode.RESOURCE_EXHAUSTED,
                                                           "counted too far", "2")
    assert "Loud" in sent and entry_name("Say") in sent and "Say" not in sent
    assert ingress.ongoing == 0  # (every call's count given back)
    codes = front.codes
    assert codes["NOT_FOUND"] == 1 and codes["DATA_LOSS"] == 1 and codes["RESOURCE_EXHAUSTED"] == 1


def test_past_request_timeout_s_a_method_taking_grpc_context_is_deadline_exceeded_in_process() -> None:
    ingress, front = _front(Contextual, [ECHO], [])
    ingress.request_timeout_s = 0.2

    async def main() -> tuple[Any, ...]:
        host, port = await front.start("127.0.0.1", 0)
        try:
            async with aio.insecure_channel(f"{host}:{port}") as channel:
                return await _outcome(echo_pb2_grpc.EchoStub(channel).Nap(echo_pb2.EchoRequest(seconds=5)))
        finally:
            await front.stop(0)

    _answer, code, details, trailing = asyncio.run(main())
    assert code == grpc.StatusCode.DEADLINE_EXCEEDED and "request_timeout_s=0.2" in details, details
    assert "napped" not in trailing and "request_id" in trailing
    assert ingress.ongoing == 0


def test_an_async_generator_method_with_grpc_context_streams_in_process() -> None:
    _ingress, front = _front(AsyncStream, [ECHO], [])

    async def main() -> tuple[list[str], dict]:
        host, port = await front.start("127.0.0.1", 0)
        try:
            async with aio.insecure_channel(f"{host}:{port}") as channel:
                call = echo_pb2_grpc.EchoStub(channel).Count(echo_pb2.EchoRequest(n=2))
                items = [item.text async for item in call]
                return items, dict(await call.trailing_metadata())
        finally:
            await front.stop(0)

    items, trailing = asyncio.run(main())
    assert items == ["a0", "a1"] and trailing["async"] == "yes"


def test_services_added_to_a_running_front_are_served_at_once() -> None:
    _ingress, front = _front(Contextual, [ECHO], [])

    async def main() -> list[Any]:
        host, port = await front.start("127.0.0.1", 0)
        try:
            async with aio.insecure_channel(f"{host}:{port}") as channel:
                shout = echo_pb2_grpc.ShoutStub(channel)
                before = await _outcome(shout.Loud(echo_pb2.EchoRequest(text="a")))
                front.set_services([ECHO, SHOUT])
                after = await _outcome(shout.Loud(echo_pb2.EchoRequest(text="a")))
                still = await _outcome(echo_pb2_grpc.EchoStub(channel).Say(echo_pb2.EchoRequest(text="trailing")))
                return [before[1], after[0].text, still[0].text]
        finally:
            await front.stop(0)

    assert asyncio.run(main()) == [grpc.StatusCode.UNIMPLEMENTED, "A!", "with trailing"]


def test_the_context_pickles_and_ports_under_serves_import_path() -> None:
    class Call:  # (what Serve reads of a grpc.ServicerContext)
        def invocation_metadata(self):
            return (("application", "x"),)

        def trailing_metadata(self):
            return (("request_id", "r"),)

        def peer(self):
            return "ipv4:127.0.0.1:1"

    ctx = RayServegRPCContext(Call())
    ctx.set_code(grpc.StatusCode.NOT_FOUND)
    ctx.set_trailing_metadata([("a", "b")])
    back = pickle.loads(pickle.dumps(ctx))
    assert back.code() == grpc.StatusCode.NOT_FOUND and back.trailing_metadata() == [("request_id", "r"), ("a", "b")]
    assert back.invocation_metadata() == [("application", "x")] and back.peer() == "ipv4:127.0.0.1:1"
    assert serve.grpc_util.RayServegRPCContext is RayServegRPCContext
    from executors.ray_gpu.serve.grpc_util import RayServegRPCContext as ported  # (Serve's path, ported)

    assert ported is RayServegRPCContext


# ------------------------------------------------------------------ on Ray
@deployment(name="ctx", num_replicas=1, ray_actor_options=OPTS)
class Ctx(Contextual):
    pass


@deployment(name="plain", num_replicas=1, ray_actor_options=OPTS)
class Plain:
    def Say(self, request):
        return echo_pb2.EchoReply(text="plain " + request.text)

    def Count(self, request):
        for i in range(request.n):
            yield echo_pb2.EchoReply(text=str(i))


@serve.deployment(name="served", num_replicas=1, ray_actor_options=OPTS)
class Served:
    def Loud(self, request, grpc_context):
        grpc_context.set_trailing_metadata([("via", "serve.deployment")])
        return echo_pb2.EchoReply(text=request.text.upper())


@pytest.fixture(scope="module")
def channel(local_ray):
    """Proxies that serve HTTP alone, then gRPC asked of them: their gRPC server starts, HTTP kept."""
    _actor, http = start_ingress(port=0)
    expose(run(Ctx.bind()), "/ctx")
    assert [p["grpc_address"] for p in proxies().values()] == [None]
    _actor, again = start_ingress(grpc_port=0, grpc_servicer_functions=[ECHO])
    assert again == http
    expose(run(Plain.bind()), "/plain")
    (head,) = [p for p in proxies().values() if p["head"]]
    host, port = head["grpc_address"]
    with grpc.insecure_channel(f"{host}:{port}") as ch:
        yield ch


def _on(app: str, *more: tuple[str, str]) -> tuple:
    return (("application", app), *more)


def test_grpc_context_code_details_and_trailing_metadata_reach_the_client(channel):
    stub = echo_pb2_grpc.EchoStub(channel)
    with pytest.raises(grpc.RpcError) as err:
        stub.Say(echo_pb2.EchoRequest(text="missing"), metadata=_on("ctx"), timeout=60)
    assert err.value.code() == grpc.StatusCode.NOT_FOUND and err.value.details() == "no such thing"
    assert len(dict(err.value.trailing_metadata())["request_id"]) == 32
    reply, call = stub.Say.with_call(echo_pb2.EchoRequest(text="trailing"), metadata=_on("ctx", ("request_id", "t-1")),
                                     timeout=60)
    assert reply.text == "with trailing"
    assert dict(call.trailing_metadata()) == {"request_id": "t-1", "foo": "bar"}
    with pytest.raises(grpc.RpcError) as err:
        stub.Say(echo_pb2.EchoRequest(text="raise"), metadata=_on("ctx"), timeout=60)
    assert err.value.code() == grpc.StatusCode.DATA_LOSS and "RuntimeError: the data is gone" in err.value.details()


def test_invocation_metadata_is_the_clients_and_the_request_id_reaches_the_replica(channel):
    stub = echo_pb2_grpc.EchoStub(channel)
    reply = stub.Say(echo_pb2.EchoRequest(text="x"), metadata=_on("ctx", ("who", "me")), timeout=60)
    assert (reply.text, reply.replica) == ("me|ctx", "RayServegRPCContext")
    reply = stub.Say(echo_pb2.EchoRequest(text="rid"), metadata=_on("ctx", ("request_id", "r-9")), timeout=60)
    assert reply.text == "r-9"


def test_a_streaming_method_with_grpc_context(channel):
    stub = echo_pb2_grpc.EchoStub(channel)
    call = stub.Count(echo_pb2.EchoRequest(n=3), metadata=_on("ctx"), timeout=60)
    assert [r.text for r in call] == ["0", "1", "2"]
    trailing = dict(call.trailing_metadata())
    assert trailing["counted"] == "3" and "request_id" in trailing
    got = []
    with pytest.raises(grpc.RpcError) as err:
        for r in stub.Count(echo_pb2.EchoRequest(n=2, text="fail"), metadata=_on("ctx"), timeout=60):
            got.append(r.text)
    assert got == ["0", "1"]
    assert (err.value.code(), err.value.details()) == (grpc.StatusCode.RESOURCE_EXHAUSTED, "counted too far")


def test_methods_without_grpc_context_are_unchanged(channel):
    stub = echo_pb2_grpc.EchoStub(channel)
    assert stub.Say(echo_pb2.EchoRequest(text="a"), metadata=_on("plain"), timeout=60).text == "plain a"
    assert [r.text for r in stub.Count(echo_pb2.EchoRequest(n=2), metadata=_on("plain"), timeout=60)] == ["0", "1"]


def test_a_service_added_to_running_proxies_is_served_without_deleting_an_application(channel):
    """Proxies started with the Echo service; Shout is added while ``ctx`` serves: both answer, the
    application is never deleted, HTTP answers throughout; leaving a service out is refused."""
    (head,) = [p for p in proxies().values() if p["head"]]
    http = "http://{}:{}".format(*head["address"])
    shout = echo_pb2_grpc.ShoutStub(channel)
    with pytest.raises(grpc.RpcError) as err:
        shout.Loud(echo_pb2.EchoRequest(text="x"), metadata=_on("ctx"), timeout=30)
    assert err.value.code() == grpc.StatusCode.UNIMPLEMENTED
    answers: list[int] = []
    stop = threading.Event()

    def ask_http() -> None:
        while not stop.is_set():
            answers.append(requests.get(f"{http}/-/routes", timeout=10).status_code)
            time.sleep(0.05)

    asker = threading.Thread(target=ask_http)
    asker.start()
    try:
        start_ingress(grpc_servicer_functions=[ECHO, SHOUT])
        expose(run(Served.bind()), "/served")
        reply, call = shout.Loud.with_call(echo_pb2.EchoRequest(text="hey"), metadata=_on("served"), timeout=60)
        assert reply.text == "HEY" and dict(call.trailing_metadata())["via"] == "serve.deployment"
        assert shout.Loud(echo_pb2.EchoRequest(text="hi"), metadata=_on("ctx"), timeout=60).text == "HI!"
        assert echo_pb2_grpc.EchoStub(channel).Say(echo_pb2.EchoRequest(text="x"), metadata=_on("ctx", ("who", "w")),
                                                   timeout=60).text == "w|ctx"
    finally:
        stop.set()
        asker.join()
    assert answers and set(answers) == {200}, answers
    with pytest.raises(rc.InvalidConfig, match=r"leaves out .*add_EchoServicer_to_server"):
        start_ingress(grpc_servicer_functions=[SHOUT])
    start_ingress(grpc_servicer_functions=[SHOUT, ECHO])  # (the same services, in another order: fine)
    assert shout.Loud(echo_pb2.EchoRequest(text="ok"), metadata=_on("ctx"), timeout=60).text == "OK!"
