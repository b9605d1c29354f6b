"""The simulator's requests (issue 22): arrivals, service times, and one request machine.

Each deployment with a ``traffic:`` entry (``executors.scenarios.format.TrafficSpec``)
gets requests from its arrival process (``poisson``, ``bursts``, ``daily``, ``file``),
each seeded stream its own (``traffic/<deployment>/...``), so adding traffic changes
no other draw. Every decision about a request is ``rankcore.requests.RequestMachine``'s
(one for the whole run): the simulator feeds it ``Configure`` per deployment, every
pool command the core emits (``SimBackend.pool_changed``), a ``Submit`` at each
arrival, a ``Completed`` once the replica it was dispatched to has served it for a
``service`` draw, and a ``Tick`` at each deadline. It decides nothing itself: a
replica that dies holding requests never answers them, and the machine learns it
from the core's ``PoolChanged(gone)`` (then requeues, retries or fails them). The
only fact the simulator reports on its own is a dispatch to a replica that is no
longer there (dead while the controller was down): ``NotDelivered``, as a handle
gets an error sending to a dead actor.

Streams (``stream:``, ``executors.scenarios.format.StreamSpec``): a share of the
requests is submitted with ``stream=True``, as the Ray handle's
``options(stream=True)`` does. Dispatched, a stream's item times are drawn at once
(``traffic/<deployment>/streams``; which requests stream: ``.../streamed``); it holds
its slot until the last item, then ends with a ``Completed``. A replica that dies
or hangs stops its streams there (``replica_silent``, from the backend): the caller
has the items given until then and, once the core's ``PoolChanged(gone)`` reaches
the machine, a ``Failed("replica_died")`` (a stream is never retried). A draining
replica finishes its streams (``drain_s`` waits for their last item).

Multiplexed models (``models:``, ``executors.scenarios.format.ModelsSpec``): each
request asks for a model (``traffic/<deployment>/models``: Zipf over ``count``
models, or a file's ids in order) and is submitted with it (``Submit.model_id``:
the machine routes it, ``rankcore.requests.route_model``). Each replica
incarnation keeps its models by ``rankcore.requests.ModelCache``: a hit is served
at once; a miss holds its slot and waits for its load (one at a time per
replica, a ``load_s`` draw each from ``traffic/<deployment>/loads``, evicting
least recently used models beyond the bound), then is served as usual; the
requests that missed a model being loaded are served as soon as it is. The
replica reports what it holds (``ModelCache.resident``) ``MODELS_PUSH_S`` after a
change, as Serve's replica pushes every 0.1 s, to the controller
(``ModelsReported``): the core keeps it on the replica's record and tells the
machine (``ReplicaModels``, a pool command); one that stops, dies or hangs loses
its models (its successor starts empty).

Routing and prefix caches (issue 68; ``prefix_cache:``, ``sessions:``, ``callers:``): the machine
asks the deployment's router (``deployments.<d>.request_router``) which candidate takes each
request, and the simulator gives it what a router reads: each request's prompt
(``Submit.prefix``: the next of ``executors.sim.prefixcache.SharedPrefixWorkload.iter_prompts``,
seeded from the run's seed, ``traffic/<deployment>/prompts``), its session key
(``Submit.routing_key``: one of ``sessions``, ``.../sessions``; or with ``prefix_cache.keyed`` its
system prompt's), its caller's node
(``Submit.caller_node``, drawn from ``callers``' weights, ``.../callers``) and that node's zone
(its ``ZONE_LABEL`` label), and where each replica runs (``ReplicaLocated``, when the core's pool
commands say it serves: its node in the core's state, that node's zone). Each replica
incarnation has its own ``KVCache`` (a replacement starts cold; one gone is dropped) and prefills
one request at a time, as a GPU does (and as ``benchmarks/bench_router.py``'s replicas do, with an
``asyncio.Lock``): a request served there joins its replica's prefill line; its prefill begins when
the one before it ended (the cache then says what it held of the prompt), lasts ``ttft_s(prompt,
cached)`` of ``PrefixCacheModel``, and its first token comes at its end; then ``decode_s``, which
overlaps the other requests' prefills and decodes, and it answers. Its time to first token is its
wait before its service, its wait in the line and its ``ttft_s``.

What it measures per deployment (``as_dict``): the machine's counters, what the
callers saw (every Submit ends once: ``lost`` from the simulator's own books),
queue wait (submit -> first dispatch) and end-to-end latency (submit -> answer)
percentiles in virtual seconds, the longest queue, and ``queue_series``: (t,
queued, in flight) every ``metrics_interval_s``, the load an autoscaler reads
(issue 23); with streams, what became of them (``streams_*``), the items the
callers got, time to first item and stream duration percentiles; with models,
the hit rate, loads (a minute) and evictions; with ``prefix_cache``, time to first token
percentiles and the cache's hit share; with a router, sessions, callers or ``prefix_cache``, the
requests each replica served and their imbalance (``routing_figures``).
"""

from __future__ import annotations

import math
import random
from array import array
from bisect import bisect_right
from collections import deque
from collections.abc import Callable, Iterator
from functools import partial
from typing import Any

import rankcore as rc
from rankcore.base.records import maker
from rankcore.requests import (
    BatchDone,
    Batcher,
    Cancel,
    CancelOnReplica,
    Completed,
    Configure,
    Dispatch,
    Enqueue,
    Failed,
    Hit,
    ModelCache,
    NotDelivered,
    Rejected,
    ReplicaLocated,
    RequestAction,
    RequestMachine,
    RunBatch,
    Submit,
    Tick,
    zone_of,
)

from ..scenarios.format import ArrivalSpec, ModelsSpec, StreamSpec, TrafficSpec
from ..scenarios.metrics import imbalance, percentile
from .prefixcache import KVCache, PrefixCacheModel, SharedPrefixWorkload

__all__ = ["SimTraffic", "arrival_times", "segments"]

# records built from values the simulator holds valid (ids it made, its own clock)
_Submit, _Completed, _NotDelivered, _Tick, _Cancel = (maker(c) for c in (Submit, Completed, NotDelivered, Tick,
                                                                         Cancel))
#: the phases in which a replica takes a call (one stopping drains what it holds, takes nothing new)
_TAKES_CALLS = ("running", "reconfiguring")
#: the failures each deployment's metrics keep in full (the rest are counted)
KEEP_FAILURES = 20
#: a deployment's per-request figures (queue wait, latency, a stream's first item and duration) are kept
#: exactly up to this many values each; past it, all of them go into log-spaced buckets (``_Sample``),
#: so that a long run's memory does not grow with its requests
EXACT_VALUES = 100_000
#: the buckets' relative accuracy: a percentile read from them is within this fraction of the exact one
SAMPLE_ACCURACY = 1e-3
#: ``closed`` arrivals: how long a caller whose request failed or was refused waits before its next
CLOSED_RETRY_PAUSE_S = 0.001
#: ``models:``: how long after a change of its models a replica reports them (``ModelsReported``):
#: Serve's replica pushes its multiplexed model ids every 0.1 s
MODELS_PUSH_S = 0.1


class _Sample:
    """Durations (seconds) whose count, maximum and percentiles are read at the end, in bounded memory:
    each value kept exactly (8 bytes, in an ``array``) up to ``EXACT_VALUES``, the percentiles then
    ``percentile``'s (nearest rank) over them; past that, every value counted in a bucket of
    log-spaced bounds instead (DDSketch's: ``(g^(i-1), g^i]``, ``g = (1 + a) / (1 - a)``, read as
    ``2 g^i / (g + 1)``: within ``a = SAMPLE_ACCURACY`` of the value), values <= 0 counted apart
    (a request dispatched at once waits 0.0, read back as 0.0). The maximum stays exact. A week of
    requests keeps a few thousand buckets where a list kept every value (32 bytes each)."""

    __slots__ = ("exact", "buckets", "zeros", "n", "top")

    _GAMMA = (1 + SAMPLE_ACCURACY) / (1 - SAMPLE_ACCURACY)
    _LOG_GAMMA = math.log(_GAMMA)

    def __init__(self) -> None:
        self.exact: array | None = array("d")  # None once the values went into the buckets
        self.buckets: dict[int, int] = {}
        self.zeros = 0
        self.n = 0
        self.top = -math.inf

    def __len__(self) -> int:
        return self.n

    def append(self, v: float) -> None:
        self.n += 1
        if v > self.top:
            self.top = v
        exact = self.exact
        if exact is None:
            self._count(v)
            return
        exact.append(v)
        if len(exact) > EXACT_VALUES:
            self.exact = None
            for x in exact:
                self._count(x)

    def _count(self, v: float) -> None:
        if v <= 0:
            self.zeros += 1
        else:
            i = math.ceil(math.log(v) / self._LOG_GAMMA)
            self.buckets[i] = self.buckets.get(i, 0) + 1

    def max(self) -> float | None:
        return self.top if self.n else None

    def percentile(self, q: float) -> float | None:
        """``percentile(values, q)``: exact while every value is kept, else within ``SAMPLE_ACCURACY``
        (never above the maximum)."""
        if self.exact is not None:
            return percentile(self.exact, q)  # type: ignore[arg-type]
        k = max(0, math.ceil(q / 100 * self.n) - 1)  # (the nearest rank's index, as ``percentile``)
        if k < self.zeros:
            return 0.0
        seen = self.zeros
        for i in sorted(self.buckets):
            seen += self.buckets[i]
            if seen > k:
                return min(2 * self._GAMMA ** i / (self._GAMMA + 1), self.top)
        return self.top  # (not reached: the buckets hold n - zeros values)


