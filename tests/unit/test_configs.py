"""A new ``user_config`` reaches the replicas ``max_unavailable`` at a time (issue 64, defect 7):
``rankcore.control.configs``."""

from __future__ import annotations

import rankcore as rc
from rankcore.control.configs import config_applied
from tests.helpers import Driver


def _reconfigures(cmds: list) -> list[rc.ReconfigureReplica]:
    return [c for c in cmds if isinstance(c, rc.ReconfigureReplica)]


def _deploy(d: Driver, n: int, config: dict, **kw) -> list:
    return d.run(rc.DeploymentApplied(name="app", num_replicas=n, user_config=config, has_reconfigure=True, **kw),
                 hold=lambda c: isinstance(c, rc.ReconfigureReplica) and c.user_config == {"model": "v2"})


def test_a_new_user_config_is_told_max_unavailable_replicas_at_a_time_lowest_rank_first():
    """10 replicas, Ray Serve's 20%: two reconfigure at once; each answer lets the next one go, until
    all ten run the new config, each told once. (Every replica was told in one step before.)"""
    d = Driver(nodes=["n0", "n1"])
    _deploy(d, 10, {"model": "v1"})
    assert config_applied(d.dep())
    first = _reconfigures(_deploy(d, 10, {"model": "v2"}))
    by_rank = d.by_rank()
    assert [c.replica_id for c in first] == [by_rank[0], by_rank[1]]
    assert d.dep().count(rc.Phase.RECONFIGURING) == 2 and not config_applied(d.dep())
    told = [c.replica_id for c in first]
    while d.held:
        cmd = d.held.pop(0)
        nxt = _reconfigures([c for ev in d.answer(cmd) for c in d.run(
            ev, hold=lambda c: isinstance(c, rc.ReconfigureReplica))])
        d.held.extend(nxt)
        told += [c.replica_id for c in nxt]
        assert d.dep().count(rc.Phase.RECONFIGURING) <= 2
    assert told == [by_rank[r] for r in range(10)]  # each once, in rank order
    assert config_applied(d.dep())
    assert all(r.config_version == d.dep().config_version for r in d.dep().replicas.values())


def test_max_unavailable_as_a_count_paces_the_config_too():
    d = Driver(nodes=["n0"])
    _deploy(d, 6, {"model": "v1"}, max_unavailable=3)
    assert len(_reconfigures(_deploy(d, 6, {"model": "v2"}, max_unavailable=3))) == 3


def test_a_replica_that_crashes_behind_the_config_is_replaced_on_the_new_one():
    """A replica waiting for its turn that dies is replaced, and its replacement is initialized with
    the new config (``InitializeReplica`` carries it): nothing is left behind."""
    d = Driver(nodes=["n0"])
    _deploy(d, 5, {"model": "v1"})
    _deploy(d, 5, {"model": "v2"})
    waiting = d.by_rank()[4]
    out = d.run(rc.ReplicaCrashed(replica_id=waiting), hold=lambda c: isinstance(c, rc.ReconfigureReplica))
    (init,) = [c for c in out if isinstance(c, rc.InitializeReplica)]
    assert init.user_config == {"model": "v2"} and init.rank.rank == 4
    d.release()
    while d.held:
        d.release()
    assert config_applied(d.dep())


def test_a_crash_of_the_replica_reconfiguring_lets_the_next_one_go():
    """One reconfigures at a time (3 replicas); it crashes: its replacement starts on the new config,
    and the replicas still waiting are told in turn (no step with no pass leaves them waiting for good:
    the fast paths decline while a config is on its way, ``configs.settled``)."""
    d = Driver(nodes=["n0"])
    _deploy(d, 3, {"model": "v1"})
    (first,) = _reconfigures(_deploy(d, 3, {"model": "v2"}))
    d.held.clear()
    out = d.run(rc.ReplicaCrashed(replica_id=first.replica_id), hold=lambda c: isinstance(c, rc.ReconfigureReplica))
    told = [c.replica_id for c in _reconfigures(out)]
    assert told == [d.by_rank()[1]], out
    while d.held:
        d.release()
    assert config_applied(d.dep()) and d.dep().healthy
