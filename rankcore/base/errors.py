"""The error hierarchy: bad input raises, a broken invariant raises; nothing falls back.

Ray Serve's production mode answers a rank error with rank (0, 0, 0); rankcore
raises instead, and because every state is immutable the caller's state is
untouched by a rejected event.

Internal module: import its public names from ``rankcore`` (docs/embedding.md,
"What you may import").
"""

from __future__ import annotations

from typing import NoReturn

__all__ = [
    "assert_never",
    "RankcoreError",
    "InvalidEvent",
    "InvalidConfig",
    "InvariantViolation",
    "RankConflict",
    "UnknownReplica",
    "UnknownDeployment",
    "RequestError",
    "Overloaded",
    "Unavailable",
    "RequestTimeout",
    "RequestCancelled",
    "ReplicaDied",
    "REQUEST_ERRORS",
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


class RequestError(RankcoreError):
    """A request ended without an answer (``rankcore.requests``: a ``Rejected`` or ``Failed``
    action). ``status`` is what an HTTP ingress answers with; ``reason`` the machine's reason."""

    status = 500
    reason = "failed"

    def __init__(self, message: str, *, deployment: str | None = None, request_id: str | None = None,
                 replica_id: str | None = None) -> None:
        super().__init__(message)
        self.deployment, self.request_id, self.replica_id = deployment, request_id, replica_id


class Overloaded(RequestError):
    """The deployment's queue is at ``max_queued_requests``: refused at once (HTTP 503)."""

    status, reason = 503, "overloaded"


class Unavailable(RequestError):
    """No replica serves and none is coming (HTTP 503)."""

    status, reason = 503, "unavailable"


class RequestTimeout(RequestError, TimeoutError):
    """The request's deadline passed before it was answered (HTTP 408)."""

    status, reason = 408, "timeout"


class RequestCancelled(RequestError):
    """The caller cancelled the request (HTTP 499, as nginx logs a client that went away)."""

    status, reason = 499, "cancelled"


class ReplicaDied(RequestError):
    """The replica running the request died, and the request could not run again (not idempotent,
    a stream already under way, or its retries used up); the message names the replica (HTTP 500,
    as Ray Serve answers a replica that died mid-call)."""

    status, reason = 500, "replica_died"


#: a request machine's reason -> the error a caller gets
REQUEST_ERRORS: dict[str, type[RequestError]] = {
    "overloaded": Overloaded, "unavailable": Unavailable, "timeout": RequestTimeout, "cancelled": RequestCancelled,
    "replica_died": ReplicaDied,
}


def assert_never(value: NoReturn) -> NoReturn:
    """The last arm of a ``match`` over an enum: mypy refuses the call where a member is left
    without its own arm (the value's type is not ``Never`` there), and at run time a value no arm
    took is a broken invariant, named (``typing.assert_never`` is Python 3.11's; we support 3.10)."""
    raise InvariantViolation(f"no rule for {value!r}: a member of its enum has no arm of its own")
