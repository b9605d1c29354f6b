"""The Ray executor: real replicas as Ray actors, driven by the core.

``deployment`` / ``run`` / ``DeploymentHandle`` feel like Ray Serve's;
``get_replica_context()`` inside a replica gives its rank record and
world_size. The controller runs ``rankcore.step`` through the same driver as
the simulator.
"""

from .api import Application, Deployment, DeploymentHandle, DeploymentResponse, deployment, get_controller, run
from .context import ReplicaContext, get_replica_context

__all__ = ["deployment", "run", "Deployment", "Application", "DeploymentHandle", "DeploymentResponse",
           "get_controller", "get_replica_context", "ReplicaContext"]
