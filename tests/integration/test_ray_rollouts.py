"""Rolling updates on Ray (docs/rollouts.md): ``run()`` with new code replaces every replica, each
by one on its ranks, while calls keep being answered; unchanged code, or the same ``version``,
replaces nothing; a controller that dies mid-rollout finishes it from the replicas' reports."""

from __future__ import annotations

import importlib
import io
import json
import os
import signal
import sys
import threading
import time
import uuid

import pytest
import ray

from executors.checktrace import check_trace_lines
from executors.history import rank_history
from executors.ray_gpu import deployment, get_controller, get_replica_context, run
from executors.ray_gpu.api.deployments import ask
from executors.ray_gpu.base.fingerprint import code_fingerprint
from executors.ray_gpu.base.replicas import NAMESPACE, actor_name
from executors.ray_gpu.scenario import run_on_ray
from executors.sim import Simulation, parse_scenario
from tests.integration.conftest import _local_ray
from tests.integration.waiting import wait_for

pytestmark = pytest.mark.usefixtures("local_ray")


@pytest.fixture(scope="module")
def importable(tmp_path_factory):
    """A folder on the PYTHONPATH of every process of this module's Ray (``local_ray``), the
    controller's too: a module written there is imported by name, from the file as it is then."""
    return tmp_path_factory.mktemp("importable")


@pytest.fixture(scope="module")
def local_ray(importable):
    """conftest's, started with ``importable`` on its PYTHONPATH."""
    before = os.environ.get("PYTHONPATH")
    os.environ["PYTHONPATH"] = os.pathsep.join(filter(None, [str(importable), before]))
    try:
        yield from _local_ray(4, 256, "shutdown_replicas")
    finally:
        if before is None:
            os.environ.pop("PYTHONPATH", None)
        else:
            os.environ["PYTHONPATH"] = before

OPTS = {"num_cpus": 0.05}
NAME = "rolling"


class _Model:
    """What every version here does: answers its code's tag, its replica id and the ranks its
    ``reconfigure`` was given (one per rank it was told: a rank change would add one)."""

    TAG = ""

    def __init__(self):
        self.ranks = []

    def reconfigure(self, user_config, rank):
        self.ranks.append(rank.rank)

    def __call__(self):
        return self.TAG, get_replica_context().replica_id, list(self.ranks)


@deployment(name=NAME, num_replicas=2, user_config={"m": 1}, ray_actor_options=OPTS)
class V1(_Model):
    TAG = "v1"


@deployment(name=NAME, num_replicas=2, user_config={"m": 1}, ray_actor_options=OPTS)
class V2(_Model):
    TAG = "v2"


class Caller(threading.Thread):
    """Calls the deployment in a loop until stopped: counts answers per tag, and failures."""

    def __init__(self, handle):
        super().__init__(daemon=True)
        self.handle, self.stop = handle, threading.Event()
        self.tags: dict[str, int] = {}
        self.order: list[str] = []  # every answer's tag, in the order the calls were made (one at a time)
        self.errors: list[str] = []
        self.calls = 0

    def run(self):
        while not self.stop.is_set():
            self.calls += 1
            try:
                tag = self.handle.remote().result(timeout=30)[0]
                self.tags[tag] = self.tags.get(tag, 0) + 1
                self.order.append(tag)
            except Exception as exc:  # any error is a failed call
                self.errors.append(repr(exc))
            time.sleep(0.005)


def answers(handle, n=12) -> set:
    return {r.result(timeout=30)[0] for r in [handle.remote() for _ in range(n)]}


def commands(text: str, kind: str) -> list[dict]:
    recs = (json.loads(line) for line in text.splitlines() if line.strip())
    return [r for r in recs if r.get("kind") == "command" and r.get("type") == kind]


