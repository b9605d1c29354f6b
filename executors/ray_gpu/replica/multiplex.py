"""``@multiplexed`` and ``get_multiplexed_model_id``: Ray Serve's model multiplexing carried out
with the core's rules (issue 39).

A replica serves many models, each loaded on demand by an ``async def`` loader the user marks
``@multiplexed(max_num_models_per_replica=3)``; a request names its model with
``handle.options(multiplexed_model_id=...)``, the HTTP header ``serve_multiplexed_model_id`` or
the gRPC metadata key ``multiplexed_model_id`` (Serve's names), and the handler reads it with
``get_multiplexed_model_id()``.

Nothing is decided here. Which models a replica keeps is ``rankcore.requests.ModelCache``'s rule
(least recently used beyond the bound, one load at a time, as Serve's); which replica gets a
request for a model is the router's ``RequestMachine`` (``rankcore.requests.route_model``). This
module only runs the loads and unloads the cache names (an unloaded model's ``__del__`` is
called, awaited if it is a coroutine, as Serve does; once: Serve's may run twice), and tells the controller what the replica
holds (loaded, and loading: Serve pushes both) each time that changes, so routers send a
model's requests where it is (``Controller.report_models``; routers get it with the pool).
"""

from __future__ import annotations

import asyncio
import functools
import inspect
import logging
import threading
import time
from collections.abc import Callable
from typing import Any

from rankcore import InvalidConfig
from rankcore.requests import MAX_NUM_MODELS_PER_REPLICA, Hit, ModelCache, MultiplexOptions

from ..base.context import _get_serve_request_context

__all__ = ["multiplexed", "get_multiplexed_model_id", "MultiplexOptions", "resident_models"]

log = logging.getLogger(__name__)
#: the instance attribute a class's multiplexers live under (one per decorated method)
_HOLDERS = "__rankcore_multiplexers__"
#: plain-function loaders' multiplexers in this process, by the function's module and qualified name
_plain: dict[str, _Multiplexer] = {}
#: every multiplexer of this process (what the replica reports is their union)
_every: list[_Multiplexer] = []
_lock = threading.Lock()
#: set by the replica actor (``attach``): told the replica's models whenever they change
_sink: list[Callable[[tuple[str, ...]], None]] = []
_metrics: list[Any] = []


def get_multiplexed_model_id() -> str:
    """The multiplexed model id of the request being answered ("" if it names none), as Ray
    Serve's ``serve.get_multiplexed_model_id()``."""
    return _get_serve_request_context().multiplexed_model_id


def resident_models() -> tuple[str, ...]:
    """What this process's multiplexers hold or load, sorted (what the replica reports)."""
    with _lock:
        out: set[str] = set()
        for m in _every:
            out.update(m.cache.resident())
    return tuple(sorted(out))


def attach(sink: Callable[[tuple[str, ...]], None], metrics: Any = None) -> None:
    """The replica actor's hooks: ``sink(models)`` after each change, ``metrics`` (its
    ``ReplicaMetrics``) counts loads, unloads, lookups and load times."""
    _sink[:] = [sink]
    _metrics[:] = [metrics] if metrics is not None else []


def _changed() -> None:
    models = resident_models()
    for m in _metrics:
        m.models_now(models)
    for s in _sink:
        s(models)


#: a loaded model's type -> its subclass with a ``__del__`` that does nothing (``_unload``)
_quiet: dict[type, type] = {}


async def _unload(model: Any) -> None:
    """Serve's cleanup of an evicted model: its ``__del__`` (in a thread if plain, awaited if a
    coroutine), then never again."""
    fn = getattr(model, "__del__", None)
    if fn is None:
        return
    if inspect.iscoroutinefunction(fn):
        await fn()
    else:
        await asyncio.get_running_loop().run_in_executor(None, fn)
    # never again: Python calls ``__del__`` when the object goes, and looks it up on the type (an
    # instance attribute, Serve's way, does not stop that second call), so the object becomes an
    # instance of a subclass whose ``__del__`` does nothing; a type that refuses it keeps its own
    cls = type(model)
    quiet = _quiet.get(cls)
    if quiet is None:
        try:
            quiet = _quiet[cls] = type(cls.__name__, (cls,), {"__del__": lambda self: None,
                                                             "__module__": cls.__module__})
        except TypeError:  # (a final type)
            return
    try:
        model.__class__ = quiet
    except TypeError:  # (a type with another layout, or a builtin)
        pass


