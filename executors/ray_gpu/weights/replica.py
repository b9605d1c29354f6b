"""A replica's weights, and the contract with the user's class (issue 21; docs/ray.md, "Sleep, wake and weights").

**The contract.** A deployment's class *holds weights* when its instance has
``state_dict()`` and ``load_state_dict(state_dict, assign=True)``, as a
``torch.nn.Module`` does (a class that wraps a module forwards both to it):

* after the constructor, ``state_dict()`` gives the initial weights (version
  0); they are copied once into the replica's ``TieredWeights`` (one flat
  buffer on the device: CUDA when available, else CPU), then
  ``load_state_dict(views, assign=True)`` hands the instance views of that
  buffer to serve from (a module's parameters then share its storage);
* new weights (``UpdateWeights``) are written in place, in whatever tier the
  weights are: a HOT instance sees them without a call;
* offload (sleep): the weights go to CPU memory and the instance is given
  ``meta`` tensors (``assign=True``), so it keeps no reference to device
  memory; load (wake): the weights come back to a new device buffer and the
  instance is given its views again.

A class without both methods holds no tensors: sleep, wake and updates only
change the tier and version the replica reports (and its context shows).

Not thread-safe; the replica calls it from one thread at a time (its
control pool, each command after the one before it). A request running
while the weights move may see them half-moved: the core sends no request to
a replica that is not serving, but one already under way is not waited for.
"""

from __future__ import annotations

import sys
from collections.abc import Mapping
from typing import Any

__all__ = ["ReplicaWeights", "holds_weights"]


def holds_weights(instance: Any) -> bool:
    """Whether the user's instance follows the contract (module docstring)."""
    return callable(getattr(instance, "state_dict", None)) and callable(getattr(instance, "load_state_dict", None))