def test_new_code_rolls_every_replica_onto_its_ranks_and_no_call_fails():
    ctl = get_controller()
    ask(ctl, "reset")
    assert code_fingerprint(V1.cls) != code_fingerprint(V2.cls)
    assert code_fingerprint(V1.cls) == code_fingerprint(V1.cls)
    h = run(V1.bind())
    assert answers(h) == {"v1"}
    before = h.ranks()
    assert sorted(v[0] for v in before.values()) == [0, 1]
    old_revision = h.status()["revision"]

    ask(ctl, "record", {"scenario": "rollout on ray"})
    caller = Caller(h)
    caller.start()
    assert wait_for(lambda: caller.calls > 20, 30)
    t0 = time.monotonic()
    run(V2.bind())  # returns once healthy: every replica replaced
    returned_s = time.monotonic() - t0
    assert wait_for(lambda: answers(h) == {"v2"}, 60)
    all_new_s = time.monotonic() - t0
    time.sleep(0.5)  # a few more calls after it
    caller.stop.set()
    caller.join(60)
    text = ask(ctl, "drain_trace")

    after = h.ranks()
    status = h.status()
    print(f"\nrollout of 2 replicas: run() returned after {returned_s:.2f}s, every call 'v2' after "
          f"{all_new_s:.2f}s; {caller.calls} calls during it, {len(caller.errors)} failed, answers {caller.tags}")
    assert caller.errors == [], caller.errors[:3]
    assert caller.tags.get("v1", 0) > 0 and caller.tags.get("v2", 0) > 0
    assert set(after).isdisjoint(before)  # every replica replaced
    assert sorted(v[0] for v in after.values()) == [0, 1]
    # each successor took its predecessor's global rank, and no replica's rank changed meanwhile
    starts = commands(text, "StartReplica")
    assert len(starts) == 2
    for s in starts:
        f = s["fields"]
        assert f["replaces"] in before and f["global_rank"] == before[f["replaces"]][0]
        assert after[f["replica_id"]][0] == f["global_rank"]
    assert [c for c in commands(text, "ReconfigureReplica") if c["fields"].get("reason") == "rank"] == []
    seen = {}
    for _ in range(12):
        tag, rid, ranks = h.remote().result(timeout=30)
        assert tag == "v2"
        seen[rid] = ranks
    assert seen == {rid: [v[0]] for rid, v in after.items()}  # reconfigure told each one rank, its own
    assert status["revision"] != old_revision
    assert {r["revision"] for r in status["replicas"].values()} == {status["revision"]}
    report = check_trace_lines(text.splitlines())
    assert report.ok, report.violations[:5]

    # the same code again: nothing to roll
    ask(ctl, "record", {"scenario": "same code"})
    run(V2.bind())
    assert h.ranks() == after
    assert commands(ask(ctl, "drain_trace"), "StopReplica") == []
    assert ask(ctl, "status")["rejected_events"] == 0
    ask(ctl, "reset")


def test_with_max_surge_each_successor_starts_while_its_predecessor_drains_on_its_ranks():
    """``max_surge=2`` on a node with room: both successors start in the step that stops their
    predecessors (before either has stopped), each on its predecessor's rank; no call fails, no
    rank is reconfigured (docs/rollouts.md, "Surge")."""
    ctl = get_controller()
    ask(ctl, "reset")
    h = run(V1.options(max_surge=2, max_unavailable=2).bind())
    before = h.ranks()
    ask(ctl, "record", {"scenario": "surge on ray"})
    caller = Caller(h)
    caller.start()
    assert wait_for(lambda: caller.calls > 20, 30)
    run(V2.options(max_surge=2, max_unavailable=2).bind())
    assert wait_for(lambda: answers(h) == {"v2"}, 60)
    caller.stop.set()
    caller.join(60)
    text = ask(ctl, "drain_trace")
    after = h.ranks()
    assert caller.errors == [], caller.errors[:3]
    assert set(after).isdisjoint(before) and sorted(v[0] for v in after.values()) == [0, 1]
    recs = [json.loads(line) for line in text.splitlines() if line.strip()]
    starts = [i for i, r in enumerate(recs) if r.get("kind") == "command" and r.get("type") == "StartReplica"]
    stopped = [i for i, r in enumerate(recs) if r.get("kind") == "event" and r.get("type") == "ReplicaStopped"]
    assert len(starts) == 2 and stopped and max(starts) < min(stopped)  # both started before a drain ended
    for i in starts:
        f = recs[i]["fields"]
        assert f["global_rank"] == before[f["replaces"]][0] and after[f["replica_id"]] == before[f["replaces"]]
    assert [c for c in commands(text, "ReconfigureReplica") if c["fields"].get("reason") == "rank"] == []
    report = check_trace_lines(text.splitlines())
    assert report.ok, report.violations[:5]
    assert ask(ctl, "status")["rejected_events"] == 0
    ask(ctl, "reset")