def segments(spec: ArrivalSpec) -> Iterator[tuple[float, float, float]]:
    """The arrival rate as consecutive (start, end, requests/s) pieces from t=0, for ever."""
    if spec.kind == "poisson":
        yield 0.0, math.inf, spec.rate
    elif spec.kind == "bursts":
        if spec.offset_s > 0:
            yield 0.0, spec.offset_s, spec.base_rate
        k = 0
        while True:
            s = spec.offset_s + k * spec.period_s
            yield s, s + spec.burst_s, spec.burst_rate
            yield s + spec.burst_s, s + spec.period_s, spec.base_rate
            k += 1
    elif spec.kind == "daily":
        hour, k = spec.day_s / 24.0, 0
        while True:
            for h, rate in enumerate(spec.rates):
                yield k * spec.day_s + h * hour, k * spec.day_s + (h + 1) * hour, rate
            k += 1
    else:
        raise ValueError(f"arrivals of kind {spec.kind!r} come from a list or their callers, not a rate")


def arrival_times(spec: ArrivalSpec, rng: random.Random, start: float, until: float) -> Iterator[float]:
    """Arrival times in ``[start, until]``, increasing: ``closed``'s first requests (one per caller,
    at ``start``: the rest follow their ends, ``SimTraffic``); ``file``'s as listed; the others a Poisson
    process whose rate is constant on each piece of ``segments`` (exact: an exponential gap that
    crosses a piece's end is dropped and drawn again from there, the process being memoryless)."""
    if spec.kind == "closed":
        yield from (start for _ in range(spec.clients))
        return
    if spec.kind == "file":
        yield from (t for t in spec.times if start <= t <= until)
        return
    t = start
    for a, b, rate in segments(spec):
        if a > until:
            return
        if b <= t:
            continue
        t = max(t, a)
        while rate > 0:
            t += rng.expovariate(rate)
            if t >= b:
                break
            if t > until:
                return
            yield t
        t = b


class _Flow:
    """One deployment's traffic: its spec, random streams and what it measured."""

    __slots__ = ("spec", "name", "times", "service", "errors", "n", "waits", "latencies", "series", "max_queued",
                 "ends", "answers", "live", "failures", "failed_by_replica", "double_ends", "streamed", "shapes",
                 "streams", "no_proxy", "proxy_dropped", "batch_costs", "batches", "batch_items", "batch_full",
                 "batch_seconds", "think", "model_of", "loads", "model_requests", "model_hits", "model_loads",
                 "model_evictions", "cores", "threads", "cpu", "prompts", "cache_model", "session_of", "key_of",
                 "caller_of", "routed", "ttft", "prompt_chars", "cached_chars", "served", "caches", "located",
                 "overhead")

    def __init__(self, spec: TrafficSpec, sim: Any) -> None:
        self.spec, self.name = spec, spec.deployment
        self.times = arrival_times(spec.arrivals, sim.stream(f"traffic/{self.name}/arrivals"), spec.start, spec.until)
        self.service = sim.stream(f"traffic/{self.name}/service")
        self.errors = sim.stream(f"traffic/{self.name}/errors")
        self.n = 0  # Submits so far (the next request's number)
        self.waits = _Sample()  # submit -> first dispatch, per request dispatched
        self.latencies = _Sample()  # submit -> answer (ok or an application error)
        self.series: list[tuple[float, int, int]] = []
        self.max_queued = 0
        self.ends = 0  # ends the callers were told: answers, Rejected, Failed
        self.answers = 0
        self.live = 0  # submitted and not ended, as the callers see it
        self.failures: list[dict] = []
        self.failed_by_replica: dict[str, int] = {}
        self.double_ends = 0  # an end for a request already ended (never, if the machine is right)
        self.no_proxy = 0  # requests that found no proxy serving (failed at their callers, never submitted)
        self.proxy_dropped = 0  # requests whose proxy died holding their connection (failed at their callers)
        self.streamed = self.shapes = None
        self.streams = _Streams()
        self.batch_costs = sim.stream(f"traffic/{self.name}/batches") if spec.batch is not None else None
        #: ``host``: the host's cores (each request's own CPU, then its service or its batch), the
        #: host's threads a request passes through (``host.threads``), and the CPU draws
        host = spec.host
        self.cores = _Cpu(sim, host.cores) if host is not None else None
        self.threads = () if self.cores is None or host is None else tuple(_Thread(self.cores) for _ in host.threads)
        self.cpu = sim.stream(f"traffic/{self.name}/cpu") if host is not None else None
        #: ``closed`` arrivals: the callers' think times (each caller sends again after its last ended)
        self.think = sim.stream(f"traffic/{self.name}/think") if spec.arrivals.kind == "closed" else None
        self.batches = self.batch_items = self.batch_full = 0  # batches run, requests in them, closed full
        self.batch_seconds = 0.0  # their service time, summed
        #: ``models:``: each request's model id (None: no models), and the load times
        self.model_of = None if spec.models is None else _model_draw(spec.models,
                                                                     sim.stream(f"traffic/{self.name}/models"))
        self.loads = None if spec.models is None else sim.stream(f"traffic/{self.name}/loads")
        #: requests dispatched with a model, served without a load of their own, loads done, models evicted
        self.model_requests = self.model_hits = self.model_loads = self.model_evictions = 0
        if spec.stream is not None:
            self.streamed = sim.stream(f"traffic/{self.name}/streamed")  # which requests stream
            self.shapes = sim.stream(f"traffic/{self.name}/streams")  # their items and item times
        #: ``prefix_cache``: each request's prompt (the workload's next, seeded from the run's seed) and
        #: the replicas' cache model (None: no prompts, a ``service`` draw each)
        pc = spec.prefix_cache
        self.prompts: Iterator[str] | None = None
        self.cache_model: PrefixCacheModel | None = None
        #: ``prefill_overhead_s``: each prefill's time beyond ``ttft_s`` and its draws (None: none)
        self.overhead: tuple[Any, random.Random] | None = None
        #: ``prefix_cache.keyed``: a prompt -> its session key, its system prompt's (None: not keyed)
        self.key_of: Callable[[str], str] | None = None
        if pc is not None:
            seed = sim.stream(f"traffic/{self.name}/prompts").getrandbits(32)  # (drawn either way)
            if pc.seed is None:
                workload = SharedPrefixWorkload(**dict(pc.workload), seed=seed)
                self.prompts = workload.iter_prompts()
            else:  # (the workload's own seed: the Ray benchmark's prompts, in its order)
                workload = SharedPrefixWorkload(**dict(pc.workload), seed=pc.seed)
                self.prompts = workload.iter_listed()
            if pc.keyed:
                self.key_of = workload.system_keys()
            self.cache_model = PrefixCacheModel(**dict(pc.model))
            if pc.overhead is not None:  # (its own stream, drawn only when given: no other draw moves)
                self.overhead = (pc.overhead, sim.stream(f"traffic/{self.name}/prefills"))
        #: ``sessions`` / ``callers``: each request's session key and its caller's node (None: none)
        self.session_of = None if not spec.sessions else _session_draw(spec.sessions,
                                                                       sim.stream(f"traffic/{self.name}/sessions"))
        self.caller_of = None if not spec.callers else _weighted_draw(spec.callers,
                                                                      sim.stream(f"traffic/{self.name}/callers"))
        #: whether the routing figures are kept (a router, sessions, callers or prefix caches)
        self.routed = bool(pc is not None or spec.sessions or spec.callers or dict(spec.limits).get("request_router"))
        self.ttft = _Sample()  # arrival -> first token, per request answered (``prefix_cache``)
        self.prompt_chars = self.cached_chars = 0  # over every request a replica prefilled
        #: replica id -> requests it served (each replica that joined the pool serving: 0 until it serves)
        self.served: dict[str, int] = {}
        #: replica id -> its incarnation's prefix cache and prefill line; a new incarnation starts cold, one
        #: gone is dropped (with the prefills it was running: they never end)
        self.caches: dict[str, _Prefill] = {}
        #: serving replica id -> (node, zone) the machine was told (``ReplicaLocated``)
        self.located: dict[str, tuple[str, str]] = {}


