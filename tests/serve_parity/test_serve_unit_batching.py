"""Ray Serve's ``@serve.batch`` unit tests, run against rankcore's ``serve.batch``.

Source: ray-project/ray, python/ray/serve/tests/unit/test_batching.py at commit
090eba776e2d85c3ce1bea884c78db971812e735 (rankcore's installed Ray, for comparison, is 2.60.0).
Every case of that file is here under its own name and parameters, re-expressed against
``from executors.ray_gpu import serve`` (written anew from what each case checks, not copied).
What changed and why is said at each case; the tally is in docs/testing.md, "Ray Serve's own
tests (tests/serve_parity/)".
"""

from __future__ import annotations

import asyncio
import time

import pytest

from executors.ray_gpu import serve
from executors.ray_gpu.replica.batching import BatchSizeMismatch

ORIGIN = "python/ray/serve/tests/unit/test_batching.py@090eba776e2d85c3ce1bea884c78db971812e735"

def _pairs(key1: list, key2: list) -> list:
    return list(zip(key1, key2))


async def _divide_unless_raise(requests: list) -> list:
    if "raise" in requests:
        _ = 1 / 0
    return requests


def _batched(use_class: bool, body, **options):
    """``body`` batched by ``@serve.batch(**options)``, as a method of an instance or as a plain
    function (Serve's cases run both ways)."""
    if use_class:
        class Holder:
            @serve.batch(**options)
            async def method(self, requests):
                return await body(requests)

        return Holder().method

    @serve.batch(**options)
    async def function(requests):
        return await body(requests)

    return function


def _batched_pair(use_class: bool, body, **options):
    """The two-argument ``(key1, key2)`` form of ``_batched``."""
    if use_class:
        class MultipleArgs:
            @serve.batch(**options)
            async def method(self, key1, key2):
                return await body(key1, key2)

        return MultipleArgs().method

    @serve.batch(**options)
    async def func(key1, key2):
        return await body(key1, key2)

    return func


def _streaming_pair(use_class: bool, body, **options):
    """The generator form of ``_batched_pair``: ``body(key1, key2)`` is an async generator."""
    if use_class:
        class MultipleArgs:
            @serve.batch(**options)
            async def method(self, key1, key2):
                async for items in body(key1, key2):
                    yield items

        return MultipleArgs().method

    @serve.batch(**options)
    async def func(key1, key2):
        async for items in body(key1, key2):
            yield items

    return func


def _call_as(func, mode: str, first: str, second: str):
    """One call passing ``first`` and ``second`` as key1 and key2, the way ``mode`` names."""
    if mode == "args":
        return func(first, second)
    if mode == "kwargs":
        return func(key1=first, key2=second)
    if mode == "mixed":
        return func(first, key2=second)
    assert mode == "out-of-order"
    return func(key2=second, key1=first)


@pytest.mark.asyncio
async def test_decorator_validation():
    # accepted, bare and with options, on functions and on methods
    @serve.batch
    async def function():
        pass

    @serve.batch(max_batch_size=10, batch_wait_timeout_s=1.5)
    async def function2():
        pass

    class Class:
        @serve.batch
        async def method(self):
            pass

    class Class2:
        @serve.batch(max_batch_size=10, batch_wait_timeout_s=1.5)
        async def method(self):
            pass

    # refused: not async def
    with pytest.raises(TypeError, match="async def"):
        @serve.batch
        def non_async_function():
            pass

    with pytest.raises(TypeError, match="async def"):
        class NotAsync:
            @serve.batch
            def method(self, requests):
                pass

    # refused: a bound below 1, a negative wait
    with pytest.raises(ValueError):
        class ZeroBatch:
            @serve.batch(max_batch_size=0)
            async def method(self, requests):
                pass

    with pytest.raises(ValueError):
        class NegativeTimeout:
            @serve.batch(batch_wait_timeout_s=-0.1)
            async def method(self, requests):
                pass

    # accepted: a zero wait, float or int
    class FloatZeroTimeout:
        @serve.batch(batch_wait_timeout_s=0.0)
        async def method(self, requests):
            pass

    class IntZeroTimeout:
        @serve.batch(batch_wait_timeout_s=0)
        async def method(self, requests):
            pass

    # wrong types are TypeErrors (rankcore: BatchOptionTypeError, an InvalidConfig and a TypeError);
    # an integral float bound is taken as that int
    with pytest.raises(TypeError):
        class NonTimeout:
            @serve.batch(batch_wait_timeout_s="a")
            async def method(self, requests):
                pass

    with pytest.raises(TypeError):
        class FloatNonIntBatch:
            @serve.batch(max_batch_size=1.1)
            async def method(self, requests):
                pass

    class FloatIntegerBatch:
        @serve.batch(max_batch_size=1.0)
        async def method(self, requests):
            pass


