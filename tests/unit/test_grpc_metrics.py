"""Serve's gRPC proxy metrics in rankcore's gRPC front (issue 64): ``serve_num_grpc_requests``, its error
counters, ``serve_grpc_request_latency_ms`` and ``serve_num_ongoing_grpc_requests``, counted in the proxy's
``IngressMetrics`` as Serve's gRPC proxy labels them (the method's full name; the application as the route;
the gRPC code's name as the status). The proxy's gRPC server runs in this process (no Ray), in front of the
stand-in handle of tests/integration/test_ray_grpc_context.py, which calls the class's methods here."""

from __future__ import annotations

import asyncio
from typing import Any

import grpc
from google.protobuf import empty_pb2, wrappers_pb2
from grpc import aio

from executors.ray_gpu.base.grpc_context import attach
from executors.ray_gpu.base.grpc_proxy import API_SERVICE, GrpcFront
from executors.ray_gpu.ingress.calls import _cancel
from executors.ray_gpu.ingress.http import IngressState, public_methods
from tests.integration.protos import echo_pb2, echo_pb2_grpc
from tests.integration.test_ray_grpc_context import ECHO, SHOUT, Contextual, _Here, _outcome
from tests.unit.test_metrics import samples, tot

SAY, COUNT, NAP, LOUD = "/rankcore.test.Echo/Say", "/rankcore.test.Echo/Count", "/rankcore.test.Echo/Nap", \
    "/rankcore.test.Shout/Loud"


class NoLoud(Contextual):
    Loud = None  # type: ignore[assignment]  # (the Shout service's method this class lacks: UNIMPLEMENTED)


def _front() -> tuple[IngressState, GrpcFront]:
    """Two applications (so a call must name one), both ``Contextual``; ``lacks`` without ``Loud``."""
    for cls in (Contextual, NoLoud):
        attach(cls)
    ingress = IngressState({"/ctx": "ctx", "/lacks": "lacks"},
                           {"ctx": _Here(Contextual(), []), "lacks": _Here(NoLoud(), [])}, 1 << 20, 30.0)
    ingress.methods = {"ctx": public_methods(Contextual), "lacks": public_methods(NoLoud)}
    return ingress, GrpcFront(ingress, [ECHO, SHOUT], _cancel)


def _on(app: str) -> tuple:
    return (("application", app),)


def _grpc(ingress: IngressState) -> dict:
    """The gRPC samples of the proxy's metrics now."""
    return {k: v for k, v in samples(ingress.metrics.exposition()).items() if "grpc" in k[0]}


async def _until(ready: Any, timeout: float = 10.0) -> None:
    loop = asyncio.get_running_loop()
    end = loop.time() + timeout
    while not ready():
        assert loop.time() < end, "not in time"
        await asyncio.sleep(0.01)