def test_blue_green_switches_every_call_at_once_and_keeps_every_rank():
    """``update_mode="blue_green"``: the new replicas start on the old ones' ranks while the old ones
    answer; one step switches the pool, after which no call reaches an old replica (the calls, made
    one at a time, answer v1 then only v2); no call fails, no rank is reconfigured, and every old
    replica stops only after every new one started (docs/rollouts.md, "Blue-green")."""
    ctl = get_controller()
    ask(ctl, "reset")
    h = run(V1.options(update_mode="blue_green").bind())
    before = h.ranks()
    ask(ctl, "record", {"scenario": "blue-green on ray"})
    caller = Caller(h)
    caller.start()
    assert wait_for(lambda: caller.calls > 20, 30)
    run(V2.options(update_mode="blue_green").bind())
    assert wait_for(lambda: answers(h) == {"v2"}, 60)
    n = caller.calls
    assert wait_for(lambda: caller.calls > n + 20, 30)
    caller.stop.set()
    caller.join(60)
    text = ask(ctl, "drain_trace")
    after = h.ranks()
    assert caller.errors == [], caller.errors[:3]
    first_new = caller.order.index("v2")
    assert set(caller.order[first_new:]) == {"v2"} and set(caller.order[:first_new]) == {"v1"}, caller.order
    assert set(after).isdisjoint(before) and sorted(after.values()) == sorted(before.values())
    recs = [json.loads(line) for line in text.splitlines() if line.strip()]
    started = [i for i, r in enumerate(recs) if r.get("kind") == "command" and r.get("type") == "StartReplica"]
    stops = [i for i, r in enumerate(recs) if r.get("kind") == "command" and r.get("type") == "StopReplica"]
    ready = [i for i, r in enumerate(recs) if r.get("kind") == "event" and r.get("type") == "ReplicaReady"]
    assert len(started) == 2 and len(stops) == 2 and len(ready) >= 2 and max(ready) < min(stops)
    assert [c for c in commands(text, "ReconfigureReplica") if c["fields"].get("reason") == "rank"] == []
    report = check_trace_lines(text.splitlines())
    assert report.ok, report.violations[:5]
    assert ask(ctl, "status")["rejected_events"] == 0
    ask(ctl, "reset")


@deployment(name="pinned", num_replicas=1, ray_actor_options=OPTS)
class PinnedA:
    def __call__(self):
        return "a"


@deployment(name="pinned", num_replicas=1, ray_actor_options=OPTS)
class PinnedB:
    def __call__(self):
        return "b"


def test_the_same_version_rolls_nothing_even_with_other_code_and_a_new_one_rolls():
    ctl = get_controller()
    ask(ctl, "reset")
    h = run(PinnedA.options(version="a").bind())
    before = h.ranks()
    run(PinnedB.options(version="a").bind())  # Ray Serve's meaning: the user says nothing changed
    assert h.ranks() == before
    assert {h.remote().result(timeout=30) for _ in range(4)} == {"a"}
    assert h.status()["replicas"][next(iter(before))]["revision"].startswith("v=a;")
    run(PinnedB.options(version="b").bind())  # a new version: the class applied last runs
    after = h.ranks()
    assert set(after).isdisjoint(before) and [v[0] for v in after.values()] == [0]
    assert {h.remote().result(timeout=30) for _ in range(4)} == {"b"}
    ask(ctl, "reset")


def test_a_controller_that_dies_mid_rollout_finishes_it_from_the_replicas_reports():
    """The replicas report the revision they run (``ReplicaReport.revision``): after a controller
    crash between two replacements, the one still on the old code is replaced, on its rank."""
    ctl = get_controller()
    ask(ctl, "reset")
    h = run(V1.bind())
    before = h.ranks()
    d = V2
    ask(ctl, "apply", d.name, d.num_replicas, d.user_config, d.cls, (), {}, d.ray_actor_options,
        d.max_ongoing_requests, d.placement, d.max_replicas, d.core_options, code_fingerprint(d.cls))
    # one replaced and running, the other still on v1: crash the controller
    assert wait_for(lambda: sum(rid not in before for rid in ask(ctl, "ranks", NAME)) == 1
                    and ask(ctl, "deployment_status", NAME)["status"] != "HEALTHY", 60, every=0.02)
    ask(ctl, "halt")
    ray.kill(ctl, no_restart=False)
    time.sleep(0.5)
    ctl = get_controller()
    assert ask(ctl, "wait_healthy", NAME, 60)
    assert wait_for(lambda: answers(h) == {"v2"}, 60)
    after = h.ranks()
    assert set(after).isdisjoint(before) and sorted(v[0] for v in after.values()) == [0, 1]
    status = h.status()
    assert {r["revision"] for r in status["replicas"].values()} == {status["revision"]}
    assert ask(ctl, "status")["rejected_events"] == 0
    ask(ctl, "reset")


