"""What a trace costs: size, the simulator's time with and without it, check-trace (issue 20).

Scenarios (``--only`` picks some):

* ``day1000``: examples/scenarios/day-of-churn-1000.yaml as written (1,000
  replicas, one virtual day, ~2,850 random crashes, 1000 -> 800 -> 1000, a
  config rollout).
* ``month64``: examples/scenarios/capacity-plan-64.yaml for 30 virtual days
  (``--set duration=2592000``): 64 replicas, crashes, node losses and repairs,
  a nightly 64 -> 32 -> 64.
* ``day10000``: the day of churn at 10,000 replicas on 1,280 nodes, generated
  from day1000 with overrides (``DAY10000``): 10x the replicas and so ~10x the
  crashes (one every ~3 s: the deployment is seldom healthy, so its
  ``wait_until_healthy`` lines may time out; the trace is what is measured).

For each: the best wall (and CPU) seconds of ``--repeats`` runs without a
trace and with a trace written to a file (the two alternate), their ratio,
the median and range of each traced run over the untraced run just before it, the trace's size and
records, and the wall seconds of ``check_trace_file`` over it (with its
verdict). Run it from the repository root:

    .venv/bin/python benchmarks/bench_trace.py                  # all three
    .venv/bin/python benchmarks/bench_trace.py --only day1000 --repeats 5
    .venv/bin/python /tmp/before/benchmarks/bench_trace.py --only day1000,month64   # a copy of an older tree

The machine's load matters (``uptime`` is printed first): other processes
sharing the cores slow every figure, so compare ratios taken in one run.
"""

from __future__ import annotations

import argparse
import os
import tempfile
import time
from collections import Counter
from pathlib import Path
from typing import Any

from common import ROOT, use_this_tree

use_this_tree()

from executors.checktrace import check_trace_file  # noqa: E402
from executors.scenarios import load_scenario  # noqa: E402
from executors.sim import Simulation  # noqa: E402

EXAMPLES = ROOT / "examples" / "scenarios"
#: day1000 at 10,000 replicas (the timeline's scales are items 2 and 4)
DAY10000 = {
    "name": "day of churn, 10000 replicas",
    "cluster.nodes": 1280,
    "deployments.llm.replicas": 10000,
    "timeline.2.scale.replicas": 8000,
    "timeline.4.scale.replicas": 10000,
    "expect": [{"world_size": {"deployment": "llm", "equals": 10000}}],
}
SCENARIOS = {
    "day1000": (EXAMPLES / "day-of-churn-1000.yaml", None),
    "month64": (EXAMPLES / "capacity-plan-64.yaml", {"duration": 2592000}),
    "day10000": (EXAMPLES / "day-of-churn-1000.yaml", DAY10000),
}


def _timed(fn: Any) -> tuple[float, float, Any]:
    w, c = time.perf_counter(), time.process_time()
    out = fn()
    return time.perf_counter() - w, time.process_time() - c, out


def bench(name: str, repeats: int, keep: Path | None) -> dict:
    path, overrides = SCENARIOS[name]
    sc = load_scenario(path, overrides)
    trace = (keep or Path(tempfile.mkdtemp(prefix="bench_trace_"))) / f"{name}.jsonl"
    plain, traced = [], []
    for _ in range(repeats):  # alternated, so a machine that slows down slows both alike
        plain.append(_timed(Simulation(sc).run)[:2])
        with open(trace, "w", encoding="utf-8") as fp:
            traced.append(_timed(Simulation(sc, trace=fp).run)[:2])
    pairs = sorted(t[0] / p[0] for p, t in zip(plain, traced))
    size = trace.stat().st_size
    kinds: Counter = Counter()
    with open(trace, "rb") as fp:
        for line in fp:
            kinds[line[9:line.index(b'"', 9)].decode()] += len(line)
    check_wall, _, report = _timed(lambda: check_trace_file(trace))
    if keep is None:
        trace.unlink()
        trace.parent.rmdir()
    return {"name": name, "scenario": sc.name, "plain": min(plain), "traced": min(traced), "bytes": size,
            "pairs": pairs,
            "kinds": kinds, "check": check_wall, "ok": report.ok, "steps": report.counts["steps"],
            "violations": report.violation_count}


def _median(xs: list[float]) -> float:
    n = len(xs)
    return xs[n // 2] if n % 2 else (xs[n // 2 - 1] + xs[n // 2]) / 2


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--only", default=",".join(SCENARIOS), help="comma-separated: %(default)s")
    ap.add_argument("--repeats", type=int, default=3, help="runs of each (the best is shown; default %(default)s)")
    ap.add_argument("--keep", type=Path, help="write the traces into this folder and keep them")
    args = ap.parse_args(argv)
    names = [n for n in args.only.split(",") if n]
    unknown = [n for n in names if n not in SCENARIOS]
    if unknown:
        ap.error(f"unknown scenario(s) {', '.join(unknown)} (known: {', '.join(SCENARIOS)})")
    if args.keep:
        args.keep.mkdir(parents=True, exist_ok=True)
    print(f"load: {os.getloadavg()[0]:.2f} {os.getloadavg()[1]:.2f} {os.getloadavg()[2]:.2f} "
          f"({os.cpu_count()} CPUs); repeats {args.repeats} (untraced and traced runs alternate), best shown;\n"
          "ratio: best traced / best untraced; pairs: each traced run / the untraced run before it")
    print(f"{'scenario':<10} {'steps':>8} {'untraced s':>11} {'traced s':>9} {'ratio':>6} {'cpu ratio':>9} {'pairs: median (range)':>22} "
          f"{'trace MB':>9} {'check s':>8}  check-trace")
    for name in names:
        r = bench(name, args.repeats, args.keep)
        (pw, pc), (tw, tc) = r["plain"], r["traced"]
        verdict = "OK" if r["ok"] else f"FAILED ({r['violations']} violations)"
        print(f"{name:<10} {r['steps']:>8,} {pw:>11.3f} {tw:>9.3f} {tw / pw:>5.2f}x {tc / pc:>8.2f}x "
              f"{_median(r['pairs']):>8.2f}x ({r['pairs'][0]:.2f}-{r['pairs'][-1]:.2f}x) "
              f"{r['bytes'] / 1e6:>9.1f} {r['check']:>8.2f}  {verdict}")
        parts = ", ".join(f"{k} {v / 1e6:.1f}" for k, v in r["kinds"].most_common() if v >= 50_000)
        print(f"{'':<10} MB by record kind: {parts}")
    print(f"load after: {os.getloadavg()[0]:.2f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
