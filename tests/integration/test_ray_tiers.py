"""GPU memory, eviction and the WARM cache on Ray with real tensors (issue 21; docs/ray.md,
"GPU memory, eviction and the warm cache").

One local Ray for the module with ONE logical GPU (no CUDA needed), declared to the core as
1000 bytes of GPU memory (``book_memory``): two models of 600 "bytes" each fit one at a time,
so deploying the second evicts the first. Each replica's constructor draws random weights
(a fresh seed per process), so a replica that answers with the evicted one's exact weights
took them from the node's WARM cache or COLD file, never from its constructor.
"""

from __future__ import annotations

import os
import time

import pytest
import ray
import torch

from executors.ray_gpu import deployment, get_controller, run
from executors.ray_gpu.api.deployments import ask, book_memory, delete, tiers_status, wait_serving
from executors.ray_gpu.control.controller import NAMESPACE, actor_name
from tests.integration.waiting import wait_for

X = torch.linspace(-1, 1, 64)
GPU_MEMORY = 1000
MODEL = 600  # the core's model_bytes: two do not fit on the one GPU


pytestmark = pytest.mark.usefixtures("one_gpu_ray")


@pytest.fixture(autouse=True)
def clean():
    yield
    ask(get_controller(), "reset")


class Model:
    """Holds weights (the contract of replica_weights.py); random ones, drawn per process."""

    def __init__(self) -> None:
        torch.manual_seed(int.from_bytes(os.urandom(4), "little"))
        self.model = torch.nn.Sequential(torch.nn.Linear(64, 128), torch.nn.Tanh(), torch.nn.Linear(128, 64))

    def state_dict(self):
        return self.model.state_dict()

    def load_state_dict(self, state_dict, assign=False):
        return self.model.load_state_dict(state_dict, assign=assign)

    def __call__(self, x):
        with torch.no_grad():
            return self.model(x)


def tiered(name: str):
    return deployment(Model, name=name, num_replicas=1, ray_actor_options={"num_gpus": 1},
                      model_bytes=MODEL, min_deployment_time_s=0.0)


def only(dep: str) -> str:
    (rid,) = ask(get_controller(), "ranks", dep)
    return rid


def replica(dep: str, rid: str):
    return ray.get_actor(actor_name(dep, rid), namespace=NAMESPACE)


def exported(dep: str, rid: str) -> dict:
    return ray.get(replica(dep, rid).export_weights.remote(), timeout=30)


def info(dep: str, rid: str) -> dict:
    return ray.get(replica(dep, rid).weights_info.remote(), timeout=30)


def same(a: dict, b: dict) -> bool:
    return set(a) == set(b) and all(torch.equal(a[k], b[k]) for k in a)


def evict_and_reload(cpu_cache: int) -> dict:
    """Deploy a, then b (evicts a), then scale b to 0 (a reloads): what each step showed."""
    nodes = book_memory(gpu_memory=GPU_MEMORY, cpu_cache=cpu_cache)
    assert [(devices, cache) for _, devices, cache in nodes] == [((GPU_MEMORY,), cpu_cache)]  # NodeJoined
    ha = run(tiered("a").bind())
    a0 = only("a")
    before, answer = exported("a", a0), ha.remote(X).result(timeout=30)
    assert info("a", a0)["devices"] == (0,) and info("a", a0)["loaded_from"] == "constructor"
    hb = run(tiered("b").bind())  # a is evicted for it: a's replica leaves, its replacement waits
    b0 = only("b")
    assert info("b", b0)["devices"] == (0,)
    assert torch.equal(hb.remote(X).result(timeout=30), hb.remote(X).result(timeout=30))
    st = ask(get_controller(), "deployment_status", "a")
    assert a0 not in st["replicas"] and not st["healthy"]
    evicted = [e for e in tiers_status()["log"] if e["move"] == "evict"]
    assert [(e["replica"], e["deployment"]) for e in evicted] == [(a0, "a")]
    caches = tiers_status()["caches"]
    hb.scale(0)  # room again: a's replacement is placed, from the WARM copy if the node kept one
    wait_serving("a", timeout=60)
    a1 = only("a")
    assert a1 != a0
    after = exported("a", a1)
    assert same(after, before)  # bit-identical (its constructor drew other weights)
    assert torch.equal(ha.remote(X).result(timeout=30), answer)  # answers unchanged
    assert ask(get_controller(), "status")["rejected_events"] == 0
    return {"evicted": evicted[0], "caches_while_evicted": caches, "reloaded": info("a", a1),
            "log": tiers_status()["log"], "caches_after": tiers_status()["caches"]}


def test_an_evicted_model_reloads_from_the_warm_cache_bit_identical():
    t0 = time.monotonic()
    seen = evict_and_reload(cpu_cache=GPU_MEMORY)  # one model's copy fits in the cache
    nbytes = seen["reloaded"]["nbytes"]
    assert nbytes == sum(t.numel() * t.element_size() for t in Model().state_dict().values())
    assert seen["evicted"]["to"] == "warm" and seen["evicted"]["nbytes"] == nbytes  # the tensors' real size
    (held,) = seen["caches_while_evicted"].values()
    assert held["held_bytes"] == nbytes and list(held["entries"].values()) == [nbytes]
    assert (seen["reloaded"]["source"], seen["reloaded"]["loaded_from"], seen["reloaded"]["note"]) == \
        ("warm", "warm", "")
    (after,) = seen["caches_after"].values()
    assert after == {"entries": {}, "held_bytes": 0}  # the copy was used up by the reload
    assert time.monotonic() - t0 < 60