@pytest.mark.asyncio
@pytest.mark.parametrize("use_class", [True, False])
async def test_batch_size_one_long_timeout(use_class):
    call = _batched(use_class, _divide_unless_raise, max_batch_size=1, batch_wait_timeout_s=1000)
    assert await call("hi") == "hi"  # a full batch of one runs at once, whatever the wait
    with pytest.raises(ZeroDivisionError):
        await call("raise")


@pytest.mark.asyncio
@pytest.mark.parametrize("use_class", [True, False])
async def test_batch_size_multiple_zero_timeout(use_class):
    gate = asyncio.Event()

    async def body(requests):
        await gate.wait()
        return await _divide_unless_raise(requests)

    call = _batched(use_class, body, max_batch_size=2, batch_wait_timeout_s=0)
    gate.set()
    assert await call("hi") == "hi"
    with pytest.raises(ZeroDivisionError):
        await call("raise")
    gate.clear()

    # a lone call runs alone at once (zero wait) and holds the only slot; the next two go together
    loop = asyncio.get_running_loop()
    t1 = loop.create_task(call("hi1"))
    with pytest.raises(asyncio.TimeoutError):
        await asyncio.wait_for(asyncio.shield(t1), timeout=0.001)
    t2 = loop.create_task(call("hi2"))
    t3 = loop.create_task(call("raise"))
    gate.set()
    assert await t1 == "hi1"
    with pytest.raises(ZeroDivisionError):  # hi2 shares the batch of "raise"
        await t2
    with pytest.raises(ZeroDivisionError):
        await t3


@pytest.mark.asyncio
async def test_batch_timeout_empty_queue():
    @serve.batch(max_batch_size=10, batch_wait_timeout_s=0.25)
    async def no_op(requests):
        return ["No-op"] * len(requests)

    loop = asyncio.get_running_loop()
    for iteration in range(2):
        tasks = [loop.create_task(no_op(None)) for _ in range(9)]
        done, _ = await asyncio.wait(tasks, timeout=0.05)
        assert not done  # nine wait for the tenth (or the 0.25 s)
        tasks.append(loop.create_task(no_op(None)))
        done, _ = await asyncio.wait(tasks, timeout=0.05)
        assert set(done) == set(tasks)
        assert all(t.result() == "No-op" for t in tasks)
        if iteration == 0:
            time.sleep(0.25)  # (the loop held: the queue stays empty a whole wait between batches)


@pytest.mark.asyncio
async def test_batch_wait_queue_exceeds_batch_size_race_condition():
    @serve.batch(max_batch_size=2, batch_wait_timeout_s=10000)
    async def no_op(requests):
        return ["No-op"] * len(requests)

    loop = asyncio.get_running_loop()
    tasks = [loop.create_task(no_op(None)) for _ in range(10)]
    done, pending = await asyncio.wait(tasks, timeout=0.5)  # five full batches, none waits
    assert len(done) == 10 and not pending


@pytest.mark.asyncio
@pytest.mark.parametrize("use_class", [True, False])
async def test_batch_size_multiple_long_timeout(use_class):
    call = _batched(use_class, _divide_unless_raise, max_batch_size=3, batch_wait_timeout_s=1000)
    loop = asyncio.get_running_loop()

    t1, t2 = loop.create_task(call("hi1")), loop.create_task(call("hi2"))
    done, _ = await asyncio.wait([t1, t2], timeout=0.1)
    assert not done
    t3 = loop.create_task(call("hi3"))
    done, _ = await asyncio.wait([t1, t2, t3], timeout=100)
    assert done == {t1, t2, t3}
    assert [t1.result(), t2.result(), t3.result()] == ["hi1", "hi2", "hi3"]

    t1, t2 = loop.create_task(call("hi1")), loop.create_task(call("raise"))
    done, _ = await asyncio.wait([t1, t2], timeout=0.1)
    assert not done
    t3 = loop.create_task(call("hi3"))
    done, _ = await asyncio.wait([t1, t2, t3], timeout=100)
    assert done == {t1, t2, t3}
    for t in (t1, t2, t3):  # one batch: every caller gets its error
        assert isinstance(t.exception(), ZeroDivisionError)


