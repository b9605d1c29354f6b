"""A PNG timeline of a trace (``rankcore simulate --plot``): who held each rank when.

One row per global rank, one bar per replica holding it (coloured by lineage,
so a replacement has its predecessor's colour; solid while serving, pale while
starting, hatched while stopping; labelled with the replica id where there is
room), crash markers, reconfigure markers (rank / user_config), lost nodes,
controller outages, and the world size as a step line on a second y axis whose
value ``w`` sits on the top edge of rank row ``w - 1``. Under each rank chart
an availability panel shows serving replicas against the target over time,
the shortfall shaded, with the availability of the window shown; under it,
for a deployment with ``traffic:``, the request queue (queued and in flight,
the autoscaler's decisions in its title, issue 23).

Holdings are derived from the event and command records (StartReplica opens
one, InitializeReplica / ReconfigureReplica move it, ReplicaStopped,
ReplicaCrashed, NodeLost and a replacement's StartReplica end it) and corrected
by snapshots, so thinned snapshots (``--snapshot-every``) still give the same
picture. The trace is streamed.
"""

from __future__ import annotations

import itertools
import math
from pathlib import Path
from typing import Any

from ..trace import read_trace

__all__ = ["FLEET_RANKS", "plot_figure", "plot_trace", "variant_label"]

#: phase -> how the bar is drawn ("serving" solid, "starting" pale, "stopping" hatched)
_CLASS = {"pending": "starting", "starting": "starting", "running": "serving",
          "reconfiguring": "serving", "stopping": "stopping"}
_PALETTE = ["#4e79a7", "#f28e2b", "#59a14f", "#b07aa1", "#76b7b2", "#edc948", "#9c755f",
            "#ff9da7", "#86bcb6", "#8cd17d", "#a0cbe8", "#d4a6c8", "#bab0ac", "#79706e"]
_CRASH = "#d62728"
_NODE_ADDED = "#2ca02c"
_RANK_RECONF = "#111111"
_CONFIG_RECONF = "#7b3294"
_SERVING = "#1f6fb4"
_QUEUED = "#e15759"
_IN_FLIGHT = "#59a14f"
#: height of the request queue panel (``traffic:``), as a height ratio
_QUEUE_HEIGHT = 1.3
#: height of the availability panel under each rank chart (inches, as a height ratio)
_AVAIL_HEIGHT = 1.5
#: the shortfall of a long run is drawn as the worst value in this many time slices
_SHORT_BINS = 700


class _Replica:
    __slots__ = ("rid", "rank", "cls", "since", "lineage", "node", "held_since")

    def __init__(self, rid: str, rank: int, cls: str, t: float, lineage: int | None,
                 node: str | None) -> None:
        self.rid, self.rank, self.cls, self.since = rid, rank, cls, t
        self.lineage, self.node = lineage, node
        self.held_since = t  # start of the current holding (same rank), for labels


class _Deployment:
    def __init__(self, name: str) -> None:
        self.name = name
        self.live: dict[str, _Replica] = {}
        self.segments: list[tuple[int, float, float, str, Any]] = []  # rank, t0, t1, cls, colour key
        self.holdings: list[tuple[int, float, float, str]] = []  # rank, t0, t1, replica id
        self.crashes: list[tuple[float, int]] = []
        self.crashed: set[str] = set()
        self.reconfigures: list[tuple[float, int, str, int | None]] = []  # t, new rank, reason, old rank
        self.world: list[tuple[float, int]] = []
        self.keys: dict[str, Any] = {}  # replica id -> colour key (for label colours)

    # ---------------------------------------------------------- holdings
    def colour_key(self, rep: _Replica) -> Any:
        return rep.lineage if rep.lineage is not None else f"id:{rep.rid}"

    def _close_segment(self, rep: _Replica, t: float) -> None:
        if t > rep.since:
            self.segments.append((rep.rank, rep.since, t, rep.cls, self.colour_key(rep)))
        rep.since = t

    def _close_holding(self, rep: _Replica, t: float) -> None:
        self.holdings.append((rep.rank, rep.held_since, t, rep.rid))
        self.keys[rep.rid] = self.colour_key(rep)
        rep.held_since = t

    def update(self, rid: str, t: float, *, rank: int | None = None, phase: str | None = None,
               lineage: int | None = None, node: str | None = None) -> None:
        cls = _CLASS.get(phase) if phase is not None else None
        if phase is not None and cls is None:  # stopped / crashed / unknown: gone
            self.end(rid, t)
            return
        rep = self.live.get(rid)
        if rep is None:
            if rank is None:
                return
            self.live[rid] = _Replica(rid, rank, cls or "starting", t, lineage, node)
            return
        if lineage is not None:
            rep.lineage = lineage
        if node is not None:
            rep.node = node
        new_rank = rep.rank if rank is None else rank
        new_cls = rep.cls if cls is None else cls
        if new_rank != rep.rank or new_cls != rep.cls:
            self._close_segment(rep, t)
            if new_rank != rep.rank:
                self._close_holding(rep, t)
            rep.rank, rep.cls = new_rank, new_cls

    def end(self, rid: str, t: float, crashed: bool = False) -> None:
        rep = self.live.pop(rid, None)
        if crashed and rid not in self.crashed:
            rank = rep.rank if rep is not None else None
            if rank is not None:
                self.crashes.append((t, rank))
                self.crashed.add(rid)
        if rep is not None:
            self._close_segment(rep, t)
            self._close_holding(rep, t)

    def target(self, t: float, ws: Any) -> None:
        if isinstance(ws, int) and not isinstance(ws, bool) and (not self.world or self.world[-1][1] != ws):
            self.world.append((t, ws))

    def finish(self, t: float) -> None:
        for rid in list(self.live):
            self.end(rid, t)

    @property
    def max_rank(self) -> int:
        ranks = [s[0] for s in self.segments] + [c[1] for c in self.crashes]
        top = max(ranks) if ranks else 0
        if self.world:
            top = max(top, max(w for _, w in self.world) - 1)
        return max(top, 0)


