"""A plain call a replica began and one it never began, then the replica killed (the witness,
``executors/ray_gpu/base/witness.py``): shared by the one-node and the multi-node tests."""

from __future__ import annotations

import os
import signal
import time
from typing import Any

import pytest
import ray

import rankcore as rc
from executors.ray_gpu.control.controller import NAMESPACE, actor_name

#: ``begun_and_waiting_then_killed(witnessed=ANY_WITNESS)``: the caller checks the witness answers itself
ANY_WITNESS = object()


def begun_and_waiting_then_killed(h: Any, name: str, slow: str = "slow", witnessed: Any = None) -> str:
    """``h``: a handle of ``name``, one replica of two slots whose ``slow(s)`` sleeps s seconds and
    returns its replica id. A call runs there, its process is frozen, a second call is sent to it
    (it never begins), the process is killed: the first fails naming the replica (it began: never
    run twice), the replacement answers the second. ``witnessed``: what the router's witness answers
    must be (None: the witness told about both calls, one never began). Returns the victim."""
    victim = sorted(h.ranks())[0]
    c0 = h.counters()
    actor = ray.get_actor(actor_name(name, victim), namespace=NAMESPACE)
    pid = ray.get(actor.handle_request.remote("pid", (), {}), timeout=30)
    running = getattr(h, slow).remote(30.0)
    time.sleep(1.0)  # (it began: its thread sleeps)
    os.kill(pid, signal.SIGSTOP)
    try:
        waiting = getattr(h, slow).remote(0.1)
        time.sleep(0.5)
        st = waiting.status()
        assert st is not None and st.state == "dispatched" and st.replica_id == victim, st
    finally:
        os.kill(pid, signal.SIGKILL)
    with pytest.raises(rc.ReplicaDied) as died:
        running.result(timeout=60)
    assert died.value.replica_id == victim
    answered_by = waiting.result(timeout=90)
    assert answered_by.startswith(f"{name}#") and answered_by != victim
    c = h.counters()
    before = (c0.failed, c0.answered, c0.retried) if c0 is not None else (0, 0, 0)  # (None: no call yet)
    assert (c.lost, c.failed - before[0], c.answered - before[1], c.retried - before[2]) == (0, 1, 1, 0), (
        c0, c, h._router.witnessed)
    want = [(victim, 2, 1)] if witnessed is None else witnessed
    assert witnessed is ANY_WITNESS or list(h._router.witnessed) == want, h._router.witnessed
    return victim
