"""The ``rankcore`` console script.

``simulate`` runs a scenario file in the simulator (what-if sweeps with
``--set``), ``run`` runs one on a chosen executor, ``check-trace`` checks the
invariants over a trace, ``diagram`` renders the replica lifecycle,
``demo`` walks the bare core through its rules and ``serve`` serves an
application over HTTP on Ray; ``deploy``, ``build``, ``status``, ``delete`` and
``shutdown`` operate applications from a config file as Ray Serve's CLI does
(docs/operate.md).
"""

from __future__ import annotations

import itertools
import logging
import os
import re
import shutil
import socket
import sys
import tempfile
import textwrap
import threading
import time
from pathlib import Path
from typing import Any, NoReturn

import attrs

try:  # (the core installs without them: the command line is the ``cli`` extra)
    import click
    import yaml
    from rich import box
    from rich.cells import cell_len
    from rich.console import Console
    from rich.markup import escape
    from rich.table import Table
    from rich.text import Text
except ImportError as _missing:  # pragma: no cover - make and the test extra install them
    raise SystemExit(f"the rankcore command needs its extra: pip install 'rankcore[cli]' ({_missing})") from None

from rankcore.requests import dataplane

EXIT_EXPECTATION_FAILED = 1
EXIT_BAD_INPUT = 2

#: How long a command waits to join a running Ray cluster before exit 2 (docs/operate.md): Ray's own
#: ``ray.init(address=...)`` retries an unreachable one for some 12 minutes, a silent port for ever.
CONNECT_TIMEOUT_S = 30.0
_CONNECT_TIMEOUT = click.option(
    "--connect-timeout", type=click.FloatRange(min=0, min_open=True), default=CONNECT_TIMEOUT_S, show_default=True,
    help="Give up joining the Ray cluster after this many seconds (exit 2).")