class _Timeline:
    """Everything the plot shows, read from a trace in one pass."""

    def __init__(self) -> None:
        self.deployments: dict[str, _Deployment] = {}
        self.node_lost: list[tuple[float, str]] = []
        self.node_added: list[tuple[float, str]] = []
        self.down: list[tuple[float, float | None]] = []
        self.header: dict = {}
        self.t_end = 0.0
        self.t_start: float | None = None
        self.where: dict[str, str] = {}  # replica -> deployment
        self.metrics: dict[str, dict] = {}  # deployment -> its figures from the closing record

    def dep(self, name: str) -> _Deployment:
        d = self.deployments.get(name)
        if d is None:
            d = self.deployments[name] = _Deployment(name)
        return d

    def _rank(self, rec: dict) -> int | None:
        rk = rec.get("rank")
        return rk[0] if isinstance(rk, list) and rk else None

    def feed(self, rec: dict) -> None:
        kind = rec["kind"]
        if kind == "header":
            self.header = rec
            return
        t = rec.get("t")
        if not isinstance(t, (int, float)):
            return
        if kind != "expectation":
            self.t_end = max(self.t_end, t)
            if self.t_start is None:
                self.t_start = t
        getattr(self, f"_{kind}", lambda r, t: None)(rec, t)

    def _event(self, rec: dict, t: float) -> None:
        typ, rid, name = rec.get("type"), rec.get("replica"), rec.get("deployment")
        if rec.get("stale"):
            return
        if typ == "ControllerRecovered":
            self._recovered(t)
            return
        if typ == "NodeLost":
            self._lose_node(t, rec.get("node") or (rec.get("fields") or {}).get("node_id"))
            return
        fields = rec.get("fields") or {}
        if typ in ("DeploymentApplied", "ScaleRequested") and name:
            self.dep(name).target(t, fields.get("num_replicas"))
        if rid is None or name is None:
            return
        d = self.dep(name)
        self.where[rid] = name
        if typ == "ReplicaCrashed":
            d.end(rid, t, crashed=True)
        elif typ == "ReplicaStopped":
            d.end(rid, t)
        else:
            d.update(rid, t, rank=self._rank(rec), phase=rec.get("phase"), node=rec.get("node"))

    def _command(self, rec: dict, t: float) -> None:
        name, rid, typ = rec.get("deployment"), rec.get("replica"), rec.get("type")
        if not name:
            return
        d = self.dep(name)
        f = rec.get("fields") or {}
        d.target(t, f.get("world_size"))
        if rid is None:
            return
        self.where[rid] = name
        rank = self._rank(rec)
        if typ == "StartReplica":
            if f.get("replaces"):
                d.end(f["replaces"], t, crashed=True)
            d.update(rid, t, rank=rank, phase=rec.get("phase") or "pending", lineage=f.get("lineage"))
            return
        if typ == "ReconfigureReplica" and rank is not None:
            old = d.live.get(rid)
            d.reconfigures.append((t, rank, f.get("reason", "rank"), old.rank if old is not None else None))
        d.update(rid, t, rank=rank, phase=rec.get("phase"), node=rec.get("node"))

    def _snapshot(self, rec: dict, t: float) -> None:
        for name, sd in (rec.get("deployments") or {}).items():
            d = self.dep(name)
            d.target(t, sd.get("target"))
            reps = sd.get("replicas") or {}
            for rid in [r for r in d.live if r not in reps]:
                d.end(rid, t)
            for rid, r in reps.items():
                g = r.get("global_rank")
                if g is None:
                    g = self._rank(r)
                self.where[rid] = name
                d.update(rid, t, rank=g, phase=r.get("phase"), lineage=r.get("lineage"), node=r.get("node"))

    def _fault(self, rec: dict, t: float) -> None:
        typ = rec.get("type")
        if typ in ("crash", "random_crash") and rec.get("replica"):
            rid = rec["replica"]
            name = self.where.get(rid) or rec.get("deployment")
            if name:
                self.dep(name).end(rid, t, crashed=True)
        elif typ == "node_lost":
            self._lose_node(t, rec.get("node"))
        elif typ == "node_added" and rec.get("node"):
            self.node_added.append((t, rec["node"]))
        elif typ == "controller_crash":
            if not self.down or self.down[-1][1] is not None:
                self.down.append((t, None))
        elif typ == "controller_recovered":
            self._recovered(t)

    def _end(self, rec: dict, t: float) -> None:
        self.metrics = (rec.get("metrics") or {}).get("deployments") or {}

    def _recovered(self, t: float) -> None:
        if self.down and self.down[-1][1] is None:
            self.down[-1] = (self.down[-1][0], t)

    def _lose_node(self, t: float, node: str | None) -> None:
        if node is None:
            return
        if not any(n == node and abs(tt - t) < 1e-9 for tt, n in self.node_lost):
            self.node_lost.append((t, node))
        for d in self.deployments.values():
            for rid in [r.rid for r in d.live.values() if r.node == node]:
                d.end(rid, t, crashed=True)

    def finish(self) -> None:
        for d in self.deployments.values():
            d.finish(self.t_end)
        if self.down and self.down[-1][1] is None:
            self.down[-1] = (self.down[-1][0], self.t_end)


#: snapshots written after a step whose events and commands already say every change
#: (``healthy``, ``step``): the plot skips them unparsed (they are most of a long trace's bytes)
_REDUNDANT_SNAPSHOTS = ('"reason":"healthy"', '"reason":"step"')


