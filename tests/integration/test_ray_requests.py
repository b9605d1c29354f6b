"""The request path on Ray (issue 22): handles route through ``rankcore.requests.RequestMachine``
fed by the pool the core pushes. Composition (a deployment's constructor gets a handle to another,
both deployed by one ``run``), awaiting and chaining responses, back-pressure, and a replica killed
under load: nothing lost, idempotent calls retried, the others failed naming the replica."""

from __future__ import annotations

import asyncio
import os
import signal
import sys
import tempfile
import time
import types
from concurrent.futures import Future
from typing import Any

import pytest
import ray
from ray.exceptions import RaySystemError, TaskCancelledError

import rankcore as rc
from executors.ray_gpu import deployment, get_controller, get_replica_context, http_method, idempotent, run
from executors.ray_gpu.api.deployments import DeploymentHandle, ask
from executors.ray_gpu.control.controller import NAMESPACE, actor_name
from tests.integration.waiting import wait_for
from tests.integration.witnessing import ANY_WITNESS, begun_and_waiting_then_killed

pytestmark = pytest.mark.usefixtures("local_ray")
OPTS = {"num_cpus": 0.25}  # (a local Ray of 4 CPUs)


@pytest.fixture(autouse=True)
def clean():
    yield
    ask(get_controller(), "reset")


class Model:
    def __call__(self, x: int) -> tuple:
        ctx = get_replica_context()
        return x * 2, ctx.rank.rank, ctx.world_size

    def double(self, x: int) -> int:
        return x * 2

    @http_method
    def slow(self, seconds: float) -> str:
        time.sleep(seconds)
        return get_replica_context().replica_id

    @idempotent
    def slow_read(self, seconds: float) -> str:
        time.sleep(seconds)
        return get_replica_context().replica_id

    def pid(self) -> int:
        return os.getpid()


class Ingress:
    def __init__(self, model: DeploymentHandle) -> None:
        self.model = model

    async def __call__(self, x: int) -> dict:
        doubled, model_rank, model_world = await self.model.remote(x)
        ctx = get_replica_context()
        return {"doubled": doubled, "model_rank": model_rank, "model_world": model_world,
                "ingress_rank": ctx.rank.rank, "ingress_world": ctx.world_size,
                "handle_type": type(self.model).__name__}


def test_composition_deploys_both_and_ranks_are_independent_per_deployment():
    """Ray Serve's test_multiple_deployments_independent_ranks, with composition."""
    model = deployment(Model, name="model", num_replicas=3, ray_actor_options=OPTS)
    ingress = deployment(Ingress, name="ingress", num_replicas=2, ray_actor_options=OPTS)
    h = run(ingress.bind(model.bind()), timeout=120)
    ctl = get_controller()
    assert sorted(r[0] for r in ask(ctl, "ranks", "model").values()) == [0, 1, 2]
    assert sorted(r[0] for r in ask(ctl, "ranks", "ingress").values()) == [0, 1]
    answers = [h.remote(i).result(timeout=60) for i in range(12)]
    assert [a["doubled"] for a in answers] == [2 * i for i in range(12)]
    assert {a["handle_type"] for a in answers} == {"DeploymentHandle"}
    assert {a["model_world"] for a in answers} == {3} and {a["ingress_world"] for a in answers} == {2}
    assert {a["model_rank"] for a in answers} <= {0, 1, 2} and {a["ingress_rank"] for a in answers} <= {0, 1}


def test_a_response_is_awaitable_and_chainable_without_waiting():
    h = run(deployment(Model, name="chain", num_replicas=2, ray_actor_options=OPTS).bind())

    async def both() -> tuple:
        return await h.remote(5), await asyncio.gather(h.remote(1), h.remote(2))

    first, many = asyncio.run(both())
    assert first[0] == 10 and [m[0] for m in many] == [2, 4]
    t0 = time.monotonic()
    inner = h.slow.remote(1.0)
    outer = h.double.remote(h.double.remote(3))  # 3 -> 6 -> 12: passed on as a result
    chained = h.slow.remote(inner)  # returns at once although ``inner`` takes a second
    assert time.monotonic() - t0 < 0.5
    assert outer.result(timeout=30) == 12
    with pytest.raises(Exception):  # slow(replica_id) is not a number: the application's error
        chained.result(timeout=30)


