"""Ray Serve's proxy lifecycle tests (its ``ProxyStateManager`` and ``ProxyState``), re-expressed
against rankcore's core (issue 64, "Prove it on Serve's own tests").

Source: ray-project/ray, python/ray/serve/tests/unit/test_proxy_state.py @
0cf79cd2bce0f91316a8c58f4d4bbcc14e26e0ac (the version the search index holds, 35,303 characters: the
one with ``TestFallbackProxy``). Every case of that file is here under its own name and parameters,
written anew from what it checks (not copied); the tally is in docs/testing.md, "Ray Serve's own
tests (tests/serve_parity/)".

Serve drives its manager with a fake proxy wrapper whose answers the test sets (``is_ready_response``,
``is_healthy_response``, ``is_drained_response``) and a mock timer; ``update(proxy_nodes=...)`` is one
control loop. Where proxies run, and what becomes of one that fails or is no longer needed, is a rule
of rankcore's core (rankcore/control/proxies.py; docs/ray.md, "Proxies, one a node"), so here the same
story drives ``rankcore.step``: a node is a ``NodeJoined``, Serve's ``proxy_nodes`` (the nodes holding
a replica) are the nodes the core booked a deployment's replicas on, a passing ready check is
``ProxyStarted``, a health check (or a drain check: rankcore's health check reports what the proxy has
in flight, and a drain ends at none) is ``ProxyHealthChecked``, and the mock timer is ``Tick``. Every
step is checked (``rankcore.invariants.check_step(full=True)``).

Serve's ``ProxyStatus`` words are the ones ``rankcore status`` shows for the core's phases
(docs/ray.md, "Proxies, one a node"): STARTING, HEALTHY, DRAINING, and UNHEALTHY while a proxy waits
out its restart backoff. Serve's DRAINED (a drain that ended, the actor about to go) has no phase: the
core stops such a proxy in the step its drain ends (``StopProxy(reason="drained")``), so DRAINED is
"gone from the book after a ``StopProxy('drained')``". Serve's ``actor_details`` (worker id, log file)
and targets (IP, port) are the executor's (``executors.ray_gpu.ingress.http.proxies()``), not the
core's: those assertions are left out where a case makes them.
"""

from __future__ import annotations

from typing import Any

import pytest

import rankcore as rc
from rankcore.control.proxies import ready_timeout_s
from rankcore.invariants import check_step

ORIGIN = "python/ray/serve/tests/unit/test_proxy_state.py @ 0cf79cd2bce0f91316a8c58f4d4bbcc14e26e0ac"

HEAD_NODE_ID = "node_id-index-head"
#: Serve's constants (ray.serve._private.constants), rankcore's defaults of the same names
PROXY_HEALTH_CHECK_UNHEALTHY_THRESHOLD = rc.ProxyOptions().health_check_unhealthy_threshold
assert PROXY_HEALTH_CHECK_UNHEALTHY_THRESHOLD == 3
#: the words ``rankcore status`` shows for a proxy's phase (Serve's ``ProxyStatus``)
STATUS = {rc.ProxyPhase.STARTING: "STARTING", rc.ProxyPhase.HEALTHY: "HEALTHY",
          rc.ProxyPhase.DRAINING: "DRAINING", rc.ProxyPhase.BACKOFF: "UNHEALTHY"}

HAPROXY = ("differs on purpose: Serve's fallback proxy runs beside its native (HAProxy) ingress; rankcore's "
           "ingress is its own Python proxy, one a node, and has no HAProxy mode nor fallback proxy "
           "(docs/metrics.md, \"Ray Serve's metrics, one by one\": the serve_haproxy_* rows, no such concept)")