def _needed(lines: Any) -> Any:
    """The trace's lines, a redundant snapshot blanked (line numbers stay right)."""
    for line in lines:
        if line.startswith('{"kind":"snapshot"') and any(r in line[:96] for r in _REDUNDANT_SNAPSHOTS):
            yield "\n"
        else:
            yield line


def _read(trace_path: str | Path, *, every_snapshot: bool = False) -> _Timeline:
    """The timeline of a trace; ``every_snapshot`` also reads the redundant snapshots."""
    tl = _Timeline()
    with open(trace_path, encoding="utf-8") as fp:
        try:
            for rec in read_trace(fp if every_snapshot else _needed(fp)):
                tl.feed(rec)
        except ValueError as exc:
            raise ValueError(f"{trace_path}: {exc}") from None
    tl.finish()
    return tl


#: (seconds per unit, name): the time axis of a long run is in hours or days
_UNITS = ((1.0, "s"), (3600.0, "h"), (86400.0, "d"))
#: more crashes than this in a panel are drawn small and translucent (a density, not a wall of X)
_MANY_CRASHES = 150
#: more node losses than this are drawn without labels
_MANY_NODE_EVENTS = 12
#: above this many ranks a deployment is drawn for a planner (serving vs target, ranks by
#: band, crashes / reconfigures / reassignments over time, non-contiguous time per level)
#: instead of one row per replica, which at fleet size is a wall of stripes
FLEET_RANKS = 64
#: the rank-band panel of a fleet shows at most this many bands and time columns
_BANDS = 40
_BAND_COLUMNS = 480
#: time buckets of the events panel of a fleet
_EVENT_BUCKETS = 96
#: panel heights of a fleet (inches, as height ratios)
_BAND_HEIGHT = 3.2
_EVENTS_HEIGHT = 2.0
_NONCONTIG_HEIGHT = 1.3


def variant_label(variant: dict | str | None) -> str:
    """A ``--set`` variant as the title names it: ``cluster.nodes=9, latency.start=5``."""
    if not variant:
        return ""
    if isinstance(variant, str):
        return variant
    return ", ".join(f"{k}={v}" for k, v in variant.items())


def _time_unit(span: float) -> tuple[float, str]:
    if span > 3 * 86400:
        return _UNITS[2]
    if span > 2 * 3600:
        return _UNITS[1]
    return _UNITS[0]


def plot_trace(trace_path: str | Path, out_png: str | Path, *, title: str | None = None,
               deployment: str | None = None, window: tuple[float, float] | None = None,
               variant: dict | str | None = None) -> Path:
    """Render the trace at ``trace_path`` as a PNG at ``out_png`` (returned); see
    ``plot_figure`` for what is drawn. Needs matplotlib (``pip install matplotlib``
    or ``pip install 'rankcore[plot]'``)."""
    fig = plot_figure(trace_path, title=title, deployment=deployment, window=window, variant=variant)
    import matplotlib.pyplot as plt  # (after plot_figure said what to install if it is missing)

    out = Path(out_png)
    try:
        fig.savefig(out, dpi=110)
    finally:
        plt.close(fig)
    return out


