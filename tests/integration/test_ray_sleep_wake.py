"""Sleep, wake and weight pushes on Ray with real tensors (issue 21; docs/ray.md, "Sleep, wake and weights").

One local Ray for the module (4 logical GPUs, CPU-only torch): the weights'
device is the CPU here, so these tests cannot show GPU memory being given
back. What they show: the real tensors a replica serves from move HOT ->
WARM -> HOT bit-identical, a push lands bit-identical in every tier, a
sleeper's device buffer is released (its instance holds ``meta`` tensors,
its ``TieredWeights`` is WARM and holds the bytes on the host), a static
replica keeps its process, rank, bundle and world_size while another actor
runs in its bundle, a push reaches a replica that is starting, a controller
restart keeps a deployment asleep, and a small scenario gives the same tier
history per rank on the simulator and on Ray.
"""

from __future__ import annotations

import io
import json
import time
from collections import defaultdict
from pathlib import Path

import pytest
import ray
import torch

from executors.ray_gpu import StaticPlacementConfig, deployment, get_controller, get_replica_context, run
from executors.ray_gpu.api.deployments import ask, push_weights, sleep, wait_serving, wake, weights_status
from executors.ray_gpu.control.controller import NAMESPACE, actor_name
from executors.ray_gpu.scenario import run_on_ray
from executors.sim import Simulation, load_scenario
from tests.integration.waiting import wait_for

ROOT = Path(__file__).resolve().parents[2]
pytestmark = pytest.mark.usefixtures("local_ray")
X = torch.linspace(-1, 1, 256)


def make_model(seed: int) -> torch.nn.Module:
    torch.manual_seed(seed)
    return torch.nn.Sequential(torch.nn.Linear(256, 512), torch.nn.Tanh(), torch.nn.Linear(512, 256))  # ~1 MB


def weights(seed: int) -> dict:
    return {k: v.detach().clone() for k, v in make_model(seed).state_dict().items()}


class Policy:
    """The weights contract: the class wraps a torch module and forwards ``state_dict`` /
    ``load_state_dict`` to it (replica_weights.py)."""

    def __init__(self, start_delay: float = 0.0) -> None:
        time.sleep(start_delay)
        self.model = make_model(0)

    def state_dict(self):
        return self.model.state_dict()

    def load_state_dict(self, state_dict, assign=False):
        return self.model.load_state_dict(state_dict, assign=assign)

    def __call__(self, x):
        with torch.no_grad():
            return self.model(x)

    def whoami(self) -> dict:
        ctx = get_replica_context()
        rt = ray.get_runtime_context()
        return {"rid": ctx.replica_id, "rank": ctx.rank.as_tuple(), "world_size": ctx.world_size,
                "bundles": ctx.bundle_indices, "weights_version": ctx.weights_version, "tier": ctx.tier,
                "pg": rt.get_placement_group_id(), "node": rt.get_node_id(), "pid": __import__("os").getpid()}

    def devices(self) -> list:
        return sorted({p.device.type for p in self.model.parameters()})


@pytest.fixture(autouse=True)
def clean():
    yield
    ask(get_controller(), "reset")


def actor(dep: str, rid: str):
    return ray.get_actor(actor_name(dep, rid), namespace=NAMESPACE)


def call(dep: str, rid: str, method: str, *args):
    """Call a replica's method directly (a sleeper gets no call from a handle)."""
    return ray.get(actor(dep, rid).handle_request.remote(method, args, {}), timeout=30)


def exported(dep: str, rid: str) -> dict:
    return ray.get(actor(dep, rid).export_weights.remote(), timeout=30)


def same(a: dict, b: dict) -> bool:
    return set(a) == set(b) and all(torch.equal(a[k], b[k]) for k in a)


