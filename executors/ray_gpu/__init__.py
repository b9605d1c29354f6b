"""The Ray executor: real replicas as Ray actors, driven by the core.

``deployment`` / ``run`` / ``DeploymentHandle`` feel like Ray Serve's;
``get_replica_context()`` inside a replica gives its rank record and
world_size (and, on a caller's placement group, its bundles; in a gang, its
gang). The controller runs ``rankcore.step`` through the same driver as the
simulator.
"""

from __future__ import annotations

import importlib
import os
from typing import TYPE_CHECKING, Any

#: gRPC's fork handlers, off unless the environment says otherwise (read once, when ``grpc`` is first
#: imported: this runs before any module here imports it). With them on (grpcio's default) a process
#: whose gRPC channels are busy, as a driver's router sending by value, restarts gRPC's threads in every
#: child it forks, before that child execs; ``ray.init`` starts the GCS and the raylet that way
#: (``subprocess`` with a ``preexec_fn``), and a child that crashes there leaves Ray "timed out during
#: startup". Measured here: 1,857 of 9,798 such children died (SIGSEGV, SIGABRT) with calls in flight
#: on 8 threads, and one can hang there instead, holding its parent in ``Popen``; none of 7,673 with
#: this off. A process that forks and uses gRPC in the child sets it (``docs/ray.md``, by value).
FORK_SUPPORT_VARIABLE = "GRPC_ENABLE_FORK_SUPPORT"
os.environ.setdefault(FORK_SUPPORT_VARIABLE, "false")

if TYPE_CHECKING:
    from .api.deployments import (
        Application,
        Deployment,
        DeploymentHandle,
        DeploymentResponse,
        ask,
        delete,
        deployment,
        get_controller,
        get_deployment_handle,
        idempotent,
        run,
    )
    from .base.context import ReplicaContext, get_replica_context
    from .base.exposed import http_method
    from .control.static import StaticPlacementConfig, bundle_locations, sorted_bundle_mapping
    from .replica.batching import batch
    from .replica.multiplex import get_multiplexed_model_id, multiplexed
    from .weights.shared import WeightsShare, share_weights

__all__ = ["deployment", "run", "delete", "ask", "Deployment", "Application", "DeploymentHandle", "DeploymentResponse",
           "get_controller", "get_deployment_handle", "get_replica_context", "ReplicaContext",
           "StaticPlacementConfig", "bundle_locations", "sorted_bundle_mapping", "WeightsShare", "share_weights",
           "idempotent", "batch", "multiplexed", "get_multiplexed_model_id", "http_method"]

#: where each public name lives. Imported on first use (PEP 562): a replica's
#: worker imports ``executors.ray_gpu.replica.actor`` and must not pay for the
#: controller and the handle (~0.1-0.2 s of every replacement's start).
_WHERE = {
    **dict.fromkeys(("Application", "Deployment", "DeploymentHandle", "DeploymentResponse", "ask", "delete", "deployment",
                     "get_controller", "get_deployment_handle", "run", "idempotent"), "api.deployments"),
    **dict.fromkeys(("ReplicaContext", "get_replica_context"), "base.context"),
    **dict.fromkeys(("StaticPlacementConfig", "bundle_locations", "sorted_bundle_mapping"), "control.static"),
    **dict.fromkeys(("WeightsShare", "share_weights"), "weights.shared"),
    "batch": "replica.batching",
    "http_method": "base.exposed",
    **dict.fromkeys(("multiplexed", "get_multiplexed_model_id"), "replica.multiplex"),
}


def __getattr__(name: str) -> Any:
    where = _WHERE.get(name)
    if where is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(importlib.import_module(f".{where}", __name__), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted([*globals(), *__all__])
