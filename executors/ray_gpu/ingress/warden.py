"""An HAProxy's warden: the direct data plane outlives the proxy actor that runs it, for a while (issue 65).

A proxy actor killed or crashed used to take its HAProxy along (``PR_SET_PDEATHSIG``), and with it the
node's public sockets: until the core had started the next proxy (about 2 s), every new connection was
refused and every request in flight failed, most of them before any replica had seen them. Now each
HAProxy runs under a warden, a small process of its own (this file, run as a script: the standard library
only, nothing of Ray or rankcore loaded):

* the warden is HAProxy's parent, and HAProxy dies with it (``PR_SET_PDEATHSIG``): no HAProxy ever
  outlives its warden;
* the warden is the proxy's child in a session of its own, holding the read end of a *lease* pipe whose
  write end only the proxy holds. The proxy gone (its end closed: dead, however it died), HAProxy goes on
  serving the table it holds, straight to the replicas, for ``--grace`` seconds;
* the next proxy on the node *adopts* it (``adopt``): it asks the warden for the listening sockets over
  the warden's handover socket (``SCM_RIGHTS``; only once the lease is broken), listens on them with an
  HAProxy of its own, which tells this one to finish its connections and go (``-sf``). The port is never
  closed, no connection is refused, and the requests in flight finish;
* no proxy came within the grace: HAProxy is told to finish its connections and go (``SIGUSR1``), and is
  killed ``--stop-after`` seconds later (after a ``ray stop``, nothing is left behind for long).

A warden told ``SIGUSR1`` or ``SIGTERM`` passes a soft stop on to HAProxy; it exits when HAProxy does,
with its status. It detaches at once (its parent exits: nobody's child but init's), and its first line
on standard output is its pid and HAProxy's.
"""

from __future__ import annotations

import argparse
import array
import json
import os
import selectors
import signal
import socket
import subprocess
import sys
import time
from typing import Any

__all__ = ["ORPHAN_GRACE_S", "STOP_AFTER_S", "SCRIPT", "command", "start", "Warden", "adopt_from", "Handed"]

#: how long an HAProxy whose proxy died goes on serving, waiting for the next proxy to adopt it (the core
#: starts one within seconds; Ray Serve's fast mode took 22 s here, measured in bench_chaos)
ORPHAN_GRACE_S = 30.0
#: how long an HAProxy told to finish its connections (no proxy came) has, before it is killed
STOP_AFTER_S = 30.0
#: this file, run as a script by the proxy (``python -I warden.py ...``)
SCRIPT = os.path.abspath(__file__)


def command(haproxy: list[str], lease_fd: int, fds: dict[str, int], handover: str,
            grace_s: float = ORPHAN_GRACE_S, stop_after_s: float = STOP_AFTER_S) -> list[str]:
    """The command line that runs ``haproxy`` under a warden (``pass_fds``: ``lease_fd`` and ``fds``'
    descriptors, the listening sockets by name, which HAProxy inherits)."""
    return [sys.executable, "-I", SCRIPT, "--lease", str(lease_fd), "--grace", repr(grace_s),
            "--stop-after", repr(stop_after_s), "--handover", handover,
            *(f"--fd={name}={fd}" for name, fd in fds.items()), "--", *haproxy]


