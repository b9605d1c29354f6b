"""What-if sweeps: every variant of a scenario, each with several seeds, on
every core, summarised per variant and written out whole (JSON or CSV).

A run is loaded and simulated in a worker process and comes back as a
``RunRecord`` (plain figures, no state), so a sweep of hundreds of runs costs
little memory and uses both cores of a small machine. On a Ray cluster
(``run_sweep(on_ray=True)``, ``rankcore simulate --address``: issue 68) each run
is a Ray task of one CPU instead, given the variant as the driver loaded it (no
worker reads the file), and the records come back in the same order with the
same figures.
"""

from __future__ import annotations

import concurrent.futures as cf
import csv
import io
import json
import math
import os
import statistics
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import attrs

__all__ = ["RunRecord", "InvalidVariant", "Figure", "FIGURES", "GROUPS", "TRAFFIC_GROUPS", "ALIASES", "select_figures", "traffic_figures", "rollout_figures", "proxy_figures", "group_figures",
           "autoscaling_figures", "figure_value", "run_one",
           "run_sweep", "sweep_cpus", "summarise", "tables", "to_json", "to_csv"]


@attrs.frozen
class RunRecord:
    """One simulated run: its variant (the ``--set`` values), seed and every figure."""

    variant: dict
    seed: int
    scenario: str
    metrics: dict
    expectations: tuple[dict, ...]
    events: int
    end_time: float
    wall: float

    @property
    def passed(self) -> bool:
        return all(e["passed"] for e in self.expectations)

    def as_dict(self) -> dict:
        return {"variant": self.variant, "seed": self.seed, "scenario": self.scenario, "passed": self.passed,
                "events": self.events, "end_time": self.end_time, "wall_s": round(self.wall, 4),
                "metrics": self.metrics, "expectations": list(self.expectations)}


@attrs.frozen
class InvalidVariant:
    """A variant whose scenario does not load (reported; the other variants run)."""

    variant: dict
    error: str


def run_one(path: str, overrides: dict, seed: int | None, trace_path: str | None = None,
            plot_path: str | None = None, scenario: Any = None) -> RunRecord:
    """Load ``path`` with ``overrides`` and simulate it with ``seed`` (None: its own);
    ``scenario``: that variant already loaded (``_load(path, ...)``: a Ray task is given the
    driver's, so the worker needs neither the file nor the files it names)."""
    from .sim import Simulation

    sc = scenario if scenario is not None else _load(path, _key(overrides), overrides)
    t0 = time.perf_counter()
    fp = open(trace_path, "w") if trace_path else None
    try:
        result = Simulation(sc, seed=seed, trace=fp).run()
    finally:
        if fp:
            fp.close()
    wall = time.perf_counter() - t0
    if plot_path and trace_path:
        from .sim.plot import plot_trace

        plot_trace(Path(trace_path), Path(plot_path), title=sc.name, variant=overrides)
    return RunRecord(variant=dict(overrides), seed=result.seed, scenario=sc.name, metrics=result.metrics,
                     expectations=tuple(e.as_record() | {"kind": e.expectation.kind if e.expectation else None}
                                        for e in result.expectations),
                     events=result.events, end_time=result.end_time, wall=wall)


def _key(overrides: dict) -> str:
    return json.dumps(overrides, sort_keys=True, default=str)


_LOADED: dict[tuple, Any] = {}


def _load(path: str, key: str, overrides: dict) -> Any:
    """A worker runs many seeds of one variant: load (and validate) it once
    (again if the file changed)."""
    from .sim import load_scenario

    st = os.stat(path)
    k = (path, st.st_mtime_ns, st.st_size, key)
    sc = _LOADED.get(k)
    if sc is None:
        if len(_LOADED) > 64:
            _LOADED.clear()
        sc = _LOADED[k] = load_scenario(path, overrides=overrides)
    return sc


def _label(variant: dict) -> str:
    return ",".join(f"{k}={v}" for k, v in variant.items()) or "base"


def _safe(text: str) -> str:
    return "".join(c if c.isalnum() or c in "-_.=" else "_" for c in text)[:120]


