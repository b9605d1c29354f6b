"""The docs' deployment-option tables, generated from their one declaration (rankcore/base/options.py).

Each table sits between ``<!-- options:SURFACE -->`` and ``<!-- /options:SURFACE -->`` in the
doc that describes that surface (``DOCS``). ``--write`` rewrites them; without it the tool
exits 1 naming each table that differs (tests/unit/test_options.py runs that check).

    .venv/bin/python tools/options_table.py [--write]
"""

from __future__ import annotations

import re
import sys
from pathlib import Path
from typing import Any

import attrs

import rankcore as rc

ROOT = Path(__file__).resolve().parents[1]
#: surface -> (the doc holding its table, the heading of its first column)
DOCS = {"ray": ("docs/ray.md", "`@deployment(...)` / `.options(...)` keyword"),
        "scenario": ("docs/scenarios.md", "key under `deployments.<name>`")}


def _default(value: Any, surface: str) -> str:
    if value is None:
        return "`null`" if surface == "scenario" else "`None`"
    if isinstance(value, str):
        return f"`{value}`" if surface == "scenario" else f'`"{value}"`'
    if isinstance(value, float):
        return f"`{value:g}`"
    if value == ():
        return "nothing"
    return f"`{value!r}`"


def table(surface: str) -> str:
    """The markdown table of every option as ``surface`` spells it, in declaration order."""
    head = DOCS[surface][1]
    lines = [f"| {head} | default | what it does |", "|---|---|---|"]
    for name in rc.options.OPTION_NAMES:
        spelt = rc.options.spelling(name, surface)
        what = rc.options.leaf_doc(name)
        default = _default(getattr(rc.options.DEFAULTS, name), surface)
        if spelt is None:
            lines.append(f"| `{name}` | {default} | {what} |")
        else:
            core = "" if spelt.key == name else f" (the core's `{name}`)"
            note = f"; {spelt.note}" if spelt.note else ""
            lines.append(f"| `{spelt.key}`{core} | {spelt.default or default} | {what}{note} |")
    group_names = ", ".join(f"`{g.name}`" for g in attrs.fields(rc.options.DeploymentConfig))
    lines.append("")
    lines.append(f"Generated from `rankcore/base/options.py` (`DeploymentConfig`, groups {group_names}) by "
                 f"`tools/options_table.py --write`; do not edit by hand.")
    return "\n".join(lines)


def _pattern(surface: str) -> re.Pattern:
    return re.compile(rf"(<!-- options:{surface} -->\n)(.*?)\n?(<!-- /options:{surface} -->)", re.S)


def stale() -> list[str]:
    """The docs whose table differs from the declaration (or that lack one)."""
    out = []
    for surface, (doc, _) in DOCS.items():
        m = _pattern(surface).search((ROOT / doc).read_text())
        if m is None:
            out.append(f"{doc}: no <!-- options:{surface} --> ... <!-- /options:{surface} --> table")
        elif m.group(2) != table(surface):
            out.append(f"{doc}: the options:{surface} table differs from rankcore/base/options.py")
    return out


def write() -> None:
    for surface, (doc, _) in DOCS.items():
        path = ROOT / doc
        new = table(surface)
        text, n = _pattern(surface).subn(lambda m, new=new: m.group(1) + new + "\n" + m.group(3), path.read_text())
        if n != 1:
            raise SystemExit(f"{doc}: expected one <!-- options:{surface} --> table, found {n}")
        path.write_text(text)


def main(argv: list[str]) -> int:
    if "--write" in argv:
        write()
        return 0
    problems = stale()
    for p in problems:
        print(p, file=sys.stderr)
    if problems:
        print("run: .venv/bin/python tools/options_table.py --write", file=sys.stderr)
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
