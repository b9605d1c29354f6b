"""Scenario files: YAML in, a validated ``Scenario`` out (format: docs/scenarios.md).

Every mistake is reported as one line naming the file, the line and column,
and the field (``ScenarioError``), so the CLI can exit 2 without a traceback.
"""

from __future__ import annotations

import copy
import difflib
import math
import re
from pathlib import Path
from typing import Any, cast

import attrs
import yaml

import rankcore as rc
from rankcore.requests import make_router

from .latency import (
    DEFAULT_BANDWIDTH_GBPS,
    MAX_NUMBER,
    TRANSFER_KEYS,
    Latency,
    Transfer,
    parse_bandwidth,
    parse_latency,
)
from .timeline import (
    ACTIONS,
    Action,
    AddNode,
    CrashController,
    Deploy,
    Orphan,
    PushWeights,
    Scale,
    check_weights_versions,
)

__all__ = [
    "Scenario",
    "ScenarioError",
    "ArrivalSpec",
    "TrafficSpec",
    "StreamSpec",
    "BatchSpec",
    "BATCH_SIM_KEYS",
    "HostSpec",
    "HOST_KEYS",
    "ModelsSpec",
    "MODELS_SIM_KEYS",
    "PrefixCacheSpec",
    "PREFIX_WORKLOAD_KEYS",
    "PREFIX_MODEL_KEYS",
    "ARRIVAL_KINDS",
    "NodeSpec",
    "Provisioning",
    "PROVISIONING_KEYS",
    "DeploymentSpec",
    "Action",
    "Expectation",
    "load_scenario",
    "parse_scenario",
    "read_text",
    "check_yaml_bounds",
    "YamlTooBig",
    "MAX_NODES",
    "apply_overrides",
    "ACTIONS",
    "EXPECTATIONS",
]

EXPECTATIONS = ("world_size", "ranks", "contiguous", "reconfigures", "reassignments", "healthy", "running", "status",
                "packed", "failed", "availability", "full_strength", "non_contiguous", "to_full_strength",
                "below", "asleep", "serving", "weights_version", "evictions", "cold_loads", "warm_loads")
#: the tier counts an expectation may bound (``DeploymentMetrics``' fields of the same name)
TIER_COUNTS = ("evictions", "cold_loads", "warm_loads")
#: contiguity levels by every name a planner may use
LEVEL_NAMES = {"rank": "rank", "global": "rank", "node_rank": "node_rank", "node": "node_rank",
               "local_rank": "local_rank", "local": "local_rank", "any": "any"}
#: place: StartReplica -> on a node; start: running the user's __init__ (and
#: reconfigure); ready: from there to the first passing health check;
#: reconfigure: a ReconfigureReplica call; stop: graceful shutdown; process:
#: starting a replica's worker process, before its __init__ runs (none when it
#: takes an idle spare process: ``spare_processes``); reform: a collective group's re-form, from its new
#: epoch to its first collective (``collective_group``; the default is benchmarks/bench_groups.py's:
#: 0.07-0.09 s from the epoch told to the first right all-reduce, 4 members, gloo on a 2-core host).
LATENCY_KEYS = ("place", "start", "ready", "reconfigure", "stop", "process", "reform")
DEFAULT_LATENCY = {"place": 0.1, "start": 5.0, "ready": 0.0, "reconfigure": 0.5, "stop": 1.0, "process": 0.0,
                   "reform": 0.1}
RECONFIGURE_KINDS = ("none", "plain", "with_rank")
#: nodes a cluster may list (its count, or the sum of its entries' ``count``): each is a record made as
#: the file is read (a count of 10**100 filled memory); 100,000 (~20 MB of records) is a deployment's
#: default ``max_replicas``, and ~800 times the largest example cluster (128 nodes)
MAX_NODES = 100_000


#: what a line break is to ``str.splitlines`` (an error message is one line whatever a key holds)
_BREAKS = str.maketrans({c: repr(c)[1:-1] for c in "\n\r\v\f\x1c\x1d\x1e\x85\u2028\u2029"})


def one_line(text: str) -> str:
    """``text`` with every character ``str.splitlines`` breaks at written as its escape."""
    return text.translate(_BREAKS)


class ScenarioError(Exception):
    """A scenario file is malformed; ``str()`` is one line: file:line:col: field: message."""

    def __init__(self, file: str, line: int | None, col: int | None, field: str, message: str) -> None:
        self.file, self.line, self.col, self.field, self.message = file, line, col, field, message
        where = file if line is None else f"{file}:{line}:{col}"
        super().__init__(one_line(f"{where}: {field}: {message}" if field else f"{where}: {message}"))


# ------------------------------------------------------------------ hostile YAML (issue 40)
#: a YAML file (scenario or config) above this many bytes is refused before it is parsed: the
#: largest example scenario is 5 KB; PyYAML (pure Python, as the loaders read for positions) takes
#: ~3 s and ~10 times the size in memory for each pass over 1 MiB
MAX_YAML_BYTES = 1 << 20
#: collections nested deeper than this are refused: PyYAML's composer recurses once per level
#: (a RecursionError near 300), and no scenario or config needs more than ~10
MAX_YAML_DEPTH = 100
#: values in the document (scalars and collections) with every alias expanded: the example files have
#: at most 281; PyYAML builds a Python object per value (~70 us each here: 50,000 take ~3.5 s), and
#: aliases share one object when loaded but anything that walks the data (the position marks, a
#: deepcopy, a dump into a trace) walks each alias again: a "billion laughs" is 10^9 in 300 bytes
MAX_YAML_NODES = 50_000


class YamlTooBig(ValueError):
    """A YAML document past ``MAX_YAML_BYTES``, ``MAX_YAML_DEPTH`` or ``MAX_YAML_NODES``;
    ``mark``: where (``(line, column)``, 1-based; None: the whole file)."""

    def __init__(self, message: str, mark: tuple[int, int] | None = None) -> None:
        super().__init__(message)
        self.mark = mark


def check_yaml_bounds(text: str, what: str = "the file") -> None:
    """Refuse (``YamlTooBig``) a document (``what``: how a size past the bound names it) above the
    bounds, in one pass over its parse events (no recursion, nothing built: the expanded size is
    counted per anchor). A syntax error ends the pass quietly: the caller's parse reports it, having
    gone no deeper than this pass saw (libyaml's parser reads it first, PyYAML's again where libyaml
    found an error: theirs may differ)."""
    size = len(text) if len(text) * 4 <= MAX_YAML_BYTES else len(text.encode("utf-8", "surrogatepass"))
    if size > MAX_YAML_BYTES:
        raise YamlTooBig(f"{what} is {size:,} bytes, above {MAX_YAML_BYTES:,} (MAX_YAML_BYTES)")
    fast = getattr(yaml, "CSafeLoader", None)  # (libyaml: PyYAML's own scanner takes ~1 s to refuse 10,000 '[')
    if fast is None or not _events_bounded(text, fast):
        _events_bounded(text, yaml.SafeLoader)  # (the parser the loaders use, where libyaml stopped short)


def _events_bounded(text: str, loader: Any) -> bool:
    """``check_yaml_bounds``' pass with ``loader``'s parser: True when it read the whole document."""
    counted = 0  # values so far, every alias expanded
    open_at: list[tuple[int, str | None]] = []  # each open collection: (``counted`` at its start, its anchor)
    anchored: dict[str, int] = {}  # anchor -> its value's expanded size
    try:
        for ev in yaml.parse(text, Loader=loader):
            if isinstance(ev, yaml.CollectionStartEvent):
                if len(open_at) >= MAX_YAML_DEPTH:
                    raise YamlTooBig(f"collections nested deeper than {MAX_YAML_DEPTH} (MAX_YAML_DEPTH)",
                                     _mark(ev))
                open_at.append((counted, ev.anchor))
                counted += 1
            elif isinstance(ev, yaml.CollectionEndEvent):
                start, anchor = open_at.pop()
                if anchor is not None:
                    anchored[anchor] = counted - start
            elif isinstance(ev, yaml.ScalarEvent):
                counted += 1
                if ev.anchor is not None:
                    anchored[ev.anchor] = 1
            elif isinstance(ev, yaml.AliasEvent):
                if any(anchor == ev.anchor for _, anchor in open_at):
                    raise YamlTooBig(f"the alias *{ev.anchor} is inside its own anchor (a value that contains "
                                     f"itself)", _mark(ev))
                counted += anchored.get(ev.anchor or "", 1)
            if counted > MAX_YAML_NODES:
                raise YamlTooBig(f"more than {MAX_YAML_NODES:,} values with every alias expanded "
                                 f"(MAX_YAML_NODES: an alias bomb?)", _mark(ev))
    except yaml.YAMLError:
        return False
    return True


def _construct(node: yaml.Node | None) -> Any:
    """The data of a composed document (what ``yaml.safe_load`` gives, without parsing it again)."""
    if node is None:
        return None
    loader = yaml.SafeLoader("")
    try:
        return loader.construct_document(node)
    finally:
        loader.dispose()


def _mark(ev: yaml.Event) -> tuple[int, int] | None:
    m = ev.start_mark
    return (m.line + 1, m.column + 1) if m is not None else None


@attrs.frozen
class NodeSpec:
    name: str
    gpus: float
    #: GPUs something outside the executor's view holds here: the node reports all its GPUs
    #: to the core, which may aim a replica at it; the placement is then refused (the
    #: simulator: PlacementFailed; Ray, on a scenario-shaped cluster: a placement group the
    #: controller is told not to see holds them, so the replica's group never gets room and
    #: the core's placement timeout gives the node up). A way to ask about a core that believed wrong.
    unreported_gpus: float = 0.0
    #: each GPU's memory in bytes (0: none declared): the node then joins as a *device node*
    #: (``NodeJoined.devices``, one entry per GPU) and tiered models are booked on it by memory
    gpu_memory: int = 0
    #: CPU memory for WARM copies of evicted models, in bytes (``NodeJoined.cpu_cache_bytes``)
    cpu_cache: int = 0
    #: its availability zone ("" none): the node's ``rankcore.requests.ZONE_LABEL`` label, which the
    #: ``locality`` router reads (issue 68)
    zone: str = ""


@attrs.frozen
class Provisioning:
    """``cluster.provisioning``: the simulator's node provider, answering the core's
    ``RequestResources`` as Ray's autoscaler would: nodes of ``gpus`` GPUs for what the
    cluster cannot fit, each joining ``delay_s`` after it was asked for, the cluster never
    above ``max_nodes`` nodes (those listed included)."""

    delay_s: float
    max_nodes: int
    gpus: float


PROVISIONING_KEYS = ("delay_s", "max_nodes", "gpus")


