"""``@batch``: Ray Serve's ``@serve.batch`` carried out with the core's batcher (issue 39).

The decorated method takes a list (one element per caller) and returns a list of the same
length; each caller calls it with one element and gets its own answer. When a batch closes is
not decided here: ``rankcore.requests.Batcher`` decides (requests and ticks in, "run this batch"
out); this module only keeps the callers' futures, the one timer the batcher asks for
(``next_deadline``) and runs the batches it names, on the event loop the calls arrive on (in a
replica: its user loop).

Serve's names, defaults and behaviour: ``max_batch_size=10``, ``batch_wait_timeout_s=0.01``,
``max_concurrent_batches=1``, ``batch_size_fn=None`` (a wrong type: Serve's ``TypeError``, here
``BatchOptionTypeError``, also an ``InvalidConfig``); a wrong-length answer fails every caller
of that batch (``BatchSizeMismatch``, Serve's words; an answer with no length: ``BatchNotAList``,
also the ``TypeError`` Serve's callers get); an exception of the method fails every caller of
that batch; an ``async def`` generator streams: a call joins its batch when it is made (Serve's:
streams made together form one batch, whatever order they are read in) and returns the caller's
stream; each ``yield`` is a list with one item per caller, ``StopIteration`` (the class) in a
caller's place ends that caller's stream;
batches split by multiplexed model id, each part run in the context (``get_multiplexed_model_id()``,
the request context) of its first caller; ``set_max_batch_size`` / ``set_batch_wait_timeout_s``
(and ``set_max_concurrent_batches``) change the options without a restart, from the next
batch. Where ours differs from Serve (a request that does not fit closes the batch; a
cancelled request leaves its batch; batches keep filling while every slot is busy; a part runs
in its first caller's request context, Serve's in an empty one):
docs/requests.md, "Batching".
"""

from __future__ import annotations

import asyncio
import contextvars
import functools
import inspect
import itertools
import types
import weakref
from collections.abc import Callable
from typing import Any

import attrs

from rankcore import InvalidConfig
from rankcore.requests import (
    BatchDone,
    Batcher,
    BatchOptions,
    Cancel,
    Enqueue,
    Refused,
    RunBatch,
    SetBatchOptions,
    Tick,
)

from ..base import context
from .multiplex import get_multiplexed_model_id

__all__ = ["batch", "BatchSizeMismatch", "BatchNotAList", "BatchOptionTypeError", "BatchOptions"]

#: the instance attribute a method's batchers live under (one per decorated method)
_RUNNERS = "__rankcore_batchers__"
#: the replica's ``ReplicaMetrics`` (``attach_metrics``): Serve's batch metrics, per method
_metrics: list[Any] = []


def attach_metrics(metrics: Any) -> None:
    """The replica actor's metrics: each batch is counted there (Serve's ``serve_batch_*``)."""
    _metrics[:] = [metrics]


class _End:
    """A caller's stream ended (a class, not an ``object()``: a decorated class that travels to
    its replicas by value takes its wrappers' globals with it, and only an importable class
    keeps its identity there)."""


_END = _End()


class _Raise:
    """A stream's error, as its caller raises it (an exception the generator yields as data is an item)."""

    __slots__ = ("exc",)

    def __init__(self, exc: BaseException) -> None:
        self.exc = exc


class BatchSizeMismatch(RuntimeError):
    """The batched method answered a list of another length than the batch (or no list:
    ``BatchNotAList``)."""


class BatchNotAList(BatchSizeMismatch, TypeError):
    """The batched method answered something without a length (an ``int``, ``None``): a
    ``TypeError``, as Serve's callers get (its ``len()`` of the answer raises it), and a
    ``BatchSizeMismatch``, as rankcore's callers catch."""


class BatchOptionTypeError(InvalidConfig, TypeError):
    """A ``@batch`` option of the wrong type (``max_batch_size=1.1``, ``batch_wait_timeout_s="a"``),
    or a ``max_concurrent_batches`` that is not an int >= 1: Serve raises ``TypeError`` for these,
    rankcore ``InvalidConfig`` for every bad option; this is both."""


