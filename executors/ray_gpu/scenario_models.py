"""The scenario's replica classes on Ray, one per ``reconfigure`` kind of the
scenario format (``CLASSES``).

Each replica process unpickles its class by this module's name, so it imports
only what a replica needs (its context): not the controller, the API or the
scenario runner.
"""

from __future__ import annotations

import os
from typing import Any

from .context import get_replica_context

__all__ = ["NoReconfigure", "PlainReconfigure", "RankReconfigure", "CLASSES"]


class NoReconfigure:
    """The scenario's replica. ``start_failures``: the deployment's first N
    constructions raise (a crash loop), counted across actors by files made
    with O_EXCL in ``fail_dir``. ``pid()``: its process, which the scenario's
    ``hang`` freezes (``scenario._freeze``)."""

    def __init__(self, fail_dir: str | None = None, start_failures: int = 0) -> None:
        for k in range(start_failures):
            try:
                os.close(os.open(os.path.join(fail_dir or ".", f"start-{k}"), os.O_CREAT | os.O_EXCL))
            except FileExistsError:
                continue
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
