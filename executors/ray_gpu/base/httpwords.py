"""What an HTTP request to a deployment means and what a failure answers: the rules both HTTP
servers share, the proxy's (``ingress/http.py``) and a replica's own (``base/direct.py``, direct
ingress, issue 65), so the two answer alike. Pure functions of bytes and exceptions.
"""

from __future__ import annotations

import enum
import json
import math
import re
import uuid
from typing import Any, overload

from ray.exceptions import RayActorError, RayTaskError

import rankcore as rc

try:  # (the ``http`` and ``ray`` extras install it; without it the stdlib's json reads and writes alike)
    import orjson
except ImportError:  # pragma: no cover - the extras pin it
    orjson = None  # type: ignore[assignment]

__all__ = ["METRICS_PATH", "MAX_JSON_DEPTH", "MAX_ERROR_MESSAGE", "Reply", "match_prefix", "match_route", "not_found_text",
           "args_of", "read_json", "json_answer", "status_of", "ANSI", "REQUEST_ID_HEADER", "REQUEST_ID_MAX", "request_id_of"]

#: where Prometheus scrapes the ingress (a route prefix may not take it; the direct data plane sends
#: it to the proxy whatever route sits at /)
METRICS_PATH = "/metrics"
#: a JSON body nested deeper than this is refused with 400: Python's decoder raises RecursionError
#: near 1,000 levels, and the call's arguments are pickled (and answers encoded) by recursion too
#: (serde_json's default limit is 128)
MAX_JSON_DEPTH = 128

_METHOD = re.compile(r"[A-Za-z][A-Za-z0-9_]*")
ANSI = re.compile(r"\x1b\[[0-9;]*m")  # Ray colours the remote traceback's first line


class Reply(Exception):
    """An error answer decided in the ingress itself (bad body, unknown route)."""

    def __init__(self, status: int, error: str, detail: str, deployment: str | None = None) -> None:
        super().__init__(detail)
        self.status, self.error, self.detail, self.deployment = status, error, detail, deployment


def match_prefix(routes: dict[str, str], path: str) -> tuple[str, str, str] | None:
    """``(prefix, deployment, rest)`` for ``path``: the longest prefix that is the path or a parent
    of it, and what follows it ("" for the prefix itself). None: no route."""
    for prefix in sorted(routes, key=len, reverse=True):
        if path == prefix:
            return prefix, routes[prefix], ""
        base = "" if prefix == "/" else prefix
        if path.startswith(base + "/"):
            return prefix, routes[prefix], path[len(base) + 1:]
    return None


def match_route(routes: dict[str, str], path: str) -> tuple[str, str, str] | None:
    """``(prefix, deployment, method)`` for ``path`` (``match_prefix``); the rest, one name, is the
    method (``__call__`` when there is none). None: no route (or a rest that is not a method name).
    (A deployment that takes ASGI requests gets every path under its prefix: ``deployment_call``.)"""
    found = match_prefix(routes, path)
    if found is None:
        return None
    prefix, name, rest = found
    if rest == "":
        return prefix, name, "__call__"
    return (prefix, name, rest) if _METHOD.fullmatch(rest) else None


def not_found_text(path: str) -> str:
    """Ray Serve's proxy's 404 body, word for word (scripts and load balancers match it)."""
    return f"Path '{path}' not found. Ping http://.../-/routes for available routes."


def args_of(body: bytes) -> tuple[tuple, dict]:
    """A request body -> the call's ``(args, kwargs)``. Empty: no arguments. A JSON object whose
    keys are only ``args`` (a list) and/or ``kwargs`` (an object): those. Any other JSON value:
    the one argument (wrap an object that looks like that one: ``{"args": [obj]}``).
    Not JSON: ``Reply`` 400."""
    if not body.strip():
        return (), {}
    value = read_json(body, "the body is not JSON: {}", "a number in the body is beyond a 64-bit float")
    if isinstance(value, dict) and value and set(value) <= {"args", "kwargs"}:
        args, kwargs = value.get("args", []), value.get("kwargs", {})
        if not isinstance(args, list):
            raise Reply(400, "bad_request", f"'args' must be a JSON array, got {type(args).__name__}")
        if not isinstance(kwargs, dict):
            raise Reply(400, "bad_request", f"'kwargs' must be a JSON object, got {type(kwargs).__name__}")
        return tuple(args), kwargs
    return (value,), {}