class Manager:
    """Serve's ``ProxyStateManager`` over a mocked cluster, re-expressed: the core, its proxies
    configured, and its commands kept. ``deploy`` books one replica on each worker named (one GPU
    each, the head has none): those are Serve's ``proxy_nodes`` beside the head."""

    def __init__(self, workers: int = 0, location: str = "EveryNode", **options: Any) -> None:
        self.state = rc.State()
        self.commands: list[Any] = []
        self.step(rc.Tick(now=0.0))
        self.step(rc.NodeJoined(node_id=HEAD_NODE_ID, resources={"CPU": 8}))
        self.workers = [f"worker-node-id-{i}" for i in range(workers)]
        for w in self.workers:
            self.step(rc.NodeJoined(node_id=w, resources={"CPU": 8, "GPU": 1}))
        self.options = rc.ProxyOptions(proxy_location=location, **options)
        self.step(rc.ProxiesConfigured(options=self.options, head_node=HEAD_NODE_ID))
        self.deployed = 0

    def step(self, event: Any) -> rc.Step:
        result = rc.step(self.state, event)
        check_step(self.state, event, result, full=True)
        self.state = result.state
        self.commands.extend(result.commands)
        return result

    @property
    def now(self) -> float:
        return self.state.cluster.now

    def advance(self, seconds: float) -> rc.Step:
        """Serve's ``timer.advance``: the clock moves on (the core acts on the deadlines due)."""
        return self.step(rc.Tick(now=self.now + seconds))

    def proxies(self) -> dict[str, rc.Proxy]:
        return dict(self.state.proxies.proxies)

    def status(self, node: str) -> str | None:
        p = self.state.proxies.proxies.get(node)
        return None if p is None else STATUS[p.phase]

    def pid(self, node: str) -> str:
        return self.state.proxies.proxies[node].proxy_id

    def deploy(self, n: int) -> None:
        """One GPU replica on each of ``n`` workers (booked, placed and ready)."""
        self.step(rc.DeploymentApplied(name="model", num_replicas=n, resources={"GPU": 1}))
        self._settle()

    def scale(self, n: int) -> None:
        self.step(rc.ScaleRequested(deployment="model", num_replicas=n))
        self._settle()

    def _settle(self) -> None:
        """Every placement answered, every start ready, every stop done (Serve's mocked replicas)."""
        while True:
            state = self.state
            todo = [r for r in state.replicas() if r.phase in (rc.Phase.PENDING, rc.Phase.STARTING,
                                                                        rc.Phase.STOPPING)]
            if not todo:
                return
            r = todo[0]
            if r.phase is rc.Phase.PENDING:
                place = [c for c in self.commands if isinstance(c, rc.PlaceReplica) and c.replica_id == r.replica_id][-1]
                self.step(rc.ReplicaPlaced(replica_id=r.replica_id, node_id=place.node_id))
            elif r.phase is rc.Phase.STARTING:
                self.step(rc.ReplicaReady(replica_id=r.replica_id))
            else:
                self.step(rc.ReplicaStopped(replica_id=r.replica_id))

    def ready_all(self) -> None:
        """Every STARTING proxy passes its ready check (Serve: ``is_ready_response = True``)."""
        for p in self.proxies().values():
            if p.phase is rc.ProxyPhase.STARTING:
                self.step(rc.ProxyStarted(proxy_id=p.proxy_id))

    def checked(self, node: str, healthy: bool = True, ongoing: int = 0) -> rc.Step:
        return self.step(rc.ProxyHealthChecked(proxy_id=self.pid(node), healthy=healthy, ongoing=ongoing))

    def of(self, step: rc.Step, kind: type) -> list[Any]:
        return [c for c in step.commands if isinstance(c, kind)]


@pytest.fixture
def number_of_worker_nodes() -> int:
    return 100


# ------------------------------------------------------------------ where proxies run
def test_node_selection(number_of_worker_nodes):
    n = number_of_worker_nodes
    # Disabled: none, whatever holds replicas
    m = Manager(n, location="Disabled")
    m.deploy(n)
    assert rc.query.proxy_nodes(m.state.proxies, m.state.cluster.nodes) == frozenset() and m.proxies() == {}
    # HeadOnly: the head's only, though every worker holds a replica
    m = Manager(n, location="HeadOnly")
    m.deploy(n)
    assert rc.query.proxy_nodes(m.state.proxies, m.state.cluster.nodes) == {HEAD_NODE_ID}
    assert list(m.proxies()) == [HEAD_NODE_ID]
    # EveryNode, every node holding a replica (Serve's proxy_nodes = all nodes): every node
    m = Manager(n, location="EveryNode")
    m.deploy(n)
    assert rc.query.proxy_nodes(m.state.proxies, m.state.cluster.nodes) == {HEAD_NODE_ID, *m.workers}
    assert set(m.proxies()) == {HEAD_NODE_ID, *m.workers}
    # EveryNode, no replica anywhere (Serve's proxy_nodes = {head}): the head's only
    m = Manager(n, location="EveryNode")
    assert rc.query.proxy_nodes(m.state.proxies, m.state.cluster.nodes) == {HEAD_NODE_ID}
    assert [c.node_id for c in m.commands if isinstance(c, rc.StartProxy)] == [HEAD_NODE_ID]


