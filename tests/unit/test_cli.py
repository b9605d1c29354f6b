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


# ------------------------------------- simulate's summary at 100 columns (issue 20)
import csv  # noqa: E402
import io  # noqa: E402
import json  # noqa: E402
import pathlib  # noqa: E402

import pytest  # noqa: E402

from executors.cli import SUMMARY_FIGURES, short_detail  # noqa: E402
from executors.sweep import FIGURES, figure_value  # noqa: E402

EXAMPLES = pathlib.Path(__file__).resolve().parents[2] / "examples" / "scenarios"
HIDDEN = [f for f in FIGURES if f.key not in SUMMARY_FIGURES]


def _simulate(*args: str, columns: str | None = "100"):
    result = CliRunner(env={"COLUMNS": columns}).invoke(main, ["simulate", *map(str, args)])
    assert result.exit_code == 0, result.output
    return result.stdout


@pytest.mark.parametrize("columns", ["100", None], ids=["COLUMNS=100", "piped"])
@pytest.mark.parametrize("name", ["controller-crash.yaml", "day-of-churn-1000.yaml"])
def test_the_summary_and_expectations_fit_100_columns_uncut(name, columns):
    """No header or cell cut short ('…') and no line past 100 columns, whether
    COLUMNS says 100 or the output is piped without it."""
    out = _simulate(EXAMPLES / name, columns=columns)
    assert "…" not in out, out
    assert max(len(line) for line in out.splitlines()) <= 100, out
    for title in ("deployment", "target", "healthy", "contiguous", "crashes", "reassigned", "any level",
                  "avail. %", "crash→ready", "p50 s", "expectations", "seen"):
        assert title in out, title
    assert "every figure: --wide, --format json|csv" in " ".join(out.split())


@pytest.mark.parametrize("args", [("controller-crash.yaml",), ("traffic-batching.yaml",),
                                  ("controller-crash.yaml", "--seeds", "2", "--set", "cluster.nodes=2,3")],
                         ids=["summary", "traffic", "sweep"])
def test_an_80_column_terminal_gets_every_title_word_whole_and_nothing_cut(args):
    """Narrower than the boxed tables: their columns are parted by a space (and a sweep's wide
    tables split), so no title is broken mid-word ("deploym/ent"), no figure cut ('…')."""
    out = _simulate(EXAMPLES / args[0], *args[1:], columns="80")
    assert "…" not in out, out
    assert max(len(line) for line in out.splitlines()) <= 80, out
    assert "┃ deployment" not in out  # (the figures' compact form: no box; the expectations fold in theirs)
    headers = [line.split() for line in out.splitlines() if line.split()[:1] in (["deployment"], ["cluster.nodes"])]
    assert headers, out
    for words in headers:
        assert "deployment" in words, out
    legend = next(line for line in out.splitlines() if "replicas whose rank moved" in line)
    assert len(legend) > 70, out  # (once, after the tables, as wide as the terminal: not in a narrow column)
    if len(args) == 1:
        assert {"target", "healthy", "contiguous", "crashes"} <= set(headers[0])
    else:  # every figure of the sweep's recovery table, its columns split over two tables
        for title in ("crashes", "timeouts", "crash→ready", "to full", "max s"):
            assert title in out, title
        assert sum(words[:3] == ["cluster.nodes", "deployment", "runs"] for words in headers) > 5


def test_a_thousand_ranks_are_said_in_a_few_words():
    out = _simulate(EXAMPLES / "day-of-churn-1000.yaml")
    assert "global ranks 0..999 (1,000, contiguous)" in out
    assert "998, 999" not in out and out.count("\n") < 40


