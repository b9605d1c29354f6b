"""What the cyclic garbage collector costs an embedder who steps ``rankcore.step`` directly.

Issue 19, bug 9: with the collector on and no ``gc.collect()``/``gc.freeze()``
by the caller, steady churn cost 2.0x per cycle at 100,000 replicas against
1,000, and a window right after a 100,000-replica bulk deploy 16x. Found
here: a loop holding only its current state frees as many tracked objects
as it allocates, so no collection runs at all; those figures come back
when an old state is held (``pinned``), see docs/benchmarks.md.

What it measures
----------------
Each measurement runs in a fresh Python process (``--child``), so the
collector starts from an empty old generation and one run's garbage does not
bill the next, as in an embedder's controller process. In that process:

1. build: ``DeploymentApplied`` of N replicas (no node joined: the loop
   places them itself, eight per node), then every replica is placed
   (``ReplicaPlaced``) and becomes ready (``ReplicaReady``), start order.
   The bulk deploy is timed too (``build``).
2. window: right after the deployment is healthy, ``--window`` churn cycles,
   timed as one loop: a replica drawn at random (seeded; draws made before
   timing) crashes (``ReplicaCrashed``), its replacement is placed on the
   same node (``ReplicaPlaced``) and becomes ready (``ReplicaReady``).
3. steady: ``--steady`` more cycles, timed as one loop. Long enough that
   the collector's generation-2 passes (due once a quarter of the old
   generation's size has survived into it anew) happen in it, so the
   per-cycle figure carries their amortised cost.

No ``gc.collect()`` anywhere before or between the timed loops (only after
them, to count the tracked objects). Per-cycle cost = loop wall time /
cycles; the collections per generation and the time spent in them come from
``gc.callbacks``. Ratios are N=100,000 over N=1,000 (the sizes' last over
first), for the window and for the steady loop.

Patterns (``--patterns``, default both): ``current``, the loop holds the
current state only (as docs/embedding.md says); ``pinned``, it also holds the
state the bulk deploy ended with (a variable nobody reads again), which keeps
every later ``RankTable`` version alive (docs/embedding.md, "Keeping state").

Modes (``--modes``, default ``on,off,freeze``):

* ``on``: the collector as Python starts it (thresholds 700, 10, 10): what
  the bug reports.
* ``off``: ``gc.disable()`` at start: the floor (what the core's own work
  costs as N grows).
* ``freeze``: the recipe of docs/embedding.md, "The garbage collector":
  right after the bulk deploy, ``gc.collect()`` and ``gc.freeze()`` (what
  ``executors.driver.Driver`` does after a step that changed the replica
  count a lot; counted in ``build``).
* ``threshold`` (not in the default run): the collector on, ``gc.set_threshold(50_000, 20, 100)``
  set at start (fewer young collections, so short-lived records die before
  they are promoted).

Tracked objects per replica: with the state of N alive, after the timed
loops, ``gc.collect()`` (which untracks tuples and dicts of atomic values,
as any collection would) and ``len(gc.get_objects())`` (plus
``gc.get_freeze_count()``) less the same count before the state was built,
divided by N; and the histogram by type.

How to run
----------
    .venv/bin/python benchmarks/bench_gc.py                      # ~45 s (--repeats 3: ~2.3 min)
    .venv/bin/python benchmarks/bench_gc.py --sizes 1000,20000 --modes on,off --patterns pinned
    .venv/bin/python benchmarks/bench_gc.py --histogram          # tracked objects by type at each size
"""

from __future__ import annotations

import argparse
import collections
import gc
import json
import platform
import random
import subprocess
import sys
import time
from pathlib import Path

from common import use_this_tree

use_this_tree()

from bench_sim import _GcMeter  # noqa: E402 (bench_sim's collector meter: one copy)

import rankcore as rc  # noqa: E402

MODES = ("on", "off", "freeze", "threshold")
PER_NODE = 8


def _check(cond: bool, msg: str) -> None:
    if not cond:  # explicit raise: ``python -O`` keeps the checks
        raise AssertionError(msg)


def _tracked() -> int:
    return len(gc.get_objects()) + gc.get_freeze_count()