@attrs.frozen
class DeploymentSpec:
    name: str
    replicas: int
    user_config: Any = attrs.field(default=None, hash=False)
    reconfigure: str = "with_rank"
    gpus: float = 1.0
    latency: dict = attrs.field(factory=dict, hash=False)
    max_replicas: int = rc.DEFAULT_MAX_REPLICAS
    #: the placement policy (the scenario's ``placement`` unless the deployment names one)
    placement: str = rc.options.DEFAULTS.placement
    #: the core's start timeout (the scenario's ``faults.start_timeout``)
    start_timeout: float | None = None
    #: static placement on a placement group the scenario's caller made (rankcore.StaticPlacement)
    static: rc.StaticPlacement | None = None
    #: GPUs each bundle of that group holds on its node (the group's, not the replica's)
    bundle_gpus: float = 1.0
    #: gangs (rankcore.placement.gangs): size, pack/spread, restart_gang/restart_replica
    gang_size: int = rc.options.DEFAULTS.gang_size
    gang_placement: str = rc.options.DEFAULTS.gang_placement
    gang_failure: str = rc.options.DEFAULTS.gang_failure
    #: the options a scenario takes as is (``rankcore.base.options.as_is("scenario")``: health checks,
    #: graceful shutdown, placement timeout, restart backoff, spare processes, ...), as given in
    #: the file: the core's defaults for the rest (declared once there)
    options: tuple[tuple[str, Any], ...] = ()
    #: the first this many starts of its replicas fail (their __init__ raises): a crash loop
    start_failures: int = 0
    #: the model's weights in bytes (the core's ``model_bytes`` option, read with its scenario
    #: spelling: bytes or a size): what a load, an OffloadReplica / LoadReplica / UpdateWeights
    #: moves (0: the moves are instant). The core books it on devices (``tier_option``)
    model_bytes: int = 0
    #: its own bandwidths (GB/s) for some moves (``TRANSFER_KEYS``): the scenario's for the rest
    bandwidth: dict = attrs.field(factory=dict, hash=False)

    def applied(self, **changes: Any) -> rc.DeploymentApplied:
        spec = attrs.evolve(self, **changes)
        return rc.DeploymentApplied(
            name=spec.name,
            num_replicas=spec.replicas,
            user_config=spec.user_config,
            has_reconfigure=spec.reconfigure != "none",
            reconfigure_takes_rank=spec.reconfigure == "with_rank",
            max_replicas=spec.max_replicas,
            resources={"GPU": spec.gpus},
            placement=spec.placement,
            start_timeout_s=spec.start_timeout,
            static_placement=spec.static,
            gang_size=spec.gang_size,
            gang_placement=spec.gang_placement,
            gang_failure=spec.gang_failure,
            **spec.tier_option(),
            **dict(spec.options),
        )

    def tier_option(self) -> dict[str, Any]:
        """``model_bytes`` for the core (a static placement or a gang places its GPUs whole: the
        core books them by count, and the bytes only size the weights' moves, ``rankcore.tiers.devices``)."""
        if not self.model_bytes:
            return {}
        return {"model_bytes": self.model_bytes}


#: arrival processes (``traffic.<deployment>.arrivals.kind``) -> (required keys, optional keys); rates
#: are requests per virtual second (executors/sim/traffic.py draws the arrivals)
ARRIVAL_KINDS: dict[str, tuple[tuple[str, ...], tuple[str, ...]]] = {
    "poisson": (("rate",), ()),
    "bursts": (("base_rate", "burst_rate", "burst_s", "period_s"), ("offset_s",)),
    "daily": (("rates",), ("day_s",)),
    "file": (("path",), ()),
    "closed": (("clients",), ("think_s",)),
}
#: the request machine's limits: deployment options (``rankcore.base.options.RequestOptions``, declared once
#: there: ``deployments.<name>.max_ongoing_requests`` ...), refused in a traffic section with a pointer
_LIMITS = tuple(a.name for a in attrs.fields(rc.options.RequestOptions))
_TRAFFIC_KEYS = ("arrivals", "service", "stream", "batch", "models", "host", "prefix_cache", "sessions", "callers",
                 "idempotent", "timeout_s", "error_rate", "from", "until", "metrics_interval_s")
#: ``traffic.<deployment>.host``: the host's CPU a request costs (``HostSpec``); a batched deployment
#: may give them under ``batch`` instead (their first spelling), not in both places
HOST_KEYS = ("cores", "request_s", "threads", "replica_s")
#: ``traffic.<deployment>.batch``: the simulator's own keys (a batch's service time, and the host's),
#: beside ``rankcore.requests.BatchOptions``'s fields (declared once there)
BATCH_SIM_KEYS = ("fixed_s", "per_item_s", *HOST_KEYS)
#: ``traffic.<deployment>.models``: the simulator's own keys (which model each request asks for, how
#: long a load takes), beside ``rankcore.requests.MultiplexOptions``' fields (declared once there)
MODELS_SIM_KEYS = ("count", "zipf_s", "file", "load_s")
#: ``models.load_s``' default: seconds a replica takes to load a model
MODEL_LOAD_S = 0.5
#: ``traffic.<deployment>.prefix_cache`` (issue 68): the shared-prefix workload's keys and the replicas'
#: prefix (KV) cache's, the keyword arguments of ``executors.sim.prefixcache.SharedPrefixWorkload`` (but
#: its seed: the run's) and ``PrefixCacheModel`` (their defaults are those classes'; named here, not
#: imported: the Ray executor reads this module too, and the simulator's modules are not its own)
PREFIX_WORKLOAD_KEYS = ("system_prompts", "zipf_s", "system_chars", "question_chars")
PREFIX_MODEL_KEYS = ("block_chars", "capacity_blocks", "base_s", "prefill_s_per_char", "decode_s", "prefills")
#: ``prefix_cache.seed``: the workload's own seed (``SharedPrefixWorkload.seed``, as the Ray benchmark's):
#: given, the prompts are ``iter_listed()``'s, the benchmark's order; else drawn from the run's seed
PREFIX_SEED_KEY = "seed"
#: ``prefix_cache.prefill_overhead_s``: a latency each prefill takes beyond the model's ``ttft_s`` (the
#: simulator's own: a real replica's cache lookup and its event loop's wake-up), drawn per prefill
PREFIX_OVERHEAD_KEY = "prefill_overhead_s"
#: ``prefix_cache.keyed``: each request's session key (``Submit.routing_key``) is its system prompt's
#: (``system-<k>``: ``SharedPrefixWorkload.system_keys``), as bench_router's ``ours-hash`` keys its calls,
#: so ``consistent_hash`` keeps a system prompt on one replica (not with ``sessions``)
PREFIX_KEYED_KEY = "keyed"
#: ``prefix_cache``'s whole-number keys (the rest are numbers >= 0; those of ``_PREFIX_ZERO_OK`` may be 0,
#: the others are at least 1) and the most characters its system prompts may hold together (they are
#: built at the start of the run)
_PREFIX_COUNTS = ("system_prompts", "system_chars", "question_chars", "block_chars", "capacity_blocks", "prefills",
                  PREFIX_SEED_KEY)
_PREFIX_ZERO_OK = ("question_chars", "prefills", PREFIX_SEED_KEY)
MAX_PREFIX_CHARS = 50_000_000
#: ``traffic.<deployment>.stream``: requests answered as a stream of items (a generator method)
_STREAM_KEYS = ("fraction", "items", "first_item_s", "item_interval_s")


@attrs.frozen
class ArrivalSpec:
    """When requests arrive (``ARRIVAL_KINDS``): ``closed``: ``clients`` callers in a closed loop
    (a benchmark's load generator); ``poisson`` at ``rate``; ``bursts``: ``burst_rate``
    for ``burst_s`` of every ``period_s`` (from ``offset_s``), ``base_rate`` the rest; ``daily``: 24
    hourly ``rates`` over a day of ``day_s`` virtual seconds; ``file``: the ``times`` read from ``path``."""

    kind: str
    rate: float = 0.0
    base_rate: float = 0.0
    burst_rate: float = 0.0
    burst_s: float = 0.0
    period_s: float = 0.0
    offset_s: float = 0.0
    rates: tuple[float, ...] = ()
    day_s: float = 86400.0
    path: str = ""
    times: tuple[float, ...] = attrs.field(default=(), repr=False)
    #: ``closed``: ``clients`` callers, each sending its next request ``think_s`` after its last ended
    clients: int = 0
    think_s: Any = None  # a Latency (None: 0)


@attrs.frozen
class StreamSpec:
    """Requests answered as a stream (``traffic.<deployment>.stream``), as a generator method
    through ``handle.options(stream=True)``: a share ``fraction`` of the requests; each gives
    ``items`` items (a draw rounded to a whole number, at least 1), the first ``first_item_s``
    after its dispatch (default: one ``item_interval_s`` draw), then one every ``item_interval_s``.
    The replica holds one slot until the last item; a stream is never retried."""

    items: Latency
    item_interval_s: Latency
    first_item_s: Latency | None = None
    fraction: float = 1.0


@attrs.frozen
class BatchSpec:
    """Requests served in batches (``traffic.<deployment>.batch``), as a ``@batch`` method: when a
    batch closes is ``rankcore.requests.Batcher``'s rule under ``options``; a batch of n requests
    is served for ``fixed_s + n * per_item_s`` (each a latency: a number or a distribution). With
    a host (``HostSpec``) a batch's service is CPU on its cores too, on its replica's one thread
    with ``replica_s`` (beside nothing else of that replica), else on a thread of its own."""

    options: Any  # rankcore.requests.BatchOptions
    fixed_s: Latency
    per_item_s: Latency


@attrs.frozen
class HostSpec:
    """The host's CPU a deployment's requests cost (``traffic.<deployment>.host``; a batched one's
    may be under ``batch``): ``cores`` of them (one host per deployment, whatever its replicas'
    nodes), shared as an operating system shares them among the threads with work (each runs at
    ``min(1, cores / running)`` of a core). A request's own CPU, once a replica took it and before
    its service (a batched one's: before it joins a batch): ``request_s`` (on a thread of its own:
    work done for each request in parallel), then each of ``threads`` in turn (the host's shared
    threads it passes through, a caller's or a proxy's event loop: one request at a time on each),
    then ``replica_s`` (in its replica's process, which runs one thing at a time: Python's
    interpreter lock). A loaded host's limit, which a service time alone does not show."""

    cores: int
    request_s: Latency | None = None
    threads: tuple[Latency, ...] = ()
    replica_s: Latency | None = None


@attrs.frozen
class ModelsSpec:
    """Multiplexed models (``traffic.<deployment>.models``), as a ``@multiplexed`` loader: each
    request asks for one model, ``"m0"`` .. ``"m{count-1}"`` drawn with weight ``1 / (i + 1) **
    zipf_s`` (or, from a file, ``ids`` in order, cycled); a replica keeps them by
    ``rankcore.requests.ModelCache`` under ``options``, loading one at a time for ``load_s``."""

    options: Any  # rankcore.requests.MultiplexOptions
    count: int
    load_s: Latency
    zipf_s: float = 1.0
    #: ``file``: the model id of each request, in order (cycled); () for the Zipf draw
    ids: tuple[str, ...] = attrs.field(default=(), repr=False)
    path: str = ""


