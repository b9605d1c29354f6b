"""Which plain calls a replica that died had begun: a record that outlives its process (issue 40).

A plain call (``handle_call``) sends nothing back before its answer, so when its replica dies
Ray's ``ActorDiedError`` is all its router sees, the same for a call the replica was running as for
one that never reached its method (queued behind the ``max_ongoing_requests`` slots, or sent
after the process had died). Failing both is safe and wrong for the second: it never ran, so
sending it to another replica cannot run anything twice. Ray Serve tells them apart by making
every request answer first that it was accepted (a streaming call: half the calls a second at 16
clients here, ``benchmarks/bench_start_marker.py``). This costs a plain call two stores into
shared memory instead:

* the replica (``Witness``) writes each call's key into a slot of a small file it maps from
  ``/dev/shm`` (named by its actor id) as the call takes one of its slots, *before* the user's
  method is entered; the slot is kept ``KEEP_S`` after the call ends (its answer may still be on
  its way when the process dies) and then reused; with no slot free it counts the call as
  unrecorded while it runs and for ``KEEP_S`` after (a burst past ``SLOTS`` heals);
* when a call fails with ``ActorDiedError``, its router asks the file (``began``: read where the
  router runs when it is on the replica's node, else by a task pinned to that node,
  ``ask_node``) once the process is gone: a call whose key is not there never entered the user's
  method, and is sent to another replica (the request machine's ``NotDelivered``); the rest fail
  as before.

Every doubt counts as begun, so nothing runs twice: no file (a node lost with its replicas, a
replica stopped gracefully, which removes its file), a process that still lives (a replica marked
dead while it runs: its calls may yet begin), an unrecorded call running or ended less than
``KEEP_S`` ago, a node that does not answer within
``ASK_TIMEOUT_S``. A key is 64 bits, a random per-router prefix and the router's call counter;
two calls sharing one could only make a call that never began count as begun.

Layout (little-endian): a 64-byte header (``MAGIC``, the writer's pid and its start time in clock
ticks from ``/proc/<pid>/stat``, the unrecorded calls running, the wall time of the latest begin,
for the sweep, and of the latest unrecorded call's end), then ``SLOTS`` 8-byte keys (0: never used).
"""

from __future__ import annotations

import collections
import mmap
import os
import struct
import tempfile
import time
from pathlib import Path
from typing import Any

__all__ = ["Witness", "began", "ask_node", "witness_dir", "witness_path", "sweep", "SLOTS", "KEEP_S",
           "ASK_TIMEOUT_S", "PROCESS_EXIT_S", "SWEEP_AFTER_S", "SWEEP_EVERY_S", "DIR_ENV"]

MAGIC = b"RCWIT001"
#: magic, pid, start ticks, unrecorded calls running, wall times of the latest begin and unrecorded end
_HEADER = struct.Struct("<8sQQQdd")
HEADER_BYTES = 64
_LAST = 32  # (the offset of the latest begin's wall time in the header)
_UNRECORDED = 24
_UNRECORDED_END = 40
#: keys a replica holds at once: the calls in its slots plus those that ended less than KEEP_S ago
SLOTS = 16384
#: how long an ended call's key stays (its answer's flight back to the router, with room to spare)
KEEP_S = 5.0
#: how long a router waits for a node to say which calls began (then: all count as begun)
ASK_TIMEOUT_S = 5.0
#: how long a reader waits for the dead replica's process to be gone from its node
PROCESS_EXIT_S = 2.0
#: a witness whose process is gone and that saw no call this long is removed by a live replica of
#: its node (a router asks within a second or two of the death)
SWEEP_AFTER_S = 300.0
#: how often a live replica sweeps its node (as it starts, then on its health checks)
SWEEP_EVERY_S = 60.0
_PREFIX = "rankcore-witness-"


#: a folder for the witnesses instead (tests: one of their own, removed when they end); it must be
#: the same for every process of a node, so it is set before Ray starts there (Ray's workers inherit it)
DIR_ENV = "RANKCORE_WITNESS_DIR"


def witness_dir() -> Path:
    """Where this node's witnesses live: ``$RANKCORE_WITNESS_DIR``, else ``/dev/shm`` (memory),
    else the system's temp folder."""
    if os.environ.get(DIR_ENV):
        return Path(os.environ[DIR_ENV])
    return Path("/dev/shm") if os.path.isdir("/dev/shm") else Path(tempfile.gettempdir())


def witness_path(actor_id: str, directory: Path | None = None) -> Path:
    """Replica ``actor_id``'s witness, in ``directory`` (None: ``witness_dir()``)."""
    return (directory if directory is not None else witness_dir()) / f"{_PREFIX}{actor_id}"


