"""gRPC beside HTTP in the proxy (issue 38), called with real generated stubs
(tests/integration/protos/echo.proto): unary and server-streaming calls routed by the
``application`` metadata, the health service, listing applications, and the status codes:
NOT_FOUND, UNAVAILABLE (overloaded), INTERNAL with the remote error, DEADLINE_EXCEEDED, and a
client that cancels (its slot on the replica freed, counted CANCELLED)."""

from __future__ import annotations

import asyncio
import time

import grpc
import pytest
import ray
from google.protobuf import empty_pb2, struct_pb2, wrappers_pb2
from grpc_health.v1 import health_pb2, health_pb2_grpc

import rankcore as rc
from executors.ray_gpu import deployment, get_replica_context, run
from executors.ray_gpu.base.context import _get_serve_request_context
from executors.ray_gpu.control.controller import NAMESPACE
from executors.ray_gpu.ingress.http import INGRESS_NAME, expose, proxies, start_ingress
from tests.integration.protos import echo_pb2, echo_pb2_grpc

pytestmark = pytest.mark.usefixtures("local_ray")

OPTS = {"num_cpus": 0.05}
SERVICERS = ["tests.integration.protos.echo_pb2_grpc.add_EchoServicer_to_server"]


@deployment(name="echo", num_replicas=1, max_ongoing_requests=1, max_queued_requests=0, ray_actor_options=OPTS)
class Echo:
    def Say(self, request):
        if request.text == "boom":
            raise ValueError("the application says boom")
        if request.text == "rid":  # (the request id the replica sees)
            return echo_pb2.EchoReply(text=_get_serve_request_context().request_id)
        return echo_pb2.EchoReply(text=request.text.upper(), replica=get_replica_context().replica_id)

    def Count(self, request):
        for i in range(request.n):
            yield echo_pb2.EchoReply(text=str(i))

    async def Nap(self, request):
        await asyncio.sleep(request.seconds)
        return echo_pb2.EchoReply(text="awake")


@deployment(name="other", num_replicas=1, ray_actor_options=OPTS)
class Other:
    def Say(self, request):
        return echo_pb2.EchoReply(text="other")


@pytest.fixture(scope="module")
def channel():
    start_ingress(port=0, grpc_port=0, grpc_servicer_functions=SERVICERS)
    expose(run(Echo.bind()), "/echo")
    expose(run(Other.bind()), "/other")
    (head,) = [p for p in proxies().values() if p["head"]]
    host, port = head["grpc_address"]
    with grpc.insecure_channel(f"{host}:{port}") as ch:
        yield ch


def _meta(app):
    return (("application", app),)


def test_a_unary_call_reaches_the_deployment_named_by_its_application(channel):
    stub = echo_pb2_grpc.EchoStub(channel)
    reply = stub.Say(echo_pb2.EchoRequest(text="hi"), metadata=_meta("echo"), timeout=30)
    assert reply.text == "HI" and reply.replica.startswith("echo#")
    assert stub.Say(echo_pb2.EchoRequest(text="hi"), metadata=_meta("other"), timeout=30).text == "other"


def test_a_server_streaming_call_yields_every_item(channel):
    stub = echo_pb2_grpc.EchoStub(channel)
    got = [r.text for r in stub.Count(echo_pb2.EchoRequest(n=4), metadata=_meta("echo"), timeout=30)]
    assert got == ["0", "1", "2", "3"]


def test_health_and_the_list_of_applications(channel):
    health = health_pb2_grpc.HealthStub(channel)
    assert health.Check(health_pb2.HealthCheckRequest(), timeout=10).status == health_pb2.HealthCheckResponse.SERVING
    listing = channel.unary_unary("/rankcore.RankcoreAPIService/ListApplications",
                                  request_serializer=empty_pb2.Empty.SerializeToString,
                                  response_deserializer=struct_pb2.ListValue.FromString)
    assert list(listing(empty_pb2.Empty(), timeout=10)) == ["echo", "other"]
    healthz = channel.unary_unary("/rankcore.RankcoreAPIService/Healthz",
                                  request_serializer=empty_pb2.Empty.SerializeToString,
                                  response_deserializer=wrappers_pb2.StringValue.FromString)
    assert healthz(empty_pb2.Empty(), timeout=10).value == "success"


def test_an_unknown_or_missing_application_is_not_found(channel):
    stub = echo_pb2_grpc.EchoStub(channel)
    for meta, says in ((_meta("nope"), "Application 'nope' not found"), ((), "Application metadata not set")):
        with pytest.raises(grpc.RpcError) as err:
            stub.Say(echo_pb2.EchoRequest(text="x"), metadata=meta, timeout=10)
        assert err.value.code() == grpc.StatusCode.NOT_FOUND and says in err.value.details()


def test_the_applications_error_is_internal_with_its_message(channel):
    with pytest.raises(grpc.RpcError) as err:
        echo_pb2_grpc.EchoStub(channel).Say(echo_pb2.EchoRequest(text="boom"), metadata=_meta("echo"), timeout=30)
    assert err.value.code() == grpc.StatusCode.INTERNAL
    assert err.value.details() == "ValueError: the application says boom"  # (never the traceback)
    rid = dict(err.value.trailing_metadata())["request_id"]  # (what the proxy's log files it under)
    assert len(rid) == 32