def plot_figure(trace_path: str | Path, *, title: str | None = None, deployment: str | None = None,
                window: tuple[float, float] | None = None, variant: dict | str | None = None) -> Any:
    """The matplotlib figure of the trace at ``trace_path`` (the caller saves and closes it).

    One group of panels per deployment (only ``deployment`` when given):
    up to ``FLEET_RANKS`` ranks, the per-replica rank chart over its
    availability panel; above it, what a planner reads (``_draw_fleet``).
    ``window`` (start, end) in virtual seconds shows only that part of the
    run; the time axis is in seconds, hours or days by the length shown.
    ``variant`` (a ``--set`` override, as a dict or its label) is named in
    the title.
    """
    try:
        import matplotlib
    except ImportError:
        raise ImportError(
            "plotting a trace needs matplotlib: pip install matplotlib (or pip install 'rankcore[plot]')"
        ) from None
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.lines import Line2D
    from matplotlib.patches import Patch

    tl = _read(trace_path)
    names = sorted(tl.deployments)
    if deployment is not None:
        if deployment not in tl.deployments:
            raise ValueError(f"{trace_path}: no deployment {deployment!r} in the trace "
                             f"(found: {', '.join(names) or 'none'})")
        names = [deployment]
    t0 = tl.t_start or 0.0
    t1 = max(tl.t_end, t0 + 1e-9)
    if window is not None:
        if not (window[0] < window[1]):
            raise ValueError(f"plot window must be (start, end) with start < end, got {window!r}")
        t0, t1 = max(t0, float(window[0])), min(t1, float(window[1]))
        if t1 <= t0:
            raise ValueError(f"plot window {window!r} lies outside the run ({tl.t_start or 0:g}..{tl.t_end:g} s)")
    span = t1 - t0

    rows = {n: tl.deployments[n].max_rank + 1 for n in names}
    fleet = any(r > FLEET_RANKS for r in rows.values())
    heights: list[float] = []
    kinds: list[tuple[str, str]] = []  # (panel, deployment)
    for n in names:
        if rows[n] > FLEET_RANKS:
            heights += [_AVAIL_HEIGHT + 0.5, _BAND_HEIGHT, _EVENTS_HEIGHT, _NONCONTIG_HEIGHT]
            kinds += [("avail", n), ("bands", n), ("events", n), ("noncontig", n)]
        else:  # a rank chart, then its availability panel
            heights += [min(max(1.4 + 0.32 * rows[n], 2.6), 9.0), _AVAIL_HEIGHT]
            kinds += [("ranks", n), ("avail", n)]
        if _queue_series(tl, n):  # the request queue (``traffic:``) under them
            heights.append(_QUEUE_HEIGHT)
            kinds.append(("queue", n))
    if not names:
        heights, kinds = [2.6, _AVAIL_HEIGHT], [("ranks", ""), ("avail", "")]
    fig_h = min(sum(heights) + 1.6 + 0.4 * fleet, 44.0)
    fig = plt.figure(figsize=(13, fig_h))
    grid = fig.add_gridspec(len(heights), 1, height_ratios=heights)
    axes: list[Any] = []
    first_time_ax = None
    for i, (kind, _n) in enumerate(kinds):
        if kind == "noncontig":
            axes.append(fig.add_subplot(grid[i]))
            continue
        ax = fig.add_subplot(grid[i], sharex=first_time_ax)
        first_time_ax = first_time_ax or ax
        axes.append(ax)
    if title is None:
        title = str(tl.header.get("scenario") or Path(trace_path).name)
    label = variant_label(variant)
    seed = tl.header.get("seed")
    fig.suptitle(title + (f" [{label}]" if label else "") + (f"  (seed {seed})" if seed is not None else ""),
                 fontsize=13, fontweight="bold")

    if not names:
        axes[0].text(0.5, 0.5, "no deployment in this trace", ha="center", va="center",
                     transform=axes[0].transAxes)
        axes[1].set_visible(False)
    node_labels: list[tuple[Any, float, str]] = []  # (axes, t, text): staggered once laid out
    for ax, (kind, n) in zip(axes, kinds):
        if not n:
            continue
        d = tl.deployments[n]
        if kind == "ranks":
            node_labels += _draw(ax, tl, d, rows[n], t0, t1, span)
        elif kind == "avail":
            _draw_availability(ax, tl, d, t0, t1)
            if rows[n] > FLEET_RANKS:
                node_labels += _node_lines(ax, tl, t0, t1, labels=True)
        elif kind == "bands":
            _draw_bands(fig, ax, tl, d, rows[n], t0, t1)
        elif kind == "events":
            _draw_events(ax, tl, d, t0, t1)
        elif kind == "queue":
            _draw_queue(ax, tl, d, t0, t1)
        else:
            _draw_noncontig(ax, tl, d)
    per, unit = _time_unit(span)
    from matplotlib.ticker import FuncFormatter, MultipleLocator

    time_axes = [ax for ax, (kind, _n) in zip(axes, kinds) if kind != "noncontig"]
    bottom = time_axes[-1]
    for ax in time_axes[:-1]:
        ax.tick_params(labelbottom=False)
    bottom.xaxis.set_major_formatter(FuncFormatter(lambda x, _pos: f"{x / per:g}"))
    if per > 1:  # ticks on whole units (every 1, 2, 3, 6, 12 ... of them)
        step = next(s for s in (1, 2, 3, 6, 12, 24, 48, 96, 1e9) if span / per / s <= 16)
        bottom.xaxis.set_major_locator(MultipleLocator(step * per))
    xlabel = f"virtual time ({ {'s': 'seconds', 'h': 'hours', 'd': 'days'}[unit] })"
    bottom.set_xlabel(xlabel)
    bottom.set_xlim(t0 - 0.01 * span, t1 + 0.01 * span)
    if fleet:  # the shared axis is labelled on every deployment's last time panel
        for ax, (kind, _n) in zip(axes, kinds):
            if kind == "events":
                ax.tick_params(labelbottom=True)
                ax.set_xlabel(xlabel)

    handles: list[Any] = []
    if any(k == "ranks" for k, _ in kinds):
        handles += [
            Patch(facecolor=_PALETTE[0], edgecolor="none", label="serving (colour = lineage)"),
            Patch(facecolor=_PALETTE[0], alpha=0.35, edgecolor="none", label="pending / starting"),
            Patch(facecolor=_PALETTE[0], alpha=0.35, hatch="///", edgecolor="white", label="stopping"),
            Line2D([], [], marker="X", color=_CRASH, linestyle="none", markersize=9, markeredgecolor="white",
                   label="crash"),
            Line2D([], [], marker="^", color=_RANK_RECONF, linestyle="none", markersize=7,
                   label="reconfigure: rank"),
            Line2D([], [], marker="D", color=_CONFIG_RECONF, linestyle="none", markersize=5,
                   label="reconfigure: user_config"),
            Line2D([], [], color="black", drawstyle="steps-post", linewidth=1.6,
                   label="world_size (right axis)"),
        ]
    else:
        handles.append(Line2D([], [], color="black", drawstyle="steps-post", linewidth=1.2, label="target"))
    handles += [
        Line2D([], [], color=_SERVING, drawstyle="steps-post", linewidth=1.4, label="serving replicas"),
        Patch(facecolor=_CRASH, alpha=0.3, edgecolor="none", label="short of target (right axis)"),
    ]
    if tl.node_lost:
        handles.append(Line2D([], [], color=_CRASH, linestyle="--", linewidth=1, label="node lost"))
    if tl.node_added:
        handles.append(Line2D([], [], color=_NODE_ADDED, linestyle=":", linewidth=1, label="node joined"))
    if tl.down:
        handles.append(Patch(facecolor="#999999", alpha=0.25, label="controller down"))
    fig.legend(handles=handles, loc="lower center", ncol=min(len(handles), 5), fontsize=8.5, frameon=False)
    legend_rows = (len(handles) + 4) // 5
    fig.tight_layout(rect=(0, 0.035 * legend_rows * 9.0 / max(fig_h, 4.0), 1, 0.97))
    _stagger(fig, node_labels)
    return fig


