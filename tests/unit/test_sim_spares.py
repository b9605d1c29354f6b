"""The simulator keeps spare processes as KeepSpareProcesses asks (rankcore.placement.spares):
a replica starting on a node with an idle spare skips the ``process`` latency;
the node refills it after a ``process`` draw; a lost node's spares go with it;
with no spare processes asked, a run is what it was before."""

from __future__ import annotations

import io
from pathlib import Path
from typing import Any

import pytest

import rankcore as rc
from executors.scenarios import ACTIONS
from executors.sim import Simulation, load_scenario, parse_scenario

ROOT = Path(__file__).resolve().parents[2]

#: place 0.1 + process 1.2 + start 0.3: a replica is ready 1.6 s after its StartReplica, 0.4 s with a spare
BASE = """
name: spares
seed: 1
cluster:
  nodes:
    - {{name: n0, gpus: {gpus}}}
    - {{name: n1, gpus: {gpus}}}
placement: pack
latency: {{place: 0.1, process: 1.2, start: 0.3, ready: 0, stop: 0}}
deployments:
  llm:
    replicas: {replicas}
    spare_processes: {spares}
  other:
    replicas: 1
    spare_processes: 1
timeline: []
"""


def _sim(spares: int = 1, replicas: int = 1, gpus: int = 2) -> tuple[Simulation, list[tuple[float, str]]]:
    """A simulation driven by hand, and the (time, replica) of every ReplicaReady it sees."""
    sim = Simulation(parse_scenario(BASE.format(spares=spares, replicas=replicas, gpus=gpus)))
    ready: list[tuple[float, str]] = []

    def watch(t: float, event: object, before: Any, result: Any) -> None:
        if isinstance(event, rc.ReplicaReady):
            ready.append((round(t, 9), event.replica_id))

    sim.driver.observers.append(watch)
    return sim, ready


def _at(sim: Simulation, t: float, key: str, args: Any) -> None:
    sim.run_until(t)
    sim.act(ACTIONS[key](**args))  # (the timeline action of that YAML key, with these fields)


def _holder(sim: Simulation, rank: int = 0) -> str:
    rid = sim.backend.holder("llm", rank)
    assert rid is not None
    return rid


def _metrics(sim: Simulation, name: str = "llm") -> tuple[int, int]:
    m = sim.metrics.deployments[name]
    return m.spare_hits, m.process_starts


@pytest.mark.parametrize("spares, replacement_ready", [(1, 10.4), (0, 11.6)])
def test_a_replacement_on_a_node_with_an_idle_spare_is_ready_process_seconds_sooner(spares, replacement_ready):
    sim, ready = _sim(spares)
    _at(sim, 0.0, "deploy", {"deployment": "llm"})
    sim.run_until(5.0)
    # the first replica waited for its process (the node's spare was itself starting until 1.2)
    assert ready == [(1.6, "llm#0")]
    assert (sim.backend.nodes["n0"].spares is not None and sim.backend.nodes["n0"].spares.idle) == spares
    _at(sim, 10.0, "crash", {"replica": "llm#0"})
    sim.run_until(20.0)
    assert ready[1:] == [(replacement_ready, "llm#1")]
    assert _metrics(sim) == ((1, 1) if spares else (0, 2))


def test_the_refill_takes_a_process_start_so_a_second_crash_right_after_pays_it():
    sim, ready = _sim(spares=1)
    _at(sim, 0.0, "deploy", {"deployment": "llm"})
    _at(sim, 10.0, "crash", {"replica": "llm#0"})  # llm#1 takes the spare at 10.1; the refill is idle at 11.3
    _at(sim, 10.5, "crash", {"replica": _holder(sim)})  # llm#2 placed at 10.6: nothing idle yet
    sp = sim.backend.nodes["n0"].spares
    assert sp is not None and (sp.idle, sp.coming) == (0, 1)
    _at(sim, 20.0, "crash", {"replica": _holder(sim)})  # refilled by now: llm#3 takes it
    sim.run_until(30.0)
    assert ready == [(1.6, "llm#0"), (10.4, "llm#1"), (12.1, "llm#2"), (20.4, "llm#3")]
    assert _metrics(sim) == (2, 2)
    assert (sp.idle, sp.coming) == (1, 0)  # refilled after llm#3 took one, and no more


def _run(path: Path, **overrides: Any) -> tuple[str, dict]:
    out = io.StringIO()
    res = Simulation(load_scenario(path, overrides=overrides), trace=out).run()
    return out.getvalue(), res.metrics


def test_without_spare_processes_a_run_is_unchanged():
    """crash-storm has random latencies and random crashes: a ``process`` of 0, or
    ``spare_processes: 0``, changes no draw, no time and no figure."""
    path = ROOT / "examples" / "scenarios" / "crash-storm.yaml"
    trace, metrics = _run(path)
    assert "KeepSpareProcesses" not in trace
    for overrides in ({"latency.process": 0}, {"deployments.llm.spare_processes": 0},
                      {"deployments.llm.latency.process": {"dist": "constant", "value": 0}}):
        assert _run(path, **overrides) == (trace, metrics), overrides
    m = metrics["deployments"]["llm"]
    assert m["spare_hits"] == 0 and m["process_starts"] > 16  # every replica's process, none spared
    # a process latency that is not 0 is paid by every start (and moves the ready times)
    slow_trace, slow = _run(path, **{"latency.process": 1})
    assert slow_trace != trace
    assert slow["deployments"]["llm"]["spare_hits"] == 0
    assert slow["deployments"]["llm"]["crash_to_ready_p50"] > m["crash_to_ready_p50"]