# --------------------------------------------------------------- (a) real tensors
def test_weights_round_trip_bit_identical_and_pushes_land_in_every_tier():
    h = run(deployment(Policy, name="pol", num_replicas=1).bind())
    (rid,) = h.ranks()
    initial = weights(0)
    assert same(exported("pol", rid), initial)
    answer0 = h.remote(X).result(timeout=30)
    assert torch.equal(answer0, make_model(0)(X).detach())

    sleep("pol", timeout=30)
    w = weights_status("pol")[rid]
    assert (w["tier"], w["tiered_tier"], w["residency"], w["holds"]) == ("warm", "warm", "warm", True)
    assert w["nbytes"] == sum(t.numel() * t.element_size() for t in initial.values())
    assert w["host_nbytes"] == w["nbytes"]  # the WARM copy, and nothing on a device
    assert call("pol", rid, "devices") == ["meta"]  # the instance keeps no reference to the device buffer
    assert h.ranks()[rid] == (0, 0, 0)

    wake("pol", timeout=30)
    assert same(exported("pol", rid), initial)  # HOT -> WARM -> HOT: bit-identical
    assert torch.equal(h.remote(X).result(timeout=30), answer0)  # and answers unchanged

    v1 = weights(1)
    push_weights("pol", v1, 1, wait=True, timeout=30)  # in place, HOT
    assert same(exported("pol", rid), v1)
    answer1 = h.remote(X).result(timeout=30)
    assert torch.equal(answer1, make_model(1)(X).detach()) and not torch.equal(answer1, answer0)

    sleep("pol", timeout=30)
    v2 = weights(2)
    push_weights("pol", v2, 2)  # into the sleeper's CPU copy
    assert wait_for(lambda: weights_status("pol")[rid]["version"] == 2, timeout=30)
    assert weights_status("pol")[rid]["tier"] == "warm"
    wake("pol", timeout=30)
    assert same(exported("pol", rid), v2)
    assert torch.equal(h.remote(X).result(timeout=30), make_model(2)(X).detach())
    assert call("pol", rid, "whoami")["weights_version"] == 2

    # wake with new weights at once; a version that goes back is refused, and changes nothing
    sleep("pol", timeout=30)
    wake("pol", weights_version=3, state_dict=weights(3), timeout=30)
    assert same(exported("pol", rid), weights(3))
    import rankcore as rc

    with pytest.raises(rc.InvalidEvent, match="not newer"):
        push_weights("pol", weights(4), 3)
    with pytest.raises(rc.InvalidEvent, match="needs its state_dict"):
        push_weights("pol", None, 4)
    assert same(exported("pol", rid), weights(3))
    assert ask(get_controller(), "status")["rejected_events"] == 0


class Stubborn(Policy):
    """Refuses to let go of its weights: its offload raises."""

    def load_state_dict(self, state_dict, assign=False):
        if any(t.device.type == "meta" for t in state_dict.values()):
            raise RuntimeError("these weights stay")
        return super().load_state_dict(state_dict, assign=assign)


def test_an_offload_that_raises_is_a_tier_move_failed_and_the_weights_stay_hot():
    h = run(deployment(Stubborn, name="stub", num_replicas=1).bind())
    (rid,) = h.ranks()
    sleep("stub", wait=False)  # the core sends OffloadReplica: "offloading" until its answer
    assert weights_status("stub")[rid]["residency"] in ("offloading", "hot")
    assert wait_for(lambda: weights_status("stub")[rid]["residency"] == "hot", timeout=30)  # TierMoveFailed
    w = weights_status("stub")
    assert w["deployment"]["asleep"] and (w[rid]["residency"], w[rid]["tier"], w[rid]["tiered_tier"]) == \
        ("hot", "hot", "hot")
    assert torch.equal(h.remote(X).result(timeout=30), make_model(0)(X).detach())  # still serving
    assert ask(get_controller(), "status")["rejected_events"] == 0


# ------------------------------------------------- (b) static placement keeps its bundle
@ray.remote(num_cpus=0, num_gpus=0.5)
class Trainer:
    """What uses the GPU while the inference replicas sleep (here: CPU tensors)."""

    def step(self) -> float:
        t = torch.ones(1 << 18)
        return float(t.sum()) + len(ray.get_gpu_ids())


