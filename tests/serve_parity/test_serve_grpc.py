"""Ray Serve's gRPC tests (the gRPC proxy: routing by ``application`` metadata, ``request_id``,
``ListApplications`` / ``Healthz``, multiplexing, streaming, timeouts, errors, cancellation,
``grpc_context``, large messages; and the gRPC utilities' unit tests), run against
``from executors.ray_gpu import serve`` on one local Ray (issue 64, "Prove it on Serve's own tests").

Sources: ray-project/ray, python/ray/serve/tests/test_grpc.py (the newest version the search index
holds: 57,254 characters, with the client-streaming and bidirectional cases; the index names no
commit for it, and the one commit it lists for that path, 2ec79f325b0c, is a 5,850-character Ray 2.5
version of the file) and python/ray/serve/tests/unit/test_grpc_util.py @ 00501e2bd10f (the newest of
its two stored versions: ``gRPCGenericServer``, ``add_grpc_address``, back-pressure's code). Each case
here is one of theirs, under its own name and parameters, re-expressed from what it checks (written
anew, not copied).

Adapted, as said at each case: Serve's test protos (``serve_pb2.UserDefinedService``,
``FruitService``) are rankcore's test services (tests/integration/protos/echo.proto, not edited):
``UserDefinedService.__call__`` is ``Echo.Say``, ``Method1`` is ``Shout.Loud``, ``Method2`` (the
multiplexed one) is ``Echo.Nap``, ``Streaming`` is ``Echo.Count``, and ``FruitService.FruitStand``
(Serve's ``g2``, a model composition) is ``Shout.Loud`` of the composing deployment; a
``UserDefinedMessage(name="foo", num=30, foo="bar")`` is an ``EchoRequest(text="foo", n=30)``, a
greeting is the reply's ``text``. Serve's shared ``g`` is built here per case, under a deployment name
of the case's own (deployment names are global in rankcore: docs/ray.md, "Porting a Serve app").
Serve's fixtures start a Ray (or a cluster) and Serve for each case, gRPC on port 9000; here one Ray
for the module (~6 s) and its proxies started once, HTTP and gRPC on free ports, the gRPC server
taking messages up to 8 MiB (``max_body_bytes``: rankcore's default is 1 MiB, docs/ray.md, "### gRPC";
gRPC's own receive limit is set from it when a proxy starts), and each case's ``serve.start`` asks the
running proxies for what it names. Every case deletes the applications it ran. Serve's
``SignalActor`` is ``Signal`` below.

Skipped, differing as documented (each says why): the twenty client-streaming and bidirectional cases
(rankcore serves unary and server-streaming RPCs), and back-pressure's code (``UNAVAILABLE`` here).
No strict xfail is left: the defects this port found (``serve.run`` of another graph under an
application's name refused, a server-streaming call not bounded by ``request_timeout_s``, a servicer
function registering through ``add_generic_rpc_handlers`` alone refused) are fixed.
"""

from __future__ import annotations

import asyncio
import pickle
from typing import Any

import grpc
import pytest
import ray
from google.protobuf import any_pb2, empty_pb2, struct_pb2, wrappers_pb2
from ray import cloudpickle

import rankcore as rc
from executors.ray_gpu import serve
from executors.ray_gpu.ingress.http import proxies, start_ingress
from tests.integration.conftest import _local_ray, witness_dir  # noqa: F401 (fixtures of this module too)
from tests.integration.protos import echo_pb2, echo_pb2_grpc

ORIGIN = ("python/ray/serve/tests/test_grpc.py (newest version the search index holds, 57,254 characters; "
          "no commit given)")
ORIGIN_UNIT = "python/ray/serve/tests/unit/test_grpc_util.py @ 00501e2bd10f17c70dc12cdf54a203cf2db02a09"
CPU = {"num_cpus": 0.01}
ECHO = "tests.integration.protos.echo_pb2_grpc.add_EchoServicer_to_server"
SHOUT = "tests.integration.protos.echo_pb2_grpc.add_ShoutServicer_to_server"
#: Serve's ``grpc_servicer_functions`` (UserDefinedService, FruitService)
SERVICERS = [ECHO, SHOUT]
#: the largest gRPC message the module's proxies take (Serve's test sends 6,000,000 characters)
MAX_MESSAGE = 8 << 20

