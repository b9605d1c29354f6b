"""A replica's own gRPC server (executors/ray_gpu/replica/direct_grpc.py, the direct data plane,
issue 65), on an event loop of the test's with plain functions for the replica: the proxy's gRPC
server (``GrpcFront``) answering from the replica itself: its calls, streams, codes, deadlines and
metrics."""

from __future__ import annotations

import asyncio

import grpc
import pytest

from executors.ray_gpu.base.exposed import Reachable
from executors.ray_gpu.replica import direct_grpc
from tests.integration.protos import echo_pb2, echo_pb2_grpc

SERVICERS = ["tests.integration.protos.echo_pb2_grpc.add_EchoServicer_to_server"]


class Replica:
    def __init__(self) -> None:
        self.requests: list = []
        self.cancelled: list = []
        self.metrics: list = []
        self.closed: list = []  # (streams whose generator ended: their slot freed)
        self.began: list = []  # (calls whose begin marker went out)

    async def run(self, method, args, kwargs, request, on_begin):
        self.requests.append((method, request))
        await self._begin(on_begin, request)
        (msg,) = args
        if method == "Nap":
            try:
                await asyncio.sleep(msg.seconds)
            except asyncio.CancelledError:
                self.cancelled.append(request.request_id)
                raise
            return echo_pb2.EchoReply(text="awake")
        if msg.text == "boom":
            raise ValueError("says boom")
        return echo_pb2.EchoReply(text=msg.text.upper(), replica=request.request_id)

    async def _begin(self, on_begin, request) -> None:
        """As the replica's slot: the begin marker (the call's initial metadata) before the method."""
        assert on_begin is not None
        self.began.append(request.request_id)  # (before its await: the client may have the marker first)
        await on_begin()

    async def stream(self, method, args, kwargs, request, on_begin):
        await self._begin(on_begin, request)
        (msg,) = args
        if msg.seconds:
            try:
                await asyncio.sleep(msg.seconds)  # (before its first item)
            except asyncio.CancelledError:
                self.cancelled.append(request.request_id)
                raise
        try:
            for i in range(msg.n):
                yield echo_pb2.EchoReply(text=str(i))
                if msg.text == "slow":
                    await asyncio.sleep(0.05)
        finally:
            self.closed.append(request.request_id)


class Metrics:
    def __init__(self) -> None:
        self.calls: list = []

    def grpc_started(self) -> None:
        pass

    def grpc_ended(self) -> None:
        pass

    def grpc_request(self, **kw) -> None:
        self.calls.append((kw["method"], kw["deployment"], kw["code"]))


async def _until(done, seconds: float = 2.0) -> None:
    """Wait until ``done()`` (at most ``seconds``): the server counts a call as its handler ends, which
    may trail the client's answer."""
    for _ in range(int(seconds / 0.01)):
        if done():
            return
        await asyncio.sleep(0.01)


def _run(scenario, request_timeout_s: float | None = 5.0) -> None:
    async def main() -> None:
        rep, metrics = Replica(), Metrics()
        reach = Reachable(http=frozenset(), grpc=frozenset({"Say", "Count", "Nap"}))
        limits = {"max_body_bytes": 1 << 20, "max_header_bytes": 16 << 10, "request_timeout_s": request_timeout_s}
        front = await direct_grpc.start("dep", reach, rep.run, rep.stream, metrics, limits, SERVICERS, "127.0.0.1")
        try:
            async with grpc.aio.insecure_channel(f"127.0.0.1:{front.address[1]}") as ch:
                stub = echo_pb2_grpc.EchoStub(ch)
                stub.channel = ch  # (a scenario may call a method another way)
                await scenario(stub, rep, metrics)
        finally:
            await front.stop(0)
    asyncio.run(main())


