"""What an HTTP body means (executors/ray_gpu/api/httpwords.py): a number past a double is refused
however it is written, found without a regex pass over every body (a 1 MiB body took 35 ms so)."""

from __future__ import annotations

import pytest

from executors.ray_gpu.api.httpwords import Reply, _may_overflow, args_of


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