def test_sleep_keeps_a_static_replicas_process_rank_and_bundle_while_another_actor_runs_there():
    from ray.util.placement_group import placement_group, remove_placement_group
    from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

    pg = placement_group([{"CPU": 0.5, "GPU": 1}] * 2, strategy="PACK")
    ray.get(pg.ready(), timeout=60)
    try:
        d = deployment(Policy, name="rl", ray_actor_options={"num_gpus": 0.5},
                       static_placement=StaticPlacementConfig(pg, {0: [1], 1: [0]}))
        h = run(d.bind())
        before = h.whoami.broadcast()
        assert sorted((r["rank"][0], r["bundles"]) for r in before.values()) == [(0, (1,)), (1, (0,))]
        sleep("rl", timeout=30)
        status = weights_status("rl")
        for rid in before:
            assert (status[rid]["tier"], status[rid]["host_nbytes"]) == ("warm", status[rid]["nbytes"])
            assert call("rl", rid, "devices") == ["meta"]
            now = call("rl", rid, "whoami")
            assert now["tier"] == "warm" and now["weights_version"] == 0
            for k in ("rank", "world_size", "bundles", "pg", "node", "pid"):
                assert now[k] == before[rid][k], k  # process, ranks, bundle, world_size kept
        # while they sleep another actor is placed in rank 0's bundle (bundle 1) and runs
        trainer = Trainer.options(scheduling_strategy=PlacementGroupSchedulingStrategy(
            placement_group=pg, placement_group_bundle_index=1)).remote()
        assert ray.get(trainer.step.remote(), timeout=60) == float(1 << 18) + 1
        assert ask(get_controller(), "deployment_status", "rl")["healthy"]  # a sleeper keeps its rank
        ray.kill(trainer)
        wake("rl", timeout=30)
        after = h.whoami.broadcast()
        for rid in before:
            assert {k: v for k, v in after[rid].items() if k != "tier"} == \
                {k: v for k, v in before[rid].items() if k != "tier"}
            assert after[rid]["tier"] == "hot"
        assert torch.equal(h.remote(X).result(timeout=30), make_model(0)(X).detach())
    finally:
        ask(get_controller(), "reset")
        remove_placement_group(pg)


# ----------------------------------------------- (c) a push while a replica restarts
def test_a_push_while_a_replica_restarts_reaches_it_and_a_controller_restart_keeps_sleep():
    h = run(deployment(Policy, name="slow", num_replicas=2).bind(1.0), timeout=60)
    ranks = h.ranks()
    victim = next(rid for rid, r in ranks.items() if r[0] == 1)
    ray.kill(actor("slow", victim), no_restart=True)
    ctl = get_controller()

    seen: list[str] = []

    def replacement_starting() -> bool:
        reps = ask(ctl, "deployment_status", "slow")["replicas"]
        seen[:] = [rid for rid, r in reps.items() if r["rank"][0] == 1 and rid != victim and r["phase"] == "starting"]
        return bool(seen)

    assert wait_for(replacement_starting, timeout=30, every=0.02), "the replacement never was seen starting"
    new = seen[0]
    v1 = weights(1)
    push_weights("slow", v1, 1)  # its constructor runs (1 s): the update waits for it
    assert ask(ctl, "deployment_status", "slow")["replicas"][new]["phase"] == "starting"
    wait_serving("slow", timeout=60)
    for rid in (new, next(r for r in ranks if r != victim)):
        assert call("slow", rid, "whoami")["weights_version"] == 1
        assert same(exported("slow", rid), v1)

    # the controller restarts while the deployment sleeps: it stays asleep, and wakes
    sleep("slow", timeout=30)
    ray.kill(ctl, no_restart=False)
    time.sleep(1.0)
    st = weights_status("slow")  # (the recovered controller)
    assert st["deployment"] == {"asleep": True, "weights_version": 1}
    assert all(st[rid]["residency"] == "warm" and st[rid]["tier"] == "warm" for rid in h.ranks())
    # a replica started after the restart loads the version pushed before it (kept by the store)
    survivor = next(rid for rid, r in h.ranks().items() if r[0] == 0)
    ray.kill(actor("slow", survivor), no_restart=True)
    wake("slow", timeout=60)
    third = next(rid for rid, r in h.ranks().items() if r[0] == 0)
    assert third != survivor
    assert same(exported("slow", third), v1)
    assert ask(get_controller(), "status")["rejected_events"] == 0


