"""CUDA IPC vs a host round trip for colocated weight sync (needs one CUDA GPU; not run in CI).

The case of Ray RFC #59857: a trainer and an inference engine share one GPU
(two processes), and the engine needs the trainer's new weights. Two ways:

* ``ipc``: the trainer sends its CUDA tensor through ``torch.multiprocessing``
  (a CUDA IPC handle: no bytes move); the engine maps the trainer's memory
  (``received``: usable in place) and copies it into its own buffer on the
  GPU (``+ device copy``);
* ``host``: the trainer copies GPU -> shared pinned host memory, the engine
  copies host -> GPU (the path without IPC, e.g. through an object store).

Both processes are spawned on GPU 0; times are ``time.perf_counter``
(CLOCK_MONOTONIC, comparable across processes), from the trainer having the
weights ready to the engine having them, median of ``--repeats`` after one
warm-up (the first IPC receive, which opens the handle, is shown apart). A
checksum of the first 1024 values is compared each time. For reference, one
process's device copy and pinned round trip of the same bytes.

    .venv/bin/python benchmarks/gpu_cuda_ipc.py [--gib 1] [--repeats 10]

Exits with code 2 and says so when CUDA is not available.
"""

from __future__ import annotations

import argparse
import queue
import statistics
import sys
import time
from typing import Any


def _pin(t: Any) -> bool:
    """Page-lock ``t``'s (shared) host memory in this process; False if refused."""
    import torch

    try:
        err = torch.cuda.cudart().cudaHostRegister(t.data_ptr(), t.numel() * t.element_size(), 0)
        return int(err) == 0
    except Exception:
        return False


def _checksum(t: Any) -> float:
    return float(t[:1024].double().sum())


def trainer(to_engine: Any, from_engine: Any, host: Any, n: int, repeats: int) -> None:
    import torch

    torch.cuda.set_device(0)
    w = torch.empty(n, dtype=torch.float32, device="cuda").uniform_()
    torch.cuda.synchronize()
    for i in range(repeats + 1):  # CUDA IPC: send the tensor itself (its handle)
        w.add_(1.0)  # "a training step": new weights, in place
        torch.cuda.synchronize()
        to_engine.put(("ipc", i, _checksum(w), time.perf_counter(), w))
        from_engine.get()  # the engine let go of it
    pinned = host is not None and _pin(host)
    for i in range(repeats + 1 if host is not None else 0):  # through shared (pinned) host memory
        w.add_(1.0)
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        host.copy_(w, non_blocking=pinned)
        torch.cuda.synchronize()
        to_engine.put(("host", i, _checksum(w), t0, None))
        from_engine.get()
    to_engine.put(("done", 0, 0.0, 0.0, pinned))


def engine(from_trainer: Any, to_trainer: Any, results: Any, host: Any, n: int) -> None:
    import torch

    torch.cuda.set_device(0)
    mine = torch.empty(n, dtype=torch.float32, device="cuda")
    pinned = host is not None and _pin(host)
    while True:
        kind, i, checksum, t0, t = from_trainer.get()  # (an IPC tensor is mapped here, as it is unpickled)
        if kind == "done":
            results.put(("done", 0, 0.0, 0.0, bool(t) and pinned))
            break
        if kind == "ipc":
            received = time.perf_counter()
            mine.copy_(t)
            torch.cuda.synchronize()
            copied = time.perf_counter()
            del t
        else:
            mine.copy_(host, non_blocking=pinned)
            torch.cuda.synchronize()
            received = copied = time.perf_counter()
        ok = abs(_checksum(mine) - checksum) <= 1e-6 * max(1.0, abs(checksum))
        results.put((kind, i, received - t0, copied - t0, ok))
        to_trainer.put(True)