def test_past_max_queued_requests_a_call_is_refused_at_once_with_a_typed_error():
    h = run(deployment(Model, name="tight", num_replicas=1, max_ongoing_requests=1, max_queued_requests=1,
                   ray_actor_options=OPTS).bind())
    running = h.slow.remote(2.0)
    queued = h.slow.remote(0.0)
    t0 = time.monotonic()
    with pytest.raises(rc.Overloaded) as err:
        h.slow.remote(0.0).result(timeout=30)
    assert time.monotonic() - t0 < 1.0 and err.value.status == 503
    assert running.result(timeout=30) == queued.result(timeout=30)  # both on the one replica
    assert h.counters().rejected.get("overloaded") == 1 and h.counters().lost == 0


def test_a_replica_killed_under_load_loses_nothing():
    """Calls in flight on a killed replica: idempotent ones run again elsewhere, the others fail
    naming the replica; queued calls are served by the others; every call ends."""
    h = run(deployment(Model, name="load", num_replicas=3, max_ongoing_requests=2, ray_actor_options=OPTS).bind())
    victim = sorted(h.ranks())[0]
    calls = []  # interleaved, so each replica holds one of each kind (least loaded, ties in turn)
    for _ in range(6):
        calls.append(("read", h.slow_read.remote(1.5)))
        calls.append(("plain", h.slow.remote(1.5)))
    time.sleep(0.5)  # (6 slots taken, 6 calls queued)
    ray.kill(ray.get_actor(actor_name("load", victim), namespace=NAMESPACE), no_restart=True)
    outcomes: list = []
    for kind, resp in calls:
        try:
            outcomes.append((kind, "ok", resp.result(timeout=60)))
        except rc.ReplicaDied as exc:
            outcomes.append((kind, "died", exc.replica_id))
    died = [o for o in outcomes if o[1] == "died"]
    assert len(outcomes) == 12
    assert died and all(kind == "plain" and rid == victim for kind, _, rid in died)  # named, not retried
    assert all(o[1] == "ok" for o in outcomes if o[0] == "read")  # idempotent: retried, answered
    assert all(o[2] != victim for o in outcomes if o[1] == "ok")
    c = h.counters()
    assert c.lost == 0 and c.failed == len(died) and c.answered == 12 - len(died) and c.retried >= 1


def test_calls_keep_flowing_while_the_controller_restarts_and_through_a_scale_up():
    """The controller killed under load: the router keeps the replicas it knows and answers every
    call meanwhile (its long poll fails and is asked again on a timer); then a scale-up under load
    brings the new replicas into the pool, and calls reach them."""
    import threading

    h = run(deployment(Model, name="steady", num_replicas=2, ray_actor_options=OPTS).bind())
    before = set(h.ranks())
    results: list = []
    errors: list = []
    stop = threading.Event()

    def load() -> None:
        while not stop.is_set():
            try:
                results.append(h.slow.remote(0.02).result(timeout=60))
            except Exception as exc:  # (counted, asserted below)
                errors.append(repr(exc))

    threads = [threading.Thread(target=load, daemon=True) for _ in range(4)]
    for t in threads:
        t.start()
    try:  # (the load stops whatever happens: a failure here left 4 threads running and pytest never exited)
        time.sleep(0.5)
        ray.kill(get_controller(), no_restart=False)
        time.sleep(2.0)
        during = len(results)
        assert ask(get_controller(), "wait_healthy", "steady", 60)
        h.scale(4)
        new = set(h.ranks()) - before
        deadline = time.monotonic() + 30
        while not new <= set(results) and time.monotonic() < deadline:
            time.sleep(0.1)
    finally:
        stop.set()
        for t in threads:
            t.join(60)
    assert errors == [], errors[:3]
    assert during > 20  # calls were answered while the controller was down and restarting
    assert len(new) == 2 and new <= set(results), f"the new replicas {new} never answered"
    assert h.counters().lost == 0 and h.counters().failed == 0


class Tokens:
    @http_method
    def tokens(self, n: int, delay: float = 0.0):
        for i in range(n):
            time.sleep(delay)
            yield {"i": i, "replica": get_replica_context().replica_id}

    async def atokens(self, n: int):
        for i in range(n):
            await asyncio.sleep(0)
            yield i * 10

    @http_method
    def broken(self, n: int):
        yield 0
        raise ValueError(f"broke after the first of {n}")


