"""The batcher's rules one by one (rankcore/requests/batcher.py, issue 39)."""

from __future__ import annotations

import pytest

import rankcore as rc
from rankcore.requests import (
    BatchDone,
    Batcher,
    BatchOptions,
    BatchPart,
    Cancel,
    Enqueue,
    Refused,
    RunBatch,
    SetBatchOptions,
    Tick,
)


def _ids(act: RunBatch) -> list[str]:
    return [r for p in act.parts for r in p.request_ids]


def test_serve_defaults():
    o = BatchOptions()
    assert (o.max_batch_size, o.batch_wait_timeout_s, o.max_concurrent_batches) == (10, 0.01, 1)


@pytest.mark.parametrize("kw, words", [
    ({"max_batch_size": 0}, "BatchOptions.max_batch_size must be an integer >= 1, got 0"),
    ({"max_batch_size": 2.0}, "BatchOptions.max_batch_size must be an integer >= 1, got 2.0"),
    ({"max_concurrent_batches": 0}, "BatchOptions.max_concurrent_batches must be an integer >= 1"),
    ({"batch_wait_timeout_s": -1}, "BatchOptions.batch_wait_timeout_s"),
])
def test_bad_options_are_refused_naming_the_field(kw, words):
    with pytest.raises(rc.InvalidConfig, match=words.replace(".", r"\.")):
        BatchOptions(**kw)


def test_a_full_batch_runs_at_once_and_a_partial_one_at_its_timeout():
    b = Batcher(BatchOptions(max_batch_size=3, batch_wait_timeout_s=0.05))
    assert b.handle(Enqueue(request_id="a", now=1.0)) == []
    assert b.next_deadline() == pytest.approx(1.05)
    assert b.handle(Enqueue(request_id="b", now=1.01)) == []
    (run,) = b.handle(Enqueue(request_id="c", now=1.02))
    assert _ids(run) == ["a", "b", "c"] and run.reason == "full" and run.began == 1.0 and run.closed == 1.02
    assert b.next_deadline() is None  # nothing forms
    b.handle(BatchDone(batch_id=run.batch_id, now=1.03))
    assert b.handle(Enqueue(request_id="d", now=1.04)) == []
    assert b.handle(Tick(now=1.089)) == []
    (run2,) = b.handle(Tick(now=1.09))
    assert _ids(run2) == ["d"] and run2.reason == "timeout" and run2.batch_id == run.batch_id + 1


def test_while_every_slot_is_busy_a_forming_batch_keeps_filling_past_its_timeout():
    b = Batcher(BatchOptions(max_batch_size=4, batch_wait_timeout_s=0.01, max_concurrent_batches=1))
    b.handle(Enqueue(request_id="a", now=0.0))
    (first,) = b.handle(Tick(now=0.01))
    b.handle(Enqueue(request_id="b", now=0.02))
    assert b.next_deadline() is None  # no slot: time alone closes nothing
    assert b.handle(Tick(now=0.5)) == []
    b.handle(Enqueue(request_id="c", now=0.6))
    (second,) = b.handle(BatchDone(batch_id=first.batch_id, now=0.7))
    assert _ids(second) == ["b", "c"] and second.reason == "timeout"


def test_a_request_that_does_not_fit_closes_the_batch_and_begins_the_next():
    b = Batcher(BatchOptions(max_batch_size=4, batch_wait_timeout_s=1.0, max_concurrent_batches=2))
    b.handle(Enqueue(request_id="a", now=0.0, size=3))
    (run,) = b.handle(Enqueue(request_id="b", now=0.1, size=2))
    assert _ids(run) == ["a"] and run.reason == "full" and run.size == 3
    assert b.waiting == 1 and b.next_deadline() == pytest.approx(1.1)  # b began the next one at 0.1


def test_one_request_bigger_than_the_bound_is_refused_with_serves_words():
    b = Batcher(BatchOptions(max_batch_size=4))
    (refused,) = b.handle(Enqueue(request_id="big", now=0.0, size=5))
    assert refused == Refused(request_id="big", size=5, max_batch_size=4)
    assert refused.detail.startswith("Size of item is greater than max_batch_size.")
    assert b.waiting == 0 and b.refused == 1