def _model_draw(spec: ModelsSpec, rng: random.Random) -> Any:
    """The function giving request number n its model id: the file's ids in order (cycled), else a
    draw of ``"m<i>"`` with weight ``1 / (i + 1) ** zipf_s`` (one ``rng`` draw a request)."""
    if spec.ids:
        ids = spec.ids
        return lambda n: ids[n % len(ids)]
    names = [f"m{i}" for i in range(spec.count)]
    cum, total = [], 0.0
    for i in range(spec.count):
        total += 1.0 / (i + 1) ** spec.zipf_s
        cum.append(total)
    last = spec.count - 1
    return lambda n: names[min(bisect_right(cum, rng.random() * total), last)]


def _session_draw(sessions: int, rng: random.Random) -> Any:
    """Each request's session key: one of ``sessions`` (``"s<i>"``), evenly (one ``rng`` draw a request)."""
    return lambda: f"s{rng.randrange(sessions)}"


def _weighted_draw(pairs: tuple[tuple[str, float], ...], rng: random.Random) -> Any:
    """A draw of one of ``pairs``' names by its weight (one ``rng`` draw a request)."""
    names = [n for n, _ in pairs]
    cum, total = [], 0.0
    for _, w in pairs:
        total += w
        cum.append(total)
    last = len(names) - 1
    return lambda: names[min(bisect_right(cum, rng.random() * total), last)]


class _Streams:
    """What became of one deployment's streams, as their callers saw them."""

    __slots__ = ("started", "completed", "app_errors", "failed", "live", "items", "first_item", "duration")

    def __init__(self) -> None:
        self.started = self.completed = self.app_errors = self.failed = self.live = self.items = 0
        self.first_item = _Sample()  # submit -> first item, per stream that gave one
        self.duration = _Sample()  # dispatch -> last item (the slot held), per stream that ended answered

    def as_dict(self) -> dict:
        return {"streams_started": self.started, "streams_completed": self.completed,
                "streams_app_errors": self.app_errors, "streams_failed": self.failed, "streams_in_flight": self.live,
                "stream_items": self.items,
                "first_item_p50": _r(self.first_item.percentile(50)),
                "first_item_p99": _r(self.first_item.percentile(99)),
                "stream_duration_p50": _r(self.duration.percentile(50)),
                "stream_duration_p99": _r(self.duration.percentile(99))}


class _Req:
    __slots__ = ("flow", "t0", "dispatched", "stream", "items_at", "cut", "sent", "proxy", "model", "prompt",
                 "first_token")

    def __init__(self, flow: _Flow, t0: float, stream: bool, proxy: Any = None, model: str = "",
                 prompt: str = "") -> None:
        self.flow, self.t0, self.dispatched, self.stream, self.proxy = flow, t0, False, stream, proxy
        self.model = model  # its multiplexed model id ("" none)
        self.prompt = prompt  # its prompt (``prefix_cache``; "" none)
        self.first_token: float | None = None  # when its first token came out (``prefix_cache``: its prefill's end)
        self.items_at: list[float] | None = None  # a stream's item times (absolute), drawn at its dispatch
        self.cut: float | None = None  # when its replica died or hung: no item after that reaches the caller
        self.sent = t0  # when a replica took the stream (its items were drawn then)

    def given(self, now: float) -> int:
        """The items of this stream its caller has by ``now``."""
        if self.items_at is None:
            return 0
        return bisect_right(self.items_at, now if self.cut is None else min(now, self.cut))


def _item_times(spec: StreamSpec, rng: random.Random, now: float) -> list[float]:
    """A stream's item times from its dispatch at ``now``: ``items`` of them (at least 1), the first
    ``first_item_s`` later (default: an ``item_interval_s`` draw), the others ``item_interval_s`` apart."""
    n = max(1, round(spec.items.sample(rng)))
    t = now + (spec.first_item_s or spec.item_interval_s).sample(rng)
    times = [t]
    for _ in range(n - 1):
        t += spec.item_interval_s.sample(rng)
        times.append(t)
    return times


class _BatchReplica:
    """One replica incarnation's batcher (``traffic.<d>.batch``: the core's rule) and its one
    timer, armed for ``due`` (the batcher's ``next_deadline``) and moved only when that moves."""

    __slots__ = ("epoch", "batcher", "timer", "due", "thread", "cores", "jobs")

    def __init__(self, epoch: int, batcher: Batcher, thread: _Thread | None = None,
                 cores: _Cpu | None = None) -> None:
        self.epoch, self.batcher = epoch, batcher
        self.timer: int | None = None
        self.due: float | None = None
        #: its one interpreter (``host.replica_s``): its requests' own work and its batches, one at a time
        self.thread = thread
        #: the host's cores (``host.cores``) and, without ``replica_s``, their jobs that are its
        #: batches running on threads of their own
        self.cores = cores
        self.jobs: set[int] = set()


class _Cpu:
    """The host's CPU cores (``host.cores``), shared as an operating system shares them: every
    thread with work runs, each at ``min(1, cores / threads running)`` of a core (processor
    sharing), so a thread alone runs at full speed and a crowd slows everyone down together."""

    __slots__ = ("sim", "cores", "jobs", "at", "timer", "_n")

    def __init__(self, sim: Any, cores: int) -> None:
        self.sim, self.cores = sim, cores
        #: job number -> [CPU seconds it still needs, what to call when it has had them]
        self.jobs: dict[int, list] = {}
        self.at = 0.0  # when ``jobs``' remainders were last brought up to date
        self.timer: int | None = None  # the next job's end
        self._n = 0

    def _rate(self) -> float:
        return min(1.0, self.cores / len(self.jobs)) if self.jobs else 1.0

    def _advance(self) -> None:
        now = self.sim.now
        if self.jobs and now > self.at:
            done = (now - self.at) * self._rate()
            for job in self.jobs.values():
                job[0] -= done
        self.at = now

    def _arm(self) -> None:
        if self.timer is not None:
            self.sim.cancel(self.timer)
            self.timer = None
        if self.jobs:
            left = min(job[0] for job in self.jobs.values())
            self.timer = self.sim.schedule(max(0.0, left) / self._rate(), self._end)

    def run(self, work: float, done: Any) -> int:
        """A thread runs ``work`` CPU seconds on the cores, then ``done()`` is called; returns
        the job's number (for ``cut``)."""
        self._advance()
        self._n += 1
        self.jobs[self._n] = [max(0.0, work), done]
        self._arm()
        return self._n

    def cut(self, job: int) -> None:
        """``job``'s process died: it takes no more CPU and ends now (its ``done`` is called at
        this instant, in turn with any other job ending now); one already ended is let be."""
        entry = self.jobs.get(job)
        if entry is None or entry[0] <= 0:
            return
        self._advance()
        entry[0] = 0.0
        self._arm()

    def _end(self) -> None:
        """The jobs whose CPU is all given end (in the order they began): the one the timer was
        set for and any as near done (a float's rounding never leaves it a sliver to run)."""
        self.timer = None
        self._advance()
        least = min(job[0] for job in self.jobs.values())
        ended = [n for n, job in self.jobs.items() if job[0] <= max(least, 0.0) + 1e-12]
        calls = [self.jobs.pop(n)[1] for n in ended]
        self._arm()
        for call in calls:
            call()


class _Thread:
    """One thread of the host (a caller's or a proxy's event loop, a replica's): the CPU work
    given to it runs one item at a time, in order, on the shared cores. An item whose ``live()``
    is false when its turn comes (its request left, its replica died) takes no CPU."""

    __slots__ = ("cpu", "queue", "busy", "job")

    def __init__(self, cpu: _Cpu) -> None:
        self.cpu = cpu
        self.queue: deque[tuple[float, Any, Any]] = deque()
        self.busy = False
        self.job: int | None = None  # the cores' job of the item running

    def run(self, work: float, done: Any, live: Any = None) -> None:
        self.queue.append((work, done, live))
        if not self.busy:
            self._next()

    def _next(self) -> None:
        if self.queue:
            self.busy = True
            work, done, live = self.queue.popleft()
            self.job = self.cpu.run(work if live is None or live() else 0.0, partial(self._after, done))

    def _after(self, done: Any) -> None:
        self.busy, self.job = False, None
        self._next()
        done()

    def cut(self) -> None:
        """Its process died: the item running ends now, without the CPU it still needed (the
        items queued behind it take none when their ``live()`` says their replica is gone)."""
        if self.job is not None:
            self.cpu.cut(self.job)