class _Member:
    """A gang member: answers its code's tag, id, global rank, and its gang's members as it was
    started with them (``__init__``: where it would join its gang's collective group) and as now."""

    TAG = ""

    def __init__(self):
        self.joined = get_replica_context().gang.members

    def __call__(self):
        ctx = get_replica_context()
        return self.TAG, ctx.replica_id, ctx.rank.rank, self.joined, ctx.gang.members


GANG_OPTS = {"num_cpus": 0.1}


GANG_KW = dict(name="gangroll", num_replicas=4, gang_size=2, ray_actor_options=GANG_OPTS,
               graceful_shutdown_wait_loop_s=0.1, graceful_shutdown_timeout_s=2.0)  # (no calls to drain)


@deployment(**GANG_KW)
class GangV1(_Member):
    TAG = "v1"


@deployment(**GANG_KW)
class GangV2(_Member):
    TAG = "v2"


def test_new_code_rolls_a_gang_deployment_whole_gangs_on_their_ranks_each_new_gang_knowing_its_members():
    """Two gangs of two (docs/rollouts.md, "Gang deployments"): every replica replaced, on its global
    rank; each new gang's two StartReplicas go out in one step and its members see each other."""
    ctl = get_controller()
    ask(ctl, "reset")
    t0 = time.monotonic()
    h = run(GangV1.bind())
    t1 = time.monotonic()
    before = {rid: v[0] for rid, v in h.ranks().items()}
    assert sorted(before.values()) == [0, 1, 2, 3]
    ask(ctl, "record", {"scenario": "gang rollout on ray"})
    run(GangV2.options(max_unavailable=1).bind())  # returns once healthy
    print(f"\ngangs of 2 x 2: deployed in {t1 - t0:.2f}s, rolled in {time.monotonic() - t1:.2f}s")
    text = ask(ctl, "drain_trace")
    got = {r[1]: r for r in h.broadcast().values()}
    assert {r[0] for r in got.values()} == {"v2"} and set(got).isdisjoint(before)  # every replica replaced
    by_rank = {r[2]: rid for rid, r in got.items()}
    assert sorted(by_rank) == [0, 1, 2, 3]
    for rid, (_, _, rank, joined, members) in got.items():
        gang = (by_rank[rank - rank % 2], by_rank[rank - rank % 2 + 1])
        assert tuple(joined) == tuple(members) == gang, (rid, joined, members, gang)  # (no half-old gang)
    records = [json.loads(line) for line in text.splitlines() if line.strip()]
    at = [i for i, r in enumerate(records) if r.get("kind") == "command" and r.get("type") == "StartReplica"]
    starts = [records[i] for i in at]
    assert len(starts) == 4
    for s in starts:  # each successor on its predecessor's global rank
        f = s["fields"]
        assert before[f["replaces"]] == f["global_rank"] and got[f["replica_id"]][2] == f["global_rank"]
    # one gang at a time (max_unavailable 1, rounded up to a gang), each gang's two starts together
    assert [sorted(s["fields"]["global_rank"] for s in starts[i:i + 2]) for i in (0, 2)] == [[0, 1], [2, 3]]
    for i, j in ((at[0], at[1]), (at[2], at[3])):  # (no event between them: one step's commands)
        assert [r for r in records[i:j] if r.get("kind") == "event"] == []
    assert commands(text, "GangChanged") == []
    report = check_trace_lines(text.splitlines())
    assert report.ok, report.violations[:5]
    assert ask(ctl, "status")["rejected_events"] == 0
    ask(ctl, "reset")


ROLLOUT_SCENARIO = """
name: rollout on ray
cluster: {nodes: 1, gpus_per_node: 8}
latency: {place: 0.1, start: 1, reconfigure: 0.2, stop: 0.5}
deployments:
  model: {replicas: 3, user_config: {}}
timeline:
  - deploy: model
  - wait_until_healthy: {deployment: model, timeout: 60}
  - rollout: {deployment: model, version: v2, max_unavailable: 1}
  - wait_until_healthy: {deployment: model, timeout: 60}
expect:
  - ranks: {deployment: model, global: [0, 1, 2], contiguous: true}
  - reassignments: {deployment: model, equals: 0}
  - reconfigures: {deployment: model, reason: rank, equals: 0}
"""


