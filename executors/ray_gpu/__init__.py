"""The Ray executor: real replicas as Ray actors, driven by the core.

``deployment`` / ``run`` / ``DeploymentHandle`` feel like Ray Serve's;
``get_replica_context()`` inside a replica gives its rank record and
world_size (and, on a caller's placement group, its bundles; in a gang, its
gang). The controller runs ``rankcore.step`` through the same driver as the
simulator.
"""

from .api import (
    Application,
    Deployment,
    DeploymentHandle,
    DeploymentResponse,
    ask,
    deployment,
    get_controller,
    get_deployment_handle,
    run,
)
from .context import ReplicaContext, get_replica_context
from .static import StaticPlacementConfig, bundle_locations, sorted_bundle_mapping

__all__ = ["deployment", "run", "ask", "Deployment", "Application", "DeploymentHandle", "DeploymentResponse",
           "get_controller", "get_deployment_handle", "get_replica_context", "ReplicaContext",
           "StaticPlacementConfig", "bundle_locations", "sorted_bundle_mapping"]
