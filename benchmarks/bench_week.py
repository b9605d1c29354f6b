"""A simulated week of churn at 1,000 replicas, checked, with its wall time and peak memory (issue 40).

What it measures
----------------
``examples/scenarios/week-of-churn-1000.yaml`` (one virtual day as written: 1,000 replicas at the
daily peak over three deployments, traffic on each, random crashes, random node losses and their
repairs, two controller crashes, an autoscaled model whose daily load makes it evict another
model and give the room back, a rollout of a new version) run for one day and for ``--days``
days (default 7), each in a fresh child Python process, so that its peak RSS is that run's own
(the child's VmHWM, ``ru_maxrss`` where /proc is missing: from its start, the interpreter and the
imports included). Each run
writes its trace to a file in a temporary folder (removed at the end), and ``rankcore
check-trace`` reads it back in a process of its own (exit 0 required: the run counts as failed
otherwise). Printed per run: the simulated span, the core events stepped (``RunResult.events``,
each a ``rankcore.step``), the requests submitted, wall seconds, events per wall second, peak
RSS, the trace's size, what happened (crashes, node losses, controller crashes, evictions,
autoscaler ups and downs, rollouts done), check-trace's summary, wall seconds and peak RSS; then
the week's peak RSS over the day's against the goal: within 10% (MET / NOT MET), memory that
does not grow with the simulated time. Exit status 1 when a check-trace or an expectation failed
or the goal was not met. (Before the simulator's request figures were bounded, ``_Sample`` in
executors/sim/traffic.py, every request's queue wait and latency stayed in lists: 72 MB for the
day, 104.5 MB for two days, ~88 bytes a request.)

Method
------
* The week is the file's day repeated (``scenario_text``): the timeline's entries from its first
  ``at:`` on are the day's, copied for each day (``at`` moved by a day, each rollout's version one
  higher), ``duration`` set; the random faults and the ``daily`` arrivals repeat by themselves.
  ``scenario_text(day_s=3600)`` squeezes a day into an hour (times of day, fault rates and repair
  times scaled; latencies, delays and request rates not): the test (tests/integration/
  test_week_churn.py) runs that through the same ``run_once`` and ``check_trace``.
* The runs are deterministic (the scenario's seed, ``--seed``): the same figures each time, up to
  the wall times.
* Wall seconds are the ``Simulation.run`` call alone (parsing the scenario is not timed); the
  trace goes to a file on disk as in ``rankcore simulate --trace``. Progress on stderr.
* One run each: the figures to compare are the RSS ratio (deterministic up to the allocator) and
  the rate; the wall times move with the machine's load (this one shares 2 cores).

How to run
----------
    .venv/bin/python benchmarks/bench_week.py                    # a day and a week: ~1.5 min here
    .venv/bin/python benchmarks/bench_week.py --days 2 --seed 3 --json week.json
    .venv/bin/python benchmarks/bench_week.py --replicas 2000    # the big deployment and its nodes scaled
"""

from __future__ import annotations

import argparse
import copy
import json
import math
import os
import platform
import re
import resource
import subprocess
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path
from typing import Any

import yaml
from common import ROOT, use_this_tree

use_this_tree()

from executors.scenarios import parse_scenario  # noqa: E402
from executors.sim import Simulation  # noqa: E402

TEMPLATE = ROOT / "examples" / "scenarios" / "week-of-churn-1000.yaml"
DAY_S = 86400.0
#: the goal: the week's peak RSS at most this much above the day's
RSS_GOAL = 1.10
#: the deployment ``--replicas`` resizes, and the node group its GPUs come from
BIG, BIG_NODES = "llm", "gpu"
#: what a run must have done (``happened``'s keys): a run that stopped injecting one fails the test
KINDS = ("random_crashes", "nodes_lost", "nodes_repaired", "controller_crashes", "evictions", "scale_ups",
         "scale_downs", "rollouts_done")


# ----------------------------------------------------------------- the scenario
def _scale_latency(value: Any, k: float) -> Any:
    """A latency of the scenario format (a number, or a distribution) ``k`` times as long."""
    if isinstance(value, (int, float)):
        return value * k
    return {key: v * k if key in ("value", "low", "high", "mean", "stddev", "median") else v
            for key, v in value.items()}