_STATE: dict[str, Any] = {}

CLIENT_STREAMING = ("differs (documented): rankcore's gRPC proxy serves unary and server-streaming RPCs only "
                    "(docs/ray.md, \"### gRPC\": \"Unary and server-streaming RPCs are served\"; a servicer function "
                    "with a client-streaming or bidirectional method is refused with rankcore.InvalidConfig, and "
                    "Serve's gRPCInputStream has no equivalent); tests/integration/protos/echo.proto has no such "
                    "method either")


@pytest.fixture(scope="module", autouse=True)
def ray_serve():
    """One local Ray; the proxies (HTTP and gRPC, free ports, messages up to ``MAX_MESSAGE``); a
    channel to the head proxy's gRPC server. At the end the controller forgets everything."""
    gen = _local_ray(0, 128, "reset")
    next(gen)
    try:
        start_ingress("127.0.0.1", 0, grpc_port=0, grpc_servicer_functions=SERVICERS, max_body_bytes=MAX_MESSAGE)
        (head,) = [p for p in proxies().values() if p["head"]]
        host, port = head["grpc_address"]
        _STATE["target"] = f"{host}:{port}"
        with grpc.insecure_channel(_STATE["target"],
                                   options=[("grpc.max_receive_message_length", MAX_MESSAGE)]) as channel:
            _STATE["channel"] = channel
            yield
    finally:
        _STATE.clear()
        next(gen, None)


@pytest.fixture(autouse=True)
def _fresh_applications():
    """What a case ran is deleted after it (Serve's fixtures shut Serve down): its routes go at once."""
    yield
    for name in list(serve._APPS):
        try:
            serve.delete(name, _blocking=False)
        except rc.RankcoreError:
            pass


def channel() -> grpc.Channel:
    return _STATE["channel"]


def start(**grpc_options: Any) -> None:
    """Serve's ``serve.start(grpc_options=gRPCOptions(port=9000, grpc_servicer_functions=...))``: here
    the running proxies' free gRPC port (0: the one they have) and the module's services."""
    serve.start(grpc_options=serve.gRPCOptions(port=0, grpc_servicer_functions=list(SERVICERS), **grpc_options))


def request() -> Any:
    """Serve's ``UserDefinedMessage(name="foo", num=30, foo="bar")``."""
    return echo_pb2.EchoRequest(text="foo", n=30)


def on(app: str, *more: tuple[str, str]) -> tuple:
    return (("application", app), *more)


def list_applications(ch: grpc.Channel) -> list[str]:
    """Serve's ``RayServeAPIService.ListApplications`` is rankcore's ``/rankcore.RankcoreAPIService/
    ListApplications`` (well-known types: docs/ray.md, "### gRPC")."""
    call = ch.unary_unary("/rankcore.RankcoreAPIService/ListApplications",
                          request_serializer=empty_pb2.Empty.SerializeToString,
                          response_deserializer=struct_pb2.ListValue.FromString)
    response, rendezvous = call.with_call(empty_pb2.Empty(), timeout=30)
    assert rendezvous.code() == grpc.StatusCode.OK
    return list(response)


def healthz(ch: grpc.Channel) -> str:
    call = ch.unary_unary("/rankcore.RankcoreAPIService/Healthz",
                          request_serializer=empty_pb2.Empty.SerializeToString,
                          response_deserializer=wrappers_pb2.StringValue.FromString)
    response, rendezvous = call.with_call(empty_pb2.Empty(), timeout=30)
    assert rendezvous.code() == grpc.StatusCode.OK
    return response.value


def request_id_of(call: Any) -> str | None:
    for key, value in call.trailing_metadata() or ():
        if key == "request_id":
            return value
    return None


@ray.remote(num_cpus=0)
class Signal:
    """Serve's ``SignalActor``: ``wait`` returns once ``send`` was called (``clear``: wakes the
    waiters, then waits again)."""

    def __init__(self):
        self.ready = asyncio.Event()

    async def send(self, clear: bool = False):
        self.ready.set()
        if clear:
            await asyncio.sleep(0)
            self.ready.clear()

    async def wait(self):
        await self.ready.wait()


