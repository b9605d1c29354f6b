"""Real weights across tiers (issue 21): TieredWeights' moves against the plain copies that bound them.

A state dict of ``--gib`` GiB shaped like a transformer (a bf16 embedding,
then layers of bf16 qkv / out / up / down matrices of 8-32 MiB with fp32
norms and bf16 biases) filled with random bytes is moved, ``--repeats``
times: HOT -> WARM, WARM -> HOT, HOT -> WARM, WARM -> COLD, COLD -> HOT.
The best of the repeats is printed next to the plain copy of the same bytes,
timed in the same repeat (moves and plain copies interleave, so a change of
load hits both):

* on CPU (no CUDA): HOT <-> WARM against ``copy_`` into a preallocated
  tensor and ``ctypes.memmove`` (and ``torch.empty`` + ``copy_``, since a
  move to HOT allocates its destination: fresh pages fault in), WARM -> COLD
  against one plain file write, COLD -> HOT against one plain ``readinto``
  of the file into a preallocated buffer and into a new one (both files read
  once before, untimed, so the page cache is warm); the plain copies' CPU
  buffers are made like the mover's (huge pages asked for), so the ratios
  compare the moves, not the page size;
* on CUDA: WARM -> HOT against a pinned host-to-device copy, HOT -> WARM
  against a pinned device-to-host copy (both preallocated), COLD -> HOT in
  GB/s, with issue 21's targets (>= 80%, >= 80%, >= 20 GB/s) as MET / NOT MET;
  for reference, a one-thread ``readinto`` into pinned memory and
  ``safetensors.torch.load_file(device="cuda")``; with ``--sweep``, also
  COLD -> HOT by ``load_pipelined`` for several reader counts and chunk
  sizes, parallel reads of the file into pinned memory alone (the page
  cache's ceiling), and what allocating and releasing the device buffer costs.

GB/s are 10^9 bytes a second. The collector stays on and is not run before
timed regions. At the end the HOT weights are compared with the originals
(bit-identical, every tensor). Run from the repository root:

    .venv/bin/python benchmarks/bench_tiers.py                 # 1 GiB, 3 repeats
    .venv/bin/python benchmarks/bench_tiers.py --gib 4 --repeats 5 --dir /dev/shm
    python3 benchmarks/bench_tiers.py --gib 1 --sweep      # on a GPU machine
"""

from __future__ import annotations

import argparse
import ctypes
import gc
import os
import platform
import struct
import sys
import tempfile
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

from common import use_this_tree

use_this_tree()

import safetensors  # noqa: E402
import torch  # noqa: E402

from executors.ray_gpu.weights.weights import (  # noqa: E402
    DEFAULT_CHUNK_BYTES,
    DEFAULT_READERS,
    TieredWeights,
    _byte_view,
    _empty,
    _pread_full,
    load_pipelined,
)

MIB = 1 << 20


def make_state_dict(gib: float, d: int = 2048) -> dict[str, Any]:
    """A transformer-like state dict of at least ``gib`` GiB, random bytes, seeded."""
    target = int(gib * (1 << 30))
    shapes: list[tuple[str, tuple[int, ...], Any]] = [("embed.weight", (16_000, d), torch.bfloat16)]
    layer = [("qkv.weight", (3 * d, d), torch.bfloat16), ("qkv.bias", (3 * d,), torch.bfloat16),
             ("out.weight", (d, d), torch.bfloat16), ("norm1.weight", (d,), torch.float32),
             ("up.weight", (4 * d, d), torch.bfloat16), ("down.weight", (d, 4 * d), torch.bfloat16),
             ("norm2.weight", (d,), torch.float32)]
    total = 16_000 * d * 2
    i = 0
    while total < target:
        for name, shape, dtype in layer:
            shapes.append((f"layers.{i}.{name}", shape, dtype))
            total += torch.Size(shape).numel() * torch.tensor([], dtype=dtype).element_size()
        i += 1
    g = torch.Generator().manual_seed(0)
    # random bf16 values as the byte source: no NaN bit patterns in bf16 or fp32 (torch.equal compares)
    noise = torch.randn(32 * MIB, generator=g).to(torch.bfloat16).view(torch.uint8)
    sd = {}
    for name, shape, dtype in shapes:
        t = torch.empty(shape, dtype=dtype)
        flat = t.view(-1).view(torch.uint8)
        for off in range(0, flat.numel(), noise.numel()):
            n = min(noise.numel(), flat.numel() - off)
            flat[off:off + n].copy_(noise[:n])
        sd[name] = t
    return sd


