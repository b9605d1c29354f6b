"""Field validators shared by events, commands and state records.

Malformed input is rejected where the record is built, with a message naming
the record, the field and the value (h11's rule), so a bad event never reaches
``step``; and ``check_record`` checks it again at the boundary (``step``, the
request plane's machines), for a record that was not built by its constructor
(unpickled, built by ``rankcore.base.records.maker``, forged).

Internal module: import its public names from ``rankcore`` (docs/embedding.md,
"What you may import").
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from typing import Any

import attrs

from .errors import InvalidConfig, RankcoreError

#: how much of a value an error message shows
SHOWN = 80


def _where(inst: Any, attribute: attrs.Attribute) -> str:
    return f"{type(inst).__name__}.{attribute.name}"


def shown(value: Any, limit: int = SHOWN) -> str:
    """``repr(value)`` for an error message, cut to ``limit`` characters: a
    5,000-digit id or a 400-digit int must not flood the message (nor make
    it fail: ``repr`` of an int over Python's digit limit raises)."""
    if type(value) is int and value.bit_length() > 3 * limit:
        return f"an int of about {value.bit_length() * 30103 // 100000 + 1} digits"
    try:
        text = repr(value)
    except ValueError:  # (a huge int inside a container)
        return f"a {type(value).__name__} too large to show"
    except Exception:  # (a repr that raises)
        return f"a {type(value).__name__} that cannot be shown"
    if len(text) > limit:
        return f"{text[:limit]}... ({len(text)} characters)"
    return text


def finite(value: Any) -> bool:
    """A real number (an int or a float, not a bool) that is finite as a
    float: an int too large for a float is not (``math.isfinite`` would
    raise ``OverflowError`` on it)."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return False
    try:
        return math.isfinite(value)
    except OverflowError:
        return False


def name(inst: Any, attribute: attrs.Attribute, value: Any) -> None:
    """A non-empty string id (deployment, replica or node)."""
    if type(value) is not str or not value:  # (a str subclass may compare equal to another id)
        raise InvalidConfig(f"{_where(inst, attribute)} must be a non-empty str, got {shown_id(value)}")


def shown_id(value: Any) -> str:
    """``value`` shown, with its type where it is a str subclass (which shows as a plain str):
    ids are plain str (a subclass may compare equal to another id and find its record)."""
    if isinstance(value, str) and type(value) is not str:
        return f"{shown(value)} (of type {type(value).__name__}: a subclass of str, which may equal another id)"
    return shown(value)


def positive(inst: Any, attribute: attrs.Attribute, value: Any) -> None:
    """A finite number > 0 (bools refused)."""
    if not finite(value) or value <= 0:
        raise InvalidConfig(f"{_where(inst, attribute)} must be a finite number > 0, got {shown(value)}")


def optional_positive(inst: Any, attribute: attrs.Attribute, value: Any) -> None:
    """None, or a finite number > 0."""
    if value is not None:
        positive(inst, attribute, value)


def optional_name(inst: Any, attribute: attrs.Attribute, value: Any) -> None:
    if value is not None:
        name(inst, attribute, value)


def count(inst: Any, attribute: attrs.Attribute, value: Any) -> None:
    """A non-negative int (bools are refused: True is not a replica count)."""
    if type(value) is not int or value < 0:
        raise InvalidConfig(f"{_where(inst, attribute)} must be a non-negative int, got {shown(value)}")


def optional_count(inst: Any, attribute: attrs.Attribute, value: Any) -> None:
    """None, or a non-negative int."""
    if value is not None:
        count(inst, attribute, value)


#: the largest value a tie-breaking int may take (a node's ``order``): what a
#: 64-bit scheduler would hold; a 400-digit order is a mistake, not a preference
MAX_ORDER = 2**63 - 1


def order(inst: Any, attribute: attrs.Attribute, value: Any) -> None:
    """A non-negative int no larger than ``MAX_ORDER``: an order, or what a 64-bit counter holds (a
    version, requests queued or in flight, bytes): a 400-digit count is a mistake, its average
    overflows a float (the autoscaler divides), and one of 5,000 digits cannot even be written (a
    message, a trace's JSON)."""
    count(inst, attribute, value)
    if value > MAX_ORDER:
        raise InvalidConfig(f"{_where(inst, attribute)} must be at most 2**63 - 1, got {shown(value)}")


def flag(inst: Any, attribute: attrs.Attribute, value: Any) -> None:
    if type(value) is not bool:
        raise InvalidConfig(f"{_where(inst, attribute)} must be a bool, got {shown(value)}")


def names(inst: Any, attribute: attrs.Attribute, value: Any) -> None:
    if not isinstance(value, tuple):
        raise InvalidConfig(f"{_where(inst, attribute)} must be a tuple, got {shown(value)}")
    for v in value:
        if type(v) is not str or not v:  # (a str subclass may compare equal to another id)
            raise InvalidConfig(f"{_where(inst, attribute)} holds {shown_id(v)}, not a non-empty str")
    if len(set(value)) != len(value):
        raise InvalidConfig(f"{_where(inst, attribute)} names a replica twice: {shown(value)}")


def model_id(value: Any, where: str) -> str:
    """``value`` if it is a non-empty str (a multiplexed model id), else ``InvalidConfig`` naming
    ``where`` (Serve's checks: a string, not empty)."""
    if type(value) is not str or not value:
        raise InvalidConfig(f"{where} must be a non-empty string (a multiplexed model id), got {shown(value)}")
    return value


def model_ids(inst: Any, attribute: attrs.Attribute, value: Any) -> None:
    """A tuple of distinct multiplexed model ids."""
    if type(value) is not tuple:
        raise InvalidConfig(f"{_where(inst, attribute)} must be a tuple of model ids, got {shown(value)}")
    for m in value:
        model_id(m, f"{_where(inst, attribute)}'s items")
    if len(set(value)) != len(value):
        raise InvalidConfig(f"{_where(inst, attribute)} names a model twice: {shown(value)}")


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
        raise InvalidConfig(f"{_where(inst, attribute)} must be a str, got {shown(value)}")


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
            return tuple(sorted((k, _as_float(v)) for k, v in pairs))
    return value


def _as_float(v: Any) -> Any:
    """An int amount as a float; an int too large for a float, a bool or
    anything else is left for the validator to refuse by name."""
    if type(v) is int:
        try:
            return float(v)
        except OverflowError:
            return v
    return v


#: the largest resource amount (``resources``): a node's free room is its resources less what is
#: booked, and above 2**53 a float loses whole units (1e300 GPUs less 2 is 1e300: a booking vanishes)
MAX_AMOUNT = float(2**53)


def resources(inst: Any, attribute: attrs.Attribute, value: Any) -> None:
    """Sorted (name, amount) pairs: names non-empty and distinct, amounts finite numbers from 0 to 2**53."""
    if not isinstance(value, tuple) or not all(isinstance(p, tuple) and len(p) == 2 for p in value):
        raise InvalidConfig(f"{_where(inst, attribute)} must be a mapping of resource name to amount, got {shown(value)}")
    seen = set()
    for k, v in value:
        if not isinstance(k, str) or not k:
            raise InvalidConfig(f"{_where(inst, attribute)} names a resource {shown(k)}: not a non-empty str")
        if k in seen:
            raise InvalidConfig(f"{_where(inst, attribute)} names {shown(k)} twice")
        seen.add(k)
        if not isinstance(v, float) or not finite(v) or v < 0:
            raise InvalidConfig(f"{_where(inst, attribute)}[{shown(k)}] must be a finite number >= 0, got {shown(v)}")
        if v > MAX_AMOUNT:
            raise InvalidConfig(f"{_where(inst, attribute)}[{shown(k)}] must be at most 2**53 (a float adds and "
                                f"subtracts whole units exactly below it), got {shown(v)}")


def labels(inst: Any, attribute: attrs.Attribute, value: Any) -> None:
    """Sorted (key, value) string pairs."""
    if not isinstance(value, tuple) or not all(
            isinstance(p, tuple) and len(p) == 2 and isinstance(p[0], str) and p[0] and isinstance(p[1], str)
            for p in value):
        raise InvalidConfig(f"{_where(inst, attribute)} must be a mapping of str to str, got {shown(value)}")


def to_labels(value: Any) -> Any:
    if isinstance(value, Mapping):
        return tuple(sorted(value.items()))
    if isinstance(value, list):
        return tuple(sorted(tuple(p) if isinstance(p, list) else p for p in value))
    return value


def _frozen(value: Any) -> Any:
    if isinstance(value, Mapping):
        return tuple(sorted((k, _frozen(v)) for k, v in value.items()))
    if isinstance(value, list):
        return tuple(_frozen(v) for v in value)
    return value


def to_kwargs(value: Any) -> Any:
    """Keywords (a mapping, or pairs) as sorted ``(name, value)`` pairs, lists and mappings inside
    made tuples (hashable, as a config must be); anything else is left for the validator."""
    if isinstance(value, Mapping):
        return _frozen(value)
    if isinstance(value, (list, tuple)) and all(isinstance(p, (list, tuple)) and len(p) == 2 for p in value):
        return tuple(sorted((p[0], _frozen(p[1])) for p in value))
    return value


def _plain(value: Any) -> bool:
    if isinstance(value, tuple):
        return all(_plain(v) for v in value)
    return value is None or isinstance(value, (str, int, float, bool))


def kwargs(inst: Any, attribute: attrs.Attribute, value: Any) -> None:
    """Keywords: ``(name, value)`` pairs (``to_kwargs``), names str, values plain data (str, numbers,
    bools, None, lists and mappings of them), as Ray Serve's JSON-serializable router kwargs."""
    if not isinstance(value, tuple) or not all(
            isinstance(p, tuple) and len(p) == 2 and isinstance(p[0], str) and _plain(p[1]) for p in value):
        raise InvalidConfig(f"{_where(inst, attribute)} must be a mapping of str to plain data (str, numbers, bools, "
                            f"None, lists and mappings of them), got {shown(value)}")


def seconds(inst: Any, attribute: attrs.Attribute, value: Any) -> None:
    """A finite number of seconds >= 0 (bools refused; an int too large for a float refused)."""
    if not finite(value) or value < 0:
        raise InvalidConfig(f"{_where(inst, attribute)} must be a finite number of seconds >= 0, got {shown(value)}")


def optional_seconds(inst: Any, attribute: attrs.Attribute, value: Any) -> None:
    """None, or a finite number of seconds >= 0."""
    if value is not None:
        seconds(inst, attribute, value)


def positive_seconds(inst: Any, attribute: attrs.Attribute, value: Any) -> None:
    """A finite number of seconds > 0 (a period, a timeout)."""
    seconds(inst, attribute, value)
    if value <= 0:
        raise InvalidConfig(f"{_where(inst, attribute)} must be > 0 seconds, got {shown(value)}")


def optional_positive_seconds(inst: Any, attribute: attrs.Attribute, value: Any) -> None:
    """None, or a finite number of seconds > 0."""
    if value is not None:
        positive_seconds(inst, attribute, value)


def queue_limit(inst: Any, attribute: attrs.Attribute, value: Any) -> None:
    """Ray Serve's ``max_queued_requests``: -1 (no limit) or an int >= 0 (bools refused)."""
    if type(value) is not int or value < -1:
        raise InvalidConfig(f"{_where(inst, attribute)} must be -1 (no limit) or an int >= 0, got {shown(value)}")


def positive_int(inst: Any, attribute: attrs.Attribute, value: Any) -> None:
    """An int >= 1 (bools refused)."""
    if type(value) is not int or value < 1:
        raise InvalidConfig(f"{_where(inst, attribute)} must be an int >= 1, got {shown(value)}")


# ------------------------------------------------------------- records at a boundary
#: the validators whose accepted values a check can test inline (a plain value of the
#: plainest type); anything else calls the validator itself
_INLINE = {
    name: "(type(v) is str and v)",
    optional_name: "(v is None or (type(v) is str and v))",
    text: "type(v) is str",
    flag: "(v is True or v is False)",
    count: "(type(v) is int and v >= 0)",
    order: f"(type(v) is int and 0 <= v <= {MAX_ORDER})",
    positive_int: "(type(v) is int and v >= 1)",
    seconds: "(type(v) is float and 0.0 <= v < _inf)",
    optional_seconds: "(v is None or (type(v) is float and 0.0 <= v < _inf))",
}
_CHECKERS: dict[type, Any] = {}


def check_record(record: Any) -> None:
    """Check ``record`` (an event, a command, an option group) as its constructor would:
    every converter would leave each field as it is, every validator passes, and the
    records it holds pass too. For records that reached a boundary without their
    constructor (unpickled, built by ``rankcore.base.records.maker``, forged): ``step``
    and the request plane's machines call it on every event, so what they take in is
    always what a constructor could have built. Raises ``InvalidConfig`` naming the
    record and the field."""
    kind = type(record)
    check = _CHECKERS.get(kind)
    if check is None:
        check = checker(kind)
    check(record)


def checker(cls: type) -> Any:
    """``check_record`` for ``cls`` alone, generated once: a field holding a plain value
    of the plainest type its validator takes is checked inline (~50 ns), any other goes
    through ``_field_check`` (its converter, its validator, the records it holds)."""
    check = _CHECKERS.get(cls)
    if check is not None:
        return check
    scope: dict[str, Any] = {"_inf": math.inf, "_missing": _missing, "_cls": cls}
    body = []
    for i, a in enumerate(attrs.fields(cls)):
        if a.converter is None and a.validator is None:
            continue  # (any value: a user_config)
        scope[f"_k{i}"] = _field_check(cls, a)
        inline = next((e for k, e in _INLINE.items() if k is a.validator), None) if a.converter is None else None
        body.append(f"        v = o.{a.name}\n")
        body.append(f"        if not {inline}:\n            _k{i}(o, v)\n" if inline else f"        _k{i}(o, v)\n")
    post = getattr(cls, "__attrs_post_init__", None)
    if post is not None:  # (its checks: rankcore.base.bundles.StaticPlacement)
        scope["_post"] = _guarded(f"{cls.__name__}", post)
        body.append("        _post(o)\n")
    src = ("def check(o):\n    try:\n" + ("".join(body) or "        pass\n")
           + "    except AttributeError:\n        _missing(_cls, o)\n")
    exec(compile(src, f"<rankcore.base.fields check for {cls.__name__}>", "exec"), scope)
    _CHECKERS[cls] = check = scope["check"]
    return check


def _missing(cls: type, record: Any) -> None:
    """A record with a field never set (built with ``object.__new__``): named."""
    for a in attrs.fields(cls):
        try:
            getattr(record, a.name)
        except AttributeError:
            raise InvalidConfig(f"{cls.__name__}.{a.name} is missing (the record was not built by its "
                                f"constructor)") from None
    raise InvalidConfig(f"{cls.__name__}: a field of it cannot be read")


def _guarded(where: str, check: Any) -> Any:
    """``check(record)`` raising only ``InvalidConfig``: anything else it raises on a malformed
    value (a ``TypeError`` from a comparison) is named as such."""
    def guarded(record: Any) -> None:
        try:
            check(record)
        except RankcoreError as exc:
            if isinstance(exc, InvalidConfig):
                raise
            raise InvalidConfig(f"{where}: {exc}") from exc
        except Exception as exc:
            raise InvalidConfig(f"{where} is malformed ({type(exc).__name__}: {exc})") from exc
    return guarded


def _field_check(cls: type, a: attrs.Attribute) -> Any:
    """One field's whole check, raising only ``InvalidConfig`` naming ``Class.field``."""
    where = f"{cls.__name__}.{a.name}"
    convert, validate = a.converter, a.validator

    def check(record: Any, value: Any) -> None:
        try:
            if convert is not None:
                converted = convert(value)  # type: ignore[operator]
                if type(converted) is not type(value) or converted != value:
                    raise InvalidConfig(f"{where} is {shown(value)}, not what its constructor makes of it "
                                        f"({shown(converted)})")
            if validate is not None:
                validate(record, a, value)
        except RankcoreError as exc:
            if isinstance(exc, InvalidConfig) and a.name in str(exc):
                raise
            raise InvalidConfig(f"{where}: {exc}") from exc
        except Exception as exc:
            raise InvalidConfig(f"{where} is malformed: {shown(value)} ({type(exc).__name__}: {exc})") from exc
        for held in value if type(value) is tuple else (value,):
            kind = type(held)
            if kind in _PLAIN or not attrs.has(kind) or not kind.__module__.startswith("rankcore."):
                continue  # (a plain value, or not one of rankcore's records)
            try:
                check_record(held)
            except InvalidConfig as exc:
                raise InvalidConfig(f"{where}: {exc}") from exc
    return check


#: values that are no record (a field's check looks no further into them)
_PLAIN = frozenset({str, int, float, bool, type(None), tuple, bytes})
