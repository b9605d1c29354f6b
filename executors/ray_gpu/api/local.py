"""Run a script on a local Ray: logical GPUs when there is no CUDA, the
replicas and Ray shut down afterwards (every example's ``__main__``)."""

from __future__ import annotations

import os
from collections.abc import Callable
from typing import Any

import ray

from .deployments import get_controller


def run_locally(main: Callable[[], Any], *, logical_gpus: int | None = None) -> Any:
    """``ray.init(address="local")`` with ``logical_gpus`` GPUs unless CUDA is
    there (then Ray counts the real ones), ``main()``, then every replica
    stopped through rankcore, their COLD files removed, and Ray shut down."""
    os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
    os.environ.setdefault("RAY_AUTH_MODE", "disabled")
    gpus = None
    if logical_gpus is not None:
        import torch

        gpus = None if torch.cuda.is_available() else logical_gpus
    ray.init(address="local", num_cpus=4, num_gpus=gpus, include_dashboard=False, log_to_driver=False)
    try:
        return main()
    finally:
        ctl = get_controller()
        ray.get(ctl.shutdown_replicas.remote())
        ray.get(ctl.remove_cold_files.remote())  # (the run's own temp files go with it)
        ray.shutdown()
