"""Collective groups as plain data: what the core keeps of a group, and what a member is told.

A deployment with ``collective_group`` forms one group of its replicas (a gang deployment: one
per gang, named as the gang is). The group's membership is the tuple of replica ids holding its
ranks ``0 .. world_size - 1``, in rank order; its **epoch** rises by one each time that tuple
changes, and only once every rank is held by a running replica (a re-form never starts before
every member of the epoch is up). Replica ids are never reused, so a member of an older epoch can
never be counted in a newer one: the epoch and the members together fence a rendezvous.

The rule that raises epochs is ``rankcore.control.groups``; this module is its vocabulary.

Internal module: import its public names from ``rankcore`` (docs/embedding.md,
"What you may import").
"""

from __future__ import annotations

import hashlib

import attrs

from . import fields as f

__all__ = ["Group", "GroupContext"]


@attrs.frozen(kw_only=True)
class Group:
    """What the core keeps of one group: its epoch (0: never formed), the members it was formed
    with (replica ids in rank order) and whether every one of them was told it (``told``: False
    only after a recovery that found some member still on an older epoch, or a member gone: the
    next pass then forms a newer epoch, even with the same members)."""

    epoch: int = attrs.field(default=0, validator=f.count)
    members: tuple[str, ...] = attrs.field(default=(), converter=f.to_tuple, validator=f.names)
    told: bool = attrs.field(default=True, validator=f.flag)


@attrs.frozen(kw_only=True)
class GroupContext:
    """What one member is told of its group's epoch (``ReformGroup.group``, the replica context's
    ``group``): the group's id, the epoch, the member's rank in it, the world size, the members in
    rank order, and where it stood before: ``previous_epoch`` (0: none) and ``previous_rank`` (its
    rank in the previous epoch; None when it was not a member: it joins, it does not re-form)."""

    group_id: str = attrs.field(validator=f.name)
    epoch: int = attrs.field(validator=f.count)
    rank: int = attrs.field(validator=f.count)
    world_size: int = attrs.field(validator=f.count)
    members: tuple[str, ...] = attrs.field(converter=f.to_tuple, validator=f.names)
    previous_epoch: int = attrs.field(default=0, validator=f.count)
    previous_rank: int | None = attrs.field(default=None, validator=attrs.validators.optional(f.count))

    @property
    def in_place(self) -> bool:
        """This member was in the previous epoch on the same rank: it keeps its process, weights
        and shard, and only re-joins the group."""
        return self.previous_rank == self.rank

    @property
    def rendezvous_key(self) -> str:
        """A key naming this epoch and no other (its members are part of it: replica ids are
        never reused, so even an epoch number a recovered core hands out again names a new key)."""
        digest = hashlib.blake2s("\0".join(self.members).encode(), digest_size=8).hexdigest()
        return f"{self.group_id}/epoch-{self.epoch}/{digest}"
