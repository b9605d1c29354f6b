"""``@batch`` on plain asyncio (executors/ray_gpu/replica/batching.py, issue 39): the decorator carries
the core batcher's decisions out; the same rules on Ray are test_ray_batching's."""

from __future__ import annotations

import asyncio

import pytest

import rankcore as rc
from executors.ray_gpu import batch, get_multiplexed_model_id
from executors.ray_gpu.base.context import RequestContext, _serve_request_context
from executors.ray_gpu.replica.batching import BatchSizeMismatch


class Model:
    def __init__(self) -> None:
        self.batches: list[list] = []

    @batch(max_batch_size=4, batch_wait_timeout_s=0.05)
    async def double(self, xs: list[int]) -> list[int]:
        self.batches.append(list(xs))
        await asyncio.sleep(0.01)
        return [2 * x for x in xs]

    # (the waits below are long enough that a loaded machine's stall between the callers' submits does
    # not split their batch: the tests count on one; a batch that fills closes at once, whatever its wait)
    @batch(max_batch_size=3, batch_wait_timeout_s=0.5)
    async def short(self, xs: list[int]) -> list[int]:
        return xs[:-1]

    @batch(max_batch_size=3, batch_wait_timeout_s=0.2)
    async def broken(self, xs: list[int]) -> list[int]:
        raise ValueError(f"bad batch of {len(xs)}")

    @batch(max_batch_size=3, batch_wait_timeout_s=0.2)
    async def cancelled(self, xs: list[int]) -> list[int]:
        raise asyncio.CancelledError()

    @batch(max_batch_size=4, batch_wait_timeout_s=0.01)
    async def count_up(self, ns: list[int]):
        for i in range(max(ns)):
            yield [i if i < n else StopIteration for n in ns]

    # (a wait long enough that six callers started together all join before the timer, on a loaded CI
    # machine too: at 0.2 s a stalled loop once let the sixth begin a batch of its own)
    @batch(max_batch_size=6, batch_wait_timeout_s=1.0)
    async def which_model(self, xs: list[int]) -> list[str]:
        model = get_multiplexed_model_id()
        self.batches.append([model, *xs])
        return [f"{model}:{x}" for x in xs]

    @batch(max_batch_size=6, batch_wait_timeout_s=0.2, batch_size_fn=lambda items: sum(len(x) for x in items))
    async def rows(self, blocks: list[list[int]]) -> list[int]:
        self.batches.append([len(b) for b in blocks])
        return [sum(b) for b in blocks]


def _run(coro):
    return asyncio.run(asyncio.wait_for(coro, 10))


def test_calls_together_are_one_batch_and_each_caller_gets_its_own_answer():
    m = Model()

    async def go():
        return await asyncio.gather(*(m.double(i) for i in range(10)))

    assert _run(go()) == [2 * i for i in range(10)]
    assert m.batches == [[0, 1, 2, 3], [4, 5, 6, 7], [8, 9]]  # full, full, then the timeout


def test_a_lone_call_waits_its_timeout_then_runs_alone():
    m = Model()

    async def go():
        loop = asyncio.get_running_loop()
        t0 = loop.time()
        got = await m.double(21)
        return got, loop.time() - t0

    got, took = _run(go())
    assert got == 42 and m.batches == [[21]]
    assert 0.05 <= took < 0.5


def test_a_wrong_length_answer_fails_every_caller_of_that_batch():
    m = Model()

    async def go():
        return await asyncio.gather(*(m.short(i) for i in range(3)), return_exceptions=True)

    errs = _run(go())
    assert all(isinstance(e, BatchSizeMismatch) for e in errs)
    assert "input list has length 3 but the returned list has length 2" in str(errs[0])


def test_an_exception_of_the_method_fails_every_caller_of_that_batch():
    m = Model()

    async def go():
        return await asyncio.gather(*(m.broken(i) for i in range(2)), return_exceptions=True)

    errs = _run(go())
    assert [str(e) for e in errs] == ["bad batch of 2", "bad batch of 2"]