class Warden:
    """A running warden, seen from the proxy that started it (``start``). It is not the proxy's child
    (it detaches: Ray kills a dead worker's children, measured), so it is known by its pid, through a
    pidfd where the kernel has them (no pid reused by mistake). ``haproxy``: its HAProxy's pid;
    ``stderr``: HAProxy's standard error (and the warden's)."""

    def __init__(self, pid: int, haproxy: int, stderr: Any) -> None:
        self.pid, self.haproxy, self.stderr = pid, haproxy, stderr
        try:
            self._fd: int | None = os.pidfd_open(pid)
        except (AttributeError, OSError):  # (no pidfd here, or it has gone already)
            self._fd = None

    def running(self) -> bool:
        if self._fd is not None:
            return not _readable(self._fd, 0.0)
        try:
            os.kill(self.pid, 0)
        except ProcessLookupError:
            return False
        return True

    def signal(self, sig: int) -> None:
        """``sig`` to the warden (``SIGUSR1``, ``SIGTERM``: it tells HAProxy to finish and go; ``SIGKILL``:
        HAProxy dies with it). Nothing when it has gone."""
        try:
            if self._fd is not None:
                signal.pidfd_send_signal(self._fd, sig)
            else:
                os.kill(self.pid, sig)
        except ProcessLookupError:
            pass

    def wait(self, timeout: float) -> bool:
        """Whether it has gone within ``timeout`` seconds."""
        if self._fd is not None:
            return _readable(self._fd, timeout)
        deadline = time.monotonic() + timeout
        while self.running():
            if time.monotonic() >= deadline:
                return False
            time.sleep(0.02)
        return True

    def close(self) -> None:
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None


def _readable(fd: int, timeout: float) -> bool:
    with selectors.DefaultSelector() as sel:
        sel.register(fd, selectors.EVENT_READ)
        return bool(sel.select(timeout))


def start(haproxy: list[str], lease_fd: int, fds: dict[str, int], handover: str,
          grace_s: float = ORPHAN_GRACE_S, stop_after_s: float = STOP_AFTER_S) -> Warden:
    """Run ``haproxy`` under a warden of its own; ``RuntimeError`` (with what it said) when it could not."""
    proc = subprocess.Popen(command(haproxy, lease_fd, fds, handover, grace_s, stop_after_s),
                            pass_fds=(lease_fd, *fds.values()), stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            start_new_session=True)
    assert proc.stdout is not None and proc.stderr is not None
    with proc.stdout:
        first = proc.stdout.readline().split()  # ("<warden's pid> <HAProxy's pid>"; nothing: it failed)
    proc.wait()  # (the process started here: it exits once the warden has detached)
    if len(first) != 2 or not all(x.isdigit() for x in first):
        said = proc.stderr.read().decode(errors="replace").strip()
        raise RuntimeError(f"HAProxy's warden did not start ({proc.returncode}): {said[-2000:]}")
    return Warden(int(first[0]), int(first[1]), proc.stderr)


# ------------------------------------------------------------------ the adopter's side
class Handed:
    """What an adopted warden handed over: its HAProxy's pid and the listening sockets by name."""

    def __init__(self, pid: int, sockets: dict[str, socket.socket]) -> None:
        self.pid, self.sockets = pid, sockets

    def take(self, name: str) -> socket.socket | None:
        return self.sockets.pop(name, None)

    def close(self) -> None:
        """Close the sockets not taken (the old HAProxy holds its own until it goes)."""
        for s in self.sockets.values():
            s.close()
        self.sockets.clear()


def adopt_from(handover: str, timeout_s: float = 5.0) -> Handed:
    """Ask the warden at ``handover`` for its HAProxy's listening sockets (``OSError``, or
    ``RuntimeError`` with the warden's reason, when it cannot or will not: its proxy is alive)."""
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as s:
        s.settimeout(timeout_s)
        s.connect(handover)
        msg, fds, _flags, _addr = socket.recv_fds(s, 65536, 16)
    try:
        said = json.loads(msg.decode() or "{}")
        if "error" in said:
            raise RuntimeError(said["error"])
        names = said["names"]
        if len(names) != len(fds):
            raise RuntimeError(f"the warden named {len(names)} sockets and sent {len(fds)}")
    except BaseException:
        for fd in fds:
            os.close(fd)
        raise
    return Handed(int(said["pid"]), {n: socket.socket(fileno=fd) for n, fd in zip(names, fds, strict=True)})


# ------------------------------------------------------------------ the warden itself
def _prctl() -> Any:
    """libc's ``prctl`` (None: not Linux), looked up before the fork: the child only calls it."""
    import ctypes

    try:
        return ctypes.CDLL(None, use_errno=True).prctl
    except (OSError, AttributeError):
        return None


