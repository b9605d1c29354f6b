"""The Ray executor for real: replicas are Ray actors (logical GPUs, no GPU needed)."""

from __future__ import annotations

import os
import time

import pytest
import ray

from executors.ray_gpu import deployment, get_controller, get_deployment_handle, get_replica_context, idempotent, run
from executors.ray_gpu.api.deployments import ask

pytestmark = pytest.mark.usefixtures("local_ray")

OPTS = {"num_cpus": 0.05}


@deployment(num_replicas=4, ray_actor_options={**OPTS, "num_gpus": 0.25})
class RankReporter:
    def __call__(self):
        ctx = get_replica_context()
        return ctx.replica_id, ctx.rank.rank, ctx.world_size, os.environ.get("CUDA_VISIBLE_DEVICES")

    def pid(self):
        return os.getpid()


def test_seed_four_replicas_report_ranks_0_to_3():
    """The seed's first example, on real actors with logical GPUs."""
    h = run(RankReporter.bind())
    seen = {}
    for r in [h.remote() for _ in range(16)]:
        rid, rank, ws, gpu = r.result(timeout=30)
        seen[rid] = (rank, ws)
        assert gpu is not None  # each actor got its own CUDA_VISIBLE_DEVICES
    assert sorted(v[0] for v in seen.values()) == [0, 1, 2, 3]
    assert {v[1] for v in seen.values()} == {4}
    no_rejections()
    ask(get_controller(), "shutdown_replicas")


@deployment(name="rank_aware", num_replicas=2, user_config={"model_name": "model_v1"}, ray_actor_options=OPTS)
class RankAwareModel:
    def __init__(self):
        self.model = None
        self.calls = []

    def reconfigure(self, user_config, rank):
        ctx = get_replica_context()
        self.calls.append((user_config["model_name"], rank.rank, ctx.rank.rank, ctx.world_size))
        self.model = user_config["model_name"]

    def __call__(self):
        return self.model, self.calls, get_replica_context().rank.rank


def test_seed_rank_aware_model_reconfigured_at_startup_and_on_downscale():
    """reconfigure(user_config, rank) runs after __init__ with model_v1; on a
    downscale the moved replica's context already shows its new rank inside
    reconfigure, and every survivor sees the new world_size."""
    h = run(RankAwareModel.bind())
    results = [h.remote().result(timeout=30) for _ in range(6)]
    assert {r[0] for r in results} == {"model_v1"}
    assert all(r[1][0][1] == r[1][0][2] == r[2] for r in results)  # rank arg == context rank
    h2 = run(RankAwareModel.options(num_replicas=4).bind())
    before = h2.ranks()
    assert sorted(v[0] for v in before.values()) == [0, 1, 2, 3]
    by_rank = {v[0]: rid for rid, v in before.items()}
    h2.scale(2, victims=(by_rank[0], by_rank[1]))  # ranks 2 and 3 must move to 0 and 1
    after = h2.ranks()
    assert sorted(v[0] for v in after.values()) == [0, 1]
    assert set(after) == {by_rank[2], by_rank[3]}
    seen = {}
    for r in [h2.remote() for _ in range(8)]:
        model, calls, rank = r.result(timeout=30)
        seen[rank] = calls
        assert model == "model_v1"
    assert sorted(seen) == [0, 1]
    for rank, calls in seen.items():
        last = calls[-1]
        # the reconfigure for the rank change: rank argument == context rank == new rank; world_size 2
        assert last[1] == last[2] == rank and last[3] == 2
    no_rejections()
    ask(get_controller(), "shutdown_replicas")


@deployment(name="crashy", num_replicas=3, ray_actor_options=OPTS)
class Crashy:
    def __call__(self, x):
        if x == "boom":
            raise ValueError("boom from the app")
        return get_replica_context().rank.rank

    def pid(self):
        return os.getpid()


def test_crashed_replica_is_replaced_on_the_same_rank():
    h = run(Crashy.bind())
    ranks = h.ranks()
    victim, (rank, _, _) = sorted(ranks.items())[1]
    actor = ray.get_actor(f"ModelActor:crashy:{victim}", namespace="rankcore")
    t0 = time.monotonic()
    ray.kill(actor, no_restart=True)
    ctl = get_controller()
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        now = ask(ctl, "ranks", "crashy")
        if victim not in now and len(now) == 3 and ask(ctl, "wait_healthy", "crashy", 0.1):
            break
        time.sleep(0.1)
    now = ask(ctl, "ranks", "crashy")
    assert victim not in now
    assert sorted(v[0] for v in now.values()) == [0, 1, 2]
    replacement = [rid for rid in now if rid not in ranks]
    assert len(replacement) == 1 and now[replacement[0]][0] == rank
    assert time.monotonic() - t0 < 60
    assert ask(ctl, "state_errors") == []
    # the request path's pool, as the core pushed it: the victim gone, its replacement serving
    pools = ask(ctl, "pools")
    assert pools["mismatch"] is None and pools["coming"]["crashy"] is True
    assert pools["members"]["crashy"] == dict.fromkeys(sorted(now), "serving")
    ask(ctl, "shutdown_replicas")


