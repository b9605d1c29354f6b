"""Where the Ray controller keeps the weights pushed to each deployment (issue 21).

A replica started after a push must load the pushed version
(``InitializeReplica.weights_version``), and one restarting while a push goes
out gets it once ready (``UpdateWeights``): the controller needs the weights
of each version until every replica holds them. They live in Ray's object
store, **once per version**: ``push_weights`` puts them there (the caller's
``ray.put``), and a small detached actor, ``WeightsStore``, puts its own
copy and keeps the ``ObjectRef``: it owns the object, so the weights outlive
a controller restart (an object dies with the process that owns it; the
controller is restarted, the store is not). Each replica gets the object
from the store's node by Ray's own transfer; the controller only passes the
reference along. The last ``KEEP`` versions of each deployment are kept (a
command naming an older one may still be on its way).
"""

from __future__ import annotations

from typing import Any

import ray

from ..base.replicas import NAMESPACE

__all__ = ["STORE_NAME", "KEEP", "WeightsStore", "store"]

STORE_NAME = "rankcore-weights"
#: versions of a deployment's weights kept (the newest ones)
KEEP = 2


class WeightsStore:
    """Deployment -> version -> the ObjectRef of its weights (owned here)."""

    def __init__(self) -> None:
        self.refs: dict[str, dict[int, Any]] = {}

    def put(self, deployment: str, version: int, state_dict: Any) -> list:
        """Keep ``state_dict`` (a mapping of tensors, resolved by Ray from the caller's ref) as
        ``version``; returns ``[ref]`` (in a list: Ray passes it on unresolved)."""
        ref = ray.put(state_dict)
        kept = self.refs.setdefault(deployment, {})
        kept[version] = ref
        for old in sorted(kept)[:-KEEP]:
            del kept[old]
        return [ref]

    def get(self, deployment: str, version: int) -> list | None:
        """``[ref]`` of that version's weights, or None if none is kept."""
        ref = self.refs.get(deployment, {}).get(version)
        return None if ref is None else [ref]

    def drop(self, deployment: str, version: int) -> None:
        """Forget one version (a push the core refused)."""
        self.refs.get(deployment, {}).pop(version, None)

    def forget_all(self) -> None:
        self.refs.clear()


def store() -> Any:
    """The store actor (made on first use; detached, so it outlives the controller)."""
    return ray.remote(WeightsStore).options(name=STORE_NAME, namespace=NAMESPACE, lifetime="detached",
                                           get_if_exists=True, num_cpus=0, max_restarts=0).remote()
