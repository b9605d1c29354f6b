"""gRPC on the direct data plane on Ray (issue 65): with ``start_ingress(data_plane="direct",
grpc_port=..., grpc_servicer_functions=...)`` HAProxy takes the gRPC port too and sends a route's
calls, by their ``application`` metadata, straight to its replicas' own gRPC servers
(``replica/direct_grpc.py``), the rest to the proxy's gRPC server. A call the proxy answered is in
its ``grpc_codes()``; one a replica answered is not: that is how each test tells which way it went."""

from __future__ import annotations

import asyncio
import os
import time

import grpc
import pytest
import ray
from google.protobuf import empty_pb2, struct_pb2

from executors.ray_gpu import deployment, get_replica_context, run
from executors.ray_gpu.base.context import _get_serve_request_context
from executors.ray_gpu.control.controller import NAMESPACE
from executors.ray_gpu.ingress.http import INGRESS_NAME, start_ingress
from tests.integration.protos import echo_pb2, echo_pb2_grpc
from tests.integration.waiting import wait_for

pytestmark = pytest.mark.usefixtures("local_ray")

OPTS = {"num_cpus": 0.05}
SERVICERS = ["tests.integration.protos.echo_pb2_grpc.add_EchoServicer_to_server"]


@deployment(name="gecho", num_replicas=2, max_ongoing_requests=2, ray_actor_options=OPTS)
class Echo:
    def Say(self, request):
        if request.text == "boom":
            raise ValueError("the application says boom")
        if request.text == "rid":  # (the request id and application the replica sees)
            ctx = _get_serve_request_context()
            return echo_pb2.EchoReply(text=f"{ctx.request_id} {ctx.app_name}", replica=str(os.getpid()))
        return echo_pb2.EchoReply(text=request.text.upper(), replica=get_replica_context().replica_id)

    def Count(self, request):
        for i in range(request.n):
            yield echo_pb2.EchoReply(text=str(i))

    async def Nap(self, request):
        await asyncio.sleep(request.seconds)
        return echo_pb2.EchoReply(text="awake")


@deployment(name="gother", num_replicas=1, ray_actor_options=OPTS)
class Other:
    def Say(self, request):
        return echo_pb2.EchoReply(text="other", replica=get_replica_context().replica_id)


@deployment(name="gctx", num_replicas=1, ray_actor_options=OPTS)
class Contextual:
    """Serve's ``grpc_context`` on a replica's own server (``base.grpc_h1``'s context under it)."""

    def Say(self, request, grpc_context):
        if request.text == "missing":
            grpc_context.set_code(grpc.StatusCode.NOT_FOUND)
            grpc_context.set_details("no such thing")
            return echo_pb2.EchoReply(text="never sent")
        grpc_context.set_trailing_metadata([("foo", "bar")])
        seen = dict(grpc_context.invocation_metadata())
        return echo_pb2.EchoReply(text=f"{seen.get('who', '')}|{grpc_context.peer().startswith('ipv4:')}")

    def Count(self, request, grpc_context):
        for i in range(request.n):
            yield echo_pb2.EchoReply(text=str(i))
        grpc_context.set_trailing_metadata([("counted", str(request.n))])


def ingress():
    return ray.get_actor(INGRESS_NAME, namespace=NAMESPACE)


def grpc_servers(deployment_name: str) -> int:
    """How many of ``deployment_name``'s servers have a gRPC address in the data plane's table."""
    info = ray.get(ingress().data_plane.remote())
    route = next((r for r in info["routes"] if r["deployment"] == deployment_name), None)
    return sum(1 for s in (route or {}).get("servers", []) if s[4])


@pytest.fixture(scope="module")
def channel():
    start_ingress(port=0, grpc_port=0, grpc_servicer_functions=SERVICERS, data_plane="direct")
    run(Echo.bind(), route_prefix="/gecho")
    run(Other.bind(), route_prefix="/gother")
    run(Echo.options(name="gtight", num_replicas=1, max_ongoing_requests=1, max_queued_requests=0).bind(),
        route_prefix="/gtight")
    run(Contextual.bind(), route_prefix="/gctx")
    deadline = time.monotonic() + 60
    while grpc_servers("gecho") < 2 or grpc_servers("gother") < 1 or grpc_servers("gtight") < 1 \
            or grpc_servers("gctx") < 1:
        assert time.monotonic() < deadline, ray.get(ingress().data_plane.remote())
        time.sleep(0.1)
    host, port = ray.get(ingress().grpc_address.remote())
    with grpc.insecure_channel(f"{host}:{port}") as ch:
        yield ch


