"""The replica's witness (executors/ray_gpu/base/witness.py): what a dead process had begun, read
from another process; every doubt counts as begun."""

from __future__ import annotations

import multiprocessing as mp
import os
import signal
import time

import pytest

from executors.ray_gpu.base import witness as w


def _writer(directory: str, begun: list[int], ended: list[int], ready: mp.Event) -> None:
    wit = w.Witness("actor1", directory=__import__("pathlib").Path(directory))
    slots = {k: wit.begin(k) for k in begun}
    for k in ended:
        wit.end(slots[k])
    ready.set()
    time.sleep(60)  # (killed by the test)


def _dead_writer(tmp_path, begun: list[int], ended: list[int] = ()) -> None:  # type: ignore[assignment]
    ctx = mp.get_context("fork")
    ready = ctx.Event()
    p = ctx.Process(target=_writer, args=(str(tmp_path), begun, list(ended), ready))
    p.start()
    assert ready.wait(30)
    os.kill(p.pid, signal.SIGKILL)
    p.join(30)


def test_a_dead_replicas_witness_names_the_calls_it_began_running_or_ended(tmp_path):
    _dead_writer(tmp_path, begun=[11, 12, 13], ended=[12])
    assert w.began("actor1", [11, 12, 13, 14, 15], directory=tmp_path) == [11, 12, 13]


def test_no_witness_is_unknown_so_every_call_counts_as_begun(tmp_path):
    assert w.began("nobody", [1, 2], directory=tmp_path) is None


def test_a_process_that_still_runs_is_unknown_after_the_wait(tmp_path):
    wit = w.Witness("alive", directory=tmp_path)  # (this process: it lives)
    wit.begin(5)
    t0 = time.monotonic()
    assert w.began("alive", [5, 6], directory=tmp_path, wait_s=0.2) is None
    assert 0.15 <= time.monotonic() - t0 < 5
    wit.close()
    assert not (tmp_path / "rankcore-witness-alive").exists()  # (a graceful stop removes it)


def test_a_call_begun_with_every_slot_busy_reads_as_unknown_until_keep_s_after_it_ended(tmp_path, monkeypatch):
    monkeypatch.setattr(w, "SLOTS", 4)
    wit = w.Witness("full", directory=tmp_path)
    slots = [wit.begin(k) for k in (1, 2, 3, 4)]
    assert sorted(slots) == [0, 1, 2, 3]
    wit.end(slots[0])  # (ended just now: kept KEEP_S, not reused)
    unrecorded = wit.begin(5)
    assert unrecorded == -1 and wit.unrecorded == 1
    data = (tmp_path / "rankcore-witness-full").read_bytes()
    assert w._HEADER.unpack_from(data, 0)[3] == 1
    monkeypatch.setattr(w, "_start_ticks", lambda pid: None)  # (read as if its process were gone)
    assert w.began("full", [1, 6], directory=tmp_path) is None  # (5 runs unrecorded: 6 may be it)
    wit.end(unrecorded)
    assert wit.unrecorded == 0
    assert w.began("full", [1, 6], directory=tmp_path) is None  # (ended less than KEEP_S ago)
    monkeypatch.setattr(w, "KEEP_S", 0.0)
    assert w.began("full", [1, 6], directory=tmp_path) == [1]  # (healed: what it holds is whole again)
    wit.close()


def test_an_ended_calls_slot_is_reused_only_after_keep_s(tmp_path, monkeypatch):
    monkeypatch.setattr(w, "SLOTS", 2)
    wit = w.Witness("reuse", directory=tmp_path)
    a, b = wit.begin(1), wit.begin(2)
    wit.end(a)
    assert wit.begin(3) == -1  # (1 ended less than KEEP_S ago: still kept)
    monkeypatch.setattr(w, "KEEP_S", 0.0)
    assert wit.begin(4) == a  # (now its slot takes the new key)
    assert b != a
    wit.close()


def test_sweep_removes_dead_writers_witnesses_only(tmp_path):
    _dead_writer(tmp_path, begun=[1])
    live = w.Witness("live", directory=tmp_path)
    assert w.sweep(tmp_path) == 0  # (the dead one began a call a moment ago: a router may still ask)
    assert w.sweep(tmp_path, older_than_s=0) == 1
    assert [p.name for p in tmp_path.iterdir()] == ["rankcore-witness-live"]
    live.close()


def test_a_witness_lives_in_memory_where_the_node_has_it_or_where_the_env_says(monkeypatch, tmp_path):
    monkeypatch.delenv(w.DIR_ENV, raising=False)
    assert w.witness_path("x").parent == w.witness_dir()
    if os.path.isdir("/dev/shm"):
        assert str(w.witness_dir()) == "/dev/shm"
    monkeypatch.setenv(w.DIR_ENV, str(tmp_path))
    assert w.witness_path("x") == tmp_path / "rankcore-witness-x"


@pytest.mark.parametrize("key", [1, 2**63 + 5, 2**64 - 1])
def test_any_64_bit_key_round_trips(tmp_path, key):
    _dead_writer(tmp_path, begun=[key])
    assert w.began("actor1", [key, 7], directory=tmp_path) == [key]
