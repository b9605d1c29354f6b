"""The mechanics of tools/mutate.py (the mutation sweep), on tiny synthetic trees.

Nothing here runs the sweep or touches the real rankcore sources: this file
also runs inside every mutant, so it must pass whatever rankcore looks like.
"""

from __future__ import annotations

import importlib.util
import os
import pathlib
import shutil
import subprocess
import sys

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[2]


def _load_tool():
    spec = importlib.util.spec_from_file_location("rankcore_mutate_tool", ROOT / "tools" / "mutate.py")
    mod = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = mod  # dataclasses look the module up while building the classes
    spec.loader.exec_module(mod)
    return mod


mt = _load_tool()


def _tree(tmp_path: pathlib.Path, files: dict[str, str]) -> pathlib.Path:
    for rel, text in files.items():
        p = tmp_path / rel
        p.parent.mkdir(parents=True, exist_ok=True)
        p.write_text(text)
    return tmp_path


def test_the_list_is_well_formed():
    names = [m.name for m in mt.MUTATIONS]
    assert len(names) == len(set(names)), "mutation names must be unique"
    for m in mt.MUTATIONS:
        assert m.breaks and "\n" not in m.breaks, m.name
        for e in m.edits:
            # rankcore/, and the scenario timeline's two rules in executors/scenarios/
            assert e.file.startswith(("rankcore/", "executors/scenarios/")) and e.find and e.find != e.replace, m.name
    # the four mutations issue 8 point 12 asks the invariants to kill stay in the list
    assert {"node-loss-reverse-order", "recovery-node-rank-minority", "assign-highest-free-rank",
            "compact-when-unhealthy"} <= set(names)


def test_every_mutation_matches_the_code_exactly_once():
    """A refactor that moves a rule must move its mutant too (issue 20: two mutants
    were stranded by a rename and only the next mutation run noticed). Not inside a
    mutation run: there the tree is mutated on purpose, and this test would kill every
    mutant for the wrong reason."""
    if os.environ.get(mt.ENV_VAR):
        pytest.skip("inside a mutation run (the tree under test is a mutant)")
    for m in mt.MUTATIONS:
        mt.check_mutation(m, ROOT)


def test_missing_snippet_is_an_error_naming_the_mutation(tmp_path):
    tree = _tree(tmp_path, {"pkg/a.py": "x = 1\n"})
    m = mt.mutation("gone", "pkg/a.py", "x = 2\n", "x = 3\n", "x is two")
    with pytest.raises(mt.MutationError, match=r"'gone'.*not found in pkg/a\.py"):
        mt.apply_mutation(m, tree)
    assert (tree / "pkg/a.py").read_text() == "x = 1\n"


def test_ambiguous_snippet_is_an_error(tmp_path):
    tree = _tree(tmp_path, {"pkg/a.py": "x = 1\nx = 1\n"})
    m = mt.mutation("twice", "pkg/a.py", "x = 1\n", "x = 2\n", "x is one")
    with pytest.raises(mt.MutationError, match="found 2 times"):
        mt.check_mutation(m, tree)


def test_missing_file_is_an_error(tmp_path):
    m = mt.mutation("nofile", "pkg/none.py", "a", "b", "a")
    with pytest.raises(mt.MutationError, match="does not exist"):
        mt.check_mutation(m, tmp_path)


def test_patching_applies_every_edit_or_none(tmp_path):
    tree = _tree(tmp_path, {"pkg/a.py": "def f():\n    return 1\n", "pkg/b.py": "Y = 'lowest'\n"})
    m = mt.mutation("two-files", "pkg/a.py", "    return 1\n", "    return 2\n", "f is one",
                    more=[mt.Edit("pkg/b.py", "'lowest'", "'highest'")])
    mt.apply_mutation(m, tree)
    assert (tree / "pkg/a.py").read_text() == "def f():\n    return 2\n"
    assert (tree / "pkg/b.py").read_text() == "Y = 'highest'\n"
    # a later edit that does not match leaves every file as it was
    tree2 = _tree(tmp_path / "t2", {"pkg/a.py": "def f():\n    return 1\n", "pkg/b.py": "Y = 0\n"})
    with pytest.raises(mt.MutationError):
        mt.apply_mutation(m, tree2)
    assert (tree2 / "pkg/a.py").read_text() == "def f():\n    return 1\n"


def test_edits_of_one_file_apply_in_order(tmp_path):
    tree = _tree(tmp_path, {"a.py": "A\n"})
    m = mt.mutation("chain", "a.py", "A\n", "B\n", "a", more=[mt.Edit("a.py", "B\n", "C\n")])
    mt.apply_mutation(m, tree)
    assert (tree / "a.py").read_text() == "C\n"


