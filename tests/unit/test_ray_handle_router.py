"""The handle's view of the serving replicas (``executors.ray_gpu.api._Router``),
without a cluster: what a call that saw a replica die does to it, and how the
controller's answers (its long poll) update it."""

from __future__ import annotations

from executors.ray_gpu.api import DeploymentHandle, _Router


def router(*ids: str) -> _Router:
    r = _Router("d", controller=None)
    r._take([(rid, f"actor-{rid}") for rid in ids], 5)
    return r


def test_a_replica_seen_dead_is_left_out_until_the_controller_stops_listing_it():
    r = router("d#0", "d#1", "d#2")
    r.inflight["d#1"] = ["ref"]
    r.died("d#1")
    assert [rid for rid, _ in r.endpoints] == ["d#0", "d#2"] and "d#1" not in r.inflight
    r._take([("d#0", "a"), ("d#1", "b"), ("d#2", "c")], 5)  # the controller has not seen the death yet
    assert [rid for rid, _ in r.endpoints] == ["d#0", "d#2"]
    assert r.known == ("d#0", "d#1", "d#2")  # (what the next long poll compares with)
    r._take([("d#0", "a"), ("d#2", "c"), ("d#3", "e")], 5)  # it has: d#3 replaces it
    assert [rid for rid, _ in r.endpoints] == ["d#0", "d#2", "d#3"] and r.dead == set()


def test_a_replica_unreachable_for_now_comes_back_with_the_controllers_next_answer():
    r = router("d#0", "d#1")
    r.died("d#1", for_good=False)  # ActorUnavailableError: maybe alive
    assert [rid for rid, _ in r.endpoints] == ["d#0"] and r.dead == set()
    r._take([("d#0", "a"), ("d#1", "b")], 5)
    assert [rid for rid, _ in r.endpoints] == ["d#0", "d#1"]


def test_every_handle_of_a_deployment_in_a_process_shares_one_router_and_pickles_without_it():
    """handle.method, a second handle, an unpickled copy: one router (one long
    poll on the controller, one set of counts) per deployment per process."""
    import pickle

    h = DeploymentHandle("d", controller=None)
    assert h.other._router is h._router and h.other.method == "other"
    assert "_Router" not in repr(pickle.dumps(h.other))  # it travels without its router
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
