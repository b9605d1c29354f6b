"""A what-if sweep's multiplexing figures as one PNG (issue 39): per variant, the model hit rate,
model loads a minute and the latency p99, a line per value of the second swept key
(``executors.sim.plot_batches``' drawing, with these panels and a linear x axis).

    rankcore simulate SCENARIO --set traffic.D.models.max_num_models_per_replica=1,2,3,5 \\
        --set deployments.D.replicas=2,4,8 --format json --output sweep.json
    python -m executors.sim.plot_models sweep.json docs/img/multiplex-sweep.png
"""

from __future__ import annotations

import sys
from pathlib import Path

from .plot_batches import plot_batch_sweep
from .plot_tiers import sweep_main

__all__ = ["plot_model_sweep"]

#: (figure key, panel title)
PANELS = (("requests_model_hit_rate", "model hit rate"), ("requests_model_loads_per_min", "model loads per minute"),
          ("requests_latency_p99", "latency p99 (s)"))


def plot_model_sweep(summary: list[dict], out: Path, title: str = "") -> None:
    """Lines of ``summary`` (``executors.sweep.summarise``' rows, one deployment): the first swept
    key (the bound) on the x axis, a line per value of the others (replicas)."""
    plot_batch_sweep(summary, out, title, panels=PANELS, x_log=False)


def main(argv: list[str]) -> None:
    sweep_main(argv, plot_model_sweep)


if __name__ == "__main__":
    main(sys.argv[1:])
