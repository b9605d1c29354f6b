"""A what-if sweep's tier figures as one PNG (issue 21): per variant and model, the cold and
warm loads, the evictions, the replica-hours HOT and the wait to be HOT.

    rankcore simulate SCENARIO --set ... --format json --output sweep.json
    python -m executors.sim.plot_tiers sweep.json docs/img/tiers-sweep.png
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

__all__ = ["plot_tier_sweep", "sweep_main"]

#: (figure key, panel title, scale)
PANELS = (("cold_loads", "cold loads (from disk)", 1.0), ("warm_loads", "warm loads (from CPU cache)", 1.0),
          ("evictions", "evictions", 1.0), ("hot_seconds", "replica-hours HOT", 1 / 3600),
          ("wait_to_hot_s", "wait to be HOT, sum (s)", 1.0), ("wait_to_hot_max", "wait to be HOT, max (s)", 1.0))


def plot_tier_sweep(summary: list[dict], out: Path, title: str = "") -> None:
    """Grouped bars of ``summary`` (``executors.sweep.summarise``' rows): a panel per figure, a
    group per variant, a bar per deployment (the mean over the seeds)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    variants: list[str] = []
    deps: list[str] = []
    for row in summary:
        v = ", ".join(f"{k.split('.')[-1]}={x}" for k, x in row["variant"].items()) or "base"
        if v not in variants:
            variants.append(v)
        if row["deployment"] not in deps:
            deps.append(row["deployment"])
    fig, axes = plt.subplots(2, 3, figsize=(15, 7.5))
    width = 0.8 / max(1, len(deps))
    for ax, (key, label, scale) in zip(axes.flat, PANELS):
        for j, d in enumerate(deps):
            ys = []
            for v in variants:
                rows = [r for r in summary if r["deployment"] == d and (", ".join(
                    f"{k.split('.')[-1]}={x}" for k, x in r["variant"].items()) or "base") == v]
                mean = rows[0]["figures"][key]["mean"] if rows else None
                ys.append(0.0 if mean is None else mean * scale)
            ax.bar([i + j * width for i in range(len(variants))], ys, width, label=d)
        ax.set_title(label)
        ax.set_xticks([i + width * (len(deps) - 1) / 2 for i in range(len(variants))])
        ax.set_xticklabels([v.replace("gpus_per_node=", "GPUs/node ").replace("cpu_cache=", "cache ")
                            .replace(", ", "\n") for v in variants], fontsize=8)
        ax.grid(axis="y", alpha=0.3)
    axes.flat[0].legend()
    fig.suptitle(title)
    fig.tight_layout()
    fig.savefig(out, dpi=90)
    plt.close(fig)


def sweep_main(argv: list[str], draw: Any) -> None:
    """``python -m executors.sim.plot_X sweep.json out.png``: ``draw(summary, out, title=...)`` of the
    JSON a sweep wrote (``--format json --output``), titled by its scenario and seeds."""
    src, out = Path(argv[0]), Path(argv[1])
    data = json.loads(src.read_text())
    name = data["runs"][0]["scenario"] if data.get("runs") else src.stem
    draw(data["summary"], out, title=f"what-if: {name} (mean over {data['summary'][0]['runs']} seeds)")


def main(argv: list[str]) -> None:
    sweep_main(argv, plot_tier_sweep)


if __name__ == "__main__":
    main(sys.argv[1:])