def _node_lines(ax: Any, tl: _Timeline, t0: float, t1: float, *, labels: bool) -> list[tuple[Any, float, str]]:
    """Node losses (dashed red) and joins (dotted green) as vertical lines; the loss
    labels to place (``_stagger``), none when there are many."""
    many = len(tl.node_lost) + len(tl.node_added) > _MANY_NODE_EVENTS
    out = []
    for t, node in tl.node_lost:
        if not t0 <= t <= t1:
            continue
        ax.axvline(t, color=_CRASH, linestyle="--", linewidth=0.7 if many else 1, alpha=0.6 if many else 1)
        if labels and not many:
            out.append((ax, t, f"{node} lost"))
    for t, _node in tl.node_added:
        if t0 < t <= t1:
            ax.axvline(t, color=_NODE_ADDED, linestyle=":", linewidth=0.7 if many else 1, alpha=0.6 if many else 1)
    return out


#: vertical step between two rows of node-loss labels (points)
_LABEL_STEP = 11.0


def _stagger(fig: Any, labels: list[tuple[Any, float, str]]) -> None:
    """Node-loss labels at the top of their panel, each in the highest row (from the top
    edge down) where it overlaps no label already placed: two losses seconds apart
    do not write over each other. Needs the final layout (call after tight_layout)."""
    if not labels:
        return
    from matplotlib.transforms import blended_transform_factory

    renderer = fig.canvas.get_renderer()
    placed: dict[int, list[Any]] = {}  # id(axes) -> bounding boxes of its labels
    for ax, t, text in sorted(labels, key=lambda x: (id(x[0]), x[1])):
        boxes = placed.setdefault(id(ax), [])
        where = blended_transform_factory(ax.transData, ax.transAxes)
        row = 0
        while True:
            ann = ax.annotate(text, xy=(t, 1.0), xycoords=where, xytext=(2, -2 - _LABEL_STEP * row),
                              textcoords="offset points", ha="left", va="top", fontsize=7.5, color=_CRASH,
                              gid="node-lost", annotation_clip=False, zorder=7,
                              bbox={"boxstyle": "square,pad=0.1", "facecolor": "white", "edgecolor": "none",
                                    "alpha": 0.8})
            box = ann.get_window_extent(renderer)
            if not any(box.overlaps(b) for b in boxes) or row > len(boxes):
                boxes.append(box)
                break
            ann.remove()
            row += 1


def _draw(ax: Any, tl: _Timeline, d: _Deployment, nrows: int, t0: float, t1: float,
          span: float) -> list[tuple[Any, float, str]]:
    """The per-replica rank chart; returns the node-loss labels to place."""
    pad = 0.45 if nrows <= 40 else nrows * 0.012  # room for the world_size line at the full target
    colours: dict[Any, str] = {}

    def colour(key: Any) -> str:
        if key not in colours:
            i = key if isinstance(key, int) else len(colours)
            colours[key] = _PALETTE[i % len(_PALETTE)]
        return colours[key]

    label_colour = {}
    for rid, key in d.keys.items():
        r, g, b = (int(colour(key)[i:i + 2], 16) / 255 for i in (1, 3, 5))
        label_colour[rid] = "#222222" if 0.299 * r + 0.587 * g + 0.114 * b > 0.62 else "white"
    groups: dict[tuple[str, str], dict[int, list]] = {}
    for rank, a, b, cls, key in d.segments:
        groups.setdefault((colour(key), cls), {}).setdefault(rank, []).append((a, max(b - a, span * 0.0015)))
    for (c, cls), by_rank in groups.items():
        for rank, spans in by_rank.items():
            if cls == "serving":
                ax.broken_barh(spans, (rank - 0.36, 0.72), facecolors=c, edgecolor="none")
            elif cls == "starting":
                ax.broken_barh(spans, (rank - 0.36, 0.72), facecolors=c, alpha=0.35, edgecolor="none")
            else:
                ax.broken_barh(spans, (rank - 0.36, 0.72), facecolors=c, alpha=0.35, hatch="///",
                               edgecolor="white", linewidth=0)
    # replica ids where they fit (about 0.75% of the width per character)
    if nrows <= 48:
        for rank, a, b, rid in d.holdings:
            if (b - a) >= span * 0.0075 * (len(rid) + 2):
                ax.text((a + b) / 2, rank, rid, ha="center", va="center", fontsize=7.5,
                        color=label_colour.get(rid, "white"), fontweight="bold", clip_on=True)
    for down_at, up_at in tl.down:
        ax.axvspan(down_at, up_at if up_at is not None else t1, color="#999999", alpha=0.25, linewidth=0)
    labels = _node_lines(ax, tl, t0, t1, labels=True)
    k = min(1.0, (40 / max(nrows, 1)) ** 0.5)  # smaller markers when rows are thin
    rank_r = [(t, r) for t, r, why, _ in d.reconfigures if why == "rank"]
    conf_r = [(t, r) for t, r, why, _ in d.reconfigures if why != "rank"]
    moves = [(t, old, r) for t, r, why, old in d.reconfigures if old is not None and old != r]
    if len(moves) <= 300:  # a thin arrow from the old rank row to the new one
        for t, old, new in moves:
            ax.annotate("", xy=(t, new), xytext=(t, old),
                        arrowprops={"arrowstyle": "-|>", "color": _RANK_RECONF, "linewidth": 0.8,
                                    "linestyle": ":", "shrinkA": 4, "shrinkB": 6, "mutation_scale": 8},
                        zorder=4)
    if rank_r:
        ax.scatter([t for t, _ in rank_r], [r for _, r in rank_r], marker="^", s=42 * k, color=_RANK_RECONF,
                   edgecolors="white", linewidths=0.6, zorder=4)
    if conf_r:
        ax.scatter([t for t, _ in conf_r], [r + 0.22 * (nrows <= 40) for _, r in conf_r], marker="D",
                   s=18 * k, color=_CONFIG_RECONF, edgecolors="white", linewidths=0.5, zorder=4)
    if d.crashes and len(d.crashes) > _MANY_CRASHES:  # a density: small, translucent
        ax.scatter([t for t, _ in d.crashes], [r for _, r in d.crashes], marker="x", s=10 * k, color=_CRASH,
                   alpha=0.45, linewidths=0.8, zorder=5)
    elif d.crashes:
        ax.scatter([t for t, _ in d.crashes], [r for _, r in d.crashes], marker="X", s=80 * k, color=_CRASH,
                   edgecolors="white", linewidths=0.7, zorder=5)
    ax.set_ylim(-0.5, nrows - 0.5 + pad)
    if nrows <= 40:
        ax.set_yticks(range(nrows))
    ax.set_ylabel("global rank")
    ax.grid(axis="x", color="#dddddd", linewidth=0.6)
    ax.set_axisbelow(True)
    ax.spines["top"].set_visible(False)
    ws = d.world
    target = ""
    if ws:
        more = "…" if len(ws) > 6 else ""
        target = f"target {ws[0][1]}" + "".join(f"→{w}" for _, w in ws[1:6]) + more
    n_rank = sum(1 for _, _, why, _ in d.reconfigures if why == "rank")
    n_conf = len(d.reconfigures) - n_rank
    ax.set_title(f"{d.name}: {target}; {len(d.crashes)} crash{'es' if len(d.crashes) != 1 else ''}, "
                 f"{n_rank} rank / {n_conf} user_config reconfigures", fontsize=10, loc="left")
    tw = ax.twinx()
    if ws:
        xs = [t for t, _ in ws] + [t1]
        ys = [w for _, w in ws] + [ws[-1][1]]
        tw.step(xs, ys, where="post", color="black", linewidth=1.6, zorder=6)
    tw.set_ylim(0, nrows + pad)  # world_size w lies on the top edge of rank row w - 1
    if nrows <= 40:
        tw.set_yticks(range(nrows + 1))
    tw.set_ylabel("world_size")
    tw.spines["top"].set_visible(False)
    return labels