class _Call:
    __slots__ = ("args", "kwargs", "future", "queue", "done", "context")

    def __init__(self, args: tuple, kwargs: dict, future: asyncio.Future | None, queue: asyncio.Queue | None) -> None:
        self.args, self.kwargs = args, kwargs
        self.future, self.queue = future, queue
        self.done = False  # (a stream's caller ended: its later items are dropped)
        # the caller's context (its request, so its model id): its batch's part runs in a copy of it
        self.context = contextvars.copy_context()


class _Runner:
    """One method's batches on one instance (or one plain function), on one event loop."""

    def __init__(self, fn: Callable, owner: Any, options: BatchOptions, size_fn: Callable | None,
                 stream: bool) -> None:
        self.fn, self.owner, self.size_fn, self.stream = fn, owner, size_fn, stream
        self.batcher = Batcher(options)
        self.calls: dict[str, _Call] = {}
        self.ids = itertools.count()
        self.loop = asyncio.get_running_loop()
        self.timer: asyncio.TimerHandle | None = None
        self.due: float | None = None  # what ``timer`` is armed for
        self.tasks: set[asyncio.Task] = set()
        self.last = 0.0  # the batcher's clock: never behind what it was told (a timer may fire a hair early)
        self.shown_waiting = -1  # (what the queue-length gauge shows: set again only when it changes)

    def apply(self, event: Any) -> None:
        acts = self.batcher.handle(event)
        if _metrics and self.batcher.waiting != self.shown_waiting:
            self.shown_waiting = self.batcher.waiting
            for m in _metrics:
                m.batch_queue(self.fn.__name__, self.shown_waiting)
        for act in acts:
            if isinstance(act, Refused):
                call = self.calls.pop(act.request_id)
                self._fail(call, RuntimeError(act.detail))
            else:
                task = self.loop.create_task(self._run(act))
                self.tasks.add(task)
                task.add_done_callback(self.tasks.discard)
        due = self.batcher.next_deadline()
        if due != self.due:  # (the timer moves only when the deadline does: not on every call)
            if self.timer is not None:
                self.timer.cancel()
            self.due = due
            self.timer = None if due is None else self.loop.call_at(due, self._tick)

    def now(self, at_least: float = 0.0) -> float:
        self.last = max(self.last, self.loop.time(), at_least)
        return self.last

    def _tick(self) -> None:
        due, self.timer, self.due = self.due, None, None  # (fired)
        self.apply(Tick(now=self.now(due or 0.0)))

    def enqueue(self, args: tuple, kwargs: dict, *, stream: bool) -> tuple[str, _Call]:
        rid = f"b{next(self.ids)}"
        size = 1
        if self.size_fn is not None:
            if not args:
                raise TypeError("batch_size_fn needs the batched argument passed by position")
            size = self.size_fn([args[0]])
            if type(size) is not int or size < 1:
                raise TypeError(f"batch_size_fn must return an int >= 1, got {size!r}")
        call = _Call(args, kwargs, None if stream else self.loop.create_future(),
                     asyncio.Queue() if stream else None)
        self.calls[rid] = call
        try:
            self.apply(Enqueue(request_id=rid, now=self.now(), size=size, model_id=get_multiplexed_model_id()))
        except BaseException:
            self.calls.pop(rid, None)
            raise
        return rid, call

    def cancel(self, rid: str) -> None:
        """The caller went away: a request still waiting leaves its batch; one whose batch runs
        has its answer dropped there."""
        call = self.calls.get(rid)
        if call is None:
            return
        call.done = True
        before = self.batcher.waiting
        self.apply(Cancel(request_id=rid))
        if self.batcher.waiting < before:
            del self.calls[rid]

    async def _run(self, act: RunBatch) -> None:
        t0 = self.loop.time()
        try:
            await asyncio.gather(*(self._in_own_context(part.request_ids) for part in act.parts))
        finally:
            for m in _metrics:
                m.batch_ran(self.fn.__name__, (act.closed - act.began) * 1000.0, (self.loop.time() - t0) * 1000.0,
                            act.size, act.max_batch_size)
            self.apply(BatchDone(batch_id=act.batch_id, now=self.now()))

    def _in_own_context(self, rids: tuple[str, ...]) -> Any:
        """``_part(rids)`` as a task in a copy of its first caller's context: this task's (``_run``'s)
        is whoever closed the batch's (its last caller, or the one whose call armed the timer), so
        every part would read that request's model id."""
        first = next((self.calls[r] for r in rids if r in self.calls), None)
        if first is None:  # (every caller of the part went away)
            return self._part(rids)
        return first.context.run(self.loop.create_task, self._part(rids))  # (a task copies the context it starts in)

    async def _part(self, rids: tuple[str, ...]) -> None:
        calls = [self.calls.pop(r) for r in rids if r in self.calls]
        if not calls:
            return
        n, names = len(calls[0].args), sorted(calls[0].kwargs)
        odd = next((c for c in calls if len(c.args) != n or sorted(c.kwargs) != names), None)
        if odd is not None:
            for c in calls:
                self._fail(c, TypeError(
                    f"every call of a batched method must pass the same arguments: one passed {len(odd.args)} "
                    f"positional and keywords {sorted(odd.kwargs)}, another {n} and {names}"))
            return
        args = [[c.args[i] for c in calls] for i in range(n)]
        kwargs = {k: [c.kwargs[k] for c in calls] for k in names}
        head = (self.owner,) if self.owner is not None else ()
        try:
            if self.stream:
                await self._stream(calls, self.fn(*head, *args, **kwargs))
                return
            results = await self.fn(*head, *args, **kwargs)
            _check_length(results, len(calls))
        except Exception as exc:
            for c in calls:
                self._fail(c, exc)
            return
        except BaseException:  # (cancelled: no caller of the batch is left waiting for ever)
            for c in calls:
                self._fail(c, RuntimeError("the batch was cancelled before it answered"))
            raise
        for c, r in zip(calls, results):
            if c.future is not None and not c.future.done():  # (a caller gone meanwhile: its answer is dropped)
                c.future.set_result(r)

    async def _stream(self, calls: list[_Call], agen: Any) -> None:
        try:
            async for items in agen:
                _check_length(items, len(calls))
                for c, item in zip(calls, items):
                    if c.done:
                        continue
                    if item is StopIteration or item is StopAsyncIteration:
                        c.done = True
                        c.queue.put_nowait(_END)  # type: ignore[union-attr]
                    else:
                        c.queue.put_nowait(item)  # type: ignore[union-attr]
        except Exception as exc:
            for c in calls:
                if not c.done:
                    c.done = True
                    c.queue.put_nowait(_Raise(exc))  # type: ignore[union-attr]
            return
        for c in calls:
            if not c.done:
                c.done = True
                c.queue.put_nowait(_END)  # type: ignore[union-attr]

    def _fail(self, call: _Call, exc: BaseException) -> None:
        if call.future is not None:
            if not call.future.done():
                call.future.set_exception(exc)
        elif not call.done:
            call.done = True
            call.queue.put_nowait(_Raise(exc))  # type: ignore[union-attr]


