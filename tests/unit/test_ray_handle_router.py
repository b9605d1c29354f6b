"""The handle's request path (``executors.ray_gpu.base.router.Router``: the request machine carried
out), without a cluster: fake actors whose calls end when a test says, and pool answers as the
controller's long poll gives them."""

from __future__ import annotations

from concurrent.futures import Future

import pytest
from ray.exceptions import RayActorError

import rankcore as rc
from executors.ray_gpu.api.deployments import DeploymentHandle, DeploymentResponse
from executors.ray_gpu.base.context import from_wire
from executors.ray_gpu.base.router import Router


class _Ref:
    def __init__(self) -> None:
        self.f: Future = Future()

    def future(self) -> Future:
        return self.f


class _Actor:
    """A replica: each call is a pending ``_Ref`` the test ends."""

    def __init__(self, rid: str) -> None:
        self.rid, self.calls, self.requests, self.keys = rid, [], [], []
        self.handle_call = _Packed(self)
        self._actor_id = _Id(f"actor-{rid}")

    def remote(self, method: str, args: tuple, kwargs: dict, request: object = None, key: int = 0) -> _Ref:
        """``request``: the call's request context (its id, route), sent with every call; ``key``:
        what the replica's witness records as the call begins."""
        ref = _Ref()
        self.calls.append((method, args, ref))
        self.requests.append(request)
        self.keys.append(key)
        return ref


class _Packed:
    """The replica's ``handle_call``: the call in one argument, its request context as a plain tuple
    (``context.to_wire``), as the router sends it."""

    def __init__(self, actor: _Actor) -> None:
        self.actor = actor

    def remote(self, call: tuple) -> _Ref:
        method, args, kwargs, request, key = call
        assert request is None or (type(request) is tuple and all(type(f) is str for f in request)), request
        return self.actor.remote(method, args, kwargs, from_wire(request), key)


class _Id:
    def __init__(self, h: str) -> None:
        self.h = h

    def hex(self) -> str:
        return self.h


def pool(actors: dict, draining=(), coming=True, ongoing=5, queued=-1, idempotent=(), version=1,
         nodes=None) -> dict:
    out = {"version": version, "serving": list(actors.items()), "draining": list(draining), "coming": coming,
           "max_ongoing_requests": ongoing, "max_queued_requests": queued, "idempotent": list(idempotent)}
    if nodes is not None:
        out["nodes"] = nodes
    return out


def router(actors: dict, **kw) -> Router:
    r = Router("d", controller=None)
    r.refresh = lambda force=False: None  # (no controller: the test gives the pool)
    with r.lock:
        r._take(pool(actors, **kw))
    return r


def test_calls_go_to_the_least_loaded_replica_and_queue_past_max_ongoing_requests() -> None:
    a, b = _Actor("d#0"), _Actor("d#1")
    r = router({"d#0": a, "d#1": b}, ongoing=1)
    c1, c2, c3 = (r.submit("__call__", (i,), {}) for i in range(3))
    assert (len(a.calls), len(b.calls)) == (1, 1)
    assert c3.status().state == "queued" and c3.status().position == 0
    a.calls[0][2].f.set_result("one")
    assert c1.future.result(1) == "one" and len(a.calls) == 2  # the freed slot took the queued call
    b.calls[0][2].f.set_result("two")
    a.calls[1][2].f.set_result("three")
    assert (c2.future.result(1), c3.future.result(1)) == ("two", "three")
    assert r.counters().answered == 3 and r.counters().lost == 0


def test_past_max_queued_requests_a_call_is_refused_at_once() -> None:
    r = router({"d#0": _Actor("d#0")}, ongoing=1, queued=1)
    r.submit("__call__", (), {})
    r.submit("__call__", (), {})  # queued
    third = DeploymentResponse(r.submit("__call__", (), {}))
    with pytest.raises(rc.Overloaded) as err:
        third.result(1)
    assert err.value.status == 503 and err.value.deployment == "d"