def test_application_errors_reach_the_caller_and_the_replica_keeps_serving():
    h = run(Crashy.bind())
    with pytest.raises(ValueError, match="boom from the app"):
        h.remote("boom").result(timeout=30)
    assert h.remote(1).result(timeout=30) in (0, 1, 2)
    ask(get_controller(), "shutdown_replicas")


@deployment(name="slow", num_replicas=2, max_ongoing_requests=1, ray_actor_options=OPTS)
class Slow:
    def __call__(self, s):
        time.sleep(s)
        return get_replica_context().replica_id


def test_at_most_max_ongoing_requests_per_replica():
    """With max_ongoing_requests=1 and 2 replicas, 4 calls of 1 s take >= 2 s and
    spread over both replicas."""
    h = run(Slow.bind())
    t0 = time.monotonic()
    rs = [h.remote(1.0) for _ in range(4)]
    out = [r.result(timeout=60) for r in rs]
    elapsed = time.monotonic() - t0
    assert len(set(out)) == 2
    assert elapsed >= 1.9
    ask(get_controller(), "shutdown_replicas")


@deployment(name="survivor", num_replicas=3, user_config={"v": 1}, ray_actor_options=OPTS)
class Survivor:
    def reconfigure(self, user_config, rank):
        self.v = user_config["v"]

    def __call__(self):
        return get_replica_context().replica_id, os.getpid()


def test_controller_restart_recovers_the_same_ranks_without_restarting_replicas():
    """Kill the controller; Ray restarts it; it finds the replica actors by name and
    rebuilds the ranks from their reports: same ranks, same processes, no failed call."""
    h = run(Survivor.bind())
    before = h.ranks()
    pids = {rid: pid for rid, pid in (h.remote().result(timeout=30) for _ in range(9))}
    ray.kill(get_controller(), no_restart=False)
    after = h.ranks()  # waits out the restart
    assert after == before
    ctl = get_controller()
    # a call racing the restart may fail with ActorUnavailableError: ask() retries
    assert ask(ctl, "wait_healthy", "survivor", 30)
    again = {rid: pid for rid, pid in (h.remote().result(timeout=30) for _ in range(9))}
    assert set(again) <= set(before)
    assert all(pids[rid] == pid for rid, pid in again.items() if rid in pids)  # no replica restarted
    assert ask(ctl, "state_errors") == []
    pools = ask(ctl, "pools")  # the restarted controller's pools: from the recovery's PoolReset
    assert pools["mismatch"] is None and pools["members"]["survivor"] == dict.fromkeys(before, "serving")
    ask(ctl, "shutdown_replicas")


@deployment(name="sick", num_replicas=2, ray_actor_options=OPTS,
            health_check_period_s=0.5)  # (three failed checks in ~1.5 s, not Serve's default ~30 s)
class Sick:
    def __init__(self):
        self.healthy = True

    def check_health(self):
        if not self.healthy:
            raise RuntimeError("sick")

    def __call__(self, make_sick=False):
        if make_sick:
            self.healthy = False
        return get_replica_context().replica_id, get_replica_context().rank.rank


def test_failed_health_check_replaces_the_replica_on_its_rank():
    h = run(Sick.bind())
    before = h.ranks()
    rid, rank = h.remote(True).result(timeout=30)
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline and rid in h.ranks():
        time.sleep(0.2)
    ctl = get_controller()
    assert ask(ctl, "wait_healthy", "sick", 60)
    now = h.ranks()
    assert rid not in now and sorted(v[0] for v in now.values()) == [0, 1]
    new = [r for r in now if r not in before]
    assert len(new) == 1 and now[new[0]][0] == rank
    no_rejections()
    ask(ctl, "shutdown_replicas")