class _Multiplexer:
    """One loader's models in one replica (an instance's method, or a plain function)."""

    def __init__(self, fn: Callable, owner: Any, options: MultiplexOptions) -> None:
        self.fn, self.owner = fn, owner
        self.cache = ModelCache(options)
        self.models: dict[str, Any] = {}
        self.lock: asyncio.Lock | None = None
        self.loop: asyncio.AbstractEventLoop | None = None
        self.closed = False  # (the replica is stopping: its models are unloaded, no new load)
        with _lock:
            _every.append(self)

    def _the_lock(self) -> asyncio.Lock:
        loop = asyncio.get_running_loop()
        if self.lock is None or self.loop is not loop:
            self.lock, self.loop = asyncio.Lock(), loop
        return self.lock

    async def get(self, model_id: Any) -> Any:
        if not isinstance(model_id, str):  # (Serve's words)
            raise TypeError("The model ID must be a string.")
        if not model_id:
            raise ValueError("The model ID cannot be empty.")
        if self.closed:
            raise RuntimeError(f"the replica is stopping: its multiplexed models are unloaded (asked for {model_id!r})")
        for m in _metrics:
            m.model_lookup()
        lock, cache = self._the_lock(), self.cache
        if cache.use(model_id) is not None:
            return self.models[model_id]
        _changed()  # (a miss: the model counts as held from now on, so its requests come here)
        begun = False
        try:
            async with lock:  # (one load at a time: Serve's cache lock)
                if self.closed:  # (it stopped while this one waited)
                    raise RuntimeError(f"the replica is stopping: {model_id!r} is not loaded")
                act = cache.begin(model_id)
                begun = True
                if isinstance(act, Hit):
                    return self.models[model_id]
                if act.evict:  # (the evicted are gone from the cache now: routers must stop sending them
                    _changed()  # here for the whole load, not until it ends; Serve pushes after the unload)
                try:
                    # the evicted models leave now, unloaded even if this request is cancelled meanwhile
                    await asyncio.shield(self._unload_all([(gone, self.models.pop(gone, None)) for gone in act.evict]))
                    t0 = time.perf_counter()
                    model = await (self.fn(model_id) if self.owner is None else self.fn(self.owner, model_id))
                except BaseException:
                    cache.failed(model_id)
                    raise
                self.models[model_id] = model
                cache.loaded(model_id)
                for m in _metrics:
                    m.model_loaded((time.perf_counter() - t0) * 1000.0)
                return model
        finally:
            if not begun:  # (cancelled, or refused, while waiting for its turn)
                cache.gave_up(model_id)
            _changed()

    @staticmethod
    async def _unload_all(models: list[tuple[str, Any]]) -> None:
        """Unload ``models`` (id, object) in order; one whose ``__del__`` raises does not stop the
        others (Serve logs it the same way)."""
        for model_id, model in models:
            t0 = time.perf_counter()
            try:
                await _unload(model)
            except Exception:  # (the user's cleanup failed: the model is gone from the cache all the same)
                log.exception("unloading multiplexed model %r failed", model_id)
            for m in _metrics:
                m.model_unloaded((time.perf_counter() - t0) * 1000.0)

    async def shutdown(self) -> None:
        """Unload every model, least recently used first (the replica is stopping): after the load
        under way, if any; no load begins after it."""
        self.closed = True
        async with self._the_lock():
            await self._unload_all([(m, self.models.pop(m, None)) for m in self.cache.loaded_ids()])
            self.cache = ModelCache(self.cache.options)  # (a request still waiting holds the old one)


async def shutdown_all() -> None:
    """Unload every multiplexer's models (the replica is stopping)."""
    with _lock:
        every = list(_every)
    for m in every:
        await m.shutdown()
    _changed()


def _get(fn: Callable, method: bool, options: MultiplexOptions, args: tuple) -> Any:
    """The multiplexer for this call (a module function, so a decorated class sent by value to
    its replica still finds this module's state), and the model id."""
    key = f"{fn.__module__}.{fn.__qualname__}"
    if method:
        owner, rest = args[0], args[1:]
        holders = owner.__dict__.setdefault(_HOLDERS, {})
    else:
        owner, rest, holders = None, args, _plain
    if len(rest) != 1:
        raise TypeError(f"{fn.__qualname__} takes the model id only, got {len(rest)} arguments")
    mux = holders.get(key)
    if mux is None:
        mux = holders[key] = _Multiplexer(fn, owner, options)
    return mux.get(rest[0])


def multiplexed(func: Callable | None = None, max_num_models_per_replica: int = MAX_NUM_MODELS_PER_REPLICA) -> Any:
    """Mark an ``async def`` model loader (a method ``(self, model_id)`` or a function
    ``(model_id)``), as Ray Serve's ``@serve.multiplexed``: calling it returns the model, loaded
    on a miss; beyond ``max_num_models_per_replica`` (-1: no bound) the least recently used
    model is unloaded (its ``__del__`` is called). Serve's checks and errors (``TypeError``,
    ``ValueError``), when the class is defined."""
    if func is not None:
        if not callable(func):
            raise TypeError("The `multiplexed` decorator must be used with a function or method.")
        if not inspect.iscoroutinefunction(func):
            raise TypeError("@serve.multiplexed can only be used to decorate async functions or methods.")
        n = len(inspect.signature(func).parameters)
        if n == 0 or n > 2:
            raise TypeError("@serve.multiplexed can only be used to decorate functions or methods with at least "
                            "one 'model_id: str' argument.")
    if type(max_num_models_per_replica) is not int:  # (Serve's errors; the bound's rule: MultiplexOptions)
        raise TypeError("max_num_models_per_replica must be an integer.")
    try:
        options = MultiplexOptions(max_num_models_per_replica=max_num_models_per_replica)
    except InvalidConfig:
        raise ValueError("max_num_models_per_replica must be positive.") from None

    def decorate(fn: Callable) -> Any:
        if func is None:  # (checked above when given directly)
            return multiplexed(fn, max_num_models_per_replica)
        # a method: its first parameter is ``self`` (Serve's docs write them so)
        method = next(iter(inspect.signature(fn).parameters), "") == "self"

        @functools.wraps(fn)
        async def load(*args: Any) -> Any:
            return await _get(fn, method, options, args)

        load.multiplex_options = options  # type: ignore[attr-defined]
        return load

    return decorate(func) if func is not None else decorate
