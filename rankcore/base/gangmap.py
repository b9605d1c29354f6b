"""Gangs as plain data: their numbering and what a member knows of its gang.

A deployment with ``gang_size = k`` has gangs of k replicas: gang g holds the
global ranks ``g*k .. g*k+k-1`` (so ranks are contiguous per gang, and per node
when the gang fits on one node). Its target is a multiple of k, a downscale
removes whole gangs from the top (nothing to compact), and the core places a
gang all or nothing (``rankcore.placement.policies.choose_gang``). When a member fails,
``restart_gang`` replaces every member on its rank (the others are stopped),
``restart_replica`` replaces only that member (the others are told the new
member list, ``GangChanged``). A gang whose start a controller crash cut short
is restarted whole on its ranks at recovery.

A gang is named by its position, which never changes: ``"<deployment>/gang-<g>"``.

The rules that act on gangs are in ``rankcore.placement.gangs``, which re-exports these
names (``rankcore.placement.gangs.gang_id``).

Internal module: import its public names from ``rankcore`` (docs/embedding.md,
"What you may import").
"""

from __future__ import annotations

import attrs

from . import fields as f
from .errors import InvalidConfig

__all__ = ["GangContext", "GANG_PLACEMENTS", "GANG_FAILURES", "gang_id", "gang_index", "gang_ranks"]

#: ``pack``: the whole gang on one node when it fits, else on as few nodes as
#: possible, consecutive ranks together. ``spread``: members on distinct nodes
#: when there are enough.
GANG_PLACEMENTS = ("pack", "spread")
#: what a member's failure restarts
GANG_FAILURES = ("restart_gang", "restart_replica")


def gang_index(global_rank: int, size: int) -> int:
    return global_rank // size


def gang_ranks(g: int, size: int) -> range:
    return range(g * size, (g + 1) * size)


def gang_id(deployment: str, g: int) -> str:
    return f"{deployment}/gang-{g}"


def _members(inst: object, attribute: attrs.Attribute, value: object) -> None:
    if not isinstance(value, tuple) or not all(isinstance(v, str) and v for v in value):
        raise InvalidConfig(f"GangContext.members must be a tuple of replica ids, got {value!r}")


@attrs.frozen(kw_only=True)
class GangContext:
    """What a gang member knows of its gang (on ``StartReplica.gang`` and the
    replica context): its id, the member's rank in it, its size, and the
    members' replica ids in gang-rank order."""

    gang_id: str = attrs.field(validator=f.name)
    rank_in_gang: int = attrs.field(validator=f.count)
    gang_size: int = attrs.field(validator=f.count)
    members: tuple[str, ...] = attrs.field(converter=f.to_tuple, validator=_members)