def test_generator_methods_stream_through_the_handle_and_a_death_mid_stream_is_an_error():
    h = run(deployment(Tokens, name="tokens", num_replicas=2, ray_actor_options=OPTS).bind())
    streaming = h.options(stream=True)
    items = list(streaming.tokens.remote(5))
    assert [x["i"] for x in items] == [0, 1, 2, 3, 4] and len({x["replica"] for x in items}) == 1

    async def collect() -> list:
        return [x async for x in streaming.atokens.remote(4)]

    assert asyncio.run(collect()) == [0, 10, 20, 30]
    with pytest.raises(TypeError, match=r"generator method: call it through handle\.options"):
        h.tokens.remote(3)
    got = []
    with pytest.raises(ValueError, match="broke after the first of 3"):
        for x in streaming.broken.remote(3):
            got.append(x)
    assert got == [0]

    gen = streaming.tokens.remote(50, 0.1)
    seen = []
    with pytest.raises(rc.ReplicaDied) as err:
        for x in gen:
            seen.append(x)
            if len(seen) == 3:
                ray.kill(ray.get_actor(actor_name("tokens", x["replica"]), namespace=NAMESPACE), no_restart=True)
    assert 3 <= len(seen) < 50 and err.value.replica_id == seen[0]["replica"]
    assert "mid-stream" in str(err.value)
    c = h.counters()
    assert c.lost == 0 and c.failed == 1 and c.answered == 2 and c.app_errors == 1


def test_a_generator_method_streams_over_http_as_ndjson():
    import json

    import httpx

    from executors.ray_gpu.ingress.http import ingress_address

    run(deployment(Tokens, name="httptokens", num_replicas=1, ray_actor_options=OPTS).bind(),
        route_prefix="/tok", port=0)
    host, port = ingress_address()
    with httpx.Client(base_url=f"http://{host}:{port}", timeout=30) as client:
        with client.stream("POST", "/tok/tokens", json={"args": [4]}) as r:
            assert r.status_code == 200 and r.headers["content-type"].startswith("application/x-ndjson")
            lines = [json.loads(line) for line in r.iter_lines() if line]
        assert [x["i"] for x in lines] == [0, 1, 2, 3]
        r = client.post("/tok/broken", json={"args": [2]})
        last = [json.loads(line) for line in r.text.splitlines() if line]
        assert r.status_code == 200 and last[0] == 0
        assert last[-1]["error"] == "application_error" and "broke after the first of 2" in last[-1]["detail"], last


def test_a_call_that_never_began_on_a_replica_that_died_is_sent_to_another():
    """A progress call tells the router when it began (its marker); a plain call's replica wrote it
    to its witness as it began (``base.witness``): either kind, dispatched to a replica that died
    before beginning it, never ran, and is answered by another replica."""
    h = run(deployment(Model, name="unstarted", num_replicas=2, max_ongoing_requests=2, ray_actor_options=OPTS).bind())
    victim = sorted(h.ranks())[0]
    actor = ray.get_actor(actor_name("unstarted", victim), namespace=NAMESPACE)
    pid = ray.get(actor.handle_request.remote("pid", (), {}), timeout=30)
    os.kill(pid, signal.SIGSTOP)  # a wedged process: what is sent to it never begins
    try:
        calls = [("progress", h.options(progress=True).slow.remote(0.2)) for _ in range(2)]
        calls += [("plain", h.slow.remote(0.2)) for _ in range(2)]  # (least loaded: one of each kind each)
        time.sleep(0.5)
        on_victim = {kind for kind, resp in calls if (st := resp.status()) is not None and st.replica_id == victim}
        assert on_victim == {"progress", "plain"}, [(k, r.status()) for k, r in calls]
    finally:
        os.kill(pid, signal.SIGKILL)
    outcomes = []
    for kind, resp in calls:
        try:
            outcomes.append((kind, resp.result(timeout=60)))
        except rc.ReplicaDied as exc:
            outcomes.append((kind, f"died on {exc.replica_id}"))
    assert all(o.startswith("unstarted#") and o != victim for _, o in outcomes), outcomes  # all answered, elsewhere
    c = h.counters()
    assert c.lost == 0 and c.failed == 0 and c.answered == 4 and c.retried == 0
    assert (victim, 1, 1) in h._router.witnessed  # (its witness: the plain call there never began)