class ReplicaWeights:
    """Where one replica's weights are (``tier``: ``"hot"`` or ``"warm"``) and their ``version``."""

    def __init__(self, name: str) -> None:
        self.name = name
        self.tier = "hot"
        self.version = 0
        self.tiered: Any = None  # a TieredWeights, when the instance holds weights
        self.instance: Any = None
        #: where its weights came from at its start: "constructor", "warm" (the node's cache),
        #: "cold" (the node's COLD file); ``note`` says why a source the core named was not used
        self.loaded_from = "constructor"
        self.note = ""
        #: the trainer's share the last update was copied from (``shared_weights``), "" if none
        self.shared = ""

    def attach(self, instance: Any, device: Any = None) -> None:
        """Take the constructed instance's initial weights (version 0), if it holds any, onto
        ``device`` (None: CUDA when available, else the CPU)."""
        self.instance = instance
        if not holds_weights(instance):
            return
        from .weights import TieredWeights  # (torch: only in replicas whose class holds weights)

        self.tiered = TieredWeights(instance.state_dict(), version=0, name=self.name, device=device)
        self._bind()

    def fill(self, source: str, warm: Any, cold_path: str | None, version: int) -> None:
        """A replica booked by memory (``PlaceReplica.source``): its weights from the node's WARM
        copy (``warm``: ``FlatWeights``, None if the cache had none) when ``source`` is "warm",
        else, or failing that, from the node's COLD file when it holds ``version`` (the weights
        the core says this replica starts with); else the constructor's stay. Each fallback is
        noted (``note``), never silent; the bytes are checked against the layout either way."""
        if not source:
            return
        if self.tiered is None:  # nothing to load: the tier is all there is
            self.loaded_from = source
            return
        notes = []
        if source == "warm":
            if warm is None:
                notes.append("no warm copy on this node")
            else:
                try:
                    self.tiered.update(warm.state_dict(), warm.version)
                except Exception as exc:
                    notes.append(f"warm copy refused: {exc}")
                else:
                    self.version, self.loaded_from = warm.version, "warm"
                    self._bind()
                    return
        import os

        if cold_path is not None and os.path.exists(cold_path):
            try:
                self.version = self.tiered.load_file(cold_path, version)
            except Exception as exc:
                notes.append(f"cold file refused: {exc}")
            else:
                self.loaded_from = "cold"
                self.note = "; ".join(notes)
                self._bind()
                return
        else:
            notes.append("no cold file on this node")
        self.note = "; ".join(notes)

    def evict(self, to: str, path: str | None) -> Any:
        """``EvictReplica``: the weights leave this replica (its process ends next). ``to="warm"``:
        returns them as ``FlatWeights`` for the node's cache (None: no tensors); ``"cold"``:
        writes them to ``path`` (the node's COLD file) and returns the bytes written."""
        if self.tiered is None:
            return None if to == "warm" else 0
        if to == "warm":
            return self.tiered.to_flat()
        if path is None:
            raise RuntimeError(f"replica {self.name}: an eviction to cold needs the node's COLD file path")
        return self.tiered.to_cold(path).nbytes

    @property
    def nbytes(self) -> int:
        return self.tiered.nbytes if self.tiered is not None else 0

    def offload(self) -> int:
        """HOT -> WARM; returns the bytes moved."""
        if self.tier != "hot":
            raise RuntimeError(f"replica {self.name}: its weights are {self.tier}, not hot: nothing to offload")
        if self.tiered is not None:
            import torch

            meta = {k: torch.empty_like(v, device="meta") for k, v in self.tiered.state_dict().items()}
            # first: the instance lets go of the device buffer, so leaving HOT can free it (CUDA)
            self.instance.load_state_dict(meta, assign=True)
            try:
                self.tiered.to_warm()
            except BaseException:
                self._bind()  # the weights stay HOT (TierMoveFailed): the instance serves them again
                raise
        self.tier = "warm"
        return self.nbytes

    def load(self) -> int:
        """WARM -> HOT; returns the bytes moved."""
        if self.tier != "warm":
            raise RuntimeError(f"replica {self.name}: its weights are {self.tier}, not warm: nothing to load")
        if self.tiered is not None:
            self.tiered.to_hot()
            try:
                self._bind()
            except BaseException:
                self.tiered.to_warm()  # the weights stay WARM (TierMoveFailed)
                raise
        self.tier = "hot"
        return self.nbytes

    def update(self, version: int, state_dict: Mapping[str, Any] | None) -> int:
        """Hold ``state_dict`` as ``version``, in place in the current tier; returns the bytes written.
        An older or equal version changes nothing (an update sent again)."""
        if version <= self.version:
            return 0
        if self.tiered is not None:
            if state_dict is None:
                raise RuntimeError(f"replica {self.name}: no weights for version {version}")
            from .shared import SharedWeights

            if isinstance(state_dict, SharedWeights):
                self._update_shared(version, state_dict)
            else:
                self.tiered.update(state_dict, version)
        self.version = version
        return self.nbytes

    def _update_shared(self, version: int, handle: Any) -> None:
        """New weights from a trainer's share (``shared_weights``): copied from its mapping, opened once,
        when it lives on this node; else from its fallback copy in the object store, if it has one."""
        from .shared import SharedWeightsUnavailable, open_shared, this_node

        if handle.here():
            open_shared(handle).copy_into(lambda views: self.tiered.update(views, version), version)
            self.shared = handle.share_id
            return
        if handle.fallback is None:
            raise SharedWeightsUnavailable(
                f"replica {self.name} on node {this_node()}: version {version} was shared on node "
                f"{handle.node_id} only (no copy for other nodes): push it again as a state_dict")
        import ray

        self.tiered.update(ray.get(handle.fallback), version)
        self.shared = ""

    def export(self) -> dict:
        """A CPU copy of the weights the instance serves from (only while HOT, and only a holder's)."""
        if self.tiered is None or self.tier != "hot":
            raise RuntimeError(f"replica {self.name}: no hot weights to export ({self.tier})")
        return {k: v.detach().to("cpu", copy=True) for k, v in self.tiered.state_dict().items()}

    def info(self) -> dict:
        """What the replica says about its weights (tests, tools)."""
        t = self.tiered
        shared = sys.modules.get("executors.ray_gpu.weights.shared")
        return {"shares_opened": shared.opened() if shared is not None else 0,
                "tier": self.tier, "version": self.version, "nbytes": self.nbytes, "holds": t is not None,
                "host_nbytes": t.host_nbytes if t is not None else 0,
                "device": str(t.device) if t is not None else None,
                "tiered_tier": t.tier if t is not None else None,
                "loaded_from": self.loaded_from, "note": self.note, "shared": self.shared}

    def _bind(self) -> None:
        self.instance.load_state_dict(self.tiered.state_dict(), assign=True)
