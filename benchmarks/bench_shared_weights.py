"""A weight push to colocated replicas on Ray: by state_dict (the object store) against by share (issue 21).

An RL trainer pushes new weights every step to the replicas on its node.
``push_weights(name, state_dict, v)`` puts the weights in Ray's object store
(the caller's ``ray.put``, the store actor's own copy) and each replica copies
them out; ``push_weights(name, share, v)`` after ``share.write(state_dict, v)``
(``executors/ray_gpu/weights/shared.py``) sends a handle, and each replica
copies from the shared buffer it opened once. Both are timed end to end, as a
trainer waits for them: ``write`` (share only) + ``push_weights(...,
wait=True)`` until every replica serves the version. The two kinds of push
alternate, ``--repeats`` times each, and the median and best of each are
printed with their ratio, and the bytes each replica holds are checked
against the pushed ones at the end.

Without CUDA the share is ``/dev/shm`` and the copies are memcpy; with
CUDA (``--device cuda``, the default when torch sees a GPU) the share is CUDA
IPC memory on GPU 0, the replicas hold their weights on that GPU (each asks
for ``1 / replicas`` of it) and their copies are device to device; a pinned
round trip of the same bytes in this process (device -> pinned host ->
device: the path without IPC) is printed beside them. The collector stays
on. Run from the repository root:

    .venv/bin/python benchmarks/bench_shared_weights.py               # 256 MiB, 2 replicas, 5 repeats
    .venv/bin/python benchmarks/bench_shared_weights.py --mib 1024 --replicas 2 --repeats 3
"""

from __future__ import annotations

import argparse
import os
import statistics
import time

from common import ROOT, use_this_tree

use_this_tree()

import ray  # noqa: E402
import torch  # noqa: E402

MIB = 1 << 20


class Holder:
    """A replica that holds ``mib`` MiB of float32 weights in 8 MiB tensors (the weights contract)."""

    def __init__(self, mib: int) -> None:
        n = max(1, mib // 8)
        self.tensors = {f"layer{i:03d}": torch.zeros(2 * MIB, dtype=torch.float32) for i in range(n)}

    def state_dict(self) -> dict:
        return dict(self.tensors)

    def load_state_dict(self, state_dict: dict, assign: bool = False) -> None:
        self.tensors = dict(state_dict)

    def __call__(self) -> float:
        return float(next(iter(self.tensors.values()))[0])


def weights(mib: int, version: int, device: str = "cpu") -> dict:
    n = max(1, mib // 8)
    return {f"layer{i:03d}": torch.full((2 * MIB,), float(version), dtype=torch.float32, device=device)
            for i in range(n)}


def pinned_round_trip(nbytes: int, repeats: int) -> float:
    """Median seconds of device -> pinned host -> device for ``nbytes`` (the copy a push without IPC makes)."""
    a = torch.empty(nbytes, dtype=torch.uint8, device="cuda").fill_(1)
    b, host = torch.empty_like(a), torch.empty(nbytes, dtype=torch.uint8, pin_memory=True)
    ts = []
    for _ in range(repeats + 1):
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        host.copy_(a, non_blocking=True)
        b.copy_(host, non_blocking=True)
        torch.cuda.synchronize()
        ts.append(time.perf_counter() - t0)
    return statistics.median(ts[1:])


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--mib", type=int, default=256, help="weights per replica, MiB (default 256)")
    p.add_argument("--replicas", type=int, default=2)
    p.add_argument("--repeats", type=int, default=5)
    p.add_argument("--device", choices=("auto", "cpu", "cuda"), default="auto",
                   help="where the share and the replicas' weights live (auto: cuda when torch sees a GPU)")
    args = p.parse_args(argv)
    if args.mib < 8 or args.replicas < 1 or args.repeats < 1:
        p.error("--mib >= 8, --replicas >= 1, --repeats >= 1")
    device = ("cuda" if torch.cuda.is_available() else "cpu") if args.device == "auto" else args.device
    if device == "cuda" and not torch.cuda.is_available():
        p.error("--device cuda: torch sees no CUDA GPU here")
    os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
    os.environ.setdefault("RAY_AUTH_MODE", "disabled")
    from executors.ray_gpu import deployment, run, share_weights
    from executors.ray_gpu.api.deployments import push_weights, weights_status

    gpus = torch.cuda.device_count() if device == "cuda" else 4  # (CPU: logical GPUs, none asked for)
    ray.init(address="local", num_cpus=max(4, args.replicas + 2), num_gpus=gpus, include_dashboard=False,
             log_to_driver=False, runtime_env={"env_vars": {"PYTHONPATH": os.pathsep.join(
                 filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))}})
    try:
        opts = {"num_gpus": round(1 / args.replicas, 4)} if device == "cuda" else {}
        run(deployment(Holder, name="bench", num_replicas=args.replicas, ray_actor_options=opts).bind(args.mib),
            timeout=120)
        nbytes = (max(1, args.mib // 8) * 8) * MIB
        share = share_weights(weights(args.mib, 0, device), 0, device=device)
        times: dict[str, list[float]] = {"state_dict": [], "share": []}
        version = 0
        where = (f"CUDA: {torch.cuda.get_device_name(0)}, share by CUDA IPC" if device == "cuda"
                 else "CPU: share in /dev/shm")
        print(f"{args.mib} MiB per replica ({nbytes / 1e9:.2f} GB), {args.replicas} replicas on one node, "
              f"{args.repeats} pushes of each kind, alternating; {where}; torch {torch.__version__}", flush=True)
        for r in range(args.repeats):
            for kind in ("state_dict", "share"):
                version += 1
                new = weights(args.mib, version, device)
                t0 = time.perf_counter()
                if kind == "share":
                    share.write(new, version)
                    push_weights("bench", share, version, wait=True, timeout=300)
                else:
                    push_weights("bench", new, version, wait=True, timeout=300)
                times[kind].append(time.perf_counter() - t0)
                print(f"  repeat {r + 1}/{args.repeats} {kind:10s} {times[kind][-1] * 1e3:9.1f} ms", flush=True)
        st = weights_status("bench")
        reps = [v for k, v in st.items() if k != "deployment"]
        ok = all(v["version"] == version for v in reps) and all(v["shares_opened"] == 1 for v in reps)
        devices = sorted({str(v.get("device")) for v in reps})
        ok = ok and all(d.startswith(device) for d in devices)
        print(f"replicas' weights on: {', '.join(devices)}")
        print()
        print(f"{'push':12s} {'median ms':>10s} {'best ms':>10s} {'GB/s (all replicas)':>20s}")
        for kind, ts in times.items():
            med = statistics.median(ts)
            print(f"{kind:12s} {med * 1e3:10.1f} {min(ts) * 1e3:10.1f} {nbytes * args.replicas / med / 1e9:20.2f}")
        if device == "cuda":
            rt = pinned_round_trip(nbytes, args.repeats)
            print(f"{'pinned D2H+H2D (one copy, no Ray)':34s} {rt * 1e3:10.1f} ms {nbytes / rt / 1e9:8.2f} GB/s")
        ratio = statistics.median(times["state_dict"]) / statistics.median(times["share"])
        print(f"by share is {ratio:.2f}x as fast as by state_dict (medians); every replica holds version "
              f"{version} and opened the share once: {'yes' if ok else 'NO'}")
        share.close()
        return 0 if ok else 1
    finally:
        ray.shutdown()


if __name__ == "__main__":
    raise SystemExit(main())