def test_a_plain_call_a_dead_replica_had_begun_fails_and_one_it_had_not_is_answered_elsewhere():
    """One replica, two slots: a call runs there, the process freezes, a second call is sent to it
    (it never begins). Killed: its witness says the first began (it fails naming the replica: never
    run twice) and the second did not (the replacement answers it)."""
    h = run(deployment(Model, name="witnessed", num_replicas=1, max_ongoing_requests=2, ray_actor_options=OPTS).bind())
    begun_and_waiting_then_killed(h, "witnessed")


def test_a_progress_call_reports_running_over_http_and_through_the_handle():
    """A caller who asks for progress sees ``running`` while the method runs (the replica says when it
    began): over HTTP (``?progress=1``) the server-sent events go dispatched, running, done in that
    order; through ``handle.options(progress=True)`` the response's status says ``running``. A plain
    call never reports its start (it pays nothing): it stays ``dispatched`` until answered."""
    import json

    import httpx

    from executors.ray_gpu.ingress.http import ingress_address

    h = run(deployment(Model, name="progress", num_replicas=1, ray_actor_options=OPTS).bind(),
            route_prefix="/prog", port=0)
    host, port = ingress_address()
    with httpx.Client(base_url=f"http://{host}:{port}", timeout=30) as client:
        r = client.post("/prog/slow?progress=1", json={"args": [1.0]})
    assert r.status_code == 200 and r.headers["content-type"].startswith("text/event-stream")
    events = [(fields["event"], json.loads(fields["data"])) for fields in
              (dict(line.split(": ", 1) for line in block.splitlines()) for block in r.text.strip().split("\n\n"))]
    names = [e for e, _ in events]
    assert "running" in names, names
    assert names.index("dispatched") < names.index("running") < names.index("done") == len(names) - 1, names
    assert events[-1][1]["result"].startswith("progress#")

    def states(response: Any, seconds: float) -> list:
        seen, deadline = [], time.monotonic() + seconds
        while time.monotonic() < deadline:
            st = response.status()
            if st is not None and (not seen or seen[-1] != st.state):
                seen.append(st.state)
            time.sleep(0.02)
        return seen

    watched = h.options(progress=True).slow.remote(1.0)
    seen = states(watched, 0.7)
    assert seen[-1] == "running", seen
    assert watched.result(timeout=30).startswith("progress#") and watched.status().state == "done"
    plain = h.slow.remote(1.0)
    assert states(plain, 0.7)[-1] == "dispatched"
    assert plain.result(timeout=30).startswith("progress#")
    c = h.counters()
    assert c.answered == 2 and c.lost == 0 and c.failed == 0  # (this process: the HTTP call went through the ingress's)


def test_deleting_one_deployment_drains_it_fails_its_waiting_calls_and_leaves_the_other_be():
    """Ray Serve's ``serve.delete`` for one deployment: the call a replica holds is answered, the one
    waiting for a slot fails with Unavailable (nothing is coming), its HTTP route is gone at once (404),
    the other deployment keeps answering, the core forgets it once its replica has stopped, and a new
    deployment of its name starts with new replicas."""
    import httpx

    from executors.ray_gpu import delete
    from executors.ray_gpu.base.persist import load_deleted
    from executors.ray_gpu.ingress.http import ingress_address

    doomed = run(deployment(Model, name="doomed", num_replicas=1, max_ongoing_requests=1,
                            ray_actor_options=OPTS).bind(), route_prefix="/doomed", port=0)
    kept = run(deployment(Model, name="kept", num_replicas=1, ray_actor_options=OPTS).bind())
    host, port = ingress_address()
    ctl = get_controller()
    first = set(ask(ctl, "ranks", "doomed"))
    held = doomed.slow.remote(2.0)
    waiting = doomed.slow.remote(0.0)
    deadline = time.monotonic() + 30
    while getattr(held.status(), "state", None) != "dispatched" and time.monotonic() < deadline:
        time.sleep(0.02)
    assert waiting.status().state == "queued", waiting.status()
    delete("doomed", wait=False)
    with httpx.Client(base_url=f"http://{host}:{port}", timeout=30.0) as c:
        r = c.post("/doomed", json=1)
        assert r.status_code == 404, r.text
    with pytest.raises(rc.Unavailable):
        waiting.result(timeout=30)
    assert held.result(timeout=30) in first  # (drained: the held call finished on its replica)
    assert kept.double.remote(21).result(timeout=30) == 42
    assert ask(ctl, "wait_deleted", "doomed", 60)
    pools = ask(ctl, "pools")
    assert not pools["members"].get("doomed") and pools["mismatch"] is None, pools
    assert "doomed" in load_deleted()
    with pytest.raises(rc.InvalidEvent, match="unknown deployment 'doomed'"):
        delete("doomed")
    again = run(deployment(Model, name="doomed", num_replicas=1, ray_actor_options=OPTS).bind())
    assert again.double.remote(4).result(timeout=60) == 8
    assert not set(ask(ctl, "ranks", "doomed")) & first  # (new replica ids)
    assert "doomed" not in load_deleted()