def serving_curve(d: _Deployment) -> list[tuple[float, int]]:
    """(time, serving replicas from then on) for a deployment: every change point, in order."""
    deltas: dict[float, int] = {}
    for _rank, a, b, cls, _key in d.segments:
        if cls == "serving" and b > a:
            deltas[a] = deltas.get(a, 0) + 1
            deltas[b] = deltas.get(b, 0) - 1
    out: list[tuple[float, int]] = []
    n = 0
    for t in sorted(deltas):
        n += deltas[t]
        if not out or out[-1][1] != n:
            out.append((t, n))
    return out


def _merged(d: _Deployment, t0: float, t1: float) -> tuple[list[float], list[int], list[int]]:
    """Change points in [t0, t1] with serving replicas and target from each on (one merged walk)."""
    serving = serving_curve(d)
    cuts = sorted({t0, t1, *(t for t, _ in serving if t0 < t < t1), *(t for t, _ in d.world if t0 < t < t1)})
    srv: list[int] = []
    tgt: list[int] = []
    i = j = 0
    s = g = 0
    for t in cuts:
        while i < len(serving) and serving[i][0] <= t:
            s = serving[i][1]
            i += 1
        while j < len(d.world) and d.world[j][0] <= t:
            g = d.world[j][1]
            j += 1
        srv.append(s)
        tgt.append(g)
    if len(cuts) > 1:  # the step from the last change lasts to t1 (replicas still live are closed there)
        srv[-1], tgt[-1] = srv[-2], tgt[-2]
    return cuts, srv, tgt


def window_availability(d: _Deployment, t0: float, t1: float) -> tuple[float | None, float | None]:
    """(availability %, full strength %) in [t0, t1], counted as the summary counts them: from the
    first moment every target replica serves, serving replica-seconds (capped at the target) over
    target replica-seconds, and the share of that time with every target replica serving.

    (None, None) when that moment does not come in the window.
    """
    xs, srv, tgt = _merged(d, t0, t1)
    got = want = full = seen = 0.0
    started = False
    for a, b, s, g in zip(xs, xs[1:], srv, tgt):
        started = started or (g > 0 and s >= g)
        if started and g > 0:
            want += g * (b - a)
            got += min(s, g) * (b - a)
            seen += b - a
            full += (b - a) * (s >= g)
    if want <= 0:
        return None, None
    return 100.0 * got / want, 100.0 * full / seen


def _worst_per_bin(xs: list[float], ys: list[int], t0: float, t1: float,
                   bins: int = _SHORT_BINS) -> tuple[list[float], list[int]]:
    """The step function (xs, ys) as the largest value in each of ``bins`` equal slices of
    [t0, t1]: a shortfall of a minute in a week still covers one slice (about a pixel)."""
    if len(xs) <= bins:
        return xs, ys
    width = (t1 - t0) / bins
    worst = [0] * bins
    for a, b, y in zip(xs, xs[1:], ys):
        if y <= 0 or b <= a:
            continue
        lo = min(int((a - t0) / width), bins - 1)
        hi = max(lo, min(math.ceil((b - t0) / width) - 1, bins - 1))  # b itself is not in [a, b)
        for k in range(lo, hi + 1):
            if y > worst[k]:
                worst[k] = y
    return [t0 + k * width for k in range(bins)] + [t1], worst + [worst[-1]]