def test_examples_run(tmp_path):
    """examples/ray: the seed's two examples (the second with a real torch model)."""
    from examples.ray import rank_aware_model, seed_ranks

    seen = seed_ranks.main()
    assert sorted(r["rank"] for r in seen) == [0, 1, 2, 3] and {r["world_size"] for r in seen} == {4}
    out = rank_aware_model.main(str(tmp_path))
    by_rank = {r["rank"]: r for r in out}
    assert set(by_rank) == {0, 1} and {r["model"] for r in out} == {"model_v1"}
    # rank 1's shard is rank 0's scaled by 2 (plus the same bias)
    y0, y1 = by_rank[0]["y"], by_rank[1]["y"]
    assert y0 != y1
    import torch

    if not torch.cuda.is_available():  # (the fixture's 4 GPUs are logical: replicas fall back to the CPU)
        assert {r["device"] for r in out} == {"cpu"}
    ask(get_controller(), "shutdown_replicas")


@deployment(name="steady", num_replicas=2, user_config={"v": 1}, ray_actor_options=OPTS)
class Steady:
    def reconfigure(self, user_config):
        self.v = user_config["v"]

    def __call__(self, s=0.0):
        time.sleep(s)
        ctx = get_replica_context()
        return ctx.replica_id, self.v, ctx.world_size


def test_calls_in_flight_survive_scaling_and_config_updates_reach_every_replica():
    h = run(Steady.bind())
    slow = [h.remote(2.0) for _ in range(4)]  # in flight on both replicas
    h.scale(4)  # upscale: new world_size everywhere, running calls undisturbed
    ranks = h.ranks()
    assert len(ranks) == 4
    # ask every replica directly (the handle would favour the idle new ones)
    seen = {rid: ray.get(ray.get_actor(f"ModelActor:steady:{rid}", namespace="rankcore")
                         .handle_request.remote("__call__", (), {}), timeout=60)[2] for rid in ranks}
    assert set(seen.values()) == {4}
    more = [h.remote(2.0) for _ in range(4)]
    h.scale(2)  # downscale drains the victims' calls before stopping them
    results = [x.result(timeout=60) for x in slow + more]
    assert len(results) == 8
    h2 = run(Steady.options(num_replicas=2, user_config={"v": 2}).bind())
    got = {(v, ws) for _, v, ws in (x.result(timeout=60) for x in [h2.remote() for _ in range(8)])}
    assert got == {(2, 2)}
    no_rejections()
    ask(get_controller(), "shutdown_replicas")


def no_rejections() -> None:
    """A normal run: the core rejected no event (issue 8, point 7)."""
    status = ask(get_controller(), "status")
    assert status["rejected_events"] == 0, status["rejected"]


@deployment(name="rank_only", num_replicas=4, ray_actor_options=OPTS)
class RankOnly:
    """Ported from Ray Serve: reconfigure(user_config, rank), and no user_config."""

    def __init__(self):
        self.calls = []

    def reconfigure(self, user_config, rank):
        self.calls.append((user_config, rank.rank, get_replica_context().rank.rank))

    def __call__(self):
        return self.calls


def test_reconfigure_taking_rank_without_user_config_learns_its_rank_at_start_and_after_compaction():
    """Ray Serve 2.60 calls reconfigure(user_config=None, rank) at start when the
    method takes rank; rankcore does, and on every rank change too."""
    h = run(RankOnly.bind())
    before = h.ranks()
    for rid, (rank, _, _) in before.items():
        assert ask_replica("rank_only", rid) == [(None, rank, rank)]
    by_rank = {v[0]: rid for rid, v in before.items()}
    h.scale(2, victims=(by_rank[0], by_rank[1]))  # ranks 2 and 3 move to 0 and 1
    after = h.ranks()
    assert set(after) == {by_rank[2], by_rank[3]}
    for rid, (rank, _, _) in after.items():
        assert ask_replica("rank_only", rid) == [(None, before[rid][0], before[rid][0]), (None, rank, rank)]
    no_rejections()
    ask(get_controller(), "shutdown_replicas")


def ask_replica(dep: str, rid: str, method: str = "__call__"):
    actor = ray.get_actor(f"ModelActor:{dep}:{rid}", namespace="rankcore")
    return ray.get(actor.handle_request.remote(method, (), {}), timeout=30)


