"""A what-if sweep's batching figures as one PNG (issue 39): per variant, requests answered a
second, the latency p99 and the mean batch size, a line per value of the second swept key.

    rankcore simulate SCENARIO --set traffic.D.batch.max_batch_size=4,8,16,32 \\
        --set traffic.D.batch.batch_wait_timeout_s=0.005,0.02 --format json --output sweep.json
    python -m executors.sim.plot_batches sweep.json docs/img/batching-sweep.png
"""

from __future__ import annotations

import sys
from pathlib import Path

from .plot_tiers import sweep_main

__all__ = ["plot_batch_sweep"]

#: (figure key, panel title)
PANELS = (("requests_throughput_rps", "answered per second"), ("requests_latency_p99", "latency p99 (s)"),
          ("requests_batch_size_mean", "mean batch size"))


def plot_batch_sweep(summary: list[dict], out: Path, title: str = "", panels: tuple = PANELS,
                     x_log: bool = True) -> None:
    """Lines of ``summary`` (``executors.sweep.summarise``' rows, one deployment): the first swept
    key on the x axis (``x_log``: a log2 scale), a line per value of the others (the mean over the
    seeds), a panel per ``(figure key, title)`` of ``panels``."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    if not summary:
        raise ValueError("the sweep has no rows")
    keys = list(summary[0]["variant"])
    if not keys:
        raise ValueError("the sweep varied nothing: give --set KEY=V1,V2")
    x_key, rest = keys[0], keys[1:]
    lines: dict[str, list[tuple[float, dict]]] = {}
    for row in summary:
        label = ", ".join(f"{k.split('.')[-1]}={row['variant'][k]}" for k in rest) or row["deployment"]
        lines.setdefault(label, []).append((float(row["variant"][x_key]), row["figures"]))
    fig, axes = plt.subplots(1, len(panels), figsize=(5 * len(panels), 4))
    for ax, (key, label) in zip(axes, panels):
        for name, points in lines.items():
            points.sort(key=lambda p: p[0])
            xs = [x for x, _ in points]
            ys = [f.get(key, {}).get("mean") for _, f in points]
            ax.plot(xs, [float("nan") if y is None else y for y in ys], marker="o", label=name)
        ax.set_title(label)
        ax.set_xlabel(x_key.split(".")[-1])
        if x_log:
            ax.set_xscale("log", base=2)
        if key == "requests_latency_p99":
            ax.set_yscale("log")
        ax.grid(alpha=0.3)
    axes[0].legend(fontsize=8)
    fig.suptitle(title)
    fig.tight_layout()
    fig.savefig(out, dpi=90)
    plt.close(fig)


def main(argv: list[str]) -> None:
    sweep_main(argv, plot_batch_sweep)


if __name__ == "__main__":
    main(sys.argv[1:])
