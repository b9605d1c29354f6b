"""The simulator's host CPU (``batch.cores``, issue 39): cores shared as the kernel shares them
(processor sharing), and threads that run their work one item at a time on them."""

from __future__ import annotations

import heapq
import itertools

import pytest

from executors.sim.traffic import _Cpu, _Thread


class _Clock:
    """Just what ``_Cpu`` asks of the simulation: its clock, and timers to schedule and cancel."""

    def __init__(self) -> None:
        self.now = 0.0
        self._queue: list = []
        self._seq = itertools.count()
        self._cancelled: set[int] = set()

    def schedule(self, delay: float, fn, *args) -> int:
        ticket = next(self._seq)
        heapq.heappush(self._queue, (self.now + delay, ticket, fn, args))
        return ticket

    def cancel(self, ticket: int) -> None:
        self._cancelled.add(ticket)

    def run(self) -> None:
        while self._queue:
            t, ticket, fn, args = heapq.heappop(self._queue)
            if ticket in self._cancelled:
                continue
            self.now = t
            fn(*args)


def _ends(cores: int, works: list[float], starts: list[float] | None = None) -> list[float]:
    clock, ends = _Clock(), {}
    cpu = _Cpu(clock, cores)
    for i, (work, at) in enumerate(zip(works, starts or [0.0] * len(works))):
        clock.schedule(at, lambda i=i, work=work: cpu.run(work, lambda: ends.__setitem__(i, clock.now)))
    clock.run()
    assert not cpu.jobs and cpu.timer is None
    return [ends[i] for i in range(len(works))]


def test_a_thread_alone_runs_at_full_speed_and_a_crowd_shares_the_cores():
    assert _ends(2, [1.0]) == pytest.approx([1.0])
    assert _ends(2, [1.0, 1.0]) == pytest.approx([1.0, 1.0])  # (one core each)
    assert _ends(1, [1.0, 1.0]) == pytest.approx([2.0, 2.0])  # (half a core each)
    # 3 on 2 cores: 2/3 of a core each until the short one ends at 1.5, then a core each
    assert _ends(2, [1.0, 2.0, 2.0]) == pytest.approx([1.5, 2.5, 2.5])
    # one arriving late slows the first only from then on
    assert _ends(1, [1.0, 0.5], [0.0, 0.5]) == pytest.approx([1.5, 1.5])


def test_work_on_a_weeks_clock_ends_on_time():
    # at t=600,000 s the clock resolves ~1e-10 s: 0.1 us of CPU still ends, and frees the core
    assert _ends(1, [1e-7, 1.0], [600_000.0, 600_000.0]) == pytest.approx([600_000.0, 600_001.0], abs=1e-6)


def test_a_thread_runs_its_work_one_item_at_a_time_in_order():
    clock, done = _Clock(), []
    cpu = _Cpu(clock, 4)
    thread = _Thread(cpu)
    for i in range(3):
        thread.run(1.0, lambda i=i: done.append((i, clock.now)))
    other = _Thread(cpu)
    other.run(0.5, lambda: done.append(("other", clock.now)))
    clock.run()
    assert done == [("other", 0.5), (0, 1.0), (1, 2.0), (2, 3.0)]  # (4 cores: the threads never wait for one)
    assert not thread.busy and not thread.queue


def _one_thread(*items: tuple[str, float, bool]):
    """A thread on one core given ``items`` (name, CPU seconds, whether its owner may leave: then
    ``alive[name]`` says if it is still there); ``done`` gets (name, when it ended)."""
    clock, done, alive = _Clock(), [], {}
    thread = _Thread(_Cpu(clock, 1))
    for name, work, owned in items:
        alive[name] = True
        thread.run(work, lambda name=name: done.append((name, clock.now)),
                   (lambda name=name: alive[name]) if owned else None)
    return clock, done, thread, alive


def test_an_item_whose_owner_left_by_its_turn_takes_no_cpu():
    clock, done, thread, alive = _one_thread(("a", 1.0, True), ("b", 1.0, True), ("c", 1.0, False))
    clock.schedule(0.5, lambda: alive.__setitem__("b", False))  # (b's replica dies at 0.5)
    clock.run()
    # a, already running, ends at 1.0; b's turn comes with its owner gone: no CPU; c runs at once
    assert done == [("a", 1.0), ("b", 1.0), ("c", 2.0)]
    assert not thread.busy and not thread.queue


def test_a_job_cut_ends_at_once_and_gives_its_share_of_the_cores_back():
    clock, ends = _Clock(), {}
    cpu = _Cpu(clock, 1)
    a = cpu.run(2.0, lambda: ends.__setitem__("a", clock.now))
    cpu.run(2.0, lambda: ends.__setitem__("b", clock.now))
    clock.schedule(1.0, cpu.cut, a)  # (a's process dies with 1.5 s of its CPU still to run)
    clock.schedule(1.5, cpu.cut, a)  # (cutting one already ended changes nothing)
    clock.run()
    # both ran at half a core until 1.0 (0.5 s each); then b alone at a whole core: 1.5 s more
    assert ends == pytest.approx({"a": 1.0, "b": 2.5})
    assert not cpu.jobs and cpu.timer is None


def test_a_thread_cut_ends_the_item_running_and_goes_on_with_those_still_live():
    clock, done, thread, alive = _one_thread(("a", 2.0, True), ("b", 1.0, True))  # (b: another owner, live)
    clock.schedule(0.5, lambda: (alive.__setitem__("a", False), thread.cut()))
    clock.run()
    assert done == [("a", 0.5), ("b", 1.5)]
    assert thread.job is None and not thread.busy