def run_sweep(path: Path, variants: Sequence[dict], seeds_for: Callable[[dict], list[int | None]], *,
              jobs: int | None = None, trace_dir: Path | None = None, plot_dir: Path | None = None,
              progress: Callable[[int, int], None] | None = None, on_ray: bool = False) -> list[RunRecord]:
    """Every (variant, seed) run, on ``jobs`` processes (default: every core),
    in variant then seed order whatever order they finish in.

    ``on_ray``: each run a Ray task of one CPU on the cluster this process is connected to
    (``ray.init`` first), given its variant as loaded here (``_load``: one ``ray.put`` per
    variant); the same records in the same order as on processes (``jobs`` is not used). Not with
    ``trace_dir`` or ``plot_dir``: a task writes its files on the node it runs on."""
    if on_ray and (trace_dir or plot_dir):
        raise ValueError("run_sweep(on_ray=True) writes no traces or plots (a task's files would be on its node)")
    tasks = []
    for i, v in enumerate(variants):
        for s in seeds_for(v):
            name = f"{i:03d}-{_safe(_label(v))}-seed{s}"
            trace = str(trace_dir / f"{name}.jsonl") if trace_dir else None
            if plot_dir and not trace:
                trace = str(plot_dir / f"{name}.jsonl")
            plot = str(plot_dir / f"{name}.png") if plot_dir else None
            tasks.append((str(path), dict(v), s, trace, plot))
    workers = sweep_cpus(len(tasks), jobs)
    out: list[RunRecord | None] = [None] * len(tasks)
    if on_ray:
        out = _on_ray(tasks, progress)
    elif workers <= 1:
        for k, t in enumerate(tasks):
            out[k] = run_one(*t)
            if progress:
                progress(k + 1, len(tasks))
    else:
        with cf.ProcessPoolExecutor(max_workers=workers) as pool:
            futures = {pool.submit(run_one, *t): k for k, t in enumerate(tasks)}
            for done, fut in enumerate(cf.as_completed(futures), 1):
                out[futures[fut]] = fut.result()
                if progress:
                    progress(done, len(tasks))
    if plot_dir and not trace_dir:
        for t in tasks:
            if t[3]:
                Path(t[3]).unlink(missing_ok=True)
    return [r for r in out if r is not None]


def sweep_cpus(runs: int, jobs: int | None = None, on_ray: bool = False) -> int:
    """The CPUs a sweep of ``runs`` runs works on at once: on Ray, the cluster's
    (``ray.cluster_resources()["CPU"]``, each run a task of one CPU), else its worker processes
    (``jobs``, default every core); never more than the runs, at least one."""
    if on_ray:
        import ray

        cpus = int(ray.cluster_resources().get("CPU", 0))
    else:
        cpus = jobs or os.cpu_count() or 1
    return max(1, min(cpus, runs))


def _ray_run(path: str, overrides: dict, seed: int | None, scenario: Any) -> RunRecord:
    """One run of a sweep as a Ray task: ``run_one`` on the variant the driver loaded."""
    return run_one(path, overrides, seed, scenario=scenario)


_REMOTE: Any = None


def _on_ray(tasks: list[tuple], progress: Callable[[int, int], None] | None) -> list[RunRecord | None]:
    """``tasks`` (``run_one``'s arguments, no trace or plot) as Ray tasks of one CPU, their
    records in the tasks' order; ``progress`` as each finishes. A run that raises raises here
    (the runs not finished are cancelled), as ``fut.result()`` does on processes."""
    import ray

    global _REMOTE
    if not ray.is_initialized():
        raise RuntimeError("run_sweep(on_ray=True) needs a connected Ray: call ray.init(address=...) first")
    if _REMOTE is None:
        _REMOTE = ray.remote(num_cpus=1)(_ray_run)
    loaded: dict[str, Any] = {}  # a variant's key -> its loaded scenario, put once for all its seeds
    refs = []
    for path, v, s, _, _ in tasks:
        k = _key(v)
        if k not in loaded:
            loaded[k] = ray.put(_load(path, k, v))
        refs.append(_REMOTE.remote(path, v, s, loaded[k]))
    index = {ref: n for n, ref in enumerate(refs)}
    out: list[RunRecord | None] = [None] * len(refs)
    pending = list(refs)
    try:
        while pending:
            ready, pending = ray.wait(pending, num_returns=1)
            for ref in ready:
                out[index[ref]] = ray.get(ref)
            if progress:
                progress(len(refs) - len(pending), len(refs))
    except BaseException:
        for ref in pending:
            ray.cancel(ref)
        raise
    return out