# ------------------------------------------------------------------ restarts
def test_proxy_state_manager_restarts_unhealthy_proxies():
    m = Manager()
    m.ready_all()
    old = m.pid(HEAD_NODE_ID)
    # Serve marks the proxy UNHEALTHY by hand; here it fails its health checks the threshold's times
    for _ in range(PROXY_HEALTH_CHECK_UNHEALTHY_THRESHOLD - 1):
        m.advance(5)
        assert m.of(m.checked(HEAD_NODE_ID, healthy=False), rc.StopProxy) == []
    m.advance(5)
    step = m.checked(HEAD_NODE_ID, healthy=False)
    # the old one is shut down, a new one (another actor, another id) is STARTING, restarted once
    assert m.of(step, rc.StopProxy) == [rc.StopProxy(proxy_id=old, node_id=HEAD_NODE_ID, reason="unhealthy")]
    (start,) = m.of(step, rc.StartProxy)
    new = m.state.proxies.proxies[HEAD_NODE_ID]
    assert start.proxy_id == new.proxy_id != old
    assert m.status(HEAD_NODE_ID) == "STARTING" and new.restarts == 1


def test_proxy_state_reconcile_shutting_down():
    # Serve: a proxy being shut down is left alone by the next reconcile. Here: a proxy the core
    # stopped is gone from its book, and late news of it (a check, a ready answer) changes nothing.
    m = Manager(workers=1)
    m.deploy(1)
    m.ready_all()
    m.scale(0)  # the worker holds nothing: its proxy drains, then stops with nothing in flight
    worker = m.workers[0]
    pid = m.pid(worker)
    m.advance(m.options.min_draining_period_s)
    step = m.checked(worker, ongoing=0)
    assert m.of(step, rc.StopProxy) == [rc.StopProxy(proxy_id=pid, node_id=worker, reason="drained")]
    before = m.state.proxies
    for late in (rc.ProxyHealthChecked(proxy_id=pid, healthy=False), rc.ProxyStarted(proxy_id=pid),
                 rc.ProxyCrashed(proxy_id=pid)):
        assert m.step(late).stale
    assert m.state.proxies == before and m.status(worker) is None


# ------------------------------------------------------------------ ready checks
def test_proxy_state_reconcile_readiness_check_succeed():
    m = Manager()
    assert m.status(HEAD_NODE_ID) == "STARTING"
    step = m.step(rc.ProxyStarted(proxy_id=m.pid(HEAD_NODE_ID)))
    assert m.status(HEAD_NODE_ID) == "HEALTHY" and not step.stale
    # (Serve's actor_details, worker id and log file: the executor's proxies(), not the core's)


def test_proxy_state_reconcile_readiness_check_pending():
    m = Manager()
    # the ready check pending: the clock moves on within its timeout, the proxy stays STARTING
    for _ in range(10):
        m.advance(1.0)
        assert m.status(HEAD_NODE_ID) == "STARTING"
    assert m.now < ready_timeout_s(m.options, 0)
    m.step(rc.ProxyStarted(proxy_id=m.pid(HEAD_NODE_ID)))
    assert m.status(HEAD_NODE_ID) == "HEALTHY"


def test_proxy_state_reconcile_readiness_check_fails():
    # Serve: a failed ready check is counted; the threshold's worth makes the proxy UNHEALTHY (the
    # manager then restarts it). rankcore: ready checks of ready_check_timeout_s each, the threshold's
    # worth of them (docs/ray.md, "Proxies, one a node"): not ready by then it is stopped and restarted.
    m = Manager()
    one_check = m.options.ready_check_timeout_s
    m.advance(one_check)  # the first check failed: still STARTING
    assert m.status(HEAD_NODE_ID) == "STARTING"
    first = m.pid(HEAD_NODE_ID)
    steps = [m.advance(one_check) for _ in range(PROXY_HEALTH_CHECK_UNHEALTHY_THRESHOLD - 1)]
    stops = [c for s in steps for c in m.of(s, rc.StopProxy)]
    assert stops == [rc.StopProxy(proxy_id=first, node_id=HEAD_NODE_ID, reason="ready_timeout")]
    assert m.pid(HEAD_NODE_ID) != first  # (restarted at once the first time: a new incarnation, STARTING)


# ------------------------------------------------------------------ health checks
def test_proxy_state_reconcile_health_check_succeed():
    m = Manager()
    m.ready_all()
    assert m.status(HEAD_NODE_ID) == "HEALTHY"
    for _ in range(10):
        m.advance(5)
        step = m.checked(HEAD_NODE_ID)
        assert m.status(HEAD_NODE_ID) == "HEALTHY" and m.of(step, rc.StopProxy) == []
    # (every check was told to the core: none was dropped as stale)
    assert m.state.proxies.proxies[HEAD_NODE_ID].failures == 0


