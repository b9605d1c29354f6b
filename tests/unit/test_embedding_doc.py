"""docs/embedding.md stays true: its runnable examples run, its quotes match the code.

* Every ```python block whose first line is ``# runnable`` is executed in a
  fresh namespace and must set ``ok = True`` (so a block that silently stops
  early, or is emptied, fails).
* Every ```python block whose first line is ``# quoted from <path>`` must
  appear in that file: each of its non-blank lines, in order, at the same
  relative indentation, as consecutive lines of the file.
"""

from __future__ import annotations

import pathlib
import re
import textwrap

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[2]
DOC = ROOT / "docs" / "embedding.md"

# A fenced python block, possibly indented (inside a list item).
_BLOCK = re.compile(r"^(?P<indent>[ \t]*)```python[ \t]*\n(?P<body>.*?)^(?P=indent)```[ \t]*$", re.S | re.M)


def _blocks() -> list[tuple[int, str]]:
    text = DOC.read_text()
    out = []
    for m in _BLOCK.finditer(text):
        line = text.count("\n", 0, m.start()) + 1
        out.append((line, textwrap.dedent(m.group("body"))))
    return out


def _first_line(body: str) -> str:
    return body.lstrip("\n").split("\n", 1)[0].strip()


RUNNABLE = [(line, body) for line, body in _blocks() if _first_line(body) == "# runnable"]
QUOTED = [(line, body) for line, body in _blocks() if _first_line(body).startswith("# quoted from ")]


def test_every_python_block_is_run_or_checked():
    """A block that is neither run nor checked against the code can rot unseen."""
    loose = [line for line, body in _blocks()
             if _first_line(body) != "# runnable" and not _first_line(body).startswith("# quoted from ")]
    assert loose == [], f"docs/embedding.md: python blocks at lines {loose} are neither '# runnable' nor quoted"


def test_doc_has_examples():
    assert len(RUNNABLE) >= 3, "docs/embedding.md lost its runnable examples"
    assert any("class FakeCluster" in body for _, body in RUNNABLE), "the minimal executor is not runnable"
    assert len(QUOTED) >= 3, "docs/embedding.md lost its quotes of the simulator"


@pytest.mark.parametrize("line,body", RUNNABLE, ids=[f"line{line}" for line, _ in RUNNABLE])
def test_runnable_block(line, body, capsys):
    namespace: dict = {"__name__": f"embedding_md_line{line}"}
    exec(compile(body, f"{DOC}:{line}", "exec"), namespace)
    assert namespace.get("ok") is True, f"the block at docs/embedding.md:{line} did not reach its end"
    if "class FakeCluster" in body:
        out = capsys.readouterr().out
        assert out == (
            "llm#2 node-a ReplicaRank(rank=0, node_rank=0, local_rank=0)\n"
            "llm#4 node-b ReplicaRank(rank=1, node_rank=1, local_rank=0)\n"
        ), out
        # The doc shows this output too.
        assert out.strip() in DOC.read_text()


@pytest.mark.parametrize("line,body", QUOTED, ids=[f"line{line}" for line, _ in QUOTED])
def test_quoted_block_matches_source(line, body):
    first, _, rest = body.lstrip("\n").partition("\n")
    path = ROOT / first.strip()[len("# quoted from "):].strip()
    assert path.is_file(), f"docs/embedding.md:{line} quotes {path}, which does not exist"
    quoted = [ln.rstrip() for ln in textwrap.dedent(rest).splitlines() if ln.strip()]
    source = [ln.rstrip() for ln in path.read_text().splitlines()]
    # Find the quote as consecutive source lines (blank source lines skipped), same relative indent.
    width = len(quoted[0]) - len(quoted[0].lstrip())
    for start, src in enumerate(source):
        if src.strip() != quoted[0].strip():
            continue
        shift = (len(src) - len(src.lstrip())) - width
        got = [ln for ln in source[start:] if ln.strip()][: len(quoted)]
        if [(" " * shift + q) if shift >= 0 else q[-shift:] for q in quoted] == got:
            return
    pytest.fail(f"docs/embedding.md:{line}: the quote of {path.relative_to(ROOT)} no longer matches the code "
                f"(first line {quoted[0].strip()!r})")