def test_a_scenarios_rollout_action_gives_the_simulators_rank_history_on_ray():
    """The scenario runner applies the action's version (its class never changes): the same
    successors on the same ranks as in the simulator, counted as the simulator counts them."""
    sc = parse_scenario(ROLLOUT_SCENARIO, "rollout.yaml")
    buf = io.StringIO()
    assert Simulation(sc, trace=buf).run().passed
    want = rank_history(json.loads(line) for line in buf.getvalue().splitlines())
    result = run_on_ray(sc)
    assert result.passed, result.expectations
    lines = result.trace.splitlines()
    assert rank_history(json.loads(line) for line in lines) == want
    starts = [json.loads(line)["fields"] for line in lines if '"type":"StartReplica"' in line]
    assert [(f["global_rank"], f["replaces"] is not None) for f in starts] == \
        [(0, False), (1, False), (2, False), (0, True), (1, True), (2, True)]
    end = json.loads(lines[-1])
    m = end["metrics"]["deployments"]["model"]
    assert (m["rollout_replacements"], m["rollouts_done"]) == (3, 1)
    report = check_trace_lines(lines)
    assert report.ok, report.violations[:5]
    ask(get_controller(), "reset")


EDITED = """VERSION = "{version}"


class Model:
    def __call__(self):
        return (VERSION,)  # (as ``answers`` reads a tag: first)
"""


def test_an_edit_on_disk_is_never_served_under_the_old_revision_and_a_redeploy_rolls_it_out(importable):
    """Issue 64, defect 3: ``VERSION = "v2"`` written beside an unchanged class (imported by name:
    a new replica process reads the file as it is now). A replacement of a killed replica does not
    serve v2 under the v1 revision: its start fails, and the status says why; ``run()`` again
    rolls every replica onto v2 (the fingerprint covers the module's file)."""
    name = f"issue64_app_{uuid.uuid4().hex[:8]}"
    path = importable / f"{name}.py"
    path.write_text(EDITED.format(version="v1"))
    sys.path.insert(0, str(importable))
    ctl = get_controller()
    ask(ctl, "reset")
    try:
        importlib.invalidate_caches()
        module = importlib.import_module(name)
        made = deployment(name="edited", num_replicas=2, ray_actor_options=OPTS, restart_backoff_s=0.2,
                          restart_backoff_max_s=0.5)
        h = run(made(module.Model).bind())
        assert answers(h, 8) == {"v1"}
        v1 = h.status()["revision"]
        mtime = path.stat().st_mtime_ns
        path.write_text(EDITED.format(version="v2"))
        os.utime(path, ns=(mtime + 10**9, mtime + 10**9))  # (a later second: no stale .pyc)

        victim = sorted(h.ranks())[0]
        actor = ray.get_actor(actor_name("edited", victim), namespace=NAMESPACE)
        ask(ctl, "record", {"scenario": "an edit on disk"})
        os.kill(ray.get(actor.pid.remote(), timeout=30), signal.SIGKILL)
        # (UNHEALTHY at once for the kill: a serving replica died, rankcore.base.unhealthy; then for
        # the replacement's starts that fail: its message says so once they keep failing)
        assert wait_for(lambda: (st := h.status())["status"] == "UNHEALTHY"
                        and "failing to start" in st["status_message"], 60), h.status()
        status = h.status()
        assert {r["revision"] for r in status["replicas"].values()} == {v1}
        assert answers(h, 16) == {"v1"}  # (the survivor: nothing answers v2 under v1)
        crashes = [r["fields"]["reason"] for r in map(json.loads, ask(ctl, "drain_trace").splitlines())
                   if r.get("type") == "ReplicaCrashed"]
        print(f"\nafter the kill: {status['status']}: {status['status_message']}; {crashes[-1][:300]}")
        assert len(crashes) >= 2 and all("the code on this node changed" in c and name in c and v1 in c
                                          and "redeploy to roll it out" in c for c in crashes[1:]), crashes[:3]

        t0 = time.monotonic()
        module = importlib.reload(module)
        h = run(made(module.Model).bind())  # returns once healthy: rolled onto the file as it is
        print(f"redeploy rolled in {time.monotonic() - t0:.2f}s")
        status = h.status()
        assert status["revision"] != v1 and status["status"] == "HEALTHY"
        assert {r["revision"] for r in status["replicas"].values()} == {status["revision"]}
        assert victim not in h.ranks() and answers(h, 8) == {"v2"}
    finally:
        sys.path.remove(str(importable))
        sys.modules.pop(name, None)
        path.unlink()
        ask(ctl, "reset")