# ------------------------------------------------------------------ Serve's grpc_deployment.py
@serve.deployment(ray_actor_options=CPU)
class GrpcDeployment:
    """Serve's ``GrpcDeployment`` (``g``): ``__call__`` is ``Say``, ``Method1`` is ``Loud``, ``Streaming``
    is ``Count``; and its ``Method2`` with a multiplexed loader (Serve's ``MultiplexedGrpcDeployment``)
    is ``Nap``."""

    def Say(self, request):
        return echo_pb2.EchoReply(text=f"Hello {request.text} from bar", replica=str(request.n * 2))

    def Loud(self, request):
        return echo_pb2.EchoReply(text=f"Hello {request.text} from method1", replica=str(request.n * 3))

    def Count(self, request):
        for i in range(10):
            yield echo_pb2.EchoReply(text=f"{i}: Hello {request.text} from bar", replica=str(request.n * 2 + i))

    @serve.multiplexed(max_num_models_per_replica=1)
    async def get_model(self, model_id: str) -> str:
        return f"loading model: {model_id}"

    async def Nap(self, request):
        model = await self.get_model(serve.get_multiplexed_model_id())
        return echo_pb2.EchoReply(text=f"Method2 called model, {model}")


def g(name: str) -> Any:
    """Serve's ``g`` (``GrpcDeployment.options(name="grpc-deployment").bind()``), under ``name``."""
    return GrpcDeployment.options(name=name).bind()


@serve.deployment(ray_actor_options={"num_cpus": 0})
class FruitMarket:
    """Serve's ``FruitMarket``: ``FruitStand(FruitAmounts(orange=4, apple=8))`` is ``Loud`` of
    ``EchoRequest(text="4,8")`` (oranges, apples), the costs the reply's text."""

    def __init__(self, orange_stand, apple_stand):
        self.directory = {"ORANGE": orange_stand, "APPLE": apple_stand}

    async def Loud(self, request):
        orange, apple = (int(x) for x in request.text.split(","))
        costs = await self.check_price({"ORANGE": orange, "APPLE": apple})
        return echo_pb2.EchoReply(text=f"{costs:g}")

    async def check_price(self, inputs):
        costs = 0.0
        for fruit, amount in inputs.items():
            costs += await self.directory[fruit].remote(int(amount))
        return costs


@serve.deployment(ray_actor_options={"num_cpus": 0})
class OrangeStand:
    def __init__(self):
        self.price = 2.0

    def __call__(self, num_oranges: int):
        return num_oranges * self.price


@serve.deployment(ray_actor_options={"num_cpus": 0})
class AppleStand:
    def __init__(self):
        self.price = 3.0

    def __call__(self, num_apples: int):
        return num_apples * self.price


def g2(name: str) -> Any:
    """Serve's ``g2``: the market composing two stands (deployment names of the case's own)."""
    return FruitMarket.options(name=name).bind(OrangeStand.options(name=f"{name}-orange").bind(),
                                               AppleStand.options(name=f"{name}-apple").bind())


def ping_call_method(app: str, *, not_found: bool = False) -> None:
    stub = echo_pb2_grpc.EchoStub(channel())
    if not_found:
        with pytest.raises(grpc.RpcError) as err:
            stub.Say.with_call(request(), metadata=on(app), timeout=30)
        assert err.value.code() == grpc.StatusCode.NOT_FOUND
        assert f"Application '{app}' not found." in err.value.details()
        return
    response, call = stub.Say.with_call(request(), metadata=on(app), timeout=60)
    assert call.code() == grpc.StatusCode.OK and response.text == "Hello foo from bar"


