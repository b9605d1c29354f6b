"""A replica's multiplexed models in the core's state (rankcore/control/models.py, issue 39): kept on its
record from its ``ModelsReported``, told to the request path (``ReplicaModels`` in ``Step.pool``) when they
change, when it joins the pool holding some, and after a recovery, which reads them back from the reports;
the request machine routes by what it is told."""

from __future__ import annotations

import pytest

import rankcore as rc
from rankcore.requests import Configure, Dispatch, RequestMachine, Submit

from .test_pool import Run


def _models(step: rc.Step) -> list[tuple]:
    return [(c.replica_id, c.model_ids) for c in step.pool if isinstance(c, rc.ReplicaModels)]


def test_a_report_is_kept_on_the_record_and_told_to_the_request_path_once():
    run = Run()
    a, _b = run.up()
    step = run(rc.ModelsReported(replica_id=a, model_ids=("m1", "m2")))
    assert not step.stale and not step.commands
    assert run.state.replica(a).models == ("m1", "m2")
    assert _models(step) == [(a, ("m1", "m2"))] and run.view.models[a] == ("m1", "m2")
    again = run(rc.ModelsReported(replica_id=a, model_ids=["m1", "m2"]))
    assert again.stale and again.pool == ()
    emptied = run(rc.ModelsReported(replica_id=a, model_ids=()))
    assert _models(emptied) == [(a, ())] and run.state.replica(a).models == ()


def test_news_of_a_replica_that_left_or_is_stopping_is_stale():
    run = Run()
    a, _b = run.up()
    with pytest.raises(rc.InvalidEvent, match="the core never started it"):  # (as every replica's news)
        run(rc.ModelsReported(replica_id="llm#99", model_ids=("m",)))
    run(rc.ReplicaCrashed(replica_id=a))
    assert run(rc.ModelsReported(replica_id=a, model_ids=("m",))).stale  # an older incarnation
    run(rc.ScaleRequested(deployment="llm", num_replicas=0))  # every replica drains
    stopping = next(r.replica_id for r in run.state.replicas() if r.phase is rc.Phase.STOPPING)
    step = run(rc.ModelsReported(replica_id=stopping, model_ids=("m",)))
    assert step.stale and run.state.replica(stopping).models == ()


def test_a_replica_that_reported_before_it_served_is_told_when_it_joins():
    run = Run()
    first = run(rc.DeploymentApplied(name="llm", num_replicas=1))
    rid = next(c.replica_id for c in first.commands if isinstance(c, rc.StartReplica))
    run(rc.ReplicaPlaced(replica_id=rid, node_id="a"))
    early = run(rc.ModelsReported(replica_id=rid, model_ids=("m1",)))
    assert _models(early) == [] and run.state.replica(rid).models == ("m1",)  # not in a pool yet
    ready = run(rc.ReplicaReady(replica_id=rid))
    assert [type(c).__name__ for c in ready.pool] == ["PoolChanged", "ReplicaModels"]
    assert _models(ready) == [(rid, ("m1",))]


def test_a_recovery_reads_the_models_back_and_tells_them_after_each_pool():
    run = Run()
    a, b = run.up()
    run(rc.ModelsReported(replica_id=b, model_ids=("m7",)))
    reports = rc.invariants.reports_from(run.state)
    assert {r.replica_id: r.models for r in reports.reports} == {a: (), b: ("m7",)}
    fresh = Run()
    result = fresh(reports)
    assert fresh.state.replica(b).models == ("m7",)
    assert [type(c).__name__ for c in result.pool] == ["PoolReset", "ReplicaModels"]
    assert _models(result) == [(b, ("m7",))]


def test_the_request_machine_routes_by_what_the_core_told_it():
    run = Run()
    a, b = run.up()
    machine = RequestMachine()
    machine.handle(Configure(deployment="llm"))
    machine.handle(rc.PoolReset(deployment="llm", serving=(a, b), draining=(), coming=True))
    for c in run(rc.ModelsReported(replica_id=b, model_ids=("lora",))).pool:
        machine.handle(c)
    (d,) = machine.handle(Submit(request_id="q", deployment="llm", model_id="lora"))
    assert isinstance(d, Dispatch) and d.replica_id == b


def test_bad_reports_are_refused_by_name():
    with pytest.raises(rc.InvalidConfig, match="model_ids's items must be a non-empty string"):
        rc.ModelsReported(replica_id="llm#0", model_ids=("",))
    with pytest.raises(rc.InvalidConfig, match="names a model twice"):
        rc.ModelsReported(replica_id="llm#0", model_ids=("a", "a"))
    with pytest.raises(rc.InvalidConfig, match=r"ReplicaReport\.models"):
        rc.ReplicaReport(replica_id="llm#0", deployment="llm", rank=0, node_id="a", models="abc")
