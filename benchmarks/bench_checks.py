"""What ``rankcore.invariants.check_step`` costs (issue 8, point 11).

A deployment of N replicas (8 per node) is deployed from nothing through
``rankcore.step``, every command answered in-process (``rankcore.protocol.answers``),
three times: without checks, with ``check_step`` after every step (the default:
it checks what the step touched) and with ``check_step(..., full=True)`` (every
invariant over the whole state, what the property machines run). Prints the
wall time of each and the ratios to the unchecked run.

    .venv/bin/python benchmarks/bench_checks.py            # N = 1,000
    .venv/bin/python benchmarks/bench_checks.py 10000 --no-full
"""

from __future__ import annotations

import argparse
import time

import rankcore as rc
from rankcore.invariants import check_step
from rankcore.protocol import answers


def deploy(n: int, check: bool, full: bool = False) -> tuple[float, int]:
    state = rc.State()
    queue: list[object] = [rc.DeploymentApplied(name="llm", num_replicas=n)]
    nodes = [f"n{i}" for i in range(max(1, n // 8))]
    started = steps = 0
    t0 = time.perf_counter()
    while queue:
        event = queue.pop(0)
        result = rc.step(state, event)
        if check:
            check_step(state, event, result, full=full)
        state = result.state
        steps += 1
        for cmd in result.commands:
            node = ""
            if isinstance(cmd, rc.StartReplica):
                node = nodes[started % len(nodes)]
                started += 1
            queue.extend(answers(cmd, node))
    return time.perf_counter() - t0, steps


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("replicas", nargs="?", type=int, default=1000)
    ap.add_argument("--no-full", action="store_true", help="skip the full=True run (O(N) per step)")
    args = ap.parse_args(argv)
    if args.replicas < 1:
        ap.error("replicas must be at least 1")
    base, steps = deploy(args.replicas, check=False)
    print(f"deploy of {args.replicas:,} replicas: {steps:,} steps")
    print(f"  no checks                 {base:8.3f} s")
    inc, _ = deploy(args.replicas, check=True)
    print(f"  check_step (incremental)  {inc:8.3f} s  {inc / base:6.1f}x  {(inc - base) / steps * 1e6:8.1f} us/step")
    if not args.no_full:
        full, _ = deploy(args.replicas, check=True, full=True)
        print(f"  check_step(full=True)     {full:8.3f} s  {full / base:6.1f}x  {(full - base) / steps * 1e6:8.1f} us/step")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