def test_a_call_whatever_application_it_names_is_this_replica_s():
    async def scenario(stub, rep, metrics):
        reply = await stub.Say(echo_pb2.EchoRequest(text="hi"), metadata=(("application", "anything"),
                                                                         ("request_id", "rid-1")))
        assert reply.text == "HI" and reply.replica == "rid-1"
        assert rep.requests[-1][0] == "Say" and rep.requests[-1][1].request_id == "rid-1"
        items = [r.text async for r in stub.Count(echo_pb2.EchoRequest(n=3))]
        assert items == ["0", "1", "2"]
        with pytest.raises(grpc.aio.AioRpcError) as err:
            await stub.Say(echo_pb2.EchoRequest(text="boom"))
        assert err.value.code() == grpc.StatusCode.INTERNAL and "ValueError: says boom" in err.value.details()
        await _until(lambda: len(metrics.calls) == 3)
        assert [c[2] for c in metrics.calls] == ["OK", "OK", "INTERNAL"]
        assert metrics.calls[0][:2] == ("/rankcore.test.Echo/Say", "dep")
    _run(scenario)


def test_past_request_timeout_s_a_call_and_a_stream_end_deadline_exceeded_and_are_cancelled():
    async def scenario(stub, rep, metrics):
        with pytest.raises(grpc.aio.AioRpcError) as err:
            await stub.Nap(echo_pb2.EchoRequest(seconds=5.0), metadata=(("request_id", "napper"),))
        assert err.value.code() == grpc.StatusCode.DEADLINE_EXCEEDED
        assert "request_timeout_s=0.3" in err.value.details()
        with pytest.raises(grpc.aio.AioRpcError) as err:  # (a stream whose first item comes too late)
            _ = [r async for r in stub.Count(echo_pb2.EchoRequest(n=2, seconds=5.0),
                                             metadata=(("request_id", "streamer"),))]
        assert err.value.code() == grpc.StatusCode.DEADLINE_EXCEEDED
        await _until(lambda: len(rep.cancelled) == 2 and len(metrics.calls) == 2)
        assert sorted(rep.cancelled) == ["napper", "streamer"]
        assert [c[2] for c in metrics.calls] == ["DEADLINE_EXCEEDED", "DEADLINE_EXCEEDED"]
    _run(scenario, request_timeout_s=0.3)


def test_a_client_that_cancels_cancels_the_call():
    async def scenario(stub, rep, metrics):
        call = stub.Nap(echo_pb2.EchoRequest(seconds=30.0), metadata=(("request_id", "leaver"),))
        for _ in range(100):
            if rep.requests:
                break
            await asyncio.sleep(0.01)
        call.cancel()
        for _ in range(200):
            if rep.cancelled:
                break
            await asyncio.sleep(0.01)
        assert rep.cancelled == ["leaver"]
    _run(scenario)


def test_a_stream_its_client_leaves_mid_way_is_closed_on_the_replica():
    async def scenario(stub, rep, metrics):
        call = stub.Count(echo_pb2.EchoRequest(n=10_000, text="slow"), metadata=(("request_id", "mid"),))
        got = 0
        async for _ in call:
            got += 1
            if got == 3:
                call.cancel()
                break
        for _ in range(200):
            if rep.closed:
                break
            await asyncio.sleep(0.01)
        assert rep.closed == ["mid"]
    _run(scenario)


def test_a_call_gets_its_initial_metadata_as_it_begins_long_before_its_answer():
    """The begin marker the balancer heeds (``rankcore.requests.dataplane.GRPC_RETRY_ON``): a call
    that got no initial metadata never began, so HAProxy may send it to another replica. (A unary
    call is read here as a stream of one: grpc.aio hands a unary call's initial metadata over only
    with its answer, whenever it came.)"""
    async def scenario(stub, rep, metrics):
        nap = stub.channel.unary_stream("/rankcore.test.Echo/Nap", request_serializer=echo_pb2.EchoRequest.SerializeToString,
                                        response_deserializer=echo_pb2.EchoReply.FromString)
        for call in (nap(echo_pb2.EchoRequest(seconds=2.0), metadata=(("request_id", "napper"),)),
                     stub.Count(echo_pb2.EchoRequest(n=1, seconds=2.0), metadata=(("request_id", "streamer"),))):
            t0 = asyncio.get_running_loop().time()
            got = await asyncio.wait_for(call.initial_metadata(), 1.0)  # (the method sleeps 2 s before answering)
            assert ("rankcore-began", "1") in tuple(got) and not call.done()
            assert asyncio.get_running_loop().time() - t0 < 1.0
            call.cancel()
        assert sorted(rep.began) == ["napper", "streamer"]  # (both reached their marker: any order)
    _run(scenario)