def test_with_none_serving_a_call_waits_while_replicas_come_and_fails_at_once_when_none_will() -> None:
    r = router({}, coming=True)
    waiting = r.submit("__call__", (), {})
    assert waiting.status().state == "loading"
    a = _Actor("d#0")
    with r.lock:
        r._take(pool({"d#0": a}, version=2))
    a.calls[0][2].f.set_result("late but answered")
    assert waiting.future.result(1) == "late but answered"
    with r.lock:
        r._take(pool({}, coming=False, version=3))
    with pytest.raises(rc.Unavailable):
        DeploymentResponse(r.submit("__call__", (), {})).result(1)


def test_a_call_whose_replica_dies_runs_again_only_if_its_method_is_idempotent() -> None:
    a, b = _Actor("d#0"), _Actor("d#1")
    r = router({"d#0": a, "d#1": b}, ongoing=1, idempotent=("read",))
    plain = r.submit("__call__", (), {})
    read = r.submit("read", (), {})
    dying, other = (a, b) if a.calls and a.calls[0][0] == "__call__" else (b, a)
    dying.calls[0][2].f.set_exception(RayActorError())
    with pytest.raises(rc.ReplicaDied, match=dying.rid) as err:
        plain.future.result(1)
    assert err.value.replica_id == dying.rid and err.value.status == 500
    assert dying.rid in r.dead and dying.rid not in r.actors
    other.calls[0][2].f.set_exception(RayActorError())  # the idempotent call's replica dies too: none left
    assert not read.future.done()  # (queued again, waiting for a replica: both died, more are coming)
    c = _Actor("d#2")
    with r.lock:  # the controller has not seen the deaths yet: still lists them, and a new one
        r._take(pool({"d#0": a, "d#1": b, "d#2": c}, version=2))
    assert set(r.actors) == {"d#2"}  # left out until the controller stops listing them
    assert c.calls[0][0] == "read"
    c.calls[0][2].f.set_result("again")
    assert read.future.result(1) == "again" and r.counters().retried == 1
    with r.lock:
        r._take(pool({"d#2": c}, version=3))
    assert r.dead == set()


def test_an_application_error_is_an_answer_the_caller_gets_not_a_retry() -> None:
    a = _Actor("d#0")
    r = router({"d#0": a}, idempotent=("__call__",))
    call = r.submit("__call__", (), {})
    a.calls[0][2].f.set_exception(ValueError("bad input"))
    with pytest.raises(ValueError, match="bad input"):
        call.future.result(1)
    assert len(a.calls) == 1 and r.counters().app_errors == 1


def test_every_handle_of_a_deployment_in_a_process_shares_one_router_and_pickles_without_it():
    """handle.method, a second handle, an unpickled copy: one router (one long
    poll on the controller, one set of counts) per deployment per process."""
    import pickle

    h = DeploymentHandle("d", controller=None)
    assert h.other._router is h._router and h.other.method == "other"
    assert "Router" not in repr(pickle.dumps(h.other))  # it travels without its router
    copy = pickle.loads(pickle.dumps(h.other))
    assert (copy.name, copy.method) == ("d", "other") and copy._router is h._router
    assert DeploymentHandle("d", controller=None)._router is h._router
    assert DeploymentHandle("e", controller=None)._router is not h._router


def test_a_hang_that_did_not_take_on_ray_is_a_failed_result_not_a_pass(monkeypatch):
    """The scenario's hang on Ray: a signal that failed, or a process still
    answering after SIGSTOP, fails the run (it was recorded as "nothing to
    hang", passed)."""
    from executors.ray_gpu import scenario
    from executors.scenarios.timeline import Hang

    target = scenario._RayTarget.__new__(scenario._RayTarget)
    target.results, target.down = [], True
    monkeypatch.setattr(target, "_hit", lambda action: ("llm#0", None, object()))

    def still_answers(actor: object) -> bool:
        raise RuntimeError("hang: replica process 7 still answers after SIGSTOP")

    monkeypatch.setattr(scenario, "_freeze", still_answers)
    target.hang(Hang(replica="llm#0"))
    ((what, ok, detail),) = target.results
    assert what.startswith("hang") and not ok and "llm#0 could not be frozen" in detail and "still answers" in detail
    monkeypatch.setattr(scenario, "_freeze", lambda actor: False)  # it died meanwhile: nothing to hang
    target.hang(Hang(replica="llm#0"))
    assert target.results[-1][1] is True and "nothing to hang" in target.results[-1][2]