def _joins_at_call() -> bool:
    """Whether a batched stream joins its batch when its method is called (Serve's rule: streams
    made together form one batch, whatever order they are read in), not at its first read: yes,
    unless no event loop runs (the batcher lives on the loop its calls arrive on), or the call is a
    replica's own, outside any request (the replica's ``handle_stream`` calls the method, then reads
    the stream in the request's context: joining there, as it reads at once, gives the batch that
    request's context and model id)."""
    try:
        asyncio.get_running_loop()
    except RuntimeError:
        return False
    return context._current is None or context._serve_request_context.get() is not None


async def _read(joined: tuple[_Runner, str, _Call] | Callable[[], tuple[_Runner, str, _Call]]) -> Any:
    """A caller's stream: the items its batches yield for it (``joined``: its call, in its batch
    already; or how to join, at the first read)."""
    r, rid, call = joined() if callable(joined) else joined
    try:
        while True:
            item = await call.queue.get()  # type: ignore[union-attr]
            if isinstance(item, _End):
                return
            if isinstance(item, _Raise):
                raise item.exc
            yield item
    finally:
        if not call.done:
            r.cancel(rid)
        call.done = True  # (gone: a batch still running gives it no more items)


class _BatchedStream:
    """What ``@batch`` makes of an ``async def`` generator: calling it joins the batch at once and
    returns the caller's stream (an ``async def`` generator wrapper would join at the first read: its
    body runs only then). A method descriptor, as ``staticmethod`` is: its function is ``__func__``
    (the fingerprint reads it as the wrapper of ``__wrapped__``, the user's generator). To ``inspect``
    it is still an ``async def`` generator function, bound or not (its ``__code__`` is the
    generator's): the replica, the controller and the ingresses tell a stream so."""

    __wrapped__: Any  # (the generator function: set by update_wrapper)

    def __init__(self, fn: Callable, call: Callable) -> None:
        functools.update_wrapper(self, fn)
        self.__func__ = call

    @property
    def __code__(self) -> types.CodeType:
        return self.__wrapped__.__code__

    @property
    def __defaults__(self) -> tuple | None:
        return self.__wrapped__.__defaults__

    @property
    def __kwdefaults__(self) -> dict | None:
        return self.__wrapped__.__kwdefaults__

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        return self.__func__(*args, **kwargs)

    def __get__(self, instance: Any, owner: type | None = None) -> Any:
        return self if instance is None else types.MethodType(self, instance)

    def __repr__(self) -> str:
        return f"<batched stream {self.__wrapped__.__qualname__}>"


