"""Polling for the Ray tests: what a test waits for, with a deadline (``wait_for``; a collective
group re-formed: ``reformed``)."""

from __future__ import annotations

import time
from collections.abc import Callable


def wait_for(pred: Callable[[], object], timeout: float = 60.0, every: float = 0.1) -> bool:
    """True as soon as ``pred()`` is; after ``timeout`` seconds, ``pred()``'s last word."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if pred():
            return True
        time.sleep(every)
    return bool(pred())


def settled(h, world: int) -> dict[int, dict] | None:
    """A collective group's members (issue 67; ``examples/ray/data_parallel_group.py``'s calls):
    the replicas by rank once ``world`` of them all-reduced right in one epoch; else None."""
    got = {r["rank"]: r for r in h.broadcast(timeout=10).values()}
    lasts = {r["last"] for r in got.values()}
    if sorted(got) != list(range(world)) or len(lasts) != 1:
        return None
    (last,) = lasts
    if last is None or last[1] != world or last[2] != world * (world + 1) / 2:
        return None
    return got


def reformed(h, world: int, above: int = 0, timeout: float = 90.0) -> dict[int, dict]:
    """``settled`` at an epoch above ``above``, waiting up to ``timeout`` s (what it saw last, if not)."""
    seen: list = [None]

    def done() -> bool:
        try:
            got = settled(h, world)
        except Exception as exc:  # (a member dying under the call)
            seen[0] = exc
            return False
        seen[0] = got
        return got is not None and got[0]["last"][0] > above

    assert wait_for(done, timeout=timeout, every=0.2), f"not re-formed at world {world} above epoch {above}: {seen[0]}"
    return seen[0]