def read_json(body: bytes, not_json: str, huge: str, prefix: str = "") -> Any:
    """A body's JSON value, or ``Reply`` 400 saying why not, each message after ``prefix``:
    ``not_json`` (with ``{}``: the parser's words) for what is not UTF-8 JSON or is NaN/Infinity,
    "the body is nested deeper than MAX_JSON_DEPTH" (a loop checks it: nothing recurses that deep),
    ``huge`` + " (JSON has no infinity)" for a number past a double (1e999 reads as inf: an answer
    could not hold it). The HTTP ingress (``args_of``) and the REST server (``rest.config_of``) read
    their bodies with it.

    orjson reads it first (a 1 MiB string: 0.3 ms, the stdlib's json 1.7 ms), its value walked for
    the checks. The stdlib reads what orjson refuses (its words say why) and what orjson may have
    read otherwise (an integer past 64 bits orjson makes a float): the value is the stdlib's always."""
    deep = f"{prefix}the body is nested deeper than {MAX_JSON_DEPTH} (MAX_JSON_DEPTH)"
    if orjson is not None:
        try:
            value = orjson.loads(body)
        except orjson.JSONDecodeError:
            pass
        else:
            deeper, _infinite, rounded = _walk(value)  # (orjson refuses a number past a double itself)
            if not rounded:
                if deeper:
                    raise Reply(400, "bad_request", deep)
                return value
    try:
        value = json.loads(body, parse_constant=_no_constant)
    except ValueError as exc:  # (UnicodeDecodeError and an int of more than 4,300 digits are ValueErrors)
        raise Reply(400, "bad_request", prefix + not_json.format(exc)) from None
    except RecursionError:
        raise Reply(400, "bad_request", deep) from None
    walked = _walk(value, len(body) >> 10) if len(body) >= _WALK_FROM else None
    if walked is not None:  # (a big body of few values, as one long string: their walk is the exact answer)
        deeper, infinite, _rounded = walked
    else:
        if len(body) - len(body.translate(None, _SPECIAL)) < 4:  # (one pass: neither check can find anything)
            return value
        if body.count(b"[") + body.count(b"{") <= MAX_JSON_DEPTH and not _may_overflow(body):
            return value  # (too few brackets to nest that deep, no number past a double: nothing to walk)
        deeper, infinite, _rounded = _walk(value)
    if deeper:
        raise Reply(400, "bad_request", deep)
    if infinite:
        raise Reply(400, "bad_request", f"{prefix}{huge} (JSON has no infinity)")
    return value


def json_answer(value: Any) -> bytes:
    """A value as an answer's JSON, as Ray Serve's ``JSONResponse`` writes it: compact, UTF-8; NaN and
    the infinities refused (``ValueError``: JSON has none), as a value JSON cannot hold
    (``TypeError``). Both HTTP servers answer with it, whole answers and a stream's lines alike.

    orjson writes it when it takes the value (a 1 MiB string: 0.05 ms, the stdlib's json 2.2 ms);
    the stdlib writes what orjson will not (a key that is not a string, an integer past 64 bits, a
    lone surrogate, a subclass, a date, a dataclass), with the same meaning. orjson also writes a
    ``uuid.UUID`` and an ``enum.Enum``'s value, which the stdlib refuses."""
    if orjson is not None:
        try:
            out: bytes = orjson.dumps(value, option=_ORJSON_OPTIONS)
        except TypeError:
            pass
        else:
            if b"null" in out and _walk(value)[1]:  # (orjson writes NaN and infinities as null)
                raise ValueError("Out of range float values are not JSON compliant")
            return out
    return json.dumps(value, allow_nan=False, separators=(",", ":")).encode()


def _no_constant(name: str) -> Any:
    """``NaN``, ``Infinity``, ``-Infinity``: Python's decoder takes them, JSON (RFC 8259) has none."""
    raise ValueError(f"{name} is not a JSON value")


#: what a number past a double's range looks like in JSON (an exponent of 3 digits or more, 309 digits
#: in a row, or a mantissa of 20 digits or more with any exponent): only then is the parsed value
#: searched for an infinity (``_may_overflow``)
_BIG_EXPONENT = re.compile(rb"[eE]\+?0*(?:[3-9][0-9][0-9]|[0-9]{4})")
_LONG_DIGITS = re.compile(rb"[0-9]{309}")
_SOME_DIGITS = re.compile(rb"[0-9]{20}")
_DIGITS = b"0123456789"
#: what nesting or a number past a double needs: brackets, digits, exponent letters (fewer than 4 of
#: them in a body: it nests less than MAX_JSON_DEPTH and holds no such number; ``read_json`` counts
#: them in one pass before either check)
_SPECIAL = _DIGITS + b"eE[{"
#: above this many exponent letters in a body, one regex pass over it is cheaper than a look at each
_FEW_EXPONENTS = 64


def _may_overflow(body: bytes) -> bool:
    """Whether ``body`` may hold a number past a double (``_BIG_EXPONENT``, ``_LONG_DIGITS``), looked
    for at C speed first: a regex pass over a 1 MiB body took 35 ms, where counting letters and
    digits takes well under one (the answer is the same: a false alarm only costs the exact walk)."""
    letters = body.count(b"e") + body.count(b"E")
    if letters > _FEW_EXPONENTS:
        if _BIG_EXPONENT.search(body):
            return True
    elif letters:
        for letter in (b"e", b"E"):
            at = body.find(letter)
            while at >= 0:
                if _BIG_EXPONENT.match(body, at):
                    return True
                at = body.find(letter, at + 1)
    digits = len(body) - len(body.translate(None, _DIGITS))
    if letters and digits >= 20 and _SOME_DIGITS.search(body):  # (a long mantissa times a small power: 1 + 250 zeros, e60)
        return True
    return digits >= 309 and _LONG_DIGITS.search(body) is not None