def test_a_rejected_event_is_recorded_logged_and_counted():
    """The controller survives an event the core refuses, but never silently:
    a ``rejected`` trace record, an error in its log naming the event, and
    ``status()['rejected_events']``."""
    import glob
    import json

    import rankcore as rc
    from executors.checktrace import check_trace_lines

    h = run(Crashy.bind())
    ctl = get_controller()
    no_rejections()
    ask(ctl, "record", {"scenario": "a forged event"})
    rid = sorted(h.ranks())[0]
    forged = rc.ReplicaReconfigured(replica_id=rid, version=99)  # no reconfigure 99 was ever sent
    assert ask(ctl, "feed_event", forged) is False
    status = ask(ctl, "status")
    assert status["rejected_events"] == 1 and status["rejected"][0].startswith(repr(forged))
    assert h.remote(1).result(timeout=30) in (0, 1, 2)  # still serving
    text = ask(ctl, "drain_trace")
    (rec,) = [json.loads(line) for line in text.splitlines() if '"kind":"rejected"' in line]
    assert (rec["type"], rec["replica"], rec["error_type"]) == ("ReplicaReconfigured", rid, "InvalidEvent")
    assert rid in rec["error"] and "99" in rec["error"] and rec["fields"] == {"replica_id": rid, "version": 99}
    report = check_trace_lines(text.splitlines())
    assert report.violation_count == 1 and "the core rejected a ReplicaReconfigured event" in report.violations[0]
    logs = ray._private.worker._global_node.get_session_dir_path() + f"/logs/*-{status['pid']}.err"

    def logged() -> bool:
        return any(f"the core rejected {forged!r}" in open(p, errors="replace").read() for p in glob.glob(logs))

    deadline = time.monotonic() + 10
    while not logged() and time.monotonic() < deadline:
        time.sleep(0.2)
    assert logged(), glob.glob(logs)
    ask(ctl, "reset")  # (forgets the rejection, the trace and the deployment)


def test_scale_above_max_replicas_raises_at_the_call_and_changes_nothing():
    import rankcore as rc

    h = run(Crashy.options(name="capped", max_replicas=3).bind())
    with pytest.raises(rc.InvalidConfig, match="max_replicas"):
        h.scale(4)
    with pytest.raises(rc.InvalidConfig, match="non-negative int"):
        h.scale(-1)
    assert sorted(v[0] for v in h.ranks().values()) == [0, 1, 2]
    h.scale(2)  # the deployment is unchanged: a good request still works
    assert sorted(v[0] for v in h.ranks().values()) == [0, 1]
    no_rejections()  # (a bad request raises to its caller: it is not a rejected cluster event)
    ask(get_controller(), "shutdown_replicas")


@deployment(name="ids", num_replicas=3, ray_actor_options=OPTS)
class Ids:
    def __call__(self):
        return get_replica_context().replica_id


def test_a_handle_learns_of_a_crash_and_its_replacement_from_the_controller_not_a_timer(monkeypatch):
    """The serving replicas reach a handle by the controller's long poll: with
    the handle's clock stopped (so no timed re-read can happen), calls through
    a handle made before the crash skip the dead replica and reach its
    same-rank replacement once the controller serves it, and none fails."""
    import types

    from executors.ray_gpu.base import router

    h = run(Ids.bind())
    assert h.remote().result(timeout=30)  # the handle knows the 3 replicas
    frozen = time.monotonic()
    monkeypatch.setattr(router, "time", types.SimpleNamespace(monotonic=lambda: frozen, sleep=time.sleep))
    ranks = h.ranks()
    victim, (rank, _, _) = sorted(ranks.items())[1]
    ray.kill(ray.get_actor(f"ModelActor:ids:{victim}", namespace="rankcore"), no_restart=True)
    ctl = get_controller()
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:  # the controller's own view: the replacement serves
        serving = [rid for rid, _ in ask(ctl, "pool", "ids")["serving"]]
        if victim not in serving and len(serving) == 3:
            break
        time.sleep(0.05)
    (new,) = set(serving) - set(ranks)
    assert h.ranks()[new][0] == rank
    answered: set = set()
    deadline = time.monotonic() + 30
    while new not in answered and time.monotonic() < deadline:
        answered |= {h.remote().result(timeout=30) for _ in range(6)}  # (a failed call raises here)
    assert new in answered, f"the handle never routed a call to the replacement {new}: {answered}"
    assert victim not in answered
    assert ask(ctl, "state_errors") == []
    ask(ctl, "shutdown_replicas")


