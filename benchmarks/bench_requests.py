"""Events per second through the request machine (``rankcore.requests``, issue 22).

A pool of R serving replicas (``max_ongoing_requests`` 5, no queue limit)
holds C outstanding requests per replica (C x R in all: with C > 5 the rest
wait in the queue). Each cycle answers the oldest request on a replica
(``Completed``, which dispatches the head of the queue into the freed slot)
and submits a new one (``Submit``, dispatched at once or queued): two events,
one request through. Printed per (R, C): events per second and microseconds
per request, for the machine alone (events built beforehand) and with the
event records built in the loop too (what an executor pays); ``--started``
adds a ``Started`` per request (three events).

    .venv/bin/python benchmarks/bench_requests.py            # 200,000 requests per row
    .venv/bin/python benchmarks/bench_requests.py --requests 50000 --started
"""

from __future__ import annotations

import argparse
import time
from collections import deque

import rankcore as rc
from rankcore.requests import Completed, Configure, Dispatch, RequestMachine, Started, Submit

D = "model"


def fill(m: RequestMachine, replicas: int, per_replica: int) -> deque[str]:
    m.handle(Configure(deployment=D))
    for i in range(replicas):
        m.handle(rc.PoolChanged(deployment=D, replica_id=f"{D}#{i}", membership="serving"))
    running: deque[str] = deque()
    for i in range(replicas * per_replica):
        for a in m.handle(Submit(request_id=f"w{i}", deployment=D)):
            if isinstance(a, Dispatch):
                running.append(a.request_id)
    return running


def run(replicas: int, per_replica: int, n: int, build: bool, started: bool) -> tuple[float, int]:
    """(seconds, events) for ``n`` requests through a warm pool."""
    m = RequestMachine(reports_started=started)
    running = fill(m, replicas, per_replica)
    ids = [f"r{i}" for i in range(n)]
    submits = [] if build else [Submit(request_id=r, deployment=D) for r in ids]
    done: dict[str, Completed] = {}
    starts: dict[str, Started] = {}
    if not build:  # every id that can be answered in the loop: the fill's and the loop's own
        for r in [*running, *[f"w{i}" for i in range(replicas * per_replica)], *ids]:
            done[r] = Completed(request_id=r)
            starts[r] = Started(request_id=r)
    handle, popleft, push = m.handle, running.popleft, running.append
    events = 0
    t0 = time.perf_counter()
    for i in range(n):
        rid = popleft()
        for a in handle(Completed(request_id=rid) if build else done[rid]):
            if type(a) is Dispatch:
                push(a.request_id)
                if started:
                    handle(Started(request_id=a.request_id) if build else starts[a.request_id])
                    events += 1
        for a in handle(Submit(request_id=ids[i], deployment=D) if build else submits[i]):
            if type(a) is Dispatch:
                push(a.request_id)
                if started:
                    handle(Started(request_id=a.request_id) if build else starts[a.request_id])
                    events += 1
        events += 2
    elapsed = time.perf_counter() - t0
    c = m.counters()
    if c.lost or c.answered != n or c.in_queue + c.in_flight != replicas * per_replica:
        raise SystemExit(f"bench_requests: the machine lost track: {c}")
    return elapsed, events


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--requests", type=int, default=200_000, help="requests through per row (default 200,000)")
    ap.add_argument("--started", action="store_true", help="report Started too (3 events per request)")
    args = ap.parse_args(argv)
    if args.requests < 1:
        ap.error("--requests must be at least 1")
    print(f"request machine: {args.requests:,} requests per row, max_ongoing_requests=5"
          f"{', Started reported' if args.started else ''}")
    print(f"{'replicas':>8} {'per replica':>11} {'queued':>7} | {'machine: events/s':>17} {'us/request':>10} |"
          f" {'+ records: events/s':>19} {'us/request':>10}")
    for replicas in (4, 100):
        for per in (1, 16, 64):
            t, ev = run(replicas, per, args.requests, build=False, started=args.started)
            tb, evb = run(replicas, per, args.requests, build=True, started=args.started)
            queued = max(0, per - 5) * replicas
            print(f"{replicas:>8} {per:>11} {queued:>7} | {ev / t:>17,.0f} {t / args.requests * 1e6:>10.2f} |"
                  f" {evb / tb:>19,.0f} {tb / args.requests * 1e6:>10.2f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
