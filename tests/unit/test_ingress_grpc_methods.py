"""A gRPC method of the proxy's services that the routed deployment's class does not have
(base/grpc_proxy.py): ``UNIMPLEMENTED`` naming the deployment, the method and the class's methods,
before anything is sent, as an HTTP ``<prefix>/<method>`` the class lacks is a 404 (the methods
``expose`` stored: ``http.public_methods``). A method of no service stays gRPC's own ``UNIMPLEMENTED``.
No Ray: the proxy's gRPC server runs in this process in front of an ``http.IngressState`` whose handle
is a stand-in that records what it is asked to send."""

from __future__ import annotations

import asyncio
from typing import Any

import grpc
from grpc import aio

from executors.ray_gpu.base.grpc_proxy import GrpcFront
from executors.ray_gpu.ingress.calls import _cancel
from executors.ray_gpu.ingress.http import IngressState, public_methods
from tests.integration.protos import echo_pb2, echo_pb2_grpc

SERVICERS = ["tests.integration.protos.echo_pb2_grpc.add_EchoServicer_to_server"]


class Wire:
    """The routed class: the Echo service's ``Say`` only (not ``Nap``, not ``Count``)."""

    def Say(self, request):
        return echo_pb2.EchoReply(text=request.text.upper())


class Handle:
    """A ``DeploymentHandle`` stand-in: every method's call answered at once, each one recorded."""

    def __init__(self, sent: list[str], method: str = "__call__") -> None:
        self.sent, self.method = sent, method

    def __getattr__(self, method: str) -> Handle:
        if method.startswith("_"):
            raise AttributeError(method)
        return Handle(self.sent, method)

    def knows_pool(self) -> bool:
        return True

    def options(self, **_: Any) -> Handle:
        return self

    def remote(self, request: Any) -> Any:
        self.sent.append(self.method)

        async def answer() -> Any:
            return echo_pb2.EchoReply(text=request.text.upper())
        return answer()


def test_a_method_the_class_lacks_is_unimplemented_and_nothing_is_sent() -> None:
    sent: list[str] = []
    ingress = IngressState({"/wire": "wire"}, {"wire": Handle(sent)}, 1 << 20, 30.0)
    ingress.methods = {"wire": public_methods(Wire)}

    async def main() -> list[tuple[str, Any, str]]:
        front = GrpcFront(ingress, SERVICERS, _cancel)
        host, port = await front.start("127.0.0.1", 0)
        out = []
        try:
            async with aio.insecure_channel(f"{host}:{port}") as channel:
                stub = echo_pb2_grpc.EchoStub(channel)
                out.append(("Say", grpc.StatusCode.OK, (await stub.Say(echo_pb2.EchoRequest(text="hi"))).text))
                for name, call in (("Nap", lambda: stub.Nap(echo_pb2.EchoRequest(text="x"))),
                                   ("Count", lambda: _drain(stub.Count(echo_pb2.EchoRequest(text="x")))),
                                   ("Nope", lambda: channel.unary_unary("/rankcore.test.Echo/Nope")(b""))):
                    try:
                        await call()
                        out.append((name, grpc.StatusCode.OK, ""))
                    except aio.AioRpcError as exc:
                        out.append((name, exc.code(), exc.details() or ""))
        finally:
            await front.stop(0)
        return out

    got = {name: (code, detail) for name, code, detail in asyncio.run(main())}
    assert got["Say"] == (grpc.StatusCode.OK, "HI")
    for name in ("Nap", "Count"):  # services' methods the class does not have
        code, detail = got[name]
        assert code == grpc.StatusCode.UNIMPLEMENTED, got[name]
        assert f"deployment 'wire' has no method '{name}' (methods: Say)" in detail, detail
    assert got["Nope"][0] == grpc.StatusCode.UNIMPLEMENTED  # a method of no service: gRPC's own
    assert sent == ["Say"]  # nothing was sent for the others


async def _drain(stream: Any) -> None:
    async for _ in stream:
        pass