@attrs.frozen
class PrefixCacheSpec:
    """Prompts sharing system prompts, served by replicas with a prefix (KV) cache
    (``traffic.<deployment>.prefix_cache``, issue 68): the keywords given for the simulator's
    ``SharedPrefixWorkload`` (``PREFIX_WORKLOAD_KEYS``) and ``PrefixCacheModel``
    (``PREFIX_MODEL_KEYS``), the rest those classes' defaults. Each request's prompt is the
    workload's next (sent as ``Submit.prefix``); on a replica it waits for the prefill before it
    (``prefills`` at once, 1 by default), then its prefill takes ``ttft_s(prompt, cached)``, the
    replica incarnation's own cache saying what is cached, and its decode ``decode_s``. ``seed``:
    the workload's own (the prompts in ``iter_listed()``'s order, the Ray benchmark's); None: drawn
    from the run's seed. ``overhead``: ``prefill_overhead_s``, what each prefill takes beyond
    ``ttft_s`` (its replica's line waits for it too). ``keyed``: each request's session key is its
    system prompt's (``PREFIX_KEYED_KEY``)."""

    workload: tuple[tuple[str, Any], ...] = ()
    model: tuple[tuple[str, Any], ...] = ()
    seed: int | None = None
    #: each prefill's time beyond ``ttft_s`` (a draw per prefill; None: none)
    overhead: Latency | None = None
    #: each request's session key is its system prompt's (``PREFIX_KEYED_KEY``)
    keyed: bool = False


@attrs.frozen
class TrafficSpec:
    """One deployment's requests in the simulator (docs/scenarios.md, "Traffic and the request
    queue"): arrivals between ``start`` and ``until``, each served for a ``service`` draw on the
    replica it is dispatched to, an application error with probability ``error_rate``; the
    request machine's limits are Ray Serve's (``rankcore.requests.Configure``) unless given."""

    deployment: str
    arrivals: ArrivalSpec
    #: a plain request's service time (None: every request streams, ``stream.fraction`` 1)
    service: Latency | None
    #: the requests answered as a stream (None: none)
    stream: StreamSpec | None = None
    #: served in batches (None: one by one, a ``service`` draw each)
    batch: BatchSpec | None = None
    #: multiplexed models (None: requests carry no model id)
    models: ModelsSpec | None = None
    #: the host's CPU its requests cost (None: none; their service time alone)
    host: HostSpec | None = None
    #: prompts with shared prefixes, replicas with a prefix cache (None: neither; ``service`` draws)
    prefix_cache: PrefixCacheSpec | None = None
    #: each request's ``Submit.routing_key`` one of this many session keys (0: none)
    sessions: int = 0
    #: the callers' nodes and their weights (each request's ``Submit.caller_node``; (): none)
    callers: tuple[tuple[str, float], ...] = ()
    idempotent: bool = False
    timeout_s: float | None = None
    error_rate: float = 0.0
    start: float = 0.0
    until: float = 0.0
    metrics_interval_s: float = 10.0
    #: ``Configure``'s keyword arguments given in the file (the machine's defaults for the rest)
    limits: tuple[tuple[str, int], ...] = ()


@attrs.frozen
class Expectation:
    index: int
    kind: str
    args: Any = attrs.field(hash=False)
    at: float | None = None  # None: at the end
    where: str = ""


@attrs.frozen
class ProxySpec:
    """``proxies:`` (the simulator only): the core runs a proxy per node (``rankcore.ProxyOptions``,
    its fields by their own names: ``proxy_location``, ``min_draining_period_s`` ...), the head
    node (default: the first node), how long a proxy takes to be ready (``start``) and how
    often one dies (``crash_rate_per_proxy_hour``)."""

    options: rc.ProxyOptions
    head: str
    start: Latency
    crash_rate: float  # per second


#: the simulator's own keys of ``proxies:``, beside ``rankcore.ProxyOptions``'s fields
PROXY_SIM_KEYS = ("head", "start", "crash_rate_per_proxy_hour")


@attrs.frozen
class Scenario:
    name: str
    source: str
    seed: int
    duration: float | None
    nodes: tuple[NodeSpec, ...]
    deployments: dict = attrs.field(hash=False)
    latency: dict = attrs.field(hash=False)
    crash_rate_per_replica_hour: float = 0.0
    start_hang_probability: float = 0.0
    #: random node loss: losses per node per second (from node_loss_per_node_day or node_mtbf_hours)
    node_loss_rate: float = 0.0
    #: random node loss for the whole cluster: losses per second whatever the node count (from
    #: node_loss_per_cluster_day), each hitting a node drawn among those up; adds to node_loss_rate
    cluster_node_loss_rate: float = 0.0
    #: how long a lost node takes to come back (the same name and GPUs)
    node_repair: Latency | None = None
    start_timeout: float = 300.0
    placement: str = "spread"
    timeline: tuple[Action, ...] = ()
    expect: tuple[Expectation, ...] = ()
    snapshot_every: int = 0  # 0: the trace writer's own cadence (by size)
    description: str = ""
    raw: dict = attrs.field(factory=dict, hash=False, repr=False)
    #: things that will likely not do what the author meant (printed before a run)
    warnings: tuple[str, ...] = ()
    #: move (``TRANSFER_KEYS``) -> its bandwidth (``bandwidth:``, else ``DEFAULT_BANDWIDTH_GBPS``)
    bandwidth: dict = attrs.field(factory=lambda: {k: Transfer(v) for k, v in DEFAULT_BANDWIDTH_GBPS.items()},
                                  hash=False)
    #: deployment -> its requests (``traffic:``; the simulator only)
    traffic: dict = attrs.field(factory=dict, hash=False)
    #: nodes added on the core's demand (``cluster.provisioning``; the simulator only)
    provisioning: Provisioning | None = None
    #: the proxies the core runs (``proxies:``; the simulator only); None: none modelled
    proxies: ProxySpec | None = None

    def latency_for(self, deployment: str, what: str) -> Latency:
        spec = self.deployments.get(deployment)
        if spec is not None and what in spec.latency:
            return spec.latency[what]
        return self.latency[what]

    def transfer_seconds(self, deployment: str, what: str) -> float:
        """How long ``what`` (``TRANSFER_KEYS``) of one replica's weights takes:
        the deployment's ``model_bytes`` over the bandwidth of that move."""
        spec = self.deployments.get(deployment)
        if spec is None or spec.model_bytes <= 0:
            return 0.0
        return spec.bandwidth.get(what, self.bandwidth[what]).seconds(spec.model_bytes)


# ------------------------------------------------------------------ marks
def _marks(node: yaml.Node, path: tuple, out: dict, keys: dict) -> None:
    """Where each value (``out``) and each mapping key (``keys``) starts."""
    out[path] = (node.start_mark.line + 1, node.start_mark.column + 1)
    if isinstance(node, yaml.MappingNode):
        for k, v in node.value:
            key = k.value
            keys[path + (key,)] = (k.start_mark.line + 1, k.start_mark.column + 1)
            _marks(v, path + (key,), out, keys)
    elif isinstance(node, yaml.SequenceNode):
        for i, v in enumerate(node.value):
            _marks(v, path + (i,), out, keys)


def _field(path: tuple) -> str:
    s = ""
    for p in path:
        s += f"[{p}]" if isinstance(p, int) else (f".{p}" if s else str(p))
    return s


class _Checker:
    def __init__(self, file: str, marks: dict, keys: dict | None = None) -> None:
        self.file, self.marks, self.keys = file, marks, keys or {}
        #: paths a ``--set`` wrote (path -> the argument): their errors name the argument
        self.overridden: dict[tuple, str] = {}
        self.warnings: list[str] = []

    def fail(self, path: tuple, message: str, *, at_key: bool = False) -> ScenarioError:
        """An error about ``path``: at its value, or (``at_key``) at its key;
        at the ``--set`` argument when one wrote it (or a mapping above it)."""
        for n in range(len(path), 0, -1):
            arg = self.overridden.get(tuple(str(p) for p in path[:n]))
            if arg is not None:
                return ScenarioError(arg, None, None, _field(path), message)
        if at_key and path in self.keys:
            line, col = self.keys[path]
            return ScenarioError(self.file, line, col, _field(path), message)
        p = path
        while p and p not in self.marks:
            p = p[:-1]
        line, col = self.marks.get(p, (None, None))
        return ScenarioError(self.file, line, col, _field(path), message)

    def where(self, path: tuple) -> str:
        line, _col = self.marks.get(path, (None, None))
        return f"{self.file}:{line}" if line else self.file

    def mapping(self, value: Any, path: tuple, allowed: tuple | None = None, required: tuple = ()) -> dict:
        if not isinstance(value, dict):
            raise self.fail(path, f"must be a mapping, got {_show(value)}")
        if allowed is not None:
            for k in value:
                if k not in allowed:
                    raise self.fail(path + (k,), f"unknown field{_did_you_mean(k, allowed)} "
                                                 f"(allowed: {', '.join(allowed)})", at_key=True)
        for k in required:
            if k not in value:
                raise self.fail(path, f"missing required field '{k}'")
        return value

    def count(self, value: Any, path: tuple) -> int:
        if isinstance(value, bool) or not isinstance(value, int):
            raise self.fail(path, f"must be a whole number, got {_show(value)}")
        if value < 0:
            raise self.fail(path, f"must not be negative, got {value}")
        return value

    def some(self, value: Any, path: tuple, what: str) -> int:
        """A whole number of ``what`` (models, callers), at least 1."""
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise self.fail(path, f"must be a whole number of {what} >= 1, got {_show(value)}")
        return value

    def number(self, value: Any, path: tuple, *, minimum: float = 0.0, maximum: float | None = None) -> float:
        if isinstance(value, bool) or not isinstance(value, (int, float)) or (isinstance(value, float)
                                                                               and math.isnan(value)):
            raise self.fail(path, f"must be a number, got {_show(value)}")
        if not -MAX_NUMBER < value < MAX_NUMBER:  # (an infinity, or an int no float holds)
            raise self.fail(path, f"must be a finite number below 1e300 in size, got {_show(value):.40}")
        if value < minimum:
            raise self.fail(path, f"must be >= {minimum:g}, got {value:g}")
        if maximum is not None and value > maximum:
            raise self.fail(path, f"must be <= {maximum:g}, got {value:g}")
        return float(value)

    def name(self, value: Any, path: tuple) -> str:
        if not isinstance(value, str) or not value.strip():
            raise self.fail(path, f"must be a non-empty string, got {_show(value)}")
        return value

    def latency(self, value: Any, path: tuple) -> Latency:
        try:
            return parse_latency(value)  # (each of its numbers below MAX_NUMBER)
        except (ValueError, ArithmeticError) as exc:  # (OverflowError: an int no float holds)
            raise self.fail(path, str(exc)) from None

    def bandwidth(self, value: Any, path: tuple) -> Transfer:
        try:
            return parse_bandwidth(value)
        except (ValueError, ArithmeticError) as exc:
            raise self.fail(path, str(exc)) from None


def _did_you_mean(word: Any, choices: tuple) -> str:
    """' (did you mean 'replicas'?)' for a near miss, else ''."""
    close = difflib.get_close_matches(str(word), [str(c) for c in choices], n=1, cutoff=0.6)
    return f" (did you mean {close[0]!r}?)" if close else ""


def _show(value: Any) -> str:
    """A value in an error message: the core's ``rankcore.shown`` at most ``_SHOWN`` characters (an error stays
    a line to read; an int past Python's digit limit inside it is named, not a ValueError)."""
    return "nothing" if value is None else rc.shown(value, _SHOWN)


_SHOWN = 200


# ----------------------------------------------------------------- parsing
def load_scenario(path: str | Path, overrides: dict | None = None) -> Scenario:
    """Read and validate a scenario file (``overrides``: dotted path -> value)."""
    path = Path(path)
    file = str(path)
    try:
        text = read_text(path)
    except OSError as exc:
        raise ScenarioError(file, None, None, "", f"cannot read: {exc.strerror or exc}") from None
    except ValueError as exc:
        raise ScenarioError(file, None, None, "", str(exc)) from None
    return parse_scenario(text, file, overrides)


