"""Ray Serve's deployment state machine tests, re-expressed against rankcore's core.

Source: ray-project/ray, python/ray/serve/tests/unit/test_deployment_state.py at
0076a4ad6ffcc318f6def0ad7626a66b22454124 (the newest version the search index holds, 415,360
characters: the one with replica ranks, gangs and deployment actors). Where a case says what
Serve expected with ``RAY_SERVE_EAGERLY_START_REPLACEMENT_REPLICAS=0``, that is the same file at
89497fb38a5d9070af8e9a3c5a88194f3b66093a, which checked both ways.

Serve drives its ``DeploymentStateManager`` with mocked replica actors: ``deploy()`` sets a target,
``update()`` runs one control loop, and the test answers for the actors (``set_ready``,
``set_done_stopping``, ``set_failed_to_start``, ``set_unhealthy``). Here the same story drives the
pure core: each ``deploy``/``autoscale``/``delete`` is an event (``DeploymentApplied``,
``AutoscalingMetrics``, ``DeploymentDeleted``), and each answer of a mocked actor is the event an
executor would report (``ReplicaReady``, ``ReplicaReconfigured``, ``ReplicaStopped``,
``ReplicaCrashed(cause="error")``, ``HealthChecked``). The core acts in the step of the event, so
Serve's ``update()`` after an answer is the answer's own step. Placements are answered at once on
one node, ``"node-id"``, as Serve's mocked cluster has one; every other command waits for the test,
as Serve's mocked actor does. Every invariant is checked after every step
(``rankcore.invariants.check_step(full=True)``). Every case of that file is here under its own name
and parameters, written anew from what it checks (not copied); the tally is in docs/testing.md,
"Ray Serve's own tests (tests/serve_parity/)".

Serve's replica states are rankcore's phases: STARTING is ``pending`` or ``starting``, RUNNING is
``running``, UPDATING is ``reconfiguring``, STOPPING is ``stopping``; a Serve version is the code
``version`` (the replica's ``revision``), its user_config apart (``config_version``).

Adapted throughout (each case says where it matters):

* Serve starts a successor beside a replica it stops (``RAY_SERVE_EAGERLY_START_REPLACEMENT_REPLICAS``,
  on by default); rankcore does with ``max_surge`` (docs/rollouts.md, "Surge"), so every deployment
  here is applied with ``max_surge`` equal to its ``max_unavailable`` (Serve's ``rolling_update_percentage``,
  20%). A surge applies to a serving replica only: a successor of one not serving yet starts when it
  has stopped (docs/rollouts.md, "The rule"), which is Serve's expectation without the eager start.
* Statuses: rankcore's are HEALTHY, UPDATING and UNHEALTHY; Serve's UPSCALING and DOWNSCALING are
  UPDATING here, and it never shows DEPLOY_FAILED (docs/metrics.md, ``ray_serve_deployment_status``).
  It has no status triggers: those assertions are left out.
* A failed start is reported by ``ReplicaCrashed``: the replica is gone then (its executor saw it die),
  where Serve's goes STOPPING until the controller has killed its actor. A replica the core kills
  (``StopReplica`` with 0 s: unhealthy under ``force_stop_unhealthy_replicas``, a gang member, an
  unhealthy replica during a rollout) gives its room to its successor in the same step and is gone
  from the state (docs/architecture.md, the "health checks" and "graceful shutdown" rows).
* The k-th failed start in a row waits out a restart backoff before its retry (docs/architecture.md,
  "restart backoff"); Serve's mocked timer never waits, so the clock is moved past it.
* Serve's mocked health check returns its wrapper's verdict (three failures in a row); here
  ``health_check_failure_threshold`` failed ``HealthChecked`` in a row.
* There is no RECOVERING phase: a restarted controller learns each replica's phase, rank and revision
  from its ``ReplicaReport`` in the ``ControllerRecovered`` step (built with
  ``rankcore.invariants.reports_from``, what the live replicas would say).
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

import attrs
import pytest

import rankcore as rc
from rankcore.invariants import check_step, reports_from

ORIGIN = "python/ray/serve/tests/unit/test_deployment_state.py @ 0076a4ad6ffcc318f6def0ad7626a66b22454124"

DEP = "test_deployment"
DEP_2 = "test_deployment_2"
NODE = "node-id"  # Serve's mocked cluster: one node, "node-id"

P = rc.Phase
#: Serve's replica states as rankcore phases
STARTING = (P.PENDING, P.STARTING)
RUNNING = (P.RUNNING,)
UPDATING = (P.RECONFIGURING,)
STOPPING = (P.STOPPING,)
ANY = object()  # check_counts: any version (Serve's ``None``)

#: Serve's constants the cases use (ray.serve._private.constants)
DEFAULT_GRACEFUL_SHUTDOWN_TIMEOUT_S = 20
DEFAULT_GRACEFUL_SHUTDOWN_WAIT_LOOP_S = 2
DEFAULT_HEALTH_CHECK_PERIOD_S = 10
DEFAULT_HEALTH_CHECK_TIMEOUT_S = 30
DEFAULT_MAX_ONGOING_REQUESTS = 5


class Controller:
    """Serve's mocked ``DeploymentStateManager``, re-expressed: the core, one node, and replicas whose
    answers wait for the test (``waiting``: replica id -> the command its mocked actor has not
    answered). Placements are answered at once unless ``placing`` is False (Serve's
    PENDING_ALLOCATION: the replica stays ``pending``)."""

    def __init__(self, nodes: Iterable[str] = (NODE,)) -> None:
        self.state = rc.State()
        self.waiting: dict[str, Any] = {}
        self.unplaced: list[rc.PlaceReplica] = []
        self.placing = True
        self.revisions: dict[Any, str] = {}  # Serve's code version -> the revision rankcore gave it
        self.commands: list[Any] = []  # the commands of the last call
        self.log: list[Any] = []  # every command so far
        self.steps: list[rc.Step] = []  # the steps of the last call
        for node in nodes:
            self.step(rc.NodeJoined(node_id=node, resources={"CPU": 1000.0}))

    # ------------------------------------------------------------------ the core
    def step(self, event: Any) -> list[Any]:
        """``event``, then the placements it leads to, each checked; the commands, in order."""
        out: list[Any] = []
        steps: list[rc.Step] = []
        queue = [event]
        while queue:
            e = queue.pop(0)
            before = self.state
            result = rc.step(before, e)
            check_step(before, e, result, full=True)
            self.state = result.state
            steps.append(result)
            for cmd in result.commands:
                out.append(cmd)
                if isinstance(cmd, rc.PlaceReplica):
                    if self.placing:
                        queue.append(rc.ReplicaPlaced(replica_id=cmd.replica_id, node_id=cmd.node_id))
                    else:
                        self.unplaced.append(cmd)
                elif isinstance(cmd, rc.StartReplica) and not self.state.cluster.managed:
                    queue.append(rc.ReplicaPlaced(replica_id=cmd.replica_id, node_id=NODE))
                elif isinstance(cmd, (rc.InitializeReplica, rc.ReconfigureReplica, rc.StopReplica)):
                    self.waiting[cmd.replica_id] = cmd
        live = {r.replica_id for r in self.state.replicas()}
        self.waiting = {rid: c for rid, c in self.waiting.items() if rid in live}
        self.commands, self.steps = out, steps
        self.log.extend(out)
        return out

    def deploy(self, name: str = DEP, num_replicas: int = 1, version: str | None = None,
               user_config: Any = None, **options: Any) -> list[Any]:
        """Serve's ``dsm.deploy(id, deployment_info(...))``: a ``DeploymentApplied``. ``max_surge``
        follows ``max_unavailable`` (Serve's eager start of replacements, its rolling pace)."""
        options.setdefault("max_surge", options.get("max_unavailable", 0.2))
        out = self.step(rc.DeploymentApplied(name=name, num_replicas=num_replicas, version=version,
                                             user_config=user_config, **options))
        self.revisions[version] = self.state.deployment(name).revision
        return out

    def delete(self, name: str = DEP) -> list[Any]:
        return self.step(rc.DeploymentDeleted(deployment=name))

    def scale(self, num_replicas: int, name: str = DEP) -> list[Any]:
        """Serve's ``set_target_num_replicas``."""
        return self.step(rc.ScaleRequested(deployment=name, num_replicas=num_replicas))

    # ------------------------------------------------------------------ the mocked actors
    def ready(self, *rids: str) -> None:
        """``set_ready``: a started replica is ready, a reconfiguring one has applied its config."""
        for rid in rids:
            cmd = self.waiting.pop(rid)
            if isinstance(cmd, rc.InitializeReplica):
                self.step(rc.ReplicaReady(replica_id=rid))
            else:
                assert isinstance(cmd, rc.ReconfigureReplica), cmd
                self.step(rc.ReplicaReconfigured(replica_id=rid, version=cmd.version))

    def done_stopping(self, *rids: str) -> None:
        for rid in rids:
            assert isinstance(self.waiting.pop(rid), rc.StopReplica)
            self.step(rc.ReplicaStopped(replica_id=rid))

    def fail_start(self, *rids: str) -> None:
        """``set_failed_to_start``: its constructor raised."""
        for rid in rids:
            if self.state.replica(rid) is not None:
                self.waiting.pop(rid, None)
                self.step(rc.ReplicaCrashed(replica_id=rid, reason="constructor raised", cause="error"))

    def unhealthy(self, rid: str, name: str = DEP) -> None:
        """``set_unhealthy``: as many failed health checks in a row as the deployment tolerates."""
        for _ in range(self.state.deployment(name).health_check_failure_threshold):
            if self.state.replica(rid) is not None:
                self.step(rc.HealthChecked(replica_id=rid, healthy=False))

    def ready_all(self, states: tuple = STARTING + UPDATING, name: str = DEP) -> None:
        """Every replica of ``states`` there is now answers ready (those it leads to start wait)."""
        rids = [rid for rid in self.ids(states, name=name) if rid in self.waiting
                and not isinstance(self.waiting[rid], rc.StopReplica)]
        self.ready(*rids)

    def done_stopping_all(self, name: str | None = DEP) -> None:
        rids = [rid for rid, c in self.waiting.items() if isinstance(c, rc.StopReplica)
                and (name is None or c.deployment == name)]
        self.done_stopping(*sorted(rids, key=_number))

    def tick(self, seconds: float) -> list[Any]:
        return self.step(rc.Tick(now=self.state.cluster.now + seconds))

    def wait_out_backoff(self) -> None:
        """Move the clock to each held restart's end until none is held."""
        while self.state.cluster.delayed:
            self.step(rc.Tick(now=self.state.cluster.next_deadline))

    # ------------------------------------------------------------------ reading it
    @property
    def dep(self) -> rc.Deployment:
        return self.state.deployment(DEP)

    @property
    def status(self) -> str:
        return self.dep.status

    def replicas(self, states: tuple | None = None, version: Any = ANY, name: str = DEP) -> list[rc.Replica]:
        """The replicas in ``states`` (Serve's) on ``version``, oldest first (``ds._replicas.get``)."""
        dep = self.state.deployments.get(name)
        if dep is None:  # (deleted: its record has gone)
            return []
        found = [r for r in dep.replicas.values()
                 if (states is None or r.phase in states)
                 and (version is ANY or r.revision == self.revisions[version])]
        return sorted(found, key=lambda r: _number(r.replica_id))

    def ids(self, states: tuple | None = None, version: Any = ANY, name: str = DEP) -> list[str]:
        return [r.replica_id for r in self.replicas(states, version, name)]

    def count(self, states: tuple | None = None, version: Any = ANY, name: str = DEP) -> int:
        return len(self.replicas(states, version, name))

    def ranks(self, name: str = DEP) -> list[int]:
        """The global ranks of the replicas not stopping, sorted (Serve's ``_get_replica_ranks_mapping``)."""
        dep = self.state.deployment(name)
        return sorted(dep.ranks.global_rank(r.replica_id) for r in dep.replicas.values() if r.phase is not P.STOPPING)

    def log_for(self, rid: str) -> list[Any]:
        """Every command so far about replica ``rid``, in order."""
        return [x for x in self.log if getattr(x, "replica_id", None) == rid]

    def started(self) -> list[rc.StartReplica]:
        return [c for c in self.commands if isinstance(c, rc.StartReplica)]

    def stops(self) -> list[rc.StopReplica]:
        return [c for c in self.commands if isinstance(c, rc.StopReplica)]

    # ------------------------------------------------------------------ a controller restart
    def restarted(self, deployments: tuple | None = None, reports: tuple | None = None) -> Controller:
        """A new controller, recovered from what this one's live replicas report
        (``rankcore.invariants.reports_from``) and its checkpoint (``deployments``, default the specs
        now); the replicas' answers still owed carry over."""
        event = reports_from(self.state)
        changes: dict[str, Any] = {}
        if deployments is not None:
            changes["deployments"] = deployments
        if reports is not None:
            changes["reports"] = reports
        event = attrs.evolve(event, **changes)
        new = Controller(nodes=())
        new.revisions = dict(self.revisions)
        reported = {r.replica_id for r in event.reports}
        new.waiting = {rid: c for rid, c in self.waiting.items() if rid in reported}
        new.step(event)
        return new


def _number(rid: str) -> int:
    return rc.query.parse_replica_number(rid) or 0


def check_counts(c: Controller, total: int | None = None, by_state: Iterable[tuple] = (), name: str = DEP) -> None:
    """Serve's ``check_counts``: replicas in all, and per (states, count, version)."""
    everything = {f"{r.replica_id}:{r.phase.value}:{r.revision}" for r in c.replicas(name=name)}
    if total is not None:
        assert c.count(name=name) == total, everything
    for states, n, version in by_state:
        assert c.count(states, version, name) == n, (states, n, version, everything)


# ---------------------------------------------------------------------------------------------- reasons

R_CONTAINER = (
    "Serve's private ReplicaStateContainer (its replicas kept per state and version, counted and popped): "
    "rankcore keeps a deployment's replicas in Deployment.replicas, each with its phase and revision, and the "
    "count per phase in Deployment.counts, which rankcore.invariants checks against them after every step")
R_DEPLOYMENT_ACTORS = (
    "Serve's deployment actors (DeploymentActorConfig: actors a deployment starts beside its replicas): "
    "rankcore has none; a config file's deployment_actors is refused (docs/operate.md)")
R_DEAD_REPLICAS = (
    "Serve's dashboard list of recently stopped replicas (RAY_SERVE_RETAINED_DEAD_REPLICAS): the core keeps no "
    "record of a replica once it has stopped; a trace records every stop (docs/trace-format.md)")
R_NO_VERSION = (
    "version=None: Serve gives every deploy a new random code version, so each redeploy replaces every replica; "
    "rankcore's core has nothing to compare and replaces nothing (docs/rollouts.md, 'Options': version None), "
    "and on Ray compares the fingerprint of the code instead (docs/rollouts.md, 'On Ray: the code's fingerprint')")
R_PACE = (
    "the rollout's pace: Serve starts rolling only once the replicas a downscale stops have stopped; rankcore "
    "retires an outdated serving replica whenever no more than max_unavailable of the target are short of "
    "serving, so it retires one of the two left in the downscale's own step (docs/rollouts.md, 'The rule')")
R_DEPLOY_FAILED = (
    "Serve stops retrying and shows DEPLOY_FAILED (or UNHEALTHY with no replica left) once the starts of a "
    "version that never ran fail min(max_constructor_retry_count, 3 x target) times; rankcore shows UNHEALTHY "
    "and keeps retrying with a backoff (docs/architecture.md, the 'restart backoff' and 'status' rows; "
    "docs/scenarios.md: max_constructor_retry_count '(it keeps retrying)'; docs/metrics.md: never DEPLOY_FAILED)")
R_PG_INVALID = (
    "a placement group bundle Ray refuses ({'GPU': 0}): each start fails on it, and Serve ends DEPLOY_FAILED "
    "after its retries while the other deployment runs; to the core that is a failed start like any other (the "
    "executor reports ReplicaCrashed), so rankcore shows UNHEALTHY and keeps retrying, never DEPLOY_FAILED "
    "(docs/architecture.md, the 'restart backoff' and 'status' rows; docs/metrics.md)")
R_SHUTDOWN = (
    "Serve's controller shutdown (DeploymentStateManager.shutdown, is_ready_for_shutdown, its checkpoint in "
    "the KV store): the core has no instance shutdown; an executor deletes each deployment (DeploymentDeleted, "
    "docs/embedding.md, 'Deleting a deployment') and persists desired_specs itself ('Controller recovery')")
R_PRIVATE = (
    "Serve's private bookkeeping, not a rule of its state machine: rankcore has no such structure (its "
    "decisions are the commands of each step)")
R_RAY = (
    "Ray's side of a replica (actor options, placement group objects): the executor's (executors/ray_gpu), "
    "not the core's")
R_NODE_QUERIES = (
    "Serve's manager queries of where its replicas run (for its proxies and the dashboard): rankcore's state "
    "holds each replica's node (Replica.node_id) and decides where proxies run itself (rankcore.query.proxy_nodes; "
    "tests/unit/test_proxies.py)")
R_INGRESS_ROUTER = (
    "Serve's ingress request router (a deployment pinned one replica per proxy node): rankcore has none")
R_TEST_HOOKS = "Serve's own test hooks on its manager (_dump_replica_states_for_testing, _stop_one_running_replica_for_testing)"
R_HANDLE_METRICS = (
    "handle metrics going stale (a handle that stops pushing, one on a dead actor): the executor's; on Ray the "
    "controller drops a router silent for 2 intervals and sums the rest into AutoscalingMetrics "
    "(docs/autoscaling.md, 'On Ray'); the core decides from those sums")
R_SCALE_TIMES = (
    "Serve's AutoscalingContext.last_scale_up_time / last_scale_down_time: rankcore's PolicyContext holds "
    "'the parts the core has' (docs/autoscaling.md lists them) and no scale times")
R_TARGET_CAPACITY = (
    "target_capacity: rankcore does not scale by it (docs/operate.md: null or 100 accepted and ignored, any "
    "other value refused)")
R_DRAINING = (
    "replicas on a draining node: Serve starts their replacements elsewhere before the drain's deadline "
    "(PENDING_MIGRATION); the core does not yet: a drain only drains the node's proxy and its replicas are "
    "replaced when the node goes (docs/ray.md, 'Proxies, one a node')")
R_DOCS_PATH = "the FastAPI docs path a replica reports: the Ray executor's HTTP ingress (docs/ray.md, 'HTTP ingress'), not the core's"
R_OUTBOUND = (
    "Serve's graph of which deployments call which (replicas report their outbound deployments) and the "
    "dependency-ordered shutdown built on it: the core holds no call graph")
R_BROADCAST = (
    "Serve's long-poll broadcast bookkeeping (_broadcasted_replicas_set_changed, _request_routing_info_updated): "
    "rankcore tells the request path in the step that changes it (Step.pool, docs/architecture.md, "
    "'control/pool.py'), with nothing held over to a later loop")
R_IN_TRANSITION = (
    "Serve's _in_transition flag (a control loop skips a steady deployment): rankcore does work only in the "
    "step of an event (its fast paths: docs/architecture.md, 'fastpaths.py')")
R_DIRTY_SET = (
    "Serve's dirty-set sweep (which RUNNING replicas its controller health-checks on a loop): the executor "
    "checks each replica every health_check_period_s and reports each outcome (HealthChecked); the core keeps "
    "no sweep")
R_INGRESS_PORTS = "Serve's direct-ingress port bookkeeping (get_ingress_membership_version): rankcore has none"
R_RANK_GATE = (
    "Serve's count of its rank-consistency passes: rankcore decides from its rank table whether a compaction is "
    "due (moves.compaction_due) and reports only the compactions it makes (Step.compactions); a starting "
    "replica holds its ranks from its StartReplica on")
R_NO_RECOVERING = (
    "Serve's RECOVERING state: rankcore has none, a restarted controller takes each replica's phase from its "
    "report in the ControllerRecovered step (docs/embedding.md, 'Controller recovery')")
R_UNINITIALIZED = (
    "a replica alive but never initialised when the controller restarted: Serve kills it and starts another "
    "(no failed start counted); rankcore initialises it where it is (a report 'pending' with its node: the "
    "core sends InitializeReplica, docs/embedding.md, 'Controller recovery'), no failed start counted either")
R_GANG_PG = (
    "Serve reserves a gang's placement group before starting it and counts a failed reservation as a failed "
    "start; rankcore places a gang all or nothing by its gang_placement and a gang that does not fit waits for "
    "room (docs/rollouts.md, 'Successors wait for their gang'; docs/architecture.md, gangs)")
R_GANG_KILLED = (
    "a gang whose member failed to start: Serve stops the rest (STOPPING) and starts no gang until they have "
    "stopped; rankcore kills them (StopReplica with 0 s) and starts the whole new gang in the same step, the "
    "room passed on (docs/architecture.md, 'graceful shutdown' and 'restart backoff' rows)")
R_STATUS_DEFECT = (
    "rankcore defect: a replica replaced after failing its health checks leaves its deployment UPDATING; "
    "Serve's is UNHEALTHY (trigger HEALTH_CHECK_FAILED) until the replacement runs. rankcore's status is "
    "UNHEALTHY only for failed starts and FAILED static ranks (Deployment.status; docs/architecture.md, "
    "'status')")


# ------------------------------------------------------------------------------ TestReplicaStateContainer


@pytest.mark.skip(reason=R_CONTAINER)
class TestReplicaStateContainer:
    def test_count(self):
        pass

    def test_get(self):
        pass

    def test_get_by_id(self):
        pass

    def test_get_by_id_after_remove(self):
        pass

    def test_pop_basic(self):
        pass

    def test_pop_exclude_version(self):
        pass

    def test_pop_max_replicas(self):
        pass

    def test_pop_states(self):
        pass

    def test_pop_integration(self):
        pass


@pytest.mark.skip(reason=R_DEPLOYMENT_ACTORS)
class TestDeploymentActorContainer:
    def test_add_and_count(self):
        pass

    def test_is_empty(self):
        pass

    def test_add_moves_existing(self):
        pass

    def test_get(self):
        pass

    def test_pop(self):
        pass

    def test_pop_by_states(self):
        pass

    def test_pop_all_versions(self):
        pass

    def test_get_wrapper(self):
        pass

    def test_get_code_versions(self):
        pass


@pytest.mark.skip(reason=R_DEPLOYMENT_ACTORS)
class TestDeploymentActorWrapper:
    @pytest.mark.parametrize(
        "deployment_runtime_env,actor_runtime_env,conflicting_keys",
        [("app_name", None, "app_name"), (None, "deployment_and_actor_name", "actor_and_deployment_name"),
         ("code_version", "deployment_name", "code_version_and_deployment_name")],
    )
    def test_start_rejects_reserved_internal_context_env_vars(self, deployment_runtime_env, actor_runtime_env,
                                                                conflicting_keys):
        pass

    def test_properties(self):
        pass

    def test_start_success(self):
        pass

    def test_start_injects_internal_deployment_context_env_vars(self):
        pass

    def test_start_preserves_user_env_vars_when_injecting_internal_context(self):
        pass

    def test_start_failure(self):
        pass

    def test_check_ready_already_ready(self):
        pass

    def test_check_ready_not_started(self):
        pass

    def test_check_ready_ref_not_ready(self):
        pass

    def test_check_ready_ref_ready_then_success(self):
        pass

    def test_check_ready_ref_ready_then_fails(self):
        pass

    def test_kill_with_handle(self):
        pass

    def test_kill_without_handle(self):
        pass

    def test_kill_actor_already_stopped(self):
        pass


# ------------------------------------------------------------------------------ deploy, delete, redeploy


def test_create_delete_single_replica():
    c = Controller()
    c.deploy()
    check_counts(c, total=1, by_state=[(STARTING, 1, ANY)])
    c.tick(1)  # time alone moves nothing while the replica is not ready
    check_counts(c, total=1, by_state=[(STARTING, 1, ANY)])
    assert c.status == "UPDATING"

    rid = c.ids()[0]
    c.ready(rid)
    check_counts(c, total=1, by_state=[(RUNNING, 1, ANY)])
    assert c.status == "HEALTHY"

    c.delete()
    check_counts(c, total=1, by_state=[(STOPPING, 1, ANY)])
    assert isinstance(c.waiting[rid], rc.StopReplica)  # (Serve: its actor was told to stop)
    assert c.status == "UPDATING"

    c.done_stopping(rid)
    assert DEP not in c.state.deployments  # no replica left, and the deployment's record gone with it


@pytest.mark.skip(reason=R_DEAD_REPLICAS)
@pytest.mark.parametrize("allocate_logs, expected_dead", [(True, 1), (False, 0)], ids=["with_logs", "no_logs"])
def test_recent_dead_replicas_retention(allocate_logs, expected_dead):
    pass


@pytest.mark.skip(reason=R_DEAD_REPLICAS)
def test_recent_dead_replicas_bounded():
    pass


def test_force_kill():
    # adapted: Serve's controller force-kills the actor itself once graceful_shutdown_timeout_s has passed,
    # again at every loop until it is gone; rankcore tells the executor once, on StopReplica, how long the
    # drain may last before it kills the process (rankcore/base/commands.py, StopReplica), and sends nothing
    # more: the replica stays STOPPING, its ranks held, until its ReplicaStopped
    grace_period_s = 10
    c = Controller()
    c.deploy(graceful_shutdown_timeout_s=grace_period_s)
    c.ready_all()
    c.delete()
    rid = c.ids()[0]
    check_counts(c, total=1, by_state=[(STOPPING, 1, ANY)])
    stop = c.waiting[rid]
    assert isinstance(stop, rc.StopReplica) and stop.graceful_shutdown_timeout_s == grace_period_s

    for _ in range(10):
        assert c.tick(0.1) == []
    check_counts(c, total=1, by_state=[(STOPPING, 1, ANY)])

    assert c.tick(grace_period_s + 0.1) == []  # the kill is the executor's: nothing repeated
    check_counts(c, total=1, by_state=[(STOPPING, 1, ANY)])
    assert c.status == "UPDATING"

    c.done_stopping(rid)
    assert DEP not in c.state.deployments


def test_redeploy_same_version():
    c = Controller()
    c.deploy(version="1")
    check_counts(c, total=1, by_state=[(STARTING, 1, "1")])
    assert c.status == "UPDATING"

    assert c.deploy(version="1") == []  # while the first deploy is still under way: nothing to do
    assert c.status == "UPDATING"
    check_counts(c, total=1, by_state=[(STARTING, 1, "1")])

    c.ready_all()
    check_counts(c, total=1, by_state=[(RUNNING, 1, "1")])
    assert c.status == "HEALTHY"

    assert c.deploy(version="1") == []  # and once it is done
    check_counts(c, total=1, by_state=[(RUNNING, 1, "1")])
    assert c.status == "HEALTHY"


@pytest.mark.skip(reason=R_NO_VERSION)
def test_redeploy_no_version():
    pass


def test_redeploy_new_version():
    c = Controller()
    c.deploy(version="1")
    check_counts(c, total=1, by_state=[(STARTING, 1, "1")])
    assert c.status == "UPDATING"

    c.deploy(version="2")  # while the first replica still starts
    assert c.status == "UPDATING"
    # adapted: a replica not serving yet is stopped at once and its successor starts once it has stopped
    # (docs/rollouts.md, "The rule"; a surge is for serving replicas): Serve's expectation without the eager
    # start (89497fb); with it, Serve also has the new replica STARTING here
    check_counts(c, total=1, by_state=[(STOPPING, 1, "1")])
    c.done_stopping_all()
    check_counts(c, total=1, by_state=[(STARTING, 1, "2")])
    c.ready_all()
    check_counts(c, total=1, by_state=[(RUNNING, 1, "2")])
    assert c.status == "HEALTHY"

    c.deploy(version="3")  # once the deployment is healthy: the new replica starts beside the old one
    assert c.status == "UPDATING"
    check_counts(c, total=2, by_state=[(STOPPING, 1, "2"), (STARTING, 1, "3")])
    c.done_stopping_all()
    check_counts(c, total=1, by_state=[(STARTING, 1, "3")])
    c.ready_all()
    check_counts(c, total=1, by_state=[(RUNNING, 1, "3")])
    assert c.status == "HEALTHY"


def test_redeploy_different_num_replicas():
    # adapted: Serve's UPSCALING / DOWNSCALING are UPDATING here (docs/metrics.md)
    c = Controller()
    c.deploy(version="1", num_replicas=5)
    check_counts(c, by_state=[(STARTING, 5, "1")])
    assert c.status == "UPDATING"

    c.deploy(version="1", num_replicas=10)  # more replicas while the first five still start
    assert c.status == "UPDATING"
    check_counts(c, by_state=[(STARTING, 10, "1")])
    c.ready_all()
    check_counts(c, by_state=[(RUNNING, 10, "1")])
    assert c.status == "HEALTHY"

    c.deploy(version="1", num_replicas=20)
    assert c.status == "UPDATING"  # (Serve: UPSCALING)
    check_counts(c, by_state=[(STARTING, 10, "1"), (RUNNING, 10, "1")])
    c.ready_all()
    check_counts(c, by_state=[(RUNNING, 20, "1")])
    assert c.status == "HEALTHY"

    c.deploy(version="1", num_replicas=5)
    assert c.status == "UPDATING"  # (Serve: DOWNSCALING)
    check_counts(c, by_state=[(STOPPING, 15, "1"), (RUNNING, 5, "1")])
    c.done_stopping_all()
    check_counts(c, total=5, by_state=[(RUNNING, 5, "1")])
    assert c.status == "HEALTHY"


@pytest.mark.parametrize(
    "option,value",
    [
        ("user_config", {"hello": "world"}),
        ("max_ongoing_requests", 10),
        ("graceful_shutdown_timeout_s", DEFAULT_GRACEFUL_SHUTDOWN_TIMEOUT_S + 1),
        ("graceful_shutdown_wait_loop_s", DEFAULT_GRACEFUL_SHUTDOWN_WAIT_LOOP_S + 1),
        ("health_check_period_s", DEFAULT_HEALTH_CHECK_PERIOD_S + 1),
        ("health_check_timeout_s", DEFAULT_HEALTH_CHECK_TIMEOUT_S + 1),
    ],
)
def test_deploy_new_config_same_code_version(option, value):
    """Deploying a new config with the same code version starts no new replica."""
    c = Controller()
    c.deploy(version="1")
    assert c.status == "UPDATING"
    c.ready_all()
    check_counts(c, total=1, by_state=[(RUNNING, 1, "1")])
    assert c.status == "HEALTHY"
    rid = c.ids()[0]

    commands = c.deploy(version="1", **{option: value})
    assert not [x for x in commands if isinstance(x, (rc.StartReplica, rc.StopReplica))]  # no new replica
    assert getattr(c.dep, option) == value
    if option == "user_config":  # Serve: UPDATING (its actor reconfigured), then RUNNING on v2
        assert c.status == "UPDATING"
        check_counts(c, total=1, by_state=[(UPDATING, 1, "1")])
        assert c.waiting[rid].user_config == value
        c.ready(rid)
    check_counts(c, total=1, by_state=[(RUNNING, 1, "1")])
    assert c.ids() == [rid]
    # adapted: the replica is on the new config. Serve reconfigures its actor for max_ongoing_requests and
    # graceful_shutdown_wait_loop_s too (the replica enforces them); in rankcore the request path holds
    # max_ongoing_requests (docs/requests.md) and each StopReplica carries the shutdown options, so the
    # replica needs no command, and with nothing left to do the deployment is HEALTHY at once (Serve: UPDATING
    # until its next loop)
    assert c.status == "HEALTHY"
    if option.startswith("graceful_shutdown"):
        c.delete()
        assert getattr(c.waiting[rid], option) == value  # the running replica's drain follows the new value
    if option.startswith("health_check"):  # adapted: the deployment's executor is told once, for every replica
        told = [getattr(x, option) for x in c.log
                if hasattr(x, option) and (getattr(x, "replica_id", None) == rid or x.deployment == c.dep.name)]
        assert told[-1] == value, f"the running replica's executor was last told {option}={told[-1]}"
        assert isinstance([x for x in c.log if hasattr(x, option)][-1], rc.UpdateHealthChecks)


def test_deploy_new_config_same_code_version_2():
    """A replica still starting is not reconfigured: it gets the new config once it is ready."""
    c = Controller()
    c.deploy(version="1")
    assert c.status == "UPDATING"
    check_counts(c, total=1, by_state=[(STARTING, 1, "1")])

    assert c.deploy(version="1", user_config={"hello": "world"}) == []
    assert c.status == "UPDATING"
    check_counts(c, total=1, by_state=[(STARTING, 1, "1")])  # STARTING, not UPDATING

    rid = c.ids()[0]
    c.ready(rid)
    check_counts(c, total=1, by_state=[(UPDATING, 1, "1")])
    assert c.waiting[rid].user_config == {"hello": "world"}
    c.ready(rid)
    check_counts(c, total=1, by_state=[(RUNNING, 1, "1")])
    assert c.status == "HEALTHY"


def test_deploy_new_config_new_version():
    c = Controller()
    c.deploy(version="1")
    c.ready_all()
    check_counts(c, total=1, by_state=[(RUNNING, 1, "1")])
    assert c.status == "HEALTHY"

    c.deploy(version="2", user_config={"hello": "world"})
    check_counts(c, total=2, by_state=[(STOPPING, 1, "1"), (STARTING, 1, "2")])
    c.done_stopping_all()
    check_counts(c, total=1, by_state=[(STARTING, 1, "2")])
    assert c.status == "UPDATING"
    new = c.ids(STARTING)[0]
    assert c.waiting[new].user_config == {"hello": "world"}  # the new code starts with the new config
    c.ready(new)
    check_counts(c, total=1, by_state=[(RUNNING, 1, "2")])
    assert c.status == "HEALTHY"


def test_initial_deploy_no_throttling():
    c = Controller()
    c.deploy(num_replicas=10, version="1")
    check_counts(c, total=10, by_state=[(STARTING, 10, "1")])
    assert c.status == "UPDATING"
    c.ready_all()
    check_counts(c, total=10, by_state=[(RUNNING, 10, "1")])
    assert c.status == "HEALTHY"


def _rolls_in_waves_of_two(c: Controller) -> None:
    """Serve's rolling update of ten replicas at 20%: two old replicas stop while two new ones start."""
    check_counts(c, total=12, by_state=[(RUNNING, 8, "1"), (STOPPING, 2, "1"), (STARTING, 2, "2")])

    c.done_stopping(c.ids(STOPPING)[0])  # one old replica gone: nothing new starts (its successor has)
    check_counts(c, total=11, by_state=[(RUNNING, 8, "1"), (STARTING, 2, "2"), (STOPPING, 1, "1")])

    c.ready(c.ids(STARTING)[0])  # one new replica ready: another old one stops, another new one starts
    check_counts(c, total=12, by_state=[(RUNNING, 7, "1"), (RUNNING, 1, "2"), (STARTING, 2, "2"),
                                        (STOPPING, 2, "1")])

    c.done_stopping(c.ids(STOPPING)[0])
    c.ready(c.ids(STARTING)[0])
    new, old = 2, 8
    while old:
        assert c.status == "UPDATING"
        old -= 2
        check_counts(c, total=12, by_state=[(RUNNING, old, "1"), (RUNNING, new, "2"), (STARTING, 2, "2"),
                                            (STOPPING, 2, "1")])
        c.done_stopping(*c.ids(STOPPING)[:2])
        check_counts(c, total=10, by_state=[(RUNNING, old, "1"), (RUNNING, new, "2"), (STARTING, 2, "2")])
        c.ready(*c.ids(STARTING)[:2])
        new += 2
    check_counts(c, total=10, by_state=[(RUNNING, 10, "2")])
    assert c.status == "HEALTHY"


def test_new_version_deploy_throttling_new():
    """The first deploy starts every replica at once; a new version rolls two at a time (20% of ten),
    code version and user_config both changed."""
    c = Controller()
    c.deploy(num_replicas=10, version="1", user_config="1")
    check_counts(c, total=10, by_state=[(STARTING, 10, "1")])
    assert c.status == "UPDATING"
    c.ready_all()
    check_counts(c, total=10, by_state=[(RUNNING, 10, "1")])
    assert c.status == "HEALTHY"

    c.deploy(num_replicas=10, version="2", user_config="2")
    _rolls_in_waves_of_two(c)


def test_reconfigure_throttling():
    """A new user_config reaches the replicas one at a time (20% of two, at least one)."""
    c = Controller()
    c.deploy(num_replicas=2, version="1", user_config="1")
    check_counts(c, total=2, by_state=[(STARTING, 2, "1")])
    c.ready_all()
    check_counts(c, total=2, by_state=[(RUNNING, 2, "1")])
    assert c.status == "HEALTHY"

    c.deploy(num_replicas=2, version="1", user_config="2")
    assert c.status == "UPDATING"
    check_counts(c, total=2, by_state=[(RUNNING, 1, "1"), (UPDATING, 1, "1")])
    first = c.ids(UPDATING)[0]
    assert c.waiting[first].user_config == "2"

    c.ready(first)
    check_counts(c, total=2, by_state=[(RUNNING, 1, "1"), (UPDATING, 1, "1")])
    second = c.ids(UPDATING)[0]
    assert second != first and c.waiting[second].user_config == "2"
    assert c.status == "UPDATING"

    c.ready(second)
    check_counts(c, total=2, by_state=[(RUNNING, 2, "1")])
    assert all(r.config_version == c.dep.config_version for r in c.replicas())
    assert c.status == "HEALTHY"


@pytest.mark.parametrize(
    ("num_replicas", "percentage", "expected_stopping"),
    [(10, 0.5, 5), (10, None, 2), (3, 0.5, 1), (4, 0.2, 1), (10, 0.21, 2), (5, 1.0, 5)],
)
def test_rolling_update_percentage_configurable(num_replicas, percentage, expected_stopping):
    """rolling_update_percentage is max_unavailable: max(1, int(fraction x target)) per wave."""
    pace: dict[str, Any] = {}
    if percentage is not None:
        # adapted: 100% is the count (num_replicas): a fraction is below 1 here (1 reads as one replica)
        pace["max_unavailable"] = num_replicas if percentage == 1.0 else percentage
    c = Controller()
    c.deploy(num_replicas=num_replicas, version="1", **pace)
    c.ready_all()
    check_counts(c, total=num_replicas, by_state=[(RUNNING, num_replicas, "1")])

    c.deploy(num_replicas=num_replicas, version="2", **pace)
    check_counts(c, total=num_replicas + expected_stopping,
                 by_state=[(RUNNING, num_replicas - expected_stopping, "1"), (STOPPING, expected_stopping, "1"),
                           (STARTING, expected_stopping, "2")])


@pytest.mark.skip(reason=R_PACE)
def test_new_version_and_scale_down():
    pass


def test_new_version_and_scale_up():
    """A new version with more replicas: the new ones start at once, on the new version; the old ones roll
    once those are up."""
    c = Controller()
    c.deploy(num_replicas=2, version="1")
    check_counts(c, total=2, by_state=[(STARTING, 2, "1")])
    c.ready_all()
    check_counts(c, total=2, by_state=[(RUNNING, 2, "1")])
    assert c.status == "HEALTHY"

    c.deploy(num_replicas=10, version="2")
    check_counts(c, total=10, by_state=[(RUNNING, 2, "1"), (STARTING, 8, "2")])

    c.ready_all()
    check_counts(c, total=12, by_state=[(RUNNING, 0, "1"), (STOPPING, 2, "1"), (STARTING, 2, "2"),
                                        (RUNNING, 8, "2")])
    c.done_stopping_all()
    check_counts(c, total=10, by_state=[(RUNNING, 8, "2"), (STARTING, 2, "2")])
    c.ready_all()
    check_counts(c, total=10, by_state=[(RUNNING, 10, "2")])
    assert c.status == "HEALTHY"


@pytest.mark.parametrize("target_capacity_direction", ["up", "down"])
def test_scale_num_replicas(target_capacity_direction):
    # adapted: Serve's UPSCALING / DOWNSCALING are UPDATING here (docs/metrics.md)
    c = Controller()
    c.deploy(num_replicas=3, version="x")
    check_counts(c, total=3, by_state=[(STARTING, 3, "x")])
    assert c.status == "UPDATING"
    c.ready_all()
    check_counts(c, total=3, by_state=[(RUNNING, 3, "x")])
    assert c.status == "HEALTHY"

    new_num_replicas = 5 if target_capacity_direction == "up" else 1
    c.deploy(num_replicas=new_num_replicas, version="x")
    assert c.status == "UPDATING"
    if target_capacity_direction == "up":
        check_counts(c, total=5, by_state=[(RUNNING, 3, "x"), (STARTING, 2, "x")])
        c.ready_all()
    else:
        check_counts(c, total=3, by_state=[(RUNNING, 1, "x"), (STOPPING, 2, "x")])
        c.done_stopping_all()
    check_counts(c, total=new_num_replicas, by_state=[(RUNNING, new_num_replicas, "x")])
    assert c.status == "HEALTHY"


# ------------------------------------------------------------------------------ health checks


@pytest.mark.parametrize("force_stop_unhealthy_replicas", [False, True])
def test_health_check(force_stop_unhealthy_replicas: bool):
    c = Controller()
    c.deploy(num_replicas=2, version="1", force_stop_unhealthy_replicas=force_stop_unhealthy_replicas)
    check_counts(c, total=2, by_state=[(STARTING, 2, "1")])
    assert c.status == "UPDATING"
    # no check before it is ready: InitializeReplica tells the executor the period to check it at once ready
    assert {c.waiting[r].health_check_period_s for r in c.ids()} == {DEFAULT_HEALTH_CHECK_PERIOD_S}

    c.ready_all()
    check_counts(c, total=2, by_state=[(RUNNING, 2, "1")])
    assert c.status == "HEALTHY"

    statuses = []  # what the deployment shows while a replica is being replaced (asserted last)
    first = c.ids()[0]
    c.unhealthy(first)
    (stop,) = c.stops()
    assert stop.replica_id == first
    if force_stop_unhealthy_replicas:
        # killed at once (Serve: force_stop), its room given to its successor in the same step
        assert stop.graceful_shutdown_timeout_s == 0
        check_counts(c, total=2, by_state=[(RUNNING, 1, "1"), (STARTING, 1, "1")])
    else:
        assert stop.graceful_shutdown_timeout_s == DEFAULT_GRACEFUL_SHUTDOWN_TIMEOUT_S  # drained
        check_counts(c, total=3, by_state=[(RUNNING, 1, "1"), (STOPPING, 1, "1"), (STARTING, 1, "1")])
        statuses.append(c.status)
        c.done_stopping(first)
        check_counts(c, total=2, by_state=[(RUNNING, 1, "1"), (STARTING, 1, "1")])
    statuses.append(c.status)

    c.ready_all()
    check_counts(c, total=2, by_state=[(RUNNING, 2, "1")])
    assert c.status == "HEALTHY"
    assert statuses == ["UNHEALTHY"] * len(statuses), statuses


@pytest.mark.skip(reason=R_PRIVATE + " (its health gauge's cache)")
def test_health_gauge_caching():
    pass


def test_update_while_unhealthy():
    c = Controller()
    c.deploy(num_replicas=2, version="1")
    check_counts(c, total=2, by_state=[(STARTING, 2, "1")])
    assert c.status == "UPDATING"
    c.ready_all()
    check_counts(c, total=2, by_state=[(RUNNING, 2, "1")])
    assert c.status == "HEALTHY"

    statuses = []  # asserted last
    first = c.ids()[0]
    c.unhealthy(first)
    check_counts(c, total=3, by_state=[(RUNNING, 1, "1"), (STOPPING, 1, "1"), (STARTING, 1, "1")])
    statuses.append(c.status)
    c.done_stopping(first)
    check_counts(c, total=2, by_state=[(RUNNING, 1, "1"), (STARTING, 1, "1")])

    # a new version (a rollback, say) while unhealthy: the replica still starting is stopped, not the
    # running one. adapted: its successor starts once it has stopped (docs/rollouts.md, "The rule"), Serve's
    # expectation without the eager start (89497fb)
    starting = c.ids(STARTING)[0]
    c.deploy(num_replicas=2, version="2")
    check_counts(c, total=2, by_state=[(RUNNING, 1, "1"), (STOPPING, 1, "1")])
    assert c.ids(STOPPING) == [starting]
    assert c.status == "UPDATING"

    # the old version's running replica fails too. adapted: during a rollout an unhealthy replica is killed
    # at once and its successor starts on the new version in the same step (docs/architecture.md, "health
    # checks"); Serve drains it (STOPPING 2 of version 1, and with the eager start STARTING 2 of version 2)
    c.unhealthy(c.ids(RUNNING)[0])
    check_counts(c, total=2, by_state=[(STOPPING, 1, "1"), (STARTING, 1, "2")])
    assert c.status == "UPDATING"  # an old version's failure does not make the deployment UNHEALTHY

    c.done_stopping_all()
    check_counts(c, total=2, by_state=[(STARTING, 2, "2")])
    c.ready_all()
    check_counts(c, total=2, by_state=[(RUNNING, 2, "2")])
    assert c.status == "HEALTHY"
    assert statuses == ["UNHEALTHY"], statuses


# ------------------------------------------------------------------------------ failed starts


def _constructor_failure_loop_two_replica(c: Controller, num_loops: int) -> None:
    """Both replicas' constructors raise, ``num_loops`` times over."""
    for i in range(num_loops):
        c.wait_out_backoff()
        check_counts(c, total=2, by_state=[(STARTING, 2, ANY)])
        assert c.dep.start_failures == i * 2
        c.fail_start(*c.ids())
        # (Serve: the two STOPPING until their actors are gone, two more STARTING; here the two failed are
        # gone and their retries wait or start)
        check_counts(c, total=2, by_state=[(STARTING, 2, ANY)])


@pytest.mark.skip(reason=R_DEPLOY_FAILED)
def test_deploy_with_consistent_constructor_failure():
    pass


def test_deploy_with_partial_constructor_failure():
    """Starts fail past the limit, but a replica has started meanwhile: no failure status, and the
    deployment gets there."""
    # adapted: Serve patches MAX_PER_REPLICA_RETRY_COUNT to 2, a limit of min(20, 2 x 2) = 4 failed starts;
    # here max_constructor_retry_count=4 gives min(4, 3 x 2) = 4
    c = Controller()
    c.deploy(num_replicas=2, max_constructor_retry_count=4)
    assert c.status == "UPDATING"

    _constructor_failure_loop_two_replica(c, 1)
    assert c.status == "UPDATING"
    c.wait_out_backoff()
    check_counts(c, total=2, by_state=[(STARTING, 2, ANY)])
    assert c.dep.start_failures == 2

    replica_1, replica_2 = c.ids()
    c.ready(replica_1)
    c.fail_start(replica_2)  # its replacement is brought up
    c.wait_out_backoff()
    check_counts(c, total=2, by_state=[(RUNNING, 1, ANY), (STARTING, 1, ANY)])

    c.fail_start(c.ids(STARTING)[0])  # Serve's count reaches its limit here, but a replica has started
    # (rankcore counts failed starts in a row: a replica ready resets the count, Deployment.start_failures)
    assert not c.dep.failing_to_start
    assert c.status == "UPDATING"
    c.wait_out_backoff()
    check_counts(c, total=2, by_state=[(RUNNING, 1, ANY), (STARTING, 1, ANY)])

    c.ready_all()
    check_counts(c, total=2, by_state=[(RUNNING, 2, ANY)])
    assert c.status == "HEALTHY"


@pytest.mark.skip(reason=R_PG_INVALID)
def test_deploy_with_placement_group_failure():
    pass


@pytest.mark.skip(reason=R_DEPLOY_FAILED + "; and a gang's reservation: " + R_GANG_PG)
def test_deploy_with_gang_placement_group_failure():
    pass


@pytest.mark.skip(reason=R_DEPLOYMENT_ACTORS)
class TestDeploymentActors:
    def test_deploy_with_deployment_actors_deferred_replica_creation(self):
        pass

    def test_deploy_with_deployment_actor_failure(self):
        pass

    def test_delete_deployment_calls_stop_deployment_actors(self):
        pass

    def test_cleanup_orphaned_deployment_actors_on_version_change(self):
        pass

    def test_deploy_without_deployment_actors_creates_replicas_immediately(self):
        pass

    def test_deployment_actor_start_retry_then_succeed(self):
        pass

    def test_deployment_actor_retry_counter_reset_on_redeploy(self):
        pass

    def test_deployment_actor_terminal_failure(self):
        pass

    def test_deployment_actor_failed_handled_when_already_deploy_failed(self):
        pass

    def test_no_deployment_actors_not_terminally_failed(self):
        pass

    def test_deployment_actor_partial_failure(self):
        pass

    def test_deployment_actor_partial_failure_preserves_running(self):
        pass

    def test_deployment_actor_recovery_from_checkpoint(self):
        pass

    def test_deployment_actor_recovery_get_actor_raises_value_error(self):
        pass

    def test_deployment_actor_multiple_not_ready_until_all_ready(self):
        pass

    def test_deployment_actor_deletion_gate_with_starting(self):
        pass

    def test_deletion_after_version_update_before_new_actors_ready(self):
        pass

    def test_deployment_actor_retry_counter_reset_on_success(self):
        pass

    def test_deployment_actor_start_failure_increments_counter(self):
        pass

    def test_deployment_actor_check_ready_failure_increments_counter(self):
        pass

    def test_deployment_actor_check_health_healthy_stays_running(self):
        pass

    def test_deployment_actor_check_health_unhealthy_kills_and_recreates(self):
        pass

    def test_deployment_actor_reset_health_state_after_running_on_ready(self):
        pass

    def test_deployment_actor_check_health_mixed_two_actors(self):
        pass

    def test_deployment_actors_satisfied_for_target_requires_all_slots_filled(self):
        pass

    def test_deployment_actor_health_check_non_target_kills_without_startup_counter(self):
        pass


def test_deploy_with_transient_constructor_failure():
    """Four failed starts (fewer than min(20, 3 x 2)), then both start: HEALTHY, the count reset."""
    c = Controller()
    c.deploy(num_replicas=2)
    assert c.status == "UPDATING"

    _constructor_failure_loop_two_replica(c, 2)
    assert c.status == "UPDATING"
    assert c.dep.start_failures == 4

    c.wait_out_backoff()
    check_counts(c, total=2, by_state=[(STARTING, 2, ANY)])
    assert c.status == "UPDATING"
    c.ready_all()
    check_counts(c, total=2, by_state=[(RUNNING, 2, ANY)])
    assert c.dep.start_failures == 0
    assert c.status == "HEALTHY"


# ------------------------------------------------------------------------------ controller recovery


def test_recover_state_from_replica_names():
    c = Controller()
    c.deploy(version="1")
    check_counts(c, total=1, by_state=[(STARTING, 1, "1")])
    rid = c.ids()[0]
    c.ready(rid)
    check_counts(c, total=1, by_state=[(RUNNING, 1, "1")])

    new = c.restarted()  # the controller crashed: a new one recovers from the replica's report
    # adapted: no RECOVERING: the replica says it runs version 1 in the recovery step itself
    check_counts(new, total=1, by_state=[(RUNNING, 1, "1")])
    assert not [x for x in new.commands if isinstance(x, (rc.StartReplica, rc.StopReplica))]
    assert new.ids() == [rid]  # the same replica, its process kept
    assert new.status == "HEALTHY"


def test_recover_during_rolling_update():
    """The controller crashed after checkpointing version 2, before it stopped the version 1 replica."""
    c = Controller()
    c.deploy(version="1")
    check_counts(c, total=1, by_state=[(STARTING, 1, "1")])
    old = c.ids()[0]
    c.ready(old)
    check_counts(c, total=1, by_state=[(RUNNING, 1, "1")])

    checkpoint = rc.DeploymentApplied(name=DEP, num_replicas=1, version="2", max_surge=0.2)
    new = c.restarted(deployments=(checkpoint,))
    new.revisions["2"] = new.dep.revision
    # the replica reports version 1: outdated, it is stopped and a version 2 replica started
    check_counts(new, total=2, by_state=[(STOPPING, 1, "1"), (STARTING, 1, "2")])
    new.done_stopping(old)
    check_counts(new, total=1, by_state=[(STARTING, 1, "2")])
    new.ready_all()
    check_counts(new, total=1, by_state=[(RUNNING, 1, "2")])
    assert new.ids() != [old]  # another replica


@pytest.mark.skip(reason=R_UNINITIALIZED)
def test_actor_uninitialized_before_recover():
    pass


def test_actor_died_before_recover():
    c = Controller()
    c.deploy(version="1")
    rid = c.ids()[0]
    c.ready(rid)
    check_counts(c, total=1, by_state=[(RUNNING, 1, "1")])

    new = c.restarted(reports=())  # it died while the controller was down: nobody reports it
    # adapted: Serve has no replica after its recovery and starts one in the next loop; the core starts
    # one for the rank nobody reported in the recovery step
    check_counts(new, total=1, by_state=[(STARTING, 1, "1")])
    assert new.ids() != [rid]


@pytest.mark.skip(reason=R_SHUTDOWN)
def test_shutdown():
    pass


@pytest.mark.skip(reason=R_SHUTDOWN)
def test_shutdown_blocks_deploy():
    pass


@pytest.mark.skip(reason=R_SHUTDOWN)
def test_shutdown_blocks_autoscale():
    pass


@pytest.mark.skip(reason=R_SHUTDOWN)
def test_shutdown_blocks_set_target_num_replicas():
    pass


@pytest.mark.skip(reason=R_SHUTDOWN)
def test_shutdown_does_not_delete_checkpoint():
    pass


@pytest.mark.skip(reason=R_PRIVATE + " (DeploymentReplica.resource_requirements with a None resource)")
def test_resource_requirements_none():
    pass


@pytest.mark.skip(reason=R_RAY + ": gang placement groups leaked by a previous controller")
def test_gang_pg_leak_detection_survives_state_api_failure():
    pass


@pytest.mark.skip(reason=R_RAY + ": gang placement groups leaked by a previous controller")
def test_gang_pg_leak_detection_removes_unoccupied_pg():
    pass


class TestActorReplicaWrapper:
    def test_default_value(self):
        # adapted: the defaults are the options' (rankcore/base/options.py), what a replica's commands carry
        e = rc.DeploymentApplied(name=DEP, num_replicas=1)
        assert e.graceful_shutdown_timeout_s == DEFAULT_GRACEFUL_SHUTDOWN_TIMEOUT_S
        assert e.max_ongoing_requests == DEFAULT_MAX_ONGOING_REQUESTS
        assert e.health_check_period_s == DEFAULT_HEALTH_CHECK_PERIOD_S
        assert e.health_check_timeout_s == DEFAULT_HEALTH_CHECK_TIMEOUT_S
        c = Controller()
        c.deploy()
        init = c.waiting[c.ids()[0]]
        assert (init.health_check_period_s, init.health_check_timeout_s) == (
            DEFAULT_HEALTH_CHECK_PERIOD_S, DEFAULT_HEALTH_CHECK_TIMEOUT_S)
        c.ready_all()
        c.delete()
        assert c.waiting[c.ids()[0]].graceful_shutdown_timeout_s == DEFAULT_GRACEFUL_SHUTDOWN_TIMEOUT_S

    @pytest.mark.skip(reason=R_RAY + ": the actor's max_concurrency")
    def test_max_concurrency_override(self):
        pass


@pytest.mark.skip(reason=R_NODE_QUERIES)
def test_get_active_node_ids():
    pass


@pytest.mark.skip(reason=R_NODE_QUERIES)
def test_get_active_node_ids_none():
    pass


@pytest.mark.skip(reason=R_INGRESS_ROUTER)
def test_get_active_node_ids_excludes_ingress_request_router():
    pass


@pytest.mark.skip(reason=R_NODE_QUERIES)
def test_get_active_node_ids_handles_undeployed_state():
    pass


@pytest.mark.skip(reason=R_INGRESS_ROUTER)
def test_ingress_request_router_pins_one_replica_per_proxy_node():
    pass


@pytest.mark.skip(reason=R_INGRESS_ROUTER)
def test_ingress_request_router_tracks_proxy_node_set():
    pass


@pytest.mark.skip(reason=R_INGRESS_ROUTER)
def test_ingress_request_router_same_size_node_swap():
    pass


@pytest.mark.skip(reason=R_INGRESS_ROUTER)
def test_ingress_request_router_status_reflects_scaling():
    pass


@pytest.mark.skip(reason=R_INGRESS_ROUTER)
def test_ingress_request_router_scaling_only_affects_router():
    pass


@pytest.mark.skip(reason=R_INGRESS_ROUTER)
def test_ingress_request_router_multiple_replicas_per_node():
    pass


@pytest.mark.skip(reason=R_INGRESS_ROUTER)
def test_ingress_request_router_code_version_rollout():
    pass


def test_get_deployment_ids():
    c = Controller()
    assert list(c.state.deployments.keys()) == []
    c.deploy(name=DEP, version="1")
    c.deploy(name=DEP_2, version="2")
    assert sorted(c.state.deployments.keys()) == [DEP, DEP_2]


@pytest.mark.skip(reason=R_NODE_QUERIES)
def test_get_node_id_to_alive_replica_ids():
    pass


@pytest.mark.skip(reason=R_TEST_HOOKS)
def test_dump_replica_states_for_testing():
    pass


@pytest.mark.skip(reason=R_TEST_HOOKS)
def test_stop_one_running_replica_for_testing():
    pass


# ------------------------------------------------------------------------------ autoscaling

#: Serve's autoscaling_config of these cases (rankcore's options have its names)
AUTOSCALING = dict(autoscaling=True, target_ongoing_requests=1, min_replicas=0, max_replicas=6,
                   initial_replicas=3, upscale_delay_s=0, downscale_delay_s=0, metrics_interval_s=100,
                   look_back_period_s=200)


def _metrics(c: Controller, per_replica: int | None = None, queued: int = 0, rids: Iterable[str] = (),
             after: float = 1) -> list:
    """Serve's recorded request metrics and its autoscaling decision: one ``AutoscalingMetrics`` sample,
    ``after`` seconds later (``per_replica`` requests in flight on each of ``rids``, default every running
    one). The core aggregates the samples of its window (``look_back_period_s``): where Serve's new report
    replaces the old one, the sample comes a window later."""
    rids = list(rids) or c.ids(RUNNING)
    ongoing = {} if per_replica is None else {rid: per_replica for rid in rids}
    return c.step(rc.AutoscalingMetrics(deployment=DEP, now=c.state.cluster.now + after, queued=queued,
                                        ongoing=ongoing))


class TestAutoscaling:
    @pytest.mark.parametrize("target_capacity_direction", ["up", "down"])
    def test_basic_autoscaling(self, target_capacity_direction):
        # adapted: UPSCALING / DOWNSCALING are UPDATING (docs/metrics.md); not checked: Serve's status message
        # after 60 s of starting ("have taken more than 30s"), rankcore's says how many of the target run
        c = Controller()
        c.deploy(**AUTOSCALING)
        check_counts(c, total=3, by_state=[(STARTING, 3, ANY)])
        assert c.status == "UPDATING"
        c.ready_all()
        check_counts(c, total=3, by_state=[(RUNNING, 3, ANY)])
        assert c.status == "HEALTHY"

        _metrics(c, per_replica=2 if target_capacity_direction == "up" else 0)
        if target_capacity_direction == "up":
            check_counts(c, total=6, by_state=[(RUNNING, 3, ANY), (STARTING, 3, ANY)])
            assert c.status == "UPDATING"
            c.tick(60)
            check_counts(c, total=6, by_state=[(RUNNING, 3, ANY), (STARTING, 3, ANY)])
            assert c.status == "UPDATING"
            c.ready_all()
        else:
            # two stages: from three to one, then from one to zero
            check_counts(c, total=3, by_state=[(STOPPING, 2, ANY), (RUNNING, 1, ANY)])
            _metrics(c, per_replica=0, rids=c.ids(RUNNING))
            check_counts(c, total=3, by_state=[(STOPPING, 3, ANY)])
            assert c.status == "UPDATING"
            c.done_stopping_all()
        assert c.status == "HEALTHY"
        assert c.dep.target == (6 if target_capacity_direction == "up" else 0)

        c.delete()
        c.done_stopping_all()
        assert DEP not in c.state.deployments

    @pytest.mark.parametrize("target_startup_status", ["PENDING_ALLOCATION", "PENDING_INITIALIZATION"])
    def test_downscaling_reclaiming_starting_replicas_first(self, target_startup_status):
        """A downscale stops the replicas not running yet before running ones (ray#43034)."""
        # adapted: PENDING_ALLOCATION is a replica waiting for its node (pending), PENDING_INITIALIZATION one
        # placed and initialising (starting); not checked: Serve's slow-start status message
        c = Controller()
        c.deploy(**AUTOSCALING)
        check_counts(c, total=3, by_state=[(STARTING, 3, ANY)])
        assert c.status == "UPDATING"
        c.ready_all()
        check_counts(c, total=3, by_state=[(RUNNING, 3, ANY)])
        assert c.status == "HEALTHY"
        running = c.ids(RUNNING)

        c.placing = target_startup_status == "PENDING_INITIALIZATION"
        _metrics(c, per_replica=2)
        check_counts(c, total=6, by_state=[(RUNNING, 3, ANY), (STARTING, 3, ANY)])
        phase = P.PENDING if target_startup_status == "PENDING_ALLOCATION" else P.STARTING
        assert c.count((phase,)) == 3
        assert c.status == "UPDATING"
        c.tick(60)
        check_counts(c, total=6, by_state=[(RUNNING, 3, ANY), (STARTING, 3, ANY)])

        new = sorted(set(c.ids()) - set(running), key=_number)
        _metrics(c, per_replica=1, rids=running, after=AUTOSCALING["look_back_period_s"])  # three wanted again
        assert c.ids(RUNNING) == running  # none of the running replicas is stopped
        assert c.count(STARTING) == 0
        assert sorted((x.replica_id for x in c.stops()), key=_number) == new  # the three not running
        check_counts(c, total=6, by_state=[(RUNNING, 3, ANY), (STOPPING, 3, ANY)])
        assert c.status == "UPDATING"
        c.done_stopping_all()
        check_counts(c, total=3, by_state=[(RUNNING, 3, ANY)])
        assert c.status == "HEALTHY"

    def test_update_autoscaling_config(self):
        c = Controller()
        options = {**AUTOSCALING, "metrics_interval_s": 10, "look_back_period_s": 30}
        c.deploy(version="1", **options)
        c.ready_all()
        check_counts(c, total=3, by_state=[(RUNNING, 3, ANY)])
        assert c.status == "HEALTHY"

        _metrics(c, per_replica=1)  # one request each: as many replicas as now
        check_counts(c, total=3, by_state=[(RUNNING, 3, ANY)])
        assert c.status == "HEALTHY"

        c.deploy(version="1", **{**options, "min_replicas": 6, "max_replicas": 10, "initial_replicas": None})
        check_counts(c, total=6, by_state=[(RUNNING, 3, ANY), (STARTING, 3, ANY)])
        assert c.status == "UPDATING"
        c.ready_all()
        check_counts(c, total=6, by_state=[(RUNNING, 6, ANY)])
        assert c.status == "HEALTHY"

    @pytest.mark.skip(reason=R_DEPLOY_FAILED)
    def test_replicas_fail_during_initial_scale_from_zero(self):
        pass

    def test_replicas_fail_during_subsequent_scale_from_zero(self):
        """A version that ran before scales from zero and its starts keep failing: UNHEALTHY after three
        failures, and it keeps retrying."""
        c = Controller()
        c.deploy(**{**AUTOSCALING, "max_replicas": 2, "initial_replicas": 1})
        check_counts(c, total=1, by_state=[(STARTING, 1, ANY)])
        assert c.status == "UPDATING"
        c.ready_all()
        check_counts(c, total=1, by_state=[(RUNNING, 1, ANY)])
        assert c.status == "HEALTHY"

        _metrics(c, per_replica=0)  # no traffic: down to zero
        check_counts(c, total=1, by_state=[(STOPPING, 1, ANY)])
        c.done_stopping_all()
        check_counts(c, total=0)

        _metrics(c, queued=1)  # a request waits: back up
        for i in range(10):
            c.wait_out_backoff()
            check_counts(c, total=1, by_state=[(STARTING, 1, ANY)])
            # (Serve: UPSCALING, trigger AUTOSCALING, then UNHEALTHY, REPLICA_STARTUP_FAILED)
            assert c.status == ("UPDATING" if i < 3 else "UNHEALTHY")
            c.fail_start(c.ids()[0])
            check_counts(c, total=1, by_state=[(STARTING, 1, ANY)])  # retried (Serve: and one STOPPING)

    @pytest.mark.skip(reason=R_HANDLE_METRICS)
    def test_handle_metrics_timeout(self):
        pass

    @pytest.mark.skip(reason=R_HANDLE_METRICS)
    def test_handle_metrics_on_dead_serve_actor(self):
        pass

    @pytest.mark.skip(reason=R_SCALE_TIMES)
    def test_autoscaling_timestamps(self):
        pass


@pytest.mark.skip(reason=R_TARGET_CAPACITY)
class TestTargetCapacity:
    @pytest.mark.parametrize(
        "num_replicas,target_capacity,expected_output",
        [(10, None, 10), (10, 100, 10), (10, 99, 10), (10, 50, 5), (10, 1, 1), (10, 0, 0), (10, 25, 3),
         (1, None, 1), (1, 100, 1), (1, 1, 1), (1, 0, 0), (1, 23, 1), (3, 20, 1), (3, 40, 1), (3, 70, 2),
         (3, 90, 3), (0, None, 0), (0, 1, 0), (0, 99, 0), (0, 100, 0)],
    )
    def test_get_capacity_adjusted_num_replicas(self, num_replicas, target_capacity, expected_output):
        pass

    def test_initial_deploy(self):
        pass

    def test_target_capacity_100_no_effect(self):
        pass

    def test_target_capacity_0(self):
        pass

    def test_reduce_target_capacity(self):
        pass

    def test_increase_target_capacity(self):
        pass

    def test_clear_target_capacity(self):
        pass

    def test_target_num_replicas_is_zero(self):
        pass

    def test_target_capacity_with_changing_num_replicas(self):
        pass


@pytest.mark.skip(reason=R_DRAINING)
class TestStopReplicasOnDrainingNodes:
    def test_draining_start_then_stop_replica(self):
        pass

    def test_draining_stop_replica_before_deadline(self):
        pass

    def test_draining_multiple_nodes(self):
        pass

    def test_replicas_unhealthy_on_draining_node(self):
        pass

    def test_starting_replica_on_draining_node(self):
        pass

    def test_in_place_update_during_draining(self):
        pass


@pytest.mark.skip(reason=R_DOCS_PATH)
def test_docs_path_not_updated_for_different_version():
    pass


# ------------------------------------------------------------------------------ set_target_num_replicas


def test_set_target_num_replicas_api():
    c = Controller()
    c.deploy(version="1", num_replicas=1)
    check_counts(c, total=1, by_state=[(STARTING, 1, "1")])
    assert c.dep.target == 1

    c.scale(3)
    assert c.dep.target == 3
    check_counts(c, total=3, by_state=[(STARTING, 3, "1")])


def test_set_target_num_replicas_nonexistent_deployment():
    c = Controller()
    # adapted: Serve's ValueError "Deployment ... not found" is rankcore's InvalidEvent naming it
    with pytest.raises(rc.InvalidEvent, match="unknown deployment 'nonexistent'"):
        c.scale(3, name="nonexistent")


@pytest.mark.xfail(strict=True, raises=AssertionError, reason=(
    "rankcore defect: an upscale during a surge rollout moves a rank. The draining predecessor holds a spare "
    "global rank (2, the lowest free for the target of 2); the scale to 5 starts the new replicas on ranks "
    "3, 4 and 5 (StartReplica global_rank=5 with world_size=5, outside 0..4); once the drain ends, compaction "
    "moves rank 5 to 2 (ReconfigureReplica reason='rank'), so one replica is RECONFIGURING where Serve's five "
    "are RUNNING. README: 'new replicas get the lowest free rank ...; upscaling never moves a rank'"))
def test_set_target_num_replicas_during_upgrade():
    """Scaling up in the middle of a rolling update: the new replicas are of the new version."""
    c = Controller()
    c.deploy(version="1", num_replicas=2)
    check_counts(c, total=2, by_state=[(STARTING, 2, "1")])
    assert c.dep.target == 2
    c.ready_all()
    check_counts(c, total=2, by_state=[(RUNNING, 2, "1")])

    c.deploy(version="2", num_replicas=2)
    check_counts(c, total=3, by_state=[(STARTING, 1, "2"), (RUNNING, 1, "1"), (STOPPING, 1, "1")])
    assert c.dep.target == 2

    def dsm_update(answering: dict[str, Any]) -> None:
        """Serve's loop after the mocked actors answered: those that were stopping stop, those that were
        starting are ready (Serve acts on a new target in the loop after the answers it got before)."""
        c.done_stopping(*[r for r, x in answering.items() if isinstance(x, rc.StopReplica)])
        c.ready(*[r for r, x in answering.items() if isinstance(x, rc.InitializeReplica)])

    before = dict(c.waiting)
    c.scale(5)  # the core acts on it at once: the three new replicas start, on the new version
    assert c.dep.target == 5
    dsm_update(before)
    check_counts(c, total=5, by_state=[(STARTING, 3, "2"), (RUNNING, 1, "1"), (RUNNING, 1, "2")])

    dsm_update(dict(c.waiting))
    check_counts(c, total=6, by_state=[(STARTING, 1, "2"), (RUNNING, 4, "2"), (STOPPING, 1, "1")])

    dsm_update(dict(c.waiting))
    check_counts(c, total=5, by_state=[(RUNNING, 5, "2")])
    assert c.dep.target == 5


def test_set_target_num_replicas_deleting_deployment():
    c = Controller()
    c.deploy(version="v1", num_replicas=2)
    check_counts(c, total=2, by_state=[(STARTING, 2, "v1")])
    c.delete()
    assert c.dep.deleting  # (Serve: status trigger DELETING)
    # adapted: Serve's DeploymentIsBeingDeletedError is rankcore's InvalidEvent naming the deletion
    with pytest.raises(rc.InvalidEvent, match="being deleted"):
        c.scale(3)


# ------------------------------------------------------------------------------ ranks


class TestDeploymentRankManagerIntegrationE2E:
    def test_scaling_up_and_down_scenario(self):
        c = Controller()
        c.deploy(num_replicas=3, version="1")
        check_counts(c, total=3, by_state=[(STARTING, 3, "1")])
        c.ready_all()
        check_counts(c, total=3, by_state=[(RUNNING, 3, "1")])
        assert c.status == "HEALTHY"
        assert c.ranks() == [0, 1, 2]

        c.deploy(num_replicas=2, version="1")
        check_counts(c, total=3, by_state=[(RUNNING, 2, "1"), (STOPPING, 1, "1")])
        c.done_stopping_all()
        check_counts(c, total=2, by_state=[(RUNNING, 2, "1")])
        assert c.status == "HEALTHY"
        assert c.ranks() == [0, 1]  # (Serve: after its rank-consistency pass, one loop later)

        c.deploy(num_replicas=3, version="1")
        check_counts(c, total=3, by_state=[(RUNNING, 2, "1"), (STARTING, 1, "1")])
        c.ready_all()
        check_counts(c, total=3, by_state=[(RUNNING, 3, "1")])
        assert c.status == "HEALTHY"
        assert c.ranks() == [0, 1, 2]

    def test_controller_recovery_with_scattered_ranks(self):
        c = Controller()
        c.deploy(num_replicas=3, version="1")
        c.ready_all()
        check_counts(c, total=3, by_state=[(RUNNING, 3, "1")])

        new = c.restarted()
        check_counts(new, total=3, by_state=[(RUNNING, 3, "1")])  # (Serve: RECOVERING until ready)
        assert new.status == "HEALTHY"
        assert new.ranks() == [0, 1, 2]
        assert {r: new.dep.rank_of(r) for r in new.ids()} == {r: c.dep.rank_of(r) for r in c.ids()}

    def test_rank_recovery_after_lightweight_reconfigure(self):
        """A user_config change reconfigures in place with the whole rank record, which a recovering
        controller gets back from each replica (ray#64636's 'int' object has no attribute 'rank')."""
        c = Controller()
        c.deploy(num_replicas=3, version="1", user_config="1")
        check_counts(c, total=3, by_state=[(STARTING, 3, "1")])
        c.ready_all()
        check_counts(c, total=3, by_state=[(RUNNING, 3, "1")])

        c.deploy(num_replicas=3, version="1", user_config="2")
        for _ in range(10):
            c.ready_all(UPDATING)
        check_counts(c, total=3, by_state=[(RUNNING, 3, "1")])
        reconfigures = [x for x in c.log if isinstance(x, rc.ReconfigureReplica)]
        assert sorted(x.replica_id for x in reconfigures) == c.ids()
        for x in reconfigures:
            assert isinstance(x.rank, rc.ReplicaRank) and x.rank == c.dep.rank_of(x.replica_id)

        new = c.restarted()
        check_counts(new, total=3, by_state=[(RUNNING, 3, "1")])
        for rid in c.ids():
            assert new.dep.rank_of(rid) == c.dep.rank_of(rid), f"rank of {rid} not recovered"
        assert new.ranks() == [0, 1, 2]

    def test_complex_reassignment_scenario(self):
        c = Controller()
        c.deploy(num_replicas=4, version="1")
        check_counts(c, total=4, by_state=[(STARTING, 4, "1")])
        c.ready_all()
        check_counts(c, total=4, by_state=[(RUNNING, 4, "1")])

        # the replicas report very scattered ranks to a recovering controller: 0, 3, 7, 10
        event = reports_from(c.state)
        scattered = tuple(attrs.evolve(report, rank=rc.ReplicaRank(rank=rank, node_rank=0, local_rank=i))
                          for i, (report, rank) in enumerate(zip(event.reports, (0, 3, 7, 10))))
        new = c.restarted(reports=scattered)
        # adapted: Serve recovers them RUNNING, then its next loop reassigns; rankcore compacts in the
        # recovery step, with the fewest moves (7 and 10 move, 0 and 3 stay), each moved replica told once
        (compaction,) = new.steps[0].compactions
        assert sorted((m.old.rank, m.new.rank) for m in compaction.changes) == [(7, 1), (10, 2)]
        new.ready_all(UPDATING)
        check_counts(new, total=4, by_state=[(RUNNING, 4, "1")])
        assert new.status == "HEALTHY"
        assert new.ranks() == [0, 1, 2, 3]

    def test_rank_consistency_during_version_rollout(self):
        c = Controller()
        c.deploy(num_replicas=3, version="1")
        check_counts(c, total=3, by_state=[(STARTING, 3, "1")])
        c.ready_all()
        check_counts(c, total=3, by_state=[(RUNNING, 3, "1")])
        assert c.status == "HEALTHY"
        assert c.ranks() == [0, 1, 2]

        c.deploy(num_replicas=3, version="2")
        for _ in range(20):
            c.ready_all(STARTING)
            c.done_stopping_all()
            if c.count(RUNNING, "2") == 3 and c.count() == 3:
                break
        check_counts(c, total=3, by_state=[(RUNNING, 3, "2")])
        assert c.status == "HEALTHY"
        assert c.ranks() == [0, 1, 2]

    def test_rank_assignment_with_replica_failures(self):
        c = Controller()
        c.deploy(num_replicas=3, version="1")
        check_counts(c, total=3, by_state=[(STARTING, 3, "1")])
        first, second, third = c.ids()
        c.ready(first, second)
        c.fail_start(third)
        assert c.count(RUNNING) == 2
        # adapted: the failed replica is gone (Serve: STOPPING until its actor is), and its replacement,
        # the first failure, starts at once on its rank
        assert c.count(STARTING) == 1

        c.ready_all()
        running = c.ids(RUNNING)
        assert len(running) == 3
        assert {c.dep.ranks.global_rank(r) for r in running} == {0, 1, 2}

    @pytest.mark.skip(reason=(
        "Serve's rank manager asked to recover a rank it already holds (_fail_on_rank_error): rankcore rebuilds "
        "every rank from the reports in the one ControllerRecovered step, with no per-replica recovery to repeat"))
    def test_rank_recovery_skips_when_already_assigned(self):
        pass


@pytest.mark.skip(reason=R_OUTBOUND)
class TestGetOutboundDeployments:
    def test_basic_outbound_deployments(self):
        pass

    def test_deployment_state_manager_returns_none_for_nonexistent_deployment(self):
        pass

    def test_returns_none_if_replicas_are_not_running(self):
        pass

    def test_only_considers_replicas_matching_target_version(self):
        pass


@pytest.mark.skip(reason=R_BROADCAST)
def test_broadcast_skips_work_when_replicas_unchanged():
    pass


@pytest.mark.skip(reason=R_BROADCAST)
def test_broadcast_runs_when_routing_info_updated():
    pass


@pytest.mark.skip(reason=R_BROADCAST)
def test_broadcasted_replicas_set_changed_flag_set_on_state_transitions():
    pass


@pytest.mark.skip(reason=R_BROADCAST)
def test_broadcasted_replicas_set_changed_flag_set_on_lightweight_broadcast_config_update():
    pass


def test_broadcast_deferred_while_replicas_recovering():
    """After a controller restart the request path learns the whole set of running replicas at once,
    never a part of it (ray#62728)."""
    c = Controller()
    c.deploy(num_replicas=3, version="1")
    c.ready_all()
    check_counts(c, total=3, by_state=[(RUNNING, 3, "1")])
    assert c.status == "HEALTHY"

    new = c.restarted()
    check_counts(new, total=3, by_state=[(RUNNING, 3, "1")])
    # adapted: Serve holds its broadcast while replicas are RECOVERING and sends the three once all are
    # RUNNING; rankcore's recovery step tells the request path the deployment's whole pool in one PoolReset
    (recovery,) = new.steps
    resets = [x for x in recovery.pool if isinstance(x, rc.PoolReset) and x.deployment == DEP]
    assert len(resets) == 1 and sorted(resets[0].serving) == sorted(c.ids()) and resets[0].draining == ()
    assert not [x for x in recovery.pool if isinstance(x, rc.PoolChanged) and x.deployment == DEP]


@pytest.mark.skip(reason=R_IN_TRANSITION)
def test_in_transition_cleared_at_steady_state():
    pass


@pytest.mark.skip(reason=R_IN_TRANSITION)
def test_in_transition_skips_expensive_methods():
    pass


@pytest.mark.skip(reason=R_IN_TRANSITION)
def test_in_transition_set_on_health_check_failure():
    pass


@pytest.mark.skip(reason=R_IN_TRANSITION)
def test_in_transition_set_on_target_state_change():
    pass


@pytest.mark.skip(reason=R_BROADCAST + " (routing stats a replica reports)")
def test_routing_stats_change_triggers_broadcast():
    pass


@pytest.mark.skip(reason=R_DRAINING)
def test_pending_migration_prevents_in_transition_clear():
    pass


# ------------------------------------------------------------------------------ gangs


def _gangs(starts: Iterable[rc.StartReplica]) -> dict[str, list[rc.StartReplica]]:
    """The StartReplicas by gang, each gang's members in gang-rank order."""
    gangs: dict[str, list[rc.StartReplica]] = {}
    for s in starts:
        assert s.gang is not None
        gangs.setdefault(s.gang.gang_id, []).append(s)
    return {g: sorted(ms, key=lambda s: s.gang.rank_in_gang) for g, ms in gangs.items()}


class TestIsGangDeploymentProperty:
    @pytest.mark.parametrize(
        "gang_scheduling_config, expected_value",
        [pytest.param(2, True, id="gang"), pytest.param(None, False, id="non-gang")],
    )
    def test_is_gang_deployment(self, gang_scheduling_config, expected_value):
        # adapted: Serve's GangSchedulingConfig(gang_size=2) is rankcore's gang_size option
        c = Controller()
        c.deploy(num_replicas=2, **({"gang_size": gang_scheduling_config} if gang_scheduling_config else {}))
        assert (c.dep.gang_size > 1) is expected_value
        assert all((s.gang is not None) is expected_value for s in c.started())


class TestScaleDeploymentGangReplicas:
    @pytest.mark.skip(reason=R_GANG_KILLED)
    def test_stopping_replicas_skip_upscale(self):
        pass

    @pytest.mark.skip(reason=R_GANG_PG)
    def test_gang_reservation_failure_records_startup_failure(self):
        pass

    def test_successful_gang_reservation(self):
        gang_size, num_gangs = 2, 2
        c = Controller()
        c.deploy(num_replicas=gang_size * num_gangs, version="v1", gang_size=gang_size)
        check_counts(c, total=4, by_state=[(STARTING, 4, "v1")])
        gangs = _gangs(c.started())
        assert len(gangs) == num_gangs
        for gang_id, members in gangs.items():
            ids = tuple(m.replica_id for m in members)
            assert [m.gang.rank_in_gang for m in members] == list(range(gang_size))
            for m in members:
                assert m.gang.gang_id == gang_id and m.gang.gang_size == gang_size and m.gang.members == ids
        c.ready_all()
        check_counts(c, total=4, by_state=[(RUNNING, 4, "v1")])
        assert c.status == "HEALTHY"

    def test_gang_sibling_cleanup_on_startup_failure(self):
        """One member fails to start: its whole gang goes (no partial gang), the other gang is untouched."""
        c = Controller()
        c.deploy(num_replicas=4, version="v1", gang_size=2)
        before = {s.replica_id: s.gang for s in c.started()}
        failed, surviving = _gangs(c.started()).values()

        c.ready(failed[1].replica_id)
        c.fail_start(failed[0].replica_id)
        gone = {m.replica_id for m in failed}
        assert not gone & set(c.ids())
        # adapted: the sibling is killed (0 s) and the new gang starts in the same step (Serve: the failed
        # gang STOPPING 2, its successor once they have stopped)
        assert [x.replica_id for x in c.stops()] == [failed[1].replica_id]
        assert c.stops()[0].graceful_shutdown_timeout_s == 0
        (new_gang,) = _gangs(c.started()).values()
        assert len(new_gang) == 2
        for m in surviving:  # the surviving gang: same replicas, same gang context, still starting
            assert c.state.replica(m.replica_id).phase is P.STARTING
            assert before[m.replica_id] == m.gang
        check_counts(c, total=4, by_state=[(STARTING, 4, "v1")])

        c.ready_all()
        check_counts(c, total=4, by_state=[(RUNNING, 4, "v1")])
        assert c.status == "HEALTHY"

    def test_gang_startup_failure_per_gang_counter(self):
        """A gang that fails to start counts one failed start, not one per member."""
        # adapted: Serve patches MAX_PER_REPLICA_RETRY_COUNT to 2 for a limit of min(10, 2 x 2) = 4; here
        # max_constructor_retry_count=4 gives min(4, 3 x 2) = 4
        c = Controller()
        c.deploy(num_replicas=2, version="v1", max_constructor_retry_count=4, gang_size=2)

        for cycle in range(1, 3):
            c.wait_out_backoff()
            c.fail_start(*c.ids(STARTING))  # both members fail
            c.done_stopping_all()
            assert c.dep.start_failures == cycle
            assert c.status == "UPDATING"
        assert not c.dep.failing_to_start

    @pytest.mark.skip(reason=R_DEPLOY_FAILED)
    def test_terminally_failed_deployment_skips_gang_reservation(self):
        pass

    def test_gang_downscale_stops_complete_gangs(self):
        c = Controller()
        c.deploy(num_replicas=4, version="v1", gang_size=2)
        c.ready_all()
        check_counts(c, total=4, by_state=[(RUNNING, 4, "v1")])
        assert c.status == "HEALTHY"
        gang_of = {s.replica_id: s.gang.gang_id for s in c.log if isinstance(s, rc.StartReplica)}

        c.deploy(num_replicas=2, version="v1", gang_size=2)
        stopping, running = c.ids(STOPPING), c.ids(RUNNING)
        assert len(stopping) == 2 and len(running) == 2
        assert len({gang_of[r] for r in stopping}) == 1 and len({gang_of[r] for r in running}) == 1
        assert {gang_of[r] for r in stopping} != {gang_of[r] for r in running}

        c.done_stopping_all()
        check_counts(c, total=2, by_state=[(RUNNING, 2, "v1")])
        assert c.status == "HEALTHY"

    def test_gang_downscale_prefers_pending_gang(self):
        # Serve stops the gang with a member still starting. rankcore stops whole gangs from the top ranks
        # whichever holds it (docs/architecture.md, "downscale (moves.stop)": nothing to compact after); this
        # case passes as Serve wrote it because its pending member is in the second (top) gang
        c = Controller()
        c.deploy(num_replicas=4, version="v1", gang_size=2)
        gang_1, gang_2 = _gangs(c.started()).values()
        c.ready(*[m.replica_id for m in gang_1], gang_2[0].replica_id)
        check_counts(c, total=4, by_state=[(RUNNING, 3, "v1"), (STARTING, 1, "v1")])

        c.deploy(num_replicas=2, version="v1", gang_size=2)
        assert c.ids(STOPPING) == [m.replica_id for m in gang_2]
        assert c.ids(RUNNING) == [m.replica_id for m in gang_1]

        c.done_stopping_all()
        check_counts(c, total=2, by_state=[(RUNNING, 2, "v1")])
        assert c.status == "HEALTHY"


def _deploy_gang(gang_size: int, num_replicas: int) -> tuple[Controller, list[list[str]]]:
    """A gang deployment, HEALTHY; its gangs' members, gang by gang."""
    c = Controller()
    c.deploy(num_replicas=num_replicas, version="1", gang_size=gang_size)
    check_counts(c, total=num_replicas, by_state=[(STARTING, num_replicas, "1")])
    gangs = [[m.replica_id for m in members] for members in _gangs(c.started()).values()]
    c.ready_all()
    check_counts(c, total=num_replicas, by_state=[(RUNNING, num_replicas, "1")])
    assert c.status == "HEALTHY"
    return c, gangs


class TestGangHealthCheck:
    @pytest.mark.parametrize("force_stop_unhealthy", [True, False])
    def test_restart_gang_entire_gang_stopped(self, force_stop_unhealthy):
        """A member fails its health checks: its whole gang is killed, whatever force_stop_unhealthy_replicas
        says; the healthy gang is untouched."""
        c = Controller()
        c.deploy(num_replicas=4, version="1", gang_size=2, force_stop_unhealthy_replicas=force_stop_unhealthy)
        target, healthy = ([m.replica_id for m in ms] for ms in _gangs(c.started()).values())
        c.ready_all()
        assert c.status == "HEALTHY"

        c.unhealthy(target[0])
        stops = c.stops()
        assert sorted(x.replica_id for x in stops) == sorted(target)
        assert {x.graceful_shutdown_timeout_s for x in stops} == {0}  # (Serve: force_stopped_counter == 1)
        # adapted: killed, the gang's room goes to the new gang in the same step (Serve: STOPPING 2, then
        # STARTING 2 once stopped)
        check_counts(c, total=4, by_state=[(RUNNING, 2, "1"), (STARTING, 2, "1")])
        assert c.ids(RUNNING) == healthy
        status, message = c.status, c.dep.status_message

        c.ready_all()
        check_counts(c, total=4, by_state=[(RUNNING, 4, "1")])
        assert c.status == "HEALTHY"
        assert status == "UNHEALTHY" and "UNHEALTHY" in message, (status, message)

    def test_restart_gang_multiple_unhealthy_gang_replicas(self):
        """Both members of a gang unhealthy: each is stopped once."""
        c, (target, healthy) = _deploy_gang(gang_size=2, num_replicas=4)
        for rid in target:
            c.unhealthy(rid)
        assert sorted(x.replica_id for x in c.log if isinstance(x, rc.StopReplica)) == sorted(target)
        check_counts(c, total=4, by_state=[(RUNNING, 2, "1"), (STARTING, 2, "1")])
        assert c.ids(RUNNING) == healthy
        status = c.status

        c.ready_all()
        check_counts(c, total=4, by_state=[(RUNNING, 4, "1")])
        assert c.status == "HEALTHY"
        assert status == "UNHEALTHY", status

    def test_restart_gang_multiple_gangs_failing(self):
        c, (failed_0, failed_1, surviving) = _deploy_gang(gang_size=2, num_replicas=6)
        c.unhealthy(failed_0[0])
        c.unhealthy(failed_1[0])
        stopped = [x for x in c.log if isinstance(x, rc.StopReplica)]
        assert sorted(x.replica_id for x in stopped) == sorted(failed_0 + failed_1)
        assert {x.graceful_shutdown_timeout_s for x in stopped} == {0}
        check_counts(c, total=6, by_state=[(RUNNING, 2, "1"), (STARTING, 4, "1")])
        assert c.ids(RUNNING) == surviving
        status = c.status

        c.ready_all()
        check_counts(c, total=6, by_state=[(RUNNING, 6, "1")])
        assert c.status == "HEALTHY"
        assert status == "UNHEALTHY", status


class TestGangRollingUpdate:
    @staticmethod
    def _deploy_gang(gang_size: int, num_replicas: int) -> Controller:
        c = Controller()
        c.deploy(version="v1", num_replicas=num_replicas, gang_size=gang_size)
        c.ready_all()
        assert c.status == "HEALTHY"
        return c

    @staticmethod
    def _advance_wave(c: Controller) -> None:
        """One wave: the stopping members stop (their gang's successors start, whole), then start."""
        c.done_stopping_all()
        c.ready_all(STARTING)

    def test_gang_pg_removed_only_after_last_member_stops(self):
        """A gang shares one reservation: the first member out must not free it under its sibling."""
        # adapted: the placement group is the executor's; in the core the gang's room and ranks are held until
        # its last member has stopped: the new gang starts then, whole (docs/rollouts.md, "Successors wait for
        # their gang")
        c = self._deploy_gang(2, 4)
        c.deploy(version="v2", num_replicas=4, gang_size=2)
        first, last = c.ids(STOPPING)

        c.done_stopping(first)
        assert c.started() == []  # its sibling still drains
        c.done_stopping(last)
        started = c.started()
        assert len(started) == 2 and len(_gangs(started)) == 1

    def test_stop_gang_atomically(self):
        c = self._deploy_gang(2, 4)
        gang_of = {s.replica_id: s.gang.gang_id for s in c.log if isinstance(s, rc.StartReplica)}
        c.deploy(version="v2", num_replicas=4, gang_size=2)

        stopping = c.ids(STOPPING)  # the first wave: exactly one gang
        assert len(stopping) == 2 and len({gang_of[r] for r in stopping}) == 1
        assert c.count(STOPPING, "v1") == 2

        self._advance_wave(c)
        assert c.count(STOPPING, "v1") == 2  # the second old gang

        self._advance_wave(c)
        check_counts(c, total=4, by_state=[(RUNNING, 4, "v2")])
        assert c.status == "HEALTHY"

    def test_rollout_size_rounding(self):
        """gang_size 3 of 9: 20% is one replica, rounded up to one whole gang of three."""
        c = self._deploy_gang(3, 9)
        gang_of = {s.replica_id: s.gang.gang_id for s in c.log if isinstance(s, rc.StartReplica)}
        c.deploy(version="v2", num_replicas=9, gang_size=3)
        stopping = c.ids(STOPPING)
        assert len(stopping) == 3 and len({gang_of[r] for r in stopping}) == 1

        for _ in range(3):
            self._advance_wave(c)
        check_counts(c, total=9, by_state=[(RUNNING, 9, "v2")])
        assert c.status == "HEALTHY"

    def test_reconfigure(self):
        """A config change alone reconfigures in place: nothing stops."""
        c = self._deploy_gang(2, 4)
        c.deploy(version="v1", num_replicas=4, gang_size=2, user_config={"key": "new_value"})
        assert c.count(STOPPING) == 0
        assert c.count(RUNNING) + c.count(UPDATING) == 4

    def test_starting_replicas(self):
        """v1, then v2, then v3 while v2's first gang still starts: those are stopped."""
        c = self._deploy_gang(2, 4)
        c.deploy(version="v2", num_replicas=4, gang_size=2)
        c.done_stopping_all()
        assert c.count(STARTING, "v2") == 2

        c.deploy(version="v3", num_replicas=4, gang_size=2)
        assert c.count(STOPPING, "v2") == 2
        check_counts(c, total=4, by_state=[(RUNNING, 2, "v1"), (STOPPING, 2, "v2")])

        c.done_stopping_all()  # the first wave: v3's gang starts; the v1 gang waits for it
        assert c.count(STARTING, "v3") == 2
        assert c.count(STOPPING) == 0

        c.ready_all()  # the second: v3's first gang runs, the v1 gang stops
        assert c.count(RUNNING, "v3") == 2
        assert c.count(STOPPING) == 2

        c.done_stopping_all()  # the third
        c.ready_all()
        check_counts(c, total=4, by_state=[(RUNNING, 4, "v3")])
        assert c.status == "HEALTHY"

    def test_multi_gang_stop_per_wave(self):
        c = self._deploy_gang(2, 20)
        gang_of = {s.replica_id: s.gang.gang_id for s in c.log if isinstance(s, rc.StartReplica)}
        c.deploy(version="v2", num_replicas=20, gang_size=2)
        stopping = c.ids(STOPPING)
        assert len(stopping) == 4  # max(1, int(0.2 x 20)) = 4: two gangs
        assert len({gang_of[r] for r in stopping}) == 2

    @pytest.mark.skip(reason=R_NO_RECOVERING)
    def test_recovering_member_skips_gang_update(self):
        pass


@pytest.mark.skip(reason=R_DRAINING)
class TestGangDraining:
    def test_entire_gang_migration(self):
        pass

    def test_partial_node_drain_migrates_entire_gang(self):
        pass

    def test_gang_recovery_when_node_stops_draining(self):
        pass

    def test_starting_replicas_stopped(self):
        pass

    def test_gang_excess_migration_stops_complete_gangs(self):
        pass


@pytest.mark.skip(reason=R_INGRESS_PORTS)
def test_ingress_membership_version_bumps_on_add_and_removal():
    pass


@pytest.mark.skip(reason=R_INGRESS_PORTS)
def test_ingress_membership_version_ignores_non_ingress_deployment():
    pass


@pytest.mark.skip(reason=R_DIRTY_SET)
class TestDirtySet:
    def test_covers_all_running_within_one_sweep(self):
        pass

    def test_sweep_fraction_sizes_the_window(self):
        pass

    def test_always_polls_outstanding(self):
        pass

    def test_always_includes_pending_migration(self):
        pass

    def test_active_set_is_sublinear(self):
        pass

    def test_outstanding_excluded_when_no_longer_running(self):
        pass

    def test_outstanding_dropped_when_replica_removed(self):
        pass

    def test_sweep_period_is_min_of_health_and_routing(self):
        pass


@pytest.mark.skip(reason=R_DIRTY_SET)
def test_dirty_set_gauge_prunes_ids_no_longer_running():
    pass


@pytest.mark.skip(reason=R_OUTBOUND)
class TestShutdownDeletionTiers:
    def test_linear_chain(self):
        pass

    def test_diamond(self):
        pass

    def test_cycle_appended_as_final_tier(self):
        pass

    def test_ingress_into_cycle(self):
        pass

    def test_unknown_outbound_positioned_by_callers(self):
        pass

    def test_isolated_unknown_node_in_first_tier(self):
        pass

    def test_multi_app_independent(self):
        pass

    def test_cross_app_chain(self):
        pass

    def test_no_deployments(self):
        pass


@pytest.mark.skip(reason=R_OUTBOUND)
class TestDependencyOrderedShutdown:
    def test_linear_chain_delete_order(self):
        pass

    def test_diamond_leaf_last(self):
        pass

    def test_cycle_completes(self):
        pass

    def test_unknown_outbound_completes(self):
        pass

    def test_multi_app_independent(self):
        pass

    def test_cross_app_chain_delete_order(self):
        pass

    def test_wedged_tier_still_completes(self):
        pass


@pytest.mark.skip(reason=R_OUTBOUND)
def test_shutdown_tiers_survive_application_reconcile():
    pass


@pytest.mark.skip(reason=R_OUTBOUND)
def test_cross_app_shutdown_survives_application_reconcile():
    pass


@pytest.mark.skip(reason=R_RANK_GATE)
class TestRankConsistencyMembershipGate:
    def test_skips_while_membership_unchanged(self):
        pass

    def test_reruns_when_a_replica_leaves(self):
        pass

    def test_starting_replicas_skip_the_pass(self):
        pass


@pytest.mark.parametrize("aggregation_function, expected", [("max", 8), ("min", 2)])
def test_aggregation_function_reaches_builtin_metrics(aggregation_function, expected):
    """max and min reduce the requests in flight over the window, not only a mean."""
    seen: list[float] = []

    def recording(ctx: rc.PolicyContext) -> int:  # Serve's total for the deployment, as a policy sees it
        seen.append(ctx.total_requests)
        return ctx.target

    rc.register_policy("serve_parity_recording", recording, replace=True)
    c = Controller()
    c.deploy(autoscaling=True, target_ongoing_requests=1, min_replicas=1, max_replicas=6,
             aggregation_function=aggregation_function, policy="serve_parity_recording")
    c.ready_all()
    (rid,) = c.ids(RUNNING)
    _metrics(c, per_replica=8, rids=[rid])  # (Serve: one report holding both values, at t=1 and t=2)
    _metrics(c, per_replica=2, rids=[rid])
    assert seen[-1] == expected
