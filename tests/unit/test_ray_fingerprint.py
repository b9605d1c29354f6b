"""The Ray executor's ``version`` (docs/rollouts.md): given, used as is; left out, a fingerprint of the
class's code, the same for the same code and another for other code (no Ray started)."""

from __future__ import annotations

import pytest

import rankcore as rc
from executors.ray_gpu import deployment
from executors.ray_gpu.api.fingerprint import LENGTH, code_fingerprint, version_of


class Base:
    def shared(self) -> int:
        return 1


class A(Base):
    def __call__(self) -> str:
        return "a"


class B(Base):
    def __call__(self) -> str:
        return "b"


def _made(source: str) -> type:
    scope: dict = {"__name__": "made_by_exec"}
    exec(source, scope)  # no source file: the fingerprint falls back on the pickled class
    return scope["M"]


def test_the_same_code_has_the_same_fingerprint_and_other_code_another() -> None:
    fp = code_fingerprint(A)
    assert len(fp) == LENGTH and int(fp, 16) >= 0
    assert fp == code_fingerprint(A) != code_fingerprint(B)
    one, same, other = (_made(f"class M:\n    def __call__(self):\n        return {v!r}\n") for v in (1, 1, 2))
    assert code_fingerprint(one) == code_fingerprint(same) != code_fingerprint(other)


def test_a_version_given_is_used_as_is() -> None:
    assert version_of("v7", A) == "v7"
    assert version_of(None, A) == code_fingerprint(A)


def test_the_decorator_and_options_take_a_version_checked_by_the_core() -> None:
    assert deployment(A).version is None  # (run() fills in the fingerprint)
    assert deployment(version="v1")(A).version == "v1"
    assert deployment(A).options(version="v2").version == "v2"
    with pytest.raises(rc.InvalidConfig, match="version"):
        deployment(version="")(A)
    with pytest.raises(rc.InvalidConfig, match="version"):
        deployment(A).options(version=3)