def _draw_availability(ax: Any, tl: _Timeline, d: _Deployment, t0: float, t1: float) -> None:
    """Serving replicas (blue step) against the target (black step), the shortfall in red."""
    xs, srv, tgt = _merged(d, t0, t1)
    ax.step(xs, tgt, where="post", color="black", linewidth=1.2, zorder=3)
    ax.step(xs, srv, where="post", color=_SERVING, linewidth=1.3, zorder=4)
    # the shortfall on its own log scale (right axis), so one missing replica of 1,000 shows as
    # plainly as a start-up or a scale-up of hundreds
    bx, short = _worst_per_bin(xs, [max(0, g - v) for v, g in zip(srv, tgt)], t0, t1)
    sx = ax.twinx()
    sx.fill_between(bx, 0, short, step="post", color=_CRASH, alpha=0.4, linewidth=0, zorder=1)
    sx.set_yscale("symlog", linthresh=1, linscale=0.6)
    sx.set_ylim(0, max(max(short, default=0), 1) * 1.6)
    sx.set_ylabel("short by (log)", fontsize=9, color=_CRASH)
    sx.tick_params(axis="y", colors=_CRASH, labelsize=8)
    sx.spines["top"].set_visible(False)
    ax.set_zorder(sx.get_zorder() + 1)  # the lines over the red fill
    ax.patch.set_visible(False)
    top = max(max(tgt, default=0), max(srv, default=0), 1)
    ax.set_ylim(0, top * 1.12)
    ax.set_ylabel("serving", fontsize=9)
    ax.grid(axis="x", color="#dddddd", linewidth=0.6)
    ax.set_axisbelow(True)
    ax.spines["top"].set_visible(False)
    for t, _node in tl.node_lost:
        if t0 <= t <= t1:
            ax.axvline(t, color=_CRASH, linestyle="--", linewidth=0.7, alpha=0.5)
    pct, full = window_availability(d, t0, t1)
    if pct is None:
        text = "never at full strength in this window"
    else:
        text = f"after start-up: availability {pct:.3f}%, full strength {full:.2f}% of the time"
    ax.set_title(f"{d.name}: serving replicas vs target; {text}", fontsize=9, loc="left")


def _queue_series(tl: _Timeline, name: str) -> list:
    """``name``'s ``[t, queued, in flight]`` samples from the run's closing record (``traffic:``)."""
    return ((tl.metrics.get(name) or {}).get("requests") or {}).get("queue_series") or []


def _draw_queue(ax: Any, tl: _Timeline, d: _Deployment, t0: float, t1: float) -> None:
    """The request queue every ``metrics_interval_s``: queued and in flight (the load an autoscaler
    reads), with the target for scale (right axis), so a burst, the wait and the scale-up line up."""
    series = [s for s in _queue_series(tl, d.name) if t0 <= s[0] <= t1]
    xs = [s[0] for s in series]
    ax.fill_between(xs, 0, [s[1] for s in series], step="post", color=_QUEUED, alpha=0.35, linewidth=0,
                    label="queued")
    ax.step(xs, [s[1] for s in series], where="post", color=_QUEUED, linewidth=1.0)
    ax.step(xs, [s[2] for s in series], where="post", color=_IN_FLIGHT, linewidth=1.1, label="in flight")
    ax.set_ylabel("requests", fontsize=9)
    ax.set_ylim(0, max([1, *(max(s[1], s[2]) for s in series)]) * 1.12)
    ax.grid(axis="x", color="#dddddd", linewidth=0.6)
    ax.spines["top"].set_visible(False)
    auto = (tl.metrics.get(d.name) or {}).get("autoscaling")
    text = ""
    if auto:
        text = (f"; autoscaler: {auto.get('scale_ups', 0)} up, {auto.get('scale_downs', 0)} down, "
                f"target {auto.get('min_target')}..{auto.get('max_target')}")
        if auto.get("to_enough_max") is not None:
            text += f", to enough replicas p50 {auto['to_enough_p50']:.1f} s, max {auto['to_enough_max']:.1f} s"
    for a, b in tl.down:  # no metrics fed then: the autoscaler pauses
        if b is not None and a <= t1 and b >= t0:
            ax.axvspan(max(a, t0), min(b, t1), color="#999999", alpha=0.25, linewidth=0)
    ax.set_title(f"{d.name}: request queue every metrics interval{text}", fontsize=9, loc="left")
    ax.legend(loc="upper right", fontsize=8, frameon=False)