@attrs.frozen
class Figure:
    """One per-deployment figure a sweep summarises: its key (in the JSON
    summary and the CSV), its column title, its group of columns, digits, and
    whether one run's value is a count (printed without digits)."""

    key: str
    title: str
    group: str
    digits: int = 1
    count: bool = False


_LEVELS = (("rank", "rank"), ("node_rank", "node"), ("local_rank", "local"))

#: the per-deployment figures a sweep summarises, in column order
FIGURES: tuple[Figure, ...] = (
    Figure("availability_pct", "avail. %", "availability", 3),
    Figure("full_strength_pct", "full strength %", "availability", 3),
    Figure("unavailable_replica_seconds", "unavail. replica·s", "availability"),
    Figure("crashes", "crashes", "recovery", count=True),
    Figure("timeouts", "timeouts", "recovery", count=True),
    Figure("crash_to_ready_p50", "crash→ready p50 s", "recovery"),
    Figure("crash_to_ready_p99", "crash→ready p99 s", "recovery"),
    Figure("to_full_strength_p50", "to full p50 s", "recovery"),
    Figure("to_full_strength_p99", "to full p99 s", "recovery"),
    Figure("to_full_strength_max", "to full max s", "recovery"),
    # rolling updates (docs/rollouts.md): replicas replaced, and how long the (last) rollout took
    Figure("rollout_replacements", "rollout\nreplaced", "rollouts", count=True),
    Figure("rollout_s_max", "rollout s", "rollouts"),
    *(Figure(f"reassignments_{lv}", f"reassigned\n{short}", "ranks", count=True) for lv, short in _LEVELS),
    Figure("reassignments_any", "reassigned\nany level", "ranks", count=True),
    Figure("reconfigures_rank", "reconfigures\nrank", "ranks", count=True),
    Figure("reconfigures_user_config", "reconfigures\nuser_config", "ranks", count=True),
    *(Figure(f"noncontig_{lv}", f"non-contig\n{short} frac.", "contiguity", 4) for lv, short in _LEVELS),
    Figure("noncontig_any", "non-contig\nany frac.", "contiguity", 4),
    *(Figure(f"noncontig_s_{lv}", f"non-contig\n{short} s", "contiguity_s") for lv, short in _LEVELS),
    Figure("noncontig_s_any", "non-contig\nany s", "contiguity_s"),
    Figure("noncontiguous_seconds", "non-contig\nwhole run s", "contiguity_s"),
    # GPU memory tiers (issue 21): loads by source, evictions, replica-seconds HOT, the wait to be HOT
    Figure("cold_loads", "cold\nloads", "tiers", count=True),
    Figure("warm_loads", "warm\nloads", "tiers", count=True),
    Figure("evictions", "evictions", "tiers", count=True),
    Figure("hot_seconds", "HOT\nreplica·s", "tiers", 0),
    Figure("wait_to_hot_s", "wait to HOT\nsum s", "tiers"),
    Figure("wait_to_hot_max", "wait to HOT\nmax s", "tiers"),
    Figure("never_hot", "never\nHOT", "tiers", count=True),
    # the request queue (``traffic:``; executors/sim/traffic.py): what became of the requests, and waits
    *(Figure(f"requests_{k}", title, "requests", count=True) for k, title in (
        ("submitted", "requests"), ("answered", "answered"), ("app_errors", "app\nerrors"), ("retried", "retried"),
        ("failed", "failed"), ("rejected_total", "rejected"), ("lost", "lost"))),
    Figure("requests_max_queued", "max\nqueued", "queue", count=True),
    *(Figure(f"requests_{k}", title, "queue", 3) for k, title in (
        ("queue_wait_p50", "queue wait\np50 s"), ("queue_wait_p99", "queue wait\np99 s"),
        ("latency_p50", "latency\np50 s"), ("latency_p99", "latency\np99 s"))),
    # streams (``traffic.<d>.stream``): what became of them, items given, time to first item, duration
    *(Figure(f"requests_{k}", title, "streams", count=True) for k, title in (
        ("streams_started", "streams"), ("streams_completed", "completed"), ("streams_failed", "failed"),
        ("stream_items", "items"))),
    *(Figure(f"requests_{k}", title, "streams", 3) for k, title in (
        ("first_item_p50", "1st item\np50 s"), ("first_item_p99", "1st item\np99 s"),
        ("stream_duration_p50", "duration\np50 s"), ("stream_duration_p99", "duration\np99 s"))),
    # batches (``traffic.<d>.batch``; the core's batcher): throughput, how many batches, how full
    Figure("requests_throughput_rps", "answered\nper s", "batches", 1),
    Figure("requests_batches", "batches", "batches", count=True),
    Figure("requests_batch_size_mean", "batch size\nmean", "batches", 2),
    Figure("requests_batches_full", "closed\nfull", "batches", count=True),
    # multiplexed models (``traffic.<d>.models``; the core's ModelCache): hits, loads, evictions
    Figure("requests_model_hit_rate", "model\nhit rate", "models", 3),
    Figure("requests_model_loads", "models\nloaded", "models", count=True),
    Figure("requests_model_loads_per_min", "loaded\nper min", "models", 1),
    Figure("requests_model_evictions", "models\nevicted", "models", count=True),
    # routing (issue 68; ``deployments.<d>.request_router``, ``traffic.<d>.prefix_cache``): time to first
    # token and the prefix caches' hit share (with ``prefix_cache``), how unevenly the replicas served
    Figure("requests_ttft_p50", "TTFT\np50 s", "routing", 4),
    Figure("requests_ttft_p99", "TTFT\np99 s", "routing", 4),
    Figure("requests_prefix_hit_share", "prefix\nhit share", "routing", 3),
    Figure("requests_replica_imbalance", "replica\nimbalance", "routing", 2),
    # proxies (``proxies:``; executors/sim/proxies.py): requests that failed at their callers for a proxy
    Figure("requests_failed_no_proxy", "failed:\nno proxy", "proxies", count=True),
    Figure("requests_failed_proxy_died", "failed:\nproxy died", "proxies", count=True),
    # autoscaling (issue 23; executors/sim/autoscale.py): what the replicas cost, what the autoscaler
    # did, and (``ALIASES``: figures of other groups, again) what it cost the callers and the ranks
    Figure("replica_seconds", "replica·s", "autoscaling", 0),
    Figure("gpu_hours", "GPU-h", "autoscaling", 2),
    Figure("starts", "cold\nstarts", "autoscaling", count=True),
    Figure("autoscaling_scale_ups", "scale\nups", "autoscaling", count=True),
    Figure("autoscaling_scale_downs", "scale\ndowns", "autoscaling", count=True),
    Figure("autoscaling_to_enough_p50", "to enough\np50 s", "autoscaling"),
    Figure("autoscaling_to_enough_max", "to enough\nmax s", "autoscaling"),
    Figure("as_queue_wait_p99", "queue wait\np99 s", "autoscaling", 3),
    Figure("as_failed", "failed", "autoscaling", count=True),
    Figure("as_rejected", "rejected", "autoscaling", count=True),
    Figure("as_reassigned", "reassigned", "autoscaling", count=True),
    Figure("as_reconfigures", "reconfigures\nrank", "autoscaling", count=True),
    # collective groups (issue 67; ``collective_group``): each group's time up, epochs formed, who
    # re-formed in place and who joined, and each outage (a member lost -> the next epoch up)
    Figure("group_availability_pct", "group\navail. %", "groups", 3),
    Figure("group_reforms", "epochs\nformed", "groups", count=True),
    Figure("group_in_place", "re-formed\nin place", "groups", count=True),
    Figure("group_joined", "joined", "groups", count=True),
    Figure("group_outage_p50", "outage\np50 s", "groups"),
    Figure("group_outage_max", "outage\nmax s", "groups"),
)
#: figures shown again in another group (the autoscaling table's), under a key of their own
ALIASES = {"as_queue_wait_p99": "requests_queue_wait_p99", "as_failed": "requests_failed",
           "as_rejected": "requests_rejected_total", "as_reassigned": "reassignments_any",
           "as_reconfigures": "reconfigures_rank"}
