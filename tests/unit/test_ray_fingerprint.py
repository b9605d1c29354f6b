"""The Ray executor's ``version`` (docs/rollouts.md): given, used as is; left out, a fingerprint of
what the replicas run (the class, the project's modules, what travels by value, the bind arguments),
the same for the same code and another for other code; and the replica's start check of the modules
it imported (no Ray started)."""

from __future__ import annotations

import importlib
import os
import subprocess
import sys
import uuid
from pathlib import Path

import pytest

import rankcore as rc
from executors.ray_gpu import deployment
from executors.ray_gpu.base.fingerprint import (
    LENGTH,
    CodeChanged,
    check_modules,
    code_fingerprint,
    project_modules,
    stamp,
    version_of,
)

ROOT = Path(__file__).resolve().parents[2]


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


# ------------------------------------------------------------------ what the fingerprint covers
@pytest.fixture
def modules(tmp_path, monkeypatch):
    """``write(stem, text)``: a module of a new name made from ``stem`` (returned) in a folder on
    ``sys.path``; given a name it returned, that module's file rewritten. Forgotten after."""
    monkeypatch.syspath_prepend(str(tmp_path))
    made: list[str] = []

    def write(stem: str, text: str) -> str:
        name = f"{stem}_{uuid.uuid4().hex[:8]}" if stem not in made else stem
        path = tmp_path / f"{name}.py"
        old = path.stat().st_mtime_ns if path.exists() else None
        path.write_text(text)
        if old is not None:  # (a later mtime however fast the edit: what an editor's save gives)
            os.utime(path, ns=(old + 10**9, old + 10**9))
        made.append(name)
        return name

    yield write
    for name in made:
        sys.modules.pop(name, None)


def _load(name: str):
    importlib.invalidate_caches()
    return importlib.import_module(name)


def test_a_module_global_beside_the_class_changes_it(modules) -> None:
    """Issue 64: ``VERSION = "v2"`` beside an unchanged class rolled nothing (its source alone
    was fingerprinted) and a replacement started later ran v2 under the v1 revision."""
    name = modules("app", 'VERSION = "v1"\n\nclass Model:\n    def __call__(self):\n        return VERSION\n')
    cls = _load(name).Model
    before = code_fingerprint(cls)
    assert code_fingerprint(cls) == before  # (nothing changed: the same)
    modules(name, 'VERSION = "v2"\n\nclass Model:\n    def __call__(self):\n        return VERSION\n')
    assert code_fingerprint(cls) != before  # (the file replicas import now)


def test_a_helper_modules_change_changes_it(modules) -> None:
    helper = modules("helper", "def answer():\n    return 1\n")
    app = modules("app", f"from {helper} import answer\n\nclass Model:\n    def __call__(self):\n"
                         f"        return answer()\n")
    cls = _load(app).Model
    before = code_fingerprint(cls)
    modules(helper, "def answer():\n    return 2\n")
    assert code_fingerprint(cls) != before


def _closing_over(value):
    class M:
        def __call__(self):
            return value

    return M


def test_a_closure_a_module_global_sent_by_value_and_the_bind_arguments_change_it(monkeypatch) -> None:
    """Equal code, other values the replicas get: a closure's (the class travels by value), a module
    global read by a ``@deployment`` class (by value too: the global's value travels with it),
    the ``.bind()`` arguments."""
    assert code_fingerprint(_closing_over(1)) == code_fingerprint(_closing_over(1)) != \
        code_fingerprint(_closing_over(2))
    sent = ReadsGlobal.cls
    before = code_fingerprint(sent)
    monkeypatch.setattr(sys.modules[__name__], "SETTING", {"size": 2})
    assert code_fingerprint(sent) != before
    assert code_fingerprint(A, (1,), {"k": {"x", "y"}}) == code_fingerprint(A, (1,), {"k": {"y", "x"}}) != \
        code_fingerprint(A, (2,), {"k": {"x", "y"}})
    assert code_fingerprint(A, (), {"k": 1}) != code_fingerprint(A, (), {"k": 2})


SETTING = {"size": 1}


@deployment
class ReadsGlobal:
    def __call__(self) -> dict:
        return SETTING


class Opaque:
    """Not plain data: its pickle is not proven the same for the same meaning."""


def test_an_argument_that_is_not_plain_data_rolls_every_time() -> None:
    """Ray Serve's rule where nothing proves the replicas would run the same: a random part."""
    arg = Opaque()
    assert code_fingerprint(A, (arg,)) != code_fingerprint(A, (arg,))


_PRINT = """
import sys
sys.path.insert(0, sys.argv[1])
from executors.ray_gpu.base.fingerprint import code_fingerprint
import {name} as m
print(code_fingerprint(m.Model, ("x", {{"a": {{"p", "q", "r"}}}}), {{"n": 1.5}}))
"""


