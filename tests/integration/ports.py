"""A free TCP port that the local Ray a test starts cannot take as well.

A port from ``bind(("", 0))`` comes from the kernel's ephemeral range (32768-60999 here), where
Ray picks its own ports at start (metrics, agents, the autoscaler's exporter): a test that frees
such a port and hands it to ``rankcore serve`` can find Ray's metrics answering on it (CI of stop
51). Ray's fixed defaults lie elsewhere (6379, 8265, 10001, its workers 10002-19999, 44217,
52365), so the port is drawn from 20000-32767, below the ephemeral range, and checked free on
0.0.0.0. A host whose ephemeral range covers all of that gets an ephemeral port, with a warning."""

from __future__ import annotations

import itertools
import os
import socket
import warnings

_LOW, _HIGH = 20000, 32767
_calls = itertools.count()  # (two calls before either port is bound do not give the same one)


def _ephemeral() -> tuple[int, int]:
    try:
        with open("/proc/sys/net/ipv4/ip_local_port_range") as f:
            low, high = (int(x) for x in f.read().split())
        return low, high
    except (OSError, ValueError):
        return 32768, 60999


def free_port() -> int:
    """A port free now on 0.0.0.0, outside the kernel's ephemeral range and Ray's fixed ports."""
    low, high = _ephemeral()
    span = _HIGH - _LOW + 1
    start = (os.getpid() * 7919 + next(_calls) * 101) % span  # (a walk of its own per process and call)
    for i in range(span):
        port = _LOW + (start + i * 37) % span
        if low <= port <= high:
            continue
        with socket.socket() as s:
            try:
                s.bind(("0.0.0.0", port))
            except OSError:
                continue
            return port
    warnings.warn(f"no free port in {_LOW}-{_HIGH} outside the ephemeral range {low}-{high}: an ephemeral one, "
                  f"which the local Ray may take too", stacklevel=2)
    with socket.socket() as s:
        s.bind(("0.0.0.0", 0))
        return s.getsockname()[1]