# ================================================================== test_grpc.py
def test_serving_grpc_requests():
    start()
    ping_call_method("default", not_found=True)  # (nothing runs yet)

    serve.run(g("grpc-deployment"))
    assert healthz(channel()) == "success"
    ping_call_method("default")
    stub, shout = echo_pb2_grpc.EchoStub(channel()), echo_pb2_grpc.ShoutStub(channel())
    assert shout.Loud(request(), metadata=on("default"), timeout=60).text == "Hello foo from method1"  # Method1
    model = stub.Nap(request(), metadata=on("default", ("multiplexed_model_id", "999")), timeout=60)  # Method2
    assert model.text == "Method2 called model, loading model: 999"
    items = list(stub.Count(request(), metadata=on("default"), timeout=60))  # Streaming
    assert [r.text for r in items] == [f"{i}: Hello foo from bar" for i in range(10)]

    serve.run(g2("grpc-deployment-model-composition"))  # (replaces g in application "default": the 1st defect)
    assert shout.Loud(echo_pb2.EchoRequest(text="4,8"), metadata=on("default"), timeout=60).text == "32"
    assert list_applications(channel()) == ["default"]  # (the 2nd defect: last, so that the rest is proven)


def test_serve_start_dictionary_grpc_options():
    serve.start(grpc_options={"port": 0, "grpc_servicer_functions": list(SERVICERS)})  # (a dict, not gRPCOptions)
    serve.run(g("grpc-deployment-dict"))
    assert healthz(channel()) == "success"
    assert list_applications(channel()) == ["default"]


def test_grpc_routing_without_metadata():
    start()
    serve.run(g("grpc-deployment-app1"), name="app1", route_prefix="/app1")
    stub = echo_pb2_grpc.EchoStub(channel())
    response, call = stub.Say.with_call(request(), timeout=60)  # (one application: no metadata needed)
    assert call.code() == grpc.StatusCode.OK and response.text == "Hello foo from bar"
    response, call = stub.Say.with_call(request(), metadata=on("app1"), timeout=60)
    assert call.code() == grpc.StatusCode.OK and response.text == "Hello foo from bar"

    serve.run(g2("grpc-deployment-app2"), name="app2", route_prefix="/app2")
    with pytest.raises(grpc.RpcError) as err:  # (two: the call must name one)
        stub.Say.with_call(request(), timeout=30)
    assert err.value.code() == grpc.StatusCode.NOT_FOUND
    assert "Application metadata not set" in err.value.details()


def test_grpc_request_with_request_id():
    start()
    serve.run(g("grpc-deployment-rid"), name="app1", route_prefix="/app1")
    stub = echo_pb2_grpc.EchoStub(channel())
    _, call = stub.Say.with_call(request(), metadata=(("request_id", "fake-request-id"),), timeout=60)
    assert request_id_of(call) == "fake-request-id"
    _, call = stub.Say.with_call(request(), timeout=60)
    assert request_id_of(call) not in (None, "fake-request-id")


@pytest.mark.parametrize("streaming", [False, True])
def test_grpc_request_timeouts(streaming: bool):
    """Serve's ``gRPCOptions(request_timeout_s=0.1)``: rankcore's proxies have one ``request_timeout_s``
    for HTTP and gRPC (``grpc_options.request_timeout_s`` is accepted and ignored: docs/operate.md), so
    it is set through ``http_options`` here (given to both); Serve's words "timed out after 0.1s." are
    rankcore's "... within request_timeout_s=0.1"."""
    signal = Signal.remote()

    @serve.deployment(name=f"timeouts-{streaming}", ray_actor_options=CPU)
    class HelloModel:
        async def Say(self, request):
            await signal.wait.remote()
            return echo_pb2.EchoReply(text="hello")

        async def Count(self, request):
            for _ in range(10):
                await signal.wait.remote()
                yield echo_pb2.EchoReply(text="hello")

    serve.run(HelloModel.bind())
    serve.start(http_options={"request_timeout_s": 0.1},
                grpc_options=serve.gRPCOptions(port=0, grpc_servicer_functions=list(SERVICERS), request_timeout_s=0.1))
    try:
        stub = echo_pb2_grpc.EchoStub(channel())
        with pytest.raises(grpc.RpcError) as err:
            if streaming:
                list(stub.Count(request(), timeout=5))  # (the client's deadline: well past the proxy's 0.1 s)
            else:
                stub.Say(request(), timeout=5)
        assert err.value.code() == grpc.StatusCode.DEADLINE_EXCEEDED
        assert "request_timeout_s=0.1" in err.value.details(), err.value.details()
    finally:
        serve.start(http_options={"request_timeout_s": 60.0})
        ray.get(signal.send.remote(clear=True))  # (the handlers end: no graceful shutdown to wait out)