@pytest.mark.asyncio
@pytest.mark.parametrize("mode", ["args", "kwargs", "mixed", "out-of-order"])
@pytest.mark.parametrize("use_class", [True, False])
async def test_batch_args_kwargs(mode, use_class):
    async def body(key1, key2):
        return _pairs(key1, key2)

    func = _batched_pair(use_class, body, max_batch_size=2, batch_wait_timeout_s=1000)
    got = await asyncio.gather(_call_as(func, mode, "hi1", "hi2"), _call_as(func, mode, "hi3", "hi4"))
    assert got == [("hi1", "hi2"), ("hi3", "hi4")]


def _gated_pair(use_class: bool, use_gen: bool, gate: asyncio.Event, ran: list):
    """A batched (key1, key2) method that waits for ``gate`` and notes in ``ran`` that it ran."""
    if use_gen:
        async def stream(key1, key2):
            await gate.wait()
            ran.append(True)
            yield _pairs(key1, key2)

        return _streaming_pair(use_class, stream, max_batch_size=2, batch_wait_timeout_s=1000)

    async def unary(key1, key2):
        await gate.wait()
        ran.append(True)
        return _pairs(key1, key2)

    return _batched_pair(use_class, unary, max_batch_size=2, batch_wait_timeout_s=1000)


def _two_calls(func, use_gen: bool) -> list[asyncio.Task]:
    if use_gen:  # (a stream's first item, as Serve's case reads it)
        return [asyncio.create_task(g.__anext__()) for g in (func("hi1", "hi2"), func("hi3", "hi4"))]
    return [asyncio.create_task(func("hi1", "hi2")), asyncio.create_task(func("hi3", "hi4"))]


@pytest.mark.asyncio
@pytest.mark.parametrize("use_class", [True, False])
@pytest.mark.parametrize("use_gen", [True, False])
async def test_batch_cancellation(use_class, use_gen):
    gate, ran = asyncio.Event(), []
    func = _gated_pair(use_class, use_gen, gate, ran)

    # (two calls fill the batch: it runs, and waits on the gate)
    tasks = _two_calls(func, use_gen)
    done, pending = await asyncio.wait(tasks, timeout=0.01)
    assert not done and len(pending) == 2

    tasks[0].cancel()
    done, pending = await asyncio.wait(tasks, timeout=0.01)
    assert len(done) == 1 and len(pending) == 1

    tasks[1].cancel()
    done, pending = await asyncio.wait(tasks, timeout=0.01)
    assert len(done) == 2 and not pending
    assert not ran  # the batch never got past its gate for them

    gate.set()
    assert await asyncio.gather(*_two_calls(func, use_gen)) == [("hi1", "hi2"), ("hi3", "hi4")]


@pytest.mark.asyncio
@pytest.mark.parametrize("use_class", [True, False])
@pytest.mark.parametrize("use_gen", [True, False])
async def test_cancellation_after_error(use_class, use_gen):
    healthy = asyncio.Event()

    if use_gen:
        async def stream(key1, key2):
            if not healthy.is_set():
                raise ValueError()
            yield _pairs(key1, key2)

        func = _streaming_pair(use_class, stream, max_batch_size=2, batch_wait_timeout_s=1000)
    else:
        async def unary(key1, key2):
            if not healthy.is_set():
                raise ValueError()
            return _pairs(key1, key2)

        func = _batched_pair(use_class, unary, max_batch_size=2, batch_wait_timeout_s=1000)

    for task in _two_calls(func, use_gen):
        task.cancel()
    healthy.set()
    assert await asyncio.gather(*_two_calls(func, use_gen)) == [("hi1", "hi2"), ("hi3", "hi4")]


@pytest.mark.asyncio
@pytest.mark.parametrize("use_class", [True, False])
async def test_batch_setters(use_class):
    async def body(key1, key2):
        return _pairs(key1, key2)

    func = _batched_pair(use_class, body, max_batch_size=2, batch_wait_timeout_s=1000)
    assert (func._get_max_batch_size(), func._get_batch_wait_timeout_s()) == (2, 1000)
    loop = asyncio.get_running_loop()

    tasks = [loop.create_task(func("hi1", "hi2")), loop.create_task(func("hi3", "hi4"))]
    done, pending = await asyncio.wait(tasks, timeout=0.1)
    assert not pending
    assert {t.result() for t in done} == {("hi1", "hi2"), ("hi3", "hi4")}

    func.set_max_batch_size(3)
    func.set_batch_wait_timeout_s(15000)
    assert (func._get_max_batch_size(), func._get_batch_wait_timeout_s()) == (3, 15000)

    tasks = [loop.create_task(func(f"hi{i}", f"hi{i + 1}")) for i in (1, 3, 5)]
    done, pending = await asyncio.wait(tasks, timeout=0.1)
    assert not pending  # three fill the new bound
    assert {t.result() for t in done} == {("hi1", "hi2"), ("hi3", "hi4"), ("hi5", "hi6")}


