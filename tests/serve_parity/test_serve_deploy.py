"""Ray Serve's deploy tests (redeploys, versions, user_config), re-expressed against rankcore's core.

Source: ray-project/ray, python/ray/serve/tests/test_deploy.py at
0141ec857a0eb0df5f1b41348a644466b4fe9556: the version the search index holds with the rollout cases
(Ray 1.x: ``@serve.deployment``, ``.deploy()``, ``.options(version=...)``; the index holds no newer
one, and test_deploy_2.py's cases are not about rollouts). Serve runs each case on a cluster and
tells replicas apart by the pid a call returns: here a replica is its id, and what a call would
return is what the core told that replica (its code ``version``, its ``user_config``). Serve's
``deploy()`` blocks until the deployment reaches its goal: here the test answers every command
until the core asks nothing more (``settle``). Whether the call goes through a handle or over HTTP
(``use_handle``) is not the core's: both parameter sets run the same check. Every case of that file
is here under its own name and parameters, written anew from what it checks (not copied), with the
core driven as in test_serve_deployment_state.py (its ``Controller``); the tally is in
docs/testing.md, "Ray Serve's own tests (tests/serve_parity/)".

Serve 1.x started a new replica once the old one had stopped (``test_redeploy_single_replica``),
which is rankcore's default (``max_surge`` 0: docs/rollouts.md, "The rule"), so no surge here.
"""

from __future__ import annotations

from typing import Any

import pytest

import rankcore as rc
from tests.serve_parity.test_serve_deployment_state import (
    DEP,
    RUNNING,
    STARTING,
    STOPPING,
    UPDATING,
    Controller,
    check_counts,
)

ORIGIN = "python/ray/serve/tests/test_deploy.py @ 0141ec857a0eb0df5f1b41348a644466b4fe9556"

R_NO_VERSION = (
    "no version: Serve gives every deploy a new random version, so each one replaces every replica; rankcore's "
    "core has nothing to compare and replaces nothing (docs/rollouts.md, 'Options': version None), and on Ray "
    "compares the fingerprint of the code instead (docs/rollouts.md, 'On Ray: the code's fingerprint')")
R_API = "Serve 1.x's Python API itself ({}): not a rule of the controller; rankcore's API is docs/ray.md's"
R_EXECUTOR = "{}: the executor's (executors/ray_gpu), not the core's"
R_INIT_ARGS = (
    "init args: the core never sees them; on Ray they are part of the code's fingerprint, so a change rolls "
    "(docs/rollouts.md, 'On Ray: the code's fingerprint'), where Serve 1.x took them only with a new version; "
    "the rule the core has, a new version rolls and the same one does not, is test_deploy's")


def deploy(c: Controller, num_replicas: int = 1, **options: Any) -> list[Any]:
    """Serve 1.x's ``.deploy()`` of the deployment (``has_reconfigure``: its class has a ``reconfigure``)."""
    return c.deploy(num_replicas=num_replicas, max_surge=0, **options)


def settle(c: Controller) -> None:
    """Answer every command until the core asks nothing more (Serve's blocking ``deploy()``)."""
    for _ in range(100):
        if not c.waiting:
            return
        c.done_stopping_all()
        c.ready_all()
    raise AssertionError(f"never settled: {c.waiting}")


def serving(c: Controller) -> dict[str, tuple[str | None, Any]]:
    """What a call to each serving replica would return: replica id -> (its code version, its user_config)."""
    code = {rev: v for v, rev in c.revisions.items()}
    out = {}
    for r in c.replicas(RUNNING):
        told = [x for x in c.log_for(r.replica_id) if isinstance(x, (rc.InitializeReplica, rc.ReconfigureReplica))]
        out[r.replica_id] = (code[r.revision], told[-1].user_config)
    return out


@pytest.mark.parametrize("use_handle", [True, False])
def test_deploy(use_handle):
    c = Controller()
    deploy(c, version="1")
    settle(c)
    ((pid1, (val1, _)),) = serving(c).items()
    assert val1 == "1"

    assert deploy(c, version="1") == []  # the same version and code: nothing
    assert serving(c) == {pid1: ("1", None)}

    deploy(c, version="2")  # a new version: a new replica
    settle(c)
    ((pid3, _),) = serving(c).items()
    assert pid3 != pid1

    # new code, the same version: the core is told the same version, so nothing happens and the replica keeps
    # running the code it started with (Serve: the call still returns "1")
    assert deploy(c, version="2") == []
    assert list(serving(c)) == [pid3]

    deploy(c, version="3")  # new code and a new version: a new replica
    settle(c)
    ((pid5, (val5, _)),) = serving(c).items()
    assert pid5 != pid3 and val5 == "3"


@pytest.mark.skip(reason=R_API.format("a deployment named after the function or class it decorates"))
def test_empty_decorator():
    pass


@pytest.mark.skip(reason=R_NO_VERSION)
@pytest.mark.parametrize("use_handle", [True, False])
def test_deploy_no_version(use_handle):
    pass