#: a request of a running batch on the shared cores (``_held``'s ticket: its end is the cores' to say)
_ON_CORES = -1


class _Prefill:
    """One replica incarnation's prefix cache and its prefills, ``PrefixCacheModel.prefills`` at
    once (1: one at a time; 0: no bound) (``prefix_cache``): the requests waiting for one, in the
    order they came, and those whose prefill runs (request id -> its end's ticket)."""

    __slots__ = ("epoch", "cache", "line", "running", "free")

    def __init__(self, epoch: int, cache: KVCache) -> None:
        self.epoch, self.cache = epoch, cache
        self.line: deque[str] = deque()  # request ids waiting for a prefill
        self.running: dict[str, int] = {}  # the requests whose prefill runs -> its end's ticket
        self.free = 0.0  # when the line is guessed to be empty (``drain_s``' guess: one at a time, each a miss)


class _ModelReplica:
    """One replica incarnation's models (``traffic.<d>.models``): the core's cache, the misses
    waiting for their load to begin (in order), the request whose load runs, its next report."""

    __slots__ = ("epoch", "cache", "waiting", "loader", "push")

    def __init__(self, epoch: int, cache: ModelCache) -> None:
        self.epoch, self.cache = epoch, cache
        self.waiting: deque[tuple[str, str]] = deque()  # (request id, model id), their load not begun
        self.loader: str | None = None  # the request whose load runs (None: none, or it left: the load goes on)
        self.push: int | None = None  # the scheduled ``ModelsReported`` report


