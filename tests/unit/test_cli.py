"""The console script: demo and diagram."""

from __future__ import annotations

import shutil

from click.testing import CliRunner

from executors.cli import main


def test_demo_prints_ranks_through_every_phase():
    result = CliRunner().invoke(main, ["demo"])
    assert result.exit_code == 0, result.output
    for phrase in ("upscale 4 -> 6", "crashes: its replacement gets rank 2", "downscale 6 -> 3",
                   "controller recovered", "invariants held after every step"):
        assert phrase in result.output


def test_diagram_mermaid(tmp_path):
    result = CliRunner().invoke(main, ["diagram"])
    assert result.exit_code == 0 and "stateDiagram-v2" in result.output and "pending --> starting" in result.output
    out = tmp_path / "lifecycle.mmd"
    assert CliRunner().invoke(main, ["diagram", "-o", str(out)]).exit_code == 0
    assert "stateDiagram-v2" in out.read_text()


def test_diagram_png_explains_what_is_missing_or_writes_png(tmp_path):
    out = tmp_path / "lifecycle.png"
    result = CliRunner().invoke(main, ["diagram", "--format", "png", "-o", str(out)])
    if shutil.which("dot") is None:
        assert result.exit_code == 1 and "graphviz" in result.output
    else:
        assert result.exit_code == 0, result.output
        assert out.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