def test_proxy_state_reconcile_health_check_transient_failures():
    m = Manager()
    m.ready_all()
    for _ in range(PROXY_HEALTH_CHECK_UNHEALTHY_THRESHOLD - 1):
        m.checked(HEAD_NODE_ID, healthy=False)
        assert m.status(HEAD_NODE_ID) == "HEALTHY"
        m.advance(5)
    assert m.state.proxies.proxies[HEAD_NODE_ID].failures == PROXY_HEALTH_CHECK_UNHEALTHY_THRESHOLD - 1
    m.checked(HEAD_NODE_ID, healthy=True)
    assert m.status(HEAD_NODE_ID) == "HEALTHY"
    assert m.state.proxies.proxies[HEAD_NODE_ID].failures == 0  # (Serve's _consecutive_health_check_failures)


def test_proxy_state_reconcile_health_check_persistent_failures():
    m = Manager()
    m.ready_all()
    pid = m.pid(HEAD_NODE_ID)
    for _ in range(PROXY_HEALTH_CHECK_UNHEALTHY_THRESHOLD - 1):
        assert m.of(m.checked(HEAD_NODE_ID, healthy=False), rc.StopProxy) == []
        assert m.status(HEAD_NODE_ID) == "HEALTHY"
        m.advance(5)
    assert m.state.proxies.proxies[HEAD_NODE_ID].failures == PROXY_HEALTH_CHECK_UNHEALTHY_THRESHOLD - 1
    step = m.checked(HEAD_NODE_ID, healthy=False)  # the threshold's failure in a row: unhealthy
    assert m.of(step, rc.StopProxy) == [rc.StopProxy(proxy_id=pid, node_id=HEAD_NODE_ID, reason="unhealthy")]


# ------------------------------------------------------------------ draining
@pytest.mark.parametrize("number_of_worker_nodes", [0, 1, 2, 3])
def test_proxy_manager_update_proxies_states(number_of_worker_nodes):
    n = number_of_worker_nodes
    m = Manager(n, min_draining_period_s=0.0)  # (Serve's PROXY_HEALTH_CHECK_PERIOD_S 0: no wait)
    m.deploy(n)
    m.ready_all()
    nodes = [HEAD_NODE_ID, *m.workers]
    assert [m.status(x) for x in nodes] == ["HEALTHY"] * (n + 1)
    ids = {x: m.pid(x) for x in nodes}
    # no replica left on a worker (Serve: proxy_nodes = {head}): the head's stays HEALTHY, the others drain
    m.scale(0)
    assert [m.status(x) for x in nodes] == ["HEALTHY"] + ["DRAINING"] * n
    # replicas on every worker again (proxy_nodes = every node): every proxy HEALTHY, the same ones
    m.scale(n)
    assert [m.status(x) for x in nodes] == ["HEALTHY"] * (n + 1)
    assert {x: m.pid(x) for x in nodes} == ids


def test_proxy_state_reconcile_draining_success():
    m = Manager(workers=1)
    m.deploy(1)
    m.ready_all()
    worker = m.workers[0]
    m.scale(0)
    assert m.status(worker) == "DRAINING"
    # healthy, but requests still in flight (Serve: is_drained False): DRAINING, check after check
    for _ in range(10):
        assert m.of(m.checked(worker, ongoing=1), rc.StopProxy) == []
        assert m.status(worker) == "DRAINING"
        m.advance(5)
    # (Serve's pending drain checks: no report, no change)
    for _ in range(5):
        m.advance(5)
        assert m.status(worker) == "DRAINING"
    # drained (nothing in flight, the drain's min period passed): stopped, Serve's DRAINED
    assert m.now >= m.options.min_draining_period_s
    pid = m.pid(worker)
    step = m.checked(worker, ongoing=0)
    assert m.of(step, rc.StopProxy) == [rc.StopProxy(proxy_id=pid, node_id=worker, reason="drained")]
    assert m.status(worker) is None


@pytest.mark.parametrize("number_of_worker_nodes", [1])
def test_proxy_actor_manager_removing_proxies(number_of_worker_nodes):
    m = Manager(number_of_worker_nodes)
    m.deploy(1)
    m.ready_all()
    (worker,) = m.workers
    assert [m.status(HEAD_NODE_ID), m.status(worker)] == ["HEALTHY", "HEALTHY"]
    m.scale(0)  # only the head's proxy is wanted now
    for _ in range(10):
        m.checked(worker, ongoing=1)  # (Serve: is_drained False)
        m.advance(5)
        assert [m.status(HEAD_NODE_ID), m.status(worker)] == ["HEALTHY", "DRAINING"]
    step = m.checked(worker, ongoing=0)  # drained: the worker's proxy is shut down
    assert [c.reason for c in m.of(step, rc.StopProxy)] == ["drained"]
    assert list(m.proxies()) == [HEAD_NODE_ID] and m.status(HEAD_NODE_ID) == "HEALTHY"