def gbps(nbytes: int, seconds: float) -> float:
    return nbytes / seconds / 1e9


def read_into(path: Path, buf: Any) -> None:
    view = memoryview(buf.numpy())
    with open(path, "rb", buffering=0) as f:
        done = 0
        while done < len(view):
            got = f.readinto(view[done:])
            if not got:
                break
            done += got


def best_of(repeats: int, fn: Callable[[], Any], device: Any) -> float:
    """Best wall seconds of ``repeats`` calls of ``fn`` (device synchronised around each; one untimed warm-up)."""
    times = []
    for i in range(repeats + 1):
        _sync(device)
        t0 = time.perf_counter()
        fn()
        _sync(device)
        if i:
            times.append(time.perf_counter() - t0)
    return min(times)


def _sync(device: Any) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def sweep(path: Path, n: int, device: Any, repeats: int) -> None:
    """COLD -> HOT variants on the (page-cached) file ``path``; prints one line each, GB/s of ``n`` bytes.

    Meant for CUDA (staging pinned); runs on CPU too, as a smoke test of this script.
    """
    pin = device.type == "cuda"
    with open(path, "rb") as f:
        data_start = 8 + struct.unpack("<Q", f.read(8))[0]
    chunks_mib = (4, 8, 16, 32)
    readers_all = (1, 2, 4, 8, 12, 16)
    staging = [torch.empty(max(chunks_mib) * MIB, dtype=torch.uint8, pin_memory=pin)
               for _ in range(2 * max(readers_all))]
    pinned = torch.empty(n, dtype=torch.uint8, pin_memory=pin)
    view = _byte_view(pinned)
    dev = torch.empty(n, dtype=torch.uint8, device=device)
    fd = os.open(path, os.O_RDONLY)
    print(f"sweep (best of {repeats} after one warm-up; GB/s of {n} bytes)")
    try:
        for readers in readers_all:  # reads alone: the page cache's ceiling with this many threads
            chunk = 32 * MIB

            def read_all(readers: int = readers, chunk: int = chunk) -> None:
                with ThreadPoolExecutor(readers) as pool:
                    list(pool.map(lambda off: _pread_full(fd, view[off:off + min(chunk, n - off)],
                                                          data_start + off), range(0, n, chunk)))

            s = best_of(repeats, read_all, device)
            print(f"  read only, {readers:2d} threads, 32 MiB chunks into pinned  {gbps(n, s):6.2f} GB/s")
        for readers in readers_all[2:]:
            for chunk_mib in chunks_mib:
                depth = 2 * readers  # as load_pipelined makes its own

                def pipelined(r: int = readers, c: int = chunk_mib, d: int = depth) -> None:
                    load_pipelined(fd, data_start, dev, chunk_bytes=c * MIB, readers=r, staging=staging[:d])

                s = best_of(repeats, pipelined, device)
                print(f"  load_pipelined readers {readers:2d} depth {depth:2d} chunk {chunk_mib:2d} MiB"
                      f"  {gbps(n, s):6.2f} GB/s")
    finally:
        os.close(fd)
    if not pin:
        return
    torch.cuda.empty_cache()
    alloc, free, fresh, again = [], [], [], []
    for _ in range(repeats):
        _sync(device)
        t0 = time.perf_counter()
        x = torch.empty(n, dtype=torch.uint8, device=device)
        _sync(device)
        t1 = time.perf_counter()
        x.copy_(pinned, non_blocking=True)  # into memory just allocated (as a move to HOT copies)
        _sync(device)
        t2 = time.perf_counter()
        x.copy_(pinned, non_blocking=True)  # the same again, into memory written once
        _sync(device)
        t3 = time.perf_counter()
        del x
        torch.cuda.empty_cache()
        _sync(device)
        alloc.append(t1 - t0)
        fresh.append(t2 - t1)
        again.append(t3 - t2)
        free.append(time.perf_counter() - t3)
    print(f"  device buffer of {n} bytes: allocate (cudaMalloc) {min(alloc) * 1e3:.2f} ms, "
          f"free + empty_cache {min(free) * 1e3:.2f} ms (best of {repeats})")
    print(f"  pinned H2D into a just-allocated buffer {gbps(n, min(fresh)):6.2f} GB/s, "
          f"then into the same buffer again {gbps(n, min(again)):6.2f} GB/s (best of {repeats})")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--gib", type=float, default=1.0, help="GiB of weights (default 1.0)")
    ap.add_argument("--repeats", type=int, default=3, help="best of N (default 3)")
    ap.add_argument("--dir", default=tempfile.gettempdir(), help="where the COLD file goes (default: the temp dir)")
    ap.add_argument("--device", default=None, help="default: cuda when available, else cpu")
    ap.add_argument("--readers", type=int, default=None, help="COLD -> HOT reader threads (default: the mover's)")
    ap.add_argument("--chunk-mib", type=int, default=None, help="COLD -> HOT chunk, MiB (default: the mover's)")
    ap.add_argument("--sweep", action="store_true", help="also COLD -> HOT variants (and on CUDA allocation costs)")
    args = ap.parse_args()

    load = os.getloadavg()
    print(f"load average {load[0]:.2f} {load[1]:.2f} {load[2]:.2f}; {os.cpu_count()} CPUs")
    device = torch.device(args.device or ("cuda" if torch.cuda.is_available() else "cpu"))
    cuda = device.type == "cuda"
    print(f"python {platform.python_version()}, torch {torch.__version__}, safetensors {safetensors.__version__}, "
          f"device {device}{' (' + torch.cuda.get_device_name(device) + ')' if cuda else ''}, "
          f"gc enabled={gc.isenabled()}, repeats {args.repeats}, COLD dir {args.dir}, COLD -> HOT "
          f"readers {args.readers or DEFAULT_READERS}, chunk {args.chunk_mib or DEFAULT_CHUNK_BYTES // MIB} MiB")

    t0 = time.perf_counter()
    sd = make_state_dict(args.gib)
    workdir = Path(tempfile.mkdtemp(prefix="bench-tiers-", dir=args.dir))
    w = TieredWeights(sd, device=device, directory=workdir, name="bench",
                      readers=args.readers or DEFAULT_READERS,
                      chunk_bytes=args.chunk_mib * MIB if args.chunk_mib else DEFAULT_CHUNK_BYTES)
    n = w.nbytes
    print(f"{len(sd)} tensors, {n:,} bytes ({n / (1 << 30):.2f} GiB), made in {time.perf_counter() - t0:.1f} s\n")

    def sync() -> None:
        if cuda:
            torch.cuda.synchronize(device)

    # ---- the moves and the plain copies of the same bytes, interleaved per repeat --------------------
    moves: dict[str, list[float]] = {k: [] for k in ("HOT->WARM", "WARM->HOT", "WARM->COLD", "COLD->HOT")}
    plains: dict[str, list[float]] = {}
    host = _empty(n, "cpu", pin=cuda)  # the plain copies' CPU buffers get the same huge-page advice as ours
    host.copy_(torch.cat([t.reshape(-1).view(torch.uint8) for t in sd.values()]))
    plain = workdir / "plain.bin"

    def timed(name: str, fn: Callable[[], Any]) -> None:
        sync()
        t0 = time.perf_counter()
        fn()
        sync()
        plains.setdefault(name, []).append(time.perf_counter() - t0)

    def write() -> None:
        with open(plain, "wb") as f:
            f.write(memoryview(host.numpy()))

    if cuda:
        dev = torch.empty(n, dtype=torch.uint8, device=device)
    else:
        dst = _empty(n, "cpu")
        dst.copy_(host)  # pages touched
    for _ in range(args.repeats):
        moves["HOT->WARM"].append(w.to_warm().seconds)
        moves["WARM->HOT"].append(w.to_hot().seconds)
        w.to_warm()
        moves["WARM->COLD"].append(w.to_cold().seconds)
        assert w.path is not None
        read_into(w.path, torch.empty(os.path.getsize(w.path), dtype=torch.uint8))  # page cache warm, untimed
        moves["COLD->HOT"].append(w.to_hot().seconds)
        if cuda:
            timed("pinned H2D", lambda: dev.copy_(host, non_blocking=True))
            timed("pinned D2H", lambda: host.copy_(dev, non_blocking=True))
            write()
            read_into(plain, host)  # page cache warm, untimed
            timed("readinto pinned", lambda: read_into(plain, host))
        else:
            timed("copy_", lambda: dst.copy_(host))
            timed("memmove", lambda: ctypes.memmove(dst.data_ptr(), host.data_ptr(), n))
            timed("empty+copy_", lambda: _empty(n, "cpu").copy_(host))
            timed("file write", write)
            read_into(plain, dst)  # page cache warm, untimed
            timed("file readinto", lambda: read_into(plain, dst))
            timed("empty+readinto", lambda: read_into(plain, _empty(n, "cpu")))
    if cuda:
        from safetensors.torch import load_file

        w.to_cold()
        cold = w.path
        for _ in range(args.repeats):
            timed("load_file cuda", lambda: load_file(str(cold), device=str(device)))
        if args.sweep:
            assert cold is not None
            sweep(cold, n, device, args.repeats)
        w.to_hot()
    elif args.sweep:
        w.to_cold()
        assert w.path is not None
        sweep(w.path, n, device, args.repeats)
        w.to_hot()
    served = w.state_dict()
    identical = all(torch.equal(served[k].cpu(), sd[k]) for k in sd)
    del served
    ref = {name: min(times) for name, times in plains.items()}

    # ---- report -----------------------------------------------------------------------------------
    print(f"{'what':<22} {'best s':>9} {'GB/s':>7}   (all {args.repeats} runs, s)")
    for name, times in moves.items():
        print(f"{'move ' + name:<22} {min(times):>9.4f} {gbps(n, min(times)):>7.2f}   "
              + " ".join(f"{t:.4f}" for t in times))
    for name, times in plains.items():
        print(f"{'plain ' + name:<22} {min(times):>9.4f} {gbps(n, min(times)):>7.2f}   "
              + " ".join(f"{t:.4f}" for t in times))
    print()

    def ratio(move: str, plain_name: str, target: float | None = None) -> None:
        r = ref[plain_name] / min(moves[move])
        verdict = "" if target is None else ("  MET" if r >= target else "  NOT MET") + f" (target >= {target:.0%})"
        print(f"{move:<11} / plain {plain_name:<14} {r:6.1%} of its speed{verdict}")

    if cuda:
        ratio("WARM->HOT", "pinned H2D", 0.8)
        ratio("HOT->WARM", "pinned D2H", 0.8)
        cold_gbps = gbps(n, min(moves["COLD->HOT"]))
        print(f"COLD->HOT   {cold_gbps:.1f} GB/s from a warm page cache  "
              f"{'MET' if cold_gbps >= 20 else 'NOT MET'} (target >= 20 GB/s)")
    else:
        for move in ("HOT->WARM", "WARM->HOT"):
            ratio(move, "copy_")
            ratio(move, "memmove")
            ratio(move, "empty+copy_")
        ratio("WARM->COLD", "file write")
        ratio("COLD->HOT", "file readinto")
        ratio("COLD->HOT", "empty+readinto")
    print(f"round trip bit-identical (every tensor, torch.equal): {'yes' if identical else 'NO'}")

    for p in workdir.iterdir():
        p.unlink()
    workdir.rmdir()
    if not identical:
        sys.exit(1)


if __name__ == "__main__":
    main()