@pytest.mark.skipif(shutil.which("git") is None, reason="needs git")
def test_repo_files_are_the_working_tree_as_git_sees_it(tmp_path):
    repo = _tree(tmp_path, {".gitignore": "ignored.txt\n", "tracked.py": "1\n", "gone.py": "2\n"})
    git = ["git", "-c", "user.name=t", "-c", "user.email=t@t", "-c", "commit.gpgsign=false"]
    subprocess.run(["git", "init", "-q"], cwd=repo, check=True)
    subprocess.run([*git, "add", ".gitignore", "tracked.py", "gone.py"], cwd=repo, check=True)
    subprocess.run([*git, "commit", "-q", "-m", "t"], cwd=repo, check=True)
    (repo / "tracked.py").write_text("edited\n")  # uncommitted edit
    (repo / "gone.py").unlink()  # deleted, not committed
    (repo / "new.py").write_text("3\n")  # untracked
    (repo / "ignored.txt").write_text("4\n")
    files = mt.repo_files(repo)
    assert files == [".gitignore", "new.py", "tracked.py"]
    dest = tmp_path / "copy"
    mt.copy_tree(repo, dest, files)
    assert (dest / "tracked.py").read_text() == "edited\n"  # the working tree, not HEAD


FAKE = {
    "pytest.ini": "[pytest]\n",
    "rankcore/__init__.py": "RULE = 'lowest'\nOTHER = 1\n",
    "executors/__init__.py": "",
    "tests_fake/test_rule.py": "import rankcore\n\n\ndef test_rule():\n    assert rankcore.RULE == 'lowest'\n",
}
ARGS = ["-q", "-p", "no:cacheprovider", "tests_fake"]


@pytest.fixture(autouse=True)
def _quick_pytest(monkeypatch):
    # the inner pytest needs none of the installed plugins (hypothesis, ...): start it faster
    monkeypatch.setenv("PYTEST_DISABLE_PLUGIN_AUTOLOAD", "1")


@pytest.mark.parametrize(
    "find, replace, status",
    [("'lowest'", "'highest'", mt.KILLED), ("OTHER = 1", "OTHER = 2", mt.SURVIVED)],
)
def test_run_one_tests_the_mutated_copy(tmp_path, find, replace, status):
    repo = _tree(tmp_path / "repo", FAKE)
    m = mt.mutation("fake", "rankcore/__init__.py", find, replace, "rule")
    res = mt.run_one(m, repo, sorted(FAKE), sys.executable, ARGS, timeout=120)
    assert res.status == status, res.output
    if status == mt.KILLED:
        assert res.detail == "tests_fake/test_rule.py::test_rule"
    assert (repo / "rankcore/__init__.py").read_text() == FAKE["rankcore/__init__.py"]  # the original is untouched


def test_run_one_refuses_a_rankcore_imported_from_elsewhere(tmp_path):
    # No rankcore in the copy: whatever gets imported (the editable install, or
    # nothing) is not the copy's, and the probe turns that into an error.
    files = {k: v for k, v in FAKE.items() if not k.startswith("rankcore/")}
    repo = _tree(tmp_path / "repo", files)
    res = mt.run_one(None, repo, sorted(files), sys.executable, ARGS, timeout=120)
    assert res.status == mt.ERROR, res.output


def test_a_mutation_that_no_longer_matches_is_an_error_result(tmp_path):
    repo = _tree(tmp_path / "repo", FAKE)
    m = mt.mutation("stale", "rankcore/__init__.py", "RULE = 'middle'", "RULE = 'x'", "rule")
    res = mt.run_one(m, repo, sorted(FAKE), sys.executable, ARGS, timeout=120)
    assert res.status == mt.ERROR and "not found" in res.detail


MORE = {**FAKE, "tests_more/test_other.py": "import rankcore\n\n\ndef test_other():\n    assert rankcore.OTHER == 1\n"}


def test_a_mutant_the_first_run_misses_is_killed_by_a_later_run(tmp_path):
    repo = _tree(tmp_path / "repo", MORE)
    m = mt.mutation("other", "rankcore/__init__.py", "OTHER = 1", "OTHER = 2", "other is one")
    res = mt.run_one(m, repo, sorted(MORE), sys.executable, ARGS, timeout=120, then=("tests_more",))
    assert res.status == mt.KILLED, res.output
    assert res.detail == "[2] tests_more/test_other.py::test_other"
    # without the later run it survives: the first run alone does not see it
    assert mt.run_one(m, repo, sorted(MORE), sys.executable, ARGS, timeout=120).status == mt.SURVIVED


def test_a_mutants_own_tests_run_first_with_the_common_options(tmp_path):
    repo = _tree(tmp_path / "repo", MORE)
    m = mt.mutation("other", "rankcore/__init__.py", "OTHER = 1", "OTHER = 2", "other is one",
                    tests=["tests_more/test_other.py"])
    assert mt.stages(m, ARGS, ("tests_more",), repo) == [
        ["-q", "-p", "no:cacheprovider", "tests_more/test_other.py"], ARGS,
        ["-q", "-p", "no:cacheprovider", "tests_more"]]
    assert mt.stages(None, ARGS, (), repo) == [ARGS]  # the baseline: the common runs only
    res = mt.run_one(m, repo, sorted(MORE), sys.executable, ARGS, timeout=120)
    assert res.status == mt.KILLED and res.detail == "tests_more/test_other.py::test_other", res.output