def test_the_request_id_reaches_the_replica_and_comes_back_in_trailing_metadata(channel):
    """As Serve's gRPC proxy: the client's ``request_id`` metadata kept, else a new id; the replica's
    request context has it; the answer's trailing metadata carries it (issue 64)."""
    stub = echo_pb2_grpc.EchoStub(channel)
    reply, call = stub.Say.with_call(echo_pb2.EchoRequest(text="rid"),
                                     metadata=(*_meta("echo"), ("request_id", "abc-123")), timeout=30)
    assert reply.text == "abc-123" and dict(call.trailing_metadata())["request_id"] == "abc-123"
    reply, call = stub.Say.with_call(echo_pb2.EchoRequest(text="rid"), metadata=_meta("echo"), timeout=30)
    made = dict(call.trailing_metadata())["request_id"]
    assert reply.text == made and len(made) == 32


def test_overloaded_is_unavailable_and_a_cancelled_call_frees_its_slot(channel):
    stub = echo_pb2_grpc.EchoStub(channel)
    slow = stub.Nap.future(echo_pb2.EchoRequest(seconds=30), metadata=_meta("echo"), timeout=60)
    time.sleep(1.0)  # (it holds the one slot; nothing may queue)
    with pytest.raises(grpc.RpcError) as err:
        stub.Say(echo_pb2.EchoRequest(text="x"), metadata=_meta("echo"), timeout=30)
    assert err.value.code() == grpc.StatusCode.UNAVAILABLE
    slow.cancel()  # the client cancels: the replica's call is cancelled, its slot freed at once
    deadline = time.monotonic() + 10
    while True:
        try:
            assert stub.Say(echo_pb2.EchoRequest(text="y"), metadata=_meta("echo"), timeout=30).text == "Y"
            break
        except grpc.RpcError as exc:
            assert exc.code() == grpc.StatusCode.UNAVAILABLE and time.monotonic() < deadline, exc
            time.sleep(0.2)
    codes = ray.get(ray.get_actor(INGRESS_NAME, namespace=NAMESPACE).grpc_codes.remote())
    assert codes.get("CANCELLED", 0) >= 1 and codes.get("UNAVAILABLE", 0) >= 1, codes


def test_past_request_timeout_s_is_deadline_exceeded(channel):
    actor = ray.get_actor(INGRESS_NAME, namespace=NAMESPACE)
    ray.get(actor.configure.remote(request_timeout_s=0.5))
    try:
        with pytest.raises(grpc.RpcError) as err:
            echo_pb2_grpc.EchoStub(channel).Nap(echo_pb2.EchoRequest(seconds=3), metadata=_meta("echo"), timeout=30)
        assert err.value.code() == grpc.StatusCode.DEADLINE_EXCEEDED
    finally:
        ray.get(actor.configure.remote(request_timeout_s=60.0))
    time.sleep(3)  # (the nap ends: its slot is free for the next test)


def test_servicer_functions_are_checked_where_they_are_given():
    with pytest.raises(rc.InvalidConfig, match=r"cannot import 'nowhere\.add_XServicer_to_server'"):
        start_ingress(grpc_servicer_functions=["nowhere.add_XServicer_to_server"])
    with pytest.raises(rc.InvalidConfig, match="must be a list of import paths"):
        start_ingress(grpc_servicer_functions=SERVICERS[0])


def test_another_grpc_port_asked_of_running_proxies_is_refused_not_ignored(channel):
    with pytest.raises(rc.InvalidConfig, match=r"the proxies serve gRPC on grpc_port=0, not 9001"):
        start_ingress(grpc_servicer_functions=SERVICERS, grpc_port=9001)
    start_ingress(grpc_servicer_functions=[*SERVICERS, SERVICERS[0]])  # (the same services: fine)
    start_ingress(grpc_servicer_functions=SERVICERS)  # (services added to running proxies: test_ray_grpc_context.py)


@deployment(name="keyed", num_replicas=3, ray_actor_options=OPTS, request_router="consistent_hash")
class Keyed:
    def Say(self, request):
        return echo_pb2.EchoReply(text=request.text, replica=get_replica_context().replica_id)


def test_a_session_key_in_the_x_routing_key_metadata_stays_on_its_replica(channel):
    """Issue 68: a call's ``x-routing-key`` metadata is its ``routing_key`` (the handle's option), so
    ``consistent_hash`` keeps each key on one replica and spreads the keys; without it each call's key
    is its own request id."""
    from executors.ray_gpu import delete

    expose(run(Keyed.bind()), "/keyed")
    try:
        stub = echo_pb2_grpc.EchoStub(channel)

        def replica(*meta: tuple[str, str]) -> str:
            return stub.Say(echo_pb2.EchoRequest(text="x"), metadata=(*_meta("keyed"), *meta), timeout=30).replica

        homes = {k: {replica(("x-routing-key", k)) for _ in range(4)} for k in "abcdef"}
        assert all(len(v) == 1 for v in homes.values()), homes
        assert len({next(iter(v)) for v in homes.values()}) > 1, homes
        assert len({replica() for _ in range(12)}) > 1  # (no key: each call hashed on its own id)
    finally:
        delete("keyed")