#: column groups, each printed as a table of its own (so each stays narrow)
GROUPS = ("availability", "recovery", "rollouts", "ranks", "contiguity", "contiguity_s", "tiers", "requests", "queue",
          "streams", "batches", "models", "routing", "proxies", "autoscaling", "groups")
#: the groups of the request queue (shown only for a scenario with ``traffic:``; streams: with ``stream:``)
TRAFFIC_GROUPS = ("requests", "queue", "streams", "batches", "models", "routing")
#: the groups a sweep prints when ``--columns`` is not given (every figure is in the JSON and CSV), and
#: ``TRAFFIC_GROUPS`` too when its runs had traffic (``traffic_figures``)
DEFAULT_GROUPS = ("availability", "recovery", "ranks", "contiguity")


def select_figures(spec: str | None) -> list[Figure]:
    """The figures ``--columns`` names: comma-separated groups (``ranks``), figure
    keys (``reconfigures_rank``) or ``all``; None: the default groups. Raises
    ValueError naming an unknown name and listing the valid ones."""
    if spec is None:
        return [f for f in FIGURES if f.group in DEFAULT_GROUPS]
    keys = {f.key for f in FIGURES}
    chosen: list[Figure] = []
    for name in (n.strip() for n in spec.split(",")):
        if name == "all":
            picked = list(FIGURES)
        elif name in GROUPS:
            picked = [f for f in FIGURES if f.group == name]
        elif name in keys:
            picked = [f for f in FIGURES if f.key == name]
        else:
            raise ValueError(f"unknown column {name!r}: give 'all', a group ({', '.join(GROUPS)}) "
                             f"or a figure ({', '.join(sorted(keys))})")
        chosen += [f for f in picked if f not in chosen]
    return chosen