def test_a_batch_runs_split_by_model_id_each_part_in_arrival_order():
    b = Batcher(BatchOptions(max_batch_size=4))
    for rid, model in (("a", "m1"), ("b", "m2"), ("c", "m1")):
        b.handle(Enqueue(request_id=rid, now=0.0, model_id=model))
    (run,) = b.handle(Enqueue(request_id="d", now=0.0, model_id="m2"))
    assert run.parts == (BatchPart(model_id="m1", request_ids=("a", "c")),
                         BatchPart(model_id="m2", request_ids=("b", "d")))


def test_a_cancelled_request_leaves_its_batch_and_frees_its_room():
    b = Batcher(BatchOptions(max_batch_size=2, batch_wait_timeout_s=1.0))
    b.handle(Enqueue(request_id="a", now=0.0))
    assert b.handle(Cancel(request_id="a")) == []
    assert b.waiting == 0 and b.next_deadline() is None  # the batch it began is gone with it
    b.handle(Enqueue(request_id="b", now=0.1))
    b.handle(Enqueue(request_id="c", now=0.2))  # full: runs
    assert b.handle(Cancel(request_id="c")) == [] and b.cancelled == 1  # (running: the executor drops it)
    assert b.handle(Cancel(request_id="never")) == []


def test_a_cancel_in_a_batch_waiting_for_a_slot():
    b = Batcher(BatchOptions(max_batch_size=1, max_concurrent_batches=1))
    (first,) = b.handle(Enqueue(request_id="a", now=0.0))
    assert b.handle(Enqueue(request_id="b", now=0.0)) == []  # full, no slot: waits
    b.handle(Enqueue(request_id="c", now=0.0))
    b.handle(Cancel(request_id="b"))
    (nxt,) = b.handle(BatchDone(batch_id=first.batch_id, now=0.1))
    assert _ids(nxt) == ["c"]


def test_new_options_apply_from_the_next_batch_and_more_slots_at_once():
    b = Batcher(BatchOptions(max_batch_size=2, batch_wait_timeout_s=1.0, max_concurrent_batches=1))
    b.handle(Enqueue(request_id="a", now=0.0))
    b.handle(SetBatchOptions(options=BatchOptions(max_batch_size=3, batch_wait_timeout_s=0.0,
                                                  max_concurrent_batches=1)))
    (run,) = b.handle(Enqueue(request_id="b", now=0.1))  # the forming batch keeps its bound of 2
    assert run.max_batch_size == 2 and _ids(run) == ["a", "b"]
    assert b.handle(Enqueue(request_id="c", now=0.2)) == []  # no slot
    (more,) = b.handle(SetBatchOptions(options=BatchOptions(max_batch_size=3, batch_wait_timeout_s=0.0,
                                                            max_concurrent_batches=2)))
    assert _ids(more) == ["c"] and more.max_batch_size == 3


def test_bad_events_are_refused_and_change_nothing():
    b = Batcher()
    b.handle(Enqueue(request_id="a", now=5.0))
    with pytest.raises(rc.InvalidEvent, match="already waiting"):
        b.handle(Enqueue(request_id="a", now=6.0))
    with pytest.raises(rc.InvalidEvent, match="clock went back"):
        b.handle(Tick(now=4.0))
    with pytest.raises(rc.InvalidEvent, match="batch 7 is not running"):
        b.handle(BatchDone(batch_id=7, now=9.0))
    assert b.next_deadline() == pytest.approx(5.01) and b.waiting == 1
    with pytest.raises(rc.InvalidEvent, match="takes no str"):
        b.handle("tick")  # type: ignore[arg-type]
    with pytest.raises(rc.InvalidConfig, match=r"Enqueue\.size must be an integer >= 1"):
        Enqueue(request_id="x", now=0.0, size=0)
    with pytest.raises(rc.InvalidConfig, match="Batcher options must be a BatchOptions"):
        Batcher({"max_batch_size": 3})  # type: ignore[arg-type]
