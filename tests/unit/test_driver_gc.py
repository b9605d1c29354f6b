"""The executors' Driver keeps a big state out of the cyclic collector's way
(issue 8, point 3): after a large change of the replica count it collects once
and freezes, so later generation-2 passes do not rescan the state."""

from __future__ import annotations

import gc

import rankcore as rc
from executors.driver import FREEZE_MIN_CHANGE, Driver


class _Null:
    def execute(self, commands, t):
        pass


def _scale(d: Driver, n: int) -> None:
    if "app" not in d.state.deployments:
        d.feed(rc.DeploymentApplied(name="app", num_replicas=n), 0.0)
    else:
        d.feed(rc.ScaleRequested(deployment="app", num_replicas=n), 0.0)


def test_a_large_scale_up_freezes_what_is_alive_and_small_changes_do_not():
    gc.unfreeze()
    d = Driver(_Null())
    _scale(d, 100)
    assert d.freezes == 0 and gc.get_freeze_count() == 0
    _scale(d, FREEZE_MIN_CHANGE + 100)
    assert d.freezes == 1
    frozen = gc.get_freeze_count()
    # the new replica records are frozen: a full collection no longer scans them
    assert frozen >= FREEZE_MIN_CHANGE
    assert not any(type(o) is rc.base.state.Replica for o in gc.get_objects())
    _scale(d, FREEZE_MIN_CHANGE + 1_000)  # +900: below the threshold
    assert d.freezes == 1
    _scale(d, 2 * FREEZE_MIN_CHANGE + 200)  # +10,100 and more than a quarter
    assert d.freezes == 2 and gc.get_freeze_count() > frozen


def test_gc_freeze_false_leaves_the_collector_alone():
    gc.unfreeze()
    d = Driver(_Null(), gc_freeze=False)
    _scale(d, FREEZE_MIN_CHANGE + 100)
    assert d.freezes == 0 and gc.get_freeze_count() == 0
    assert any(type(o) is rc.base.state.Replica for o in gc.get_objects())
