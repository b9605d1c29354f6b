"""A replica keeps the world size of the newest command that carried one, in
the order the core emitted them, whatever order the calls arrive in. Found by
the exploring Ray property run (seed 2076362567): after a controller restart a
reconfigure's task started after a later UpdateWorldSize had been sent, and
the replica was left on the old world size."""

from __future__ import annotations

import asyncio

from executors.ray_gpu.replica.actor import ReplicaActor


class Model:
    pass


def _replica() -> ReplicaActor:
    return ReplicaActor("app", "app#0", Model, (), {}, lineage=0, global_rank=0, world_size=1)


def test_an_older_reconfigure_arriving_late_does_not_undo_a_newer_world_size():
    r = _replica()

    async def go() -> None:
        await r.update_world_size(3, (2, 7))  # sent second, arrives first
        await r.reconfigure((0, 0, 0), 1, {"m": 2}, 4, False, False, (2, 6))  # sent first, arrives late
    asyncio.run(go())
    assert r.world_size == 3
    assert r.user_config == {"m": 2} and r.version == 4  # the rest of the reconfigure still applies


def test_a_newer_command_wins_and_a_later_controller_outranks_an_earlier_one():
    r = _replica()

    async def go() -> None:
        await r.update_world_size(3, (1, 900))
        await r.update_world_size(5, (2, 1))  # a restarted controller's first command
        await r.update_world_size(4, (1, 901))  # the dead controller's, delivered late
    asyncio.run(go())
    assert r.world_size == 5


def test_unnumbered_calls_still_apply():
    r = _replica()
    asyncio.run(r.update_world_size(6))
    assert r.world_size == 6