@click.group(context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(package_name="rankcore")
def main() -> None:
    """rankcore: stable, contiguous replica ranks."""


# ------------------------------------------------------------------ simulate
def _parse_sets(sets: tuple[str, ...], zipped: bool = False) -> list[dict[str, Any]]:
    """``key=v1,v2`` options -> the list of variants: their cartesian product, or
    (``zipped``) the i-th value of every option together. Each value is read as YAML within the
    scenario files' bounds (``check_yaml_bounds``: its size, depth and alias expansion); one past
    them, or one YAML cannot hold (an int of more than 4,300 digits), is exit 2 naming its key."""
    from .scenarios.format import YamlTooBig, check_yaml_bounds

    axes = []
    for s in sets:
        key, sep, values = s.partition("=")
        if not sep or not key or not values:
            raise click.UsageError(f"--set {_shown(s)}: expected key=value[,value...]")
        parsed, name = [], _shown(key, 120, quote=False)
        for v in values.split(","):
            try:
                check_yaml_bounds(v, "the value")
                parsed.append(yaml.safe_load(v))
            except YamlTooBig as exc:
                _fail(f"--set {name}: value {_shown(v)} refused: {exc}")
            except yaml.YAMLError:
                raise click.UsageError(f"--set {_shown(s)}: cannot read value {_shown(v)}") from None
            except (ValueError, RecursionError) as exc:  # (an int of more than 4,300 digits; a depth the bound missed)
                _fail(f"--set {name}: value {_shown(v)} refused: {type(exc).__name__}: {exc}")
        axes.append([(key, v) for v in parsed])
    if not axes:
        return [{}]
    if zipped:
        lengths = {len(a) for a in axes}
        if len(lengths) != 1:
            raise click.UsageError(f"--zip pairs the i-th values of every --set: they need as many values each, "
                                   f"got {', '.join(f'{a[0][0]}: {len(a)}' for a in axes)}")
        return [dict(combo) for combo in zip(*axes)]
    return [dict(combo) for combo in itertools.product(*axes)]


def _shown(text: str, most: int = 60, quote: bool = True) -> str:
    """``text`` on one line (quoted: its ``repr``), cut to ``most`` characters (a hostile value
    may be 100 KB)."""
    from .scenarios.format import one_line

    shown = repr(text[:most]) if quote else one_line(text[:most])
    return shown if len(text) <= most else f"{shown}... ({len(text):,} characters)"


def _fmt(v: Any, digits: int = 1) -> str:
    if v is None:
        return "-"
    if isinstance(v, float):
        return f"{v:.{digits}f}"
    return str(v)


#: one run's default summary: the state columns, then these figures (keys of
#: executors.sweep.FIGURES, where every figure is declared); ``--wide`` or
#: ``--columns`` show the others, ``--format json|csv`` carries them all
SUMMARY_FIGURES = ("crashes", "reassignments_any", "availability_pct", "crash_to_ready_p50")

#: (a word of a column title, what it means): the legend under a table lists those of the columns it shows
MEANINGS = (
    ("reassigned", "reassigned: replicas whose rank moved (per level; any level: at one or more)"),
    ("reconfigures", "reconfigures: reconfigure calls for a rank change / a user_config update"),
    ("timeouts", "timeouts: starts replaced after faults.start_timeout"),
    ("crash→ready", "crash→ready: from a rank's failure to its replacement ready (a crash while the controller "
                    "was down: to the replica its recovery started on that rank; none: no replacement ready by "
                    "the end)"),
    ("avail. %", "avail. %: serving / target replica-seconds after first full strength"),
    ("full strength %", "full strength %: time after that with every replica serving"),
    ("unavail.", "unavail. replica·s: target minus serving replicas, integrated"),
    ("to full", "to full: from each drop below full strength (a crash, a node loss; not a new target) "
                "to full strength again"),
    ("frac.", "non-contig frac. / s: time after start-up with that level's ranks not contiguous"),
    ("whole run", "non-contig whole run s: seconds with ranks not contiguous, start-up included"),
    ("loads", "cold / warm loads: placements that loaded the weights from disk / the node's WARM copy"),
    ("HOT replica", "HOT replica·s: replicas serving from their GPU, integrated"),
    ("wait to HOT", "wait to HOT: from a replica's StartReplica to its being ready (never HOT: stopped, "
                    "crashed or the run ended first; their wait until then counts too)"),
    ("queue wait", "queue wait: a request's submit to its first dispatch; latency: submit to answer; "
                   "lost: submitted minus ended minus waiting (0)"),
    ("GPU-h", "replica·s / GPU-h: replicas holding their node's GPUs (placed until stopped or dead), integrated; "
              "GPU-h: times the GPUs of each; cold starts: replicas started"),
    ("scale", "scale ups / downs: target changes the autoscaler made"),
    ("group", "group avail. %: the time each collective group was up (from its epoch formed plus the "
              "re-form's cost until a member of it was lost); epochs formed; members that re-formed in place "
              "/ joined; outage: a member lost to the next epoch up"),
    ("to enough", "to enough: from a metrics sample whose load needs more replicas than serve (ceil(total / "
                  "target_ongoing_requests)) to enough serving (over the episodes that ended by a scale-up)"),
    ("model hit", "models: hit rate: requests served without a load of their own / requests with a model id; "
                  "loaded (per min): model loads; evicted: models unloaded to make room"),
    ("1st item", "streams: 1st item: a stream's submit to its first item; duration: its dispatch to its last "
                 "item (the slot held); failed: ended by an error after the items given (its replica died "
                 "mid-stream: never retried)"),
    ("TTFT", "routing: TTFT: a request's arrival to its first token (its queue wait, its wait for its replica's "
             "prefill line, and its prefill of what the replica's prefix cache lacked); prefix hit share: prompt "
             "characters found cached / all; replica imbalance: the most requests one replica served / the mean "
             "per replica (1: even)"),
)


def legend(titles: Any, more: bool = False) -> str:
    """What the columns titled ``titles`` mean (only those that need saying);
    ``more``: say where the figures not shown are."""
    flat = " ".join(t.replace("\n", " ") for t in titles)
    parts = [text for word, text in MEANINGS if word in flat]
    if more:
        parts.append("every figure: --wide, --format json|csv")
    return "; ".join(parts)


def _state_cells(result: Any, name: str) -> list[str]:
    dep = result.state.deployments.get(name)
    return [escape(name), str(dep.target) if dep else "-", "yes" if dep and dep.healthy else "no",
            "yes" if dep and dep.ranks.is_contiguous() else "no"]


def _figure_cell(m: dict, f: Any) -> str:
    from .sweep import figure_value

    v = figure_value(m, f.key)
    if v is None:
        # crashes and no replacement ready (the target fell, the run ended first): say so, not "-"
        return "none" if f.key.startswith("crash_to_ready") and m.get("crashes") else "-"
    return str(int(v)) if f.count else f"{v:.{f.digits}f}"


def _title_width(title: str) -> int:
    """A column's width for ``title``: its lines as written, else one line up to
    10 characters, else the narrowest that fits it in two lines (never below its
    longest word). A fixed width keeps rich from cutting a title short
    ("crash→rea…") when it shrinks a table to fit."""
    if "\n" in title or len(title) <= 10:
        return max(len(line) for line in title.split("\n"))
    width = max(len(w) for w in title.split())
    while len(textwrap.wrap(title, width)) > 2:
        width += 1
    return width



def _cell_width(col: Any) -> int:
    """The width ``col`` needs: its widest cell line, its fixed width, and never below its title's
    longest word (rich would break "deployment" mid-word to fit)."""
    return max(col.width or 0, col.min_width or 0, *(cell_len(line) for c in col.cells for line in str(c).split("\n")))


def _sized(console: Console) -> bool:
    """Whether ``console``'s width is the terminal's or one COLUMNS gives (a number; rich takes
    anything else as 80), not a pipe's guess."""
    return console.is_terminal or os.environ.get("COLUMNS", "").isdigit()


def _fit(tables: list[Table], width: int, keep: int = 1) -> list[Any]:
    """``tables`` for a console ``width`` wide (an 80-column terminal): no title word broken; where
    a boxed table would be wider, every table's columns parted by one space instead of a box and
    padding, the legend (the last caption) printed after them at the whole width; and where even
    that is too wide, a table's figure columns in several tables of about as many columns each,
    each beginning with its first ``keep`` columns (what names a row), the title on the first."""
    widths = {}  # column -> the width it needs, by id (each measured once)
    for table in tables:
        for col in table.columns:
            col.min_width = max(col.min_width or 0, max((cell_len(w) for w in str(col.header).split()), default=0))
            widths[id(col)] = _cell_width(col)
    if all(sum(widths[id(c)] + 3 for c in t.columns) + 1 <= width for t in tables):
        return tables
    captions = [t.caption for t in tables if t.caption]
    for t in tables:
        t.caption = None
    out: list[Any] = [part for table in tables for part in _compact(table, widths, width, keep)]
    return out + [c if isinstance(c, Text) else Text.from_markup(c, style="table.caption") for c in captions]


def _compact(table: Table, widths: dict[int, int], width: int, keep: int) -> list[Table]:
    """``table`` (or its columns in several tables) with one space between columns, each column
    ``widths[id(column)]`` wide (``_fit``)."""
    cols = table.columns

    def need(cs: list) -> int:
        return sum(widths[id(c)] for c in cs) + len(cs) - 1

    compact = {"box": box.SIMPLE_HEAD, "padding": (0, 0), "pad_edge": False, "show_edge": False}
    for col in cols:  # (each as wide as computed: rich's own shrinking would cut a figure short)
        col.width = widths[id(col)]
    if need(cols) <= width or len(cols) <= keep + 1:
        for k, v in compact.items():
            setattr(table, k, v)
        return [table]
    head, rest = cols[:keep], cols[keep:]
    greedy: list[list[Any]] = [[]]
    for col in rest:
        if greedy[-1] and need(head + greedy[-1] + [col]) > width:
            greedy.append([])
        greedy[-1].append(col)
    size = -(-len(rest) // len(greedy))  # (as many parts, about as many columns in each, if they fit)
    even = [rest[i:i + size] for i in range(0, len(rest), size)]
    chunks = even if len(even) == len(greedy) and all(need(head + c) <= width for c in even) else greedy
    out = []
    for i, chunk in enumerate(chunks):
        t = Table(title=table.title if i == 0 else None, **compact)  # type: ignore[arg-type]
        part = head + chunk
        for col in part:
            t.add_column(col.header, justify=col.justify, min_width=col.min_width, width=col.width,
                         overflow=col.overflow)
        for row in zip(*(list(col.cells) for col in part)):
            t.add_row(*row)
        out.append(t)
    return out


def _figures_table(title: str, cols: list, cells: dict[str, list[str]]) -> Table:
    """A table of figures: a row per deployment, a column per figure, each as wide as its widest cell."""
    t = Table(title=title)
    t.add_column("deployment", overflow="fold")
    for i, f in enumerate(cols):
        t.add_column(f.title, justify="right", width=max([_title_width(f.title), *(len(c[i]) for c in cells.values())]))
    for name, row in cells.items():
        t.add_row(escape(name), *row)
    return t

def _summary_tables(result: Any, figures: Any = None) -> list[Table]:
    """One run's summary. ``figures`` None: one table of the state columns and
    ``SUMMARY_FIGURES`` (readable at 100 columns); else a table per group of
    ``figures`` (the sweep's groups), the state columns in the first."""
    from .sweep import ALIASES, FIGURES, GROUPS, TRAFFIC_GROUPS

    deps = result.metrics["deployments"]
    title = (f"{escape(result.scenario.name)}  [dim](seed {result.seed}, virtual t={result.end_time:,.1f}s, "
             f"{result.events:,} core events)[/dim]")
    if figures is None:
        groups = [[f for key in SUMMARY_FIGURES for f in FIGURES if f.key == key]]
    else:
        keys = {f.key for f in figures}  # (a figure shown again under an alias: once is enough in one run)
        figures = [f for f in figures if ALIASES.get(f.key) not in keys]
        groups = [cols for g in GROUPS if (cols := [f for f in figures if f.group == g])]
    out = []
    for n, cols in enumerate(groups or [[]]):
        t = Table(title=title if n == 0 else cols[0].group)
        for c in ("deployment", "target", "healthy", "contiguous") if n == 0 else ("deployment",):
            t.add_column(c, justify="left" if c == "deployment" else "right", overflow="fold")
        cells = {name: [_figure_cell(m, f) for f in cols] for name, m in deps.items()}
        for i, f in enumerate(cols):
            t.add_column(f.title, justify="right",
                         width=max([_title_width(f.title), *(len(c[i]) for c in cells.values())]))
        for name in deps:
            t.add_row(*(_state_cells(result, name) if n == 0 else [escape(name)]), *cells[name])
        out.append(t)
    tiers = [f for f in FIGURES if f.group == "tiers"]
    if figures is None and any(m.get("cold_loads") or m.get("warm_loads") for m in deps.values()):
        t = Table(title="tiers")  # GPU memory tiers at work (issue 21): their figures too
        t.add_column("deployment", overflow="fold")
        for f in tiers:
            t.add_column(f.title, justify="right", width=max(_title_width(f.title), 7))
        for name, m in deps.items():
            t.add_row(escape(name), *(_figure_cell(m, f) for f in tiers))
        out.append(t)
        groups.append(tiers)
    scaled = {name: m for name, m in deps.items() if m.get("autoscaling")}
    if figures is None and scaled:  # autoscaled deployments (issue 23): cost, decisions, the callers' wait
        cols = [f for f in FIGURES if f.group == "autoscaling" and f.key not in ALIASES]  # (the rest: other tables)
        out.append(_figures_table("autoscaling", cols, {name: [_figure_cell(m, f) for f in cols]
                                                        for name, m in scaled.items()}))
        groups.append(cols)
    grouped = {name: m for name, m in deps.items() if m.get("group_reforms")}
    if figures is None and grouped:  # collective groups (issue 67): time up, epochs, in place / joined
        cols = [f for f in FIGURES if f.group == "groups"]
        out.append(_figures_table("groups", cols, {name: [_figure_cell(m, f) for f in cols]
                                                   for name, m in grouped.items()}))
        groups.append(cols)
    for group in TRAFFIC_GROUPS if figures is None and any(m.get("requests") for m in deps.values()) else ():
        cols = [f for f in FIGURES if f.group == group]  # the request queue (``traffic:``): counts, waits
        cells = {name: [_figure_cell(m, f) for f in cols] for name, m in deps.items() if m.get("requests")}
        cells = {name: row for name, row in cells.items() if set(row) != {"-"}}  # (streams: theirs only)
        if not cells:
            continue
        out.append(_figures_table(group, cols, cells))
        groups.append(cols)
    out[-1].caption = legend([f.title for cols in groups for f in cols], more=figures is None)
    return out


_INT_LIST = re.compile(r"\[(\d+(?:, \d+)*)\]")


def short_detail(text: str, most: int = 8) -> str:
    """``text`` with every list of more than ``most`` whole numbers (a
    1,000-replica rank list) written as its runs: ``0..999 (1,000,
    contiguous)``, ``0..4, 6..999 (999)``; a gap or a repeat stays visible."""

    def runs(m: re.Match) -> str:
        nums = [int(x) for x in m.group(1).split(", ")]
        if len(nums) <= most:
            return m.group(0)
        spans: list[list[int]] = []
        for n in nums:
            if spans and n == spans[-1][1] + 1:
                spans[-1][1] = n
            else:
                spans.append([n, n])
        text = ", ".join(f"{a}..{b}" if b > a else str(a) for a, b in spans[:4])
        if len(spans) > 4:
            text += f", … ({len(spans) - 4} more runs)"
        contiguous = len(spans) == 1 and spans[0][0] == 0
        return f"{text} ({len(nums):,}{', contiguous' if contiguous else ''})"

    return _INT_LIST.sub(runs, text)


def _expectation_table(result: Any) -> Table | None:
    if not result.expectations:
        return None
    t = Table(title="expectations")
    t.add_column("", justify="center")
    t.add_column("expectation", overflow="fold")
    t.add_column("seen", overflow="fold")
    for e in result.expectations:
        t.add_row("[green]pass[/green]" if e.passed else "[red]FAIL[/red]", escape(e.name),
                  escape(short_detail(e.detail)))
    return t


def _run_one(scenario: Any, seed: int | None, trace_path: Path | None, snapshot_every: int | None,
             console: Console, show_progress: bool) -> Any:
    from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn

    from .sim import Simulation

    fp = open(trace_path, "w") if trace_path else None
    try:
        with Progress(TextColumn("[bold]simulating[/bold] {task.description}"), BarColumn(),
                      TextColumn("t={task.completed:,.0f}s"), TimeElapsedColumn(), console=console,
                      transient=True, disable=not show_progress) as progress:
            task = progress.add_task(scenario.name, total=scenario.duration)

            def tick(now: float, total: float | None) -> None:
                progress.update(task, completed=now)

            sim = Simulation(scenario, seed=seed, trace=fp, snapshot_every=snapshot_every, progress=tick)
            return sim.run()
    finally:
        if fp:
            fp.close()


@main.command()
@click.argument("scenario", type=click.Path(dir_okay=False, path_type=Path))
@click.option("--seed", type=int, help="Override the scenario's seed.")
@click.option("--trace", "trace_path", type=click.Path(dir_okay=False, path_type=Path),
              help="Write the JSON Lines trace here (see docs/trace-format.md).")
@click.option("--plot", "plot_path", type=click.Path(dir_okay=False, path_type=Path),
              help="Write a PNG timeline: who held each rank when, crashes, reconfigures, world_size.")
@click.option("--set", "sets", multiple=True, metavar="KEY=V1[,V2...]",
              help="What-if: override a scenario field (dotted path), e.g. "
                   "faults.crash_rate_per_replica_hour=0,0.5,2; several values run several variants.")
@click.option("--plot-window", metavar="START:END",
              help="Plot only this part of the run (virtual seconds; suffix h or d for hours or days: 2d:3d).")
@click.option("--zip", "zipped", is_flag=True,
              help="Pair the --set values (the i-th value of each option together) instead of every combination.")
@click.option("--seeds", type=click.IntRange(min=1), default=1, show_default=True,
              help="Run every variant with N seeds (the scenario's seed, or --seed, and the next N-1); "
                   "tables show mean and min-max, and how many runs met each expectation.")
@click.option("--jobs", type=click.IntRange(min=1), help="Processes for a sweep (default: every core).")
@click.option("--format", "fmt", type=click.Choice(["table", "json", "csv"]), default="table", show_default=True,
              help="json / csv: every figure of every run (to --output, else stdout instead of the tables).")
@click.option("--output", type=click.Path(dir_okay=False, path_type=Path), help="Write --format json/csv here.")
@click.option("--trace-dir", type=click.Path(file_okay=False, path_type=Path),
              help="A sweep: write each run's trace here (<variant>-seed<N>.jsonl).")
@click.option("--plot-dir", type=click.Path(file_okay=False, path_type=Path),
              help="A sweep: write each run's plot here (<variant>-seed<N>.png).")
@click.option("--snapshot-every", type=click.IntRange(min=1), help="Write a full trace snapshot every N steps (default: when the deltas add up to one).")
@click.option("--columns", metavar="NAMES",
              help="The figures the tables show: groups (availability, recovery, ranks, contiguity, contiguity_s, "
                   "tiers, requests, queue, streams, autoscaling), "
                   "figure keys or 'all', comma-separated (default: one run, a short summary; a sweep, all groups "
                   "but contiguity_s).")
@click.option("--wide", is_flag=True, help="Show every figure (--columns all): one table per group.")
@click.option("--quiet", is_flag=True, help="Print only failures and the final verdict.")
@click.option("--address", metavar="ADDR",
              help="A sweep: run each (variant, seed) as a Ray task on this cluster (auto, HOST:PORT, "
                   "ray://HOST:PORT; local: a fresh local Ray) instead of on local processes; the same figures.")
@_CONNECT_TIMEOUT
def simulate(scenario: Path, seed: int | None, trace_path: Path | None, plot_path: Path | None,
             plot_window: str | None, sets: tuple[str, ...], zipped: bool, seeds: int, jobs: int | None, fmt: str, output: Path | None,
             trace_dir: Path | None, plot_dir: Path | None, snapshot_every: int | None, quiet: bool,
             columns: str | None = None, wide: bool = False, address: str | None = None,
             connect_timeout: float = CONNECT_TIMEOUT_S) -> None:
    """Run SCENARIO (a YAML file) in the simulator and summarise what happened to ranks."""
    if wide:
        if columns is not None:
            raise click.UsageError("--wide is --columns all: give one of them")
        columns = "all"
    if address is not None or seeds > 1 or fmt != "table" or trace_dir or plot_dir or len(_parse_sets(sets, zipped)) > 1:
        if trace_path or plot_path:
            raise click.UsageError("--trace and --plot take one run; use --trace-dir / --plot-dir for a sweep")
        if address is not None and (trace_dir or plot_dir):
            raise click.UsageError("--trace-dir / --plot-dir are not written with --address (each run's files "
                                   "would be on the node that ran it): run that sweep without --address")
        if address is not None and jobs is not None:
            raise click.UsageError("--jobs is for a sweep on local processes; with --address the cluster's "
                                   "CPUs run the tasks")
        _sweep(scenario, seed, sets, zipped, seeds, jobs, fmt, output, trace_dir, plot_dir, quiet, columns,
               address, connect_timeout)
        return
    figures = None
    if columns is not None:
        from .sweep import select_figures

        try:
            figures = select_figures(columns)
        except ValueError as exc:
            raise click.UsageError(f"--columns: {exc}") from None
    _simulate(scenario, seed, trace_path, plot_path, sets, snapshot_every, quiet, _window(plot_window), figures)


def _window(text: str | None) -> tuple[float, float] | None:
    """``START:END`` in seconds, or with an h / d suffix, as (start, end) seconds."""
    if text is None:
        return None

    def secs(s: str) -> float:
        s = s.strip()
        scale = {"h": 3600.0, "d": 86400.0, "s": 1.0}.get(s[-1:])
        return float(s[:-1]) * scale if scale is not None else float(s)

    a, sep, b = text.partition(":")
    try:
        start, end = secs(a), secs(b)
    except ValueError:
        raise click.UsageError(f"--plot-window {text!r}: expected START:END, e.g. 3600:7200 or 2d:3d") from None
    if not sep or not start < end:
        raise click.UsageError(f"--plot-window {text!r}: expected START:END with START < END")
    return start, end


def _sweep(scenario_path: Path, seed: int | None, sets: tuple[str, ...], zipped: bool, seeds: int,
           jobs: int | None, fmt: str, output: Path | None, trace_dir: Path | None, plot_dir: Path | None,
           quiet: bool, columns: str | None = None, address: str | None = None,
           connect_timeout: float = CONNECT_TIMEOUT_S) -> None:
    """Every variant x seed, on every core (``address``: as Ray tasks on that cluster, the same
    records in the same order); invalid variants are reported and skipped."""
    from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn

    from .sim import ScenarioError, load_scenario
    from .sweep import (
        InvalidVariant,
        autoscaling_figures,
        group_figures,
        proxy_figures,
        rollout_figures,
        run_sweep,
        select_figures,
        sweep_cpus,
        tables,
        to_csv,
        to_json,
        traffic_figures,
    )

    try:
        figures = select_figures(columns)
    except ValueError as exc:
        raise click.UsageError(f"--columns: {exc}") from None

    console = Console(stderr=fmt != "table" and output is None)
    if not _sized(console):  # piped: every figure on its line
        console = Console(width=200, stderr=fmt != "table" and output is None)
    variants, invalid, base_seed, warned = [], [], {}, set()
    for v in _parse_sets(sets, zipped):
        try:
            sc = load_scenario(scenario_path, overrides=v)
        except ScenarioError as exc:
            invalid.append(InvalidVariant(variant=v, error=str(exc)))
            click.echo(f"error: variant {_label(v)}: {exc}", err=True)
            continue
        for w in sc.warnings:
            if w not in warned:  # once per sweep
                warned.add(w)
                click.echo(f"warning: {w}", err=True)
        variants.append(v)
        base_seed[_label(v)] = sc.seed if seed is None else seed
    if not variants:
        sys.exit(EXIT_BAD_INPUT)
    for d in (trace_dir, plot_dir):
        if d:
            d.mkdir(parents=True, exist_ok=True)
    started = _sweep_ray(address, connect_timeout) if address is not None else False
    try:
        t0 = time.perf_counter()
        with Progress(TextColumn("[bold]sweep[/bold]"), BarColumn(), TextColumn("{task.completed}/{task.total} runs"),
                      TimeElapsedColumn(), console=Console(stderr=True), transient=True,
                      disable=quiet or not Console(stderr=True).is_terminal) as progress:
            task = progress.add_task("runs", total=len(variants) * seeds)
            records = run_sweep(scenario_path, variants,
                                lambda v: [base_seed[_label(v)] + i for i in range(seeds)], jobs=jobs,
                                trace_dir=trace_dir, plot_dir=plot_dir,
                                progress=lambda done, total: progress.update(task, completed=done),
                                on_ray=address is not None)
        wall = time.perf_counter() - t0
        cpus = sweep_cpus(len(records), jobs, on_ray=address is not None)
    finally:
        if started:
            import ray

            ray.shutdown()
    where = f"Ray tasks at {address}" if address is not None else "local processes"
    rate = (f"{len(records)} runs in {wall:.2f}s wall: {len(records) / max(wall, 1e-9):.2f} runs/s "
            f"on {cpus} CPU{'s' if cpus != 1 else ''} ({where})")
    if fmt != "table":
        text = to_json(records, invalid) if fmt == "json" else to_csv(records)
        if output:
            output.write_text(text)
        else:
            click.echo(text, nl=False)
    if fmt == "table" or output:
        if columns is None:  # the default groups, and the request queue's when the runs had traffic
            figures += (rollout_figures(records) + traffic_figures(records) + proxy_figures(records)
                        + autoscaling_figures(records) + group_figures(records))
        out = tables(records, records[0].scenario if records else scenario_path.name, figures)
        out[-1].caption = legend([f.title for f in figures])
        keep = len(records[0].variant) + 2 if records else 1  # (the variant's keys, deployment, runs)
        console.print(*_fit(out, console.width, keep))
        console.print(f"[dim]{escape(rate)}" + (f"; {fmt}: {escape(str(output))}" if output else "") + "[/dim]")
    elif not quiet:  # json / csv on stdout: the rate on stderr
        click.echo(rate, err=True)
    failed = [r for r in records if not r.passed]
    for r in failed:
        for e in r.expectations:
            if not e["passed"]:
                click.echo(f"expectation failed [{_label(r.variant)} seed={r.seed}]: {e['name']}: "
                           f"{short_detail(e['detail'])}", err=True)
    if invalid:
        sys.exit(EXIT_BAD_INPUT)
    if failed:
        sys.exit(EXIT_EXPECTATION_FAILED)
    if quiet:
        click.echo(f"ok: {len(records)} run(s), every expectation met")


def _label(variant: dict) -> str:
    return ", ".join(f"{k}={v}" for k, v in variant.items()) or "as written"


def _sweep_ray(address: str, connect_timeout: float) -> bool:
    """Connect for ``simulate --address``: ``local`` starts a fresh local Ray, anything else is
    joined within ``connect_timeout`` (``_join``: exit 2 naming the address when there is no
    cluster there). A process already connected (tests, notebooks) keeps its Ray when the address
    is ``auto``, ``local`` or that cluster's own, and is exit 2 otherwise. True: started here
    (the caller shuts it down)."""
    import ray

    os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
    os.environ.setdefault("RAY_AUTH_MODE", "disabled")
    if ray.is_initialized():
        try:
            current = ray.get_runtime_context().gcs_address
        except Exception:  # (a ray:// client: no GCS address to compare)
            current = None
        if current is None or address in ("auto", "local") or address.split("://", 1)[-1] == current:
            return False
        _fail(f"--address {address}: this process is already connected to the Ray cluster at {current}")
    if address == "local":
        ray.init(address="local", include_dashboard=False, log_to_driver=False, logging_level=logging.ERROR)
    else:
        _join(address, connect_timeout, log_to_driver=False, logging_level=logging.ERROR)
    return True


def _simulate(scenario_path: Path, seed: int | None, trace_path: Path | None, plot_path: Path | None,
              sets: tuple[str, ...], snapshot_every: int | None, quiet: bool,
              window: tuple[float, float] | None = None, figures: Any = None) -> None:
    """One run (``sets`` give one value each; several variants go to ``_sweep``);
    ``figures``: the summary's figures (None: the short summary)."""
    from .sim import ScenarioError, load_scenario

    console = Console()
    if not _sized(console):
        console = Console(width=100)  # piped: as wide as the summary needs, whatever rich's default
    (variant,) = _parse_sets(sets)
    try:
        sc = load_scenario(scenario_path, overrides=variant)
    except ScenarioError as exc:
        click.echo(f"error: {exc}", err=True)  # one plain line: no wrapping, no markup
        sys.exit(EXIT_BAD_INPUT)
    for w in sc.warnings:
        click.echo(f"warning: {w}", err=True)
    t0 = time.perf_counter()
    path = trace_path
    tmp = None
    if plot_path and not path:
        tmp = tempfile.NamedTemporaryFile("w", suffix=".jsonl", delete=False)
        tmp.close()
        path = Path(tmp.name)
    result = _run_one(sc, seed, path, snapshot_every, console, show_progress=not quiet and console.is_terminal)
    wall = time.perf_counter() - t0
    if not quiet:
        console.print(*_fit(_summary_tables(result, figures), console.width))
        et = _expectation_table(result)
        if et is not None:
            console.print(et)
        console.print(f"[dim]{result.events:,} core events in {wall:.2f}s wall "
                      f"({result.events / max(wall, 1e-9):,.0f} events/s)"
                      + (f"; trace: {escape(str(trace_path))}" if trace_path else "") + "[/dim]")
    if plot_path and path:
        from .sim.plot import plot_trace

        try:
            plot_trace(path, plot_path, title=sc.name, window=window, variant=variant)
        except ValueError as exc:
            click.echo(f"error: --plot-window: {exc}", err=True)
            sys.exit(EXIT_BAD_INPUT)
        if not quiet:
            console.print(f"[dim]plot: {escape(str(plot_path))}[/dim]")
        if tmp:
            Path(tmp.name).unlink(missing_ok=True)
    where = f" [{_label(variant)}]" if variant else ""
    for e in result.failures:
        click.echo(f"expectation failed{where}: {e.name}: {short_detail(e.detail)}", err=True)
    if result.failures:
        sys.exit(EXIT_EXPECTATION_FAILED)
    if quiet:
        console.print("ok: 1 run(s), every expectation met")


@main.command()
@click.argument("scenario", type=click.Path(dir_okay=False, path_type=Path))
@click.option("--executor", type=click.Choice(["sim", "ray"]), default="sim", show_default=True,
              help="sim: the simulator; ray: real Ray actors (a local Ray unless --address).")
@click.option("--seed", type=int, help="(sim) Override the scenario's seed.")
@click.option("--trace", "trace_path", type=click.Path(dir_okay=False, path_type=Path),
              help="Write the JSON Lines trace here (the same format for both executors).")
@click.option("--address", help="(ray) Connect to this Ray cluster instead of starting a local one.")
@_CONNECT_TIMEOUT
@click.option("--cluster", "cluster_kind", type=click.Choice(["auto", "local", "scenario"]), default="auto",
              show_default=True,
              help="(ray) local: one local Ray node; scenario: a local multi-node Ray shaped like the scenario's "
                   "cluster (its GPUs as logical GPUs; needed for lose_node/add_node); auto: scenario when the "
                   "scenario loses or adds nodes, else local.")
def run(scenario: Path, executor: str, seed: int | None, trace_path: Path | None, address: str | None,
        connect_timeout: float, cluster_kind: str) -> None:
    """Run SCENARIO on an executor and check its expectations."""
    if executor == "sim":
        _simulate(scenario, seed, trace_path, None, (), None, False)
        return
    _run_on_ray(scenario, trace_path, address, cluster_kind, connect_timeout)


def _run_on_ray(scenario_path: Path, trace_path: Path | None, address: str | None, cluster_kind: str = "auto",
                connect_timeout: float = CONNECT_TIMEOUT_S) -> None:
    import os

    from .sim import ScenarioError, load_scenario

    try:
        sc = load_scenario(scenario_path)
        from .ray_gpu.scenario import UnsupportedOnRay, check_supported, needs_cluster

        if cluster_kind == "auto":
            cluster_kind = "scenario" if needs_cluster(sc) and not address else "local"
        if cluster_kind == "scenario" and address:
            raise UnsupportedOnRay("--cluster scenario starts its own local cluster: it does not take --address")
        check_supported(sc, multi_node=cluster_kind == "scenario")
    except (ScenarioError, UnsupportedOnRay) as exc:
        click.echo(f"error: {exc}", err=True)
        sys.exit(EXIT_BAD_INPUT)
    import ray

    from .ray_gpu import get_controller
    from .ray_gpu.scenario import run_on_ray

    os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
    os.environ.setdefault("RAY_AUTH_MODE", "disabled")
    console = Console()
    cluster = None
    started = not ray.is_initialized()
    if cluster_kind == "scenario":
        if not started:
            click.echo("error: --cluster scenario starts its own Ray cluster, but this process is already "
                       "connected to one", err=True)
            sys.exit(EXIT_BAD_INPUT)
        from .ray_gpu.control.cluster import ScenarioCluster

        with console.status(f"starting a local Ray cluster of {len(sc.nodes)} nodes + head"):
            cluster = ScenarioCluster(sc.nodes)
        ray.init(address=cluster.address, log_to_driver=False)
    elif not started:
        pass  # embedded use (tests, notebooks): keep the caller's Ray
    elif address:
        _join(address, connect_timeout, log_to_driver=False)
    else:
        ray.init(address="local", num_cpus=max(4, os.cpu_count() or 1), include_dashboard=False,
                 object_store_memory=256 * 1024**2, log_to_driver=False)
    try:
        fp = open(trace_path, "w") if trace_path else None
        try:
            t0 = time.perf_counter()
            result = run_on_ray(sc, trace_fp=fp, cluster=cluster)
        finally:
            if fp:
                fp.close()
        where = f"a {len(sc.nodes)}-node local Ray cluster" if cluster else "Ray"
        t = Table(title=f"{sc.name} on {where}  [dim]({time.perf_counter() - t0:.1f}s)[/dim]")
        t.add_column("", justify="center")
        t.add_column("expectation")
        t.add_column("seen")
        for name, ok, detail in result.expectations:
            t.add_row("[green]pass[/green]" if ok else "[red]FAIL[/red]", escape(name), escape(short_detail(detail)))
        console.print(t)
        ray.get(get_controller().reset.remote())
    finally:
        if started:
            ray.shutdown()
        if cluster is not None:
            cluster.shutdown()
    failed = [(n, d) for n, ok, d in result.expectations if not ok]
    for n, d in failed:
        click.echo(f"expectation failed: {n}: {short_detail(d)}", err=True)
    if failed:
        sys.exit(EXIT_EXPECTATION_FAILED)


# --------------------------------------------------------------- crash-sweep
@main.command("crash-sweep")
@click.argument("scenario", type=click.Path(dir_okay=False, path_type=Path))
@click.option("--every", type=click.IntRange(1), default=1, show_default=True,
              help="Crash after every K-th step only (a long scenario: N runs of N steps).")
def crash_sweep(scenario: Path, every: int) -> None:
    """Run SCENARIO once, then once per step k with the controller crashed right after step k and
    recovered at once: every invariant, no orphan, the same end state (exit 1 on a difference)."""
    from rich.progress import Progress

    from .sim import ScenarioError, load_scenario
    from .sim.crashsweep import sweep

    try:
        sc = load_scenario(scenario)
    except ScenarioError as exc:
        click.echo(f"error: {exc}", err=True)
        sys.exit(EXIT_BAD_INPUT)
    with Progress(transient=True, console=Console(stderr=True)) as bar:
        task = bar.add_task("crashing after each step", total=None)
        report = sweep(sc, every=every, progress=lambda k, n: bar.update(task, completed=k, total=n))
    click.echo(f"{report.scenario}: {report.steps} steps, crashed after {len(report.crashed)} "
               f"(every {every}), {len(report.failures)} different"
               + (f", {len(report.local_only)} with other local ranks only (after steps "
                  f"{', '.join(map(str, report.local_only[:10]))})" if report.local_only else ""))
    for k, why in list(report.failures.items())[:20]:
        click.echo(f"crash after step {k}: {why}", err=True)
    if not report.passed:
        sys.exit(1)


# --------------------------------------------------------------- check-trace
@main.command("check-trace")
@click.argument("trace", type=click.Path(dir_okay=False, path_type=Path))
def check_trace(trace: Path) -> None:
    """Check every rank invariant over a JSON Lines trace (exit 1 on a violation)."""
    from .checktrace import TraceFormatError, check_trace_file

    console = Console()
    try:
        report = check_trace_file(trace)
    except TraceFormatError as exc:
        click.echo(f"error: {exc}", err=True)
        sys.exit(EXIT_BAD_INPUT)
    console.print(report.summary())
    if not report.ok:
        for v in report.violations[:20]:
            click.echo(f"violation: {v}", err=True)
        sys.exit(1)


# --------------------------------------------------------------------- serve
def _load_app(target: str) -> Any:
    """``module:attr`` -> the application (``api.apps.import_app``: a ``Deployment`` is bound
    with no arguments, a builder function called; the module's classes travel to the replicas
    by value). A bad target is a usage error naming what was wrong."""
    import rankcore as rc

    from .ray_gpu.api.apps import import_app

    if ":" not in target:
        raise click.UsageError(f"expected MODULE:APP (e.g. my_models:app), got {target!r}")
    try:
        return import_app(target, {})
    except rc.InvalidConfig as exc:
        raise click.UsageError(str(exc)) from None


@main.command()
@click.argument("target", metavar="MODULE:APP")
@click.option("--port", type=click.IntRange(0, 65535),
              help="The ingress's port (default: the running ingress's, else 8000; 0: any free port).")
@click.option("--host", help="The address to listen on (default 127.0.0.1; 0.0.0.0: every interface).")
@click.option("--route-prefix", help="The route to the application's deployment (default /<deployment name>).")
@click.option("--request-timeout-s", type=click.FloatRange(min=0, min_open=True),
              help="Answer 408 to a request unanswered after this long (default 60).")
@click.option("--max-body-bytes", type=click.IntRange(min=0), help="Answer 413 to a larger body (default 1 MiB).")
@click.option("--header-timeout-s", type=click.FloatRange(min=0, min_open=True),
              help="Answer 408 and close a connection whose request head is not in after this long (default 10).")
@click.option("--max-header-bytes", type=click.IntRange(min=1024),
              help="Answer 431 to a larger request head (default 16 KiB).")
@click.option("--max-connections", type=click.IntRange(min=1),
              help="Answer 503 and close a connection past this many open (default 10000).")
@click.option("--data-plane", type=click.Choice(dataplane.DATA_PLANES),
              help="What carries the requests: proxy (the Python proxy and router) or direct (HAProxy straight "
                   "to each replica's own HTTP server). Default: the running ingress's, else proxy (direct with "
                   "RAY_SERVE_ENABLE_HA_PROXY=1). docs/ray.md, \"The direct data plane\".")
@click.option("--address", help="Connect to this Ray cluster instead of starting a local one.")
@_CONNECT_TIMEOUT
@click.option("--access-log/--no-access-log", "enable_access_log", default=None,
              help="Write one JSON access record per request (default: on; docs/metrics.md).")
def serve(target: str, port: int | None, host: str | None, route_prefix: str | None, request_timeout_s: float | None,
          max_body_bytes: int | None, address: str | None, enable_access_log: bool | None,
          header_timeout_s: float | None = None, max_header_bytes: int | None = None,
          max_connections: int | None = None, connect_timeout: float = CONNECT_TIMEOUT_S,
          data_plane: str | None = None) -> None:
    """Deploy MODULE:APP and serve it over HTTP until interrupted (docs/ray.md, "HTTP ingress")."""
    import ray

    import rankcore as rc

    from .ray_gpu.api.deployments import run as ray_run
    from .ray_gpu.ingress.http import check_port, expose, start_ingress

    app = _load_app(target)
    os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
    os.environ.setdefault("RAY_AUTH_MODE", "disabled")
    if address:
        _join(address, connect_timeout, log_to_driver=False)
    else:
        try:  # (a local Ray is ours: its proxy's port, in use, is named before Ray starts)
            check_port(host, port)
        except rc.InvalidConfig as exc:
            click.echo(f"error: {exc}", err=True)
            sys.exit(EXIT_BAD_INPUT)
        ray.init(address="local", include_dashboard=False, log_to_driver=False)

    try:
        start_ingress(host, port, max_body_bytes=max_body_bytes,
                      request_timeout_s=request_timeout_s if request_timeout_s is not None else "keep",
                      enable_access_log=enable_access_log,
                      header_timeout_s=header_timeout_s if header_timeout_s is not None else "keep",
                      max_header_bytes=max_header_bytes,
                      max_connections=max_connections if max_connections is not None else "keep",
                      data_plane=data_plane)
        url = expose(ray_run(app), route_prefix, port, host)
    except rc.RankcoreError as exc:
        click.echo(f"error: {exc}", err=True)
        ray.shutdown()
        sys.exit(EXIT_BAD_INPUT)
    base = url.split("/", 3)
    click.echo(f"serving {app.deployment.name!r} at {url}  (status: {'/'.join(base[:3])}/-/status; Ctrl-C stops)",
               err=False)
    sys.stdout.flush()
    try:
        while True:
            time.sleep(3600)
    except KeyboardInterrupt:
        pass
    finally:
        ray.shutdown()  # a local cluster goes with it; on --address, the deployment and the ingress keep serving


# ------------------------------------------------- operate (issue 37): deploy, build, status, delete, shutdown
def _connect(address: str | None, connect_timeout: float) -> None:
    """Join the running Ray cluster (``--address``, else ``RAY_ADDRESS``, else the local one):
    the controller, the ingress and the REST server are its named actors. No cluster: exit 2."""
    import ray

    os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
    os.environ.setdefault("RAY_AUTH_MODE", "disabled")
    if ray.is_initialized():
        return
    _join(address or os.environ.get("RAY_ADDRESS") or "auto", connect_timeout, namespace="rankcore",
          log_to_driver=False, logging_level=logging.ERROR)


def _join(address: str, connect_timeout: float, **init: Any) -> None:
    """``ray.init(address=address, **init)`` within ``connect_timeout`` seconds, else exit 2 naming both.

    Ray retries a GCS it cannot reach for some 12 minutes, and one that accepts the connection but
    never answers (not a GCS) for ever: a port that refuses, or a host that does not answer, is
    refused at once by a TCP connect, and a watchdog ends the process at the deadline whatever Ray
    is waiting on (``ray.init`` cannot be interrupted, and it has started nothing to clean up)."""
    import ray

    lock = threading.Lock()
    done = False

    def said(why: str) -> str:
        return (f"no Ray cluster at {address} ({why}, gave up within --connect-timeout {connect_timeout:g} s): "
                f"start one with `ray start --head`, or pass --address")

    def give_up(why: str, now: bool = False) -> None:
        nonlocal done
        with lock:  # (once: the watchdog and a failing ray.init may both give up)
            if done:
                return
            done = True
            if now:  # the watchdog's thread: sys.exit would end only that thread
                click.echo(f"error: {said(why)}", err=True)
                sys.stderr.flush()
                os._exit(EXIT_BAD_INPUT)
        _fail(said(why))

    watchdog = threading.Timer(connect_timeout, give_up, ("no answer from Ray there", True))
    watchdog.daemon = True
    watchdog.start()
    try:
        host, _, port = address.split("://", 1)[-1].rpartition(":")
        if host and port.isdigit():
            try:
                socket.create_connection((host.strip("[]"), int(port)), timeout=connect_timeout).close()
            except TimeoutError:
                give_up("no answer")
            except OSError as exc:
                give_up(exc.strerror or str(exc))
        try:
            ray.init(address=address, **init)
        except (ConnectionError, RuntimeError, ValueError) as exc:
            give_up(str(exc).splitlines()[0])
        with lock:
            done = True
    finally:
        watchdog.cancel()


def _fail(message: str) -> NoReturn:
    click.echo(f"error: {message}", err=True)
    sys.exit(EXIT_BAD_INPUT)


_ADDRESS = click.option("--address", help="The Ray cluster (default: RAY_ADDRESS, else the running local one).")


@main.command()
@click.argument("target", metavar="CONFIG|MODULE:APP")
@click.argument("arguments", metavar="[KEY=VALUE]...", nargs=-1)
@_ADDRESS
@_CONNECT_TIMEOUT
@click.option("--wait/--no-wait", default=True, show_default=True,
              help="Wait until every deployment is healthy (Ray Serve's deploy returns at once: --no-wait).")
@click.option("--timeout", type=click.FloatRange(min=0, min_open=True), default=120.0, show_default=True,
              help="How long --wait waits, in seconds.")
@click.option("--rest-port", type=click.IntRange(0, 65535),
              help="Start the REST server (/api/serve/applications/) on this port if none runs (default 8266).")
def deploy(target: str, arguments: tuple[str, ...], address: str | None, connect_timeout: float, wait: bool,
           timeout: float, rest_port: int | None) -> None:
    """Apply a config file (Ray Serve's schema): deploy or update its applications, delete
    those it no longer names. Applying the same file again changes nothing (docs/operate.md).
    Or, as Serve's ``serve deploy``, one application from MODULE:APP: named ``default``, at ``/``,
    a builder's ``args`` given as KEY=VALUE (the proxies that run keep their host and port)."""
    import rankcore as rc

    from .ray_gpu.api import config as cf

    config_file = _config_or_import_path(target, arguments)
    try:
        if isinstance(config_file, Path):
            cfg = cf.load(config_file)  # (checked before any cluster is joined)
        else:
            cfg = cf.parse(config_file, source=target)
    except cf.ConfigError as exc:
        _fail(str(exc))
    for note in cfg.warnings:
        click.echo(f"warning: {note}", err=True)
    _connect(address, connect_timeout)
    if not isinstance(config_file, Path):  # (an import path keeps the proxies that run where they are)
        from .ray_gpu.ingress.http import ingress_address

        running = ingress_address()
        if running is not None:
            cfg = attrs.evolve(cfg, http_options=attrs.evolve(cfg.http_options, host=running[0], port=running[1]))
    from .ray_gpu.api import apps, rest

    try:
        url = rest.start_rest(None, rest_port)
        applied = apps.apply_config(cfg, wait_s=timeout if wait else None)
    except rc.RankcoreError as exc:
        _fail(str(exc))
    except TimeoutError as exc:
        click.echo(f"error: {exc}", err=True)
        sys.exit(1)
    click.echo(f"applied {len(applied)} application(s) from {config_file}: {', '.join(applied) or 'none'} "
               f"(REST: {url}/api/serve/applications/)")


def _config_or_import_path(target: str, arguments: tuple[str, ...]) -> Path | dict:
    """``rankcore deploy``'s argument as Serve's ``serve deploy`` reads it: a config file (a file, or a
    name ending .yaml, .yml or .json), else an import path whose application is named ``default`` at
    ``/``, its builder's ``args`` from KEY=VALUE (a value is a string, as Serve passes them)."""
    path = Path(target)
    if path.is_file() or path.suffix in (".yaml", ".yml", ".json"):
        if arguments:
            _fail(f"KEY=VALUE arguments are for an import path (MODULE:APP); {target} is a config file")
        return path
    args: dict[str, str] = {}
    for a in arguments:
        key, eq, value = a.partition("=")
        if not eq or not key:
            _fail(f"arguments are KEY=VALUE, got {a!r}")
        args[key] = value
    return {"applications": [{"name": "default", "route_prefix": "/", "import_path": target, "args": args}]}


@main.command()
@click.argument("targets", metavar="MODULE:APP...", nargs=-1, required=True)
@click.option("-o", "--output", type=click.Path(dir_okay=False, path_type=Path), help="Write here instead of stdout.")
@click.option("--grpc-servicer-functions", "servicers", multiple=True, metavar="MODULE.FUNCTION",
              help="A gRPC servicer function the proxies serve (add_XServicer_to_server); repeat for more.")
def build(targets: tuple[str, ...], output: Path | None, servicers: tuple[str, ...]) -> None:
    """Write the config file that deploys each MODULE:APP as its code says (edit it, then `rankcore
    deploy`): one application per import path, named by its ingress deployment."""
    import rankcore as rc

    from .ray_gpu.api import config as cf
    from .ray_gpu.api.apps import import_app

    target = targets[0]
    try:
        built = []
        for target in targets:
            built.append((target, import_app(target, {})))
        text = cf.dump(cf.build_config(built, grpc_servicer_functions=servicers))
        cf.parse(yaml.safe_load(text), "the built config")  # (what build writes, deploy reads)
    except cf.ConfigError as exc:
        _fail(f"the built config: {exc.message}" if exc.path else str(exc))
    except rc.InvalidConfig as exc:
        _fail(f"{target}: {exc}")
    if output:
        output.write_text(text)
        click.echo(f"wrote {output}")
    else:
        click.echo(text, nl=False)


@main.command()
@_ADDRESS
@_CONNECT_TIMEOUT
@click.option("--json", "as_json", is_flag=True, help="Print JSON (the same facts) instead of tables.")
def status(address: str | None, connect_timeout: float, as_json: bool) -> None:
    """Applications, deployments, replicas (ranks, node, tier, state, version; pid too on a terminal
    of 120 columns or more), the proxy, autoscaling targets and recent faults. Exit status 1 when
    anything is unhealthy (UNHEALTHY, DEPLOY_FAILED, the proxy down), 0 while deploying."""
    import json as json_

    _connect(address, connect_timeout)
    from .ray_gpu.api import apps

    view = apps.status()
    if as_json:
        click.echo(json_.dumps(view, indent=2, default=str))
    else:
        _status_tables(view, Console())
    if not view["healthy"]:
        if not as_json:
            for line in apps.unhealthy(view):
                click.echo(f"unhealthy: {line}", err=True)
        sys.exit(1)


@main.command("config")
@_ADDRESS
@_CONNECT_TIMEOUT
@click.option("--name", "-n", "app_name", help="Only this application's config.")
def config_command(address: str | None, connect_timeout: float, app_name: str | None) -> None:
    """The config each application was applied with (Ray Serve's `serve config`): one YAML
    document per application, its entry as `rankcore deploy` took it."""
    _connect(address, connect_timeout)
    from .ray_gpu.api import apps

    applied = apps.applied_apps()
    if app_name is not None:
        if app_name not in applied:
            click.echo(f'No config has been deployed for application "{app_name}".')
            return
        applied = {app_name: applied[app_name]}
    if not applied:
        click.echo("No configuration was found.")  # (Ray Serve's words)
        return
    entries = [{k: v for k, v in a.config.items() if v or k != "deployments"} for a in applied.values()]
    click.echo(yaml.safe_dump_all(entries, sort_keys=False), nl=False)


#: the terminal width from which ``rankcore status``'s replica table has a pid column
PID_COLUMN_FROM = 120


def _status_tables(view: dict, console: Console) -> None:
    apps_t = Table(title="applications")
    for col in ("application", "status", "route", "deployment", "deployment status", "target", "autoscaling",
                "message"):
        apps_t.add_column(col)
    deps = [(a["name"], a, d) for a in view["applications"].values() for d in a["deployments"].values()]
    deps += [("-", None, d) for d in view["other_deployments"].values()]
    for app_name, a, d in deps:
        auto = d["autoscaling"]
        apps_t.add_row(escape(app_name), a["status"] if a else "-", escape(str(a["route_prefix"])) if a else "-",
                       escape(d["name"]), d["status"], str(d["target"]),
                       f"{auto['min_replicas']}..{auto['max_replicas']}" if auto else "-",
                       escape(d["message"] or (a["message"] if a else "")))
    console.print(apps_t)
    reps = Table(title="replicas")
    pids = console.width >= PID_COLUMN_FROM  # (narrower, the replica ids would wrap)
    for col in ("deployment", "replica", "rank", "node_rank", "local_rank", "node", *(("pid",) if pids else ()),
                "tier", "state", "version"):
        reps.add_column(col)
    for _, _, d in deps:
        for r in d["replicas"]:
            state = r["state"] + (f" ({r['blue_green']})" if r.get("blue_green") else "")  # (a blue-green switch)
            reps.add_row(escape(d["name"]), escape(r["replica_id"]), str(r["rank"]), str(r["node_rank"]),
                         str(r["local_rank"]), (r["node_id"] or "-")[:12],
                         *((str(r.get("pid") or "-"),) if pids else ()), r["tier"], state,
                         escape(str(r["version"])))
    console.print(reps)
    proxies = Table(title="proxies")
    for col in ("node", "status", "address"):
        proxies.add_column(col)
    for node, p in view["proxies"].items():
        proxies.add_row(node[:12], p["status"], str(p["address"]))
    console.print(proxies)
    if view["recent_faults"]:
        faults = Table(title="recent faults")
        for col in ("t", "event", "detail"):
            faults.add_column(col)
        for f in view["recent_faults"]:
            rest = {k: v for k, v in f.items() if k not in ("t", "event")}
            faults.add_row(str(f["t"]), f["event"], escape(", ".join(f"{k}={v}" for k, v in rest.items())))
        console.print(faults)


@main.command()
@click.argument("name")
@_ADDRESS
@_CONNECT_TIMEOUT
def delete(name: str, address: str | None, connect_timeout: float) -> None:
    """Delete application NAME (its deployments and route), leave the others be."""
    import rankcore as rc

    _connect(address, connect_timeout)
    from .ray_gpu.api import apps

    try:
        apps.delete_app(name)
    except rc.RankcoreError as exc:
        _fail(str(exc))
    click.echo(f"deleted application {name!r}")


@main.command()
@_ADDRESS
@_CONNECT_TIMEOUT
@click.option("--yes", "-y", is_flag=True, help="Do not ask.")
def shutdown(address: str | None, connect_timeout: float, yes: bool) -> None:
    """Delete every application, stop the ingress and the REST server, reset the controller
    (the Ray cluster keeps running)."""
    if not yes:
        click.confirm("Delete every application and reset the controller?", abort=True)
    _connect(address, connect_timeout)
    from .ray_gpu.api import apps, rest

    apps.delete_all()
    rest.stop_rest()
    click.echo("shut down")


# ------------------------------------------------------------------- others
@main.command()
def demo() -> None:
    """Print ranks through upscale, crash, downscale and controller recovery (bare core)."""
    from .demo import run_demo

    run_demo(Console())


@main.command()
@click.option("--format", "fmt", type=click.Choice(["mermaid", "png"]), default="mermaid", show_default=True)
@click.option("-o", "--output", type=click.Path(dir_okay=False, path_type=Path), help="Write here instead of stdout.")
def diagram(fmt: str, output: Path | None) -> None:
    """Render the replica lifecycle (generated from rankcore.base.lifecycle.DECLARATION)."""
    from rankcore.base import lifecycle

    if fmt == "mermaid":
        text = lifecycle.mermaid()
        if output:
            output.write_text(text + "\n")
            click.echo(f"wrote {output}")
        else:
            click.echo(text)
        return
    if shutil.which("dot") is None:
        raise click.ClickException(
            "PNG needs graphviz's 'dot' binary (e.g. apt-get install graphviz) and the "
            "'graphviz' Python package; '--format mermaid' needs neither"
        )
    try:
        graph = lifecycle.graph_machine("graphviz")
    except ImportError as exc:  # pragma: no cover - depends on the machine
        raise click.ClickException(f"PNG needs the 'graphviz' Python package: {exc}") from None
    target = output or Path("lifecycle.png")
    graph.draw(str(target), prog="dot", format="png")
    click.echo(f"wrote {target}")


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