def traffic_figures(records: Sequence[RunRecord]) -> list[Figure]:
    """The request queue's figures (``TRAFFIC_GROUPS``) if any run had traffic (streams': if any
    had streams), else none."""
    queues = [m.get("requests") or {} for r in records for m in r.metrics["deployments"].values()]
    groups = {"requests", "queue"} if any(queues) else set()
    groups |= {"streams"} if any("streams_started" in q for q in queues) else set()
    groups |= {"batches"} if any("batches" in q for q in queues) else set()
    groups |= {"models"} if any("model_loads" in q for q in queues) else set()
    groups |= {"routing"} if any("replica_imbalance" in q for q in queues) else set()
    return [f for f in FIGURES if f.group in groups]


def group_figures(records: Sequence[RunRecord]) -> list[Figure]:
    """The collective groups' figures if any run formed a group (``collective_group``), else none."""
    if any(m.get("group_reforms") for r in records for m in r.metrics["deployments"].values()):
        return [f for f in FIGURES if f.group == "groups"]
    return []


def rollout_figures(records: Sequence[RunRecord]) -> list[Figure]:
    """The rollouts group's figures if any run replaced a replica by a rollout, else none."""
    if any(m.get("rollout_replacements") for r in records for m in r.metrics["deployments"].values()):
        return [f for f in FIGURES if f.group == "rollouts"]
    return []


def proxy_figures(records: Sequence[RunRecord]) -> list[Figure]:
    """The proxies group's figures if any run modelled proxies (``proxies:``), else none."""
    if any(r.metrics.get("proxies") for r in records):
        return [f for f in FIGURES if f.group == "proxies"]
    return []


def autoscaling_figures(records: Sequence[RunRecord]) -> list[Figure]:
    """The autoscaling group's figures if any run had an autoscaled deployment, else none."""
    if any(m.get("autoscaling") for r in records for m in r.metrics["deployments"].values()):
        return [f for f in FIGURES if f.group == "autoscaling"]
    return []


#: figure key prefix -> the section of a deployment's metrics it reads: rank changes, the request
#: queue's figures (``traffic:``), what the autoscaler did (executors/sim/autoscale.py)
_SECTIONS = (("reassignments_", "reassignments"), ("reconfigures_", "reconfigures"), ("requests_", "requests"),
             ("autoscaling_", "autoscaling"))


def figure_value(d: dict, key: str) -> float | None:
    """A figure of one run's deployment metrics (``metrics.DeploymentMetrics.as_dict``)."""
    key = ALIASES.get(key, key)
    for prefix, field in _SECTIONS:
        if key.startswith(prefix):
            v = (d.get(field) or {}).get(key[len(prefix):])
            return None if v is None else float(v)
    if key.startswith("noncontig_s_"):  # seconds: the fraction of the observed time (after start-up)
        frac = (d.get("noncontiguous_fraction") or {}).get(key[len("noncontig_s_"):])
        return None if frac is None else frac * float(d.get("observed_seconds") or 0.0)
    if key.startswith("noncontig_"):
        return (d.get("noncontiguous_fraction") or {}).get(key[len("noncontig_"):])
    v = d.get(key)
    return None if v is None else float(v)