def test_a_stream_whose_consuming_task_is_cancelled_frees_its_slot():
    """``async for`` over a stream in a task that is cancelled mid-stream: the stream ends for the
    request machine, so its one slot is free again (the next call on the 1-slot replica runs)."""
    h = run(deployment(Tokens, name="cancelled", num_replicas=1, max_ongoing_requests=1,
                       ray_actor_options=OPTS).bind())
    streaming = h.options(stream=True)

    async def consume(seen: list) -> None:
        async for x in streaming.tokens.remote(1000, 0.05):
            seen.append(x)

    async def cancelled_mid_stream() -> list:
        seen: list = []
        task = asyncio.ensure_future(consume(seen))
        while len(seen) < 3:
            await asyncio.sleep(0.02)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        return seen

    async def next_stream() -> list:
        return [x["i"] async for x in streaming.tokens.remote(2)]

    assert len(asyncio.run(cancelled_mid_stream())) >= 3
    assert asyncio.run(asyncio.wait_for(next_stream(), 20)) == [0, 1]  # (a leaked slot: it never starts)
    assert h.counters().lost == 0


# ------------------------------------------------------------------ by value (base/by_value.py)
class Valued:
    def double(self, x: int) -> int:
        return x * 2

    def kind(self, x: Any) -> str:
        return type(x).__name__

    def fail(self, what: str) -> None:
        raise ValueError(f"boom {what}")

    async def wait(self, seconds: float, marker: str) -> str:
        try:
            await asyncio.sleep(seconds)
        except asyncio.CancelledError:  # (cancelled on the replica: its caller cancelled the call)
            with open(marker, "w") as f:
                f.write("cancelled")
            raise
        return "waited"

    def slow(self, seconds: float) -> str:
        time.sleep(seconds)
        return get_replica_context().replica_id

    def pid(self) -> int:
        return os.getpid()

    def quit(self) -> None:
        sys.exit(3)

    def interrupt(self) -> None:
        raise KeyboardInterrupt

    async def interrupt_async(self) -> None:
        raise KeyboardInterrupt

    def stranger(self) -> Any:
        """An instance of a class of a module only this replica has: its caller cannot unpickle it."""
        module = types.ModuleType("only_in_the_replica")
        exec("class Stranger:\n    pass\n", module.__dict__)
        sys.modules[module.__name__] = module
        return module.Stranger()


def _by_value(name: str, replicas: int, **opts: Any) -> Any:
    """A handle of a new deployment that sends by value, once its router knows every replica's server."""
    h = run(deployment(Valued, name=name, num_replicas=replicas, ray_actor_options=OPTS, **opts).bind())
    hv = h.options(_by_reference=False)
    assert hv.double.remote(1).result(timeout=30) == 2  # (asks the replicas where their servers are)
    assert wait_for(lambda: len(hv._router.addresses) == replicas, 30), hv._router.addresses
    return hv