@pytest.mark.parametrize("streaming", [False, True])
def test_grpc_request_internal_error(streaming: bool):
    start()

    @serve.deployment(name=f"internal-error-{streaming}", ray_actor_options=CPU)
    class HelloModel:
        def Say(self, request):
            raise RuntimeError("test error case")

        def Count(self, request):  # (as Serve's Streaming: a plain method that raises, no generator)
            raise RuntimeError("test error case")

    serve.run(HelloModel.bind(), name="app1")
    stub = echo_pb2_grpc.EchoStub(channel())
    if streaming:
        rpc_error: Any = stub.Count(request(), timeout=60)  # (the call itself: its code waits for the end)
    else:
        with pytest.raises(grpc.RpcError) as err:
            stub.Say(request(), timeout=60)
        rpc_error = err.value
    assert rpc_error.code() == grpc.StatusCode.INTERNAL
    assert "test error case" in rpc_error.details()


async def _within(ref: Any, seconds: float, what: str) -> None:
    """Await ``ref`` for at most ``seconds``; past them the case fails saying ``what`` did not happen."""
    try:
        await asyncio.wait_for(ref, seconds)
    except asyncio.TimeoutError:
        pytest.fail(f"{what} within {seconds:g} s")


@pytest.mark.asyncio
# (the whole case: its setup, serve.start and serve.run, blocks the loop and counts against this on a
# loaded machine; the two waits it tests are each bounded below, and say which one did not happen)
@pytest.mark.deadline_s(240)
@pytest.mark.parametrize("streaming", [False, True])
async def test_grpc_request_cancellation(streaming: bool):
    start()
    running, cancelled = Signal.remote(), Signal.remote()

    @serve.deployment(name=f"downstream-{streaming}", ray_actor_options=CPU)
    class Downstream:
        async def wait_for_signal(self):
            try:  # (Serve's send_signal_on_cancellation: the cancellation is told to ``cancelled``)
                await running.send.remote()
                await asyncio.sleep(10000)
            except asyncio.CancelledError:
                await cancelled.send.remote()
                raise

        async def Say(self, request):
            await self.wait_for_signal()
            return echo_pb2.EchoReply(text="hello")

        async def Count(self, request):
            await self.wait_for_signal()
            yield echo_pb2.EchoReply(text="hello")

    serve.run(Downstream.bind(), name="downstream", route_prefix="/downstream")
    stub = echo_pb2_grpc.EchoStub(channel())
    if streaming:
        r: Any = stub.Count(request(), metadata=on("downstream"))
    else:
        r = stub.Say.future(request(), metadata=on("downstream"))
    await _within(running.wait.remote(), 60, "the replica's call did not begin")
    r.cancel()  # (the client cancels: the replica's call is cancelled)
    await _within(cancelled.wait.remote(), 60, "the client's cancellation did not reach the replica's call")
    with pytest.raises(grpc.FutureCancelledError):
        r.result()
    ray.get(running.send.remote(clear=True))
    ray.get(cancelled.send.remote(clear=True))


@pytest.mark.parametrize("streaming", [False, True])
def test_using_grpc_context(streaming: bool):
    start()
    trailing = ("foo", "bar")

    @serve.deployment(name=f"context-{streaming}", ray_actor_options=CPU)
    class HelloModel:
        def Say(self, request, grpc_context: serve.grpc_util.RayServegRPCContext):
            grpc_context.set_code(grpc.StatusCode.DATA_LOSS)
            grpc_context.set_details("my specific error message")
            grpc_context.set_trailing_metadata([trailing])
            return echo_pb2.EchoReply(text="hello")

        def Count(self, request, grpc_context: serve.grpc_util.RayServegRPCContext):
            grpc_context.set_code(grpc.StatusCode.DATA_LOSS)
            grpc_context.set_details("my specific error message")
            grpc_context.set_trailing_metadata([trailing])
            yield echo_pb2.EchoReply(text="hello")

    serve.run(HelloModel.bind(), name="app1")
    stub = echo_pb2_grpc.EchoStub(channel())
    with pytest.raises(grpc.RpcError) as err:
        if streaming:
            list(stub.Count(request(), timeout=60))
        else:
            stub.Say(request(), timeout=60)
    assert err.value.code() == grpc.StatusCode.DATA_LOSS
    assert err.value.details() == "my specific error message"
    assert trailing in err.value.trailing_metadata()
    assert any(key == "request_id" for key, _ in err.value.trailing_metadata())  # (always there)