def read_text(path: str | Path) -> str:
    """A YAML file's text (scenario or config): ``OSError`` when it cannot be read or is above
    ``MAX_YAML_BYTES`` (no more than that is read into memory), ``ValueError`` (one line) when it
    is not UTF-8."""
    with open(path, "rb") as fp:
        data = fp.read(MAX_YAML_BYTES + 1)
    if len(data) > MAX_YAML_BYTES:
        raise OSError(f"the file is above {MAX_YAML_BYTES:,} bytes (MAX_YAML_BYTES)")
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise ValueError(f"not UTF-8 text: byte 0x{data[exc.start]:02x} at offset {exc.start}") from None


def parse_scenario(text: str, file: str = "<scenario>", overrides: dict | None = None) -> Scenario:
    try:
        check_yaml_bounds(text)
        node = yaml.compose(text, Loader=yaml.SafeLoader)
        raw = _construct(node)
    except YamlTooBig as exc:
        line, col = exc.mark or (None, None)
        raise ScenarioError(file, line, col, "", f"refused: {exc}") from None
    except yaml.MarkedYAMLError as exc:
        mark = exc.problem_mark or exc.context_mark
        line, col = (mark.line + 1, mark.column + 1) if mark else (None, None)
        raise ScenarioError(file, line, col, "", f"bad YAML: {exc.problem or exc}") from None
    except yaml.YAMLError as exc:
        raise ScenarioError(file, None, None, "", f"bad YAML: {' '.join(str(exc).split())}") from None
    except (ValueError, RecursionError) as exc:  # (an int of more than 4,300 digits; a depth the bound missed)
        raise ScenarioError(file, None, None, "", f"bad YAML: {type(exc).__name__}: {exc}") from None
    marks: dict = {}
    keys: dict = {}
    if node is not None:
        _marks(node, (), marks, keys)
    c = _Checker(file, marks, keys)
    if raw is None:
        raise c.fail((), "the file is empty")
    if overrides:
        raw = apply_overrides(raw, overrides, c)
        c.overridden = {tuple(k.split(".")): f"--set {k}={_arg(v)}" for k, v in overrides.items()}
    return _scenario(raw, c)


def _arg(value: Any) -> str:
    """A ``--set`` value as it was typed (YAML scalars read back)."""
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, str) and len(value) <= _SHOWN:
        return value
    return rc.shown(value, _SHOWN)  # (an API caller's value may be huge)


def apply_overrides(raw: Any, overrides: dict, c: _Checker | None = None) -> dict:
    """Set dotted paths (``faults.crash_rate_per_replica_hour``) in a raw scenario."""
    raw = copy.deepcopy(raw)
    for dotted, value in overrides.items():
        keys = dotted.split(".")
        cur = raw
        for i, k in enumerate(keys[:-1]):
            if isinstance(cur, list) and k.isdigit() and int(k) < len(cur):
                cur = cur[int(k)]
                continue
            if not isinstance(cur, dict):
                raise ScenarioError(c.file if c else "<scenario>", None, None, dotted,
                                    f"--set cannot go into {'.'.join(keys[:i]) or 'the top level'}: not a mapping")
            cur = cur.setdefault(k, {})
        last = keys[-1]
        if isinstance(cur, list) and last.isdigit() and int(last) < len(cur):
            cur[int(last)] = value
        elif isinstance(cur, dict):
            cur[last] = value
        else:
            raise ScenarioError(c.file if c else "<scenario>", None, None, dotted, "--set target is not a mapping")
    return raw


_TOP = ("name", "description", "seed", "duration", "cluster", "placement", "latency", "bandwidth", "faults",
        "deployments", "timeline", "expect", "trace", "traffic", "proxies")


def _scenario(raw: Any, c: _Checker) -> Scenario:
    top = c.mapping(raw, (), _TOP, required=("cluster", "deployments", "timeline"))
    name = c.name(top.get("name", Path(c.file).stem), ("name",))
    seed = c.count(top.get("seed", 0), ("seed",))
    duration = None if top.get("duration") is None else c.number(top["duration"], ("duration",), minimum=0)
    nodes = _nodes(top["cluster"], c)
    provisioning = _provisioning(top["cluster"], nodes, c)
    placement = top.get("placement", "spread")
    if placement not in rc.placement.POLICIES:
        raise c.fail(("placement",), f"must be one of {', '.join(rc.placement.POLICIES)}, got {_show(placement)}")
    lat_raw = c.mapping(top.get("latency", {}), ("latency",), LATENCY_KEYS)
    parsed_latency = {k: c.latency(v, ("latency", k)) for k, v in lat_raw.items()}
    latency = {k: parse_latency(v) for k, v in DEFAULT_LATENCY.items()}
    latency.update(parsed_latency)
    bw_raw = c.mapping(top.get("bandwidth", {}), ("bandwidth",), TRANSFER_KEYS)
    bandwidth = {k: Transfer(v) for k, v in DEFAULT_BANDWIDTH_GBPS.items()}
    bandwidth.update({k: c.bandwidth(v, ("bandwidth", k)) for k, v in bw_raw.items()})
    faults = c.mapping(top.get("faults", {}), ("faults",),
                       ("crash_rate_per_replica_hour", "start_hang_probability", "start_timeout",
                        "node_loss_per_node_day", "node_mtbf_hours", "node_loss_per_cluster_day", "node_repair"))
    if "node_loss_per_node_day" in faults and "node_mtbf_hours" in faults:
        raise c.fail(("faults", "node_mtbf_hours"), "give node_loss_per_node_day or node_mtbf_hours, not both")
    node_loss = 0.0
    if "node_loss_per_node_day" in faults:
        node_loss = c.number(faults["node_loss_per_node_day"], ("faults", "node_loss_per_node_day")) / 86400.0
    elif "node_mtbf_hours" in faults:
        mtbf = c.number(faults["node_mtbf_hours"], ("faults", "node_mtbf_hours"), minimum=1e-6)
        node_loss = 1.0 / (mtbf * 3600.0)
    cluster_loss = c.number(faults.get("node_loss_per_cluster_day", 0.0), ("faults", "node_loss_per_cluster_day")) / 86400.0
    repair = c.latency(faults.get("node_repair", 600), ("faults", "node_repair"))
    rate = c.number(faults.get("crash_rate_per_replica_hour", 0.0), ("faults", "crash_rate_per_replica_hour"))
    hang = c.number(faults.get("start_hang_probability", 0.0), ("faults", "start_hang_probability"), maximum=1.0)
    timeout = c.number(faults.get("start_timeout", 300.0), ("faults", "start_timeout"), minimum=0.001)
    deployments = _deployments(top["deployments"], c, placement, timeout, {n.name for n in nodes})
    timeline = _timeline(top["timeline"], c, deployments)
    _check_nodes_named(timeline, nodes, c)
    back = check_weights_versions(timeline)
    if back is not None:
        a, message = back
        raise c.fail(("timeline", a.index, a.key, "version" if isinstance(a, PushWeights) else "weights_version"),
                     message)
    expect = _expectations(top.get("expect", []), c, deployments)
    traffic = _traffic(top.get("traffic", {}), c, deployments, duration, tuple(n.name for n in nodes))
    proxies = _proxies(top.get("proxies"), nodes, c)
    trace = c.mapping(top.get("trace", {}), ("trace",), ("snapshot_every",))
    every = c.count(trace.get("snapshot_every", 0), ("trace", "snapshot_every"))
    if every < 1 and "snapshot_every" in trace:
        raise c.fail(("trace", "snapshot_every"), "must be at least 1")
    if rate > 0 and duration is None:
        raise c.fail(("faults", "crash_rate_per_replica_hour"),
                     "a random crash rate needs a 'duration' (the run would never end)")
    if node_loss > 0 and duration is None:
        key = "node_loss_per_node_day" if "node_loss_per_node_day" in faults else "node_mtbf_hours"
        raise c.fail(("faults", key), "a random node loss rate needs a 'duration' (the run would never end)")
    if cluster_loss > 0 and duration is None:
        raise c.fail(("faults", "node_loss_per_cluster_day"),
                     "a random node loss rate needs a 'duration' (the run would never end)")
    for d in deployments.values():
        if duration is None and dict(d.options).get("autoscaling"):
            raise c.fail(("deployments", d.name, "autoscaling"), "autoscaling needs the scenario's 'duration' "
                                                                 "(its metrics are sent for ever: the run would never end)")
    return Scenario(
        name=name, source=c.file, seed=seed, duration=duration, nodes=nodes, deployments=deployments,
        latency=latency, crash_rate_per_replica_hour=rate, start_hang_probability=hang, start_timeout=timeout,
        node_loss_rate=node_loss, cluster_node_loss_rate=cluster_loss,
        node_repair=repair if node_loss > 0 or cluster_loss > 0 else None,
        placement=placement, timeline=timeline, expect=expect, snapshot_every=every,
        description=str(top.get("description", "")), raw=raw, bandwidth=bandwidth, traffic=traffic,
        warnings=tuple(_warnings(nodes, deployments, timeline, latency, timeout, provisioning)),
        provisioning=provisioning, proxies=proxies,
    )


def _field_names(cls: type) -> tuple[str, ...]:
    return tuple(a.name for a in attrs.fields(cls))


def _core_options(cls: type, m: dict, p: tuple, c: _Checker) -> Any:
    """``cls`` (an options record of the core, its fields by their own names) from those keys of
    ``m``; its refusal is the file's error, at the key it names."""
    fields = _field_names(cls)
    try:
        return cls(**{k: v for k, v in m.items() if k in fields})
    except (rc.InvalidConfig, TypeError) as exc:
        bad = next((k for k in fields if k in m and k in str(exc)), None)
        raise c.fail(p + ((bad,) if bad else ()), str(exc)) from None


def _proxies(raw: Any, nodes: tuple[NodeSpec, ...], c: _Checker) -> ProxySpec | None:
    """``proxies: {proxy_location, head, start, crash_rate_per_proxy_hour, ...}`` (``ProxySpec``), or None."""
    if raw is None:
        return None
    p = ("proxies",)
    m = c.mapping(raw, p, _field_names(rc.ProxyOptions) + PROXY_SIM_KEYS)
    options = _core_options(rc.ProxyOptions, m, p, c)
    names = [n.name for n in nodes]
    head = m.get("head", names[0] if names else None)
    if head not in names:
        raise c.fail(p + ("head",), f"unknown node {_show(head)} (the cluster has: {', '.join(names) or 'none'})")
    rate = c.number(m.get("crash_rate_per_proxy_hour", 0.0), p + ("crash_rate_per_proxy_hour",)) / 3600.0
    start = c.latency(m.get("start", 2.0), p + ("start",))
    return ProxySpec(options=options, head=head, start=start, crash_rate=rate)


def _check_nodes_named(timeline: tuple[Action, ...], nodes: tuple[NodeSpec, ...], c: _Checker) -> None:
    """``lose_node`` (and ``place_bundles``) name nodes of the cluster or added by the timeline."""
    known = {n.name for n in nodes} | {a.node for a in timeline if isinstance(a, AddNode)}
    for a in timeline:
        for sub, name in a.nodes_needed():
            if name not in known:
                raise c.fail(("timeline", a.index, a.key, *sub),
                             f"unknown node {name!r}{_did_you_mean(name, tuple(sorted(known)))} (the cluster has: "
                             f"{', '.join(sorted(known))}; add_node adds one)")


