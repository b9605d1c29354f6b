"""Where a benchmark level's CPU went on this host (issues 39 and 65), read from ``/proc``.

``host_busy_s`` (every core summed), ``thread_cpu_s`` (one thread), ``process_threads_cpu`` (each
thread of the processes named), and ``deltas``: what a window's two samples of the last say, per
process name (``total_s`` and the busiest threads). bench_batch and bench_http use them to give the
simulator a request's CPU thread by thread (``traffic.<d>.host``, docs/scenarios.md). None where
``/proc`` cannot be read (not Linux, another host)."""

from __future__ import annotations

import os

__all__ = ["host_busy_s", "cpu_s_of", "thread_cpu_s", "process_threads_cpu", "deltas", "Window"]


def host_busy_s() -> float | None:
    """CPU seconds the whole host has been busy, every core summed (``/proc/stat``; None elsewhere):
    the load generator, the proxy, the router and the replica alike."""
    try:
        with open("/proc/stat") as f:
            fields = [int(v) for v in f.readline().split()[1:]]
    except (OSError, ValueError):
        return None
    idle = fields[3] + (fields[4] if len(fields) > 4 else 0)  # (idle, iowait)
    return (sum(fields[:8]) - idle) / os.sysconf("SC_CLK_TCK")


def cpu_s_of(stat: str) -> float:
    """CPU seconds (utime + stime) in a ``/proc`` ``stat`` line (a process's or a thread's): the fields
    after the command's name, whose closing ``)`` is the line's last (a name may hold spaces and
    parentheses)."""
    fields = stat.rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def thread_cpu_s(pid: int, tid: int) -> float | None:
    """CPU seconds one thread of a process on this host has used (``/proc/<pid>/task/<tid>/stat``'s
    utime + stime; None where it cannot be read: another host, or the thread is gone)."""
    try:
        with open(f"/proc/{pid}/task/{tid}/stat") as f:
            return cpu_s_of(f.read())
    except (OSError, IndexError):
        return None


def process_threads_cpu(names: tuple[str, ...]) -> dict:
    """{name: {"pid/tid": CPU s}} of this host's processes whose command line (or its first word's
    base name) starts with one of ``names`` (the same name twice: their threads together)."""
    out: dict = {}
    for pid in os.listdir("/proc"):
        if not pid.isdigit():
            continue
        try:
            with open(f"/proc/{pid}/cmdline", "rb") as f:
                cmd = f.read().split(b"\0")[0].decode(errors="replace")
            name = next((n for n in names if os.path.basename(cmd).startswith(n) or cmd.startswith(n)), None)
            if name is None:
                continue
            for tid in os.listdir(f"/proc/{pid}/task"):
                t = thread_cpu_s(int(pid), int(tid))
                if t is not None:
                    out.setdefault(name, {})[f"{pid}/{tid}"] = t
        except OSError:
            continue
    return out


def deltas(before: dict, after: dict) -> dict:
    """Two ``process_threads_cpu`` samples -> {name: {"total_s", "top_threads_s" (the busiest three)}}:
    the CPU each named process used between them (a thread new since counts from 0)."""
    out = {}
    for name, threads in after.items():
        was = before.get(name, {})
        used = sorted((t - was.get(tid, 0.0) for tid, t in threads.items()), reverse=True)
        out[name] = {"total_s": sum(used), "top_threads_s": used[:3]}
    return out


class Window:
    """A benchmark level's window, sampled on the callers' thread at its start and at its end
    (``sample``): the host's busy CPU, this thread's, and the named processes' threads'. The scans
    of ``/proc`` stay outside the window: at the start the processes are read before the clocks, at
    the end after them."""

    def __init__(self, names: tuple[str, ...]) -> None:
        self.names = names
        self.samples: list[tuple[float | None, float, dict]] = []

    def sample(self) -> None:
        import time

        if not self.samples:
            procs = process_threads_cpu(self.names)
            self.samples.append((host_busy_s(), time.thread_time(), procs))
        else:
            busy, own = host_busy_s(), time.thread_time()
            self.samples.append((busy, own, process_threads_cpu(self.names)))

    def figures(self) -> dict:
        """``host_busy_s``, ``caller_thread_s`` and ``processes`` (``deltas``) of the window (None
        where it was not sampled twice)."""
        if len(self.samples) != 2:
            return {"host_busy_s": None, "caller_thread_s": None, "processes": {}}
        (b0, c0, p0), (b1, c1, p1) = self.samples
        return {"host_busy_s": None if b0 is None or b1 is None else b1 - b0, "caller_thread_s": c1 - c0,
                "processes": deltas(p0, p1)}
