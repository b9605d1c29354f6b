"""The error hierarchy: bad input raises, a broken invariant raises; nothing falls back.

Ray Serve's production mode answers a rank error with rank (0, 0, 0); rankcore
raises instead, and because every state is immutable the caller's state is
untouched by a rejected event.

Internal module: import its public names from ``rankcore`` (docs/embedding.md,
"What you may import").
"""

from __future__ import annotations

__all__ = [
    "RankcoreError",
    "InvalidEvent",
    "InvalidConfig",
    "InvariantViolation",
    "RankConflict",
    "UnknownReplica",
    "UnknownDeployment",
]


class RankcoreError(Exception):
    """Base class of every error rankcore raises on purpose."""


class InvalidConfig(RankcoreError, ValueError):
    """A record was built with a malformed field (names the field and value)."""


class InvalidEvent(RankcoreError):
    """A well-formed event that is illegal in the current state."""


class InvariantViolation(RankcoreError):
    """An internal rule of ranks was broken (a bug, never a fallback)."""


class RankConflict(RankcoreError):
    """A rank operation would give one rank to two holders."""


class UnknownReplica(RankcoreError, KeyError):
    """A replica the rank table does not hold."""

    def __str__(self) -> str:  # KeyError would repr() the message
        return str(self.args[0]) if self.args else "unknown replica"


class UnknownDeployment(RankcoreError, KeyError):
    """A read (``State.deployment``, ``State.ranks``) named a deployment the state
    does not hold. Events naming one raise :class:`InvalidEvent` instead."""

    def __str__(self) -> str:
        return str(self.args[0]) if self.args else "unknown deployment"