def test_each_call_is_counted_by_its_method_application_and_code() -> None:
    ingress, front = _front()

    async def main() -> dict[str, Any]:
        host, port = await front.start("127.0.0.1", 0)
        out: dict[str, Any] = {}
        try:
            async with aio.insecure_channel(f"{host}:{port}") as channel:
                stub, shout = echo_pb2_grpc.EchoStub(channel), echo_pb2_grpc.ShoutStub(channel)
                for text in ("ok", "ok", "plain-raise", "raise", "missing"):
                    out[text] = await _outcome(stub.Say(echo_pb2.EchoRequest(text=text), metadata=_on("ctx")))
                out["no-app"] = await _outcome(stub.Say(echo_pb2.EchoRequest(text="ok")))
                out["unimplemented"] = await _outcome(shout.Loud(echo_pb2.EchoRequest(text="a"), metadata=_on("lacks")))
                out["loud"] = await _outcome(shout.Loud(echo_pb2.EchoRequest(text="a"), metadata=_on("ctx")))
                call = stub.Count(echo_pb2.EchoRequest(n=3), metadata=_on("ctx"))
                out["count"] = [item.text async for item in call]
                # the API and health services are not counted (as the HTTP side's /-/ pages)
                await channel.unary_unary(f"/{API_SERVICE}/Healthz", request_serializer=empty_pb2.Empty.SerializeToString,
                                          response_deserializer=wrappers_pb2.StringValue.FromString)(empty_pb2.Empty())
        finally:
            await front.stop(0)
        return out

    got = asyncio.run(main())
    assert got["ok"][1] == grpc.StatusCode.OK and got["plain-raise"][1] == grpc.StatusCode.INTERNAL
    assert got["raise"][1] == grpc.StatusCode.DATA_LOSS and got["missing"][1] == grpc.StatusCode.NOT_FOUND
    assert got["no-app"][1] == grpc.StatusCode.NOT_FOUND and got["unimplemented"][1] == grpc.StatusCode.UNIMPLEMENTED
    assert got["loud"][0].text == "A!" and got["count"] == ["0", "1", "2"]
    s = _grpc(ingress)
    by = {tuple(dict(ls)[k] for k in ("route", "method", "application", "status_code")): v
          for (n, ls), v in s.items() if n == "ray_serve_num_grpc_requests_total"}
    assert by == {("ctx", SAY, "ctx", "StatusCode.OK"): 2, ("ctx", SAY, "ctx", "StatusCode.INTERNAL"): 1, ("ctx", SAY, "ctx", "StatusCode.DATA_LOSS"): 1,
                  ("ctx", SAY, "ctx", "StatusCode.NOT_FOUND"): 1,  # (a code the method set: as the client got it)
                  ("", SAY, "", "StatusCode.NOT_FOUND"): 1,  # (no application named: Serve's empty route and application)
                  ("lacks", LOUD, "lacks", "StatusCode.UNIMPLEMENTED"): 1, ("ctx", LOUD, "ctx", "StatusCode.OK"): 1,
                  ("ctx", COUNT, "ctx", "StatusCode.OK"): 1}
    assert sum(by.values()) == sum(front.codes.values()) == 9  # (every call once; Healthz is in neither)
    errors = {(dict(ls)["route"], dict(ls)["error_code"]): v for (n, ls), v in s.items()
              if n == "ray_serve_num_grpc_error_requests_total"}
    assert errors == {("ctx", "StatusCode.INTERNAL"): 1, ("ctx", "StatusCode.DATA_LOSS"): 1, ("ctx", "StatusCode.NOT_FOUND"): 1, ("", "StatusCode.NOT_FOUND"): 1,
                      ("lacks", "StatusCode.UNIMPLEMENTED"): 1}
    assert tot(s, "ray_serve_num_deployment_grpc_error_requests_total", deployment="ctx", method=SAY,
               error_code="StatusCode.INTERNAL", route="ctx", application="ctx") == 1
    assert tot(s, "ray_serve_num_deployment_grpc_error_requests_total", deployment="") == 1
    assert tot(s, "ray_serve_grpc_request_latency_ms_count") == 9
    assert tot(s, "ray_serve_grpc_request_latency_ms_count", method=COUNT, status_code="StatusCode.OK") == 1
    assert tot(s, "ray_serve_num_ongoing_grpc_requests") == 0
    # HTTP's families are another protocol's
    assert tot(samples(ingress.metrics.exposition()), "ray_serve_num_http_requests_total") == 0


def test_a_call_in_flight_is_ongoing_and_its_time_is_measured_and_a_cancelled_one_counted() -> None:
    ingress, front = _front()

    def ongoing() -> float:
        return tot(_grpc(ingress), "ray_serve_num_ongoing_grpc_requests")

    async def main() -> tuple[list[float], Any]:
        host, port = await front.start("127.0.0.1", 0)
        seen: list[float] = []
        try:
            async with aio.insecure_channel(f"{host}:{port}") as channel:
                stub = echo_pb2_grpc.EchoStub(channel)
                nap = asyncio.ensure_future(_outcome(stub.Nap(echo_pb2.EchoRequest(seconds=0.3), metadata=_on("ctx"))))
                await _until(lambda: ongoing() == 1)
                seen.append(ongoing())
                answer = await nap
                seen.append(ongoing())
                long = stub.Nap(echo_pb2.EchoRequest(seconds=30), metadata=_on("ctx"))
                await _until(lambda: ongoing() == 1)
                long.cancel()
                await _until(lambda: tot(_grpc(ingress), "ray_serve_num_grpc_requests_total",
                                         status_code="StatusCode.CANCELLED") == 1)
                seen.append(ongoing())
        finally:
            await front.stop(0)
        return seen, answer

    seen, answer = asyncio.run(main())
    assert seen == [1, 0, 0] and answer[0].text == "awake"
    s = _grpc(ingress)
    assert tot(s, "ray_serve_grpc_request_latency_ms_count", method=NAP, status_code="StatusCode.OK") == 1
    assert tot(s, "ray_serve_grpc_request_latency_ms_sum", method=NAP, status_code="StatusCode.OK") >= 300.0
    assert tot(s, "ray_serve_grpc_request_latency_ms_bucket", method=NAP, status_code="StatusCode.OK", le="200.0") == 0
    assert tot(s, "ray_serve_num_grpc_error_requests_total", error_code="StatusCode.CANCELLED", route="ctx") == 1
    assert front.codes["CANCELLED"] == 1 and ingress.ongoing == 0