@pytest.mark.parametrize("streaming", [False, True])
def test_using_grpc_context_exception(streaming: bool):
    start()

    @serve.deployment(name=f"context-exception-{streaming}", ray_actor_options=CPU)
    class HelloModel:
        def Say(self, request, grpc_context: serve.grpc_util.RayServegRPCContext):
            grpc_context.set_code(grpc.StatusCode.DATA_LOSS)
            raise RuntimeError("test error")

        def Count(self, request, grpc_context: serve.grpc_util.RayServegRPCContext):  # (no generator, as Serve's)
            grpc_context.set_code(grpc.StatusCode.DATA_LOSS)
            raise RuntimeError("test error")

    serve.run(HelloModel.bind(), name="app1")
    stub = echo_pb2_grpc.EchoStub(channel())
    with pytest.raises(grpc.RpcError) as err:
        if streaming:
            list(stub.Count(request(), timeout=60))
        else:
            stub.Say(request(), timeout=60)
    assert err.value.code() == grpc.StatusCode.DATA_LOSS  # (the code it set is kept, not INTERNAL)
    assert "test error" in err.value.details()


@pytest.mark.parametrize("streaming", [False, True])
def test_exception_without_grpc_context_code(streaming: bool):
    start()

    @serve.deployment(name=f"no-code-{streaming}", ray_actor_options=CPU)
    class HelloModel:
        def Say(self, request, grpc_context: serve.grpc_util.RayServegRPCContext):
            raise RuntimeError("test error without status code")

        def Count(self, request, grpc_context: serve.grpc_util.RayServegRPCContext):
            raise RuntimeError("test error without status code")

    serve.run(HelloModel.bind(), name="app1")
    stub = echo_pb2_grpc.EchoStub(channel())
    with pytest.raises(grpc.RpcError) as err:
        if streaming:
            list(stub.Count(request(), timeout=60))
        else:
            stub.Say(request(), timeout=60)
    assert err.value.code() == grpc.StatusCode.INTERNAL
    assert "test error without status code" in err.value.details()


def _bad_signature(issue: str, name: str) -> Any:
    """Serve's two ``HelloModel``s whose methods cannot be called as a gRPC call calls them."""
    if issue == "incorrect_spelling":
        @serve.deployment(name=name, ray_actor_options=CPU)
        class HelloModel:
            def Say(self, request, grpc_context_incorrect_spelling):
                grpc_context_incorrect_spelling.set_code(grpc.StatusCode.DATA_LOSS)
                return echo_pb2.EchoReply(text="hello")

            def Count(self, request, grpc_context_incorrect_spelling):
                grpc_context_incorrect_spelling.set_code(grpc.StatusCode.DATA_LOSS)
                yield echo_pb2.EchoReply(text="hello")

        return HelloModel

    @serve.deployment(name=name, ray_actor_options=CPU)
    class HelloModelMoreArgs:
        def Say(self, request, grpc_context, extra_required_arg):
            grpc_context.set_code(grpc.StatusCode.DATA_LOSS)
            return echo_pb2.EchoReply(text="hello")

        def Count(self, request, grpc_context, extra_required_arg):
            grpc_context.set_code(grpc.StatusCode.DATA_LOSS)
            yield echo_pb2.EchoReply(text="hello")

    return HelloModelMoreArgs