def test_the_controllers_long_poll_answers_a_change_at_once_and_no_change_at_its_timeout():
    """``pool_after(name, version, timeout)``: held while the deployment's pool is at ``version``;
    answered by the step whose pool commands change it (a crash, a downscale)."""
    run(Crashy.bind())
    ctl = get_controller()

    def ids(answer):
        return tuple(rid for rid, _ in answer["serving"])

    first = ask(ctl, "pool", "crashy")
    known = ids(first)
    t0 = time.monotonic()
    assert ids(ask(ctl, "pool_after", "crashy", first["version"], 0.5)) == known
    assert time.monotonic() - t0 >= 0.5  # nothing changed: held until its timeout
    pending = ctl.pool_after.remote("crashy", first["version"], 600.0)
    victim = known[1]
    ray.kill(ray.get_actor(f"ModelActor:crashy:{victim}", namespace="rankcore"), no_restart=True)
    after_crash = ray.get(pending, timeout=60)  # answered by the crash, not its 600 s timeout
    assert victim not in ids(after_crash) and after_crash["version"] != first["version"]
    assert ask(ctl, "wait_healthy", "crashy", 60)
    now = ask(ctl, "pool", "crashy")
    pending = ctl.pool_after.remote("crashy", now["version"], 600.0)
    get_deployment_handle("crashy").scale(1)
    answer = ray.get(pending, timeout=60)  # the downscale's step answered it: two replicas draining
    assert len(ids(answer)) == 1 and len(answer["draining"]) == 2
    assert ask(ctl, "state_errors") == []
    ask(ctl, "shutdown_replicas")


@deployment(name="spares", num_replicas=2, ray_actor_options=OPTS, spare_processes=1)
class SpareUser:
    # (it reads who answers: idempotent, so a call the handle routed to the killed replica before its
    # long poll brought the news is retried elsewhere; a plain one fails naming it: test_ray_requests)
    @idempotent
    def __call__(self):
        return get_replica_context().replica_id, os.getpid()


def _started_at(pid: int) -> float:
    """When process ``pid`` started (epoch seconds; Linux /proc: this machine's Ray is local)."""
    with open(f"/proc/{pid}/stat") as f:
        ticks = int(f.read().rpartition(")")[2].split()[19])
    with open("/proc/stat") as f:
        boot = next(int(line.split()[1]) for line in f if line.startswith("btime"))
    return boot + ticks / os.sysconf("SC_CLK_TCK")


def test_a_crash_replacement_runs_in_a_spare_process_the_controller_kept_on_its_node():
    """``spare_processes=1``: the core tells the controller to keep an idle worker
    on the replicas' node (``KeepSpareProcesses``); the controller has Ray start
    one there (its pid is in ``status()``); the same-rank replacement of a
    killed replica runs in a process that was up before the crash instead of a
    new one; the node has one spare again after; scaled to 0, it keeps none."""
    h = run(SpareUser.bind())
    ctl = get_controller()
    node = ray.get_runtime_context().get_node_id()

    def spares() -> dict:
        return ask(ctl, "status")["spare_processes"].get(node, {})

    deadline = time.monotonic() + 60
    while not spares().get("pids") and time.monotonic() < deadline:
        time.sleep(0.05)
    before = spares()
    assert before["target"] == 1 and len(before["pids"]) == 1 and before["unavailable"] is None, before
    (spare,) = before["pids"]
    pids = {pid for _, pid in (h.remote().result(timeout=30) for _ in range(8))}
    assert spare not in pids  # idle: no replica runs in it yet

    ranks = h.ranks()
    victim, (rank, _, _) = sorted(ranks.items())[0]
    killed = time.time()
    ray.kill(ray.get_actor(f"ModelActor:spares:{victim}", namespace="rankcore"), no_restart=True)
    seen: dict = {}
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        now = h.ranks()
        new = [rid for rid in now if rid not in ranks]
        if new and now[new[0]] is not None and now[new[0]][0] == rank:
            seen.update(h.remote().result(timeout=30) for _ in range(6))
            if new[0] in seen:
                break
        time.sleep(0.05)
    (new,) = [rid for rid in h.ranks() if rid not in ranks]
    # Ray gives the actor an idle, never used worker of the job: the spare, or one Ray
    # prestarted itself at ray.init (there are num_cpus of those). Either way its
    # process was up before the crash, and no replica ran in it.
    assert seen.get(new) not in pids, (new, seen, pids)
    assert _started_at(seen[new]) < killed, f"the replacement {new} runs in a process started after the crash"
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline and not (
            spares().get("pids") and (spares()["taken"] > before["taken"] or spares()["pids"] == [spare])):
        time.sleep(0.05)
    after = spares()
    assert len(after["pids"]) == 1, after
    assert after["taken"] - before["taken"] == (seen[new] == spare), (before, after, seen[new])
    assert ask(ctl, "state_errors") == []
    ask(ctl, "shutdown_replicas")
    deadline = time.monotonic() + 30
    while spares() and time.monotonic() < deadline:  # the core told the node 0: nothing kept
        time.sleep(0.05)
    assert spares() == {}
