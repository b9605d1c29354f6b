"""Access records are written in the order their answers ended (``IngressState.observed``), even when
the first one waits for its replica's rank from the controller and the next one's rank is known: a
client's second request, answered while its first one's rank was asked, was recorded before it
(seen in a CI run once the proxy's calls went by value, which answers faster). No Ray: the rank
lookup is a stand-in that the test releases."""

from __future__ import annotations

import asyncio

from executors.ray_gpu.ingress.access import AccessLog
from executors.ray_gpu.ingress.http import IngressState


def test_a_record_waiting_for_its_rank_holds_back_the_ones_answered_after_it() -> None:
    state = IngressState({"/m": "m"}, {}, 1 << 20, 30.0, access=AccessLog(enabled=True))

    async def main() -> list[str]:
        asked = asyncio.Event()

        async def rank_of(deployment: str, replica: str) -> int:
            if replica == "new":  # (new to the proxy: its rank is asked for)
                await asked.wait()
            return 0

        state.rank_of = rank_of  # type: ignore[method-assign]

        def note(rid: str, replica: str) -> dict:
            return {"route": "/m", "deployment": "m", "replica": replica, "request_id": rid}

        first = asyncio.ensure_future(state.observed(note("first", "new"), "POST", "/m", 200, 1.0, 1))
        await asyncio.sleep(0)  # (the first is waiting for its rank)
        second = asyncio.ensure_future(state.observed(note("second", "known"), "POST", "/m", 200, 1.0, 1))
        await asyncio.sleep(0.05)
        asked.set()
        await asyncio.gather(first, second)
        return [r["request_id"] for r in state.access.last()]

    assert asyncio.run(main()) == ["first", "second"]


def test_a_refused_request_is_recorded_after_the_answers_that_ended_before_it() -> None:
    """A request the connection guard refuses (``refused``: a 431, say) while an earlier answer waits
    for its replica's rank is recorded after that answer, and one refused later after it; with
    nothing waiting it is recorded at once."""
    state = IngressState({"/m": "m"}, {}, 1 << 20, 30.0, access=AccessLog(enabled=True))

    async def main() -> tuple[list[str], list[str], list[str]]:
        asked = asyncio.Event()

        async def rank_of(deployment: str, replica: str) -> int:
            await asked.wait()
            return 0

        state.rank_of = rank_of  # type: ignore[method-assign]
        first = asyncio.ensure_future(state.observed(
            {"route": "/m", "deployment": "m", "replica": "new", "request_id": "first"}, "POST", "/m", 200, 1.0, 1))
        await asyncio.sleep(0)  # (the first is waiting for its rank)
        a = state.refused("GET", "/m", 431, 1.0, 10)
        await asyncio.sleep(0.02)
        asked.set()
        await first
        await asyncio.sleep(0)  # (the first's lock is free: the refused one's turn)
        b = state.refused("GET", "/m", 431, 1.0, 10)  # (the first ended in the meantime, nothing waits)
        mid = [r["request_id"] for r in state.access.last()]
        await asyncio.sleep(0.02)
        return mid, [r["request_id"] for r in state.access.last()], [a, b]

    mid, end, (a, b) = asyncio.run(main())
    assert end == ["first", a, b]
    assert mid == end  # (b was written at once: it waited for nothing)


def test_a_refused_request_keeps_its_place_ahead_of_an_answer_that_ended_after_it() -> None:
    """In one turn of the loop the first answer's rank arrives, a request is refused, and another
    request's answer ends: they are recorded in that order (found in review: the refused one's record
    waited for a lock it had not yet queued for, and the answer after it took the lock first)."""
    state = IngressState({"/m": "m"}, {}, 1 << 20, 30.0, access=AccessLog(enabled=True))

    async def main() -> tuple[list[str], str]:
        asked = asyncio.Event()

        async def rank_of(deployment: str, replica: str) -> int:
            if replica == "new":
                await asked.wait()
            return 0

        state.rank_of = rank_of  # type: ignore[method-assign]
        first = asyncio.ensure_future(state.observed(
            {"route": "/m", "deployment": "m", "replica": "new", "request_id": "first"}, "POST", "/m", 200, 1.0, 1))
        await asyncio.sleep(0)  # (the first is waiting for its rank)
        asked.set()  # (its rank is here; it has not run since)
        after = asyncio.ensure_future(state.observed(  # (its answer ends when it runs: after the refusal)
            {"route": "/m", "deployment": "m", "replica": "known", "request_id": "after"}, "POST", "/m", 200, 1.0,
            1))
        refused = state.refused("GET", "/m", 431, 1.0, 10)
        await asyncio.gather(first, after)
        await asyncio.sleep(0.02)
        return [r["request_id"] for r in state.access.last()], refused

    written, refused = asyncio.run(main())
    assert written == ["first", refused, "after"]


def test_a_rank_lookup_that_fails_holds_back_nothing() -> None:
    """The first answer's rank lookup raises: it is recorded without a rank, and the next is recorded."""
    state = IngressState({"/m": "m"}, {}, 1 << 20, 30.0, access=AccessLog(enabled=True))

    async def main() -> list[tuple[str, int | None]]:
        async def rank_of(deployment: str, replica: str) -> int:
            if replica == "broken":
                raise RuntimeError("controller gone")
            return 4

        state.rank_of = rank_of  # type: ignore[method-assign]
        try:
            await state.observed({"route": "/m", "deployment": "m", "replica": "broken", "request_id": "a"},
                                 "POST", "/m", 200, 1.0, 1)
        except RuntimeError:
            pass
        await state.observed({"route": "/m", "deployment": "m", "replica": "ok", "request_id": "b"},
                             "POST", "/m", 200, 1.0, 1)
        return [(r["request_id"], r["rank"]) for r in state.access.last()]

    assert asyncio.run(main()) == [("a", None), ("b", 4)]
