"""Type-check the Python examples in README.md and docs/*.md with mypy.

Every fenced ```python block is checked, except blocks quoted from the source
(``# quoted from <file>``: that file is type-checked itself) and fragments
marked ``# not type-checked: <why>``. Each block becomes a module of its own,
so examples cannot lean on each other's names. Exit status 1 (with mypy's
report, mapped back to ``file:line``) when any block has a type error.

    .venv/bin/python tools/typecheck_docs.py [FILES...]
"""

from __future__ import annotations

import pathlib
import re
import sys
import tempfile
import textwrap

from mypy import api

ROOT = pathlib.Path(__file__).resolve().parent.parent
DEFAULT = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
_BLOCK = re.compile(r"^(?P<indent>[ \t]*)```python[ \t]*\n(?P<body>.*?)^(?P=indent)```[ \t]*$", re.S | re.M)
_SKIP = ("# quoted from ", "# not type-checked")


def blocks(path: pathlib.Path) -> list[tuple[int, str]]:
    """(first line of the code in the file, dedented code) of every checked block."""
    text = path.read_text()
    out = []
    for m in _BLOCK.finditer(text):
        body = textwrap.dedent(m.group("body"))
        first = body.lstrip("\n").split("\n", 1)[0].strip()
        if first.startswith(_SKIP):
            continue
        out.append((text.count("\n", 0, m.start("body")) + 1, body))
    return out


def main(argv: list[str]) -> int:
    files = [pathlib.Path(a).resolve() for a in argv] or DEFAULT
    with tempfile.TemporaryDirectory(prefix="rankcore-doc-types-") as tmp:
        where: dict[str, tuple[pathlib.Path, int]] = {}
        for path in files:
            for n, (line, body) in enumerate(blocks(path)):
                name = f"{re.sub(r'[^a-z0-9]+', '_', path.stem.lower())}_block{n}.py"
                (pathlib.Path(tmp) / name).write_text(body)
                where[name] = (path, line)
        if not where:
            print("typecheck_docs: no python blocks found")
            return 0
        out, err, status = api.run([
            "--config-file", str(ROOT / "pyproject.toml"), "--no-error-summary",
            "--follow-imports=silent", "--cache-dir", str(ROOT / ".mypy_cache"),
            *sorted(str(pathlib.Path(tmp) / n) for n in where),
        ])
        pattern = re.compile(r"^.*?([a-z0-9_]+_block\d+\.py):(\d+):")

        def relocate(m: re.Match) -> str:
            doc, line = where[m.group(1)]
            return f"{doc.relative_to(ROOT)}:{line + int(m.group(2)) - 1}:"

        report = "\n".join(pattern.sub(relocate, ln) for ln in out.splitlines() if ln.strip())
        if report:
            print(report)
        if err:
            print(err, file=sys.stderr)
    print(f"typecheck_docs: {len(where)} examples in {len(files)} files, "
          f"{'ok' if status == 0 else 'type errors above'}")
    return 0 if status == 0 else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
