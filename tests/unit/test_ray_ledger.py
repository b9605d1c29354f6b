"""The Ray controller's bookkeeping: one record per replica, so letting a
replica go is one deletion that takes its tasks and its group with it, and the
checkpoint keeps exactly the replicas of ours (no Ray cluster needed: the KV
store and the group removal are stood in for)."""

from __future__ import annotations

import asyncio

import pytest

from executors.ray_gpu.control import ledger as ledger_mod
from executors.ray_gpu.control import persist
from executors.ray_gpu.control.ledger import Ledger
from executors.ray_gpu.control.replicas import CREATED, RESERVING, ReplicaRecord


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
