"""executors.ray_gpu.replica.collective without Ray: what a replica's helper does before and
between epochs (the re-form itself runs on Ray: tests/integration/test_ray_groups.py)."""

from __future__ import annotations

import threading
import time

import pytest

import rankcore as rc
from executors.ray_gpu.replica import collective


@pytest.fixture(autouse=True)
def fresh(monkeypatch):
    monkeypatch.setattr(collective, "_newest", None)


def ctx(epoch: int, members=("dp#0", "dp#1")) -> rc.GroupContext:
    return rc.GroupContext(group_id="dp", epoch=epoch, rank=0, world_size=len(members), members=members,
                           previous_epoch=epoch - 1)


def test_no_epoch_yet_is_a_clear_refusal_not_a_hang():
    pg = collective.ProcessGroup(timeout_s=1.0)
    t0 = time.monotonic()
    with pytest.raises(collective.GroupReforming, match="no epoch of the collective group has formed yet"):
        pg.ensure(wait_s=0.2)
    assert time.monotonic() - t0 < 1.0 and pg.epoch == 0


def test_wait_newer_wakes_when_the_replica_is_told_a_newer_epoch():
    pg = collective.ProcessGroup()
    threading.Timer(0.1, collective.told, args=(ctx(1),)).start()
    got = pg.wait_newer(5.0)
    assert got is not None and got.epoch == 1


def test_an_older_epoch_told_late_never_replaces_the_newest():
    collective.told(ctx(3))
    collective.told(ctx(2))
    assert collective.newest().epoch == 3


def test_the_rendezvous_key_names_the_epoch_and_its_members():
    a, b = ctx(2), ctx(2, members=("dp#0", "dp#5"))
    assert a.rendezvous_key != b.rendezvous_key != ctx(3).rendezvous_key
    assert a.rendezvous_key.startswith("dp/epoch-2/")


def test_a_failed_epoch_is_not_joined_again_until_a_newer_one_or_its_timeout():
    pg = collective.ProcessGroup(timeout_s=0.3)
    collective.told(ctx(1))
    pg.group = ctx(1)  # (as if joined: no process group in this process, nothing to destroy)
    assert pg.failed() is None and pg.group is None
    with pytest.raises(collective.GroupReforming, match="epoch 1 of dp failed; waiting for the next one"):
        pg.ensure()
    assert pg.wait_newer(0.05) is None  # (epoch 1 is no news)
    threading.Timer(0.05, collective.told, args=(ctx(2, members=("dp#0", "dp#2")),)).start()
    got = pg.wait_newer(5.0)
    assert got is not None and got.epoch == 2
    # a failure that was no member's death: after timeout_s the same epoch may be joined again
    pg2 = collective.ProcessGroup(timeout_s=0.1)
    pg2.group = ctx(2, members=("dp#0", "dp#2"))
    pg2.failed()
    assert pg2._is_broken(collective.newest())
    time.sleep(0.15)
    assert not pg2._is_broken(collective.newest())
