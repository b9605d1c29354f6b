"""The request plane's golden scripts (tests/scenarios/requests/*.txt): routing by model, the batcher,
a replica's model cache. ``RANKCORE_REWRITE=1 pytest tests/scenarios`` rewrites their outputs; read the
diff before committing it."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from .requests_golden import check

SCRIPTS = sorted((Path(__file__).parent / "requests").glob("*.txt"))


def test_there_are_scripts() -> None:
    assert {p.stem.split("-")[0] for p in SCRIPTS} >= {"batch", "multiplex"}


@pytest.mark.parametrize("path", SCRIPTS, ids=[p.stem for p in SCRIPTS])
def test_request_golden(path: Path) -> None:
    rewrite = os.environ.get("RANKCORE_REWRITE", "") not in ("", "0")
    problem = check(path, rewrite)
    if problem:
        pytest.fail(problem, pytrace=False)
