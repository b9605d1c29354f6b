"""A local multi-node Ray cluster shaped like a scenario's ``cluster:`` section.

One head node (no GPUs; the controller lives there, so losing a worker never
takes it along) plus one Ray node per scenario node, with that node's GPUs as
logical GPUs, so ``lose_node``/``add_node`` can be played for real:
``lose`` kills the node's raylet, ``add`` starts a new one. Nodes carry the
placement order label, so replicas spread over them in the scenario's order,
as in the simulator. Health checks are fast (a dead node is seen in ~1.5 s).
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator, Sequence
from typing import Any

from .placement import ORDER_LABEL

__all__ = ["ScenarioCluster", "FAST_HEALTH_CHECKS", "SCENARIO_NODE_LABEL", "in_zone"]

FAST_HEALTH_CHECKS = {"health_check_period_ms": 500, "health_check_failure_threshold": 3,
                      "health_check_initial_delay_ms": 0}
SCENARIO_NODE_LABEL = "rankcore.io/scenario-node"
_STORE = 80 * 1024**2
#: what a Ray node reads its zone label from as it starts (ray._raylet.NODE_ZONE_ENV)
_ZONE_ENV = "RAY_NODE_ZONE"


@contextlib.contextmanager
def in_zone(zone: str) -> Iterator[None]:
    """A local cluster's node started inside this block is in availability zone ``zone`` ("": none):
    Ray's own label (``ray.io/availability-zone``, which Ray reserves), which a node takes from
    ``RAY_NODE_ZONE`` as it starts, read in this process; the variable is as it was after."""
    before = os.environ.pop(_ZONE_ENV, None)
    if zone:
        os.environ[_ZONE_ENV] = zone
    try:
        yield
    finally:
        os.environ.pop(_ZONE_ENV, None)
        if before is not None:
            os.environ[_ZONE_ENV] = before


class ScenarioCluster:
    """Start with ``ScenarioCluster(scenario.nodes)``; ``address`` is what to ``ray.init``."""

    def __init__(self, nodes: Sequence[Any], *, cpus_per_node: float = 2, head_cpus: float = 2) -> None:
        from ray.cluster_utils import Cluster

        self.cpus_per_node = cpus_per_node
        self.cluster = Cluster(initialize_head=True, head_node_args={
            "num_cpus": head_cpus, "num_gpus": 0, "include_dashboard": False, "object_store_memory": _STORE,
            "_system_config": FAST_HEALTH_CHECKS})
        self.nodes: dict[str, Any] = {}
        self.zones: dict[str, str] = {}  # node name -> its zone ("" none)
        self._order = 0
        try:
            for n in nodes:
                self.add(n.name, n.gpus, wait=False, zone=getattr(n, "zone", ""))
            self.cluster.wait_for_nodes()
        except BaseException:
            self.cluster.shutdown()
            raise

    @property
    def address(self) -> str:
        return self.cluster.address

    def node_id(self, name: str) -> str:
        return self.nodes[name].node_id

    def add(self, name: str, gpus: float, *, wait: bool = True, zone: str = "") -> None:
        """A node ``name`` with ``gpus``; ``zone``: its availability zone (``in_zone``)."""
        if name in self.nodes:
            raise ValueError(f"node {name!r} is already in the cluster")
        self.zones[name] = zone = zone or self.zones.get(name, "")  # (a repaired node: its zone again)
        with in_zone(zone):
            self.nodes[name] = self.cluster.add_node(
                num_cpus=self.cpus_per_node, num_gpus=gpus, object_store_memory=_STORE,
                labels={ORDER_LABEL: str(self._order), SCENARIO_NODE_LABEL: name})
        self._order += 1
        if wait:
            self.cluster.wait_for_nodes()

    def lose(self, name: str) -> bool:
        """Kill node ``name`` abruptly (False if it is not in the cluster)."""
        node = self.nodes.pop(name, None)
        if node is None:
            return False
        self.cluster.remove_node(node, allow_graceful=False)
        return True

    def shutdown(self) -> None:
        self.cluster.shutdown()