class SimTraffic:
    """Every deployment's requests in one simulation (module docstring). ``sim``: the
    ``Simulation`` (its clock, seeded streams and backend)."""

    def __init__(self, sim: Any, specs: dict[str, TrafficSpec]) -> None:
        self.sim = sim
        self.machine = RequestMachine()
        self.flows: dict[str, _Flow] = {}
        self._requests: dict[str, _Req] = {}  # live requests, as the callers see them
        #: replica id -> request id -> (when its answer is due, its ticket, ok): what each replica is serving
        self._held: dict[str, dict[str, tuple[float, int, bool]]] = {}
        self._end_t = sim.scenario.duration
        #: the proxies (``executors.sim.proxies``) the requests come in through; None: no ``proxies:``
        self.proxies: Any = None
        #: replica id -> its batcher (batched deployments' replicas, ``traffic.<d>.batch``); a new
        #: incarnation gets a new one
        self._batchers: dict[str, _BatchReplica] = {}
        #: requests of a running batch answered already (``CancelOnReplica``): its end skips them
        self._cut: set[str] = set()
        #: requests in their own CPU's stages before their service or batch (``host``), and the
        #: replica incarnation each is on (a request retried elsewhere is the new one's)
        self._in_cpu: dict[str, tuple[str, int]] = {}
        #: replica id -> (its incarnation, its one interpreter): an unbatched deployment's replicas'
        #: ``host.replica_s`` (a batched one's is its batcher's); a new incarnation gets a new one
        self._interpreters: dict[str, tuple[int, _Thread]] = {}
        #: replica id -> its models (``traffic.<d>.models``); a new incarnation starts empty
        self._models: dict[str, _ModelReplica] = {}
        #: request id -> the replica where it waits for a model's load
        self._load_wait: dict[str, str] = {}
        for name in sorted(specs):
            flow = self.flows[name] = _Flow(specs[name], sim)
            limits: dict[str, Any] = dict(specs[name].limits)
            self.machine.handle(Configure(deployment=name, **limits))
            self._next_arrival(flow)
            sim.schedule(0.0, self._sample, flow, last=True)

    # ------------------------------------------------------------ arrivals
    def _next_arrival(self, flow: _Flow) -> None:
        t = next(flow.times, None)
        if t is not None:
            self.sim.schedule(max(0.0, t - self.sim.now), self._arrive, flow)

    def _again(self, flow: _Flow, refused: bool = False) -> None:
        """``closed`` arrivals: the caller whose request just ended sends its next one after its
        think time, until the arrivals' window ends; after an error no sooner than
        ``CLOSED_RETRY_PAUSE_S`` (a caller refused at once would else send again at the same
        instant for ever)."""
        if flow.think is None:
            return
        think = flow.spec.arrivals.think_s
        delay = 0.0 if think is None else think.sample(flow.think)
        if refused:
            delay = max(delay, CLOSED_RETRY_PAUSE_S)
        if self.sim.now + delay <= flow.spec.until:
            self.sim.schedule(delay, self._arrive, flow)

    def _arrive(self, flow: _Flow) -> None:
        now, spec = self.sim.now, flow.spec
        rid = f"{flow.name}/{flow.n}"
        model = "" if flow.model_of is None else flow.model_of(flow.n)  # (drawn first: one draw per arrival)
        # (each of these too, so request n has the n-th prompt, session and caller whatever became of the others)
        prompt = "" if flow.prompts is None else next(flow.prompts)
        key = flow.key_of(prompt) if flow.key_of is not None else flow.session_of() if flow.session_of else ""
        caller = "" if flow.caller_of is None else flow.caller_of()
        flow.n += 1
        deadline = None if spec.timeout_s is None else now + spec.timeout_s
        stream = flow.streamed is not None and spec.stream is not None and (
            spec.stream.fraction >= 1 or flow.streamed.random() < spec.stream.fraction)
        proxy = None
        if self.proxies is not None:  # (a scenario's ``proxies:``: it comes in through one, or fails at once)
            proxy = self.proxies.route(rid)
            if proxy is None:
                flow.no_proxy += 1
                flow.ends += 1
                self._again(flow, refused=True)
                self._next_arrival(flow)
                return
        self._requests[rid] = _Req(flow, now, stream, proxy, model, prompt)
        flow.live += 1
        actions = self.machine.handle(_Submit(request_id=rid, deployment=flow.name, idempotent=spec.idempotent,
                                              stream=stream, deadline=deadline, model_id=model, routing_key=key,
                                              prefix=prompt, caller_node=caller,
                                              caller_zone=self._zone(caller) if caller else ""))
        if deadline is not None:
            self.sim.schedule(spec.timeout_s, self._tick)
        if not actions:  # queued
            self._peak(flow)
            self.sim.autoscaler.queued(flow.name)  # (scaled to zero: the autoscaler hears of it at once)
        self._carry(actions)
        self._next_arrival(flow)

    # ------------------------------------------------- the machine's actions
    def _carry(self, actions: list[RequestAction]) -> None:
        for a in actions:
            if isinstance(a, Dispatch):
                self._dispatch(a)
            elif isinstance(a, CancelOnReplica):
                self._answer_now(a.request_id, a.replica_id)
            else:
                self._ended(a)

    def _dispatch(self, a: Dispatch) -> None:
        """Hand the request to its replica: served for a ``service`` draw (a stream: until its last
        item), then answered (a hung replica never answers); a replica no longer there never got it
        (``NotDelivered``)."""
        sim = self.sim
        r = sim.backend.replicas.get(a.replica_id)
        if r is None or r.phase not in _TAKES_CALLS:
            self._carry(self.machine.handle(_NotDelivered(request_id=a.request_id, replica_id=a.replica_id)))
            self._peak(self.flows[a.deployment])
            return
        req = self._requests.get(a.request_id)
        flow = self.flows[a.deployment]
        if req is not None and not req.dispatched:
            req.dispatched = True
            flow.waits.append(sim.now - req.t0)
            if req.stream:
                flow.streams.started += 1
                flow.streams.live += 1
        if r.hung:
            return  # a frozen process takes the call and never answers it
        if flow.spec.batch is not None:
            self._batch_enqueue(flow, a.request_id, a.replica_id, r.epoch)
            return
        if flow.cores is not None:  # (its own CPU first, on the host's cores: then it is served)
            self._host_enqueue(flow, a.request_id, a.replica_id, r.epoch)
            return
        self._served(flow, req, a.request_id, a.replica_id, r.epoch)

    def _served(self, flow: _Flow, req: _Req | None, rid: str, replica_id: str, epoch: int) -> None:
        """An unbatched request on its replica, its CPU given (``host``): it waits for its model, or
        is served now."""
        if req is not None and req.model:
            self._model_dispatch(flow, req, rid, replica_id, epoch)
            return
        self._serve(flow, req, rid, replica_id, epoch)

    def _host_enqueue(self, flow: _Flow, rid: str, replica_id: str, epoch: int) -> None:
        """An unbatched deployment's replica took ``rid``: its CPU's stages on the host (``host``),
        then ``_served`` (if it is still there: not answered, retried elsewhere, or its replica gone)."""
        assert flow.cores is not None and flow.spec.host is not None
        held = self._interpreters.get(replica_id)
        if held is None or held[0] != epoch:
            held = self._interpreters[replica_id] = (epoch, _Thread(flow.cores))
        host = flow.spec.host
        guess = self.sim.now + sum(t.quantile(0.5) for t in (host.request_s, *host.threads, host.replica_s)
                                   if t is not None)  # (drain_s's guess while it waits)
        ok = True  # (drawn at its service)
        self._held.setdefault(replica_id, {})[rid] = (guess, None, ok)  # type: ignore[assignment]
        self._in_cpu[rid] = (replica_id, epoch)

        def then() -> None:
            self._held.get(replica_id, {}).pop(rid, None)
            self._served(flow, self._requests.get(rid), rid, replica_id, epoch)
        self._cpu_stage(flow, rid, replica_id, epoch, held[1] if host.replica_s is not None else None, then, 0)

    def _serve(self, flow: _Flow, req: _Req | None, rid: str, replica_id: str, epoch: int) -> None:
        """The replica serves ``rid`` from now: a ``service`` draw (a stream: until its last item),
        then it answers."""
        sim = self.sim
        ok = flow.spec.error_rate <= 0 or flow.errors.random() >= flow.spec.error_rate  # (its own stream)
        if flow.routed:
            flow.served[replica_id] = flow.served.get(replica_id, 0) + 1
        if req is not None and req.stream:
            assert flow.spec.stream is not None and flow.shapes is not None
            req.items_at, req.cut, req.sent = _item_times(flow.spec.stream, flow.shapes, sim.now), None, sim.now
            service = req.items_at[-1] - sim.now
        elif flow.cache_model is not None:  # (its replica's prefill line: its answer's time is known later)
            self._prefill_join(flow, req, rid, replica_id, epoch, ok)
            return
        else:
            assert flow.spec.service is not None  # (parsed: required unless every request streams)
            service = flow.spec.service.sample(flow.service)
        ticket = sim.schedule(service, self._complete, rid, replica_id, epoch, ok)
        self._held.setdefault(replica_id, {})[rid] = (sim.now + service, ticket, ok)

    # ---------------------------------------------------------- prefills
    def _prefill_join(self, flow: _Flow, req: _Req | None, rid: str, replica_id: str, epoch: int,
                      ok: bool) -> None:
        """``prefix_cache``: the replica serves ``rid`` from now (``ok``: it answers, not an application
        error): it joins that replica incarnation's prefill line (``_prefill_next`` begins its prefill
        when one is free: 1 at a time by default)."""
        model = flow.cache_model
        assert model is not None
        pf = flow.caches.get(replica_id)
        if pf is None or pf.epoch != epoch:
            pf = flow.caches[replica_id] = _Prefill(epoch, model.cache())
        pf.free = max(pf.free, self.sim.now) + model.ttft_s(len(req.prompt) if req is not None else 0, 0)
        # (drain_s' guess; no ticket: in the line or its prefill, ``_answer_now`` asks ``_prefill_left``)
        self._held.setdefault(replica_id, {})[rid] = (pf.free + model.decode_s, None, ok)  # type: ignore[assignment]
        pf.line.append(rid)
        self._prefill_next(flow, replica_id, pf)

    def _prefill_next(self, flow: _Flow, replica_id: str, pf: _Prefill) -> None:
        """While a prefill is free there: the first request of the line begins its prefill of what
        its replica's cache did not hold (``ttft_s``); its prompt is cached from now on. A request
        whose caller is gone (its prompt no longer known) costs the prefill of nothing."""
        model = flow.cache_model
        assert model is not None
        held = self._held.get(replica_id, {})
        while pf.line and (model.prefills <= 0 or len(pf.running) < model.prefills):
            rid = pf.line.popleft()
            req = self._requests.get(rid)
            if req is None or not req.prompt:
                ttft = model.ttft_s(0, 0)
            else:
                cached = pf.cache.take(req.prompt)
                flow.prompt_chars += len(req.prompt)
                flow.cached_chars += cached
                ttft = model.ttft_s(len(req.prompt), cached)
            if flow.overhead is not None:
                ttft += flow.overhead[0].sample(flow.overhead[1])
            pf.running[rid] = self.sim.schedule(ttft, self._prefill_done, flow, replica_id, pf, rid)
            entry = held.get(rid)
            if entry is not None:  # (its answer's time is known now)
                held[rid] = (self.sim.now + ttft + model.decode_s, None, entry[2])  # type: ignore[assignment]

    def _prefill_done(self, flow: _Flow, replica_id: str, pf: _Prefill, rid: str) -> None:
        """``rid``'s prefill ended: its first token now, its answer ``decode_s`` later (if its replica,
        that very incarnation, still runs and answers: one that died or froze never does); the next
        prefill begins."""
        if flow.caches.get(replica_id) is not pf or not self._replica_live(replica_id, pf.epoch):
            return
        model = flow.cache_model
        assert model is not None
        del pf.running[rid]
        entry = self._held.get(replica_id, {}).get(rid)
        if entry is not None:
            req = self._requests.get(rid)
            if req is not None:
                req.first_token = self.sim.now
            ticket = self.sim.schedule(model.decode_s, self._complete, rid, replica_id, pf.epoch, entry[2])
            self._held[replica_id][rid] = (self.sim.now + model.decode_s, ticket, entry[2])
        self._prefill_next(flow, replica_id, pf)

    def _prefill_left(self, flow: _Flow, rid: str, replica_id: str) -> None:
        """``rid`` left its replica's prefill line (``CancelOnReplica``): one waiting leaves it, one
        whose prefill runs stops there (as a cancelled task leaves the lock), and the next begins."""
        pf = flow.caches.get(replica_id)
        if pf is None:
            return
        ticket = pf.running.pop(rid, None)
        if ticket is not None:  # (the next begins after whatever else ends at this instant: a request
            self.sim.cancel(ticket)  # that leaves with it never begins its prefill)
            self.sim.schedule(0.0, self._prefill_resume, flow, replica_id, pf)
        elif rid in pf.line:
            pf.line.remove(rid)

    def _prefill_resume(self, flow: _Flow, replica_id: str, pf: _Prefill) -> None:
        """After a prefill was cut: the next begins (on that very replica incarnation, if it still runs)."""
        if flow.caches.get(replica_id) is pf and self._replica_live(replica_id, pf.epoch):
            self._prefill_next(flow, replica_id, pf)

    # ---------------------------------------------------------- models
    def _model_dispatch(self, flow: _Flow, req: _Req, rid: str, replica_id: str, epoch: int) -> None:
        """A replica took ``rid`` for ``req.model``: served at once on a hit; on a miss it holds its
        slot and waits for the model's load (``_next_load``)."""
        mr = self._models.get(replica_id)
        if mr is None or mr.epoch != epoch:
            if mr is not None:
                self._drop_models(replica_id)
            spec = flow.spec.models
            assert spec is not None
            mr = self._models[replica_id] = _ModelReplica(epoch, ModelCache(spec.options))
        flow.model_requests += 1
        if mr.cache.use(req.model) is not None:
            flow.model_hits += 1
            self._serve(flow, req, rid, replica_id, epoch)
            return
        mr.waiting.append((rid, req.model))
        self._load_wait[rid] = replica_id
        guess = self._load_guess(flow, len(mr.waiting) + 1)  # (drain_s' guess while it waits)
        self._held.setdefault(replica_id, {})[rid] = (guess, None, True)  # type: ignore[assignment]
        self._models_changed(flow, replica_id, mr)
        self._next_load(flow, replica_id, mr)

    def _load_guess(self, flow: _Flow, loads: int) -> float:
        """When a request waiting behind ``loads`` loads may be answered (``drain_s``' guess)."""
        spec = flow.spec
        assert spec.models is not None
        service = spec.service.quantile(0.5) if spec.service is not None else 0.0
        return self.sim.now + loads * spec.models.load_s.quantile(0.5) + service

    def _next_load(self, flow: _Flow, replica_id: str, mr: _ModelReplica) -> None:
        """While no load runs: the first miss waiting begins its load (or, its model loaded
        meanwhile, is served)."""
        while mr.cache.loading is None and mr.waiting:
            rid, model = mr.waiting.popleft()
            act = mr.cache.begin(model)
            if isinstance(act, Hit):
                self._load_served(flow, rid, replica_id, mr)
                continue
            flow.model_evictions += len(act.evict)
            assert flow.spec.models is not None and flow.loads is not None
            took = flow.spec.models.load_s.sample(flow.loads)
            mr.loader = rid
            held = self._held.setdefault(replica_id, {})
            if rid in held:
                held[rid] = (self._load_guess(flow, 0) + took, None, True)  # type: ignore[assignment]
            self.sim.schedule(took, self._model_loaded, flow, replica_id, mr.epoch, model)
            if act.evict:
                self._models_changed(flow, replica_id, mr)

    def _load_served(self, flow: _Flow, rid: str, replica_id: str, mr: _ModelReplica) -> None:
        """``rid``'s model is loaded (by its own load or another's): it is served now."""
        flow.model_hits += rid != mr.loader
        del self._load_wait[rid]
        self._serve(flow, self._requests.get(rid), rid, replica_id, mr.epoch)

    def _model_loaded(self, flow: _Flow, replica_id: str, epoch: int, model: str) -> None:
        """A load ended (on a replica still alive): the request that began it and every other
        that missed the model are served, then the next load begins."""
        mr = self._live_models(replica_id, epoch)
        if mr is None:
            return
        mr.cache.loaded(model)
        flow.model_loads += 1
        if mr.loader is not None:
            self._load_served(flow, mr.loader, replica_id, mr)
            mr.loader = None
        for entry in [e for e in mr.waiting if e[1] == model]:
            mr.waiting.remove(entry)
            act = mr.cache.begin(model)
            assert isinstance(act, Hit), act
            self._load_served(flow, entry[0], replica_id, mr)
        self._models_changed(flow, replica_id, mr)
        self._next_load(flow, replica_id, mr)

    def _model_left(self, rid: str) -> None:
        """``rid`` left while it waited for a load (its deadline, its caller gone): a load begun
        for it goes on; one not begun is given up."""
        replica_id = self._load_wait.pop(rid)
        mr = self._models[replica_id]
        if mr.loader == rid:
            mr.loader = None
            return
        entry = next(e for e in mr.waiting if e[0] == rid)
        mr.waiting.remove(entry)
        mr.cache.gave_up(entry[1])
        self._models_changed(self.flows[rid.rsplit("/", 1)[0]], replica_id, mr)

    def _models_changed(self, flow: _Flow, replica_id: str, mr: _ModelReplica) -> None:
        """What the replica holds changed: it reports it ``MODELS_PUSH_S`` later (one report for
        every change until then)."""
        if mr.push is None:
            mr.push = self.sim.schedule(MODELS_PUSH_S, self._push_models, flow, replica_id, mr.epoch)

    def _push_models(self, flow: _Flow, replica_id: str, epoch: int) -> None:
        mr = self._live_models(replica_id, epoch)
        if mr is None:
            return
        mr.push = None
        r = self.sim.backend.replicas[replica_id]  # (live: ``_live_models``)
        r.models = mr.cache.resident()
        # told to the controller, as the Ray replica does: the core keeps it on the replica's record and
        # tells the request machine (``ReplicaModels`` in the step's pool commands: ``pool``); lost while
        # the controller is down (a recovery reads it back from the replica's report)
        self.sim.deliver(rc.ModelsReported(replica_id=replica_id, model_ids=r.models))

    def _live_models(self, replica_id: str, epoch: int) -> _ModelReplica | None:
        """The models of that very incarnation of the replica if it still runs (else dropped)."""
        mr = self._models.get(replica_id)
        if mr is None or mr.epoch != epoch:
            return None
        if not self._replica_live(replica_id, epoch):
            self._drop_models(replica_id)
            return None
        return mr

    def _drop_models(self, replica_id: str) -> None:
        """The replica stopped, died or hung: its models are gone, and the requests waiting there
        for a load are never served (the machine ends them when the core says it is gone)."""
        mr = self._models.pop(replica_id, None)
        if mr is None:
            return
        if mr.push is not None:
            self.sim.cancel(mr.push)
        held = self._held.get(replica_id, {})
        for rid in [*(r for r, _ in mr.waiting), *([mr.loader] if mr.loader is not None else [])]:
            self._load_wait.pop(rid, None)
            held.pop(rid, None)
        if not held:
            self._held.pop(replica_id, None)

    # ---------------------------------------------------------- batches
    def _batch_enqueue(self, flow: _Flow, rid: str, replica_id: str, epoch: int) -> None:
        """A batched deployment's replica took ``rid``: its batcher (the core's rule) says when the
        batch runs; the batch is served for ``fixed_s + n x per_item_s``, then each answers."""
        spec = flow.spec.batch
        assert spec is not None
        b = self._batchers.get(replica_id)
        if b is None or b.epoch != epoch:
            if b is not None and b.timer is not None:
                self.sim.cancel(b.timer)
            host = flow.spec.host
            b = self._batchers[replica_id] = _BatchReplica(epoch, Batcher(spec.options), None if (
                host is None or host.replica_s is None or flow.cores is None) else _Thread(flow.cores), flow.cores)
        ok = flow.spec.error_rate <= 0 or flow.errors.random() >= flow.spec.error_rate
        guess = self.sim.now + spec.options.batch_wait_timeout_s + spec.fixed_s.quantile(0.5) + \
            spec.options.max_batch_size * spec.per_item_s.quantile(0.5)  # (drain_s's guess while it waits)
        self._held.setdefault(replica_id, {})[rid] = (guess, None, ok)  # type: ignore[assignment]
        if flow.cores is not None:  # (its own CPU first, on the host's cores: then it joins a batch)
            self._in_cpu[rid] = (replica_id, epoch)
            self._cpu_stage(flow, rid, replica_id, b.epoch, b.thread, partial(self._batch_join, flow, rid, replica_id, b),
                            0)
            return
        self._batch_actions(flow, replica_id, b, b.batcher.handle(Enqueue(request_id=rid, now=self.sim.now)))

    def _cpu_stage(self, flow: _Flow, rid: str, replica_id: str, epoch: int, thread: _Thread | None, then: Any,
                   stage: int) -> None:
        """``rid``'s own CPU, stage by stage (``host``): ``request_s`` (a thread of its own), each of
        ``threads`` in turn (shared: one request at a time), ``replica_s`` on its replica's
        ``thread``; then ``then()``. One that left meanwhile (answered, retried elsewhere, its
        replica gone) stops, and its work still queued on a thread takes no CPU."""
        host = flow.spec.host
        assert host is not None and flow.cores is not None and flow.cpu is not None
        if not self._cpu_live(rid, replica_id, epoch):
            if self._in_cpu.get(rid) == (replica_id, epoch):  # (not one retried on another replica)
                del self._in_cpu[rid]
            return
        step = partial(self._cpu_stage, flow, rid, replica_id, epoch, thread, then, stage + 1)
        live = partial(self._cpu_live, rid, replica_id, epoch)
        if stage == 0:
            if host.request_s is not None:
                flow.cores.run(host.request_s.sample(flow.cpu), step)
            else:
                step()
            return
        if stage <= len(flow.threads):
            flow.threads[stage - 1].run(host.threads[stage - 1].sample(flow.cpu), step, live)
            return
        if stage == len(flow.threads) + 1 and thread is not None:
            assert host.replica_s is not None
            thread.run(host.replica_s.sample(flow.cpu), step, live)
            return
        del self._in_cpu[rid]
        then()

    def _batch_join(self, flow: _Flow, rid: str, replica_id: str, b: _BatchReplica) -> None:
        """``rid``'s CPU given: it joins its replica's batcher (that very incarnation's, if it runs)."""
        if self._live_batcher(replica_id, b.epoch) is b:
            self._batch_actions(flow, replica_id, b, b.batcher.handle(Enqueue(request_id=rid, now=self.sim.now)))

    def _cpu_live(self, rid: str, replica_id: str, epoch: int) -> bool:
        """Whether ``rid`` is still in its CPU's stages on that very replica incarnation, which
        still runs."""
        return self._in_cpu.get(rid) == (replica_id, epoch) and self._replica_live(replica_id, epoch)

    def _replica_live(self, replica_id: str, epoch: int) -> bool:
        """Whether that very incarnation of the replica still runs and answers (not replaced, not
        dead, not frozen)."""
        r = self.sim.backend.replicas.get(replica_id)
        return r is not None and r.epoch == epoch and not r.hung

    def _batch_actions(self, flow: _Flow, replica_id: str, b: _BatchReplica, actions: list) -> None:
        spec, sim = flow.spec.batch, self.sim
        assert spec is not None and flow.batch_costs is not None
        for act in actions:
            if not isinstance(act, RunBatch):  # (Refused: never, every request is of size 1 <= the bound)
                raise AssertionError(f"the simulator's batcher refused a request: {act!r}")
            rids = tuple(r for part in act.parts for r in part.request_ids)
            service = spec.fixed_s.sample(flow.batch_costs) + act.size * spec.per_item_s.sample(flow.batch_costs)
            flow.batches += 1
            flow.batch_items += act.size
            flow.batch_full += act.reason == "full"
            flow.batch_seconds += service
            if flow.cores is not None:  # (its service is CPU on the host's cores: on its replica's one
                # thread with ``replica_s``, else a thread of its own)
                held = self._held.setdefault(replica_id, {})
                for rid in rids:
                    if rid in held:
                        held[rid] = (sim.now + service, _ON_CORES, held[rid][2])
                done = partial(self._batch_done, flow, replica_id, b.epoch, act.batch_id, rids)
                if b.thread is not None:  # (one whose replica is gone by its turn takes no CPU)
                    b.thread.run(service, done, partial(self._replica_live, replica_id, b.epoch))
                else:
                    jobs = flow.cores.jobs
                    b.jobs = {j for j in b.jobs if j in jobs}  # (those ended: at most max_concurrent_batches)
                    b.jobs.add(flow.cores.run(service if self._replica_live(replica_id, b.epoch) else 0.0, done))
                continue
            self._batch_begin(flow, replica_id, b.epoch, act.batch_id, rids, service)
        self._arm(flow, replica_id, b)

    def _batch_begin(self, flow: _Flow, replica_id: str, epoch: int, batch_id: int, rids: tuple,
                     service: float) -> None:
        """A closed batch runs now, for ``service`` (without ``batch.cores``: its time, not the
        host's CPU)."""
        sim = self.sim
        ticket = sim.schedule(service, self._batch_done, flow, replica_id, epoch, batch_id, rids)
        held = self._held.setdefault(replica_id, {})
        for rid in rids:
            if rid in held:
                held[rid] = (sim.now + service, ticket, held[rid][2])

    def _arm(self, flow: _Flow, replica_id: str, b: _BatchReplica) -> None:
        """Keep ``b``'s timer at its batcher's ``next_deadline`` (moved only when that moved)."""
        due = b.batcher.next_deadline()
        if due == b.due:
            return
        if b.timer is not None:
            self.sim.cancel(b.timer)
        b.due = due
        b.timer = None if due is None else self.sim.schedule(max(0.0, due - self.sim.now), self._batch_tick, flow,
                                                            replica_id, b.epoch)

    def _live_batcher(self, replica_id: str, epoch: int) -> _BatchReplica | None:
        """The batcher of that very incarnation of the replica if it still runs; one whose
        replica died, froze or was replaced is dropped (its batches end with it)."""
        b = self._batchers.get(replica_id)
        if b is None or b.epoch != epoch:
            return None
        if not self._replica_live(replica_id, epoch):
            del self._batchers[replica_id]
            if b.timer is not None:
                self.sim.cancel(b.timer)
            return None
        return b

    def _batch_tick(self, flow: _Flow, replica_id: str, epoch: int) -> None:
        b = self._live_batcher(replica_id, epoch)
        if b is None:
            return
        due, b.timer, b.due = b.due, None, None  # (fired)
        self._batch_actions(flow, replica_id, b, b.batcher.handle(_Tick(now=max(self.sim.now, due or 0.0))))

    def _batch_done(self, flow: _Flow, replica_id: str, epoch: int, batch_id: int, rids: tuple) -> None:
        """A batch was served: each of its requests answers (those still held: one cancelled or
        cut meanwhile has been answered already), then its slot is free."""
        for rid in rids:
            entry = self._held.get(replica_id, {}).get(rid)
            if entry is not None and entry[1] is not None and rid not in self._cut:
                self._complete(rid, replica_id, epoch, entry[2])
            self._cut.discard(rid)
        b = self._live_batcher(replica_id, epoch)
        if b is not None:
            self._batch_actions(flow, replica_id, b, b.batcher.handle(BatchDone(batch_id=batch_id, now=self.sim.now)))

    def _complete(self, rid: str, replica_id: str, epoch: int, ok: bool) -> None:
        """The replica finished serving ``rid``: its answer goes in if that very replica is still
        alive and answering (one that died or froze meanwhile never answers)."""
        held = self._held.get(replica_id)
        if held is not None:
            held.pop(rid, None)
            if not held:
                del self._held[replica_id]
        if not self._replica_live(replica_id, epoch):
            return
        st = self.machine.status(rid)
        if st is None:
            return  # ended so long ago the machine forgot it (its answer would only be counted late)
        answer = st.state in ("dispatched", "running") and st.replica_id == replica_id
        actions = self.machine.handle(_Completed(request_id=rid, ok=ok, replica_id=replica_id))
        if answer:
            req = self._requests.pop(rid)
            if req.proxy is not None:
                req.proxy.carrying.discard(rid)
            req.flow.latencies.append(self.sim.now - req.t0)
            if req.first_token is not None:
                req.flow.ttft.append(req.first_token - req.t0)
            req.flow.answers += 1
            req.flow.ends += 1
            self._again(req.flow)
            req.flow.live -= 1
            if req.stream:  # every item given, then the end (an application error: a last error line)
                self._stream_ended(req, completed=ok, answered=True)
        self._carry(actions)

    def _stream_ended(self, req: _Req, *, completed: bool, answered: bool) -> None:
        """A stream's end as its caller saw it: the items it got, when the first came, how long
        its replica held the slot (answered streams)."""
        st, now = req.flow.streams, self.sim.now
        st.live -= 1
        if answered:
            st.completed += completed
            st.app_errors += not completed
        else:
            st.failed += 1
        given = req.given(now)
        st.items += given
        if given and req.items_at is not None:
            st.first_item.append(req.items_at[0] - req.t0)
            if answered:
                st.duration.append(req.items_at[-1] - req.sent)

    def _answer_now(self, rid: str, replica_id: str) -> None:
        """``CancelOnReplica``: the replica stops serving ``rid`` and answers at once (counted late
        by the machine), which frees its slot."""
        entry = self._held.get(replica_id, {}).get(rid)
        if entry is not None:
            flow = self.flows[rid.rsplit("/", 1)[0]]
            if rid in self._load_wait:  # waiting for a model's load: it leaves the line
                self._model_left(rid)
            elif self._in_cpu.get(rid, ("",))[0] == replica_id:  # in its own CPU's stages there, not in a
                del self._in_cpu[rid]  # batch yet: it never joins one (its queued work takes no CPU)
            elif flow.cache_model is not None and entry[1] is None:  # in its replica's prefill line, or
                self._prefill_left(flow, rid, replica_id)  # its prefill: it leaves (its decode: cancelled below)
            elif flow.spec.batch is not None:  # batched: a waiting one leaves its batch; a running batch
                # runs on for the others (its end, which frees its slot, is never cancelled)
                b = self._batchers.get(replica_id)
                if entry[1] is None:
                    if b is not None:  # (a dead replica's batcher is gone, and its batches with it)
                        b.batcher.handle(Cancel(request_id=rid))
                        self._arm(flow, replica_id, b)
                else:
                    self._cut.add(rid)
            else:
                self.sim.cancel(entry[1])
            r = self.sim.backend.replicas.get(replica_id)
            epoch = r.epoch if r is not None else -1
            ticket = self.sim.schedule(0.0, self._complete, rid, replica_id, epoch, entry[2])
            self._held[replica_id][rid] = (self.sim.now, ticket, entry[2])

    def _ended(self, a: Rejected | Failed) -> None:
        req = self._requests.pop(a.request_id, None)
        if req is None:
            flow = self.flows.get(a.request_id.rsplit("/", 1)[0])
            if flow is not None:
                flow.double_ends += 1
            return
        flow = req.flow
        flow.ends += 1
        self._again(flow, refused=True)
        flow.live -= 1
        if req.proxy is not None:
            req.proxy.carrying.discard(a.request_id)
        if type(a) is Failed:
            rep = a.replica_id or "-"
            flow.failed_by_replica[rep] = flow.failed_by_replica.get(rep, 0) + 1
            if len(flow.failures) < KEEP_FAILURES:
                failure = {"t": round(self.sim.now, 6), "request": a.request_id, "reason": a.reason,
                           "replica": a.replica_id, "detail": a.detail}
                if req.stream:  # the caller has these items, then the error: never a silent truncation
                    failure["items"] = req.given(self.sim.now)
                flow.failures.append(failure)
        if req.stream and req.dispatched:  # (a stream refused before any replica took it never started)
            self._stream_ended(req, completed=False, answered=False)

    def dropped(self, rids: list[str]) -> None:
        """The proxy holding these requests' connections died: each fails at its caller, and
        the machine is told the caller hung up (``Cancel``: its slot is freed at once)."""
        for rid in rids:
            req = self._requests.get(rid)
            if req is None:
                continue
            req.flow.proxy_dropped += 1
            req.proxy = None
            actions = self.machine.handle(_Cancel(request_id=rid))
            if not any(isinstance(a, (Rejected, Failed)) and a.request_id == rid for a in actions):
                del self._requests[rid]  # (dispatched: the replica is told to drop it; the caller is gone)
                req.flow.ends += 1
                self._again(req.flow, refused=True)
                req.flow.live -= 1
                if req.stream and req.dispatched:
                    self._stream_ended(req, completed=False, answered=False)
            self._carry(actions)

    def _tick(self) -> None:
        """A deadline came due: the machine ends what is past it."""
        self._carry(self.machine.handle(_Tick(now=self.sim.now)))

    # ---------------------------------------------------------- the pool
    def pool_changed(self, commands: tuple) -> None:
        """The core's pool commands of one step (``Step.pool``), as they are; then where each replica
        that serves runs (``ReplicaLocated``)."""
        for cmd in commands:
            self._carry(self.machine.handle(cmd))
            flow = self.flows.get(cmd.deployment)
            if flow is not None:
                self._locate(flow, cmd)
                self._peak(flow)  # (a replica gone puts what it held back in the queue)

    def _locate(self, flow: _Flow, cmd: Any) -> None:
        """After a pool command: tell the machine where each replica it made serving runs (its node
        in the core's state, that node's zone; once, and again if that changed), as the Ray handle's
        router does; forget the replicas gone (and their prefix caches)."""
        if type(cmd) is rc.PoolChanged:
            serving: tuple[str, ...] = (cmd.replica_id,) if cmd.membership == "serving" else ()
            if cmd.membership == "gone":
                flow.located.pop(cmd.replica_id, None)
                pf = flow.caches.get(cmd.replica_id)
                if pf is not None and not pf.line and not pf.running:  # (one still prefilling: its
                    del flow.caches[cmd.replica_id]  # process's end drops it, ``replica_silent``)
        elif type(cmd) is rc.PoolReset:  # (after a recovery: every replica not named is gone)
            serving, keep = cmd.serving, {*cmd.serving, *cmd.draining}
            flow.located = {r: p for r, p in flow.located.items() if r in keep}
            flow.caches = {r: c for r, c in flow.caches.items() if r in keep or c.line or c.running}
        else:
            return
        if not serving:
            return
        dep = self.sim.driver.state.deployments.get(flow.name)
        for rid in serving:
            if flow.routed:
                flow.served.setdefault(rid, 0)
            rec = dep.replicas.get(rid) if dep is not None else None
            node = (rec.node_id or "") if rec is not None else ""
            place = (node, self._zone(node))
            if flow.located.get(rid) != place:
                self.machine.handle(ReplicaLocated(deployment=flow.name, replica_id=rid, node_id=place[0],
                                                   zone=place[1]))
                flow.located[rid] = place

    def _zone(self, node_id: str) -> str:
        """``node_id``'s availability zone: its ``ZONE_LABEL`` label in the core's state ("" none)."""
        node = self.sim.driver.state.cluster.nodes.get(node_id)
        return "" if node is None else zone_of(node.labels)

    def replica_silent(self, replica_id: str) -> None:
        """``replica_id`` died, was killed or hung now: the streams it serves give no more items
        (their callers learn the end from the machine, once the core says it is gone)."""
        for rid in self._held.get(replica_id, ()):
            req = self._requests.get(rid)
            if req is not None and req.stream and req.cut is None:
                req.cut = self.sim.now
        if replica_id in self._models:
            self._drop_models(replica_id)
        for f in self.flows.values():  # (its prefix cache goes with its process, and its prefills: never answered)
            pf = f.caches.pop(replica_id, None)
            if pf is not None:
                for ticket in pf.running.values():
                    self.sim.cancel(ticket)
                holding = self._held.get(replica_id, {})
                for rid in (*pf.line, *pf.running):
                    holding.pop(rid, None)
                if not holding:
                    self._held.pop(replica_id, None)
        held = self._interpreters.pop(replica_id, None)
        if held is not None:  # (its process stopped: what it was running on the host's cores takes no more)
            held[1].cut()
        b = self._batchers.get(replica_id)
        if b is not None:  # (its process stopped: what it was running on the host's cores takes no more)
            if b.thread is not None:
                b.thread.cut()
            if b.cores is not None:
                for job in b.jobs:
                    b.cores.cut(job)
            b.jobs.clear()

    def holds(self, replica_id: str) -> bool:
        """Whether ``replica_id`` still holds a request it has neither answered nor dropped."""
        return bool(self._held.get(replica_id))

    def drain_s(self, replica_id: str) -> float:
        """How long ``replica_id`` needs to finish what it is serving (its graceful stop waits)."""
        held = self._held.get(replica_id)
        if not held:
            return 0.0
        return max(0.0, max(due for due, _, _ in held.values()) - self.sim.now)

    # ------------------------------------------------------------ metrics
    def _peak(self, flow: _Flow) -> None:
        q = self.machine.counters(flow.name).in_queue
        if q > flow.max_queued:
            flow.max_queued = q

    def _sample(self, flow: _Flow) -> None:
        c = self.machine.counters(flow.name)
        flow.series.append((round(self.sim.now, 6), c.in_queue, c.in_flight))
        flow.max_queued = max(flow.max_queued, c.in_queue)
        nxt = self.sim.now + flow.spec.metrics_interval_s
        if self._end_t is None or nxt <= self._end_t + 1e-9:
            self.sim.schedule(flow.spec.metrics_interval_s, self._sample, flow, last=True)

    def as_dict(self) -> dict[str, dict]:
        """Per deployment: counters, percentiles (virtual seconds), the longest queue, the series."""
        out = {}
        for name, f in self.flows.items():
            c = self.machine.counters(name)
            out[name] = {
                "submitted": c.submitted, "dispatched": c.dispatched, "answered": c.answered,
                "app_errors": c.app_errors, "retried": c.retried, "failed": c.failed,
                "rejected": dict(c.rejected), "rejected_total": c.rejected_total, "cancelled": c.cancelled,
                "late": c.late, "in_queue": c.in_queue, "in_flight": c.in_flight,
                # the callers' books: every Submit ended once or is still waiting (the machine's own: machine_lost)
                "lost": f.n - f.ends - f.live, "machine_lost": c.lost, "double_ends": f.double_ends,
                "queue_wait_p50": _r(f.waits.percentile(50)), "queue_wait_p99": _r(f.waits.percentile(99)),
                "queue_wait_max": _r(f.waits.max()),
                "latency_p50": _r(f.latencies.percentile(50)), "latency_p99": _r(f.latencies.percentile(99)),
                "max_queued": f.max_queued,
                "failed_no_proxy": f.no_proxy, "failed_proxy_died": f.proxy_dropped,
                "failed_by_replica": dict(sorted(f.failed_by_replica.items())),
                "failures": list(f.failures),
                "queue_series": [list(s) for s in f.series],
            }
            if f.spec.stream is not None:
                out[name].update(f.streams.as_dict())
            span = f.spec.until - f.spec.start
            if f.spec.batch is not None:
                out[name].update({"batches": f.batches, "batch_size_mean": _r(f.batch_items / f.batches)
                                  if f.batches else None, "batches_full": f.batch_full,
                                  "batch_busy_s": _r(f.batch_seconds)})
            if f.spec.batch is not None or f.spec.host is not None:  # (what a loaded host's CPU allows)
                out[name]["throughput_rps"] = _r(f.answers / span) if span > 0 else None
            if f.spec.models is not None:
                out[name].update({"model_requests": f.model_requests, "model_hits": f.model_hits,
                                  "model_hit_rate": _r(f.model_hits / f.model_requests) if f.model_requests else None,
                                  "model_loads": f.model_loads,
                                  "model_loads_per_min": _r(60 * f.model_loads / span) if span > 0 else None,
                                  "model_evictions": f.model_evictions})
            if f.routed:
                out[name].update(routing_figures(f))
        return out


def routing_figures(f: _Flow) -> dict:
    """One deployment's routing figures (docs/scenarios.md, "Routers in the simulator"): with
    ``prefix_cache``, time to first token (arrival -> first token, per request answered: the queue
    wait, its wait in its replica's prefill line, then its prefill) and the cache's hit share
    (characters its replica had cached / prompt characters, over every request a replica
    prefilled); always, the requests each replica served
    (``served_by_replica``: every replica that joined the pool serving, 0 if it served none) and
    their imbalance (``imbalance``: the most one served / the mean per replica; 1 even)."""
    out: dict[str, Any] = {}
    if f.cache_model is not None:
        out.update({"ttft_p50": _r(f.ttft.percentile(50)), "ttft_p99": _r(f.ttft.percentile(99)),
                    "prefix_hit_share": _r(f.cached_chars / f.prompt_chars) if f.prompt_chars else None,
                    "prompt_chars": f.prompt_chars, "cached_chars": f.cached_chars})
    out.update({"replica_imbalance": _r(imbalance(f.served.values())),
                "served_by_replica": dict(sorted(f.served.items()))})
    return out


def _r(v: float | None) -> float | None:
    return None if v is None else round(v, 6)
