"""Steady churn at fleet size, the collector on (issue 36), and an autoscaling metrics step by size.

(a) churn: for each N in ``--sizes`` (default 1,000 and 100,000), in a fresh
    Python process (the collector starts with an empty old generation, as in
    an embedder's controller): a bulk deploy of N replicas brought to healthy
    through ``rankcore.step`` (untimed), ``--window`` cycles right after it,
    then ``--cycles`` seeded cycles timed as one loop, each a replica drawn at
    random crashing (``ReplicaCrashed``), its replacement placed on the same
    node (``ReplicaPlaced``) and ready (``ReplicaReady``). The collector as
    Python starts it, nothing frozen or collected by the loop, which holds its
    current state only. The loop and the deploy are ``bench_gc.py``'s (one
    copy: its ``on, current`` cell). Printed: µs per cycle at each size, the
    ratio of the largest size over the smallest (issue 36's goal: <= 1.5x),
    and the collections per generation in the timed loop.
(b) metrics: for each N in ``--metrics-sizes`` (default 1,000 and 10,000) an
    autoscaled deployment of N healthy replicas (its load exactly its target,
    so no step scales it), then ``--metrics-steps`` ``AutoscalingMetrics``
    events (built before timing; one a second of virtual time), each step
    timed alone: µs per step (median of the steps). A step that changes no
    replica should cost the same at any N.
(a') the churn of (a) again, the loop holding the last ``--keep`` (event,
    commands) pairs (default 10,000), as a controller's log or trace buffer
    would: the collector then runs (young objects survive), as in a service.

Each size runs ``--repeats`` times (default 3), interleaved; the median is
printed. Runs the worktree's own ``rankcore`` (its root is put first on the
path), not whichever one the environment has installed.

    .venv/bin/python benchmarks/bench_churn.py                  # ~1 min on a quiet 2-core machine
    .venv/bin/python benchmarks/bench_churn.py --sizes 1000,20000 --cycles 5000 --only churn
"""

from __future__ import annotations

import argparse
import gc
import json
import platform
import statistics
import subprocess
import sys
import time
from pathlib import Path

from common import use_this_tree

use_this_tree()

from bench_gc import child as _gc_child  # noqa: E402 (bench_gc's deploy and churn loop: one copy)

import rankcore as rc  # noqa: E402


def churn(n: int, window: int, cycles: int, seed: int, keep: int = 0) -> dict:
    """(a) in this (fresh) process: bench_gc's ``on, current`` cell (``keep``: with a log of that many steps)."""
    r = _gc_child(n, "on", window, cycles, seed, histogram=False, keep=keep)
    return {"n": n, "us": r["steady_us"], "gc": r["gc"]["steady"]["count"], "gc_s": sum(r["gc"]["steady"]["seconds"])}


def metrics(n: int, steps: int) -> dict:
    """(b) in this (fresh) process: µs per AutoscalingMetrics step at N replicas."""
    step = rc.step
    target = 2  # AutoscalingOptions' target_ongoing_requests default: N replicas at 2 each want N
    state = step(rc.State(), rc.DeploymentApplied(name="m", num_replicas=n, autoscaling=True, min_replicas=1, initial_replicas=n,
                                                  max_replicas=n, target_ongoing_requests=target)).state
    dep = state.deployment("m")
    for i, rid in enumerate(sorted(dep.replicas)):
        state = step(state, rc.ReplicaPlaced(replica_id=rid, node_id=f"node-{i // 8}")).state
        state = step(state, rc.ReplicaReady(replica_id=rid)).state
    ongoing = tuple((rid, target) for rid in sorted(state.deployment("m").replicas))
    events = [rc.AutoscalingMetrics(deployment="m", now=float(t), ongoing=ongoing) for t in range(1, steps + 1)]
    clock = time.perf_counter
    times = []
    for e in events:
        t0 = clock()
        state = step(state, e).state
        times.append(clock() - t0)
    dep = state.deployment("m")
    if dep.target != n or not dep.healthy:
        raise AssertionError(f"the metrics scaled the deployment ({dep.target} wanted, {n} expected)")
    return {"n": n, "us": statistics.median(times) * 1e6}