#: the start-up latency quantile compared with the start timeout
_SLOW_START_Q = 0.99


def _warnings(nodes: tuple[NodeSpec, ...], deployments: dict, timeline: tuple[Action, ...], latency: dict,
              timeout: float, provisioning: Provisioning | None = None) -> list[str]:
    out = []
    deployed = {a.deployment for a in timeline if isinstance(a, (Deploy, Scale))}
    by_memory = any(n.gpu_memory for n in nodes)  # tiered models are booked by memory there, may evict others
    want = sum(d.replicas * d.gpus for n, d in deployments.items() if n in deployed and d.static is None
               and not (by_memory and d.tier_option()))
    have = sum(n.gpus for n in nodes) - sum(d.bundle_gpus * len([b for b in d.static.bundle_nodes if b])
                                           for d in deployments.values() if d.static is not None)
    have += sum(a.gpus for a in timeline if isinstance(a, AddNode))
    if provisioning is not None:  # (at most this many more, on demand)
        have += max(0, provisioning.max_nodes - len(nodes)) * provisioning.gpus
    if want > have + 1e-9:
        also = "add_node and provisioning" if provisioning is not None else "add_node"
        out.append(f"cluster: {have:g} GPUs ({also} included) for {want:g} asked by the deployments at full "
                   f"strength: some replicas will never be placed (add nodes, or lower replicas)")
    crashes = [a.index for a in timeline if isinstance(a, CrashController)]
    for a in timeline:
        if isinstance(a, Orphan) and not any(i > a.index for i in crashes):
            out.append(f"timeline[{a.index}] orphan: no crash_controller after it, so no recovery finds "
                       f"{a.replica} (an orphan is seen only by a recovering controller)")
    for name, d in sorted(deployments.items()):
        start = d.latency.get("start", latency["start"])
        ready = d.latency.get("ready", latency["ready"])
        process = d.latency.get("process", latency["process"])  # (a start with no spare process)
        slow = start.quantile(_SLOW_START_Q) + ready.quantile(_SLOW_START_Q) + process.quantile(_SLOW_START_Q)
        if slow >= timeout:  # (a start that takes exactly the timeout races its deadline: warn too)
            also = f" + process {process.describe()}" if process.quantile(_SLOW_START_Q) > 0 else ""
            out.append(f"deployments.{name}: starts take up to ~{slow:g} s (p99 of start {start.describe()} + "
                       f"ready {ready.describe()}{also}), {'at' if slow == timeout else 'beyond'} "
                       f"faults.start_timeout={timeout:g} s: slow starts will be declared hung and replaced "
                       f"(counted as timeouts); raise faults.start_timeout")
    return out


def _provisioning(value: Any, nodes: tuple[NodeSpec, ...], c: _Checker) -> Provisioning | None:
    """``cluster.provisioning: {delay_s, max_nodes, gpus}`` (``Provisioning``), or None."""
    raw = value.get("provisioning") if isinstance(value, dict) else None
    if raw is None:
        return None
    p = ("cluster", "provisioning")
    m = c.mapping(raw, p, PROVISIONING_KEYS, required=("delay_s", "max_nodes"))
    delay = c.number(m["delay_s"], p + ("delay_s",))
    most = c.count(m["max_nodes"], p + ("max_nodes",))
    if most < len(nodes):
        raise c.fail(p + ("max_nodes",), f"{most} is fewer than the {len(nodes)} nodes the cluster starts with "
                                         f"(max_nodes counts them too)")
    gpus = c.number(m.get("gpus", value.get("gpus_per_node", 8)), p + ("gpus",) if "gpus" in m else
                    ("cluster", "gpus_per_node"))
    if gpus <= 0:
        raise c.fail(p + ("gpus",), f"a node added must have GPUs, got {gpus:g}")
    return Provisioning(delay_s=delay, max_nodes=most, gpus=gpus)


def _nodes(value: Any, c: _Checker) -> tuple[NodeSpec, ...]:
    cl = c.mapping(value, ("cluster",), ("nodes", "gpus_per_node", "gpu_memory", "cpu_cache", "provisioning"),
                   required=("nodes",))
    gpus_default = c.number(cl.get("gpus_per_node", 8), ("cluster", "gpus_per_node"))
    memory_default = _size(cl.get("gpu_memory", 0), ("cluster", "gpu_memory"), c)
    cache_default = _size(cl.get("cpu_cache", 0), ("cluster", "cpu_cache"), c)
    nodes_raw = cl["nodes"]
    out: list[NodeSpec] = []
    if isinstance(nodes_raw, int) and not isinstance(nodes_raw, bool):
        n = _at_most_nodes(c.count(nodes_raw, ("cluster", "nodes")), 0, ("cluster", "nodes"), c)
        out = [NodeSpec(name=f"node-{i}", gpus=gpus_default, gpu_memory=memory_default, cpu_cache=cache_default)
               for i in range(n)]
        if memory_default:
            _whole_gpus(gpus_default, ("cluster", "gpus_per_node"), c)
    elif isinstance(nodes_raw, list):
        for i, item in enumerate(nodes_raw):
            p = ("cluster", "nodes", i)
            m = c.mapping(item, p, ("name", "gpus", "count", "unreported_gpus", "gpu_memory", "cpu_cache", "zone"),
                          required=("name",))
            nm = c.name(m["name"], p + ("name",))
            gpus = c.number(m.get("gpus", gpus_default), p + ("gpus",))
            count = _at_most_nodes(c.count(m.get("count", 1), p + ("count",)), len(out), p + ("count",), c)
            hidden = c.number(m.get("unreported_gpus", 0), p + ("unreported_gpus",))
            if hidden > gpus:
                raise c.fail(p + ("unreported_gpus",), f"{hidden:g} is more than the node's {gpus:g} GPUs")
            memory = _size(m.get("gpu_memory", memory_default), p + ("gpu_memory",), c)
            cache = _size(m.get("cpu_cache", cache_default), p + ("cpu_cache",), c)
            zone = c.name(m["zone"], p + ("zone",)) if "zone" in m else ""
            if memory:
                _whole_gpus(gpus, p + ("gpus",) if "gpus" in m else ("cluster", "gpus_per_node"), c)
            names = [f"{nm}-{j}" for j in range(count)] if "count" in m else [nm]
            out.extend(NodeSpec(name=x, gpus=gpus, unreported_gpus=hidden, gpu_memory=memory, cpu_cache=cache,
                                zone=zone) for x in names)
    else:
        raise c.fail(("cluster", "nodes"), f"must be a node count or a list of nodes, got {_show(nodes_raw)}")
    seen: set[str] = set()
    for spec in out:
        if spec.name in seen:
            raise c.fail(("cluster", "nodes"), f"node {spec.name!r} is listed twice")
        seen.add(spec.name)
    return tuple(out)


def _at_most_nodes(n: int, listed: int, p: tuple, c: _Checker) -> int:
    """``n`` more nodes beside the ``listed`` ones, within ``MAX_NODES`` (each is an object made now)."""
    if listed + n > MAX_NODES:
        raise c.fail(p, f"{listed + n:,} nodes is above {MAX_NODES:,} (MAX_NODES)")
    return n


def _deployments(value: Any, c: _Checker, placement: str = "spread", timeout: float | None = None,
                 nodes: set[str] | None = None) -> dict:
    ds = c.mapping(value, ("deployments",))
    if not ds:
        raise c.fail(("deployments",), "declare at least one deployment")
    out = {}
    for name, spec in ds.items():
        p = ("deployments", name)
        c.name(name, p)
        m = c.mapping(spec if spec is not None else {}, p,
                      ("replicas", "user_config", "reconfigure", "gpus", "latency", "max_replicas", "placement",
                       "static_placement", "gang", "start_failures", _MODEL_BYTES, "bandwidth", *_AS_IS))
        policy = m.get("placement", placement)
        if policy not in rc.placement.POLICIES:
            raise c.fail(p + ("placement",), f"must be one of {', '.join(rc.placement.POLICIES)}, got {_show(policy)}")
        reconf = m.get("reconfigure", "with_rank")
        if reconf not in RECONFIGURE_KINDS:
            raise c.fail(p + ("reconfigure",), f"must be one of {', '.join(RECONFIGURE_KINDS)}, got {_show(reconf)}")
        lat = c.mapping(m.get("latency", {}), p + ("latency",), LATENCY_KEYS)
        most = c.count(m.get("max_replicas", rc.DEFAULT_MAX_REPLICAS), p + ("max_replicas",))
        if not 1 <= most <= rc.MAX_RANKS:
            raise c.fail(p + ("max_replicas",), f"must be 1..{rc.MAX_RANKS}, got {most}")
        static, bundle_gpus = _static(m.get("static_placement"), p + ("static_placement",), c, nodes)
        gang = _gang(m.get("gang"), p + ("gang",), c)
        if static is not None and gang[0] > 1:
            raise c.fail(p + ("gang",), "a static placement and gangs do not mix (the mapping fixes every rank)")
        replicas = m.get("replicas", static.replicas if static is not None else 1)
        if m.get("autoscaling") is True and "replicas" in m:
            raise c.fail(p + ("replicas",), "an autoscaled deployment has no fixed replica count (the autoscaler "
                                            "sets it): give min_replicas / initial_replicas instead")
        if static is not None and replicas != static.replicas:
            raise c.fail(p + ("replicas",), f"a static placement fixes the replica count to its mapping's length "
                                            f"({static.replicas}), got {_show(replicas)}")
        if gang[0] > 1 and isinstance(replicas, int) and replicas % gang[0]:
            raise c.fail(p + ("replicas",), f"{replicas} replicas is not a multiple of the gang size {gang[0]}")
        out[name] = DeploymentSpec(
            name=name,
            max_replicas=most,
            static=static,
            bundle_gpus=bundle_gpus,
            gang_size=gang[0],
            gang_placement=gang[1],
            gang_failure=gang[2],
            replicas=_at_most(c.count(replicas, p + ("replicas",)), most, p + ("replicas",), c),
            user_config=m.get("user_config"),
            reconfigure=reconf,
            gpus=c.number(m.get("gpus", 1), p + ("gpus",)),
            latency={k: c.latency(v, p + ("latency", k)) for k, v in lat.items()},
            placement=policy,
            start_timeout=timeout,
            options=_options(m, p, c, name),
            start_failures=c.count(m.get("start_failures", 0), p + ("start_failures",)),
            model_bytes=_size(m.get(_MODEL_BYTES, 0), p + (_MODEL_BYTES,), c),
            bandwidth={k: c.bandwidth(v, p + ("bandwidth", k))
                       for k, v in c.mapping(m.get("bandwidth", {}), p + ("bandwidth",), TRANSFER_KEYS).items()},
        )
        try:  # the options together, as the core will see them (model_bytes with the GPUs, ...)
            out[name].applied()
        except rc.InvalidConfig as exc:
            raise c.fail(p + ((_MODEL_BYTES,) if _MODEL_BYTES in str(exc) and _MODEL_BYTES in m else ()),
                         str(exc)) from None
    return out