def test_is_ready_for_shutdown():
    pytest.skip("covered by tests/integration/test_ray_http.py::"
                "test_reset_stops_the_ingress_and_forgets_its_routes_and_port: shutting every proxy down is the "
                "Ray controller's reset (its server closed, its port free, the actor killed), not a rule of the "
                "core, which has no such event")


@pytest.mark.parametrize("number_of_worker_nodes", [1])
def test_proxy_state_manager_timing_out_on_start(number_of_worker_nodes):
    # Serve patches PROXY_HEALTH_CHECK_UNHEALTHY_THRESHOLD to 1: one failed ready check restarts a proxy
    m = Manager(number_of_worker_nodes, health_check_unhealthy_threshold=1)
    m.deploy(1)
    nodes = [HEAD_NODE_ID, *m.workers]
    assert len(m.proxies()) == 2 and [m.status(x) for x in nodes] == ["STARTING", "STARTING"]
    before = {x: m.pid(x) for x in nodes}
    # the worker's proxy started later (with its replica's booking): every proxy's ready timeout passes
    step = m.advance(ready_timeout_s(m.options, 0))
    stopped = {c.node_id: c.proxy_id for c in m.of(step, rc.StopProxy)}
    assert stopped == before and {c.reason for c in m.of(step, rc.StopProxy)} == {"ready_timeout"}
    after = {x: m.pid(x) for x in nodes}
    assert all(after[x] != before[x] for x in nodes) and [m.status(x) for x in nodes] == ["STARTING"] * 2
    # the new ones pass their ready checks: HEALTHY, the same proxies
    m.ready_all()
    assert [m.status(x) for x in nodes] == ["HEALTHY"] * 2 and {x: m.pid(x) for x in nodes} == after


def test_proxy_state_manager_get_targets(number_of_worker_nodes):
    # Serve's targets: every proxy but a DRAINED one; here the proxies that serve (an outside load
    # balancer's targets: rc.query.serving_proxies), by node. (Each target's IP and port: the executor's
    # proxies(); Serve's gRPC targets and its ValueError for an unknown protocol: no such API.)
    m = Manager(number_of_worker_nodes)
    m.deploy(number_of_worker_nodes)
    m.ready_all()
    last = m.workers[-1]
    # the last worker's proxy drains and is drained (stopped)
    m.step(rc.NodeDraining(node_id=last))
    m.advance(m.options.min_draining_period_s)
    m.checked(last, ongoing=0)
    serving = rc.query.serving_proxies(m.state.proxies)
    assert len(serving) == number_of_worker_nodes  # (101 nodes, one drained)
    assert m.pid(HEAD_NODE_ID) in serving and all(not p.startswith(f"proxy:{last}#") for p in serving)


# ------------------------------------------------------------------ Serve's fallback proxy (HAProxy)
class TestFallbackProxy:
    def test_fallback_proxy_starts_on_head_node(self):
        pytest.skip(HAPROXY)

    def test_no_fallback_proxy_when_not_native(self):
        pytest.skip(HAPROXY)

    def test_fallback_proxy_uses_correct_ports(self):
        pytest.skip(HAPROXY)

    def test_fallback_proxy_not_started_twice(self):
        pytest.skip(HAPROXY)

    def test_stop_unhealthy_fallback_proxy(self):
        pytest.skip(HAPROXY)

    def test_stop_drained_fallback_proxy(self):
        pytest.skip(HAPROXY)

    def test_fallback_proxy_included_in_handles(self):
        pytest.skip(HAPROXY)

    def test_fallback_proxy_included_in_names(self):
        pytest.skip(HAPROXY)

    def test_fallback_proxy_included_in_alive_actor_ids(self):
        pytest.skip(HAPROXY)

    def test_fallback_proxy_blocks_shutdown_readiness(self):
        pytest.skip(HAPROXY)

    def test_shutdown_includes_fallback_proxy(self):
        pytest.skip(HAPROXY)

    def test_fallback_proxy_reconciled_during_update(self):
        pytest.skip(HAPROXY)

    def test_get_fallback_proxy_targets(self):
        pytest.skip(HAPROXY)
