"""The plot's figure (``plot_figure``): the planner's panels at fleet size, the
per-replica chart for small scenarios, the variant in the title, node-loss labels
that never overlap, and the reader's skipped snapshots changing nothing."""

from __future__ import annotations

import itertools
from pathlib import Path

import pytest

pytest.importorskip("matplotlib")

from executors.sim import Simulation, load_scenario
from executors.sim.plot import FLEET_RANKS, _read, plot_figure

EXAMPLES = Path("examples/scenarios")

FLEET = """
name: fleet
seed: 3
duration: 1800
cluster: {nodes: 12, gpus_per_node: 8}
latency: {place: 0.1, start: 5, reconfigure: 0.5, stop: 1}
faults: {crash_rate_per_replica_hour: 0.2}
deployments:
  llm: {replicas: 90, user_config: {v: 1}, reconfigure: with_rank}
timeline:
  - deploy: llm
  - wait_until_healthy: {deployment: llm, timeout: 300}
  - at: 600
    scale: {deployment: llm, replicas: 70}
  - at: 900
    lose_node: node-3
"""

TWO_LOSSES = """
name: two losses
seed: 1
cluster:
  nodes:
    - {name: node, count: 4, gpus: 4}
latency: {place: 0.1, start: 5}
deployments:
  llm: {replicas: 8, user_config: {}}
timeline:
  - deploy: llm
  - wait_until_healthy: {deployment: llm, timeout: 60}
  - at: 60
    lose_node: node-1
  - at: 61.5
    lose_node: node-2
duration: 90
"""


def _trace(tmp_path: Path, text: str, name: str = "s", overrides: dict | None = None) -> Path:
    scenario = tmp_path / f"{name}.yaml"
    scenario.write_text(text)
    out = tmp_path / f"{name}.jsonl"
    with open(out, "w") as fp:
        Simulation(load_scenario(scenario, overrides=overrides or {}), trace=fp).run()
    return out


def _titles(fig) -> list[str]:
    return [ax.get_title(loc="left") for ax in fig.axes]


def test_fleet_size_draws_the_planner_panels_not_a_row_per_replica(tmp_path):
    fig = plot_figure(_trace(tmp_path, FLEET))
    titles = _titles(fig)
    assert FLEET_RANKS < 90
    assert any(t.startswith("llm: serving replicas vs target") for t in titles)
    assert any(t.startswith("llm: ranks by band of") for t in titles)
    assert any(t.startswith("llm: crashes, reassignments and reconfigures over time") for t in titles)
    assert any(t.startswith("llm: non-contiguous time per level") for t in titles)
    assert not any(ax.get_ylabel() == "global rank" for ax in fig.axes)  # no per-replica chart
    (bars,) = [ax for ax in fig.axes if ax.get_title(loc="left").startswith("llm: non-contiguous")]
    assert [t.get_text() for t in bars.get_yticklabels()] == ["rank", "node_rank", "local_rank", "any"]
    (events,) = [ax for ax in fig.axes if "over time" in ax.get_title(loc="left")]
    labels = [t.get_text() for t in events.get_legend().get_texts()]
    assert any(x.startswith("crashes: ") and x != "crashes: 0" for x in labels)
    assert any(x.startswith("reconfigures: rank (reassignments): ") for x in labels)


def test_small_scenario_keeps_the_per_replica_chart(tmp_path):
    fig = plot_figure(_trace(tmp_path, (EXAMPLES / "node-loss-3-nodes.yaml").read_text()))
    assert sum(ax.get_ylabel() == "global rank" for ax in fig.axes) == 1
    assert not any("ranks by band" in t or "non-contiguous" in t for t in _titles(fig))


def test_a_variant_is_named_in_the_title(tmp_path):
    trace = _trace(tmp_path, (EXAMPLES / "node-loss-3-nodes.yaml").read_text(), overrides={"latency.place": 0.2})
    fig = plot_figure(trace, title="node loss", variant={"cluster.nodes": 9, "latency.start": 5})
    assert fig._suptitle.get_text().startswith("node loss [cluster.nodes=9, latency.start=5]")
    assert "[" not in plot_figure(trace, title="node loss")._suptitle.get_text()


def test_node_loss_labels_seconds_apart_do_not_overlap(tmp_path):
    fig = plot_figure(_trace(tmp_path, TWO_LOSSES))
    renderer = fig.canvas.get_renderer()
    labels = [t for ax in fig.axes for t in ax.texts if t.get_gid() == "node-lost"]
    assert sorted(t.get_text() for t in labels) == ["node-1 lost", "node-2 lost"]
    boxes = [t.get_window_extent(renderer) for t in labels]
    for a, b in itertools.combinations(boxes, 2):
        assert not a.overlaps(b)


def test_skipping_redundant_snapshots_changes_nothing(tmp_path):
    for name in ("node-loss-3-nodes.yaml", "controller-crash-orphan-unresponsive.yaml", "gangs.yaml"):
        trace = _trace(tmp_path, (EXAMPLES / name).read_text(), name=name[:-5])
        fast, full = _read(trace), _read(trace, every_snapshot=True)
        assert fast.deployments.keys() == full.deployments.keys(), name
        for dep in full.deployments:
            a, b = fast.deployments[dep], full.deployments[dep]
            assert (sorted(a.segments), sorted(a.holdings), a.crashes, a.reconfigures, a.world) == (
                sorted(b.segments), sorted(b.holdings), b.crashes, b.reconfigures, b.world), (name, dep)
