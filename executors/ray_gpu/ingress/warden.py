"""An HAProxy's warden: the direct data plane outlives the proxy actor that runs it, for a while (issue 65).

A proxy actor killed or crashed used to take its HAProxy along (``PR_SET_PDEATHSIG``), and with it the
node's public sockets: until the core had started the next proxy (about 2 s), every new connection was
refused and every request in flight failed, most of them before any replica had seen them. Now each
HAProxy runs under a warden, a small process of its own (this file, run as a script: the standard library
only, nothing of Ray or rankcore loaded):

* the warden is HAProxy's parent, and HAProxy dies with it (``PR_SET_PDEATHSIG``): no HAProxy ever
  outlives its warden;
* the warden is started by the proxy but detaches at once (nobody's child but init's: Ray kills the
  children of a worker that died), in a session of its own, holding the read end of a *lease* pipe whose
  write end only the proxy holds. The proxy gone (its end closed: dead, however it died), HAProxy goes on
  serving the table it holds, straight to the replicas, for ``--grace`` seconds (from the proxy's death,
  or from its last handover);
* the next proxy on the node *adopts* it (``haproxy.adopt``, ``adopt_from`` here): it asks the warden
  for the listening sockets over the warden's handover socket (``SCM_RIGHTS``; only once the lease is
  broken), listens on them with an HAProxy of its own, which tells this one to finish its connections
  and go (``-sf``). The port is never closed, no connection is refused, and the requests in flight
  finish;
* no proxy came within the grace: HAProxy is told to finish its connections and go (``SIGUSR1``), the
  warden closes its own copies of the sockets (the port is free once HAProxy has let go: at once), and
  HAProxy is killed ``--stop-after`` seconds later if it is still finishing.

A warden told ``SIGUSR1`` or ``SIGTERM`` passes a soft stop on to HAProxy; it exits when HAProxy does,
with its status (written to its standard error when not 0). Its first line on standard output is its
pid and HAProxy's. Ray's ``RAY_kill_child_processes_on_worker_exit_with_raylet_subreaper=1`` makes the
raylet kill such processes too: with it, HAProxy dies with its proxy, as before.
"""

from __future__ import annotations

import argparse
import array
import contextlib
import json
import os
import selectors
import signal
import socket
import subprocess
import sys
import time
from typing import Any

__all__ = ["ORPHAN_GRACE_S", "STOP_AFTER_S", "SCRIPT", "command", "start", "alive", "Process", "Warden", "adopt_from",
           "Handed"]

#: how long an HAProxy whose proxy died goes on serving, waiting for the next proxy to adopt it (the core
#: starts one within 2 s here; Ray Serve's fast mode took 22-32 s to bring its proxy back, bench_chaos)
ORPHAN_GRACE_S = 30.0
#: how long an HAProxy told to finish its connections (no proxy came) has, before it is killed
STOP_AFTER_S = 10.0
#: this file, run as a script by the proxy (``python -I warden.py ...``)
SCRIPT = os.path.abspath(__file__)


def command(haproxy: list[str], lease_fd: int, fds: dict[str, int], handover: str,
            grace_s: float = ORPHAN_GRACE_S, stop_after_s: float = STOP_AFTER_S) -> list[str]:
    """The command line that runs ``haproxy`` under a warden (``pass_fds``: ``lease_fd`` and ``fds``'
    descriptors, the listening sockets by name, which HAProxy inherits)."""
    return [sys.executable, "-I", SCRIPT, "--lease", str(lease_fd), "--grace", repr(grace_s),
            "--stop-after", repr(stop_after_s), "--handover", handover,
            *(f"--fd={name}={fd}" for name, fd in fds.items()), "--", *haproxy]


def alive(pid: int) -> bool:
    """Whether a process ``pid`` runs (0 and below name none; another user's counts as running)."""
    if pid <= 0:
        return False  # (no process named: 0 would signal our own group)
    try:
        os.kill(pid, 0)
    except (ProcessLookupError, OverflowError):
        return False
    except PermissionError:
        return True
    return True


class Process:
    """A process known by its pid, not this one's child (a warden detaches; an adopted HAProxy is another
    warden's), through a pidfd where the kernel has them: no pid reused since is signalled by mistake."""

    def __init__(self, pid: int) -> None:
        self.pid = pid
        try:
            self._fd: int | None = os.pidfd_open(pid)
        except (AttributeError, OSError):  # (no pidfd here, or it has gone already)
            self._fd = None

    def running(self) -> bool:
        return not self.wait(0.0)

    def signal(self, sig: int) -> None:
        """``sig`` to it; nothing when it has gone."""
        try:
            if self._fd is not None:
                signal.pidfd_send_signal(self._fd, sig)
            elif alive(self.pid):
                os.kill(self.pid, sig)
        except ProcessLookupError:
            pass

    def wait(self, timeout: float) -> bool:
        """Whether it has gone within ``timeout`` seconds."""
        fd = self._fd
        if fd is not None:
            try:
                return _readable(fd, timeout)
            except (OSError, ValueError):  # (closed meanwhile, by another thread: asked by pid)
                pass
        deadline = time.monotonic() + timeout
        while alive(self.pid):
            if time.monotonic() >= deadline:
                return False
            time.sleep(0.02)
        return True

    def finish(self, timeout: float) -> None:
        """Wait ``timeout`` seconds for it to go (told already), else kill it; then let it go."""
        if not self.wait(timeout):
            self.signal(signal.SIGKILL)
            self.wait(5.0)
        self.close()

    def close(self) -> None:
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None