@pytest.mark.parametrize("streaming", [False, True])
@pytest.mark.parametrize("issue", ["incorrect_spelling", "more_args"])
def test_using_grpc_context_bad_function_signature(streaming: bool, issue: str):
    start()
    model = _bad_signature(issue, f"bad-signature-{issue}-{streaming}")
    serve.run(model.bind(), name="app1")
    stub = echo_pb2_grpc.EchoStub(channel())
    with pytest.raises(grpc.RpcError) as err:
        if streaming:
            list(stub.Count(request(), timeout=60))
        else:
            stub.Say(request(), timeout=60)
    assert err.value.code() == grpc.StatusCode.INTERNAL
    assert "missing 1 required positional argument:" in err.value.details(), err.value.details()
    missing = "grpc_context_incorrect_spelling" if issue == "incorrect_spelling" else "extra_required_arg"
    assert missing in err.value.details()


def test_grpc_client_sending_large_payload():
    """Above gRPC's default 4 MiB message: rankcore takes a message up to ``max_body_bytes`` (default
    1 MiB, docs/ray.md "### gRPC"; the module's proxies start with 8 MiB), Serve's proxy any size."""
    start()
    serve.run(g("grpc-deployment-large"))
    large = "foobar" * 1_000_000
    response = echo_pb2_grpc.EchoStub(channel()).Say(echo_pb2.EchoRequest(text=large, n=30), metadata=on("default"),
                                                    timeout=120)
    assert response == echo_pb2.EchoReply(text=f"Hello {large} from bar", replica="60")


@pytest.mark.skip(reason=CLIENT_STREAMING)
def test_grpc_client_streaming():
    pass


def test_grpc_unary_not_found():
    start()
    serve.run(g("grpc-deployment-nf1"), name="app1", route_prefix="/app1")
    serve.run(g("grpc-deployment-nf2"), name="app2", route_prefix="/app2")  # (two: the call must name one)
    with pytest.raises(grpc.RpcError) as err:
        echo_pb2_grpc.EchoStub(channel()).Say.with_call(request(), metadata=on("nonexistent_app"), timeout=30)
    assert err.value.code() == grpc.StatusCode.NOT_FOUND


@pytest.mark.skip(reason=CLIENT_STREAMING)
def test_grpc_client_streaming_not_found():
    pass


@pytest.mark.skip(reason=CLIENT_STREAMING)
def test_grpc_bidirectional_streaming():
    pass


@pytest.mark.skip(reason=CLIENT_STREAMING)
def test_grpc_client_streaming_with_grpc_context():
    pass


@pytest.mark.skip(reason=CLIENT_STREAMING)
def test_grpc_bidirectional_streaming_with_grpc_context():
    pass


@pytest.mark.skip(reason=CLIENT_STREAMING)
@pytest.mark.parametrize("streaming_type", ["client", "bidi"])
def test_grpc_streaming_internal_error(streaming_type: str):
    pass


@pytest.mark.skip(reason=CLIENT_STREAMING)
@pytest.mark.parametrize("streaming_type", ["client", "bidi"])
def test_grpc_streaming_timeout(streaming_type: str):
    pass


@pytest.mark.skip(reason=CLIENT_STREAMING)
def test_grpc_client_streaming_empty_stream():
    pass


@pytest.mark.skip(reason=CLIENT_STREAMING)
def test_grpc_bidi_streaming_empty_stream():
    pass


@pytest.mark.skip(reason=CLIENT_STREAMING)
@pytest.mark.parametrize("streaming_type", ["client", "bidi"])
def test_grpc_streaming_cancellation(streaming_type: str):
    pass


@pytest.mark.skip(reason=CLIENT_STREAMING)
@pytest.mark.parametrize("streaming_type", ["client", "bidi"])
def test_grpc_streaming_context_with_exception(streaming_type: str):
    pass


@pytest.mark.skip(reason=CLIENT_STREAMING)
@pytest.mark.parametrize("streaming_type", ["client", "bidi"])
def test_grpc_streaming_backpressure(streaming_type: str):
    pass


@pytest.mark.skip(reason=CLIENT_STREAMING)
@pytest.mark.parametrize("streaming_type", ["client", "bidi"])
def test_grpc_streaming_client_error_mid_stream(streaming_type: str):
    pass


@pytest.mark.skip(reason=CLIENT_STREAMING)
def test_grpc_streaming_client_closes_channel_mid_stream():
    pass