#: a body this long or longer the stdlib read is first walked as its parsed value, up to one value
#: per KiB of it (``_walk``), before any pass over its bytes: a 1 MiB string's bytes took 0.6 ms to
#: count, its one value nothing
_WALK_FROM = 1 << 15
#: what orjson leaves to the stdlib (``json_answer``): subclasses of str, int, dict and list (the
#: stdlib writes them by their base's rules), dates and dataclasses (the stdlib refuses them)
_ORJSON_OPTIONS = 0 if orjson is None else (
    orjson.OPT_PASSTHROUGH_SUBCLASS | orjson.OPT_PASSTHROUGH_DATETIME | orjson.OPT_PASSTHROUGH_DATACLASS)
#: orjson reads an integer from 2**63 on up as a float when it does not fit 64 bits: a float this big
#: may be one (``_walk``: the stdlib reads the body again)
_ROUNDED_FROM = 2.0 ** 63


@overload
def _walk(value: Any) -> tuple[bool, bool, bool]: ...
@overload
def _walk(value: Any, most: int) -> tuple[bool, bool, bool] | None: ...


def _walk(value: Any, most: int | None = None) -> tuple[bool, bool, bool] | None:
    """(nested deeper than MAX_JSON_DEPTH, holds an infinity or NaN, holds a float of ``_ROUNDED_FROM``
    or more) of ``value``, walked whole; with ``most``, ``None`` when it holds more than ``most``
    arrays, objects and values (walking them all would cost more than a pass over the body's bytes)."""
    stack, seen, deeper, infinite, rounded = [(value, 1)], 0, False, False, False
    while stack:
        v, depth = stack.pop()
        seen += 1
        if most is not None and seen > most:
            return None
        if type(v) is float:
            if not math.isfinite(v):
                infinite = True
            elif abs(v) >= _ROUNDED_FROM:
                rounded = True
        elif isinstance(v, (dict, list, tuple)):
            deeper = deeper or depth > MAX_JSON_DEPTH
            stack.extend((x, depth + 1) for x in (v.values() if isinstance(v, dict) else v))
        elif isinstance(v, enum.Enum):  # (orjson writes its value: a NaN there too)
            stack.append((v.value, depth))
    return deeper, infinite, rounded


def status_of(exc: BaseException) -> tuple[int, str, str]:
    """What a failed call answers: ``(HTTP status, error, detail)``. The application's own
    exception first (500 with its type and message, whatever its type: never its traceback, which
    holds the replica's file paths, pid, IP and actor id; ``log_failure`` writes that to the proxy's
    log), then the request path's typed errors by their ``.status``, an unknown deployment 404, a
    dead replica 500, a timeout 408."""
    if isinstance(exc, RayTaskError):
        return 500, "application_error", _what_raised(exc.cause if isinstance(exc.cause, BaseException) else None,
                                                      getattr(exc, "cause_cls", None))
    if isinstance(exc, rc.RequestError):
        return exc.status, exc.reason, str(exc)
    if isinstance(exc, rc.UnknownDeployment):
        return 404, "unknown_deployment", str(exc)
    if isinstance(exc, RayActorError) or type(exc).__name__ == "ReplicaDiedError":
        return 500, "replica_died", "the replica serving the request died"
    if isinstance(exc, TimeoutError):
        return 408, "timeout", str(exc) or "the request timed out"
    return 500, "application_error", _what_raised(exc, type(exc))


#: how much of an application exception's message an answer carries
MAX_ERROR_MESSAGE = 1000


def _what_raised(exc: BaseException | None, cls: Any) -> str:
    """``"ValueError: its message"`` (the message's first ``MAX_ERROR_MESSAGE`` characters, no colours)."""
    name = getattr(cls, "__name__", None) or (type(exc).__name__ if exc is not None else "Exception")
    message = ANSI.sub("", str(exc)) if exc is not None else ""
    if len(message) > MAX_ERROR_MESSAGE:
        message = message[:MAX_ERROR_MESSAGE] + "..."
    return f"{name}: {message}" if message else name


#: the header a client's request id comes in, and the answer's goes out in (Serve's ``x-request-id``)
REQUEST_ID_HEADER = "x-request-id"
#: the longest client request id kept (longer: replaced by a new one)
REQUEST_ID_MAX = 128

_REQUEST_ID = re.compile(rf"[A-Za-z0-9\-_.:@/+=]{{1,{REQUEST_ID_MAX}}}")


def request_id_of(sent: str | None) -> str:
    """The request's id: ``sent`` (the client's ``X-Request-Id``) when it is one we can echo and
    log safely, else a new one (a uuid4's hex)."""
    if sent is not None and _REQUEST_ID.fullmatch(sent):
        return sent
    return uuid.uuid4().hex