# ------------------------------------------------------------------ fleet size
def _draw_bands(fig: Any, ax: Any, tl: _Timeline, d: _Deployment, nrows: int, t0: float, t1: float) -> None:
    """Ranks by band: each cell is the share of the band's rank-seconds below the target
    that did not serve (log colour, white: all served; grey: no rank of the band in
    the target), so where and when replicas were missing shows at any fleet size."""
    import numpy as np
    from matplotlib.colors import LogNorm

    size = max(1, math.ceil(nrows / _BANDS))
    bands = math.ceil(nrows / size)
    edges = np.linspace(t0, t1, _BAND_COLUMNS + 1)
    # serving seconds per band and column: sum over segments of the clipped overlap,
    # as differences of the running integral sum(clip(x - a, 0, b - a)) at the edges
    by_band: dict[int, tuple[list[float], list[float]]] = {}
    for rank, a, b, cls, _key in d.segments:
        if cls == "serving" and b > a and rank < bands * size:
            starts, ends = by_band.setdefault(rank // size, ([], []))
            starts.append(a)
            ends.append(b)
    served = np.zeros((bands, _BAND_COLUMNS))
    for band, (starts, ends) in by_band.items():
        a_ = np.asarray(starts)[:, None]
        length = np.asarray(ends)[:, None] - a_
        served[band] = np.diff(np.clip(edges[None, :] - a_, 0.0, length).sum(axis=0))
    # rank-seconds expected: ranks of the band below the target, over the target's steps
    expected = np.zeros((bands, _BAND_COLUMNS))
    lows = np.arange(bands) * size
    world = d.world + [(t1, d.world[-1][1] if d.world else 0)]
    for (a, g), (b, _g) in itertools.pairwise(world):
        if b <= a:
            continue
        inside = np.clip(g - lows, 0, size)[:, None]  # ranks of each band below the target
        expected += inside * np.diff(np.clip(edges - a, 0.0, b - a))[None, :]
    short = np.clip(expected - served, 0.0, None)
    with np.errstate(invalid="ignore", divide="ignore"):
        share = np.where(expected > 0, short / np.where(expected > 0, expected, 1.0), np.nan)
    share = np.where(share > 1e-6, share, np.where(np.isnan(share), np.nan, 0.0))
    shown = np.ma.masked_where(~(share > 0), share)
    ax.set_facecolor("#ffffff")
    grey = np.ma.masked_where(~np.isnan(share), np.ones_like(share))
    extent = (t0, t1, bands * size - 0.5, -0.5)
    ax.imshow(grey, aspect="auto", extent=extent, cmap="Greys", vmin=0, vmax=6, interpolation="nearest")
    img = ax.imshow(shown, aspect="auto", extent=extent, cmap="Reds", interpolation="nearest",
                    norm=LogNorm(vmin=1e-4, vmax=1.0))
    ax.set_ylim(-0.5, bands * size - 0.5)  # rank 0 at the bottom, as in the per-replica chart
    ax.set_ylabel(f"global rank (bands of {size})", fontsize=9)
    bar = fig.colorbar(img, cax=ax.inset_axes((1.005, 0.0, 0.01, 1.0)))  # takes no width from the panel
    bar.set_label("share not serving", fontsize=8)
    bar.ax.tick_params(labelsize=7)
    _node_lines(ax, tl, t0, t1, labels=False)
    for down_at, up_at in tl.down:
        ax.axvspan(down_at, up_at if up_at is not None else t1, color="#999999", alpha=0.25, linewidth=0)
    ax.set_title(f"{d.name}: ranks by band of {size}: share of each band's rank-time below the target not "
                 f"serving (grey: band above the target)", fontsize=9, loc="left")


def _draw_events(ax: Any, tl: _Timeline, d: _Deployment, t0: float, t1: float) -> None:
    """Crashes, rank reconfigures (one per replica whose rank changed at any level:
    a reassignment), global-rank moves and user_config reconfigures per time bucket."""
    import numpy as np

    edges = np.linspace(t0, t1, _EVENT_BUCKETS + 1)
    series = [
        ("crashes", [t for t, _ in d.crashes], _CRASH),
        ("reconfigures: rank (reassignments)", [t for t, _, why, _ in d.reconfigures if why == "rank"],
         _RANK_RECONF),
        ("global rank moves", [t for t, r, _, old in d.reconfigures if old is not None and old != r], "#e6a100"),
        ("reconfigures: user_config", [t for t, _, why, _ in d.reconfigures if why != "rank"], _CONFIG_RECONF),
    ]
    top = 1
    for name, times, colour in series:
        counts, _ = np.histogram([t for t in times if t0 <= t <= t1], bins=edges)
        top = max(top, int(counts.max(initial=0)))
        ax.stairs(counts, edges, color=colour, linewidth=1.3, label=f"{name}: {int(counts.sum()):,}")
    ax.set_yscale("symlog", linthresh=1, linscale=0.6)
    ax.set_ylim(0, top * 1.8)
    ax.set_ylabel(f"per {_duration(float(edges[1] - edges[0]))}", fontsize=9)
    ax.grid(axis="x", color="#dddddd", linewidth=0.6)
    ax.spines["top"].set_visible(False)
    ax.legend(fontsize=7.5, loc="upper left", ncol=4, frameon=False)
    _node_lines(ax, tl, t0, t1, labels=False)
    ax.set_title(f"{d.name}: crashes, reassignments and reconfigures over time", fontsize=9, loc="left")


def _draw_noncontig(ax: Any, tl: _Timeline, d: _Deployment) -> None:
    """Seconds non-contiguous per rank level over the whole run (the closing record's figures)."""
    m = tl.metrics.get(d.name) or {}
    frac, seen = m.get("noncontiguous_fraction") or {}, m.get("observed_seconds")
    levels = ("rank", "node_rank", "local_rank", "any")
    ax.set_title(f"{d.name}: non-contiguous time per level (whole run)", fontsize=9, loc="left")
    ax.spines[["top", "right"]].set_visible(False)
    if not frac or not seen:
        ax.text(0.5, 0.5, "no closing record with figures in this trace", ha="center", va="center",
                transform=ax.transAxes, fontsize=8)
        ax.set_yticks([])
        return
    secs = [(frac.get(lv) or 0.0) * seen for lv in levels]
    ax.barh(range(len(levels)), secs, color=["#4e79a7", "#f28e2b", "#59a14f", "#79706e"], height=0.6)
    ax.set_yticks(range(len(levels)), levels, fontsize=8)
    ax.invert_yaxis()
    ax.set_xlim(0, max(max(secs), 1e-9) * 1.35)
    for y, v in enumerate(secs):
        ax.text(v, y, f" {_duration(v)} ({100.0 * v / seen:.3g}% of {_duration(seen)})", va="center", fontsize=8)
    ax.set_xlabel("seconds not contiguous", fontsize=8)
    ax.tick_params(axis="x", labelsize=8)


def _duration(seconds: float) -> str:
    for per, unit in ((86400.0, "d"), (3600.0, "h"), (60.0, "min")):
        if seconds >= per:
            return f"{seconds / per:.3g} {unit}"
    return f"{seconds:.3g} s"
