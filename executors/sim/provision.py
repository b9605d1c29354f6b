"""The simulator's node provider: the core's ``RequestResources`` answered as Ray's
autoscaler answers ``request_resources`` (``cluster.provisioning`` in a scenario).

Ray's rule, kept here: the request is the whole need of the cluster (``held`` plus one
bundle per waiting replica), packed first-fit-decreasing into the nodes the cluster
has and those already launched; whatever does not fit launches new nodes of the
configured shape, never more than ``max_nodes`` in all. A launched node joins
``delay_s`` later (``NodeJoined``), whatever the demand has become meanwhile (a
launch is not taken back). Nodes are never removed: Ray's idle-node timeout is not
modelled. The simulated nodes hold GPUs only, so bundles are packed by their GPUs.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any, Protocol

import rankcore as rc

from ..scenarios.format import Provisioning


class _Clock(Protocol):
    """What the provisioner needs of the simulation (``world.SimServices`` has it; not imported:
    the world imports this module)."""

    now: float

    def schedule(self, delay: float, fn: Callable, *args: Any, last: bool = False) -> int: ...

    def note(self, type_: str, **fields: Any) -> None: ...


class _Nodes(Protocol):
    """What it reads of the simulated cluster (``world.SimBackend``): its nodes by name."""

    @property
    def nodes(self) -> Mapping[str, Any]: ...

__all__ = ["SimProvisioner"]

_EPS = 1e-9


class SimProvisioner:
    """Launches nodes for the core's demand; counts what it did (``as_dict``)."""

    def __init__(self, sim: _Clock, backend: _Nodes, spec: Provisioning,
                 join: Callable[[str, float], None]) -> None:
        """``join(name, gpus)``: a launched node joins the cluster (the runner's ``add_node``)."""
        self.sim, self.backend, self.spec, self.join = sim, backend, spec, join
        self.launching: dict[str, float] = {}  # node name -> its GPUs: launched, not joined yet
        self.requests = 0  # RequestResources received
        self.launched = 0
        self.joined: list[float] = []  # when each node added joined
        self.unmet = 0  # bundles of the last request no node of the shape can hold
        self._names = 0

    def request(self, cmd: rc.RequestResources) -> None:
        """Ray's autoscaler on a new request: launch what the cluster cannot fit."""
        self.requests += 1
        bundles = sorted((b.get("GPU", 0.0) for b in cmd.bundles()), reverse=True)
        live = [n.gpus - n.held for n in self.backend.nodes.values() if n.alive]
        bins = live + list(self.launching.values())
        room = self.spec.max_nodes - len(live) - len(self.launching)
        new: list[float] = []
        self.unmet = 0
        for gpus in bundles:
            if gpus <= _EPS:
                continue
            i = next((i for i, free in enumerate(bins) if free + _EPS >= gpus), None)
            if i is not None:
                bins[i] -= gpus
                continue
            if gpus > self.spec.gpus + _EPS or len(new) >= room:
                self.unmet += 1  # (bigger than a node, or the cluster is at max_nodes)
                continue
            new.append(self.spec.gpus)
            bins.append(self.spec.gpus - gpus)
        for _ in new:
            self._launch()

    def _launch(self) -> None:
        while True:
            name = f"auto-{self._names}"
            self._names += 1
            if name not in self.backend.nodes:
                break
        self.launching[name] = self.spec.gpus
        self.launched += 1
        self.sim.note("node_launched", node=name, gpus=self.spec.gpus)
        self.sim.schedule(self.spec.delay_s, self._join, name)

    def _join(self, name: str) -> None:
        gpus = self.launching.pop(name)
        self.joined.append(self.sim.now)
        self.join(name, gpus)

    def as_dict(self) -> dict[str, Any]:
        """The run's figures (``metrics["provisioning"]``)."""
        return {"requests": self.requests, "nodes_launched": self.launched, "nodes_added": len(self.joined),
                "first_join_s": round(min(self.joined), 6) if self.joined else None,
                "last_join_s": round(max(self.joined), 6) if self.joined else None,
                "unmet_bundles": self.unmet}
