"""What an HTTP body means (executors/ray_gpu/base/httpwords.py): a number past a double is refused
however it is written, found without a regex pass over every body (a 1 MiB body took 35 ms so)."""

from __future__ import annotations

import pytest

from executors.ray_gpu.base.httpwords import Reply, _may_overflow, args_of


@pytest.mark.parametrize("body", [b"[1e999]", b"[1E+0400]", b"[-2.5e00309]", b"[" + b"9" * 309 + b".0]",
                                  b"[" + b"1e5," * 100 + b"1e400]", b'{"a": {"b": [1, 2e9999]}}',
                                  b"[1" + b"0" * 250 + b"e60]", b"[1" + b"0" * 300 + b".5E9]"])
def test_a_number_past_a_double_is_refused(body):
    with pytest.raises(Reply, match="JSON has no infinity"):
        args_of(body)


@pytest.mark.parametrize("body", [b"[1e308]", b'["e999", "9e9999"]', b"[" + b"9" * 400 + b"]",
                                  b'{"text": "' + b"x" * (1 << 20) + b'"}', b"[" + b"1.5e3," * 1000 + b"0]"])
def test_what_only_looks_like_one_is_read(body):
    args, _ = args_of(body)
    assert args


def test_the_cheap_look_agrees_with_the_letters_and_digits():
    assert not _may_overflow(b'{"text": "' + b"x" * 100_000 + b'"}')  # (one 'e', no exponent after it)
    assert not _may_overflow(b"[" + b"12345," * 100 + b"0]")  # (many digits, no run of 309)
    assert _may_overflow(b"[" + b"1" * 309 + b"]") and _may_overflow(b"[1e309]")


# ------------------------------------------------------- orjson first, the stdlib's meaning
import datetime  # noqa: E402
import json  # noqa: E402
import math  # noqa: E402

from hypothesis import given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402

from executors.ray_gpu.base import httpwords  # noqa: E402
from executors.ray_gpu.base.httpwords import MAX_JSON_DEPTH, json_answer, read_json  # noqa: E402

_JSON = st.recursive(
    st.none() | st.booleans() | st.text(max_size=20)
    | st.integers(min_value=-(2**70), max_value=2**70) | st.sampled_from([2**63, 2**64, -(2**63) - 1, 2**64 - 1])
    | st.floats(allow_nan=False, allow_infinity=False) | st.sampled_from([1e300, 9.3e18, -1e19, 1.5]),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=5), inner, max_size=4),
    max_leaves=30)


@pytest.fixture(params=["orjson", "stdlib"])
def encoders(request, monkeypatch):
    """Each test twice: with orjson (the extras install it) and without (the stdlib alone)."""
    if request.param == "stdlib":
        monkeypatch.setattr(httpwords, "orjson", None)
    return request.param


def _stdlib_read(body: bytes):
    """What ``read_json`` means, by the stdlib alone and a whole walk: the value, or the Reply's words."""
    try:
        value = json.loads(body, parse_constant=lambda n: (_ for _ in ()).throw(ValueError(n)))
    except (ValueError, RecursionError):
        return "refused"
    stack = [(value, 1)]
    while stack:
        v, d = stack.pop()
        if isinstance(v, float) and math.isinf(v):
            return "refused"
        if isinstance(v, (dict, list)):
            if d > MAX_JSON_DEPTH:
                return "refused"
            stack.extend((x, d + 1) for x in (v.values() if isinstance(v, dict) else v))
    return value


def _read(body: bytes):
    try:
        return read_json(body, "not JSON: {}", "huge")
    except Reply as r:
        assert r.status == 400
        return "refused"


def _same(a, b) -> bool:
    """Equal, and of the same types all the way down (an int read as a float is not the same)."""
    if type(a) is not type(b):
        return False
    if isinstance(a, dict):
        return a.keys() == b.keys() and all(_same(a[k], b[k]) for k in a)
    if isinstance(a, list):
        return len(a) == len(b) and all(_same(x, y) for x, y in zip(a, b))
    return bool(a == b)


@settings(max_examples=150, deadline=None)
@given(value=_JSON, pad=st.sampled_from([0, 40_000]), spaced=st.booleans())
def test_a_body_reads_as_the_stdlib_reads_it(value, pad, spaced):
    """orjson reads first, but the value is always the stdlib's: an integer past 64 bits stays an int
    (orjson would make it a float), and big bodies (walked, not counted) are checked alike."""
    for encoders in ("orjson", "stdlib"):
        saved = httpwords.orjson
        if encoders == "stdlib":
            httpwords.orjson = None
        try:
            body = json.dumps({"v": value, "pad": "x" * pad}, separators=(", ", ": ") if spaced else (",", ":"))
            got, want = _read(body.encode()), _stdlib_read(body.encode())
            assert _same(got, want), (encoders, got, want)
        finally:
            httpwords.orjson = saved


