"""Replicas on placement groups: one detached group per replica, named
``rankcore:<deployment>:<replica_id>``, freed when the replica goes (logical GPUs)."""

from __future__ import annotations

import os
import time

import pytest
import ray

from executors.ray_gpu import deployment, get_controller, get_replica_context, run
from executors.ray_gpu.api.deployments import ask
from executors.ray_gpu.control.controller import NAMESPACE, actor_name
from tests.integration.waiting import wait_for

pytestmark = pytest.mark.usefixtures("local_ray")


def groups(dep: str) -> dict[str, dict]:
    """replica id -> its group's table entry, for the groups not removed."""
    out = {}
    for pg_id, info in ray.util.placement_group_table().items():
        if info["name"].startswith(f"rankcore:{dep}:") and info["state"] != "REMOVED":
            out[info["name"].split(":", 2)[2]] = {**info, "id": pg_id}
    return out


def ask_replica(dep: str, rid: str, method: str = "__call__", *args):
    actor = ray.get_actor(actor_name(dep, rid), namespace=NAMESPACE)
    return ray.get(actor.handle_request.remote(method, args, {}), timeout=30)


@deployment(name="pg", num_replicas=3, ray_actor_options={"num_cpus": 0.05, "num_gpus": 1})
class OnGroup:
    def __call__(self):
        pg = ray.util.get_current_placement_group()
        return pg.id.hex() if pg else None, os.environ.get("CUDA_VISIBLE_DEVICES")


def test_each_replica_runs_in_its_own_group_which_goes_with_it():
    h = run(OnGroup.bind())
    ranks = h.ranks()
    pgs = groups("pg")
    assert set(pgs) == set(ranks)
    seen_gpus = set()
    for rid in ranks:
        info = pgs[rid]
        assert info["state"] == "CREATED"
        assert list(info["bundles"].values()) == [{"CPU": 0.05, "GPU": 1.0}]
        pg_id, gpus = ask_replica("pg", rid)
        assert pg_id == info["id"]  # the replica runs inside its own group
        seen_gpus.add(gpus)
    assert len(seen_gpus) == 3 and None not in seen_gpus  # each replica its own (logical) GPU
    h.scale(1)
    assert wait_for(lambda: set(groups("pg")) == set(h.ranks()))  # the stopped replicas' groups are gone
    ctl = get_controller()
    assert ask(ctl, "state_errors") == []
    h.scale(0)
    assert wait_for(lambda: not groups("pg"))


@deployment(name="big", num_replicas=3, ray_actor_options={"num_cpus": 0.05, "num_gpus": 2})
class Big:
    def __call__(self):
        return get_replica_context().rank.rank


def test_a_replica_waiting_for_capacity_holds_its_rank_and_stops_at_once():
    """4 logical GPUs, 3 replicas of 2 GPUs: the third waits for capacity with its
    rank held (in the core's queue: no node has room, so it is placed nowhere and
    has no group yet); a downscale to 2 stops it without waiting on anything."""
    ctl = get_controller()
    d = Big
    ask(ctl, "apply", d.name, 3, None, d.cls, (), {}, d.ray_actor_options, d.max_ongoing_requests, d.placement)
    assert wait_for(lambda: len(ask(ctl, "pool", "big")["serving"]) == 2, 60)
    ranks = ask(ctl, "ranks", "big")
    assert sorted(r[0] for r in ranks.values()) == [0, 1, 2]  # the waiting one already holds rank 2
    (waiting,) = [rid for rid, r in ranks.items() if r[0] == 2]
    assert ranks[waiting] == (2, None, None)  # not placed: no node or local rank
    assert waiting not in groups("big") and len(groups("big")) == 2
    t0 = time.monotonic()
    ask(ctl, "scale", "big", 2, ())
    assert ask(ctl, "wait_healthy", "big", 30)
    assert time.monotonic() - t0 < 10  # nothing to drain: it did not wait out a timeout
    assert sorted(r[0] for r in ask(ctl, "ranks", "big").values()) == [0, 1]
    assert wait_for(lambda: set(groups("big")) == set(ask(ctl, "ranks", "big")))
    assert ask(ctl, "state_errors") == []
    ask(ctl, "scale", "big", 0, ())
    assert wait_for(lambda: not groups("big"))


@ray.remote(num_cpus=0.05, num_gpus=1)
def _worker():
    return ray.get_gpu_ids(), ray.util.get_current_placement_group().id.hex()


@deployment(name="tp", num_replicas=2, ray_actor_options={"num_cpus": 0.05},
            placement_group_bundles=[{"CPU": 0.05}, {"CPU": 0.05, "GPU": 1}], placement_group_strategy="STRICT_PACK")
class WithWorker:
    """The replica in bundle 0 (no GPU); its worker task lands in bundle 1 (the GPU)."""

    def __call__(self):
        gpus, pg = ray.get(_worker.remote())
        return len(gpus), pg, ray.util.get_current_placement_group().id.hex()


def test_extra_bundles_hold_the_replicas_own_workers():
    h = run(WithWorker.bind())
    pgs = groups("tp")
    assert set(pgs) == set(h.ranks())
    for rid, info in pgs.items():
        assert info["strategy"] == "STRICT_PACK"
        assert list(info["bundles"].values()) == [{"CPU": 0.05}, {"CPU": 0.05, "GPU": 1.0}]
        n_gpus, worker_pg, replica_pg = ask_replica("tp", rid)
        assert n_gpus == 1 and worker_pg == replica_pg == info["id"]
    h.scale(0)
    assert wait_for(lambda: not groups("tp"))


@deployment(name="kept", num_replicas=2, ray_actor_options={"num_cpus": 0.05, "num_gpus": 0.5})
class Kept:
    def __call__(self):
        return get_replica_context().replica_id


def test_a_restarted_controller_keeps_live_replicas_groups_and_removes_orphans():
    h = run(Kept.bind())
    before = groups("kept")
    orphan = ray.util.placement_group([{"CPU": 0.01}], name="rankcore:kept:kept#999", lifetime="detached")
    ray.get(orphan.ready(), timeout=30)
    ray.kill(get_controller(), no_restart=False)  # (returns at once: ask until the new one recovered)
    assert wait_for(lambda: h.ranks() and set(groups("kept")) == set(before))
    assert {rid: g["id"] for rid, g in groups("kept").items()} == {rid: g["id"] for rid, g in before.items()}
    h.scale(1)  # a recovered replica's group is released on stop too
    assert wait_for(lambda: set(groups("kept")) == set(h.ranks()))
    h.scale(0)
    assert wait_for(lambda: not groups("kept"))