def test_a_controller_restart_keeps_a_sleep_and_a_push_that_no_replica_showed_yet():
    """Asleep and the weights version are saved beside the specs (``rankcore.query.desired_asleep``,
    ``desired_weights``) and passed as ``ControllerRecovered.asleep`` / ``weights_versions``:
    here every replica is still in its constructor when the controller dies, so no report says
    "warm" or holds the version pushed, and only the saved words keep the sleep and the push."""
    from executors.ray_gpu.base import persist

    d = deployment(Policy, name="early", num_replicas=2)
    ctl = get_controller()
    ask(ctl, "apply", d.name, d.num_replicas, d.user_config, d.cls, (1.5,), {}, d.ray_actor_options,
        d.max_ongoing_requests, d.placement, d.max_replicas, d.core_options)
    push_weights("early", weights(1), 1)  # no replica holds it when the controller dies: only the saved version
    sleep("early", wait=False)
    assert persist.load_asleep() == ("early",) and persist.load_weights_versions() == (("early", 1),)
    ray.kill(ctl, no_restart=False)
    assert ask(get_controller(), "wait_asleep", "early", 60, timeout=90)  # ready, then put to sleep
    assert all(w["tier"] == "warm" for rid, w in weights_status("early").items() if rid != "deployment")
    wake("early", timeout=60)
    assert persist.load_asleep() == ()
    for rid in ask(get_controller(), "ranks", "early"):
        assert same(exported("early", rid), weights(1))  # the push before the restart reached them


# ---------------------------------------------- (d) same tier history as the simulator
def tier_history(lines) -> dict[int, list]:
    """Per global rank: the (tier, weights version) its replicas held, after each answer that changed
    them (consecutive repeats merged), and ``"crashed"`` where its replica died."""
    init: dict[str, int] = {}
    where: dict[str, tuple[str, int]] = {}
    out: dict[int, list] = defaultdict(list)
    for r in map(json.loads, lines):
        if r.get("kind") == "command" and r["type"] == "InitializeReplica":
            init[r["replica"]] = r["fields"]["weights_version"]
        if r.get("kind") != "event" or r.get("stale") or r.get("rank") is None:
            continue
        rid, kind, rank = r["replica"], r["type"], r["rank"][0]
        if kind == "ReplicaCrashed":
            out[rank].append("crashed")
            continue
        tier, version = where.get(rid, ("hot", init.get(rid, 0)))
        if kind == "TierMoved":
            tier = r["fields"]["tier"]
        elif kind == "WeightsUpdated":
            version = r["fields"]["version"]
        elif kind != "ReplicaReady":
            continue
        where[rid] = (tier, version)
        if not out[rank] or out[rank][-1] != (tier, version):
            out[rank].append((tier, version))
    return dict(out)