@pytest.mark.parametrize("body", [b"18446744073709551616", b"[-9223372036854775809]", b'{"id": 1' + b"0" * 30 + b"}"])
def test_an_integer_past_64_bits_stays_an_int(encoders, body):
    assert _same(_read(body), json.loads(body))


@pytest.mark.parametrize("body", [
    b"[" * (MAX_JSON_DEPTH + 1) + b"]" * (MAX_JSON_DEPTH + 1),  # (orjson reads it: the walk refuses it)
    b"[" * 1100 + b"]" * 1100,  # (orjson refuses it: the stdlib's read and walk say why)
    b'{"pad": "' + b"x" * 100_000 + b'", "n": 1e999}',  # (a big body of few values: walked, not counted)
    b'{"pad": "' + b"x" * 100_000 + b'", "d": ' + b"[" * 130 + b"]" * 130 + b"}",
    b"NaN", b"[Infinity]", b"\xff", b'{"a": ', b"\xef\xbb\xbf[1e999]"])
def test_what_is_refused_is_refused_either_way(encoders, body):
    assert _read(body) == "refused"


def test_a_bom_and_a_lone_surrogate_read_as_the_stdlib_reads_them(encoders):
    assert _read(b"\xef\xbb\xbf[1]") == [1]  # (orjson refuses a BOM)
    assert _read(b'"\\ud800"') == "\ud800"  # (and a lone surrogate)


@settings(max_examples=150, deadline=None)
@given(value=_JSON)
def test_an_answer_reads_back_as_the_value(value):
    for none in (False, True):
        saved = httpwords.orjson
        if none:
            httpwords.orjson = None
        try:
            out = json_answer(value)
            assert _same(json.loads(out), json.loads(json.dumps(value)))
        finally:
            httpwords.orjson = saved


def test_an_answer_is_compact_utf8_json_as_serves(encoders):
    want = '{"a":[1,2],"t":"é"}'.encode() if encoders == "orjson" else b'{"a":[1,2],"t":"\\u00e9"}'
    assert json_answer({"a": [1, 2], "t": "é"}) == want  # (the stdlib escapes: a lone surrogate stays JSON)


class _Odd(__import__("enum").Enum):  # (orjson writes an Enum's value: a NaN inside one is refused too)
    NAN = float("nan")
    INFS = (float("inf"),)


@pytest.mark.parametrize("value", [float("nan"), [1.0, float("inf")], {"x": {"y": -math.inf}}])
def test_nan_and_infinities_are_refused_not_written_as_null(encoders, value):
    with pytest.raises(ValueError, match="not JSON compliant"):
        json_answer(value)


def test_what_orjson_will_not_write_the_stdlib_writes(encoders):
    class Text(str):
        pass

    assert json.loads(json_answer({1: 2, None: 3})) == {"1": 2, "null": 3}  # (keys that are not strings)
    assert json.loads(json_answer([2**70])) == [2**70]
    assert json.loads(json_answer("\ud800")) == "\ud800"
    assert json.loads(json_answer({"t": Text("s")})) == {"t": "s"}
    assert json_answer({"a": None}) == b'{"a":null}'  # (a null that is None, not a NaN)
    with pytest.raises(TypeError):
        json_answer({"when": datetime.datetime(2026, 1, 1)})  # (refused, as the stdlib refuses it)


def test_orjson_also_writes_a_uuid_and_an_enum_the_stdlib_refuses(encoders):
    import enum
    import uuid

    class Colour(enum.Enum):
        RED = "red"

    value = {"u": uuid.UUID(int=1), "c": Colour.RED}
    if encoders == "orjson":
        assert json.loads(json_answer(value)) == {"u": "00000000-0000-0000-0000-000000000001", "c": "red"}
    else:
        with pytest.raises(TypeError):
            json_answer(value)


@pytest.mark.parametrize("value", [_Odd.NAN, [_Odd.INFS]])
def test_a_nan_inside_an_enum_is_refused_too(encoders, value):
    """orjson writes an Enum's value, so its NaN is looked for there too (not written as null); the
    stdlib refuses an Enum whatever it holds."""
    with pytest.raises(ValueError if encoders == "orjson" else TypeError):
        json_answer(value)