@pytest.mark.skip(reason=R_API.format("prev_version, a check that the version deployed is the one expected; "
                                      "Serve dropped it, rankcore has none"))
@pytest.mark.parametrize("use_handle", [True, False])
def test_deploy_prev_version(use_handle):
    pass


@pytest.mark.parametrize("use_handle", [True, False])
def test_config_change(use_handle):
    c = Controller()
    deploy(c, version="1", has_reconfigure=True)  # no user_config
    settle(c)
    ((pid1, _),) = serving(c).items()

    deploy(c, version="1", has_reconfigure=True, user_config={"ret": "2"})  # the same replica, reconfigured
    assert c.count(UPDATING) == 1
    settle(c)
    assert serving(c) == {pid1: ("1", {"ret": "2"})}

    deploy(c, version="1", has_reconfigure=True, user_config={"ret": "3"})
    settle(c)
    assert serving(c) == {pid1: ("1", {"ret": "3"})}

    deploy(c, version="2", has_reconfigure=True, user_config={"ret": "3"})  # a new version: a new replica
    settle(c)
    ((pid4, (_, val4)),) = serving(c).items()
    assert pid4 != pid1 and val4 == {"ret": "3"}

    deploy(c, version="3", has_reconfigure=True, user_config={"ret": "4"})  # both: a new replica, new config
    settle(c)
    ((pid5, (_, val5)),) = serving(c).items()
    assert pid5 != pid4 and val5 == {"ret": "4"}


@pytest.mark.skip(reason=(
    "Serve 1.x rolled a deployment back to its last user_config when its reconfigure raised (the deploy call "
    "raising RuntimeError); rankcore rolls back only when the old config is applied again (docs/rollouts.md, "
    "'A rollback is applying the old config again'), and a reconfigure that fails is a crash "
    "(rankcore/protocol.py: ReconfigureReplica is answered by ReplicaReconfigured or ReplicaCrashed)"))
def test_reconfigure_with_exception():
    pass


@pytest.mark.parametrize("use_handle", [True, False])
def test_redeploy_single_replica(use_handle):
    """A new version of a single replica starts once the old replica has completely stopped (a request it
    holds finishes first)."""
    c = Controller()
    deploy(c, version="1")
    settle(c)
    ((pid1, _),) = serving(c).items()

    deploy(c, version="2")  # the old replica holds a blocked request: its drain lasts
    assert [x.replica_id for x in c.stops()] == [pid1]
    assert c.started() == []
    for _ in range(3):
        c.tick(1)
    check_counts(c, total=1, by_state=[(STOPPING, 1, "1")])  # nothing new while it drains
    assert c.status == "UPDATING"  # the goal not reached

    c.done_stopping(pid1)  # the request is answered (by version 1), the old replica gone
    check_counts(c, total=1, by_state=[(STARTING, 1, "2")])
    settle(c)
    ((pid2, (val2, _)),) = serving(c).items()
    assert pid2 != pid1 and val2 == "2"
    assert c.status == "HEALTHY"


@pytest.mark.parametrize("use_handle", [True, False])
def test_redeploy_multiple_replicas(use_handle):
    """Two replicas, one holding a blocked request: a new version rolls one replica at a time."""
    c = Controller()
    deploy(c, num_replicas=2, version="1")
    settle(c)
    pids1 = set(serving(c))

    deploy(c, num_replicas=2, version="2")
    (first,) = c.stops()  # one replica at a time; it drains the blocked request
    assert c.started() == []
    (other,) = pids1 - {first.replica_id}
    assert serving(c) == {other: ("1", None)}  # the other one answers, on version 1
    c.tick(5)
    assert serving(c) == {other: ("1", None)}

    c.done_stopping(first.replica_id)  # the blocked request answered by version 1, the replica gone
    settle(c)
    assert sorted(v for v, _ in serving(c).values()) == ["2", "2"]
    assert not set(serving(c)) & pids1


@pytest.mark.parametrize("use_handle", [True, False])
def test_reconfigure_multiple_replicas(use_handle):
    """A new user_config reaches two replicas one at a time (the first one's reconfigure blocks)."""
    c = Controller()
    deploy(c, num_replicas=2, version="1", has_reconfigure=True, user_config="1")
    settle(c)
    pids1 = set(serving(c))

    deploy(c, num_replicas=2, version="1", has_reconfigure=True, user_config="2")
    (blocked,) = c.ids(UPDATING)
    (other,) = pids1 - {blocked}
    assert serving(c) == {other: ("1", "1")}  # the other one still answers with the old config
    c.tick(5)
    assert c.ids(UPDATING) == [blocked]

    c.ready(blocked)  # its reconfigure returns
    settle(c)
    assert serving(c) == {pid: ("1", "2") for pid in pids1}  # the same two replicas, both on the new config


@pytest.mark.skip(reason=(
    "requests in flight during a reconfigure finish on the old config: the replica's order of calls and the "
    "request path's (docs/requests.md), not the core's, which paces the reconfigures "
    "(test_reconfigure_multiple_replicas)"))
def test_reconfigure_with_queries():
    pass