def test_the_small_tier_scenario_has_the_same_tier_history_on_the_simulator_and_on_ray(tmp_path):
    sc = load_scenario(ROOT / "examples" / "scenarios" / "rl-sleep-wake-ray.yaml")
    buf = io.StringIO()
    sim = Simulation(sc, trace=buf).run()
    assert sim.passed
    want = tier_history(buf.getvalue().splitlines())
    trace = tmp_path / "ray.jsonl"
    with open(trace, "w") as fp:
        result = run_on_ray(sc, trace_fp=fp)
    assert result.passed, [e for e in result.expectations if not e[1]]
    got = tier_history(trace.read_text().splitlines())
    assert got == want
    # it did move weights: every rank slept, woke and took three versions; rank 1 crashed once
    assert [h[-1] for _, h in sorted(got.items())] == [("hot", 3)] * 4
    assert got[1].count("crashed") == 1 and ("warm", 2) in got[0]
    # the metrics count the same moves
    sim_end = json.loads(buf.getvalue().splitlines()[-1])["metrics"]["deployments"]
    ray_end = json.loads(trace.read_text().splitlines()[-1])["metrics"]["deployments"]
    keys = ("offloads", "loads", "weight_updates", "bytes_moved")
    assert {k: ray_end["llm"][k] for k in keys} == {k: sim_end["llm"][k] for k in keys}
    assert ask(get_controller(), "status")["rejected_events"] == 0


# ------------------------------------------------ (e) weights shared once, updated in place
def test_a_push_by_share_is_opened_once_per_replica_and_reaches_a_restarted_and_a_sleeping_one():
    from executors.ray_gpu import share_weights

    h = run(deployment(Policy, name="shared", num_replicas=2).bind())
    share = share_weights(weights(1), 1)  # the trainer's process (here, the driver): /dev/shm on CPU
    try:
        push_weights("shared", share, 1, wait=True, timeout=30)
        for version in (2, 3):
            share.write(weights(version), version)  # in place, after the push before was taken
            push_weights("shared", share, version, wait=True, timeout=30)
            st = weights_status("shared")
            for rid in h.ranks():
                assert (st[rid]["version"], st[rid]["shared"], st[rid]["shares_opened"]) == (
                    version, share.handle.share_id, 1), st[rid]  # opened once, by each replica
                assert same(exported("shared", rid), weights(version))
            assert torch.equal(h.remote(X).result(timeout=30), make_model(version)(X).detach())

        with pytest.raises(Exception, match="holds version 3"):  # a push of a version the share does not hold
            push_weights("shared", share, 4)
        assert weights_status("shared")["deployment"]["weights_version"] == 3

        # a replica started later opens the share at its start, and loads the version it holds
        victim = next(rid for rid, r in h.ranks().items() if r[0] == 1)
        ray.kill(actor("shared", victim), no_restart=True)
        assert wait_for(lambda: victim not in h.ranks() and len(h.ranks()) == 2, timeout=60)
        wait_serving("shared", timeout=60)
        new = next(rid for rid, r in h.ranks().items() if r[0] == 1)
        assert same(exported("shared", new), weights(3)) and weights_status("shared")[new]["shared"] == share.handle.share_id

        # a sleeping deployment takes a push by share into its CPU copies, and wakes with it
        sleep("shared", timeout=30)
        share.write(weights(4), 4)
        push_weights("shared", share, 4)
        assert wait_for(lambda: all(weights_status("shared")[r]["version"] == 4 for r in h.ranks()), timeout=30)
        wake("shared", timeout=30)
        assert torch.equal(h.remote(X).result(timeout=30), make_model(4)(X).detach())
        assert ask(get_controller(), "status")["rejected_events"] == 0
    finally:
        share.close()


def test_a_replica_on_another_node_takes_a_shares_fallback_copy():
    """What a replica does with a handle shared on another node (a two-node cluster is the scenario
    suite's; here the handle names another node): it loads the CPU copy ``push_weights`` adds."""
    import attrs

    from executors.ray_gpu import share_weights
    from executors.ray_gpu.weights.replica import ReplicaWeights

    share = share_weights(weights(1), 1)
    try:
        rw = ReplicaWeights("pol#x")
        rw.attach(Policy(), device="cpu")
        remote = attrs.evolve(share.handle, node_id="another-node", fallback=ray.put(share.cpu_state_dict()))
        rw.update(1, remote)
        assert same({k: v for k, v in rw.instance.state_dict().items()}, weights(1))
        assert rw.info()["shared"] == ""  # not from the mapping
    finally:
        share.close()