def _meta(app, *more):
    return (("application", app), *more)


def codes() -> dict:
    """The proxy's own gRPC answers by code."""
    return ray.get(ingress().grpc_codes.remote())


def test_a_unary_call_goes_straight_to_a_replica_named_by_its_application(channel):
    stub = echo_pb2_grpc.EchoStub(channel)
    before = codes()
    reply, call = stub.Say.with_call(echo_pb2.EchoRequest(text="hi"), metadata=_meta("gecho"), timeout=30)
    assert reply.text == "HI" and reply.replica.startswith("gecho#")
    assert stub.Say(echo_pb2.EchoRequest(text="hi"), metadata=_meta("gother"), timeout=30).text == "other"
    rid = dict(call.trailing_metadata())["request_id"]
    assert len(rid) == 32
    reply, call = stub.Say.with_call(echo_pb2.EchoRequest(text="rid"), timeout=30,
                                     metadata=_meta("gecho", ("request_id", "grpc-direct-1")))
    assert reply.text == "grpc-direct-1 gecho" and reply.replica != str(os.getpid())
    assert dict(call.trailing_metadata())["request_id"] == "grpc-direct-1"
    replicas = {stub.Say(echo_pb2.EchoRequest(text="x"), metadata=_meta("gecho"), timeout=30).replica
                for _ in range(12)}
    assert len(replicas) == 2  # (both replicas serve)
    assert codes() == before  # (none of these went through the proxy's gRPC server)


def test_a_server_streaming_call_yields_every_item_straight_from_a_replica(channel):
    stub = echo_pb2_grpc.EchoStub(channel)
    before = codes()
    got = [r.text for r in stub.Count(echo_pb2.EchoRequest(n=5), metadata=_meta("gecho"), timeout=30)]
    assert got == ["0", "1", "2", "3", "4"] and codes() == before


def test_errors_end_with_the_proxy_s_codes(channel):
    stub = echo_pb2_grpc.EchoStub(channel)
    with pytest.raises(grpc.RpcError) as err:
        stub.Say(echo_pb2.EchoRequest(text="boom"), metadata=_meta("gecho"), timeout=30)
    assert err.value.code() == grpc.StatusCode.INTERNAL
    assert "ValueError: the application says boom" in err.value.details()
    before = codes()
    with pytest.raises(grpc.RpcError) as err:  # (no such application: the proxy answers it)
        stub.Say(echo_pb2.EchoRequest(text="x"), metadata=_meta("nope"), timeout=30)
    assert err.value.code() == grpc.StatusCode.NOT_FOUND
    assert codes().get("NOT_FOUND", 0) == before.get("NOT_FOUND", 0) + 1


def test_past_request_timeout_s_a_call_ends_deadline_exceeded_and_is_cancelled(channel):
    ray.get(ingress().configure.remote(request_timeout_s=0.5))
    try:
        time.sleep(1.0)  # (the replicas told: a call each)
        stub = echo_pb2_grpc.EchoStub(channel)
        t0 = time.monotonic()
        with pytest.raises(grpc.RpcError) as err:
            stub.Nap(echo_pb2.EchoRequest(seconds=5.0), metadata=_meta("gecho"), timeout=30)
        assert err.value.code() == grpc.StatusCode.DEADLINE_EXCEEDED, err.value.details()
        assert "request_timeout_s=0.5" in err.value.details() and time.monotonic() - t0 < 4.0
    finally:
        ray.get(ingress().configure.remote(request_timeout_s=60.0))
    time.sleep(1.0)
    # its slots were freed: both replicas take two calls each at once again (one slot still held would
    # queue a call behind a 1 s nap)
    stub = echo_pb2_grpc.EchoStub(channel)
    t0 = time.monotonic()
    futures = [stub.Nap.future(echo_pb2.EchoRequest(seconds=1.0), metadata=_meta("gecho"), timeout=30)
               for _ in range(4)]
    assert [f.result().text for f in futures] == ["awake"] * 4
    assert time.monotonic() - t0 < 1.9