def test_a_call_by_value_is_answered_over_the_replicas_server_as_a_ray_call_is():
    """``options(_by_reference=False)`` (Serve's): plain calls go over the replica's gRPC server, the
    answers and the application's errors the same as by reference (``RayTaskError(<cause>)``, the
    remote traceback); a Ray ``ObjectRef`` argument, or a bad option, is not sent by value."""
    hv = _by_value("valued", 2)
    router = hv._router
    sent = router.sent_by_value
    assert [hv.double.remote(i).result(timeout=30) for i in range(6)] == [2 * i for i in range(6)]
    assert router.sent_by_value == sent + 6
    with pytest.raises(ValueError) as by_value:
        hv.fail.remote("here").result(timeout=30)
    with pytest.raises(ValueError) as by_ref:
        hv.options(_by_reference=True).fail.remote("here").result(timeout=30)
    assert type(by_value.value).__name__ == type(by_ref.value).__name__ == "RayTaskError(ValueError)"
    assert "boom here" in str(by_value.value) and "in fail" in str(by_value.value)  # (its traceback)
    assert router.sent_by_value == sent + 7
    assert hv.kind.remote(ray.put(3)).result(timeout=30) == "ObjectRef"  # (by reference: Ray carries the ref)
    assert hv.kind.remote(hv._router.controller).result(timeout=30) == "ActorHandle"  # (likewise an actor)
    assert router.sent_by_value == sent + 7
    assert hv.counters().answered >= 8 and hv.counters().lost == 0
    with pytest.raises(rc.InvalidConfig, match="_by_reference"):
        hv.options(_by_reference="no")


def test_an_answer_the_caller_cannot_unpickle_is_rays_system_error_either_way():
    """A value whose class the caller lacks: Ray's ``RaySystemError`` naming the cause, by reference as
    by value, and the replica answers the next call."""
    hv = _by_value("valued_stranger", 1)
    sent = hv._router.sent_by_value
    for handle in (hv.options(_by_reference=True), hv):
        with pytest.raises(RaySystemError, match="only_in_the_replica"):
            handle.stranger.remote().result(timeout=30)
    assert hv._router.sent_by_value == sent + 1
    assert hv.double.remote(2).result(timeout=30) == 4


def test_a_call_by_value_cancelled_by_its_caller_is_cancelled_on_the_replica_and_frees_its_slot():
    hv = _by_value("valued_cancel", 1, max_ongoing_requests=1)
    with tempfile.TemporaryDirectory() as tmp:
        marker = os.path.join(tmp, "cancelled")
        sent = hv._router.sent_by_value
        waiting = hv.wait.remote(60.0, marker)
        time.sleep(0.5)
        waiting.cancel()
        with pytest.raises(rc.RequestCancelled):
            waiting.result(timeout=30)
        assert wait_for(lambda: os.path.exists(marker), 30), "the replica's task was not cancelled"
        assert hv.wait.remote(0.0, marker).result(timeout=15) == "waited"  # (the one slot is free)
        assert hv._router.sent_by_value == sent + 2
    c = hv.counters()
    assert c.cancelled == 1 and c.lost == 0


def test_a_plain_call_by_value_a_dead_replica_had_begun_fails_and_one_it_had_not_is_answered_elsewhere():
    """As by reference (above): the witness tells which of the dead replica's calls began."""
    hv = _by_value("valued_witness", 1, max_ongoing_requests=2)
    sent = hv._router.sent_by_value
    begun_and_waiting_then_killed(hv, "valued_witness")
    assert hv._router.sent_by_value >= sent + 2


def test_a_call_by_value_cut_off_before_it_began_is_answered_elsewhere_with_no_witness_to_ask():
    """A node lost takes its replicas' witnesses with it: here the replica has none (its witness
    folder does not exist). The call that waited for a slot never got the replica's begin marker
    (``by_value.BEGAN``), so it goes to another replica all the same; the one that began fails."""
    h = run(deployment(Valued, name="valued_unwitnessed", num_replicas=1, max_ongoing_requests=2,
                       ray_actor_options={**OPTS, "runtime_env": {"env_vars": {
                           "RANKCORE_WITNESS_DIR": "/nonexistent-rankcore-witness"}}}).bind())
    hv = h.options(_by_reference=False)
    assert hv.double.remote(1).result(timeout=60) == 2
    assert wait_for(lambda: len(hv._router.addresses) == 1, 30), hv._router.addresses
    sent, not_begun = hv._router.sent_by_value, hv._router.not_begun
    victim = begun_and_waiting_then_killed(hv, "valued_unwitnessed", witnessed=ANY_WITNESS)
    assert hv._router.not_begun == not_begun + 1 and hv._router.sent_by_value >= sent + 2
    assert all(w[0] == victim and w[2] is None for w in hv._router.witnessed), hv._router.witnessed  # (no file)