def _next_version(version: str, days: int) -> str:
    m = re.fullmatch(r"(.*?)(\d+)", version)
    return f"{m.group(1)}{int(m.group(2)) + days}" if m else f"{version}-{days}"


def scenario_text(days: int = 7, *, day_s: float = DAY_S, seed: int | None = None, replicas: int | None = None,
                  template: Path = TEMPLATE) -> str:
    """The template (a day) as a run of ``days`` days of ``day_s`` virtual seconds each, as YAML.

    The timeline's entries up to its first ``at:`` run once (the deploys); the rest are the day's
    and are repeated, each day's ``at`` (and ``after``) one day later, a ``rollout``'s version one
    higher a day (v2, v3, ...). ``day_s`` < 86,400 squeezes the day: times of day (``at``,
    ``after``, the ``daily`` arrivals' ``day_s``), fault rates and repair times scale; latencies,
    the autoscaler's delays and request rates do not. ``replicas``: the peak total, by resizing
    ``llm`` and its ``gpu`` nodes in proportion (the other deployments as written)."""
    data = yaml.safe_load(template.read_text())
    k = day_s / DAY_S
    data["duration"] = days * day_s
    if seed is not None:
        data["seed"] = seed
    timeline = data["timeline"]
    first = next((i for i, e in enumerate(timeline) if "at" in e), len(timeline))
    out = timeline[:first]
    for d in range(days):
        for entry in timeline[first:]:
            e = copy.deepcopy(entry)
            if "at" in e:
                e["at"] = (e["at"] + d * DAY_S) * k
            if "after" in e:
                e["after"] = e["after"] * k
            if "rollout" in e and d:
                e["rollout"]["version"] = _next_version(str(e["rollout"]["version"]), d)
            out.append(e)
    data["timeline"] = out
    faults = data.get("faults", {})
    for key in ("crash_rate_per_replica_hour", "node_loss_per_node_day", "node_loss_per_cluster_day"):
        if key in faults:
            faults[key] = faults[key] / k
    if "node_mtbf_hours" in faults:
        faults["node_mtbf_hours"] = faults["node_mtbf_hours"] * k
    if "node_repair" in faults:
        faults["node_repair"] = _scale_latency(faults["node_repair"], k)
    if k != 1:
        for spec in data.get("traffic", {}).values():
            if spec["arrivals"].get("kind") == "daily":
                spec["arrivals"]["day_s"] = spec["arrivals"].get("day_s", DAY_S) * k
    if replicas is not None:
        deps = data["deployments"]
        others = sum(d.get("max_replicas", 1) if d.get("autoscaling") else d.get("replicas", 1)
                     for name, d in deps.items() if name != BIG)
        big = replicas - others
        if big < 1:
            raise ValueError(f"--replicas {replicas}: the other deployments take {others} at their peak")
        group = next(n for n in data["cluster"]["nodes"] if n["name"] == BIG_NODES)
        group["count"] = math.ceil(big * group["count"] / deps[BIG]["replicas"])
        deps[BIG]["replicas"] = big
    return yaml.safe_dump(data, sort_keys=False)


