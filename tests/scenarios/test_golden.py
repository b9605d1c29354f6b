"""The golden scenario scripts (tests/scenarios/*.txt): one per rule of docs/architecture.md.

``RANKCORE_REWRITE=1 pytest tests/scenarios`` rewrites every script's expected
output from what the core does now; read the diff before committing it.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from .golden import check

HERE = Path(__file__).parent
SCRIPTS = sorted(HERE.glob("*.txt"))


def test_there_are_scripts() -> None:
    assert len(SCRIPTS) >= 30


@pytest.mark.parametrize("path", SCRIPTS, ids=[p.stem for p in SCRIPTS])
def test_golden(path: Path) -> None:
    rewrite = os.environ.get("RANKCORE_REWRITE", "") not in ("", "0")
    problem = check(path, rewrite)
    if problem:
        pytest.fail(problem, pytrace=False)
