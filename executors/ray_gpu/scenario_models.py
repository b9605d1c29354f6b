"""The scenario's replica classes on Ray, one per ``reconfigure`` kind of the
scenario format (``CLASSES``).

Each replica process unpickles its class by this module's name, so it imports
only what a replica needs (its context): not the controller, the API or the
scenario runner.
"""

from __future__ import annotations

import os
from typing import Any

from .base.context import get_replica_context

__all__ = ["NoReconfigure", "PlainReconfigure", "RankReconfigure", "CLASSES", "Weighted", "WEIGHTED", "weights_for"]


class NoReconfigure:
    """The scenario's replica. ``start_failures``: the deployment's first N
    constructions raise (a crash loop), counted across actors by files made
    with O_EXCL in ``fail_dir`` (the scenario run's: once it is removed, none
    raises). ``pid()``: its process, which the scenario's
    ``hang`` freezes (``scenario._freeze``)."""

    def __init__(self, fail_dir: str | None = None, start_failures: int = 0) -> None:
        for k in range(start_failures):
            try:
                os.close(os.open(os.path.join(fail_dir or ".", f"start-{k}"), os.O_CREAT | os.O_EXCL))
            except FileExistsError:
                continue
            except FileNotFoundError:  # the run that counted is over (its folder removed): no more failures
                return
            raise RuntimeError(f"start_failures: construction {k + 1} of {start_failures} raises")

    def __call__(self) -> Any:
        return get_replica_context().rank.rank

    def pid(self) -> int:
        return os.getpid()


class PlainReconfigure(NoReconfigure):
    def reconfigure(self, user_config: Any) -> None:
        self.user_config = user_config


class RankReconfigure(NoReconfigure):
    def reconfigure(self, user_config: Any, rank: Any) -> None:
        self.user_config, self.rank = user_config, rank


#: the class of each ``reconfigure`` kind (``none``, ``plain``, ``with_rank``)
CLASSES = {"none": NoReconfigure, "plain": PlainReconfigure, "with_rank": RankReconfigure}


def weights_for(model_bytes: int, version: int) -> dict:
    """A scenario model's weights of ``version``: one float32 tensor of ``model_bytes // 4``
    elements, all equal to ``version`` (so a replica's answer says which version it serves)."""
    import torch

    return {"w": torch.full((max(1, model_bytes // 4),), float(version), dtype=torch.float32)}


class Weighted:
    """A scenario replica holding real weights (``deployments.*.model_bytes``): it follows the
    weights contract (``replica_weights``: ``state_dict`` / ``load_state_dict(assign=True)``);
    ``weights_served()`` reads the tensor it serves from (the version, as ``weights_for``
    fills it)."""

    def __init__(self, fail_dir: str | None = None, start_failures: int = 0, model_bytes: int = 0) -> None:
        super().__init__(fail_dir, start_failures)  # type: ignore[call-arg]
        self.tensors = weights_for(model_bytes, 0)

    def state_dict(self) -> dict:
        return dict(self.tensors)

    def load_state_dict(self, state_dict: dict, assign: bool = False) -> None:
        if assign:
            self.tensors = dict(state_dict)
        else:
            for k, v in state_dict.items():
                self.tensors[k].copy_(v)

    def weights_served(self) -> float:
        w = self.tensors["w"]
        return float(w[0]) if w.device.type != "meta" else float("nan")


class WeightedNoReconfigure(Weighted, NoReconfigure):
    pass


class WeightedPlainReconfigure(Weighted, PlainReconfigure):
    pass


class WeightedRankReconfigure(Weighted, RankReconfigure):
    pass


#: ``CLASSES`` for deployments with ``model_bytes``
WEIGHTED = {"none": WeightedNoReconfigure, "plain": WeightedPlainReconfigure, "with_rank": WeightedRankReconfigure}
