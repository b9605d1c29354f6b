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


def test_handles_made_by_method_share_the_replicas_and_counts_and_pickle_without_them():
    import pickle

    h = DeploymentHandle("d", controller=None)
    assert h.other._router is h._router and h.other.method == "other"
    copy = pickle.loads(pickle.dumps(h.other))
    assert (copy.name, copy.method) == ("d", "other") and copy._router is not h._router