@pytest.mark.parametrize("use_handle", [True, False])
def test_redeploy_scale_down(use_handle):
    c = Controller()
    deploy(c, num_replicas=4, version="1")
    settle(c)
    pids1 = set(serving(c))
    assert len(pids1) == 4

    deploy(c, num_replicas=2, version="2")
    settle(c)
    assert sorted(v for v, _ in serving(c).values()) == ["2", "2"]
    assert not set(serving(c)) & pids1


@pytest.mark.parametrize("use_handle", [True, False])
def test_redeploy_scale_up(use_handle):
    c = Controller()
    deploy(c, num_replicas=2, version="1")
    settle(c)
    pids1 = set(serving(c))

    deploy(c, num_replicas=4, version="2")
    settle(c)
    assert sorted(v for v, _ in serving(c).values()) == ["2"] * 4
    assert not set(serving(c)) & pids1


@pytest.mark.skip(reason=R_API.format("a handle's method names"))
def test_deploy_handle_validation():
    pass


@pytest.mark.skip(reason=R_INIT_ARGS)
def test_init_args():
    pass


@pytest.mark.skip(reason=R_INIT_ARGS)
def test_init_kwargs():
    pass


@pytest.mark.skip(reason=R_API.format("the decorator's checks of its options; rankcore checks its own where "
                                      "they are written: tests/unit/test_options.py"))
def test_input_validation():
    pass


@pytest.mark.skip(reason=R_API.format("a Deployment object's properties"))
def test_deployment_properties():
    pass


class TestGetDeployment:
    """``serve.get_deployment`` / ``serve.list_deployments`` (``use_list_api``): Serve 1.x's API to fetch a
    deployment by name; the core's counterpart is ``State.deployment(name)``."""

    @pytest.mark.skip(reason=R_API.format("serve.get_deployment returning a deployed deployment"))
    @pytest.mark.parametrize("use_list_api", [True, False])
    def test_basic_get(self, use_list_api):
        pass

    @pytest.mark.parametrize("use_list_api", [True, False])
    def test_get_after_delete(self, use_list_api):
        c = Controller()
        deploy(c, version="1")
        settle(c)
        c.delete()
        settle(c)
        with pytest.raises(KeyError):  # (rankcore's UnknownDeployment is a KeyError, as Serve's)
            c.state.deployment(DEP)

    @pytest.mark.parametrize("use_list_api", [True, False])
    def test_deploy_new_version(self, use_list_api):
        c = Controller()
        deploy(c, version="1")
        settle(c)
        ((pid1, _),) = serving(c).items()
        spec = c.dep.spec()  # the deployment as fetched back, then deployed with a new version
        c.step(spec.replace(version="2"))
        c.revisions["2"] = c.dep.revision
        settle(c)
        ((pid2, (val2, _)),) = serving(c).items()
        assert pid2 != pid1 and val2 == "2"

    @pytest.mark.skip(reason=R_NO_VERSION)
    @pytest.mark.parametrize("use_list_api", [True, False])
    def test_deploy_empty_version(self, use_list_api):
        pass

    @pytest.mark.skip(reason=R_INIT_ARGS)
    @pytest.mark.parametrize("use_list_api", [True, False])
    def test_init_args(self, use_list_api):
        pass

    @pytest.mark.parametrize("use_list_api", [True, False])
    def test_scale_replicas(self, use_list_api):
        c = Controller()
        deploy(c)
        settle(c)
        assert len(serving(c)) == 1
        c.step(c.dep.spec().replace(num_replicas=2))  # fetched back and deployed with two replicas
        settle(c)
        check_counts(c, total=2, by_state=[(RUNNING, 2, None)])


@pytest.mark.skip(reason=R_API.format("serve.list_deployments"))
def test_list_deployments():
    pass


@pytest.mark.skip(reason=R_EXECUTOR.format("route prefixes (the HTTP ingress, docs/ray.md 'HTTP ingress'; the "
                                           "core never sees one)"))
def test_deploy_change_route_prefix():
    pass


@pytest.mark.skip(reason=R_EXECUTOR.format("a replica with num_cpus=0 (Ray's empty placement bundle)"))
def test_deploy_empty_bundle():
    pass


@pytest.mark.skip(reason=R_EXECUTOR.format("a Ray runtime_env the cluster refuses, reported to the deploy call"))
def test_deployment_error_handling():
    pass


@pytest.mark.skip(reason=R_EXECUTOR.format("HTTP requests cancelled by their client (the proxy's)"))
def test_http_proxy_request_cancellation():
    pass


@pytest.mark.skip(reason=R_API.format("deploy_group, deploying several deployments in one call; Serve dropped it"))
class TestDeployGroup:
    def test_basic_deploy_group(self):
        pass

    def test_non_blocking_deploy_group(self):
        pass

    def test_mutual_handles(self):
        pass

    def test_decorated_deployments(self):
        pass

    def test_empty_list(self):
        pass

    def test_invalid_input(self):
        pass

    def test_import_path_deployment(self):
        pass

    def test_different_pymodules(self):
        pass
