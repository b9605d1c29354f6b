"""Gangs on Ray (local Ray, 4 logical GPUs): replicas that start, fail and
scale together on consecutive ranks, each knowing its gang from
``get_replica_context().gang``."""

from __future__ import annotations

import json

import pytest
import ray

import rankcore as rc
from executors.ray_gpu import deployment, get_controller, get_replica_context, run
from executors.ray_gpu.api.deployments import ask
from executors.ray_gpu.control.controller import NAMESPACE, actor_name
from tests.integration.waiting import wait_for

pytestmark = pytest.mark.usefixtures("local_ray")

OPTS = {"num_cpus": 0.05, "num_gpus": 0.5}


@pytest.fixture(autouse=True)
def clean():
    yield
    ask(get_controller(), "reset")


class Member:
    def __call__(self) -> dict:
        ctx = get_replica_context()
        g = ctx.gang
        return {"rid": ctx.replica_id, "rank": ctx.rank.rank, "world_size": ctx.world_size,
                "gang": (g.gang_id, g.rank_in_gang, g.gang_size, g.members) if g is not None else None}


def by_rank(h) -> dict[int, dict]:
    return {r["rank"]: r for r in h.broadcast().values()}


def kill(dep: str, rid: str) -> None:
    ray.kill(ray.get_actor(actor_name(dep, rid), namespace=NAMESPACE), no_restart=True)


def expected_gang(dep: str, ctxs: dict[int, dict], rank: int, size: int = 2) -> tuple:
    g = rank // size
    return (f"{dep}/gang-{g}", rank % size, size, tuple(ctxs[r]["rid"] for r in range(g * size, (g + 1) * size)))


def test_gang_options_are_checked_at_the_decorator():
    assert deployment(Member, name="g", num_replicas=4, gang_size=2, gang_failure="restart_replica",
                      gang_placement="spread").gang_size == 2
    for kwargs, words in [({"num_replicas": 3, "gang_size": 2}, "num_replicas=3 is not a multiple of gang_size=2"),
                          ({"gang_size": 0}, "gang_size must be an int >= 1"),
                          ({"num_replicas": 2, "gang_size": 2, "gang_failure": "restart_all"}, "gang_failure must be"),
                          ({"num_replicas": 2, "gang_size": 2, "gang_placement": "strict"}, "gang_placement must be")]:
        with pytest.raises(rc.InvalidConfig, match=words):
            deployment(Member, name="g", **kwargs)
    with pytest.raises(rc.InvalidConfig, match=r"'g'.*gang_size"):  # @deployment(...) form, .options too
        deployment(name="g", num_replicas=2, gang_size=2)(Member).options(num_replicas=5)


def test_restart_gang_restarts_every_member_on_its_rank_and_scaling_is_by_whole_gangs():
    ctl = get_controller()
    ask(ctl, "record", {"scenario": "restart_gang"})
    h = run(deployment(Member, name="gang", num_replicas=4, gang_size=2, ray_actor_options=OPTS).bind())
    before = by_rank(h)
    assert sorted(before) == [0, 1, 2, 3]
    for r, c in before.items():
        assert c["gang"] == expected_gang("gang", before, r) and c["world_size"] == 4
    assert {rid: v["gang"] for rid, v in h.status()["replicas"].items()} == \
        {c["rid"]: f"gang/gang-{r // 2}" for r, c in before.items()}

    kill("gang", before[1]["rid"])  # one member dies: its whole gang restarts
    old = {before[0]["rid"], before[1]["rid"]}
    assert wait_for(lambda: not old & set(h.ranks()) and ask(ctl, "wait_healthy", "gang", 0.2))
    after = by_rank(h)
    assert after[0]["rid"] not in old and after[1]["rid"] not in old  # both members new ...
    assert sorted(after) == [0, 1, 2, 3]  # ... on the same ranks
    assert (after[2], after[3]) == (before[2], before[3])  # the other gang untouched
    for r in (0, 1):
        assert after[r]["gang"] == expected_gang("gang", after, r)
    records = [json.loads(line) for line in ask(ctl, "drain_trace").splitlines()]
    crash = next(i for i, r in enumerate(records) if r["kind"] == "event" and r["type"] == "ReplicaCrashed")
    cmds = [(r["type"], r["replica"]) for r in records[crash:] if r["kind"] == "command"
            and r["type"] in ("StopReplica", "StartReplica")]
    assert ("StopReplica", before[0]["rid"]) in cmds  # the live member stopped by the core's command
    assert sorted(rid for t, rid in cmds if t == "StartReplica") == sorted([after[0]["rid"], after[1]["rid"]])

    with pytest.raises(rc.InvalidConfig, match=r"handle.scale\(3\) of 'gang': .*not a multiple of its gang_size=2"):
        h.scale(3)
    h.scale(2)  # the top gang goes whole
    assert {v[0]: rid for rid, v in h.ranks().items()} == {0: after[0]["rid"], 1: after[1]["rid"]}
    h.scale(4)  # a new gang on ranks 2, 3
    grown = by_rank(h)
    assert grown[0] == after[0] and grown[2]["gang"] == expected_gang("gang", grown, 2)
    assert ask(ctl, "state_errors") == []


def test_restart_replica_replaces_the_member_and_tells_the_others():
    ctl = get_controller()
    h = run(deployment(Member, name="solo", num_replicas=2, gang_size=2, gang_failure="restart_replica",
                       ray_actor_options=OPTS).bind())
    before = by_rank(h)
    kill("solo", before[1]["rid"])
    assert wait_for(lambda: before[1]["rid"] not in h.ranks() and ask(ctl, "wait_healthy", "solo", 0.2))
    new = {v[0]: rid for rid, v in h.ranks().items()}
    assert new[0] == before[0]["rid"] and new[1] != before[1]["rid"]  # only the dead member replaced
    members = ("solo/gang-0", (new[0], new[1]))
    # the survivor learns the new member list (GangChanged), the newcomer starts with it
    assert wait_for(lambda: all((c["gang"][0], c["gang"][3]) == members for c in by_rank(h).values()), 30)
    assert [c["gang"][1] for _, c in sorted(by_rank(h).items())] == [0, 1]
    assert ask(ctl, "state_errors") == []