def _check_length(results: Any, n: int) -> None:
    try:
        got = len(results)
    except TypeError:
        raise BatchNotAList(f"Batched function doesn't preserve batch size. The input list has length {n} but "
                            f"the answer is a {type(results).__name__}, not a list.") from None
    if got != n:
        raise BatchSizeMismatch(f"Batched function doesn't preserve batch size. The input list has length {n} but "
                                f"the returned list has length {got}.")


def _options(base: BatchOptions | None = None, **given: Any) -> BatchOptions:
    """``given`` over ``base`` (the defaults when None), checked first as Serve checks them: an
    integral float ``max_batch_size`` is that int, and a wrong type (or a ``max_concurrent_batches``
    below 1) is a ``BatchOptionTypeError`` (Serve's ``TypeError``, in Serve's words); then by the
    core's rules (``BatchOptions``: ``InvalidConfig`` naming the option, a ``ValueError`` as Serve's
    for a ``max_batch_size`` below 1 or a negative wait)."""
    if "max_batch_size" in given:
        n = given["max_batch_size"]
        if isinstance(n, float) and n.is_integer():
            given["max_batch_size"] = int(n)
        elif not isinstance(n, int):
            raise BatchOptionTypeError(f"max_batch_size must be integer >= 1, got {n!r}")
    if "batch_wait_timeout_s" in given and not isinstance(given["batch_wait_timeout_s"], (int, float)):
        raise BatchOptionTypeError(f"batch_wait_timeout_s must be a float >= 0, got {given['batch_wait_timeout_s']!r}")
    if "max_concurrent_batches" in given:
        n = given["max_concurrent_batches"]
        if not isinstance(n, int) or isinstance(n, bool) or n < 1:
            raise BatchOptionTypeError(f"max_concurrent_batches must be an integer >= 1, got {n!r}")
    return BatchOptions(**given) if base is None else attrs.evolve(base, **given)


