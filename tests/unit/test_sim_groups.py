"""Collective groups in the simulator (issue 67): the group figures, and the what-if the scenario
examples/scenarios/dp-groups.yaml asks (restart_replica re-forms in place, restart_gang restarts
every member)."""

from __future__ import annotations

import pathlib

import pytest

import rankcore as rc
from executors.scenarios.metrics import Metrics
from executors.sim import Simulation, load_scenario

ROOT = pathlib.Path(__file__).resolve().parents[2]
SCENARIO = ROOT / "examples" / "scenarios" / "dp-groups.yaml"


def run(**overrides: object) -> dict:
    res = Simulation(load_scenario(SCENARIO, overrides={"duration": 21600, **overrides})).run()
    return res.metrics["deployments"]["dp"]


def test_restart_replica_re_forms_the_survivors_in_place_and_restart_gang_restarts_them():
    mine = run()
    whole = run(**{"deployments.dp.gang.failure": "restart_gang"})
    assert mine["crashes"] and whole["crashes"]
    # the first epoch: 8 join; after each crash the replacement joins and the 7 survivors re-form in place
    assert mine["group_joined"] == 8 + mine["group_reforms"] - 1
    assert mine["group_in_place"] == 7 * (mine["group_reforms"] - 1)
    # restart_gang: nobody re-forms in place, every epoch is 8 new members
    assert whole["group_in_place"] == 0 and whole["group_joined"] == 8 * whole["group_reforms"]
    # waiting for the slowest of 8 starts is longer than for one
    assert whole["group_outage_p50"] > mine["group_outage_p50"]
    assert whole["availability_pct"] < mine["availability_pct"]


def test_a_group_is_down_for_the_re_form_cost_after_each_epoch():
    slow = run(**{"latency.reform": 30})
    fast = run(**{"latency.reform": 0})
    assert slow["group_reforms"] == fast["group_reforms"]  # (same seed, same crashes)
    assert slow["group_availability_pct"] < fast["group_availability_pct"]
    assert slow["group_outage_p50"] == pytest.approx(fast["group_outage_p50"] + 30)


def test_no_group_figures_without_the_option():
    plain = run(**{"deployments.dp.collective_group": False})
    assert "group_reforms" not in plain


def test_the_figures_count_up_time_from_the_re_form_and_an_outage_to_the_next_epoch():
    """Drive the observer by hand: formed at 10 (up at 12), a member lost at 20, the next epoch at 50."""
    m = Metrics(reform_s=lambda d: 2.0)
    state = rc.State()
    for e in (rc.NodeJoined(node_id="n0", resources={"GPU": 2}),
              rc.DeploymentApplied(name="dp", num_replicas=2, resources={"GPU": 1}, collective_group=True)):
        state = rc.step(state, e).state
    t = 0.0

    def feed(event: object, at: float) -> rc.Step:
        nonlocal state
        result = rc.step(state, event)
        m(at, event, state, result)
        state = result.state
        return result

    feed(rc.ReplicaPlaced(replica_id="dp#0", node_id="n0"), t)
    feed(rc.ReplicaPlaced(replica_id="dp#1", node_id="n0"), t)
    feed(rc.ReplicaReady(replica_id="dp#0"), 5.0)
    feed(rc.ReplicaReady(replica_id="dp#1"), 10.0)  # epoch 1 formed: up from 12
    step = feed(rc.ReplicaCrashed(replica_id="dp#1", reason="boom"), 20.0)  # down from 20
    (place,) = [c for c in step.commands if isinstance(c, rc.PlaceReplica)]
    feed(rc.ReplicaPlaced(replica_id=place.replica_id, node_id="n0"), 21.0)
    feed(rc.ReplicaReady(replica_id=place.replica_id), 50.0)  # epoch 2: up from 52
    m.advance(60.0)
    g = m.deployments["dp"].as_dict()
    assert g["group_reforms"] == 2 and g["group_in_place"] == 1 and g["group_joined"] == 3
    assert g["group_outages"] == 1 and g["group_outage_p50"] == pytest.approx(52.0 - 20.0)
    # up 12..20 and 52..60 of 10..60
    assert g["group_availability_pct"] == pytest.approx(100 * 16 / 50)