def one_process(n: int, repeats: int) -> dict[str, float]:
    import torch

    a = torch.empty(n, dtype=torch.float32, device="cuda").uniform_()
    b = torch.empty_like(a)
    host = torch.empty(n, dtype=torch.float32, pin_memory=True)
    out: dict[str, list[float]] = {"device copy": [], "pinned round trip": []}
    for _ in range(repeats + 1):
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        b.copy_(a)
        torch.cuda.synchronize()
        t1 = time.perf_counter()
        host.copy_(a, non_blocking=True)
        b.copy_(host, non_blocking=True)
        torch.cuda.synchronize()
        t2 = time.perf_counter()
        out["device copy"].append(t1 - t0)
        out["pinned round trip"].append(t2 - t1)
    return {k: statistics.median(v[1:]) for k, v in out.items()}


def main() -> int:
    ap = argparse.ArgumentParser(description="CUDA IPC vs a host round trip, two processes on one GPU")
    ap.add_argument("--gib", type=float, default=1.0, help="tensor size in GiB (float32)")
    ap.add_argument("--repeats", type=int, default=10)
    args = ap.parse_args()
    try:
        import torch
    except ImportError:
        print("gpu_cuda_ipc: torch is not installed; nothing to measure", file=sys.stderr)
        return 2
    if not torch.cuda.is_available():
        print("gpu_cuda_ipc: CUDA is not available (torch.cuda.is_available() is False): this benchmark needs a "
              "CUDA GPU; nothing measured", file=sys.stderr)
        return 2
    import torch.multiprocessing as mp

    n = int(args.gib * 1024**3) // 4
    gib = n * 4 / 1024**3
    print(f"torch {torch.__version__}, {torch.cuda.get_device_name(0)}, {gib:.2f} GiB float32, "
          f"median of {args.repeats}")
    ref = one_process(n, args.repeats)
    for label, s in ref.items():
        print(f"  one process, {label:<24} {s * 1e3:8.2f} ms  ({gib / s:7.1f} GiB/s)")

    ctx = mp.get_context("spawn")
    try:
        host = torch.empty(n, dtype=torch.float32).share_memory_()
    except Exception as exc:  # /dev/shm too small, say
        print(f"  (no shared host buffer of {gib:.2f} GiB: {exc}; the host path is skipped)")
        host = None
    to_engine, to_trainer, results = ctx.Queue(), ctx.Queue(), ctx.Queue()
    procs = [ctx.Process(target=trainer, args=(to_engine, to_trainer, host, n, args.repeats)),
             ctx.Process(target=engine, args=(to_engine, to_trainer, results, host, n))]
    for p in procs:
        p.start()
    got: dict[str, list[tuple]] = {"ipc": [], "host": []}
    pinned = False
    deadline = time.monotonic() + 300  # a child that dies must not hold a lent GPU for long
    while True:
        try:
            kind, i, received, copied, ok = results.get(timeout=5)
        except queue.Empty:
            dead = [p.exitcode for p in procs if p.exitcode not in (None, 0)]
            if dead or time.monotonic() > deadline:
                print(f"  no answer from the two processes (exit codes {[p.exitcode for p in procs]}); "
                      "nothing measured", file=sys.stderr)
                for p in procs:
                    p.kill()
                return 1
            continue
        if kind == "done":
            pinned = bool(ok)
            break
        if not ok:
            print(f"  {kind} #{i}: the engine's copy does not match the trainer's weights", file=sys.stderr)
            return 1
        got[kind].append((received, copied))
    for p in procs:
        p.join(timeout=60)
    ipc = got["ipc"]
    print(f"  two processes, ipc first receive (opens the handle) {ipc[0][0] * 1e3:8.2f} ms, "
          f"+ device copy {ipc[0][1] * 1e3:8.2f} ms")
    rest = ipc[1:]
    print(f"  two processes, ipc received (usable in place)      {statistics.median(r for r, _ in rest) * 1e3:8.2f} ms")
    med = statistics.median(c for _, c in rest)
    print(f"  two processes, ipc received + device copy          {med * 1e3:8.2f} ms  ({gib / med:7.1f} GiB/s)")
    if got["host"]:
        med = statistics.median(c for _, c in got["host"][1:])
        print(f"  two processes, host {'pinned' if pinned else 'NOT pinned'} D2H + H2D"
              f"              {med * 1e3:8.2f} ms  ({gib / med:7.1f} GiB/s)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