def test_the_api_and_a_multiplexed_call_go_through_the_proxy(channel):
    before = codes()
    listed = channel.unary_unary("/rankcore.RankcoreAPIService/ListApplications",
                                 request_serializer=empty_pb2.Empty.SerializeToString,
                                 response_deserializer=struct_pb2.ListValue.FromString)(empty_pb2.Empty(), timeout=30)
    assert {"gecho", "gother"} <= set(listed)
    stub = echo_pb2_grpc.EchoStub(channel)
    reply = stub.Say(echo_pb2.EchoRequest(text="m"), metadata=_meta("gecho", ("multiplexed_model_id", "m1")),
                     timeout=30)
    assert reply.text == "M"
    assert codes().get("OK", 0) == before.get("OK", 0) + 1  # (the multiplexed call: the proxy's)


def _grpc_counted(app: str, code: str) -> float:
    """``ray_serve_num_grpc_requests_total`` of ``app`` ended ``code``, as the ingress's ``/metrics`` says."""
    import httpx
    from prometheus_client.parser import text_string_to_metric_families

    host, port = ray.get(ingress().ready.remote())
    text = httpx.get(f"http://{host}:{port}/metrics", timeout=30).text
    return sum(s.value for fam in text_string_to_metric_families(text) for s in fam.samples
               if s.name == "ray_serve_num_grpc_requests_total" and s.labels.get("application") == app
               and s.labels.get("status_code") == f"StatusCode.{code}")


def test_direct_calls_are_in_the_ingress_s_metrics(channel):
    before, answered = _grpc_counted("gother", "OK"), codes()
    stub = echo_pb2_grpc.EchoStub(channel)
    for _ in range(3):
        stub.Say(echo_pb2.EchoRequest(text="x"), metadata=_meta("gother"), timeout=30)
    assert _grpc_counted("gother", "OK") - before == 3 and codes() == answered  # (counted by the replica: the proxy saw none)


def test_past_max_queued_requests_the_balancer_ends_a_call_unavailable(channel):
    """``gtight``: one slot, no queue. A call holding the slot; the next ends ``UNAVAILABLE`` at once,
    answered by HAProxy (neither the proxy nor the replica saw it), and counted in the ingress's
    metrics all the same (HAProxy's log of its own answers)."""
    stub = echo_pb2_grpc.EchoStub(channel)
    held = stub.Nap.future(echo_pb2.EchoRequest(seconds=2.0), metadata=_meta("gtight"), timeout=30)
    time.sleep(0.5)
    before, counted = codes(), _grpc_counted("gtight", "UNAVAILABLE")
    t0 = time.monotonic()
    with pytest.raises(grpc.RpcError) as err:
        stub.Say(echo_pb2.EchoRequest(text="x"), metadata=_meta("gtight"), timeout=30)
    assert err.value.code() == grpc.StatusCode.UNAVAILABLE, err.value.details()
    assert "max_queued_requests" in err.value.details() and time.monotonic() - t0 < 1.0
    assert held.result().text == "awake" and codes() == before
    assert wait_for(lambda: _grpc_counted("gtight", "UNAVAILABLE") == counted + 1, 10), (
        _grpc_counted("gtight", "UNAVAILABLE"), counted)


def test_grpc_context_on_a_replica_s_own_server(channel):
    """A method taking ``grpc_context``, called straight on its replica: the client's metadata and its
    peer (HAProxy's end) reach it; the code, details and trailing metadata it sets end the call."""
    before = codes()
    say = echo_pb2_grpc.EchoStub(channel).Say
    reply, call = say.with_call(echo_pb2.EchoRequest(text="hi"), metadata=_meta("gctx", ("who", "me")))
    assert reply.text == "me|True"
    assert ("foo", "bar") in tuple(call.trailing_metadata())
    with pytest.raises(grpc.RpcError) as err:
        say(echo_pb2.EchoRequest(text="missing"), metadata=_meta("gctx"))
    assert err.value.code() == grpc.StatusCode.NOT_FOUND and err.value.details() == "no such thing"
    items = echo_pb2_grpc.EchoStub(channel).Count(echo_pb2.EchoRequest(n=3), metadata=_meta("gctx"))
    assert [r.text for r in items] == ["0", "1", "2"]
    assert ("counted", "3") in tuple(items.trailing_metadata())
    assert codes() == before  # (the proxy answered none of them: they went straight to the replica)