def _run(args: argparse.Namespace) -> int:
    prctl = _prctl()

    def die_with_warden() -> None:  # (in the child, before HAProxy starts; the warden has one thread)
        if prctl is not None:
            prctl(1, signal.SIGKILL)  # (1: PR_SET_PDEATHSIG)

    fds = dict(item.split("=", 1) for item in args.fd)
    held = {name: int(fd) for name, fd in fds.items()}
    # (SIGPIPE left ignored, as in this process: HAProxy's standard error is the proxy's pipe, gone with it)
    proc = subprocess.Popen(args.command, pass_fds=tuple(held.values()), stdout=subprocess.DEVNULL,
                            preexec_fn=die_with_warden, restore_signals=False)
    print(os.getpid(), proc.pid, flush=True)
    sys.stdout.close()  # (the proxy reads to here)
    stopping_at: list[float] = []

    def soft_stop(*_: Any) -> None:
        if not stopping_at:
            stopping_at.append(time.monotonic())
        if proc.poll() is None:
            proc.send_signal(signal.SIGUSR1)

    signal.signal(signal.SIGUSR1, soft_stop)
    signal.signal(signal.SIGTERM, soft_stop)
    try:
        os.unlink(args.handover)
    except FileNotFoundError:
        pass
    server = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    server.bind(args.handover)
    server.listen(4)
    sel = selectors.DefaultSelector()
    sel.register(args.lease, selectors.EVENT_READ, "lease")
    sel.register(server, selectors.EVENT_READ, "handover")
    orphaned_at: float | None = None
    try:
        while proc.poll() is None:
            now = time.monotonic()
            if orphaned_at is not None and not stopping_at and now - orphaned_at >= args.grace:
                soft_stop()  # (no proxy adopted it in time)
            if stopping_at and now - stopping_at[0] >= args.stop_after:
                proc.kill()
            for key, _ in sel.select(timeout=0.2):
                if key.data == "lease":
                    if not os.read(args.lease, 4096):  # (its proxy's end closed: the proxy is gone)
                        sel.unregister(args.lease)
                        orphaned_at = time.monotonic()
                elif key.data == "handover":
                    _hand_over(server, proc.pid, held, orphaned_at is not None)
        return proc.returncode if proc.returncode >= 0 else 128 - proc.returncode
    finally:
        server.close()
        try:
            os.unlink(args.handover)
        except FileNotFoundError:
            pass


def _hand_over(server: socket.socket, pid: int, held: dict[str, int], orphaned: bool) -> None:
    """One adopter's ask: the listening sockets and HAProxy's pid, only when the proxy is gone (a live
    proxy's sockets are its own)."""
    try:
        conn, _ = server.accept()
    except OSError:
        return
    with conn:
        conn.settimeout(2.0)
        try:
            if not orphaned:
                conn.sendall(json.dumps({"error": "its proxy is alive: not handed over"}).encode())
            else:
                names = list(held)
                socket.send_fds(conn, [json.dumps({"pid": pid, "names": names}).encode()],
                                array.array("i", [held[n] for n in names]))
        except OSError:
            pass


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description="Run HAProxy so that it outlives its proxy for a while.")
    p.add_argument("--lease", type=int, required=True, help="the read end of the proxy's lease pipe")
    p.add_argument("--grace", type=float, default=ORPHAN_GRACE_S)
    p.add_argument("--stop-after", type=float, default=STOP_AFTER_S)
    p.add_argument("--handover", required=True, help="the Unix socket an adopter asks")
    p.add_argument("--fd", action="append", default=[], metavar="NAME=FD", help="a listening socket HAProxy inherits")
    p.add_argument("command", nargs=argparse.REMAINDER)
    args = p.parse_args(argv)
    if args.command[:1] == ["--"]:
        args.command = args.command[1:]
    if not args.command:
        p.error("no command to run")
    if os.fork() > 0:  # (detached: the process the proxy started exits now, and the warden, its child,
        os._exit(0)  # is nobody's but init's: Ray kills the children of a worker that died, measured)
    return _run(args)


if __name__ == "__main__":
    sys.exit(main())