def test_a_batch_cancelled_inside_fails_its_callers_instead_of_leaving_them_waiting():
    m = Model()

    async def go():
        return await asyncio.gather(*(m.cancelled(i) for i in range(2)), return_exceptions=True)

    errs = _run(go())
    assert [str(e) for e in errs] == ["the batch was cancelled before it answered"] * 2


def test_calls_passing_other_arguments_fail_naming_them():
    m = Model()

    async def go():
        return await asyncio.gather(m.double(1), m.double(x=2), return_exceptions=True)  # type: ignore[call-arg]

    errs = _run(go())
    assert all(isinstance(e, TypeError) and "must pass the same arguments" in str(e) for e in errs), errs


def test_a_generator_streams_to_each_caller_and_stopiteration_ends_one_stream():
    m = Model()

    async def take(n):
        return [x async for x in m.count_up(n)]

    async def go():
        return await asyncio.gather(take(1), take(3), take(2))

    assert _run(go()) == [[0], [0, 1, 2], [0, 1]]


@pytest.mark.parametrize("n", [6, 3], ids=["closed-by-the-last-caller", "closed-by-the-timer"])
def test_each_model_s_part_of_a_batch_runs_in_its_own_model_s_request_context(n):
    """A batch splits by model id; each part must see its own model in ``get_multiplexed_model_id()``,
    not the context of whoever closed the batch (the last caller, or the timer's)."""
    m = Model()

    async def ask(i: int) -> str:
        _serve_request_context.set(RequestContext(multiplexed_model_id=("model_a", "model_b")[i % 2]))  # (as a replica)
        return await m.which_model(i)

    async def go():
        return await asyncio.gather(*(ask(i) for i in range(n)))

    assert _run(go()) == [f"{('model_a', 'model_b')[i % 2]}:{i}" for i in range(n)]
    assert sorted(m.batches) == [["model_a", *range(0, n, 2)], ["model_b", *range(1, n, 2)]]


def test_batch_size_fn_counts_items_and_one_too_big_is_refused():
    m = Model()

    async def go():
        return await asyncio.gather(m.rows([1, 2]), m.rows([3, 4, 5]), m.rows([6, 7]), m.rows(list(range(7))),
                                    return_exceptions=True)

    a, b, c, big = _run(go())
    assert (a, b, c) == (3, 12, 13)
    assert m.batches == [[2, 3], [2]]  # 2 + 3 fit in 6; the next 2 did not: it began the next batch
    assert isinstance(big, RuntimeError) and "Size of item is greater than max_batch_size" in str(big)


def test_a_cancelled_caller_leaves_its_batch():
    m = Model()

    async def go():
        doomed = asyncio.ensure_future(m.double(1))
        await asyncio.sleep(0)
        doomed.cancel()
        got = await asyncio.gather(m.double(2), m.double(3))
        return got, doomed.cancelled()

    got, cancelled = _run(go())
    assert got == [4, 6] and cancelled
    assert m.batches == [[2, 3]]


def test_set_max_batch_size_applies_from_the_next_batch_without_a_restart():
    m = Model()

    async def go():
        await asyncio.gather(*(m.double(i) for i in range(4)))
        Model.double.set_max_batch_size(2)
        await asyncio.sleep(0)  # (the runners are told on their loop)
        await asyncio.gather(*(m.double(i) for i in range(4)))

    try:
        _run(go())
        assert m.batches == [[0, 1, 2, 3], [0, 1], [2, 3]]
        assert Model.double._get_max_batch_size() == 2
    finally:
        Model.double.set_max_batch_size(4)


def test_bad_options_and_functions_are_refused_when_the_class_is_defined():
    with pytest.raises(rc.InvalidConfig, match="max_batch_size must be an integer >= 1, got 0"):
        batch(max_batch_size=0)
    with pytest.raises(rc.InvalidConfig, match="batch_wait_timeout_s"):
        batch(batch_wait_timeout_s=-0.5)
    with pytest.raises(TypeError, match="batch_size_fn must be a callable"):
        batch(batch_size_fn=3)  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="needs an 'async def'"):
        @batch
        def plain(self, xs):
            return xs
    with pytest.raises(rc.InvalidConfig, match="max_batch_size"):
        Model.double.set_max_batch_size(0)