def test_a_load_reporter_pushes_nothing_once_ray_is_shut_down(monkeypatch):
    """A router's load pushes run on timer threads: after ``ray.shutdown`` (a test module's end) one
    would call ``.remote`` on the old controller's handle, which starts a new Ray from that thread and
    broke the next module's ``ray.init`` (the whole CI run stopped at the next module)."""
    from executors.ray_gpu.base import autoscale
    from executors.ray_gpu.base.autoscale import LoadReporter

    monkeypatch.setattr(autoscale.ray, "is_initialized", lambda: False)  # (Ray is gone)
    pushed: list = []
    reporter = LoadReporter(lambda: (3, (("m#0", 2),)), lambda *a: pushed.append(a))
    reporter.kick(urgent=True)
    reporter.kick()
    assert pushed == [] and reporter.pushes == 0


class _Controller:
    """The long poll never answers (the test asks ``pool`` through ``ask`` only)."""

    class _Poll:
        def remote(self, *args: object) -> _Ref:
            return _Ref()

    pool_after = _Poll()


def test_a_forced_pool_ask_leaves_the_lock_free_for_the_calls_answers(monkeypatch):
    """``refresh(force=True)`` (``scale``, ``broadcast``) asks the controller without the router's
    lock: Ray delivers that answer on the thread that runs the calls' completion callbacks, which
    take the lock, so holding it there stalled the answer for the ask's whole 60 s (CI: the
    controller-restart test's ``h.scale(4)`` timed out in ``pool``)."""
    import threading

    from executors.ray_gpu.base import router as router_mod

    monkeypatch.setattr(router_mod.ray, "is_initialized", lambda: True)
    a = _Actor("d#0")
    free: list = []

    def ask(controller: object, method: str, *args: object) -> dict:
        assert method == "pool"
        t = threading.Thread(target=lambda: free.append(r.lock.acquire(timeout=2) and (r.lock.release() or True)))
        t.start()
        t.join()  # (what a call's completion callback on Ray's thread does meanwhile)
        return pool({"d#0": a}, version=(1, 2))

    r = Router("d", controller=_Controller(), ask=ask)
    r.refresh(force=True)
    assert free == [True] and r.version == (1, 2) and list(r.actors) == ["d#0"]


def test_a_pool_answer_older_than_the_one_taken_is_dropped() -> None:
    """A forced ask and the long poll can cross: the answer the controller gave first must not undo
    the later one (a replica it had already dropped would be served again)."""
    a, b = _Actor("d#0"), _Actor("d#1")
    r = router({"d#0": a, "d#1": b}, version=(1, 3))
    with r.lock:
        r._take(pool({"d#0": a}, version=(1, 4)))  # d#1 gone
        r._take(pool({"d#0": a, "d#1": b}, version=(1, 3)))  # the older answer, late
    assert r.version == (1, 4) and list(r.actors) == ["d#0"]
    with r.lock:
        r._take(pool({"d#0": a, "d#1": b}, version=(2, 0)))  # a restarted controller's first answer
    assert r.version == (2, 0) and sorted(r.actors) == ["d#0", "d#1"]


def _witnessing(monkeypatch, began):
    """A router of two replicas on nodes n0 / n1 whose witness answers ``began(actor_id, keys)``
    when the test runs the asks it queued (``asks``), as the router's thread would."""
    import executors.ray_gpu.base.router as router_mod

    asked: list = []
    monkeypatch.setattr(router_mod, "ask_node", lambda node, actor_id, keys: asked.append((node, actor_id)) or
                        began(actor_id, keys))
    a, b = _Actor("d#0"), _Actor("d#1")
    r = router({"d#0": a, "d#1": b}, ongoing=2, nodes={"d#0": "n0", "d#1": "n1"})
    asks: list = []
    r._later = asks.append
    return r, a, b, asks, asked