#: the core's ``model_bytes`` option as a scenario spells it (bytes, or a size: ``_size``)
_MODEL_BYTES = cast(rc.options.Spelling, rc.options.spelling("model_bytes", "scenario")).key
#: the deployment keys that are options taken as is (rankcore.base.options: one declaration); the
#: others (gpus, placement, static_placement, gang, faults.start_timeout) are spelt here
_AS_IS = rc.options.as_is("scenario")


def _options(m: dict, p: tuple, c: _Checker, name: str) -> tuple[tuple[str, Any], ...]:
    """The options given that a scenario takes as is (``_AS_IS``), checked by the core's own
    ``DeploymentApplied`` (one declaration, one check), the error pinned on the key."""
    given = tuple((k, m[k]) for k in _AS_IS if k in m)
    beside: dict[str, Any] = {"model_bytes": 1} if _MODEL_BYTES in m else {}  # (its size: checked below, _size)
    try:
        config = rc.DeploymentApplied(name=name, num_replicas=0, **beside, **dict(given)).config
    except rc.InvalidConfig as exc:
        named = [k for k, _ in given if f".{k}" in str(exc)]
        raise c.fail(p + tuple(named[:1]), str(exc)) from None
    if config.request_router:  # (the router named must exist and take its keywords: refused here, not mid-run)
        try:
            make_router(config.request_router, dict(config.request_router_kwargs))
        except rc.InvalidConfig as exc:
            raise c.fail(p + ("request_router",), str(exc)) from None
    return given


def _static(v: Any, p: tuple, c: _Checker, nodes: set[str] | None) -> tuple[rc.StaticPlacement | None, float]:
    """``static_placement: {bundles: [node, ...], mapping: {rank: [bundle, ...]} | per_replica: k}``."""
    if v is None:
        return None, 1.0
    m = c.mapping(v, p, ("group", "bundles", "mapping", "per_replica", "bundle_gpus", "capture_child_tasks"),
                  required=("bundles",))
    bundles = m["bundles"]
    if not isinstance(bundles, list) or not bundles:
        raise c.fail(p + ("bundles",), f"must list the node of every bundle of the group, got {_show(bundles)}")
    for i, b in enumerate(bundles):
        c.name(b, p + ("bundles", i))
        if nodes is not None and b not in nodes:
            raise c.fail(p + ("bundles", i), f"unknown node {b!r} (the cluster has: {', '.join(sorted(nodes))})")
    if ("mapping" in m) == ("per_replica" in m):
        raise c.fail(p, "give a 'mapping' (rank: [bundle indices]) or 'per_replica' (bundles per rank, "
                        "consecutive by node), not both or neither")
    if "per_replica" in m:
        k = c.count(m["per_replica"], p + ("per_replica",))
        seen: dict[str, int] = {}
        where = []
        for b in bundles:  # a bundle's GPU id: its position among its node's bundles
            where.append((b, seen.get(b, 0)))
            seen[b] = seen.get(b, 0) + 1
        try:
            mapping: Any = rc.consecutive_mapping(where, k)
        except rc.InvalidConfig as exc:
            raise c.fail(p + ("per_replica",), str(exc)) from None
    else:
        mapping = m["mapping"]
    group = c.name(m.get("group", "pg"), p + ("group",))
    capture = m.get("capture_child_tasks", True)
    if not isinstance(capture, bool):
        raise c.fail(p + ("capture_child_tasks",), "must be true or false")
    try:
        static = rc.StaticPlacement.from_mapping(group, bundles, mapping, capture)
    except rc.InvalidConfig as exc:
        raise c.fail(p + ("mapping",), str(exc)) from None
    return static, c.number(m.get("bundle_gpus", 1), p + ("bundle_gpus",))


_D = rc.options.DEFAULTS


def _gang(v: Any, p: tuple, c: _Checker) -> tuple[int, str, str]:
    """``gang: {size: k, placement: pack|spread, failure: restart_gang|restart_replica}`` (or just ``k``)."""
    if v is None:
        return _D.gang_size, _D.gang_placement, _D.gang_failure
    if isinstance(v, int) and not isinstance(v, bool):
        v = {"size": v}
    m = c.mapping(v, p, ("size", "placement", "failure"), required=("size",))
    size = c.count(m["size"], p + ("size",))
    if size < 1:
        raise c.fail(p + ("size",), "must be at least 1")
    placement = m.get("placement", _D.gang_placement)
    if placement not in rc.gangs.GANG_PLACEMENTS:
        raise c.fail(p + ("placement",), f"must be one of {', '.join(rc.gangs.GANG_PLACEMENTS)}, got {_show(placement)}")
    failure = m.get("failure", _D.gang_failure)
    if failure not in rc.gangs.GANG_FAILURES:
        raise c.fail(p + ("failure",), f"must be one of {', '.join(rc.gangs.GANG_FAILURES)}, got {_show(failure)}")
    return size, placement, failure


#: the units a size may end with (``16GiB``, ``80GB``, ``512MiB``): powers of 1024 and of 1000
SIZE_UNITS = {"B": 1, "KB": 10**3, "MB": 10**6, "GB": 10**9, "TB": 10**12,
              "KiB": 2**10, "MiB": 2**20, "GiB": 2**30, "TiB": 2**40}
_SIZE = re.compile(r"^\s*([0-9]*\.?[0-9]+(?:[eE][+-]?[0-9]+)?)\s*([A-Za-z]*)\s*$")


def _size(value: Any, p: tuple, c: _Checker) -> int:
    """A byte count: a number (``16e9``: YAML 1.1 reads an exponent without a dot as a
    string), or a size with a unit of ``SIZE_UNITS`` (``16GiB``, ``80GB``); whole bytes."""
    if isinstance(value, str):
        m = _SIZE.match(value)
        unit = m.group(2) if m else None
        if m is None or (unit and unit not in SIZE_UNITS):
            raise c.fail(p, f"must be a number of bytes, got {_show(value)} (or a size such as 16GiB or 80GB; "
                            f"units: {', '.join(SIZE_UNITS)})")
        value = float(m.group(1)) * SIZE_UNITS[unit or "B"]
    if isinstance(value, float) and math.isinf(value):
        raise c.fail(p, "must be a finite number of bytes")
    return int(c.number(value, p))


def _whole_gpus(gpus: float, p: tuple, c: _Checker) -> None:
    """A node that declares ``gpu_memory`` lists one device per GPU: a whole number of them."""
    if gpus != int(gpus):
        raise c.fail(p, f"a node with gpu_memory needs a whole number of GPUs (one device each), got {gpus:g}")


def _at_most(n: int, most: int, p: tuple, c: _Checker) -> int:
    """A replica count within the deployment's max_replicas (the core's own ceiling)."""
    if n > most:
        raise c.fail(p, f"{n} replicas is above max_replicas={most} (raise the deployment's max_replicas "
                        f"if you mean it)")
    return n


def _deployment_ref(value: Any, p: tuple, c: _Checker, deployments: dict) -> str:
    name = c.name(value, p)
    if name not in deployments:
        raise c.fail(p, f"unknown deployment {name!r} (declared: {', '.join(sorted(deployments))})")
    return name


def _entries(value: Any, c: _Checker, section: str, kinds: tuple, extra: tuple,
             noun: str, entry: str) -> Any:
    """The entries of a list section, each a mapping with exactly one of ``kinds``
    (plus the ``extra`` keys): yields (path, mapping, kind)."""
    if not isinstance(value, list):
        raise c.fail((section,), f"must be a list of {noun}s, got {_show(value)}")
    for i, item in enumerate(value):
        p = (section, i)
        m = c.mapping(item, p)
        unknown = [k for k in m if k not in kinds and k not in extra]
        if unknown:
            raise c.fail(p + (unknown[0],), f"unknown {noun}{_did_you_mean(unknown[0], kinds + extra)} "
                                            f"(one of: {', '.join(kinds)})", at_key=True)
        found = [k for k in m if k in kinds]
        if len(found) != 1:
            raise c.fail(p, f"each {entry} needs exactly one {noun}, got {len(found)}")
        yield p, m, found[0]


@attrs.frozen
class _ActionChecks:
    """What an action's ``parse`` asks of the file (``timeline.Checks``): the file's
    checks, pinned on its lines, and the deployments it declares."""

    c: _Checker
    declared: dict

    def fail(self, path: tuple, message: str, *, at_key: bool = False) -> ScenarioError:
        return self.c.fail(path, message, at_key=at_key)

    def mapping(self, value: Any, path: tuple, allowed: tuple | None = None, required: tuple = ()) -> dict:
        return self.c.mapping(value, path, allowed, required)

    def count(self, value: Any, path: tuple) -> int:
        return self.c.count(value, path)

    def number(self, value: Any, path: tuple) -> float:
        return self.c.number(value, path)

    def name(self, value: Any, path: tuple) -> str:
        return self.c.name(value, path)

    def deployment(self, value: Any, path: tuple) -> str:
        return _deployment_ref(value, path, self.c, self.declared)

    def replicas(self, value: Any, deployment: str, path: tuple) -> int:
        return _at_most(self.c.count(value, path), self.declared[deployment].max_replicas, path, self.c)

    def show(self, value: Any) -> str:
        return _show(value)


def _timeline(value: Any, c: _Checker, deployments: dict) -> tuple[Action, ...]:
    """Each entry's action (``timeline.ACTIONS`` parses it) with its place and time."""
    out = []
    checks = _ActionChecks(c, deployments)
    for p, m, key in _entries(value, c, "timeline", tuple(ACTIONS), ("at", "after"), "action", "timeline entry"):
        if "at" in m and "after" in m:
            raise c.fail(p, "give 'at' or 'after', not both")
        at = c.number(m["at"], p + ("at",)) if "at" in m else None
        after = c.number(m["after"], p + ("after",)) if "after" in m else None
        action = ACTIONS[key].parse(m[key], p + (key,), checks)
        out.append(attrs.evolve(action, index=p[1], at=at, after=after, where=c.where(p)))
    return tuple(out)


_BOUNDS = ("at_most", "at_least", "equals")