# ---------------------------------------------------------------------- a run
def _peak_rss_mb() -> float:
    """This process's peak resident memory (VmHWM; ``ru_maxrss`` where /proc is missing), in MB."""
    try:
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith("VmHWM:"):
                    return int(line.split()[1]) / 1024
    except OSError:
        pass
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def run_once(days: int, trace_path: str | os.PathLike[str], *, day_s: float = DAY_S, seed: int | None = None,
             replicas: int | None = None, progress: bool = False) -> dict:
    """Simulate ``scenario_text(days, ...)`` here, its trace to ``trace_path``: what it did and cost."""
    text = scenario_text(days, day_s=day_s, seed=seed, replicas=replicas)
    sc = parse_scenario(text, str(TEMPLATE))
    label = f"{days} day{'s' if days != 1 else ''}"
    last = [time.perf_counter()]
    t_start = last[0]

    def report(now: float, duration: float | None) -> None:
        wall = time.perf_counter()
        if wall - last[0] >= 10:
            last[0] = wall
            print(f"[bench_week] {label}: t={now / day_s:.2f} of {days} days ({100 * now / (duration or 1):.0f}%), "
                  f"{wall - t_start:.0f} s", file=sys.stderr, flush=True)

    faults: Counter = Counter()
    with open(trace_path, "w") as fp:
        sim = Simulation(sc, trace=fp, progress=report if progress else None)
        assert sim.trace is not None
        write_fault = sim.trace.fault

        def fault(t: float, type_: str, **fields: Any) -> None:  # (counted on the way to the trace)
            faults[type_, bool(fields.get("random") or fields.get("repaired"))] += 1
            write_fault(t, type_, **fields)

        sim.trace.fault = fault  # type: ignore[method-assign]
        t0 = time.perf_counter()
        result = sim.run()
        wall = time.perf_counter() - t0
    deps = result.metrics["deployments"]
    auto = [d["autoscaling"] for d in deps.values() if "autoscaling" in d]
    requests = [d["requests"] for d in deps.values() if "requests" in d]
    happened = {
        "random_crashes": faults["random_crash", False],
        "crashes": sum(d["crashes"] for d in deps.values()),
        "nodes_lost": faults["node_lost", True],
        "nodes_repaired": faults["node_added", True],
        "controller_crashes": faults["controller_crash", False],
        "evictions": sum(d["evictions"] for d in deps.values()),
        "warm_loads": sum(d["warm_loads"] for d in deps.values()),
        "scale_ups": sum(a["scale_ups"] for a in auto),
        "scale_downs": sum(a["scale_downs"] for a in auto),
        "rollouts_done": sum(d["rollouts_done"] for d in deps.values()),
        "requests": sum(q["submitted"] for q in requests),
        "requests_failed": sum(q["failed"] for q in requests),
        "requests_lost": sum(q["lost"] for q in requests),
    }
    return {"days": days, "day_s": day_s, "span_s": result.end_time, "events": result.events, "wall_s": wall,
            "events_per_s": result.events / wall if wall > 0 else None, "peak_rss_mb": _peak_rss_mb(),
            "trace_bytes": os.path.getsize(trace_path), "happened": happened, "passed": result.passed,
            "failures": [f"{e.name}: {e.detail}" for e in result.failures]}


def check_trace(trace_path: str | os.PathLike[str]) -> dict:
    """``rankcore check-trace`` over the trace, in a process of its own: exit code, summary, cost."""
    exe = Path(sys.executable).with_name("rankcore")
    cmd = [str(exe)] if exe.exists() else [sys.executable, "-m", "executors.cli"]
    t0 = time.perf_counter()
    proc = subprocess.Popen([*cmd, "check-trace", str(trace_path)], stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True, env={**os.environ, "COLUMNS": "100000"},
                            cwd=ROOT)
    assert proc.stdout is not None
    output = proc.stdout.read()
    _, status, usage = os.wait4(proc.pid, 0)  # (its own peak RSS, not the largest child's so far)
    proc.returncode = os.waitstatus_to_exitcode(status)
    return {"rc": proc.returncode, "summary": " ".join(output.split()), "wall_s": time.perf_counter() - t0,
            "peak_rss_mb": usage.ru_maxrss / 1024}


# ------------------------------------------------------------------- parent
def _spawn(days: int, args: argparse.Namespace, trace: Path) -> dict:
    """``run_once`` in a fresh child process (its result as JSON on a file)."""
    out = trace.with_suffix(".json")
    cmd = [sys.executable, __file__, "--child", str(days), "--child-trace", str(trace), "--child-out", str(out)]
    if args.seed is not None:
        cmd += ["--seed", str(args.seed)]
    if args.replicas is not None:
        cmd += ["--replicas", str(args.replicas)]
    subprocess.run(cmd, check=True, stdout=sys.stderr)
    return json.loads(out.read_text())


def _mb(n: float) -> str:
    return f"{n / 1e6:,.1f} MB"