def test_calls_by_value_in_flight_on_a_draining_replica_finish_there():
    """A scale-down drains the replica it stops: its calls by value already sent finish and are
    answered (the router's channel to it closes only once they ended), as by reference."""
    hv = _by_value("valued_drain", 2, max_ongoing_requests=2)
    sent = hv._router.sent_by_value
    calls = [hv.slow.remote(2.0) for _ in range(4)]  # (two on each replica)
    time.sleep(0.5)
    hv.scale(1, timeout=60)
    answered_by = [c.result(timeout=60) for c in calls]
    assert len(set(answered_by)) == 2, answered_by  # (the stopped replica answered its own two)
    assert hv._router.sent_by_value == sent + 4
    c = hv.counters()
    assert c.failed == 0 and c.lost == 0
    router = hv._router
    assert wait_for(lambda: hv.slow.remote(0).result(timeout=30) and len(router._channels) == 1, 30), (
        router._channels, router.addresses)  # (the stopped one's channel closed once its calls ended)
    assert not router._closing


def test_a_call_by_value_that_never_reached_a_live_replica_goes_to_it_by_reference_and_so_do_the_next():
    """Its router's address for the replica made wrong (nothing listens there): the call fails on its
    way before any connection, Ray says the replica lives, so the call goes to that replica as a Ray
    call and is answered; the replica stays in the pool and takes the next calls as Ray calls."""
    hv = _by_value("valued_alive", 1)
    router = hv._router
    (rid,) = router.addresses
    with router.lock:
        router.addresses[rid] = "127.0.0.1:1"
    sent, resent = router.sent_by_value, router.resent_by_reference
    assert hv.double.remote(4).result(timeout=60) == 8
    assert router.sent_by_value == sent + 1 and router.resent_by_reference == resent + 1
    assert [hv.double.remote(i).result(timeout=30) for i in range(3)] == [0, 2, 4]
    assert router.sent_by_value == sent + 1 and rid in router.no_by_value and rid not in router.addresses
    c = hv.counters()
    assert c.lost == 0 and c.app_errors == 0 and c.failed == 0 and c.answered == 5