def _expectations(value: Any, c: _Checker, deployments: dict) -> tuple[Expectation, ...]:
    out = []
    for p, m, kind in _entries(value, c, "expect", EXPECTATIONS, ("at",), "expectation", "expect entry"):
        i = p[1]
        at = None
        if "at" in m and m["at"] != "end":
            at = c.number(m["at"], p + ("at",))
        q = p + (kind,)
        v = m[kind]
        if kind in ("contiguous", "asleep", "serving"):
            args: dict[str, Any] = {"deployment": _deployment_ref(v, q, c, deployments)}
        elif kind in ("world_size", "running", "failed", "weights_version"):
            mm = c.mapping(v, q, ("deployment", "equals"), required=("deployment", "equals"))
            args = {"deployment": _deployment_ref(mm["deployment"], q + ("deployment",), c, deployments),
                    "equals": c.count(mm["equals"], q + ("equals",))}
        elif kind == "status":
            mm = c.mapping(v, q, ("deployment", "equals"), required=("deployment", "equals"))
            if mm["equals"] not in rc.STATUSES:
                raise c.fail(q + ("equals",), f"must be one of {', '.join(rc.STATUSES)}, got {_show(mm['equals'])}")
            args = {"deployment": _deployment_ref(mm["deployment"], q + ("deployment",), c, deployments),
                    "equals": mm["equals"]}
        elif kind == "ranks":
            mm = c.mapping(v, q, ("deployment", "global", "contiguous"), required=("deployment",))
            args = {"deployment": _deployment_ref(mm["deployment"], q + ("deployment",), c, deployments)}
            if "global" in mm:
                g = mm["global"]
                if not isinstance(g, list):
                    raise c.fail(q + ("global",), f"must be a list of ranks, got {_show(g)}")
                args["global"] = [c.count(x, q + ("global", j)) for j, x in enumerate(g)]
            if "contiguous" in mm:
                if not isinstance(mm["contiguous"], bool):
                    raise c.fail(q + ("contiguous",), "must be true or false")
                args["contiguous"] = mm["contiguous"]
        elif kind == "packed":
            mm = c.mapping(v, q, ("deployment", *_BOUNDS), required=("deployment",))
            args = {"deployment": _deployment_ref(mm["deployment"], q + ("deployment",), c, deployments)}
            bounds = [b for b in _BOUNDS if b in mm] or ["equals"]
            for b in bounds:
                args[b] = c.count(mm.get(b, 0), q + (b,))
        elif kind in ("reconfigures", "reassignments", *TIER_COUNTS):
            extra = ("reason",) if kind == "reconfigures" else ("level",) if kind == "reassignments" else ()
            mm = c.mapping(v, q, ("deployment", *_BOUNDS, *extra), required=("deployment",))
            args = {"deployment": _deployment_ref(mm["deployment"], q + ("deployment",), c, deployments)}
            bounds = [b for b in _BOUNDS if b in mm]
            if not bounds:
                raise c.fail(q, f"needs one of {', '.join(_BOUNDS)}")
            for b in bounds:
                args[b] = c.count(mm[b], q + (b,))
            if kind in TIER_COUNTS:
                pass
            elif kind == "reconfigures":
                reason = mm.get("reason", "any")
                if reason not in ("any", "rank", "user_config"):
                    raise c.fail(q + ("reason",), f"must be any, rank or user_config, got {_show(reason)}")
                args["reason"] = reason
            else:
                level = mm.get("level", "any")
                if level not in ("any", "rank", "node_rank", "local_rank"):
                    raise c.fail(q + ("level",), f"must be any, rank, node_rank or local_rank, got {_show(level)}")
                args["level"] = level
        elif kind in ("availability", "full_strength"):
            mm = c.mapping(v, q, ("deployment", "at_least"), required=("deployment", "at_least"))
            args = {"deployment": _deployment_ref(mm["deployment"], q + ("deployment",), c, deployments),
                    "at_least": c.number(mm["at_least"], q + ("at_least",), maximum=100.0)}
        elif kind == "non_contiguous":
            mm = c.mapping(v, q, ("deployment", "level", "at_most_fraction"),
                           required=("deployment", "at_most_fraction"))
            level = mm.get("level", "any")
            if not isinstance(level, str) or level not in LEVEL_NAMES:
                raise c.fail(q + ("level",), f"must be one of {', '.join(LEVEL_NAMES)}, got {_show(level)}")
            args = {"deployment": _deployment_ref(mm["deployment"], q + ("deployment",), c, deployments),
                    "level": LEVEL_NAMES[level],
                    "at_most_fraction": c.number(mm["at_most_fraction"], q + ("at_most_fraction",), maximum=1.0)}
        elif kind == "below":
            limits = ("at_most_fraction", "at_most_seconds")
            mm = c.mapping(v, q, ("deployment", "replicas", *limits), required=("deployment", "replicas"))
            args = {"deployment": _deployment_ref(mm["deployment"], q + ("deployment",), c, deployments),
                    "replicas": c.count(mm["replicas"], q + ("replicas",))}
            if args["replicas"] < 1:
                raise c.fail(q + ("replicas",), "must be at least 1")
            if not any(k in mm for k in limits):
                raise c.fail(q, f"needs one of {', '.join(limits)}")
            if "at_most_fraction" in mm:
                args["at_most_fraction"] = c.number(mm["at_most_fraction"], q + ("at_most_fraction",), maximum=1.0)
            if "at_most_seconds" in mm:
                args["at_most_seconds"] = c.number(mm["at_most_seconds"], q + ("at_most_seconds",))
        elif kind == "to_full_strength":
            keys = ("p50_at_most", "p99_at_most", "max_at_most")
            mm = c.mapping(v, q, ("deployment", *keys), required=("deployment",))
            args = {"deployment": _deployment_ref(mm["deployment"], q + ("deployment",), c, deployments)}
            if not any(k in mm for k in keys):
                raise c.fail(q, f"needs one of {', '.join(keys)} (seconds)")
            for k in keys:
                if k in mm:
                    args[k] = c.number(mm[k], q + (k,))
        elif kind == "healthy":
            mm = c.mapping(v, q, ("deployment", "by"), required=("deployment", "by"))
            args = {"deployment": _deployment_ref(mm["deployment"], q + ("deployment",), c, deployments)}
            at = c.number(mm["by"], q + ("by",))
        else:  # pragma: no cover
            raise AssertionError(kind)
        out.append(Expectation(index=i, kind=kind, args=args, at=at, where=c.where(p)))
    return tuple(out)


def _traffic(value: Any, c: _Checker, deployments: dict, duration: float | None,
             nodes: tuple[str, ...] = ()) -> dict:
    """``traffic: {deployment: {arrivals: {kind: ...}, service: <latency>, ...}}`` -> ``TrafficSpec`` by name
    (``nodes``: the cluster's, which ``callers`` may name)."""
    section = c.mapping({} if value is None else value, ("traffic",))
    out = {}
    for name, spec in section.items():
        p = ("traffic", name)
        if name not in deployments:
            raise c.fail(p, f"unknown deployment {name!r}{_did_you_mean(name, tuple(deployments))} "
                            f"(declared: {', '.join(sorted(deployments))})", at_key=True)
        given = set(spec) & set(_LIMITS) if isinstance(spec, dict) else set()
        if given:
            k = sorted(given)[0]
            raise c.fail(p + (k,), f"{k} is a deployment option (declared once: rankcore/base/options.py): "
                                   f"set it as deployments.{name}.{k}", at_key=True)
        m = c.mapping(spec, p, _TRAFFIC_KEYS, required=("arrivals",))
        stream = None if m.get("stream") is None else _stream(m["stream"], p + ("stream",), c)
        batched, host = (None, None) if m.get("batch") is None else _batch(m["batch"], p + ("batch",), c)
        if m.get("host") is not None:
            if host is not None:
                raise c.fail(p + ("host",), "the host's CPU is given under batch already: give it once (host: "
                                            "holds it for any deployment)", at_key=True)
            keys = c.mapping(m["host"], p + ("host",), HOST_KEYS, required=("cores",))
            host = _host(keys, p + ("host",), c)
        if batched is not None and stream is not None:
            raise c.fail(p + ("batch",), "batch and stream together are not modelled by the simulator (a batched "
                                         "generator streams per caller on Ray): give one of them", at_key=True)
        if batched is not None and "service" in m:
            raise c.fail(p + ("service",), "a batched deployment's service time is its batch's: "
                                           "batch.fixed_s + n x batch.per_item_s (drop 'service')", at_key=True)
        models = None if m.get("models") is None else _models(m["models"], p + ("models",), c)
        if models is not None and batched is not None:
            raise c.fail(p + ("models",), "models and batch together are not modelled by the simulator (a batch "
                                          "would split by model id): give one of them", at_key=True)
        prefix = None if m.get("prefix_cache") is None else _prefix_cache(m["prefix_cache"], p + ("prefix_cache",), c)
        if prefix is not None:
            for k, why in (("service", "its service time is the prefix cache's: ttft_s(prompt, cached) + decode_s "
                                       "(drop 'service')"),
                           ("batch", "prefix_cache and batch together are not modelled by the simulator: give one "
                                     "of them"),
                           ("stream", "prefix_cache and stream together are not modelled by the simulator (a "
                                      "stream's items have their own times): give one of them")):
                if m.get(k) is not None:
                    raise c.fail(p + (k,), why, at_key=True)
        sessions = 0 if m.get("sessions") is None else c.some(m["sessions"], p + ("sessions",), "sessions")
        if sessions and prefix is not None and prefix.keyed:
            raise c.fail(p + ("sessions",), "prefix_cache.keyed gives each request its system prompt's session key: "
                                            "give sessions or keyed, not both", at_key=True)
        callers = () if m.get("callers") is None else _callers(m["callers"], p + ("callers",), c, nodes)
        if "service" not in m and batched is None and prefix is None and (stream is None or stream.fraction < 1):
            raise c.fail(p, "missing required field 'service'" + (
                "" if stream is None else f" (the plain requests' service time: stream.fraction is {stream.fraction:g})"))
        if duration is None:
            raise c.fail(p, "traffic needs the scenario's 'duration' (requests arrive, and the queue is "
                            "sampled, until then)", at_key=True)
        start = c.number(m.get("from", 0), p + ("from",), maximum=duration)
        until = c.number(m.get("until", duration), p + ("until",), minimum=start, maximum=duration)
        idempotent = m.get("idempotent", False)
        if not isinstance(idempotent, bool):
            raise c.fail(p + ("idempotent",), f"must be true or false, got {_show(idempotent)}")
        timeout = m.get("timeout_s")
        if timeout is not None and c.number(timeout, p + ("timeout_s",)) <= 0:
            raise c.fail(p + ("timeout_s",), "must be > 0 seconds (or null: no deadline)")
        interval = c.number(m.get("metrics_interval_s", 10.0), p + ("metrics_interval_s",))
        if interval <= 0:
            raise c.fail(p + ("metrics_interval_s",), "must be > 0 seconds")
        limits = tuple((k, v) for k, v in deployments[name].options if k in _LIMITS)
        out[name] = TrafficSpec(
            deployment=name, arrivals=_arrivals(m["arrivals"], p + ("arrivals",), c),
            service=c.latency(m["service"], p + ("service",)) if "service" in m else None, stream=stream,
            batch=batched, models=models, host=host, prefix_cache=prefix, sessions=sessions, callers=callers,
            idempotent=idempotent,
            timeout_s=None if timeout is None else float(timeout),
            error_rate=c.number(m.get("error_rate", 0.0), p + ("error_rate",), maximum=1.0),
            start=start, until=until, metrics_interval_s=interval, limits=tuple(limits))
    return out