def _interval(values: list[float]) -> dict:
    """Mean, min, max and a 95% interval of the mean (normal approximation; None for one value)."""
    if not values:
        return {"mean": None, "min": None, "max": None, "ci95": None, "n": 0}
    mean = statistics.fmean(values)
    half = 1.96 * statistics.stdev(values) / math.sqrt(len(values)) if len(values) > 1 else None
    return {"mean": mean, "min": min(values), "max": max(values),
            "ci95": None if half is None else [mean - half, mean + half], "n": len(values)}


def summarise(records: Sequence[RunRecord]) -> list[dict]:
    """Per variant and deployment: every figure's mean / min / max / 95% interval,
    and how many runs met each expectation."""
    by_variant: dict[str, list[RunRecord]] = {}
    for r in records:
        by_variant.setdefault(json.dumps(r.variant, sort_keys=True, default=str), []).append(r)
    rows = []
    for runs in by_variant.values():
        deps = sorted({d for r in runs for d in r.metrics["deployments"]})
        met: dict[str, list[int]] = {}
        for r in runs:
            for e in r.expectations:
                k = met.setdefault(e["name"], [0, 0])
                k[0] += e["passed"]
                k[1] += 1
        for d in deps:
            figures = {f.key: _interval([v for r in runs
                                         if (v := figure_value(r.metrics["deployments"].get(d, {}), f.key)) is not None])
                       for f in FIGURES}
            rows.append({"variant": runs[0].variant, "deployment": d, "runs": len(runs),
                         "seeds": [r.seed for r in runs], "figures": figures,
                         "runs_meeting_every_expectation": sum(r.passed for r in runs),
                         "expectations_met": {k: f"{a}/{b}" for k, (a, b) in met.items()},
                         "wall_s": round(sum(r.wall for r in runs), 4)})
    return rows


def to_json(records: Sequence[RunRecord], invalid: Sequence[InvalidVariant] = ()) -> str:
    return json.dumps({"runs": [r.as_dict() for r in records], "summary": summarise(records),
                       "invalid_variants": [{"variant": i.variant, "error": i.error} for i in invalid]},
                      indent=1, default=str)


def to_csv(records: Sequence[RunRecord]) -> str:
    """One row per run and deployment, every summarised figure a column."""
    keys = sorted({k for r in records for k in r.variant})
    buf = io.StringIO()
    w = csv.writer(buf)
    w.writerow([*keys, "seed", "deployment", *(f.key for f in FIGURES), "passed", "events", "wall_s"])
    for r in records:
        for d, m in sorted(r.metrics["deployments"].items()):
            w.writerow([*(r.variant.get(k, "") for k in keys), r.seed, d,
                        *("" if (v := figure_value(m, f.key)) is None else v for f in FIGURES),
                        r.passed, r.events, round(r.wall, 4)])
    return buf.getvalue()


def tables(records: Sequence[RunRecord], name: str, figures: Sequence[Figure] | None = None) -> list[Any]:
    """The sweep's summary as rich tables, one per group of ``figures`` (default:
    ``select_figures(None)``): per variant and deployment, each figure's mean and
    min-max over the seeds; the first table also counts the runs that met every
    expectation. One wide table of every figure would be over 300 columns."""
    from rich.table import Table

    figures = list(figures) if figures is not None else select_figures(None)
    rows = summarise(records)
    keys = list(rows[0]["variant"].keys()) if rows else []
    groups = [g for g in GROUPS if any(f.group == g for f in figures)]
    out = []
    for n, group in enumerate(groups):
        t = Table(title=f"what-if: {name}: {group}  [dim](mean, min-max over the seeds)[/dim]")
        cols = [f for f in figures if f.group == group]
        for k in keys:
            t.add_column(k, justify="right")
        for col in ("deployment", "runs", *(f.title for f in cols), *(("met every\nexpectation",) if n == 0 else ())):
            t.add_column(col, justify="right")
        for row in rows:
            cells = []
            for f in cols:
                v = row["figures"][f.key]
                cells.append("-" if v["mean"] is None else f"{v['mean']:.{f.digits}f}" + (
                    "" if v["n"] < 2 else f"\n{v['min']:.{f.digits}f}-{v['max']:.{f.digits}f}"))
            met = (f"{row['runs_meeting_every_expectation']}/{row['runs']}",) if n == 0 else ()
            t.add_row(*[str(row["variant"][k]) for k in keys], row["deployment"], str(row["runs"]), *cells, *met)
        out.append(t)
    return out