def test_a_cache_too_small_sends_the_evicted_model_cold_and_it_reloads_bit_identical_from_its_file():
    seen = evict_and_reload(cpu_cache=MODEL - 1)  # its copy does not fit: COLD
    assert seen["evicted"]["to"] == "cold" and seen["evicted"]["nbytes"] == seen["reloaded"]["nbytes"]
    assert all(c["held_bytes"] == 0 for c in seen["caches_while_evicted"].values())
    assert (seen["reloaded"]["source"], seen["reloaded"]["loaded_from"]) == ("cold", "cold")


def test_the_cold_files_go_when_their_deployment_is_deleted_and_when_the_run_is_reset(tmp_path):
    """Issue 36: the COLD files (``<cold_dir>/<epoch>/<node>/<deployment>.safetensors``) are
    the run's: a deleted deployment's go once the core forgets it, the rest on a reset, with
    the folders they leave empty (the folder the user named stays)."""
    cold = tmp_path / "cold"

    def files() -> list[str]:
        return sorted(p.name for p in cold.rglob("*.safetensors"))

    book_memory(gpu_memory=GPU_MEMORY, cpu_cache=MODEL - 1, cold_dir=str(cold))  # no WARM room: COLD
    run(tiered("a").bind())
    hb = run(tiered("b").bind())  # a is evicted to its COLD file
    assert wait_for(lambda: files() == ["a.safetensors"], timeout=30), files()
    delete("a")
    # its epoch's folder goes with it (removed just after the file: wait for both, not one then the other)
    assert wait_for(lambda: files() == [] and list(cold.iterdir()) == [], timeout=30), list(cold.rglob("*"))
    hb.scale(0)
    run(tiered("c").bind())
    hb.scale(1)  # b evicts c to its COLD file
    assert wait_for(lambda: files() == ["c.safetensors"], timeout=60), files()
    ask(get_controller(), "reset")
    assert files() == [] and cold.is_dir() and list(cold.iterdir()) == []


def test_without_book_memory_nodes_count_gpus_and_model_bytes_change_nothing():
    h = run(tiered("plain").bind())
    rid = only("plain")
    assert info("plain", rid)["devices"] == () and info("plain", rid)["source"] == ""
    assert torch.equal(h.remote(X).result(timeout=30), h.remote(X).result(timeout=30))
    assert wait_for(lambda: tiers_status()["log"] == [], timeout=1)


def test_a_restarted_controller_keeps_the_warm_copy_and_the_evicted_model_reloads_from_it():
    """The nodes' WARM caches outlive the controller: the restarted one tells the core the
    copies (``ControllerRecovered.warm_copies``), so a's replacement waits without evicting b
    and, once room frees, loads a's evicted weights from the node's cache, bit-identical."""
    from ray import cloudpickle

    t0 = time.monotonic()
    book_memory(gpu_memory=GPU_MEMORY, cpu_cache=GPU_MEMORY)
    ha = run(tiered("a").bind())
    a0 = only("a")
    before, answer = exported("a", a0), ha.remote(X).result(timeout=30)
    hb = run(tiered("b").bind())  # evicts a to the node's WARM cache
    b0 = only("b")
    (held,) = tiers_status()["caches"].values()
    assert list(held["entries"]) == [f"a/{a0}"]
    ray.kill(get_controller(), no_restart=False)  # (returns at once: ask until the new one recovered)
    assert list(ask(get_controller(), "ranks", "b")) == [b0]
    state = cloudpickle.loads(ask(get_controller(), "state"))
    (node,) = state.cluster.caches.keys()
    assert [(e.deployment, e.replica_id, e.nbytes) for e in state.cluster.caches[node]] == [("a", a0, MODEL)]
    # no eviction back: b keeps its replica, a's replacement waits for room
    assert {r: x.phase.value for r, x in state.deployments["b"].replicas.items()} == {b0: "running"}
    assert [x.phase.value for x in state.deployments["a"].replicas.values()] == ["pending"]
    hb.scale(0)  # room again: a's replacement is placed from the WARM copy the new controller was told of
    wait_serving("a", timeout=60)
    a1 = only("a")
    assert (info("a", a1)["source"], info("a", a1)["loaded_from"], info("a", a1)["note"]) == ("warm", "warm", "")
    assert same(exported("a", a1), before)  # bit-identical (its constructor drew other weights)
    assert torch.equal(ha.remote(X).result(timeout=30), answer)
    assert ask(get_controller(), "status")["rejected_events"] == 0
    assert tiers_status()["caches"] == {node: {"entries": {}, "held_bytes": 0}}  # used up by the reload
    assert time.monotonic() - t0 < 60