def _print_run(label: str, r: dict) -> None:
    h, c = r["happened"], r["check"]
    days = r["span_s"] / DAY_S
    print(f"{label}: {days:g} virtual day{'' if days == 1 else 's'} ({r['span_s']:,.0f} s)")
    print(f"  events stepped   {r['events']:>12,}   requests {h['requests']:,} (failed {h['requests_failed']:,}, "
          f"lost {h['requests_lost']})")
    print(f"  wall             {r['wall_s']:>12.1f} s   {r['events_per_s']:,.0f} events/s, "
          f"{h['requests'] / r['wall_s']:,.0f} requests/s")
    print(f"  peak RSS         {r['peak_rss_mb']:>12.1f} MB")
    print(f"  trace            {_mb(r['trace_bytes']):>15}")
    print(f"  happened         crashes {h['crashes']:,} ({h['random_crashes']:,} random), nodes lost "
          f"{h['nodes_lost']} / repaired {h['nodes_repaired']}, controller crashes {h['controller_crashes']}, "
          f"evictions {h['evictions']:,} (warm reloads {h['warm_loads']:,}), autoscaler {h['scale_ups']} up / "
          f"{h['scale_downs']} down, rollouts done {h['rollouts_done']}")
    print(f"  expectations     {'all met' if r['passed'] else 'FAILED: ' + '; '.join(r['failures'])}")
    print(f"  check-trace      exit {c['rc']} ({'OK' if c['rc'] == 0 else 'FAILED'}), {c['wall_s']:.1f} s wall, "
          f"peak RSS {c['peak_rss_mb']:.1f} MB")
    print(f"    {c['summary']}")


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--days", type=int, default=7, help="the long run's virtual days (default 7)")
    p.add_argument("--seed", type=int, help="the scenario's seed (default: the file's)")
    p.add_argument("--replicas", type=int, help="replicas at the daily peak (default: the file's 1,000)")
    p.add_argument("--json", metavar="FILE", help="write every figure here")
    p.add_argument("--child", type=int, help=argparse.SUPPRESS)
    p.add_argument("--child-trace", help=argparse.SUPPRESS)
    p.add_argument("--child-out", help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.days < 2:
        p.error("--days must be at least 2 (the day is the baseline)")
    if args.child is not None:
        res = run_once(args.child, args.child_trace, seed=args.seed, replicas=args.replicas, progress=True)
        Path(args.child_out).write_text(json.dumps(res))
        return 0
    print(f"# bench_week: {TEMPLATE.relative_to(ROOT)}, a day and {args.days} days, each in a fresh process "
          f"(seed {args.seed if args.seed is not None else 'of the file'}, replicas "
          f"{args.replicas or 'of the file'}); Python {platform.python_version()}; load average "
          f"{', '.join(f'{x:.2f}' for x in os.getloadavg())}")
    runs: dict[str, dict] = {}
    with tempfile.TemporaryDirectory(prefix="bench_week_") as tmp:
        for label, days in (("day", 1), ("week" if args.days == 7 else f"{args.days} days", args.days)):
            trace = Path(tmp) / f"{days}d.jsonl"
            print(f"[bench_week] {label}: simulating {days} virtual day(s) ...", file=sys.stderr, flush=True)
            r = _spawn(days, args, trace)
            print(f"[bench_week] {label}: check-trace over {_mb(r['trace_bytes'])} ...", file=sys.stderr, flush=True)
            r["check"] = check_trace(trace)
            trace.unlink()
            runs[label] = r
            _print_run(label, r)
    (day, week) = runs.values()
    ratio = week["peak_rss_mb"] / day["peak_rss_mb"]
    met = ratio <= RSS_GOAL
    print(f"peak RSS {week['peak_rss_mb']:.1f} / {day['peak_rss_mb']:.1f} MB = {ratio:.3f}x "
          f"(goal: within {RSS_GOAL - 1:.0%} of the day's): {'MET' if met else 'NOT MET'}")
    ok = all(r["check"]["rc"] == 0 and r["passed"] for r in runs.values())
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"config": {k: v for k, v in vars(args).items() if not k.startswith("child")},
                       "runs": runs, "rss_ratio": ratio, "rss_goal_met": met}, f, indent=1)
        print(f"wrote {args.json}", file=sys.stderr)
    return 0 if ok and met else 1


if __name__ == "__main__":
    sys.exit(main())
