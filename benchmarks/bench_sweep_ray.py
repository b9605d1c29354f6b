"""A what-if sweep on local processes and fanned out as Ray tasks: runs per second against CPUs (issue 68).

What it measures
----------------
One sweep (default: ``examples/scenarios/traffic-bursts.yaml``, ``--set
traffic.chat.arrivals.burst_rate=30,40,...,100``: 8 variants, one seed each, ~1 s a run here)
through ``executors.sweep.run_sweep``, as ``rankcore simulate --set ...`` runs it:

* locally on one process (``jobs=1``) and on ``--cpus``' largest count of processes;
* on a fresh local Ray (``ray.init(address="local", num_cpus=N)``) for each N in ``--cpus``
  (default 1,2), each run a Ray task of one CPU (``run_sweep(on_ray=True)``, what ``rankcore
  simulate --address`` does): once with its workers starting (the first sweep on a new Ray starts
  a process a CPU and the simulator's imports in each), then ``--repeats`` times with them started.

Printed per way: CPUs, wall seconds (the median of ``--repeats`` sweeps, and their range), runs per
second (runs / median wall), and the speedup: against the same way on the fewest CPUs, and against
one local process. Wall seconds are the ``run_sweep`` call (the variants' loading included;
``ray.init`` and ``ray.shutdown`` not). The load average before and after is printed too.

Checks (exit 1 otherwise): every way writes the same figures as the one local process, the sweep's
JSON (``to_json``) and CSV (``to_csv``) text identical but for the wall-clock fields (each run's
and each summary row's ``wall_s``).

Method
------
* ``--repeats`` sweeps a way (default 1; the runs are deterministic: the scenario's seed), in the
  order above; the wall times move with what else the machine does (this one has 2 cores, shared
  with other sessions' tests), so a speedup below (or above) the CPUs' ratio is what it is: a Ray
  task costs a few ms to schedule, and two CPUs that share with other work give less than two.
* Ray: no dashboard, no log forwarding, no usage stats; ``PYTHONPATH`` names this checkout for
  the workers.

How to run
----------
    .venv/bin/python benchmarks/bench_sweep_ray.py               # 8 runs x 6 sweeps: ~1.5 min here
    .venv/bin/python benchmarks/bench_sweep_ray.py --repeats 3   # the medians of 3: ~3.5 min
    .venv/bin/python benchmarks/bench_sweep_ray.py --quick       # 4 runs, Ray on 2 CPUs only
    .venv/bin/python benchmarks/bench_sweep_ray.py --seeds 3 --cpus 1,2,4
    .venv/bin/python benchmarks/bench_sweep_ray.py --scenario examples/scenarios/capacity-plan-64.yaml \\
        --key cluster.nodes --values 8,9,10,11 --seeds 5
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import platform
import re
import statistics
import sys
import time
from pathlib import Path
from typing import Any

from common import ROOT, use_this_tree

use_this_tree()

from executors.sim import load_scenario  # noqa: E402
from executors.sweep import run_sweep, sweep_cpus, to_csv, to_json  # noqa: E402

DEFAULT_SCENARIO = ROOT / "examples" / "scenarios" / "traffic-bursts.yaml"
DEFAULT_KEY = "traffic.chat.arrivals.burst_rate"
DEFAULT_VALUES = "30,40,50,60,70,80,90,100"

_WALL = re.compile(r'"wall_s": [0-9.e+-]+')


def figures(records: list) -> tuple[str, str]:
    """The sweep's JSON and CSV text without their wall-clock fields (each run's and each summary
    row's ``wall_s``; the CSV's ``wall_s`` column): the figures that must not move."""
    rows = [line.split(",") for line in to_csv(records).splitlines()]
    col = rows[0].index("wall_s")
    return _WALL.sub('"wall_s": -', to_json(records)), "\n".join(",".join(r[:col] + r[col + 1:]) for r in rows)


def sweep(path: Path, variants: list[dict], seeds: list[int | None], **kw: Any) -> tuple[float, list]:
    t0 = time.perf_counter()
    records = run_sweep(path, variants, lambda v: seeds, **kw)
    return time.perf_counter() - t0, records


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--scenario", type=Path, default=DEFAULT_SCENARIO, help="the scenario file swept")
    ap.add_argument("--key", default=DEFAULT_KEY, help=f"the --set key (default {DEFAULT_KEY})")
    ap.add_argument("--values", default=DEFAULT_VALUES, help=f"its values, comma-separated (default {DEFAULT_VALUES})")
    ap.add_argument("--seeds", type=int, default=1, help="seeds per variant (default 1: the scenario's)")
    ap.add_argument("--cpus", default="1,2", help="the local Rays' CPU counts, comma-separated (default 1,2)")
    ap.add_argument("--repeats", type=int, default=1,
                    help="sweeps per way (Ray's first, its workers starting, once): the median printed (default 1)")
    ap.add_argument("--quick", action="store_true", help="the first 4 values, Ray on the largest --cpus only")
    ap.add_argument("--json", type=Path, help="also write the figures printed here")
    args = ap.parse_args(argv)

    import yaml

    values = [yaml.safe_load(v) for v in args.values.split(",")]
    cpus = sorted({int(c) for c in args.cpus.split(",")})
    if args.quick:
        values, cpus = values[:4], cpus[-1:]
    variants = [{args.key: v} for v in values]
    for v in variants:
        load_scenario(args.scenario, overrides=v)  # (a bad value: its error, before anything is timed)
    base = load_scenario(args.scenario).seed
    seeds: list[int | None] = [base + i for i in range(args.seeds)]
    runs = len(variants) * len(seeds)
    print(f"sweep: {args.scenario.name}, {args.key}={args.values if not args.quick else ','.join(map(str, values))}"
          f" x {len(seeds)} seed(s) = {runs} runs; {os.cpu_count()} CPUs here, Python {platform.python_version()}, "
          f"load average (1 min) {os.getloadavg()[0]:.2f}")

    rows: list[dict] = []
    same: dict[str, bool] = {}  # a way's label -> every sweep of it gave the reference's figures
    want: tuple[str, str] | None = None

    def way(name: str, label: str, repeats: int, **kw: Any) -> None:
        """``repeats`` sweeps one way: the median wall (and the range) printed, each one's figures
        checked against the first local sweep's."""
        nonlocal want
        walls = []
        for _ in range(repeats):
            wall, records = sweep(args.scenario, variants, seeds, **kw)
            walls.append(wall)
            if want is None:
                want = figures(records)
            else:
                key = f"{label}, {name.removeprefix('Ray, ')}" if label.startswith("Ray") else label
                same[key] = same.get(key, True) and figures(records) == want
        n = sweep_cpus(runs, kw.get("jobs"), on_ray=kw.get("on_ray", False))
        med = statistics.median(walls)
        rows.append({"way": name, "cpus": n, "wall_s": med, "walls": walls, "runs_per_s": runs / med, "runs": runs})
        spread = f"{min(walls):.2f}-{max(walls):.2f}" if len(walls) > 1 else ""
        print(f"  {name:<26}{n:>5}{med:>10.2f}{runs / med:>10.2f}  {spread}", flush=True)

    print(f"  {'way':<26}{'CPUs':>5}{'wall s':>10}{'runs/s':>10}  (median of {args.repeats}; range)")
    way("local processes", "local, 1 process", args.repeats, jobs=1)
    most = max(cpus)
    if most > 1:
        way("local processes", f"local, {most} processes", args.repeats, jobs=most)

    import ray

    os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
    os.environ.setdefault("RAY_AUTH_MODE", "disabled")
    os.environ["PYTHONPATH"] = os.pathsep.join(dict.fromkeys(filter(None, [
        str(ROOT), *os.environ.get("PYTHONPATH", "").split(os.pathsep)])))
    for n in cpus:
        ray.init(address="local", num_cpus=n, include_dashboard=False, log_to_driver=False, logging_level=logging.ERROR)
        try:
            way("Ray, workers starting", f"Ray on {n} CPU(s)", 1, on_ray=True)
            way("Ray, workers started", f"Ray on {n} CPU(s)", args.repeats, on_ray=True)
        finally:
            ray.shutdown()
    print(f"load average (1 min) at the end: {os.getloadavg()[0]:.2f}")

    print("speedup (runs/s over the same way on the fewest CPUs, and over one local process):")
    one = rows[0]["runs_per_s"]
    for r in rows[1:]:
        first = next(x for x in rows if x["way"] == r["way"])
        fewer = (f"x{r['runs_per_s'] / first['runs_per_s']:.2f} against {first['cpus']} CPU(s), "
                 if first is not r else "")
        print(f"  {r['way']:<28}{r['cpus']:>3} CPU(s): {fewer}x{r['runs_per_s'] / one:.2f} against one local process")
    ok = all(same.values())
    print("same figures (JSON and CSV but wall_s) as the first sweep on one local process:")
    for label, identical in same.items():
        print(f"  {label:<44}{'identical' if identical else 'DIFFERENT'}")
    if args.json:
        args.json.write_text(json.dumps({"runs": runs, "ways": rows, "same_figures": same}, indent=1))
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
