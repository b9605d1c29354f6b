"""The gRPC front routes by application name, as Serve's gRPC proxy (issue 64; found by the
test_grpc.py port): the ``application`` metadata names an application (``serve.run``'s ``name``, a
config's: ``base.appnames``) or a routed deployment, and ``ListApplications`` lists the
applications' names. In process (no Ray): the proxy's gRPC server in front of the stand-in handle of
tests/integration/test_ray_grpc_context.py, the application table given here."""

from __future__ import annotations

import asyncio
from typing import Any

import grpc
import pytest
from google.protobuf import empty_pb2, struct_pb2
from grpc import aio

from executors.ray_gpu.base import appnames
from executors.ray_gpu.base.grpc_proxy import API_SERVICE
from tests.integration.protos import echo_pb2, echo_pb2_grpc
from tests.integration.test_ray_grpc_context import _outcome
from tests.unit.test_grpc_metrics import _front, _on


@pytest.fixture
def apps(monkeypatch: pytest.MonkeyPatch) -> None:
    """``ctx`` belongs to application ``market``; ``lacks`` to none (its own name)."""
    monkeypatch.setattr(appnames, "table", lambda fresh_s=appnames.FRESH_S: {"ctx": "market"})


def test_a_call_names_its_application_or_its_deployment(apps: None) -> None:
    _ingress, front = _front()

    async def main() -> dict[str, Any]:
        host, port = await front.start("127.0.0.1", 0)
        out: dict[str, Any] = {}
        try:
            async with aio.insecure_channel(f"{host}:{port}") as channel:
                stub = echo_pb2_grpc.EchoStub(channel)
                for who in ("market", "ctx", "nowhere"):
                    out[who] = await _outcome(stub.Say(echo_pb2.EchoRequest(text="ok"), metadata=_on(who)))
                listing = channel.unary_unary(f"/{API_SERVICE}/ListApplications",
                                              request_serializer=empty_pb2.Empty.SerializeToString,
                                              response_deserializer=struct_pb2.ListValue.FromString)
                out["list"] = list(await listing(empty_pb2.Empty()))
        finally:
            await front.stop(0)
        return out

    out = asyncio.run(main())
    assert out["market"][1] == out["ctx"][1] == grpc.StatusCode.OK, out  # (the application's name, the deployment's)
    assert out["nowhere"][1] == grpc.StatusCode.NOT_FOUND and "'nowhere' not found" in out["nowhere"][2], out
    assert out["list"] == ["lacks", "market"]  # (applications' names; a deployment none holds: its own)


def test_the_table_is_read_again_once_invalidated(monkeypatch: pytest.MonkeyPatch) -> None:
    """A process trusts what it read for ``FRESH_S``; ``invalidate`` (a proxy given a route: ``serve.run``
    named the application first) makes the next read ask the store, so a new application is seen at once."""
    store = {"d": "old"}
    reads: list[dict[str, str]] = []

    def read() -> dict[str, str]:
        reads.append(dict(store))
        return dict(store)

    monkeypatch.setattr(appnames, "_read", read)
    monkeypatch.setattr(appnames, "_cache", (float("-inf"), {}))
    assert appnames.of("d") == "old"
    store["d"] = "new"
    assert appnames.of("d") == "old" and len(reads) == 1  # (within FRESH_S: the cached table)
    appnames.invalidate()
    assert appnames.of("d") == "new" and len(reads) == 2
