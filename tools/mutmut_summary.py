#!/usr/bin/env python
"""Per-module summary of a mutmut run (``make mutate``; docs/testing.md).

Reads mutmut's own records (``mutants/<file>.meta``: each mutant's exit code)
and prints, for each rule module that has been mutated, how many mutants it
has and how many were killed, survived, timed out, had no test reaching them,
or were not checked yet; then the survivors by name (``mutmut show NAME``
prints the diff of one), each marked with whether docs/testing.md explains it
(names it, in backquotes: an equivalent mutant, or one not worth killing).
Exit status 1 when a survivor is not explained there, else 0.

    .venv/bin/python tools/mutmut_summary.py            # every mutated module
    .venv/bin/python tools/mutmut_summary.py rankcore/requests/queue.py
    .venv/bin/python tools/mutmut_summary.py --drop-empty-stats   # (before a run: see below)

``--drop-empty-stats`` removes ``mutants/mutmut-stats.json`` when it maps no
test to any function: mutmut 3.8.1 empties that map when a command that does
not generate mutants (``mutmut print-time-estimates``) loads it, and a run
would then call every mutant "no tests"; without the file, the next run
collects the map again.
"""

from __future__ import annotations

import json
import re
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
MUTANTS = ROOT / "mutants"
DOC = ROOT / "docs" / "testing.md"

#: mutmut's exit-code meanings (mutmut/stats.py, status_by_exit_code), folded
#: into the columns shown; anything else is "suspicious"
STATUS = {1: "killed", 3: "killed", 0: "survived", 5: "no tests", 33: "no tests", 34: "skipped",
          36: "timeout", -24: "timeout", 24: "timeout", 152: "timeout", 255: "timeout",
          37: "type check", -11: "segfault", -9: "segfault", None: "not checked"}
COLUMNS = ("killed", "survived", "timeout", "no tests", "not checked", "other")


def status(code: int | None) -> str:
    s = STATUS.get(code, "suspicious")
    return s if s in COLUMNS else "other"


def load(only: list[str]) -> dict[str, dict[str, int | None]]:
    """{source file: {mutant name: exit code}} from mutants/**/*.py.meta."""
    out = {}
    for meta in sorted(MUTANTS.rglob("*.py.meta")):
        src = meta.relative_to(MUTANTS).as_posix()[: -len(".meta")]
        if only and src not in only:
            continue
        codes = json.loads(meta.read_text())["exit_code_by_key"]
        if codes:
            out[src] = codes
    return out


def explained() -> set[str]:
    """The mutant names docs/testing.md gives, in backquotes."""
    return set(re.findall(r"`(rankcore\.[^`\s]+__mutmut_\d+)`", DOC.read_text())) if DOC.exists() else set()


def drop_empty_stats() -> None:
    stats = MUTANTS / "mutmut-stats.json"
    try:
        data = json.loads(stats.read_text())
    except (FileNotFoundError, ValueError):
        return
    if not any(data.get("tests_by_mangled_function_name", {}).values()):
        stats.unlink()
        print(f"{stats.relative_to(ROOT)} mapped no test to any function: removed (the run collects it again)")


def main(argv: list[str]) -> int:
    if argv == ["--drop-empty-stats"]:
        drop_empty_stats()
        return 0
    if not MUTANTS.is_dir():
        print("no mutants/ folder: run `make mutate` first", file=sys.stderr)
        return 2
    data = load(argv)
    width = max([len(s) for s in data] + [6])
    print(f"{'module':<{width}}  {'mutants':>7}  " + "  ".join(f"{c:>11}" for c in COLUMNS) + "  kill rate")
    survivors = []
    for src, codes in data.items():
        counts = dict.fromkeys(COLUMNS, 0)
        for name, code in codes.items():
            counts[status(code)] += 1
            if status(code) == "survived":
                survivors.append(name)
        checked = len(codes) - counts["not checked"]
        # timeouts count as killed (the mutant broke the suite), as in mutmut's own score
        rate = f"{100 * (counts['killed'] + counts['timeout']) / checked:.1f}%" if checked else "-"
        print(f"{src:<{width}}  {len(codes):>7}  " + "  ".join(f"{counts[c]:>11}" for c in COLUMNS) + f"  {rate:>9}")
    known = explained()
    unexplained = [n for n in survivors if n not in known]
    if survivors:
        print(f"\nsurvivors ({len(survivors)}, {len(unexplained)} not explained in docs/testing.md; "
              "`mutmut show NAME` for the diff):")
        for name in survivors:
            print(("  explained    " if name in known else "  UNEXPLAINED  ") + name)
    return 1 if unexplained else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