def test_a_plain_call_a_dead_replica_never_began_is_sent_to_another_and_one_it_began_fails(monkeypatch) -> None:
    r, a, b, asks, asked = _witnessing(monkeypatch, lambda actor_id, keys: keys[:1])  # (the first began)
    calls = [r.submit("__call__", (i,), {}) for i in range(4)]  # (two on each)
    on_a = [c for c in calls if c.replica_id == "d#0"]
    assert len(on_a) == 2 and len(a.keys) == 2 and all(a.keys) and len(set(a.keys + b.keys)) == 4
    a.calls[0][2].f.set_exception(RayActorError())
    assert asks and "d#0" in r.asking and "d#0" not in r.actors
    a.calls[1][2].f.set_exception(RayActorError())  # (the second death waits for the same answer)
    assert len(asks) == 1 and not any(c.future.done() for c in on_a)
    extra = r.submit("__call__", (9,), {})  # (d#0 drains while its witness is asked: nothing new there)
    assert extra.status().state == "queued" and len(a.calls) == 2
    with r.lock:  # a pool answer while asking keeps it (as draining): its calls are not failed by it
        r._take(pool({"d#0": a, "d#1": b}, ongoing=2, nodes={"d#0": "n0", "d#1": "n1"}, version=2))
    assert not any(c.future.done() for c in on_a) and "d#0" not in r.actors
    asks.pop()()
    assert asked == [("n0", "actor-d#0")]
    with pytest.raises(rc.ReplicaDied, match="d#0"):
        on_a[0].future.result(1)  # (it began: never run twice)
    assert on_a[1].status().state in ("queued", "dispatched") and not on_a[1].future.done()
    for ref in [ref for _, _, ref in b.calls]:
        ref.f.set_result("b")
    for _ in range(3):  # (the requeued call and the extra one follow on d#1's freed slots)
        for ref in [ref for _, _, ref in b.calls if not ref.f.done()]:
            ref.f.set_result("b")
    assert on_a[1].future.result(1) == "b" and extra.future.result(1) == "b"
    c = r.counters()
    assert (c.failed, c.answered, c.retried, c.lost) == (1, 4, 0, 0)
    assert list(r.witnessed) == [("d#0", 2, 1)] and not r.asking


def test_a_witness_that_cannot_say_fails_every_call_as_begun(monkeypatch) -> None:
    r, a, _b, asks, _ = _witnessing(monkeypatch, lambda actor_id, keys: None)
    calls = [r.submit("__call__", (i,), {}) for i in range(2)]
    on_a = [c for c in calls if c.replica_id == "d#0"]
    a.calls[0][2].f.set_exception(RayActorError())
    asks.pop()()
    for c in on_a:
        with pytest.raises(rc.ReplicaDied):
            c.future.result(1)
    assert list(r.witnessed) == [("d#0", 1, None)]


def test_without_its_node_a_dead_replicas_calls_fail_at_once(monkeypatch) -> None:
    a, b = _Actor("d#0"), _Actor("d#1")
    r = router({"d#0": a, "d#1": b}, ongoing=1)  # (no "nodes": an older controller)
    asks: list = []
    r._later = asks.append
    call = r.submit("__call__", (), {})
    dying = a if a.calls else b
    dying.calls[0][2].f.set_exception(RayActorError())
    with pytest.raises(rc.ReplicaDied):
        call.future.result(1)
    assert not asks and not r.witnessed


def test_the_witness_answers_a_router_keeps_are_bounded(monkeypatch) -> None:
    """A router lives as long as its handle, through any number of deaths: it keeps the last
    ``WITNESSED`` witness answers, not one per death for ever."""
    from executors.ray_gpu.base.router import WITNESSED

    r, *_ = _witnessing(monkeypatch, lambda actor_id, keys: [])
    for i in range(WITNESSED + 5):
        r._witnessed(f"d#{i}", {}, [])
    assert len(r.witnessed) == WITNESSED and r.witnessed[0] == ("d#5", 0, 0)
    assert r.witnessed[-1] == (f"d#{WITNESSED + 4}", 0, 0)


def test_replicas_populated_once_a_pool_answer_named_a_serving_replica_and_stays_so() -> None:
    """Serve's ``running_replicas_populated``: a worker node's proxy is ready for traffic once a handle
    of its routes has heard of a serving replica (``IngressState.unready``); a later scale to zero
    keeps it so, as Serve's."""
    r = router({}, coming=True)
    assert r.populated is False
    with r.lock:
        r._take(pool({"d#0": _Actor("d#0")}, version=2))
    assert r.populated is True
    with r.lock:
        r._take(pool({}, coming=False, version=3))
    assert r.populated is True
    assert DeploymentHandle("d", None, router=r).replicas_populated() is True