def test_a_replica_whose_server_this_router_cannot_reach_gets_ray_calls_until_it_is_reached(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """The address a replica gives is tried first (``_reach``): one nothing answers at (a firewall that
    lets Ray's ports alone through) is sent no call by value; it is tried again later (``REACH_AGAIN_S``),
    and once reached takes calls by value."""
    from executors.ray_gpu.base import router as router_module

    monkeypatch.setattr(router_module, "REACH_AGAIN_S", 3.0)
    h = run(deployment(Valued, name="valued_walled", num_replicas=1, ray_actor_options=OPTS).bind())
    hv = h.options(_by_reference=False)
    router = hv._router
    assert hv.double.remote(1).result(timeout=30) == 2  # (asks the replica where its server is)
    assert wait_for(lambda: router.addresses or router.no_by_value, 30)
    (rid,) = router.actors
    with router.lock:
        router.addresses.pop(rid, None)
    told: Future = Future()
    told.set_result("127.0.0.1:1")
    router._address(rid, router.actors[rid], told)
    assert wait_for(lambda: rid in router.no_by_value, 30) and rid not in router.addresses
    assert router.unreached == {rid: 1}
    sent = router.sent_by_value
    assert [hv.double.remote(i).result(timeout=30) for i in range(3)] == [0, 2, 4]
    assert router.sent_by_value == sent
    assert wait_for(lambda: rid in router.addresses, 30)  # (tried again: its real address this time)
    assert rid not in router.no_by_value and not router.unreached
    assert hv.double.remote(5).result(timeout=30) == 10
    assert router.sent_by_value == sent + 1


def test_a_call_by_value_that_exits_the_replica_ends_as_its_death_does_by_reference():
    """``sys.exit`` in a method called by value ends the replica's process, as in a Ray call (it stopped
    the replica's loop before, and every later call hung); its caller sees the death, and the
    replacement answers."""
    hv = _by_value("valued_exit", 1)
    pid_before = hv.pid.remote().result(timeout=30)
    sent = hv._router.sent_by_value
    with pytest.raises(rc.ReplicaDied):
        hv.quit.remote().result(timeout=60)
    assert hv._router.sent_by_value == sent + 1
    assert hv.pid.remote().result(timeout=60) != pid_before  # (its replacement)


class Front:
    """Calls ``valued`` by value from its own ``async def`` (a replica is a router's process too)."""

    def __init__(self, model: DeploymentHandle) -> None:
        self.model = model.options(_by_reference=False)

    async def __call__(self, x: int) -> tuple[int, int]:
        return await self.model.double.remote(x), self.model._router.sent_by_value


def test_a_keyboard_interrupt_in_a_method_cancels_its_call_and_the_replica_answers_the_next():
    """By reference and by value, from a plain method and an ``async def``: the caller's
    ``TaskCancelledError``, as Ray's; raised out of the actor's task it stopped the replica's loop,
    and every later call hung."""
    hv = _by_value("valued_interrupt", 1)
    h = hv.options(_by_reference=True)
    pid = hv.pid.remote().result(timeout=30)
    for handle in (h, hv):
        for method in ("interrupt", "interrupt_async"):
            with pytest.raises(TaskCancelledError, match="KeyboardInterrupt"):
                getattr(handle, method).remote().result(timeout=30)
            assert handle.pid.remote().result(timeout=30) == pid, (handle, method)
    assert hv._router.sent_by_value >= 4


def test_a_replica_calls_another_deployment_by_value_from_its_async_method():
    model = deployment(Valued, name="valued_back", num_replicas=1, ray_actor_options=OPTS)
    h = run(deployment(Front, name="valued_front", num_replicas=1, ray_actor_options=OPTS).bind(model.bind()))
    assert h.remote(1).result(timeout=60)[0] == 2
    assert wait_for(lambda: h.remote(2).result(timeout=30)[1] > 0, 30)  # (once it knows the server)
    answers = [h.remote(i).result(timeout=30) for i in range(5)]
    assert [a[0] for a in answers] == [2 * i for i in range(5)]
    assert answers[-1][1] - answers[0][1] == 4  # (each of them by value)


def test_a_frozen_replica_is_left_out_within_seconds_while_the_other_answers_and_back_once_it_thaws():
    """Outlier detection by silence (``rankcore.requests.outliers``): one of two replicas frozen
    (SIGSTOP) under a steady trickle of calls. Within ``QUIET_AFTER_S`` (and a tick) of its oldest
    call the router leaves it out: every later call goes to the other replica, none waits behind the
    frozen one. Thawed, it answers what it held and takes calls again."""
    from rankcore.requests.outliers import QUIET_AFTER_S

    h = run(deployment(Model, name="frozen", num_replicas=2, max_ongoing_requests=4, ray_actor_options=OPTS).bind())
    assert len({h.slow.remote(0.0).result(timeout=30) for _ in range(6)}) == 2  # (both answer)
    victim = sorted(h.ranks())[0]
    actor = ray.get_actor(actor_name("frozen", victim), namespace=NAMESPACE)
    pid = ray.get(actor.handle_request.remote("pid", (), {}), timeout=30)

    def views() -> dict:
        return {v.replica_id: v for v in h._router.machine.pool("frozen")}

    os.kill(pid, signal.SIGSTOP)
    sent: list[tuple[float, Any]] = []
    try:
        t0 = time.monotonic()
        quiet_at = None
        while time.monotonic() - t0 < QUIET_AFTER_S + 6:
            sent.append((time.monotonic(), h.slow.remote(0.01)))
            time.sleep(0.1)
            if quiet_at is None and views()[victim].quiet:
                quiet_at = time.monotonic()
        assert quiet_at is not None, views()
        assert quiet_at - t0 < QUIET_AFTER_S + 2, quiet_at - t0  # (its first call was sent at t0)
        after = [r for t, r in sent if t > quiet_at]
        assert after and all(r.status() is None or r.status().replica_id != victim for r in after)
        on_victim = [r for _, r in sent if (st := r.status()) is not None and st.replica_id == victim]
        assert 1 <= len(on_victim) <= 4, views()  # (what it took before it was left out, within its slots)
    finally:
        os.kill(pid, signal.SIGCONT)
    answers = [r.result(timeout=60) for _, r in sent]
    assert answers.count(victim) >= 1 and all(a.startswith("frozen#") for a in answers)
    assert wait_for(lambda: (h.slow.remote(0.0).result(timeout=30) and not views()[victim].quiet), 30), views()
    c = h.counters()
    assert c.lost == 0 and c.failed == 0
