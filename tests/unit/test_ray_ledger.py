"""The Ray controller's bookkeeping: one record per replica, so letting a
replica go is one deletion that takes its tasks and its group with it, and the
checkpoint keeps exactly the replicas of ours (no Ray cluster needed: the KV
store and the group removal are stood in for)."""

from __future__ import annotations

import asyncio

import pytest

from executors.ray_gpu.base import persist
from executors.ray_gpu.base.replicas import CREATED, RESERVING, ReplicaRecord
from executors.ray_gpu.control import ledger as ledger_mod
from executors.ray_gpu.control.ledger import Ledger


@pytest.fixture
def saved(monkeypatch):
    """A Ledger on a stand-in KV store: returns (ledger, checkpoints saved, groups removed)."""
    checkpoints: list[dict] = []
    removed: list[object] = []
    monkeypatch.setattr(persist, "epoch", lambda: 0.0)
    monkeypatch.setattr(persist, "next_incarnation", lambda: 1)
    monkeypatch.setattr(persist, "save_replicas", checkpoints.append)
    monkeypatch.setattr(ledger_mod.ray.util, "remove_placement_group", removed.append)
    return Ledger(), checkpoints, removed


def test_a_checkpoint_entry_round_trips_into_a_record():
    rec = ReplicaRecord(deployment="d", global_rank=3, lineage=7, world_size=4, stage=CREATED, gang=None,
                        actor=object(), initialized=True)
    back = ReplicaRecord.from_checkpoint(rec.checkpoint())
    assert back.checkpoint() == rec.checkpoint()
    assert back.actor is None and not back.initialized  # (what is not saved is not recovered from it)


def test_forget_drops_the_record_cancels_its_tasks_and_removes_its_group(saved):
    led, checkpoints, removed = saved

    async def go() -> None:
        placing = asyncio.get_event_loop().create_task(asyncio.sleep(10))
        checks = asyncio.get_event_loop().create_task(asyncio.sleep(10))
        pg = object()
        led.replicas["d#0"] = ReplicaRecord(deployment="d", stage=RESERVING, pg=pg, placing=("n0", placing),
                                            checks=checks)
        led.replicas["d#1"] = ReplicaRecord(deployment="d")
        rec = led.forget("d#0")
        await asyncio.sleep(0)
        assert rec is not None and rec.pg is None and removed == [pg]
        assert placing.cancelled() and checks.cancelled()  # (asyncio.run would cancel them too: checked here)

    asyncio.run(go())
    assert list(led.replicas) == ["d#1"]
    assert checkpoints[-1] == {"d#1": led.replicas["d#1"].checkpoint()}  # saved without it
    assert led.forget("d#0") is None


def test_forget_leaves_the_calling_task_running_and_saves_nothing_for_a_replica_not_ours(saved):
    led, checkpoints, _ = saved

    async def go() -> bool:
        led.replicas["x#0"] = ReplicaRecord(deployment="x", checkpointed=False,
                                            checks=asyncio.current_task())  # the health check forgets itself
        led.forget("x#0")
        await asyncio.sleep(0)
        return asyncio.current_task().cancelling() == 0  # type: ignore[union-attr]

    assert asyncio.run(go())
    assert not led.replicas and checkpoints == []


class _Counted(dict):
    """``Ledger.replicas`` that counts the records a loop over it reads."""

    visited = 0

    def _count(self, it):
        for x in it:
            self.visited += 1
            yield x

    def items(self):
        return self._count(super().items())

    def values(self):
        return self._count(super().values())

    def keys(self):
        return self._count(super().keys())

    def __iter__(self):
        return self._count(super().__iter__())


class _Watcher:
    def __init__(self) -> None:
        self.checked: list[str] = []

    def start_checks(self, rid: str, actor: object) -> None:
        self.checked.append(rid)


def _carrier(led: Ledger, monkeypatch) -> tuple:
    """A Carrier on ``led`` (no Ray): returns (carrier, nodes topped up, events fed)."""
    from executors.ray_gpu.control.carry import Carrier

    refills: list[str] = []
    fed: list[object] = []
    monkeypatch.setattr(led.spares, "refill", refills.append)
    monkeypatch.setattr(led, "feed", fed.append)
    return Carrier(led, _Watcher()), refills, fed  # type: ignore[arg-type]


def test_a_top_up_after_a_replica_is_ready_reads_no_record_whatever_the_fleet(saved, monkeypatch):
    """Issue 36: a ReplicaReady's spare top-up scanned every actor to find one
    still starting on the node (quadratic on a bulk deploy). Counted, not timed:
    the records it reads are the same (none) with 10 and 1,000 replicas."""
    visited = {}
    for n in (10, 1000):
        led = Ledger()
        carrier, refills, fed = _carrier(led, monkeypatch)
        for i in range(n):  # ready replicas on other nodes
            led.replicas[f"d#{i}"] = ReplicaRecord(deployment="d", stage=CREATED, actor=object(), initialized=True)
        led.replicas["d#new"] = ReplicaRecord(deployment="d", stage=CREATED, actor=object())
        led.starting_at("d#new", "n0")
        led.replicas["d#late"] = ReplicaRecord(deployment="d", stage=CREATED, actor=object())
        led.starting_at("d#late", "n0")
        led.replicas = _Counted(led.replicas)
        assert carrier._ready("d#new", object())
        carrier.top_up_spares("n0")
        visited[n] = led.replicas.visited
        assert visited[n] == 0, f"one ReplicaReady's top-up read {visited[n]} records of {n + 2}"
        assert refills == []  # d#late still starts there: it may take an idle process
        assert carrier._ready("d#late", object())
        carrier.top_up_spares("n0")
        assert refills == ["n0"]  # the last one to start tops the node up
        assert [type(e).__name__ for e in fed] == ["ReplicaReady", "ReplicaReady"]
        assert led.replicas.visited == 0
    assert visited == {10: 0, 1000: 0}


def test_a_replica_starts_on_its_node_until_it_is_ready_fails_to_place_or_is_forgotten(saved, monkeypatch):
    led, _, _ = saved
    carrier, refills, _ = _carrier(led, monkeypatch)
    for rid in ("d#0", "d#1", "d#2"):
        led.replicas[rid] = ReplicaRecord(deployment="d")
        led.starting_at(rid, "n0")
    assert led.starts_on("n0") and not led.starts_on("n1")
    led.starting_at("d#0", "n1")  # a caller's bundle moved: the actor runs on n1
    assert led.starting == {"n0": {"d#1", "d#2"}, "n1": {"d#0"}} and led.starting_node["d#0"] == "n1"

    async def stop() -> None:  # (cancel_chain runs in the controller's loop)
        carrier.cancel_chain("d#1")  # stopped while placing, no actor: not starting any more
        led.replicas["d#2"].actor = object()
        carrier.cancel_chain("d#2")  # an actor: starting until it is killed (forgotten)

    asyncio.run(stop())
    assert led.starting == {"n0": {"d#2"}, "n1": {"d#0"}}
    led.forget("d#2")
    carrier.top_up_spares("n0")
    carrier.top_up_spares("n1")
    assert refills == ["n0"] and led.starting == {"n1": {"d#0"}} and "d#2" not in led.starting_node
    led.forget("d#0")
    assert led.starting == {} and led.starting_node == {}