def test_an_unchanged_tree_gives_the_same_fingerprint_in_two_fresh_processes(modules, tmp_path) -> None:
    """Two ``rankcore deploy`` processes with nothing changed replace nothing (a set's order
    follows string hashing, other in each process: not in the fingerprint)."""
    helper = modules("helper", "LIMIT = 3\n")
    name = modules("app", f"import {helper}\n\nclass Model:\n    def __call__(self):\n"
                          f"        return {helper}.LIMIT\n")
    outs = []
    for seed in ("1", "2"):
        env = {**os.environ, "PYTHONHASHSEED": seed, "PYTHONPATH": str(ROOT)}
        done = subprocess.run([sys.executable, "-c", _PRINT.format(name=name), str(tmp_path)], env=env, cwd=ROOT,
                              capture_output=True, text=True, timeout=120)
        assert done.returncode == 0, done.stderr[-2000:]
        outs.append(done.stdout.strip())
    assert len(outs[0]) == LENGTH and outs[0] == outs[1]
    modules(helper, "LIMIT = 4\n")
    done = subprocess.run([sys.executable, "-c", _PRINT.format(name=name), str(tmp_path)],
                          env={**os.environ, "PYTHONPATH": str(ROOT)}, cwd=ROOT, capture_output=True, text=True,
                          timeout=120)
    assert done.returncode == 0 and done.stdout.strip() != outs[0], done.stderr[-2000:]


# ------------------------------------------------------------------ the replica's start check
def test_stamp_gives_the_modules_a_replica_checks_and_none_for_a_version_given(modules) -> None:
    name = modules("app", "class Model:\n    pass\n")
    cls = _load(name).Model
    version, taken = stamp(None, cls, (1,), {})
    assert taken is not None and name in taken
    assert __name__ not in taken  # (loaded, but nothing of Model's reaches it)
    other = modules("unrelated", "X = 1\n")
    _load(other)  # a project module imported after for another reason changes nothing
    assert stamp(None, cls, (1,), {}) == (version, taken)
    assert not any(m.split(".")[0] in ("rankcore", "executors", "ray", "pytest", "json") for m in taken)
    assert version == code_fingerprint(cls, (1,), {}, taken)
    assert stamp("v7", cls) == ("v7", None)  # (Ray Serve's meaning: the user's word, unchecked)


def test_a_replica_whose_modules_changed_since_the_deploy_refuses_to_start(modules) -> None:
    """What ``ReplicaActor._check_code`` runs before and after the user's constructor: a module it
    imported whose file is not the one fingerprinted fails the start, naming the deployment, the
    revision and what to do; modules it never imported, and ``__main__``, are not judged."""
    name = modules("app", 'VERSION = "v1"\n')
    _load(name)
    taken = project_modules()
    check_modules("dep", "v=abc;r=;p=spread", taken)  # (unchanged: starts)
    check_modules("dep", "v=abc", {**taken, "not_imported_here": "0" * LENGTH, "__main__": "0" * LENGTH})
    modules(name, 'VERSION = "v2"\n')
    with pytest.raises(CodeChanged, match=r"deployment 'dep'.*revision 'v=abc;r=;p=spread'.*"
                                          rf"{name}.*redeploy to roll it out"):
        check_modules("dep", "v=abc;r=;p=spread", taken)


def test_a_batched_or_multiplexed_class_keeps_its_fingerprint_after_it_ran() -> None:
    """The wrappers ``@batch`` and ``@multiplexed`` put around a method close over their running state
    (runners, queues, loaded models): that is not code. A redeploy of such a class after it served
    (the same source, a new user_config) rolled nothing before a fingerprint took their closures in;
    it must roll nothing now either (test_ray_batching's reconfigure test saw a restart)."""
    import asyncio

    from executors.ray_gpu import batch, multiplexed

    class Served:
        @batch(max_batch_size=2, batch_wait_timeout_s=0.01)
        async def __call__(self, xs):
            return xs

        @multiplexed(max_num_models_per_replica=1)
        async def get_model(self, model_id):
            return model_id

    before = code_fingerprint(Served)
    s = Served()

    async def use() -> None:
        assert await asyncio.gather(s(1), s(2), s(3)) == [1, 2, 3]
        assert await s.get_model("a") == "a"

    asyncio.run(use())
    assert code_fingerprint(Served) == before


def test_a_module_global_that_holds_itself_or_nests_deep_is_walked_without_recursion(modules) -> None:
    """(CI: a RecursionError in every deploy of a module whose globals nest deeper than Python's stack)"""
    name = modules("deep", "LOOP = []\nLOOP.append(LOOP)\nDEEP = [0]\nfor _ in range(5000):\n    DEEP = [DEEP]\n"
                           "class Model:\n    pass\n")
    cls = _load(name).Model
    version, taken = stamp(None, cls)
    assert taken is not None and name in taken and stamp(None, cls) == (version, taken)