# ================================================================== unit/test_grpc_util.py
def add_test_servicer_to_server(servicer: Any, server: Any) -> None:
    """Serve's hand-written servicer function: one unary method of ``google.protobuf.Any``, registered
    through ``add_generic_rpc_handlers`` alone (as grpcio-tools older than 1.62 generates them)."""
    handlers = {"ServeRoutes": grpc.unary_unary_rpc_method_handler(
        servicer.ServeRoutes, request_deserializer=any_pb2.Any.FromString,
        response_serializer=any_pb2.Any.SerializeToString)}
    server.add_generic_rpc_handlers((grpc.method_handlers_generic_handler("ray.serve.ServeAPIService", handlers),))


def test_grpc_server():
    """Serve checks its server keeps the handlers a servicer function adds, each method's full name
    served by the proxy's own handler of its kind: here the proxy's gRPC front (``GrpcFront``) given
    that function."""
    from executors.ray_gpu.base.grpc_proxy import GrpcFront
    from executors.ray_gpu.ingress.calls import _cancel
    from executors.ray_gpu.ingress.http import IngressState

    front = GrpcFront(IngressState({}, {}, 1 << 20, 30.0), [f"{__name__}.add_test_servicer_to_server"], _cancel)
    assert list(front.services) == ["ray.serve.ServeAPIService"]
    handler = front._services.handlers["/ray.serve.ServeAPIService/ServeRoutes"]
    assert handler.unary_unary is not None and handler.unary_stream is None


def test_ray_serve_grpc_context_serializable():
    class FakeGrpcContext:  # (Serve's: what a grpc.ServicerContext answers)
        def auth_context(self):
            return {"transport_security_type": [b"insecure"]}

        def code(self):
            return grpc.StatusCode.OK

        def details(self):
            return "some details"

        def invocation_metadata(self):
            return (("application", "app1"), ("request_id", "rid"))

        def peer(self):
            return "ipv4:127.0.0.1:1234"

        def peer_identities(self):
            return None

        def peer_identity_key(self):
            return None

        def trailing_metadata(self):
            return (("request_id", "rid"),)

    context = serve.grpc_util.RayServegRPCContext(FakeGrpcContext())
    assert pickle.loads(pickle.dumps(context)).__dict__ == context.__dict__
    assert pickle.loads(cloudpickle.dumps(context)).__dict__ == context.__dict__


def test_add_grpc_address():
    """Serve's private ``add_grpc_address(server, address)`` binds the server to the address: here the
    proxy's gRPC front listens where it is told (a free port asked, the one bound given back)."""
    from executors.ray_gpu.base.grpc_proxy import GrpcFront
    from executors.ray_gpu.ingress.calls import _cancel
    from executors.ray_gpu.ingress.http import IngressState

    front = GrpcFront(IngressState({}, {}, 1 << 20, 30.0), [ECHO], _cancel)

    async def main() -> tuple[tuple[str, int], str]:
        address = await front.start("127.0.0.1", 0)
        try:
            async with grpc.aio.insecure_channel(f"{address[0]}:{address[1]}") as ch:
                call = ch.unary_unary("/rankcore.RankcoreAPIService/Healthz",
                                      request_serializer=empty_pb2.Empty.SerializeToString,
                                      response_deserializer=wrappers_pb2.StringValue.FromString)
                return address, (await call(empty_pb2.Empty(), timeout=10)).value
        finally:
            await front.stop(0)

    (host, port), answer = asyncio.run(main())
    assert host == "127.0.0.1" and port > 0 and front.address == (host, port) and answer == "success"


@pytest.mark.skip(reason=(
    "differs (documented): past max_queued_requests rankcore's gRPC proxy answers UNAVAILABLE, where Serve's "
    "BackPressureError is RESOURCE_EXHAUSTED since 2.50 (docs/ray.md, \"### gRPC\": \"the issue asked for "
    "UNAVAILABLE\"); rankcore's code is covered by tests/integration/test_ray_grpc.py::"
    "test_overloaded_is_unavailable_and_a_cancelled_call_frees_its_slot"))
def test_get_grpc_response_status_backpressure_error():
    pass