def _prefix_cache(value: Any, p: tuple, c: _Checker) -> PrefixCacheSpec:
    """``prefix_cache: {system_prompts, zipf_s, system_chars, question_chars, block_chars,
    capacity_blocks, base_s, prefill_s_per_char, decode_s, prefills, seed, prefill_overhead_s, keyed}``
    (each optional) -> ``PrefixCacheSpec``."""
    m = c.mapping(value, p, PREFIX_WORKLOAD_KEYS + PREFIX_MODEL_KEYS + (PREFIX_SEED_KEY, PREFIX_OVERHEAD_KEY,
                                                                        PREFIX_KEYED_KEY))
    given: dict[str, Any] = {}
    for k, v in m.items():
        if k == PREFIX_OVERHEAD_KEY:
            given[k] = c.latency(v, p + (k,))
        elif k == PREFIX_KEYED_KEY:
            if not isinstance(v, bool):
                raise c.fail(p + (k,), f"must be true or false, got {_show(v)}")
            given[k] = v
        elif k in _PREFIX_COUNTS:
            given[k] = c.count(v, p + (k,))
            if given[k] < 1 and k not in _PREFIX_ZERO_OK:
                raise c.fail(p + (k,), f"must be at least 1, got {given[k]}")
        else:
            given[k] = c.number(v, p + (k,))
    big = given.get("system_prompts", 200) * given.get("system_chars", 1600)
    if big > MAX_PREFIX_CHARS or given.get("question_chars", 0) > MAX_PREFIX_CHARS:
        k = "question_chars" if given.get("question_chars", 0) > MAX_PREFIX_CHARS else (
            "system_chars" if "system_chars" in given else "system_prompts")
        raise c.fail(p + (k,), f"the prompts would hold over {MAX_PREFIX_CHARS:,} characters (MAX_PREFIX_CHARS): "
                               f"system_prompts x system_chars is {big:,}")
    return PrefixCacheSpec(workload=tuple((k, v) for k, v in given.items() if k in PREFIX_WORKLOAD_KEYS),
                           model=tuple((k, v) for k, v in given.items() if k in PREFIX_MODEL_KEYS),
                           seed=given.get(PREFIX_SEED_KEY), overhead=given.get(PREFIX_OVERHEAD_KEY),
                           keyed=given.get(PREFIX_KEYED_KEY, False))


def _callers(value: Any, p: tuple, c: _Checker, nodes: tuple[str, ...]) -> tuple[tuple[str, float], ...]:
    """``callers: {node: weight, ...}`` (the cluster's nodes, weights >= 0, not all 0) -> (node, weight) pairs."""
    m = c.mapping(value, p)
    if not m:
        raise c.fail(p, "must name at least one node with its weight ({node-0: 1, node-1: 3})")
    out = []
    for node, weight in m.items():
        if node not in nodes:
            raise c.fail(p + (node,), f"unknown node {_show(node)}{_did_you_mean(node, nodes)} (the cluster's: "
                                      f"{', '.join(nodes[:20])}{', ...' if len(nodes) > 20 else ''})", at_key=True)
        out.append((str(node), c.number(weight, p + (node,))))
    if not any(w > 0 for _, w in out):
        raise c.fail(p, "every weight is 0: give at least one node a weight > 0")
    return tuple(out)


def _batch(value: Any, p: tuple, c: _Checker) -> tuple[BatchSpec, HostSpec | None]:
    """``batch: {max_batch_size, batch_wait_timeout_s, max_concurrent_batches, fixed_s, per_item_s,
    cores, request_s, threads, replica_s}`` -> ``BatchSpec`` (the options are
    ``rankcore.requests.BatchOptions``'s, by their own names) and the host's CPU given there."""
    from rankcore.requests import BatchOptions

    m = c.mapping(value, p, _field_names(BatchOptions) + BATCH_SIM_KEYS, required=("fixed_s",))
    batch = BatchSpec(options=_core_options(BatchOptions, m, p, c), fixed_s=c.latency(m["fixed_s"], p + ("fixed_s",)),
                      per_item_s=c.latency(m.get("per_item_s", 0.0), p + ("per_item_s",)))
    return batch, _host(m, p, c)


def _host(m: dict, p: tuple, c: _Checker) -> HostSpec | None:
    """The host's keys of ``m`` (``HOST_KEYS``, at ``p``) -> ``HostSpec`` (None: none given)."""
    cpu = [k for k in ("request_s", "threads", "replica_s") if k in m]
    if cpu and "cores" not in m:
        raise c.fail(p + (cpu[0],), "needs 'cores' beside it: a request's CPU runs on the host's cores")
    if "cores" in m and not cpu:
        raise c.fail(p + ("cores",), "needs 'request_s', 'threads' or 'replica_s' beside it: the host's cores "
                                     "and each request's CPU on them are modelled together")
    if "cores" not in m:
        return None
    cores = c.count(m["cores"], p + ("cores",))
    if cores < 1:
        raise c.fail(p + ("cores",), f"must be at least 1, got {cores}")
    threads = m.get("threads", [])
    if not isinstance(threads, list) or (not threads and "threads" in m):
        raise c.fail(p + ("threads",), f"must be a non-empty list of CPU seconds a request costs on each "
                                       f"thread in turn, got {threads!r}")
    return HostSpec(cores=cores, request_s=c.latency(m["request_s"], p + ("request_s",)) if "request_s" in m else None,
                    threads=tuple(c.latency(t, p + ("threads", i)) for i, t in enumerate(threads)),
                    replica_s=c.latency(m["replica_s"], p + ("replica_s",)) if "replica_s" in m else None)


def _models(value: Any, p: tuple, c: _Checker) -> ModelsSpec:
    """``models: {count, zipf_s, load_s, max_num_models_per_replica}`` or ``{file, load_s, ...}`` ->
    ``ModelsSpec`` (the options are ``rankcore.requests.MultiplexOptions``', by their own names)."""
    from rankcore.requests import MultiplexOptions

    m = c.mapping(value, p, _field_names(MultiplexOptions) + MODELS_SIM_KEYS)
    options = _core_options(MultiplexOptions, m, p, c)
    load_s = c.latency(m.get("load_s", MODEL_LOAD_S), p + ("load_s",))
    if "file" in m:
        for k in ("count", "zipf_s"):
            if k in m:
                raise c.fail(p + (k,), f"{k} draws the model ids; file lists them: give one of them", at_key=True)
        path = c.name(m["file"], p + ("file",))
        ids = _model_file(path, p + ("file",), c)
        return ModelsSpec(options=options, count=len(set(ids)), load_s=load_s, ids=ids, path=path)
    if "count" not in m:
        raise c.fail(p, "missing required field 'count' (how many models, or 'file': a model id per request)")
    return ModelsSpec(options=options, count=c.some(m["count"], p + ("count",), "models"), load_s=load_s,
                      zipf_s=c.number(m.get("zipf_s", 1.0), p + ("zipf_s",)))


def _model_file(path: str, p: tuple, c: _Checker) -> tuple[str, ...]:
    """The model ids in ``path`` (relative to the scenario file): one a line, each request in
    order takes the next (cycled); blank lines and ``#`` comments skipped."""
    where = Path(path) if Path(path).is_absolute() or c.file.startswith("<") else Path(c.file).parent / path
    try:
        lines = where.read_text().splitlines()
    except OSError as exc:
        raise c.fail(p, f"cannot read {str(where)!r}: {exc.strerror}") from None
    ids: list[str] = []
    for n, line in enumerate(lines, 1):
        text = line.split("#", 1)[0].strip()
        if not text:
            continue
        if any(ch.isspace() for ch in text):
            raise c.fail(p, f"{where}:{n}: one model id a line, got {text!r}")
        ids.append(text)
    if not ids:
        raise c.fail(p, f"{where}: no model id in it")
    return tuple(ids)


def _stream(value: Any, p: tuple, c: _Checker) -> StreamSpec:
    """``stream: {items: N or a distribution, item_interval_s: <latency>, first_item_s: <latency>,
    fraction: 0..1}`` -> ``StreamSpec``."""
    m = c.mapping(value, p, _STREAM_KEYS, required=("items", "item_interval_s"))
    items = m["items"]
    if isinstance(items, bool) or not isinstance(items, (int, dict)) or (isinstance(items, int) and items < 1):
        raise c.fail(p + ("items",), f"must be a whole number of items >= 1 or a distribution "
                                     f"({{dist: lognormal, median: 200, sigma: 0.5}}), got {_show(items)}")
    first = m.get("first_item_s")
    return StreamSpec(items=c.latency(items, p + ("items",)),
                      item_interval_s=c.latency(m["item_interval_s"], p + ("item_interval_s",)),
                      first_item_s=None if first is None else c.latency(first, p + ("first_item_s",)),
                      fraction=c.number(m.get("fraction", 1.0), p + ("fraction",), maximum=1.0))


def _arrivals(value: Any, p: tuple, c: _Checker) -> ArrivalSpec:
    """One ``arrivals`` mapping (``ARRIVAL_KINDS``), every rate a number >= 0."""
    m = c.mapping(value, p, required=("kind",))
    kind = m["kind"]
    if not isinstance(kind, str) or kind not in ARRIVAL_KINDS:
        raise c.fail(p + ("kind",), f"unknown arrival kind {_show(kind)}{_did_you_mean(kind, tuple(ARRIVAL_KINDS))} "
                                    f"(one of: {', '.join(ARRIVAL_KINDS)})")
    need, optional = ARRIVAL_KINDS[kind]
    c.mapping(m, p, ("kind", *need, *optional), required=need)
    if kind == "poisson":
        return ArrivalSpec(kind, rate=c.number(m["rate"], p + ("rate",)))
    if kind == "bursts":
        period = c.number(m["period_s"], p + ("period_s",))
        if period <= 0:
            raise c.fail(p + ("period_s",), "must be > 0 seconds")
        return ArrivalSpec(kind, base_rate=c.number(m["base_rate"], p + ("base_rate",)),
                           burst_rate=c.number(m["burst_rate"], p + ("burst_rate",)),
                           burst_s=c.number(m["burst_s"], p + ("burst_s",), maximum=period), period_s=period,
                           offset_s=c.number(m.get("offset_s", 0.0), p + ("offset_s",)))
    if kind == "closed":
        think = m.get("think_s")
        return ArrivalSpec(kind, clients=c.some(m["clients"], p + ("clients",), "callers"), think_s=None if think is None else c.latency(think, p + ("think_s",)))
    if kind == "daily":
        rates = m["rates"]
        if not isinstance(rates, list) or len(rates) != 24:
            raise c.fail(p + ("rates",), f"must list 24 rates (requests/s in each hour of the day), got "
                                         f"{len(rates) if isinstance(rates, list) else _show(rates)}")
        day = c.number(m.get("day_s", 86400.0), p + ("day_s",))
        if day <= 0:
            raise c.fail(p + ("day_s",), "must be > 0 seconds")
        return ArrivalSpec(kind, rates=tuple(c.number(r, p + ("rates", i)) for i, r in enumerate(rates)), day_s=day)
    path = c.name(m["path"], p + ("path",))
    return ArrivalSpec(kind, path=path, times=_arrival_file(path, p + ("path",), c))


def _arrival_file(path: str, p: tuple, c: _Checker) -> tuple[float, ...]:
    """The arrival times in ``path`` (relative to the scenario file): one number of seconds >= 0 a
    line, blank lines and ``#`` comments skipped; in any order (sorted here)."""
    where = Path(path) if Path(path).is_absolute() or c.file.startswith("<") else Path(c.file).parent / path
    try:
        lines = where.read_text().splitlines()
    except OSError as exc:
        raise c.fail(p, f"cannot read {str(where)!r}: {exc.strerror}") from None
    times = []
    for n, line in enumerate(lines, 1):
        text = line.split("#", 1)[0].strip()
        if not text:
            continue
        try:
            t = float(text)
        except ValueError:
            raise c.fail(p, f"{where}:{n}: not a number of seconds: {text!r}") from None
        if not math.isfinite(t) or t < 0:
            raise c.fail(p, f"{where}:{n}: an arrival time must be a finite number >= 0, got {text!r}")
        times.append(t)
    return tuple(sorted(times))
