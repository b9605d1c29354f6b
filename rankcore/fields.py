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