def _build(n: int) -> tuple[rc.State, list[str], dict[str, str]]:
    """N replicas, healthy, through ``rankcore.step`` as an embedder brings a
    bulk deploy up; returns the state, live ids by global rank, and nodes."""
    step = rc.step
    nodes = max(1, n // PER_NODE)
    result = step(rc.State(), rc.DeploymentApplied(
        name="llm", num_replicas=n, user_config={"model": "v1"},
        has_reconfigure=True, reconfigure_takes_rank=True))
    state = result.state
    starts = [c.replica_id for c in result.commands if type(c) is rc.StartReplica]
    del result
    _check(len(starts) == n, f"expected {n} StartReplica, got {len(starts)}")
    where = {rid: f"node-{i % nodes}" for i, rid in enumerate(starts)}
    for rid in starts:
        state = step(state, rc.ReplicaPlaced(replica_id=rid, node_id=where[rid])).state
        state = step(state, rc.ReplicaReady(replica_id=rid)).state
    dep = state.deployments["llm"]
    _check(dep.healthy and dep.ranks.is_contiguous(), "the bulk deploy did not end healthy and contiguous")
    live = sorted(dep.replicas.keys(), key=lambda r: dep.ranks.global_rank(r))
    return state, live, where


def _churn(box: list[rc.State], live: list[str], where: dict[str, str], picks: list[int],
           log: collections.deque | None = None) -> None:
    """crash -> replacement placed on the same node -> ready, once per pick.

    The state travels in ``box`` (its one reference): a caller that held the
    state it started from would keep every later ``RankTable`` version alive
    until the loop ends (docs/embedding.md, "Keeping state"), and the
    collector would scan them all. ``log``: each step's (event, commands) appended (a bounded deque:
    a controller's log or trace buffer, as bench_sim's (e) keeps)."""
    step = rc.step
    state = box.pop()
    Crashed, Placed, Ready, Start = rc.ReplicaCrashed, rc.ReplicaPlaced, rc.ReplicaReady, rc.StartReplica
    for i in picks:
        old = live[i]
        e = Crashed(replica_id=old, reason="bench")
        result = step(state, e)
        new = next(c for c in result.commands if type(c) is Start).replica_id
        node = where.pop(old)
        where[new] = node
        live[i] = new
        if log is None:
            state = step(result.state, Placed(replica_id=new, node_id=node)).state
            state = step(state, Ready(replica_id=new)).state
            continue
        log.append((e, result.commands))
        for e in (Placed(replica_id=new, node_id=node), Ready(replica_id=new)):
            result = step(result.state, e)
            log.append((e, result.commands))
        state = result.state
    box.append(state)


def child(n: int, mode: str, window: int, steady: int, seed: int, histogram: bool, pin: bool = False,
          keep: int = 0) -> dict:
    """One measurement, in this (fresh) process. ``pin``: hold the state the
    bulk deploy ended with through the timed loops (a forgotten variable).
    ``keep``: hold the last ``keep`` (event, commands) pairs (a log; 0: none)."""
    if mode == "off":
        gc.disable()
    elif mode == "threshold":
        gc.set_threshold(50_000, 20, 100)
    rng = random.Random(seed)
    picks = [rng.randrange(n) for _ in range(window + steady)]
    meter = _GcMeter()
    base = _tracked()
    clock = time.perf_counter
    gc.callbacks.append(meter)
    t0 = clock()
    state, live, where = _build(n)
    if mode == "freeze":  # the recipe, as executors.driver.Driver does it after a big change
        gc.collect()
        gc.freeze()
    build = clock() - t0
    build_gc = meter.take()
    box = [state]
    pinned = state if pin else None
    del state
    t0 = clock()
    log = collections.deque(maxlen=keep) if keep else None
    _churn(box, live, where, picks[:window], log)
    window_s = clock() - t0
    window_gc = meter.take()
    t0 = clock()
    _churn(box, live, where, picks[window:], log)
    steady_s = clock() - t0
    steady_gc = meter.take()
    gc.callbacks.remove(meter)
    del pinned
    dep = box[0].deployments["llm"]
    _check(dep.healthy and dep.ranks.is_contiguous(), "churn did not end healthy and contiguous")
    _check(all(dep.ranks.global_rank(live[i]) == i for i in range(0, n, max(1, n // 1000))),
           "a replacement did not inherit its predecessor's global rank")
    gc.enable()
    gc.unfreeze()
    gc.collect()
    tracked = _tracked() - base
    hist: dict[str, int] = {}
    if histogram:
        counts = collections.Counter(type(o).__name__ for o in gc.get_objects())
        hist = {k: v for k, v in counts.most_common(8)}
    return {"n": n, "mode": mode, "build_s": build, "window_us": window_s / max(1, window) * 1e6,
            "steady_us": steady_s / max(1, steady) * 1e6, "gc": {"build": build_gc, "window": window_gc,
                                                                  "steady": steady_gc},
            "tracked_per_replica": tracked / n, "histogram": hist}


def _run_child(n: int, mode: str, pin: bool, args: argparse.Namespace) -> dict:
    cmd = [sys.executable, __file__, "--child", f"{n},{mode}", "--window", str(args.window),
           "--steady", str(args.steady), "--seed", str(args.seed)] + (["--histogram"] if args.histogram else []) + (
        ["--pin"] if pin else [])
    out = subprocess.run(cmd, check=True, capture_output=True, text=True)
    return json.loads(out.stdout)


def _gc_cell(g: dict) -> str:
    return " ".join(f"{c}/{s * 1e3:.0f}ms" for c, s in zip(g["count"], g["seconds"]))


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--sizes", default="1000,100000", help="comma-separated replica counts (default 1000,100000)")
    p.add_argument("--modes", default="on,off,freeze", help=f"comma-separated, of {', '.join(MODES)}")
    p.add_argument("--window", type=int, default=500, help="cycles right after the bulk deploy (default 500)")
    p.add_argument("--steady", type=int, default=30_000, help="cycles after the window (default 30,000)")
    p.add_argument("--repeats", type=int, default=1, help="runs per (size, mode); the median is printed")
    p.add_argument("--seed", type=int, default=7)
    p.add_argument("--histogram", action="store_true", help="print the tracked objects by type")
    p.add_argument("--json", type=Path, help="write every run's figures here")
    p.add_argument("--patterns", default="current,pinned",
                   help="current: the loop holds the current state only; pinned: it also holds the state the "
                        "bulk deploy ended with (default both)")
    p.add_argument("--pin", action="store_true", help=argparse.SUPPRESS)
    p.add_argument("--child", help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.child:
        n, mode = args.child.split(",")
        print(json.dumps(child(int(n), mode, args.window, args.steady, args.seed, args.histogram, args.pin)))
        return 0
    sizes = [int(s) for s in args.sizes.split(",")]
    modes = [m for m in args.modes.split(",") if m]
    bad = [m for m in modes if m not in MODES]
    if bad:
        p.error(f"unknown mode(s) {', '.join(bad)} (known: {', '.join(MODES)})")
    print(f"# bench_gc: rankcore {rc.__version__}; Python {platform.python_version()} ({platform.machine()}); "
          f"gc thresholds at start {gc.get_threshold()}; window {args.window:,} cycles, steady {args.steady:,}; "
          f"seed {args.seed}; one fresh process per run; median of {args.repeats}")
    patterns = [x for x in args.patterns.split(",") if x]
    if any(x not in ("current", "pinned") for x in patterns):
        p.error("--patterns takes current and/or pinned")
    cells = [(m, x) for x in patterns for m in modes]
    runs: dict[tuple[int, str, str], list[dict]] = {}
    for k in range(args.repeats):  # interleaved: a noisy neighbour hits every cell alike
        for mode, pat in cells:
            for n in sizes:
                print(f"[bench_gc] N={n:,} mode={mode} {pat} run {k + 1}/{args.repeats} ...",
                      file=sys.stderr, flush=True)
                runs.setdefault((n, mode, pat), []).append(_run_child(n, mode, pat == "pinned", args))
    med: dict[tuple[int, str, str], dict] = {}
    for key, rs in runs.items():
        rs = sorted(rs, key=lambda x: x["steady_us"])
        med[key] = dict(rs[len(rs) // 2])
        med[key]["window_us"] = sorted(x["window_us"] for x in rs)[len(rs) // 2]
    lo, hi = sizes[0], sizes[-1]
    label = f"{hi // 1000}k/{lo // 1000}k" if lo >= 1000 else f"{hi}/{lo}"
    print(f"\n  {'mode':<18}{'N':>9}{'build s':>9}{'window us/cycle':>17}{'steady us/cycle':>17}"
          f"{'tracked/replica':>17}   collections gen0/1/2 (count/time): window | steady")
    for mode, pat in cells:
        name = f"{mode}, {pat}"
        for n in sizes:
            r = med[(n, mode, pat)]
            print(f"  {name:<18}{n:>9,}{r['build_s']:>9.2f}{r['window_us']:>17.1f}{r['steady_us']:>17.1f}"
                  f"{r['tracked_per_replica']:>17.2f}   {_gc_cell(r['gc']['window'])} | {_gc_cell(r['gc']['steady'])}")
        if len(sizes) > 1:
            a, b = med[(lo, mode, pat)], med[(hi, mode, pat)]
            print(f"  {name:<18}{label:>9}{'':>9}{b['window_us'] / a['window_us']:>16.2f}x"
                  f"{b['steady_us'] / a['steady_us']:>16.2f}x")
    if args.histogram:
        for n in sizes:
            r = med[(n, modes[0], patterns[0])]
            print(f"\n  tracked objects by type, N={n:,} (whole process, after gc.collect()):")
            for name, count in r["histogram"].items():
                print(f"    {name:<28}{count:>10,}{count / n:>8.3f} per replica")
    if args.json:
        args.json.write_text(json.dumps({f"{n},{m},{x}": v for (n, m, x), v in runs.items()}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
