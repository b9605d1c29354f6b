"""Does a sleeping replica really give its GPU memory back? (issue 21, a GPU-only check)

A replica's weights (``executors.ray_gpu.weights.weights.TieredWeights``) go HOT -> WARM
(sleep) while a "trainer" then allocates most of the device in the memory they
left; the trainer frees it and the weights come back HOT (wake), bit-identical.
Prints the device's free memory at each point (``torch.cuda.mem_get_info``, what
another process would see) and whether each check held. Needs CUDA: on a machine
without it, it says so and exits 2 (CI has no GPU; this is not a test).

    .venv/bin/python benchmarks/gpu_sleep_frees_memory.py --gib 4
"""

from __future__ import annotations

import argparse
import time

from common import use_this_tree

use_this_tree()


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--gib", type=float, default=4.0, help="the model's weights, GiB (default %(default)s)")
    args = ap.parse_args(argv)
    import torch

    if not torch.cuda.is_available():
        print("needs CUDA: no GPU here (run it on a lent H100/H200; see docs/benchmarks.md)")
        return 2
    from executors.ray_gpu.weights.weights import TieredWeights

    gib = 1 << 30
    n = int(args.gib * gib) // 4 // 8
    sd = {f"layer{i}": torch.randn(n, device="cpu") for i in range(8)}
    w = TieredWeights(sd, device="cuda")  # HOT
    torch.cuda.synchronize()
    free_hot, total = torch.cuda.mem_get_info()
    move = w.to_warm()
    free_warm, _ = torch.cuda.mem_get_info()
    gained = free_warm - free_hot
    print(f"device {torch.cuda.get_device_name()}: {total / gib:.1f} GiB; weights {w.nbytes / gib:.2f} GiB")
    print(f"free while HOT {free_hot / gib:.2f} GiB, while asleep {free_warm / gib:.2f} GiB "
          f"(+{gained / gib:.2f} GiB; sleep took {move.seconds:.3f} s)")
    ok_freed = gained >= 0.95 * w.nbytes
    trainer = torch.empty(int(free_warm * 0.9) // 4, dtype=torch.float32, device="cuda")  # the trainer's turn
    trainer.fill_(1.0)
    torch.cuda.synchronize()
    print(f"a trainer allocated {trainer.numel() * 4 / gib:.2f} GiB in the freed memory")
    del trainer
    torch.cuda.empty_cache()
    back = w.to_hot()
    same = all(torch.equal(w.state_dict()[k].cpu(), v) for k, v in sd.items())
    print(f"wake took {back.seconds:.3f} s ({w.nbytes / back.seconds / 1e9:.1f} GB/s); bit-identical: {same}")
    for _ in range(2):  # the same sleep and wake with no trainer in between, for comparison
        w.to_warm()
        again = w.to_hot()
        print(f"  again, no trainer between: wake took {again.seconds:.3f} s "
              f"({w.nbytes / again.seconds / 1e9:.1f} GB/s)")
    w.to_warm()  # once more with a trainer, timing a bare allocation of the weights' size before the wake
    trainer = torch.empty(int(free_warm * 0.9) // 4, dtype=torch.float32, device="cuda")
    trainer.fill_(2.0)
    torch.cuda.synchronize()
    del trainer
    torch.cuda.empty_cache()
    t0 = time.perf_counter()
    probe = torch.empty(w.nbytes, dtype=torch.uint8, device="cuda")
    torch.cuda.synchronize()
    t1 = time.perf_counter()
    del probe
    torch.cuda.empty_cache()
    again = w.to_hot()
    print(f"  after a trainer again: allocating {w.nbytes / gib:.2f} GiB took {(t1 - t0) * 1e3:.1f} ms, "
          f"then the wake {again.seconds:.3f} s ({w.nbytes / again.seconds / 1e9:.1f} GB/s)")
    print(f"sleep frees the weights' memory (>= 95%): {'MET' if ok_freed else 'NOT MET'}")
    return 0 if ok_freed and same else 1


if __name__ == "__main__":
    raise SystemExit(main())
