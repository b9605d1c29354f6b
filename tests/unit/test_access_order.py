"""Access records are written in the order their answers ended (``IngressState.observed``), even when
the first one waits for its replica's rank from the controller and the next one's rank is known: a
client's second request, answered while its first one's rank was asked, was recorded before it
(seen in a CI run once the proxy's calls went by value, which answers faster). No Ray: the rank
lookup is a stand-in that the test releases."""

from __future__ import annotations

import asyncio

from executors.ray_gpu.base.access import AccessLog
from executors.ray_gpu.ingress.http import IngressState


def _state(asked: asyncio.Event, broken: str = "") -> IngressState:
    """An ingress whose rank lookup waits for ``asked`` for the replica called "new", raises for
    ``broken``, and answers 0 at once for any other."""
    state = IngressState({"/m": "m"}, {}, 1 << 20, 30.0, access=AccessLog(enabled=True))

    async def rank_of(deployment: str, replica: str) -> int:
        if replica == broken:
            raise RuntimeError("controller gone")
        if replica == "new":  # (new to the proxy: its rank is asked for)
            await asked.wait()
        return 0

    state.rank_of = rank_of  # type: ignore[method-assign]
    return state


def _answered(state: IngressState, rid: str, replica: str) -> asyncio.Future:
    return asyncio.ensure_future(state.observed(
        {"route": "/m", "deployment": "m", "replica": replica, "request_id": rid}, "POST", "/m", 200, 1.0, 1))


def _written(state: IngressState) -> list[str]:
    return [r["request_id"] for r in state.access.last()]


def test_a_record_waiting_for_its_rank_holds_back_the_ones_answered_after_it() -> None:
    async def main() -> list[str]:
        asked = asyncio.Event()
        state = _state(asked)
        first = _answered(state, "first", "new")
        await asyncio.sleep(0)  # (the first is waiting for its rank)
        second = _answered(state, "second", "known")
        await asyncio.sleep(0.05)
        asked.set()
        await asyncio.gather(first, second)
        return _written(state)

    assert asyncio.run(main()) == ["first", "second"]


def test_a_refused_request_is_recorded_after_the_answers_that_ended_before_it() -> None:
    """A request the connection guard refuses (``refused``: a 431, say) while an earlier answer waits
    for its replica's rank is recorded after that answer, and one refused later after it; with
    nothing waiting it is recorded at once."""
    async def main() -> tuple[list[str], list[str], list[str]]:
        asked = asyncio.Event()
        state = _state(asked)
        first = _answered(state, "first", "new")
        await asyncio.sleep(0)  # (the first is waiting for its rank)
        a = state.refused("GET", "/m", 431, 1.0, 10)
        await asyncio.sleep(0.02)
        asked.set()
        await first
        await asyncio.sleep(0)
        b = state.refused("GET", "/m", 431, 1.0, 10)  # (the first ended in the meantime, nothing waits)
        mid = _written(state)
        await asyncio.sleep(0.02)
        return mid, _written(state), [a, b]

    mid, end, (a, b) = asyncio.run(main())
    assert end == ["first", a, b]
    assert mid == end  # (b was written at once: it waited for nothing)


def test_a_refused_request_keeps_its_place_ahead_of_an_answer_that_ended_after_it() -> None:
    """In one turn of the loop the first answer's rank arrives, a request is refused, and another
    request's answer ends: they are recorded in that order (found in review: the refused one's record
    waited for a lock it had not yet queued for, and the answer after it took the lock first)."""
    async def main() -> tuple[list[str], str]:
        asked = asyncio.Event()
        state = _state(asked)
        first = _answered(state, "first", "new")
        await asyncio.sleep(0)  # (the first is waiting for its rank)
        asked.set()  # (its rank is here; it has not run since)
        after = _answered(state, "after", "known")  # (its answer ends when it runs: after the refusal)
        refused = state.refused("GET", "/m", 431, 1.0, 10)
        await asyncio.gather(first, after)
        await asyncio.sleep(0.02)
        return _written(state), refused

    written, refused = asyncio.run(main())
    assert written == ["first", refused, "after"]


def test_a_rank_lookup_that_fails_holds_back_nothing() -> None:
    """The first answer's rank lookup raises: it is recorded without a rank, and the next is recorded."""
    async def main() -> list[tuple[str, int | None]]:
        state = _state(asyncio.Event(), broken="broken")
        try:
            await _answered(state, "a", "broken")
        except RuntimeError:
            pass
        await _answered(state, "b", "ok")
        return [(r["request_id"], r["rank"]) for r in state.access.last()]

    assert asyncio.run(main()) == [("a", None), ("b", 0)]