class Warden(Process):
    """A running warden, seen from the proxy that started it (``start``). ``signal``: ``SIGUSR1`` or
    ``SIGTERM`` tell HAProxy to finish and go, ``SIGKILL`` kills HAProxy with it. ``haproxy``: its
    HAProxy's pid; ``stderr``: HAProxy's standard error and the warden's (its exit status, when not 0)."""

    def __init__(self, pid: int, haproxy: int, stderr: Any) -> None:
        super().__init__(pid)
        self.haproxy, self.stderr = haproxy, stderr

    def abandon(self) -> None:
        """A start that failed: killed (its HAProxy with it), its pidfd and pipe closed."""
        self.signal(signal.SIGKILL)
        self.close()
        self.stderr.close()


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
    """What an adopted warden handed over: its HAProxy (``Process``, watched from the moment it was
    handed over) and the listening sockets by name."""

    def __init__(self, pid: int, sockets: dict[str, socket.socket]) -> None:
        self.sockets = sockets
        self.process = Process(pid)

    @property
    def pid(self) -> int:
        return self.process.pid

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

    held = {name: int(fd) for name, fd in (item.split("=", 1) for item in args.fd)}
    with contextlib.suppress(FileNotFoundError):  # (its handover socket first: a path it cannot bind
        os.unlink(args.handover)  # fails the start, not the adoption later)
    server = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    server.bind(args.handover)
    server.listen(4)
    stopping_at: list[float] = []
    proc: subprocess.Popen | None = None

    def soft_stop(*_: Any) -> None:
        if not stopping_at:
            stopping_at.append(time.monotonic())
            for fd in held.values():  # (nothing more to hand over: the port is free once HAProxy lets go)
                os.close(fd)
            held.clear()
        if proc is not None and proc.poll() is None:
            proc.send_signal(signal.SIGUSR1)

    signal.signal(signal.SIGUSR1, soft_stop)  # (before HAProxy starts: a stop told at once is kept)
    signal.signal(signal.SIGTERM, soft_stop)
    # (SIGPIPE left ignored, as in this process: HAProxy's standard error is the proxy's pipe, gone with it)
    proc = subprocess.Popen(args.command, pass_fds=tuple(held.values()), stdout=subprocess.DEVNULL,
                            preexec_fn=die_with_warden, restore_signals=False)
    print(os.getpid(), proc.pid, flush=True)
    sys.stdout.close()  # (the proxy reads to here)
    if stopping_at:  # (told before HAProxy was there to tell)
        proc.send_signal(signal.SIGUSR1)
    sel = selectors.DefaultSelector()
    sel.register(args.lease, selectors.EVENT_READ, "lease")
    sel.register(server, selectors.EVENT_READ, "handover")
    orphaned_at: list[float] = []
    try:
        while proc.poll() is None:
            now = time.monotonic()
            if orphaned_at and not stopping_at and now - orphaned_at[0] >= args.grace:
                soft_stop()  # (no proxy adopted it in time)
            if stopping_at and now - stopping_at[0] >= args.stop_after:
                proc.kill()
            for key, _ in sel.select(timeout=0.2):
                if key.data == "lease":
                    _read_lease(args.lease, sel, orphaned_at)
                elif key.data == "handover":
                    _read_lease(args.lease, sel, orphaned_at)  # (an EOF not read yet: the proxy is gone)
                    if _hand_over(server, proc.pid, held, bool(orphaned_at) and not stopping_at):
                        orphaned_at[:] = [time.monotonic()]  # (its adopter takes over within its own wait)
        code = proc.returncode if proc.returncode >= 0 else 128 - proc.returncode
        if code:
            print(f"[WARNING] (warden) HAProxy {proc.pid} exited with status {code}", file=sys.stderr, flush=True)
        return code
    finally:
        server.close()
        with contextlib.suppress(FileNotFoundError):
            os.unlink(args.handover)


def _read_lease(lease: int, sel: selectors.BaseSelector, orphaned_at: list[float]) -> None:
    """Whether the proxy's end of the lease has closed (the proxy gone, however): noted once."""
    if orphaned_at or not _readable(lease, 0.0):
        return
    if not os.read(lease, 4096):
        sel.unregister(lease)
        orphaned_at.append(time.monotonic())


def _hand_over(server: socket.socket, pid: int, held: dict[str, int], orphaned: bool) -> bool:
    """One adopter's ask: the listening sockets and HAProxy's pid, only when the proxy is gone (a live
    proxy's sockets are its own) and HAProxy was not told to stop. Whether they were handed over."""
    try:
        conn, _ = server.accept()
    except OSError:
        return False
    with conn:
        conn.settimeout(2.0)
        try:
            if not orphaned:
                conn.sendall(json.dumps({"error": "its proxy is alive, or it is stopping: not handed over"}).encode())
                return False
            names = list(held)
            socket.send_fds(conn, [json.dumps({"pid": pid, "names": names}).encode()],
                            array.array("i", [held[n] for n in names]))
            return True
        except OSError:
            return False


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