def test_the_default_leaves_figures_out_and_wide_shows_every_one():
    default = _simulate(EXAMPLES / "controller-crash.yaml")
    wide = _simulate(EXAMPLES / "controller-crash.yaml", "--wide")
    summary = default[:default.index("expectations")]  # (an expectation may name user_config)
    for word in ("timeouts", "user_config", "frac.", "unavail.", "whole run", "to full"):
        assert word not in summary, word  # neither a column nor its legend entry
        assert word in wide, word
    for f in FIGURES:  # every figure's title, wrapped or not, in a table of its group
        assert all(w in wide for w in f.title.split()), f.title
    # the first table (availability) carries the state columns and the run's title; the others their group's
    first = wide[:wide.index("└")]
    assert all(word in first for word in ("contiguous", "avail. %", "strength %", "unavail.", "controller crash"))
    for group in ("recovery", "ranks", "contiguity", "contiguity_s"):
        assert any(line.strip() == group for line in wide.splitlines()), group
    assert "…" not in wide and max(len(line) for line in wide.splitlines()) <= 100, wide
    # --columns picks groups or figures for one run too, in the sweep's vocabulary
    ranks = _simulate(EXAMPLES / "controller-crash.yaml", "--columns", "ranks")
    assert "user_config" in ranks and "timeouts" not in ranks and "avail. %" not in ranks
    bad = CliRunner().invoke(main, ["simulate", str(EXAMPLES / "controller-crash.yaml"), "--wide", "--columns", "ranks"])
    assert bad.exit_code == 2 and "--wide is --columns all" in bad.output
    typo = CliRunner().invoke(main, ["simulate", str(EXAMPLES / "controller-crash.yaml"), "--columns", "rank"])
    assert typo.exit_code == 2 and "unknown column 'rank'" in typo.output


def test_every_figure_the_default_hides_is_in_json_and_csv():
    path = EXAMPLES / "node-loss-3-nodes.yaml"
    rows = list(csv.DictReader(io.StringIO(_simulate(path, "--format", "csv"))))
    runs = json.loads(_simulate(path, "--format", "json"))["runs"]
    assert len(rows) == len(runs) == 1
    metrics = runs[0]["metrics"]["deployments"]["llm"]
    assert HIDDEN and {"timeouts", "reconfigures_user_config", "noncontig_s_any", "to_full_strength_p50",
                       "noncontiguous_seconds"} <= {f.key for f in HIDDEN}
    for f in HIDDEN:
        v = figure_value(metrics, f.key)
        assert f.key in rows[0], f.key
        assert rows[0][f.key] == ("" if v is None else str(v)), f.key
    assert float(rows[0]["noncontig_s_node_rank"]) > 0  # a figure that says something: the node loss


def test_short_detail_writes_long_lists_as_runs_keeping_gaps_and_repeats():
    assert short_detail("global ranks [0, 1, 2, 3]") == "global ranks [0, 1, 2, 3]"
    assert short_detail(f"global ranks {list(range(1000))}") == "global ranks 0..999 (1,000, contiguous)"
    gap = [*range(5), *range(6, 20)]
    assert short_detail(f"expected global ranks {list(range(20))}, saw {gap}") == \
        "expected global ranks 0..19 (20, contiguous), saw 0..4, 6..19 (19)"
    assert short_detail(f"saw {[*range(10), 9]}") == "saw 0..9, 9 (11)"  # a repeated rank shows
    many = list(range(0, 40, 2))
    assert short_detail(f"saw {many}") == "saw 0, 2, 4, 6, … (16 more runs) (20)"


def test_make_simulate_gives_crash_to_ready_and_says_what_each_count_counts():
    """controller-crash.yaml (make simulate): its 2 crashes fell while the controller was down; the
    summary times them to the recovery's replacements (not "-"), and each count expectation names
    its count and window (issue 36)."""
    out = " ".join(_simulate(EXAMPLES / "controller-crash.yaml").split())
    row = next(line for line in _simulate(EXAMPLES / "controller-crash.yaml").splitlines() if "│ llm" in line)
    cells = [c.strip() for c in row.split("│") if c.strip()]
    assert cells[4] == "2" and float(cells[-1]) > 14  # crashes; crash→ready p50 (t=35/36 to ready after t=50)
    assert "expect[7] reconfigures (rank) of llm" in out and "saw 0 rank reconfigures by t=350.1" in out
    assert "expect[8] reconfigures (user_config) of llm" in out
    assert "saw 4 user_config reconfigures by t=350.1" in out
    assert "expect[6] reassignments (any level) of llm" in out and "saw 0 replicas moved (any level)" in out


def test_crash_to_ready_says_none_when_crashes_had_no_replacement_ready():
    from executors.cli import _figure_cell

    p50 = next(f for f in FIGURES if f.key == "crash_to_ready_p50")
    assert _figure_cell({"crashes": 2, "crash_to_ready_p50": None}, p50) == "none"
    assert _figure_cell({"crashes": 0, "crash_to_ready_p50": None}, p50) == "-"
    assert _figure_cell({"crashes": 2, "crash_to_ready_p50": 6.54}, p50) == "6.5"
