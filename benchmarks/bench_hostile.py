"""Hostile input on every surface (issue 40): how many events the campaign tried, and what
became of them: applied, or refused, by the error's class.

Runs the campaigns of ``tests/property/test_hostile_events.py`` (the same generators and
checks: the core fed valid events mixed with malformed, duplicated, reordered, stale and
extreme ones and things that are no event; the request machine, the batcher, the model cache
and ``route_model`` likewise) for a fixed number of examples each, deterministically (the
same ``--seed``, the same run), without shrinking, and prints the tally per campaign and in
all. A failed check is printed and makes the exit status 1.

    .venv/bin/python benchmarks/bench_hostile.py                    # 200 examples a campaign
    .venv/bin/python benchmarks/bench_hostile.py --examples 2000 --detail
    .venv/bin/python benchmarks/bench_hostile.py --only requests --examples 50

The headline, for docs/reliability.md: ``N events tried: X applied, Y refused by class (...)``
("valid": the events of the ordinary rules the hostile ones are mixed with; every other kind
is hostile: ``malformed`` built without the validators, ``duplicate``, ``reordered``,
``stale``, ``extreme``, ``not-an-event``, ``constructor``, ...). ``NastyError`` is a value of
the caller's own raising when compared (a ``user_config`` whose ``__eq__`` raises), not the core.
"""

from __future__ import annotations

import argparse
import sys
import time
import traceback
from collections import Counter
from typing import Any

from common import use_this_tree

use_this_tree()

import hypothesis.core  # noqa: E402
from hypothesis import HealthCheck, Phase, given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402
from hypothesis.stateful import run_state_machine_as_test  # noqa: E402

from tests.hostile import TALLY, Tally  # noqa: E402
from tests.property.test_hostile_events import CAMPAIGNS  # noqa: E402


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--examples", type=int, default=200, help="examples a campaign (default 200)")
    p.add_argument("--steps", type=int, default=30, help="steps a state machine example (default 30)")
    p.add_argument("--seed", type=int, default=0, help="hypothesis's seed (default 0: the same run every time)")
    p.add_argument("--only", default="", help="run only the campaigns whose name holds this")
    p.add_argument("--detail", action="store_true", help="also print the tally by event type")
    args = p.parse_args(argv)
    if args.examples < 1 or args.steps < 1:
        p.error("--examples and --steps must be at least 1")
    return args


def run(name: str, campaign: Any, args: argparse.Namespace) -> str | None:
    """One campaign; the failure it found (its message and where), or None."""
    conf = settings(max_examples=args.examples, stateful_step_count=args.steps, deadline=None, database=None,
                    phases=(Phase.explicit, Phase.generate), suppress_health_check=list(HealthCheck),
                    report_multiple_bugs=False, print_blob=False)
    try:
        if isinstance(campaign, type):
            run_state_machine_as_test(campaign, settings=conf)
        else:
            @conf
            @given(st.data())
            def one(data: st.DataObject) -> None:
                campaign(data)

            one()
    except Exception as exc:
        where = traceback.extract_tb(exc.__traceback__)[-1]
        notes = "\n".join(getattr(exc, "__notes__", [])[-15:])
        return f"{type(exc).__name__}: {exc}\n  at {where.filename}:{where.lineno}\n{notes}"
    return None


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    hypothesis.core.global_force_seed = args.seed  # (what pytest's --hypothesis-seed sets)
    total = Tally()
    failures: list[tuple[str, str]] = []
    chosen = {n: c for n, c in CAMPAIGNS.items() if args.only in n}
    if not chosen:
        print(f"no campaign's name holds {args.only!r}: {', '.join(CAMPAIGNS)}", file=sys.stderr)
        return 2
    print(f"hostile-input campaign: {args.examples} examples a campaign"
          f" ({args.steps} steps a state machine example), seed {args.seed}\n")
    for name, campaign in chosen.items():
        TALLY.clear()
        t0 = time.perf_counter()
        failure = run(name, campaign, args)
        took = time.perf_counter() - t0
        print(f"== {name} ({took:.1f} s)")
        for line in TALLY.lines(detail=args.detail):
            print(f"   {line}")
        if failure:
            failures.append((name, failure))
            print(f"   FAILED: {failure.splitlines()[0]}")
        total.counts.update(TALLY.counts)
    hostile = Tally()
    hostile.counts = Counter({k: n for k, n in total.counts.items() if k[0] != "valid"})
    print("\nin all:")
    for line in total.lines(detail=False):
        print(f"   {line}")
    print(f"hostile events only: {hostile.lines(detail=False)[0]}")
    for name, failure in failures:
        print(f"\nFAILED {name}:\n{failure}", file=sys.stderr)
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
