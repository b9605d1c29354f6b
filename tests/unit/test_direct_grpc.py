"""A replica's own gRPC server (executors/ray_gpu/replica/direct_grpc.py, the direct data plane,
issue 65), on an event loop of the test's with plain functions for the replica: the proxy's gRPC
server (``GrpcFront``) answering from the replica itself: its calls, streams, codes, deadlines and
metrics."""

from __future__ import annotations

import asyncio
import contextlib
import tempfile
import time

import grpc
import pytest

from executors.ray_gpu.base.exposed import Reachable
from executors.ray_gpu.replica import direct_grpc
from tests.helpers import load_benchmark
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


@contextlib.contextmanager
def _balancer(server_ports: list[int], tmp: str):
    """HAProxy as the data plane runs it for gRPC, in front of these servers (HTTP/1.1 to them:
    ``base.grpc_h1``; benchmarks/bench_grpc_wire.py's, one configuration for both). Its port."""
    with contextlib.ExitStack() as stack:
        _, port = load_benchmark("bench_grpc_wire").start_haproxy(stack, "h1", server_ports, tmp)
        yield port


def _run(scenario, request_timeout_s: float | None = 5.0, max_body_bytes: int = 1 << 20, before=None) -> None:
    """``scenario(stub, rep, metrics)`` against the replica's server behind HAProxy; ``before``: an
    async context manager of another server's port, put before the replica's in HAProxy's turn."""
    async def main(tmp: str) -> None:
        rep, metrics = Replica(), Metrics()
        reach = Reachable(http=frozenset(), grpc=frozenset({"Say", "Count", "Nap"}))
        limits = {"max_body_bytes": max_body_bytes, "max_header_bytes": 16 << 10,
                  "request_timeout_s": request_timeout_s}
        front = await direct_grpc.start("dep", reach, rep.run, rep.stream, metrics, limits, SERVICERS, "127.0.0.1")
        try:
            async with (before() if before is not None else contextlib.nullcontext([])) as other:
                with _balancer([*other, front.address[1]], tmp) as port:
                    async with grpc.aio.insecure_channel(f"127.0.0.1:{port}") as ch:
                        stub = echo_pb2_grpc.EchoStub(ch)
                        stub.channel = ch  # (a scenario may call a method another way)
                        await scenario(stub, rep, metrics)
        finally:
            front.h1.close()
    with tempfile.TemporaryDirectory() as tmp:
        asyncio.run(main(tmp))


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
        nap = stub.channel.unary_stream("/rankcore.test.Echo/Nap",
                                        request_serializer=echo_pb2.EchoRequest.SerializeToString,
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


def _dying_server(answer_first: bytes):
    """A replica that dies with a call: it reads the request, writes ``answer_first`` (b"": nothing)
    and closes the connection. Counts what it was sent."""
    seen: list[bytes] = []

    @contextlib.asynccontextmanager
    async def serve():
        async def dies(reader, writer):
            seen.append(await reader.read(65536))
            writer.write(answer_first)
            await writer.drain()
            writer.transport.abort()
        server = await asyncio.start_server(dies, "127.0.0.1", 0)
        try:
            yield [server.sockets[0].getsockname()[1]]
        finally:
            server.close()
    return serve, seen


def test_a_call_a_dying_replica_got_nothing_back_from_is_sent_to_another():
    """The safe re-send, through HAProxy as the data plane configures it: no byte back, so the call
    never began there, and another replica answers it."""
    serve, seen = _dying_server(b"")

    async def scenario(stub, rep, metrics):
        for i in range(4):  # (HAProxy's turn sends every other call to the dying one first)
            reply = await stub.Say(echo_pb2.EchoRequest(text=f"c{i}"))
            assert reply.text == f"C{i}"
        assert [m[0] for m in rep.requests] == ["Say"] * 4
        assert len(seen) >= 2 and all(b"/rankcore.test.Echo/Say" in s for s in seen)
    _run(scenario, before=serve)


def test_a_call_whose_begin_marker_came_back_is_never_sent_again():
    """The other side of the re-send: a replica that wrote the answer's head (the begin marker:
    ``base.grpc_h1``) and died may have run the call, so the client gets an error, not a second run."""
    serve, seen = _dying_server(b"HTTP/1.1 200 OK\r\ncontent-type: application/grpc\r\n"
                                b"transfer-encoding: chunked\r\nrankcore-began: 1\r\n\r\n")

    async def scenario(stub, rep, metrics):
        codes = []
        for i in range(4):
            try:
                await stub.Say(echo_pb2.EchoRequest(text=f"c{i}"))
                codes.append("OK")
            except grpc.aio.AioRpcError as err:
                codes.append(err.code().name)
        assert len(seen) == codes.count("OK") == 2 and len(rep.requests) == 2
        assert all(c != "OK" for c in codes[::2]), codes  # (the dying one's turns: failed, not re-sent)
    _run(scenario, before=serve)


def test_a_client_deadline_ends_the_call_deadline_exceeded_and_cancels_it():
    async def scenario(stub, rep, metrics):
        with pytest.raises(grpc.aio.AioRpcError) as err:
            await stub.Nap(echo_pb2.EchoRequest(seconds=5.0), metadata=(("request_id", "late"),), timeout=0.3)
        assert err.value.code() == grpc.StatusCode.DEADLINE_EXCEEDED
        await _until(lambda: rep.cancelled == ["late"] and len(metrics.calls) == 1)
        assert rep.cancelled == ["late"] and metrics.calls[0][2] == "CANCELLED"
    _run(scenario)


def test_codes_trailing_metadata_compression_and_limits_over_the_balancer():
    async def scenario(stub, rep, metrics):
        call = stub.Say(echo_pb2.EchoRequest(text="hi"), metadata=(("request_id", "rid-7"),))
        assert (await call).text == "HI"
        assert ("request_id", "rid-7") in tuple(await call.trailing_metadata())
        assert await call.code() == grpc.StatusCode.OK
        await stub.Say(echo_pb2.EchoRequest(text="m"), metadata=(("multiplexed_model_id", "first"),
                                                                 ("multiplexed_model_id", "last")))
        assert rep.requests[-1][1].multiplexed_model_id == "last"  # (a key sent twice: its last value)
        zipped = await stub.Say(echo_pb2.EchoRequest(text="z" * 1500), compression=grpc.Compression.Gzip)
        assert zipped.text == "Z" * 1500
        nowhere = stub.channel.unary_unary("/rankcore.test.Echo/Nowhere",
                                           request_serializer=echo_pb2.EchoRequest.SerializeToString,
                                           response_deserializer=echo_pb2.EchoReply.FromString)
        with pytest.raises(grpc.aio.AioRpcError) as err:
            await nowhere(echo_pb2.EchoRequest())
        assert err.value.code() == grpc.StatusCode.UNIMPLEMENTED
        assert echo_pb2.EchoRequest(text="x" * 1997).ByteSize() == 2000  # (a message of max_body_bytes: served)
        assert (await stub.Say(echo_pb2.EchoRequest(text="x" * 1997))).text == "X" * 1997
        for text in ("x" * 1998, "x" * 3000):
            with pytest.raises(grpc.aio.AioRpcError) as err:
                await stub.Say(echo_pb2.EchoRequest(text=text))
            assert err.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
            assert "max_body_bytes=2000" in err.value.details()
        exhausted = ("/rankcore.test.Echo/Say", "dep", "RESOURCE_EXHAUSTED")
        await _until(lambda: metrics.calls.count(exhausted) == 2)
        assert metrics.calls.count(exhausted) == 2  # (refused before a handler ran, and counted all the same)
        with pytest.raises(grpc.aio.AioRpcError) as err:
            await stub.Say(echo_pb2.EchoRequest(text="boom"), metadata=(("request_id", "rid-8"),))
        assert err.value.code() == grpc.StatusCode.INTERNAL and "says boom" in err.value.details()
        assert ("request_id", "rid-8") in tuple(err.value.trailing_metadata())
    _run(scenario, max_body_bytes=2000)


def test_the_http_1_1_wire_s_words():
    """``base.grpc_h1``: the deadline header, the trailers (details percent-encoded, metadata checked
    as gRPC checks it) and the call's metadata (HTTP's own headers left out, ``-bin`` decoded)."""
    from executors.ray_gpu.base import grpc_h1

    assert grpc_h1.timeout_of(b"100m") == pytest.approx(0.1) and grpc_h1.timeout_of(b"2S") == 2.0
    assert grpc_h1.timeout_of(b"5x") is None and grpc_h1.timeout_of(None) is None
    end = grpc_h1.trailers(grpc.StatusCode.NOT_FOUND, "no app: é 100%\r\nx", (("request_id", "r1"),))
    assert end == b"0\r\ngrpc-status: 5\r\ngrpc-message: no app: %C3%A9 100%25%0D%0Ax\r\nrequest_id: r1\r\n\r\n"
    for bad in ((("Upper", "v"),), (("k", "line\r\nbreak"),), (("k-bin", "text"),), (("grpc-status", "0"),)):
        with pytest.raises(ValueError):
            grpc_h1.trailers(grpc.StatusCode.OK, None, bad)
    ctx = grpc_h1.H1Context(None, {b"host": b"h", b"content-type": b"application/grpc", b"te": b"trailers",
                                   b"grpc-timeout": b"1S", b"application": b"app", b"x-rankcore-route": b"/r",
                                   b"blob-bin": b"AAEC"}, None)
    assert dict(ctx.invocation_metadata()) == {"application": "app", "blob-bin": b"\x00\x01\x02"}
    with pytest.raises(ValueError):
        ctx.set_trailing_metadata((("k", "bad\nvalue"),))
    assert ctx.trailing_metadata() == ()


def test_the_server_s_own_wire_its_deadline_and_a_malformed_message():
    """The replica's server spoken to in HTTP/1.1 as HAProxy speaks it, no balancer: the head with the
    begin marker, the framed message, the trailers; the client's ``grpc-timeout`` ended by the server
    itself (``DEADLINE_EXCEEDED``, the call cancelled); a body that is not one message ``INTERNAL``;
    all on one kept-alive connection."""
    import gzip
    import struct
    import zlib

    def call(path: str, body: bytes, *extra: bytes) -> bytes:
        head = b"".join(e + b"\r\n" for e in extra)
        return (b"POST %s HTTP/1.1\r\nhost: r\r\ncontent-type: application/grpc\r\nte: trailers\r\n%s"
                b"content-length: %d\r\n\r\n%s" % (path.encode(), head, len(body), body))

    def framed(msg) -> bytes:
        data = msg.SerializeToString()
        return b"\x00" + struct.pack(">I", len(data)) + data

    async def answer(reader) -> bytes:
        data = b""
        while b"grpc-status" not in data or not data.endswith(b"\r\n\r\n"):
            data += await asyncio.wait_for(reader.read(65536), 5.0)
        return data

    async def main() -> None:
        rep, metrics = Replica(), Metrics()
        reach = Reachable(http=frozenset(), grpc=frozenset({"Say", "Count", "Nap"}))
        limits = {"max_body_bytes": 1 << 20, "max_header_bytes": 16 << 10, "request_timeout_s": 30.0}
        front = await direct_grpc.start("dep", reach, rep.run, rep.stream, metrics, limits, SERVICERS, "127.0.0.1")
        reader, writer = await asyncio.open_connection("127.0.0.1", front.address[1])
        try:
            t0 = time.monotonic()
            writer.write(call("/rankcore.test.Echo/Nap", framed(echo_pb2.EchoRequest(seconds=5.0)),
                              b"grpc-timeout: 200m", b"request_id: late"))
            got = await answer(reader)
            assert time.monotonic() - t0 < 3.0 and rep.cancelled == ["late"]
            assert got.startswith(b"HTTP/1.1 200 OK\r\ncontent-type: application/grpc\r\n"
                                  b"transfer-encoding: chunked\r\n")
            assert got.split(b"\r\n\r\n")[0].endswith(b"\r\nrankcore-began: 1")  # (the head: the marker)
            assert got.endswith(b"\r\n\r\n0\r\ngrpc-status: 4\r\ngrpc-message: Deadline Exceeded\r\n"
                                b"request_id: late\r\n\r\n")
            writer.write(call("/rankcore.test.Echo/Say", framed(echo_pb2.EchoRequest(text="hi")), b"request_id: r2"))
            got = await answer(reader)
            reply = echo_pb2.EchoReply(text="HI", replica="r2").SerializeToString()
            frame = b"\x00" + struct.pack(">I", len(reply)) + reply
            assert b"\r\n\r\n%x\r\n%s\r\n0\r\ngrpc-status: 0\r\nrequest_id: r2\r\n\r\n" % (len(frame), frame) in got
            writer.write(call("/rankcore.test.Echo/Say", framed(echo_pb2.EchoRequest(text="x"))[:-1]))
            got = await answer(reader)
            assert b"grpc-status: 13\r\n" in got and b"not one message" in got
            deflated = zlib.compress(echo_pb2.EchoRequest(text="dd").SerializeToString())
            writer.write(call("/rankcore.test.Echo/Say", b"\x01" + struct.pack(">I", len(deflated)) + deflated,
                              b"grpc-encoding: deflate"))
            got = await answer(reader)
            assert b"grpc-status: 0\r\n" in got and echo_pb2.EchoReply(text="DD").SerializeToString() in got
            zipped = gzip.compress(echo_pb2.EchoRequest(text="zz").SerializeToString())
            for cut in (zipped[:10], zipped + b"junk"):  # (a gzip message cut short, or with bytes after it)
                writer.write(call("/rankcore.test.Echo/Say", b"\x01" + struct.pack(">I", len(cut)) + cut,
                                  b"grpc-encoding: gzip"))
                got = await answer(reader)
                assert b"grpc-status: 13\r\n" in got and b"not whole" in got, got
            writer.write(call("/rankcore.test.Echo/Say", framed(echo_pb2.EchoRequest(text="x")))
                         .replace(b"application/grpc", b"application/grpc-web"))
            assert b"grpc-status: 12\r\n" in await answer(reader)  # (UNIMPLEMENTED: not gRPC's own type)
            await _until(lambda: len(metrics.calls) == 3)
            assert [c[2] for c in metrics.calls] == ["CANCELLED", "OK", "OK"]  # (the malformed ones reached none)
        finally:
            writer.close()
            front.h1.close()
    asyncio.run(main())
