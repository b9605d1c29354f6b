"""Every Python example in README.md and docs/*.md is run or checked by a test.

* ``# quoted from <path> ...`` (first line): each non-blank line of the block
  appears in that file, in order, as consecutive lines (blank lines skipped), at
  the same relative indentation.
* a leading comment ``# needs Ray...``: the block drives Ray (a cluster, GPUs);
  it is not run here, but it must really use Ray, so the marker cannot hide a
  plain example. ``examples/ray/`` and tests/integration run the same code paths.
* every other block is executed, each in a fresh namespace and working directory.

tools/typecheck_docs.py type-checks the same blocks; this runs them.
"""

from __future__ import annotations

import pathlib
import re
import textwrap

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[2]
DOCS = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
# A fenced python block, possibly indented (inside a list item): as tools/typecheck_docs.py reads them.
_BLOCK = re.compile(r"^(?P<indent>[ \t]*)```python[ \t]*\n(?P<body>.*?)^(?P=indent)```[ \t]*$", re.S | re.M)
QUOTED, RAY = "# quoted from ", "# needs Ray"


def _blocks() -> list[tuple[str, int, str, str]]:
    """(file, line, kind, dedented body) of every python block: kind is quoted, ray or run."""
    out = []
    for path in DOCS:
        text = path.read_text()
        for m in _BLOCK.finditer(text):
            body = textwrap.dedent(m.group("body"))
            lines = body.lstrip("\n").splitlines()
            leading = []
            for ln in lines:
                if not ln.strip().startswith("#"):
                    break
                leading.append(ln.strip())
            kind = ("quoted" if lines and lines[0].strip().startswith(QUOTED)
                    else "ray" if any(ln.startswith(RAY) for ln in leading) else "run")
            out.append((str(path.relative_to(ROOT)), text.count("\n", 0, m.start()) + 1, kind, body))
    return out


BLOCKS = _blocks()
RUN = [b for b in BLOCKS if b[2] == "run"]
NEEDS_RAY = [b for b in BLOCKS if b[2] == "ray"]
QUOTES = [b for b in BLOCKS if b[2] == "quoted"]


def _id(block: tuple) -> str:
    return f"{block[0]}:{block[1]}"


def test_the_docs_have_examples_of_each_kind():
    assert len(BLOCKS) >= 15 and len(RUN) >= 7 and QUOTES and NEEDS_RAY
    assert {"README.md"} <= {b[0] for b in RUN}


@pytest.mark.parametrize("block", RUN, ids=[_id(b) for b in RUN])
def test_example_runs(block, tmp_path, monkeypatch, capsys):
    doc, line, _, body = block
    monkeypatch.chdir(tmp_path)
    namespace: dict = {"__name__": f"doc_example_{pathlib.Path(doc).stem}_{line}"}
    exec(compile(body, f"{ROOT / doc}:{line}", "exec"), namespace)
    if body.lstrip("\n").startswith("# runnable"):  # docs/embedding.md's convention: the block ends with ok = True
        assert namespace.get("ok") is True, f"{doc}:{line} did not reach its end"


@pytest.mark.parametrize("block", NEEDS_RAY, ids=[_id(b) for b in NEEDS_RAY])
def test_an_example_marked_as_needing_ray_uses_ray(block):
    doc, line, _, body = block
    code = "\n".join(ln for ln in body.splitlines() if not ln.strip().startswith("#"))
    assert re.search(r"\bray\b|executors\.ray_gpu|@deployment\(", code), \
        f"{doc}:{line} is marked '{RAY}' but uses no Ray: run it here instead"


@pytest.mark.parametrize("block", QUOTES, ids=[_id(b) for b in QUOTES])
def test_quoted_example_matches_its_source(block):
    doc, line, _, body = block
    first, _, rest = body.lstrip("\n").partition("\n")
    path = ROOT / first.strip()[len(QUOTED):].split()[0]
    assert path.is_file(), f"{doc}:{line} quotes {path}, which does not exist"
    quoted = [q.rstrip() for q in textwrap.dedent(rest).splitlines() if q.strip()]
    source = [s.rstrip() for s in path.read_text().splitlines()]
    width = len(quoted[0]) - len(quoted[0].lstrip())
    for start, src in enumerate(source):
        if src.strip() != quoted[0].strip():
            continue
        shift = (len(src) - len(src.lstrip())) - width
        got = [s for s in source[start:] if s.strip()][: len(quoted)]
        if [(" " * shift + q) if shift >= 0 else q[-shift:] for q in quoted] == got:
            return
    pytest.fail(f"{doc}:{line}: the quote of {path.relative_to(ROOT)} no longer matches it "
                f"(first line {quoted[0].strip()!r})")
