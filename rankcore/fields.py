"""Field validators shared by events, commands and state records.

Malformed input is rejected where the record is built, with a message naming
the record, the field and the value (h11's rule), so a bad event never reaches
``step``.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

import attrs

from .errors import InvalidConfig


def _where(inst: Any, attribute: attrs.Attribute) -> str:
    return f"{type(inst).__name__}.{attribute.name}"


def name(inst: Any, attribute: attrs.Attribute, value: Any) -> None:
    """A non-empty string id (deployment, replica or node)."""
    if not isinstance(value, str) or not value:
        raise InvalidConfig(f"{_where(inst, attribute)} must be a non-empty str, got {value!r}")


def optional_name(inst: Any, attribute: attrs.Attribute, value: Any) -> None:
    if value is not None:
        name(inst, attribute, value)


def count(inst: Any, attribute: attrs.Attribute, value: Any) -> None:
    """A non-negative int (bools are refused: True is not a replica count)."""
    if type(value) is not int or value < 0:
        raise InvalidConfig(f"{_where(inst, attribute)} must be a non-negative int, got {value!r}")


def flag(inst: Any, attribute: attrs.Attribute, value: Any) -> None:
    if type(value) is not bool:
        raise InvalidConfig(f"{_where(inst, attribute)} must be a bool, got {value!r}")


def names(inst: Any, attribute: attrs.Attribute, value: Any) -> None:
    if not isinstance(value, tuple):
        raise InvalidConfig(f"{_where(inst, attribute)} must be a tuple, got {value!r}")
    for v in value:
        if not isinstance(v, str) or not v:
            raise InvalidConfig(f"{_where(inst, attribute)} holds {v!r}, not a non-empty str")
    if len(set(value)) != len(value):
        raise InvalidConfig(f"{_where(inst, attribute)} names a replica twice: {value!r}")


def to_tuple(value: Any) -> Any:
    """Accept any iterable for a tuple field (a list from YAML, a generator).

    Materialised once, *before* validation: a validator that iterated a
    generator would leave the record holding it exhausted. A string or a
    mapping is left alone, for the validator to refuse by name (a str is
    iterable, but "llm#1" is not a list of replica ids).
    """
    if isinstance(value, (tuple, str, bytes, Mapping)):
        return value
    if isinstance(value, Iterable):
        return tuple(value)
    return value


def text(inst: Any, attribute: attrs.Attribute, value: Any) -> None:
    """A str (may be empty)."""
    if not isinstance(value, str):
        raise InvalidConfig(f"{_where(inst, attribute)} must be a str, got {value!r}")


def to_resources(value: Any) -> Any:
    """A resources mapping (``{"GPU": 1}``) or pairs, as sorted ``(name, amount)`` pairs
    (hashable, and its repr is valid Python); anything else is left for the validator."""
    if isinstance(value, Mapping):
        value = list(value.items())
    if isinstance(value, (tuple, list)):
        try:
            pairs = [(k, v) for k, v in value]
        except (TypeError, ValueError):
            return value
        if all(isinstance(k, str) for k, _ in pairs):
            return tuple(sorted((k, float(v) if isinstance(v, int) and not isinstance(v, bool) else v)
                                for k, v in pairs))
    return value


def resources(inst: Any, attribute: attrs.Attribute, value: Any) -> None:
    """Sorted (name, amount) pairs: names non-empty and distinct, amounts finite numbers >= 0."""
    import math

    if not isinstance(value, tuple):
        raise InvalidConfig(f"{_where(inst, attribute)} must be a mapping of resource name to amount, got {value!r}")
    seen = set()
    for k, v in value:
        if not isinstance(k, str) or not k:
            raise InvalidConfig(f"{_where(inst, attribute)} names a resource {k!r}: not a non-empty str")
        if k in seen:
            raise InvalidConfig(f"{_where(inst, attribute)} names {k!r} twice")
        seen.add(k)
        if not isinstance(v, float) or not math.isfinite(v) or v < 0:
            raise InvalidConfig(f"{_where(inst, attribute)}[{k!r}] must be a finite number >= 0, got {v!r}")


def labels(inst: Any, attribute: attrs.Attribute, value: Any) -> None:
    """Sorted (key, value) string pairs."""
    if not isinstance(value, tuple) or not all(
            isinstance(p, tuple) and len(p) == 2 and isinstance(p[0], str) and p[0] and isinstance(p[1], str)
            for p in value):
        raise InvalidConfig(f"{_where(inst, attribute)} must be a mapping of str to str, got {value!r}")


def to_labels(value: Any) -> Any:
    if isinstance(value, Mapping):
        return tuple(sorted(value.items()))
    if isinstance(value, list):
        return tuple(sorted(tuple(p) if isinstance(p, list) else p for p in value))
    return value


def seconds(inst: Any, attribute: attrs.Attribute, value: Any) -> None:
    """A finite number of seconds >= 0 (bools refused)."""
    import math

    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value) or value < 0:
        raise InvalidConfig(f"{_where(inst, attribute)} must be a finite number of seconds >= 0, got {value!r}")


def optional_seconds(inst: Any, attribute: attrs.Attribute, value: Any) -> None:
    """None, or a finite number of seconds >= 0."""
    if value is not None:
        seconds(inst, attribute, value)
