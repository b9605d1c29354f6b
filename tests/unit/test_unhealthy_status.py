"""Ray Serve's UNHEALTHY after a serving replica dies, on the bare core (issue 64,
``rankcore.base.unhealthy``): which deaths mark the deployment (a crash, a lost node, health
checks at the threshold), what the status message says, and when the mark goes (healthy again, a
new deploy). On Ray: tests/integration/test_ray_replica_details.py; Serve's own cases:
tests/serve_parity/test_serve_deployment_state.py (``test_health_check`` ...)."""

from __future__ import annotations

from typing import Any

import pytest

import rankcore as rc
from tests.helpers import Driver

#: Ray Serve's words (its DeploymentStatusInfo message after HEALTH_CHECK_FAILED)
UNTIL = "This deployment will be UNHEALTHY until the replica recovers or a new deploy happens."
HELD = (rc.PlaceReplica, rc.StartReplica, rc.ReconfigureReplica)


def message(d: Driver) -> str | None:
    dep = d.dep()
    return dep.status_message if dep.status == "UNHEALTHY" else None


def deployed(n: int = 2, **kw: Any) -> Driver:
    d = Driver(("n0", "n1"))
    d.run(rc.DeploymentApplied(name="app", num_replicas=n, user_config={"v": 1}, has_reconfigure=True, **kw))
    assert d.dep().healthy and message(d) is None
    return d


def test_a_serving_replicas_death_marks_its_deployment_until_it_is_healthy_again() -> None:
    d = deployed()
    victim = d.by_rank()[1]
    d.run(rc.ReplicaCrashed(replica_id=victim, reason="actor died (exited)", cause="exited"),
          hold=lambda c: isinstance(c, (rc.PlaceReplica, rc.StartReplica)))
    assert message(d) == f"replica {victim} died: actor died (exited). {UNTIL}"
    d.release()
    assert d.dep().healthy and message(d) is None and d.dep().status == "HEALTHY"


def test_a_crash_the_fast_path_takes_marks_it_too() -> None:
    """(A crash whose booking passes to its replacement on the same node is the core's fast path,
    ``fastpaths.crashed``: it marks the same, and the replacement's ready clears it.)"""
    d = deployed()
    victim = d.by_rank()[0]
    d.run(rc.ReplicaCrashed(replica_id=victim, reason="boom", cause="error"), hold=lambda c: isinstance(c, HELD))
    assert message(d) == f"replica {victim} died: boom. {UNTIL}"
    d.release()
    assert d.dep().status == "HEALTHY"


def test_a_lost_node_names_each_serving_replica_it_held() -> None:
    d = deployed(4)
    on_n1 = [rid for _, rid in sorted(d.by_rank().items()) if d.dep().replicas[rid].node_id == "n1"]
    assert len(on_n1) >= 2
    d.node_for = lambda cmd: "n0"
    d.run(rc.NodeLost(node_id="n1"), hold=lambda c: isinstance(c, (rc.PlaceReplica, rc.StartReplica)))
    assert message(d) == "; ".join(f"replica {rid} died: its node n1 was lost" for rid in on_n1) + f". {UNTIL}"


def test_health_checks_mark_it_at_the_threshold_not_before() -> None:
    d = deployed(health_check_failure_threshold=2)
    rid = d.by_rank()[0]
    d.run(rc.HealthChecked(replica_id=rid, healthy=False, detail="timed out"))
    assert message(d) is None  # (one failure: the core counts)
    d.run(rc.HealthChecked(replica_id=rid, healthy=False, detail="timed out"),
          hold=lambda c: isinstance(c, (rc.PlaceReplica, rc.StartReplica, rc.StopReplica)))
    assert message(d) == f"replica {rid} failed its health check: timed out. {UNTIL}"


def test_more_deaths_than_shown_are_counted() -> None:
    d = deployed(5)
    dead = [d.by_rank()[r] for r in range(5)]
    for rid in dead:
        d.run(rc.ReplicaCrashed(replica_id=rid, reason="gone", cause="exited"), hold=lambda c: isinstance(c, HELD))
    assert message(d) == ("; ".join(f"replica {rid} died: gone" for rid in dead[-3:]) +
                          f" (and 2 more before). {UNTIL}")


@pytest.mark.parametrize("change", [{"user_config": {"v": 2}}, {"version": "2"}])
def test_a_new_deploy_clears_it(change: dict) -> None:
    d = deployed()
    d.run(rc.ReplicaCrashed(replica_id=d.by_rank()[0], reason="gone", cause="exited"),
          hold=lambda c: isinstance(c, HELD))
    assert message(d) is not None
    d.run(rc.DeploymentApplied(name="app", num_replicas=2, **{"user_config": {"v": 1}, **change}, has_reconfigure=True),
          hold=lambda c: isinstance(c, HELD))
    assert message(d) is None and d.dep().status == "UPDATING"  # (Serve: a new deploy makes it UPDATING)


def test_the_same_deploy_again_keeps_it() -> None:
    d = deployed()
    d.run(rc.ReplicaCrashed(replica_id=d.by_rank()[0], reason="gone", cause="exited"),
          hold=lambda c: isinstance(c, HELD))
    d.run(rc.DeploymentApplied(name="app", num_replicas=2, user_config={"v": 1}, has_reconfigure=True),
          hold=lambda c: isinstance(c, HELD))
    assert message(d) is not None


def test_a_death_while_it_updates_leaves_the_counts_status() -> None:
    d = deployed()
    d.run(rc.DeploymentApplied(name="app", num_replicas=2, user_config={"v": 2}, has_reconfigure=True),
          hold=lambda c: isinstance(c, HELD))
    running = next(rid for rid, rep in d.dep().replicas.items() if rep.phase is rc.Phase.RECONFIGURING)
    d.run(rc.ReplicaCrashed(replica_id=running, reason="gone", cause="exited"), hold=lambda c: isinstance(c, HELD))
    assert message(d) is None and d.dep().status == "UPDATING"


def test_a_starting_replicas_crash_is_a_failed_start_not_this() -> None:
    d = Driver(("n0",))
    d.run(rc.DeploymentApplied(name="app", num_replicas=1), hold=lambda c: isinstance(c, rc.StartReplica))
    d.release()
    assert d.dep().status == "HEALTHY"
    d.run(rc.DeploymentApplied(name="app", num_replicas=2), hold=lambda c: isinstance(c, HELD))
    starting = next(rid for rid, rep in d.dep().replicas.items() if rep.phase is not rc.Phase.RUNNING)
    d.run(rc.ReplicaCrashed(replica_id=starting, reason="init raised", cause="error"),
          hold=lambda c: isinstance(c, HELD))
    assert message(d) is None and d.dep().status == "UPDATING"