def _run(kind: str, n: int, args: argparse.Namespace) -> dict:
    cmd = [sys.executable, __file__, "--child", f"{kind},{n}", "--window", str(args.window), "--cycles",
           str(args.cycles), "--seed", str(args.seed), "--metrics-steps", str(args.metrics_steps), "--keep",
           str(args.keep)]
    return json.loads(subprocess.run(cmd, check=True, capture_output=True, text=True).stdout)


def _ratio_label(lo: int, hi: int) -> str:
    return f"{hi // 1000}k/{lo // 1000}k" if lo >= 1000 else f"{hi}/{lo}"


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--sizes", default="1000,100000", help="replicas for (a), comma-separated (default 1000,100000)")
    p.add_argument("--cycles", type=int, default=20_000, help="timed churn cycles per size (default 20,000)")
    p.add_argument("--window", type=int, default=500, help="untimed cycles right after the deploy (default 500)")
    p.add_argument("--seed", type=int, default=7, help="seed of the churn choices (default 7)")
    p.add_argument("--metrics-sizes", default="1000,10000", help="replicas for (b) (default 1000,10000)")
    p.add_argument("--metrics-steps", type=int, default=2_000, help="AutoscalingMetrics steps per size (default 2,000)")
    p.add_argument("--repeats", type=int, default=3, help="fresh runs per size; the median is printed (default 3)")
    p.add_argument("--keep", type=int, default=10_000,
                   help="(a'): the churn again holding the last KEEP (event, commands) pairs, as a controller's log "
                        "would (default 10,000, as bench_sim's (e); 0: skip (a'))")
    p.add_argument("--only", choices=("churn", "log", "metrics"), help="run only (a), (a') or (b)")
    p.add_argument("--child", help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.child:
        kind, n = args.child.split(",")
        if kind == "metrics":
            out = metrics(int(n), args.metrics_steps)
        else:
            out = churn(int(n), args.window, args.cycles, args.seed, args.keep if kind == "log" else 0)
        print(json.dumps(out))
        return 0
    sizes = [int(s) for s in args.sizes.split(",")]
    parts = [("churn", sizes)] + ([("log", sizes)] if args.keep else []) + [
             ("metrics", [int(s) for s in args.metrics_sizes.split(",")])]
    parts = [(k, s) for k, s in parts if args.only in (None, k)]
    print(f"# bench_churn: rankcore from {Path(rc.__file__).parent}; Python {platform.python_version()}; "
          f"gc thresholds {gc.get_threshold()}; churn: {args.cycles:,} cycles after a {args.window}-cycle window, "
          f"seed {args.seed}; metrics: {args.metrics_steps:,} steps; median of {args.repeats} fresh runs")
    runs: dict[tuple[str, int], list[dict]] = {}
    for k in range(args.repeats):  # interleaved: a noisy neighbour hits every size alike
        for kind, sizes in parts:
            for n in sizes:
                print(f"[bench_churn] {kind} N={n:,} run {k + 1}/{args.repeats} ...", file=sys.stderr, flush=True)
                runs.setdefault((kind, n), []).append(_run(kind, n, args))
    for kind, sizes in parts:
        med = {}
        for n in sizes:
            rs = sorted(runs[(kind, n)], key=lambda r: r["us"])
            med[n] = rs[len(rs) // 2]
            spread = ", ".join(f"{r['us']:.1f}" for r in runs[(kind, n)])
            if kind != "metrics":
                g = med[n]
                print(f"  {kind:<7} N={n:>9,}  {g['us']:8.1f} us/cycle  (runs {spread})  collections gen0/1/2 "
                      f"{'/'.join(map(str, g['gc']))} ({g['gc_s'] * 1e3:.0f} ms)")
            else:
                print(f"  metrics N={n:>9,}  {med[n]['us']:8.1f} us/AutoscalingMetrics step  (runs {spread})")
        if len(sizes) > 1:
            lo, hi = sizes[0], sizes[-1]
            print(f"  {kind:<7} {_ratio_label(lo, hi):>11}  {med[hi]['us'] / med[lo]['us']:8.2f}x"
                  + ("" if kind == "metrics" else "  (goal <= 1.5x)"))
    return 0


if __name__ == "__main__":
    sys.exit(main())