def test_a_lost_nodes_spares_go_with_it_and_its_refill_does_not_reach_the_node_back():
    sim, ready = _sim(spares=1, gpus=1)
    _at(sim, 0.0, "deploy", {"deployment": "llm"})
    sim.run_until(5.0)
    old = sim.backend.nodes["n0"]
    assert old.spares is not None and old.spares.idle == 1
    _at(sim, 5.0, "crash", {"replica": "llm#0"})  # llm#1 takes n0's spare at 5.1; its refill is due at 6.3
    _at(sim, 5.5, "lose_node", {"node": "n0"})  # llm#2 replaces llm#1 on n1, told 1 now: nothing idle there
    assert "n0" not in sim.backend.nodes
    _at(sim, 5.6, "add_node", {"node": "n0", "gpus": 1})
    assert sim.backend.nodes["n0"] is not old and sim.backend.nodes["n0"].spares is None
    sim.backend.execute([rc.KeepSpareProcesses(deployment="other", node_id="n0", count=1)], 5.6)  # idle at 6.8
    sim.run_until(6.5)  # the lost node's refill (6.3) is void: it reached neither node
    new = sim.backend.nodes["n0"].spares
    assert new is not None and (new.idle, new.coming) == (0, 1)
    sim.run_until(7.0)
    assert (new.idle, new.coming) == (1, 0)
    sim.run_until(8.0)
    assert ready[-1] == (7.1, "llm#2")  # placed on n1 at 5.6, paid the process start
    assert _metrics(sim) == (1, 2)


def test_keep_spare_processes_lowering_the_count_drops_idle_ones():
    """The node keeps the largest count any deployment asks: lowering one that
    is not the largest drops nothing; lowering the largest drops idle ones above
    the new largest; 0 everywhere drops them all, and a start pays again."""
    sim, ready = _sim(spares=3)
    _at(sim, 0.0, "deploy", {"deployment": "llm"})
    _at(sim, 0.0, "deploy", {"deployment": "other"})  # on n0 too (pack): asks 1
    sim.run_until(5.0)
    sp = sim.backend.nodes["n0"].spares
    assert sp is not None and (sp.target, sp.idle) == (3, 3)
    spec = sim.scenario.deployments["llm"]
    for count, idle in ((2, 2), (1, 1), (0, 1)):  # "other" still asks 1
        sim.apply(spec.applied(options=(("spare_processes", count),)))
        assert (sp.target, sp.idle, sp.coming) == (idle, idle, 0), count
    sim.apply(sim.scenario.deployments["other"].applied(options=(("spare_processes", 0),)))
    assert (sp.target, sp.idle, sp.coming) == (0, 0, 0)
    _at(sim, 10.0, "crash", {"replica": "llm#0"})
    sim.run_until(20.0)
    assert ready[-1] == (11.6, "llm#2")  # no spare left: it paid the process start
    assert (sp.idle, sp.coming) == (0, 0)  # nor was one refilled


def test_raising_the_count_starts_processes_to_reach_it_and_a_lower_count_drops_late_ones():
    sim, _ = _sim(spares=1)
    _at(sim, 0.0, "deploy", {"deployment": "llm"})
    sim.run_until(5.0)
    sp = sim.backend.nodes["n0"].spares
    assert sp is not None and (sp.idle, sp.coming) == (1, 0)
    spec = sim.scenario.deployments["llm"]
    sim.apply(spec.applied(options=(("spare_processes", 3),)))
    assert (sp.target, sp.idle, sp.coming) == (3, 1, 2)
    sim.apply(spec.applied(options=(("spare_processes", 2),)))  # before they are up: one of them is dropped
    sim.run_until(7.0)
    assert (sp.target, sp.idle, sp.coming) == (2, 2, 0)


def test_check_trace_passes_on_a_run_with_spare_processes_and_reads_the_command(tmp_path):
    from executors.checktrace import TraceFormatError, check_trace_file

    path = tmp_path / "spares.jsonl"
    with open(path, "w") as fp:
        Simulation(load_scenario(ROOT / "examples" / "scenarios" / "spare-processes.yaml"), trace=fp).run()
    text = path.read_text()
    assert '"type":"KeepSpareProcesses"' in text
    report = check_trace_file(path)
    assert report.ok, report
    bad = tmp_path / "bad.jsonl"
    bad.write_text(text.replace('"node_id":"node-0","count":1', '"node_id":"node-0","count":"one"', 1))
    with pytest.raises(TraceFormatError, match="KeepSpareProcesses command's fields"):
        check_trace_file(bad)


def test_process_draws_do_not_move_the_other_latencies():
    """Common random numbers: the ``process`` draws (replicas' and refills') come
    from a stream of their own, so the start draws are the latency stream's
    whatever the spares do, and variants with and without spares compare."""
    import random

    text = BASE.format(spares=1, replicas=1, gpus=2).replace(
        "process: 1.2, start: 0.3", "process: {dist: uniform, low: 1, high: 2}, start: {dist: uniform, low: 2, high: 4}")
    sim = Simulation(parse_scenario(text))
    ready: dict[str, float] = {}
    sim.driver.observers.append(
        lambda t, e, b, r: ready.setdefault(e.replica_id, t) if isinstance(e, rc.ReplicaReady) else None)
    _at(sim, 0.0, "deploy", {"deployment": "llm"})
    _at(sim, 10.0, "crash", {"replica": "llm#0"})
    sim.run_until(20.0)
    latency = random.Random(f"{sim.seed}/latency")  # the simulator's latency stream (place, start, ...)
    first, second = latency.uniform(2, 4), latency.uniform(2, 4)
    assert 0.1 + 1 + first <= ready["llm#0"] <= 0.1 + 2 + first  # it paid a process draw
    assert ready["llm#1"] == pytest.approx(10.1 + second, abs=1e-9)  # it took the spare
    assert _metrics(sim) == (1, 1)