def batch(_func: Callable | None = None, /, max_batch_size: int = 10, batch_wait_timeout_s: float = 0.01,
          max_concurrent_batches: int = 1, batch_size_fn: Callable[[list], int] | None = None) -> Any:
    """Batch the calls of an ``async def`` method (or an ``async def`` generator: streams), as Ray
    Serve's ``@serve.batch``: ``@batch`` or ``@batch(max_batch_size=..., ...)``. Bad options
    raise ``rankcore.InvalidConfig`` naming the option, when the class is defined (a wrong type:
    ``BatchOptionTypeError``, also the ``TypeError`` Serve raises; ``max_batch_size=1.0`` is 1,
    as Serve's)."""
    options = _options(max_batch_size=max_batch_size, batch_wait_timeout_s=batch_wait_timeout_s,
                       max_concurrent_batches=max_concurrent_batches)
    if batch_size_fn is not None and not callable(batch_size_fn):
        raise TypeError(f"batch_size_fn must be a callable or None, got {type(batch_size_fn).__name__}")

    def decorate(fn: Callable) -> Any:
        if not callable(fn):
            raise TypeError("@batch can only be used to decorate functions or methods.")
        stream = inspect.isasyncgenfunction(fn)
        if not stream and not inspect.iscoroutinefunction(fn):
            raise TypeError(f"@batch needs an 'async def' method or generator, got {fn.__qualname__}")
        # a method (its first parameter named ``self``, as Serve's docs write them): a batcher per
        # instance; anything else is a plain function, one batcher per event loop
        method = next(iter(inspect.signature(fn).parameters), "") == "self"
        state = {"options": options}
        plain: dict[str, _Runner] = {}  # a plain function's runner, by event loop

        def runner(args: tuple) -> tuple[_Runner, tuple]:
            runners: dict[str, _Runner]
            if method:
                owner, rest = args[0], args[1:]
                runners = owner.__dict__.setdefault(_RUNNERS, {})
                key = fn.__qualname__
            else:
                owner, rest, runners, key = None, args, plain, str(id(asyncio.get_running_loop()))
            r = runners.get(key)
            if r is None or r.loop is not asyncio.get_running_loop():
                r = runners[key] = _Runner(fn, owner, state["options"], batch_size_fn, stream)
                every.add(r)
            return r, rest

        every: weakref.WeakSet[_Runner] = weakref.WeakSet()  # (to tell each of new options)

        if stream:
            @functools.wraps(fn)
            def stream_call(*args: Any, **kwargs: Any) -> Any:
                def join() -> tuple[_Runner, str, _Call]:
                    r, rest = runner(args)
                    rid, call = r.enqueue(rest, kwargs, stream=True)
                    return r, rid, call

                return _read(join() if _joins_at_call() else join)
            wrapper: Any = _BatchedStream(fn, stream_call)
        else:
            @functools.wraps(fn)
            async def call_wrapper(*args: Any, **kwargs: Any) -> Any:
                r, rest = runner(args)
                rid, call = r.enqueue(rest, kwargs, stream=False)
                try:
                    return await call.future  # type: ignore[misc]
                except asyncio.CancelledError:
                    r.cancel(rid)
                    raise
            wrapper = call_wrapper

        def _set(**change: Any) -> None:
            state["options"] = _options(state["options"], **change)  # (checked as at the decorator)
            try:
                here = asyncio.get_running_loop()
            except RuntimeError:
                here = None
            for r in list(every):
                if r.loop is here:  # (at once: the next call already uses them)
                    r.apply(SetBatchOptions(options=state["options"]))
                elif not r.loop.is_closed():  # (on its own loop: the batcher is not thread-safe)
                    r.loop.call_soon_threadsafe(r.apply, SetBatchOptions(options=state["options"]))

        wrapper.set_max_batch_size = lambda n: _set(max_batch_size=n)
        wrapper.set_batch_wait_timeout_s = lambda s: _set(batch_wait_timeout_s=s)
        wrapper.set_max_concurrent_batches = lambda n: _set(max_concurrent_batches=n)
        wrapper._get_max_batch_size = lambda: state["options"].max_batch_size
        wrapper._get_batch_wait_timeout_s = lambda: state["options"].batch_wait_timeout_s
        return wrapper

    return decorate(_func) if _func is not None else decorate