def _start_ticks(pid: int) -> int | None:
    """The process's start time (``/proc/<pid>/stat`` field 22), None when it is gone or a zombie."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_bytes()
    except OSError:
        return None
    rest = stat[stat.rfind(b")") + 2:].split()  # (after the command name, which may hold spaces)
    if rest[0] == b"Z":
        return None
    return int(rest[19])


class Witness:
    """A replica's record of the calls it began (module docstring). Used from the actor's event
    loop only (``begin`` and ``end`` are not thread-safe)."""

    def __init__(self, actor_id: str, directory: Path | None = None) -> None:
        self.path = witness_path(actor_id, directory)
        size = HEADER_BYTES + 8 * SLOTS
        fd = os.open(self.path, os.O_RDWR | os.O_CREAT | os.O_TRUNC, 0o600)
        try:
            os.ftruncate(fd, size)
            self._map = mmap.mmap(fd, size)
        finally:
            os.close(fd)
        pid = os.getpid()
        _HEADER.pack_into(self._map, 0, MAGIC, pid, _start_ticks(pid) or 0, 0, time.time(), 0.0)
        self._fresh = SLOTS  # slots never used, taken from the top down
        self._ended: collections.deque[tuple[float, int]] = collections.deque()
        self.unrecorded = 0  # calls running that no slot holds (every slot busy when they began)

    def begin(self, key: int) -> int:
        """Record ``key`` (a call about to enter the user's method); its slot for ``end``, -1 if none
        was free (counted unrecorded: until it ended ``KEEP_S`` ago every call counts as begun)."""
        if self._fresh:
            self._fresh -= 1
            slot = self._fresh
        elif self._ended and time.monotonic() - self._ended[0][0] >= KEEP_S:
            slot = self._ended.popleft()[1]
        else:
            self.unrecorded += 1
            struct.pack_into("<Q", self._map, _UNRECORDED, self.unrecorded)
            return -1
        struct.pack_into("<Q", self._map, HEADER_BYTES + 8 * slot, key)
        struct.pack_into("<d", self._map, _LAST, time.time())
        return slot

    def end(self, slot: int) -> None:
        """The call of ``slot`` ended: its key stays ``KEEP_S`` more, then the slot is reused (an
        unrecorded call's end is stamped: reads say unknown ``KEEP_S`` more)."""
        if slot >= 0:
            self._ended.append((time.monotonic(), slot))
        elif self.unrecorded:
            self.unrecorded -= 1
            struct.pack_into("<d", self._map, _UNRECORDED_END, time.time())
            struct.pack_into("<Q", self._map, _UNRECORDED, self.unrecorded)

    def close(self) -> None:
        """Remove the file (a graceful stop: calls that still come count as begun, as without it)."""
        try:
            self.path.unlink()
        except OSError:
            pass
        try:
            self._map.close()
        except (BufferError, ValueError):  # pragma: no cover - (already closed)
            pass


def began(actor_id: str, keys: list[int], directory: Path | None = None,
          wait_s: float = PROCESS_EXIT_S) -> list[int] | None:
    """Of ``keys``, those the dead replica ``actor_id`` had begun (they are in its witness); None
    when that cannot be known (no witness, a call it began unrecorded, its process still running after
    ``wait_s``): then every call counts as begun."""
    path = witness_path(actor_id, directory)
    try:
        data = path.read_bytes()
    except OSError:
        return None
    if len(data) < HEADER_BYTES or data[:8] != MAGIC:
        return None
    _magic, pid, ticks, _unrec, _last, _unrec_end = _HEADER.unpack_from(data, 0)
    if not ticks:  # (its writer could not say when it started: whether it still runs is unknown)
        return None
    deadline = time.monotonic() + wait_s
    while _start_ticks(pid) == ticks:  # (it still runs: a call may yet begin)
        if time.monotonic() >= deadline:
            return None
        time.sleep(0.02)
    data = path.read_bytes()  # (read again: what it wrote up to its end)
    _magic, pid, ticks, unrecorded, _last, unrecorded_end = _HEADER.unpack_from(data, 0)
    if unrecorded or time.time() - unrecorded_end < KEEP_S:  # (a call that began without a slot)
        return None
    held = set(struct.unpack_from(f"<{(len(data) - HEADER_BYTES) // 8}Q", data, HEADER_BYTES))
    return [k for k in keys if k in held]


def ask_node(node_id: str, actor_id: str, keys: list[int]) -> list[int] | None:
    """``began`` where the replica ran: here when this process is on ``node_id``, else by a task
    pinned to it (a node that is gone or does not answer within ``ASK_TIMEOUT_S``: None)."""
    import ray
    from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

    if ray.get_runtime_context().get_node_id() == node_id:
        return began(actor_id, keys)
    ref = _began_remote().options(
        scheduling_strategy=NodeAffinitySchedulingStrategy(node_id=node_id, soft=False)).remote(actor_id, keys)
    try:
        return ray.get(ref, timeout=ASK_TIMEOUT_S)
    except Exception:  # (the node is gone, or slow: every call counts as begun)
        ray.cancel(ref, force=True)
        return None


_REMOTE: Any = None


def _began_remote() -> Any:
    """``began`` as a Ray task (made once per process)."""
    global _REMOTE
    if _REMOTE is None:
        import ray

        _REMOTE = ray.remote(num_cpus=0, max_retries=0)(began)
    return _REMOTE


def sweep(directory: Path | None = None, older_than_s: float = SWEEP_AFTER_S) -> int:
    """Remove the witnesses of processes that are gone and began no call for ``older_than_s``;
    the number removed. A live replica sweeps its node; ``older_than_s=0`` removes every dead one."""
    d = directory if directory is not None else witness_dir()
    removed = 0
    now = time.time()
    for path in d.glob(f"{_PREFIX}*"):
        try:
            with open(path, "rb") as f:
                head = f.read(HEADER_BYTES)
            _magic, pid, ticks, _unrec, last, _unrec_end = _HEADER.unpack_from(head, 0)
        except (OSError, struct.error):
            continue
        if _start_ticks(pid) != ticks and now - last >= older_than_s:
            try:
                path.unlink()
                removed += 1
            except OSError:
                pass
    return removed