@pytest.mark.asyncio
async def test_batch_use_earliest_setters():
    @serve.batch(max_batch_size=2, batch_wait_timeout_s=1000)
    async def func(key1, key2):
        return _pairs(key1, key2)

    func.set_max_batch_size(3)  # before any batch began: the first one takes these
    func.set_batch_wait_timeout_s(15000)
    assert (func._get_max_batch_size(), func._get_batch_wait_timeout_s()) == (3, 15000)
    loop = asyncio.get_running_loop()

    tasks = {loop.create_task(func("hi1", "hi2")), loop.create_task(func("hi3", "hi4"))}
    done, pending = await asyncio.wait(tasks, timeout=0.1)
    assert not done and len(pending) == 2  # two of three

    func.set_max_batch_size(1)  # while it fills: it keeps 3 and its long wait
    func.set_batch_wait_timeout_s(0)
    assert (func._get_max_batch_size(), func._get_batch_wait_timeout_s()) == (1, 0)
    done, pending = await asyncio.wait(pending, timeout=0.1)
    assert not done and len(pending) == 2

    pending.add(loop.create_task(func("hi5", "hi6")))
    done, pending = await asyncio.wait(pending, timeout=0.1)
    assert not pending
    assert {t.result() for t in done} == {("hi1", "hi2"), ("hi3", "hi4"), ("hi5", "hi6")}

    # the next batch has the new options: a batch of one, at once
    done, pending = await asyncio.wait([loop.create_task(func("hi1", "hi2"))], timeout=0.1)
    assert len(done) == 1 and not pending
    assert done.pop().result() == ("hi1", "hi2")


@pytest.mark.deadline_s(5)  # (a batch not formed at once waits 1000 s: a hang, not a slow machine)
@pytest.mark.asyncio
@pytest.mark.parametrize("mode", ["args", "kwargs", "mixed", "out-of-order"])
@pytest.mark.parametrize("use_class", [True, False])
@pytest.mark.parametrize("generator_length", [0, 2, 5])
async def test_batch_generator_basic(mode, use_class, generator_length):
    async def body(key1, key2):
        for step in range(generator_length):
            yield [(step, a, b) for a, b in zip(key1, key2)]

    func = _streaming_pair(use_class, body, max_batch_size=2, batch_wait_timeout_s=1000)
    streams = [_call_as(func, mode, "hi1", "hi2"), _call_as(func, mode, "hi3", "hi4")]
    first = [item async for item in streams[0]]  # read one after the other, as Serve's case does
    second = [item async for item in streams[1]]
    assert first == [(step, "hi1", "hi2") for step in range(generator_length)]
    assert second == [(step, "hi3", "hi4") for step in range(generator_length)]


@pytest.mark.deadline_s(5)  # (a batch not formed at once waits 1000 s: a hang, not a slow machine)
@pytest.mark.asyncio
@pytest.mark.parametrize("error_type", ["runtime_error", "mismatched_lengths"])
async def test_batch_generator_exceptions(error_type):
    length, broken_at, message = 5, 2, "Testing error"

    @serve.batch(max_batch_size=2, batch_wait_timeout_s=1000)
    async def func(key1, key2):
        for step in range(length):
            items = [(step, a, b) for a, b in zip(key1, key2)]
            if step == broken_at:
                if error_type == "runtime_error":
                    raise RuntimeError(message)
                yield items * 2  # one item too many per caller
            yield items

    for stream in [func("hi1", "hi2"), func("hi3", "hi4")]:
        for _ in range(broken_at):
            await stream.__anext__()
        if error_type == "runtime_error":
            with pytest.raises(RuntimeError, match=message):
                await stream.__anext__()
        else:
            # Serve raises its RayServeException; rankcore its BatchSizeMismatch (Serve's words)
            with pytest.raises(BatchSizeMismatch, match="doesn't preserve batch size"):
                await stream.__anext__()
        with pytest.raises(StopAsyncIteration):
            await stream.__anext__()


@pytest.mark.deadline_s(5)  # (a batch not formed at once waits 1000 s: a hang, not a slow machine)
@pytest.mark.asyncio
@pytest.mark.parametrize("stop_token", [StopAsyncIteration, StopIteration])
async def test_batch_generator_early_termination(stop_token):
    callers = 4
    next_round = asyncio.Event()

    @serve.batch(max_batch_size=callers, batch_wait_timeout_s=1000)
    async def sequential_terminator(ids: list[int]):
        # round k ends the streams of the first k callers; the others get their id again
        for finished in range(1, callers + 1):
            next_round.clear()
            yield [stop_token] * finished + list(ids[finished:])
            await next_round.wait()

    streams = [sequential_terminator(i) for i in range(callers)]
    for i, stream in enumerate(streams):
        async for item in stream:
            assert item == i
        next_round.set()  # one caller done: the handler may go on


@pytest.mark.deadline_s(5)  # (a batch not formed at once waits 1000 s: a hang, not a slow machine)
@pytest.mark.asyncio
async def test_batch_generator_setters():
    @serve.batch(max_batch_size=2, batch_wait_timeout_s=1000)
    async def yield_three_times(key1, key2):
        for _ in range(3):
            yield _pairs(key1, key2)

    assert (yield_three_times._get_max_batch_size(), yield_three_times._get_batch_wait_timeout_s()) == (2, 1000)
    first_args = [("hi1", "hi2"), ("hi3", "hi4")]
    first = [yield_three_times(*a) for a in first_args]
    for stream, expected in zip(first, first_args):  # two of three items each
        for _ in range(2):
            # (Serve's case compares without asserting; asserted here)
            assert await stream.__anext__() == expected

    yield_three_times.set_max_batch_size(3)  # while that batch streams
    yield_three_times.set_batch_wait_timeout_s(15000)
    assert (yield_three_times._get_max_batch_size(), yield_three_times._get_batch_wait_timeout_s()) == (3, 15000)

    second_args = [("hi1", "hi2"), ("hi3", "hi4"), ("hi5", "hi6")]
    second = [yield_three_times(*a) for a in second_args]
    for stream, expected in zip(first, first_args):
        assert await stream.__anext__() == expected
        with pytest.raises(StopAsyncIteration):
            await stream.__anext__()
    for stream, expected in zip(second, second_args):
        for _ in range(3):
            assert await stream.__anext__() == expected
        with pytest.raises(StopAsyncIteration):
            await stream.__anext__()


def _sized_handler(ran: list, max_batch_size: int, wait_s: float):
    @serve.batch(max_batch_size=max_batch_size, batch_wait_timeout_s=wait_s,
                 batch_size_fn=lambda items: sum(item["size"] for item in items))
    async def batch_handler(requests):
        ran.append([r["value"] for r in requests])
        return [r["value"] for r in requests]

    return batch_handler


@pytest.mark.asyncio
async def test_batch_size_fn_deferred_item_early_break():
    ran: list = []
    handler = _sized_handler(ran, 10, 0.05)
    loop = asyncio.get_running_loop()
    t1 = loop.create_task(handler({"size": 6, "value": "first"}))
    t2 = loop.create_task(handler({"size": 6, "value": "second"}))  # 12 > 10: not with the first
    done, pending = await asyncio.wait([t1, t2], timeout=1.0)
    assert len(done) == 2 and not pending
    assert {t1.result(), t2.result()} == {"first", "second"}
    assert len(ran) == 2, ran


@pytest.mark.asyncio
async def test_batch_size_fn_fail_to_fit():
    handler = _sized_handler([], 10, 0.05)
    loop = asyncio.get_running_loop()
    t1 = loop.create_task(handler({"size": 6, "value": "first"}))
    t2 = loop.create_task(handler({"size": 12, "value": "second"}))  # bigger than any batch
    assert await t1 == "first"
    with pytest.raises(RuntimeError):
        await t2


@pytest.mark.asyncio
async def test_batch_size_fn_multiple_items_fit():
    ran: list = []

    @serve.batch(max_batch_size=20, batch_wait_timeout_s=0.1,
                 batch_size_fn=lambda items: sum(item["size"] for item in items))
    async def batch_handler(requests):
        ran.append([r["value"] for r in requests])
        return [r["value"] for r in requests]

    loop = asyncio.get_running_loop()
    tasks = [loop.create_task(batch_handler({"size": s, "value": v})) for s, v in ((5, "a"), (6, "b"), (7, "c"))]
    done, pending = await asyncio.wait(tasks, timeout=1.0)
    assert len(done) == 3 and not pending
    assert len(ran) == 1 and set(ran[0]) == {"a", "b", "c"}  # 18 <= 20: one batch


@pytest.mark.skip(reason=(
    "differs: Serve logs this warning from its private _BatchQueue, reading max_ongoing_requests from "
    "the replica context's deployment config; rankcore's replica context has no max_ongoing_requests "
    "and rankcore logs no such warning: docs/ray.md, 'Batching', tells the user to set "
    "max_ongoing_requests >= max_batch_size x max_concurrent_batches instead"))
def test_warn_if_max_batch_size_exceeds_max_ongoing_requests():
    pass
