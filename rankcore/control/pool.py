"""Each deployment's request pool as the control core holds it, pushed to the request path (issue 22).

The request path (``rankcore.requests``, in a handle or an HTTP proxy) must
send requests only to replicas that serve, and must learn at once when one
starts draining or is gone, so that what it held is requeued or retried.
Polling the controller for that (Ray Serve's long poll, NDIF's state sync)
lags; here the core says it, in the step that changes it (in ``Step.pool``,
apart from the replicas' ``Step.commands``):

* ``PoolChanged(replica, membership)`` when a replica's membership changes:
  ``serving`` (``residency.serving``: running, HOT, holding the deployment's
  weights version, nothing pending), ``draining`` (alive past its start but
  not serving: stopping, asleep, waiting for weights), ``gone`` (stopped,
  crashed, lost; or never ready). A replica that becomes draining without
  ever having served is not announced (the request path holds nothing of
  it); its ``gone`` may be, and is ignored by a request path that never held it.
* ``PoolComing(deployment, coming)`` when whether the deployment wants
  replicas changes (its target above zero, or autoscaled and able to scale
  up from zero): with none serving and none coming, waiting requests fail at
  once instead of waiting for nothing.
* ``PoolReset`` for every deployment after ``ControllerRecovered``: the whole
  pool, since the request path may have missed changes while the controller
  was down.
* ``ReplicaModels(replica, model_ids)``: the multiplexed models a replica in the
  pool holds (``Replica.models``, from its ``ModelsReported``), when a report
  changes them, when it joins the pool holding some, and after a recovery.

One function decides, after any step (``announce``; ``core.general_step`` calls
it, and the fast paths (``rankcore.fastpaths``) call ``answer_pool``, the same comparison
for the one replica their answer can move, from the records they hold, so they need no copy of the rule). It compares the replicas the step can have changed: the event's replica,
every replica a command names (a replica leaves serving only through a
command: stop, evict, offload, new weights, reconfigure) or replaces, every
replica of the deployment a deployment's own event names (apply, scale,
sleep, wake, push, bundles) when the step changed its replica records or its
weights version (an autoscaling sample that scales nothing looks at none), and for a node's event (lost, joined, capacity:
rare, and wide: a lost node may end a static group's replicas on others)
every replica. The property suite
checks that the pool these commands describe is the core's own after every
step (``rankcore.testing``).

Internal module: import its public names from ``rankcore`` (docs/embedding.md,
"What you may import").
"""

from __future__ import annotations

from typing import Any

from ..base.commands import PoolChanged, PoolComing, PoolReset, ReplicaModels
from ..base.events import ControllerRecovered, ModelsReported, NodeCapacityChanged, NodeJoined, NodeLost
from ..base.lifecycle import Phase
from ..base.records import maker
from ..base.state import Deployment, Replica, State, Step
from ..tiers.residency import serving
from .autoscaling import bounds

__all__ = ["SERVING", "DRAINING", "GONE", "membership", "coming", "announce", "answer_pool", "reset", "pool_of", "PoolView"]

SERVING, DRAINING, GONE = "serving", "draining", "gone"
#: alive past its start: may hold requests (when it is not serving, it finishes them and takes no new ones)
_HOLDING = (Phase.RUNNING, Phase.RECONFIGURING, Phase.STOPPING)
_Changed, _Coming, _Step = maker(PoolChanged), maker(PoolComing), maker(Step)


def membership(dep: Deployment | None, rep: Replica | None) -> str:
    """Where ``rep`` stands in its deployment's pool (module docstring)."""
    if dep is None or rep is None:
        return GONE
    if serving(dep, rep):
        return SERVING
    return DRAINING if rep.phase in _HOLDING else GONE


def coming(dep: Deployment | None) -> bool:
    """Whether ``dep`` wants replicas (so a request may wait for one): its target is above
    zero, or it is autoscaled and may scale up (at zero, the request waiting is what brings a
    replica back: rankcore.control.autoscaling's cold start); not while it is being deleted,
    nor while its starts keep failing (``Deployment.failing_to_start``: Serve's DEPLOY_FAILED,
    whose requests are answered 503 at once; it keeps retrying, and a replica that starts
    makes it coming again)."""
    if dep is None or dep.failing_to_start:
        return False
    if dep.target > 0:
        return True
    return dep.config.autoscaler.autoscaling and not dep.deleting and bounds(dep.config, dep.max_replicas)[1] > 0


def pool_of(dep: Deployment) -> tuple[tuple[str, ...], tuple[str, ...]]:
    """(serving, draining) replica ids of ``dep``, in rank order."""
    s: list[tuple[int, str]] = []
    d: list[tuple[int, str]] = []
    for rid, rep in dep.replicas.items():
        m = membership(dep, rep)
        if m is not GONE:
            (s if m is SERVING else d).append((dep.ranks.global_rank(rid), rid))
    return tuple(r for _, r in sorted(s)), tuple(r for _, r in sorted(d))


def reset(state: State) -> list[PoolReset | ReplicaModels]:
    """A ``PoolReset`` per deployment of ``state``, in name order, each followed by the
    ``ReplicaModels`` of its pool's replicas that hold multiplexed models."""
    out: list[PoolReset | ReplicaModels] = []
    for name in sorted(state.deployments):
        dep = state.deployments[name]
        s, d = pool_of(dep)
        out.append(PoolReset(deployment=name, serving=s, draining=d, coming=coming(dep)))
        out.extend(_models_of(dep.replicas[rid]) for rid in (*s, *d) if dep.replicas[rid].models)
    return out


def _models_of(rep: Replica) -> ReplicaModels:
    """What the request path is told of ``rep``'s multiplexed models (``Replica.models``)."""
    return ReplicaModels(deployment=rep.deployment, replica_id=rep.replica_id, model_ids=rep.models)


def _models_reported(before: State, after: State, rid: str) -> ReplicaModels | None:
    """A replica's report of its models: told to the request path when it changed them and the
    replica is in a pool (one that is not is told when it joins: ``_joined``)."""
    n0, n1 = before.index.get(rid), after.index.get(rid)
    rep0 = before.deployments[n0].replicas.get(rid) if n0 is not None else None
    dep1 = after.deployments.get(n1) if n1 is not None else None
    rep1 = dep1.replicas.get(rid) if dep1 is not None else None
    if rep1 is None or rep0 is None or rep0.models == rep1.models or membership(dep1, rep1) is GONE:
        return None
    return _models_of(rep1)


def _joined(changed: PoolChanged, rep1: Replica | None) -> ReplicaModels | None:
    """The models of a replica that ``changed`` brings into its pool holding some (None: none)."""
    if rep1 is None or not rep1.models or changed.membership == GONE:
        return None
    return _models_of(rep1)


def _candidates(before: State, after: State, event: object, commands: tuple) -> list[str]:
    """The replicas ``event``'s step can have moved in or out of a pool, in a fixed order."""
    seen: dict[str, None] = {}
    rid = getattr(event, "replica_id", None)
    if type(rid) is str:
        seen[rid] = None
    for c in commands:
        r = getattr(c, "replica_id", None)
        if type(r) is str:
            seen[r] = None
        r = getattr(c, "replaces", None)
        if type(r) is str:
            seen[r] = None
    kind = type(event)
    if kind in _NODE_EVENTS:  # (rare, and wide: a node's loss may end a static group's replicas elsewhere)
        for name in sorted(before.deployments):
            seen.update(dict.fromkeys(before.deployments[name].replicas))
    else:
        field = _NAMES.get(kind)
        if field is None:
            field = _name_field(kind)
        name = getattr(event, field) if field else None
        dep = before.deployments.get(name) if type(name) is str else None
        if dep is not None and _moved(dep, after.deployments.get(name)):
            # a deployment's own event (scale, apply, sleep, push, bundles) that changed its replicas or the
            # weights version they must hold: all of them
            seen.update(dict.fromkeys(dep.replicas))
    return list(seen)


def _switched(before: State, after: State, rid: str) -> list[str]:
    """Every replica of ``rid``'s deployment when the step changed its blue-green standing (the last
    green ready switches the pool; the last blue gone lets the greens serve), else none."""
    name = before.index.get(rid)
    dep0 = before.deployments.get(name) if name is not None else None
    if dep0 is None or not dep0.blues:
        return []
    dep1 = after.deployments.get(name)
    if dep1 is not None and dep1.blues == dep0.blues:
        return []
    return sorted({*dep0.replicas, *(dep1.replicas if dep1 is not None else ())})


def _moved(dep0: Deployment, dep1: Deployment | None) -> bool:
    """Whether a replica of ``dep0`` can stand elsewhere in its pool in ``dep1`` (the same deployment
    after the step): not when the step kept the same replica records (the same map), the same
    weights version and the same blue-green standing (``blues``), the deployment's own fields that
    membership reads. An autoscaling sample that scales nothing is such a step: its cost does not
    grow with the deployment."""
    return (dep1 is None or dep1.replicas is not dep0.replicas or dep1.weights_version != dep0.weights_version
            or dep1.blues != dep0.blues)


#: event type -> the field naming its deployment ("" when it names none): looked up once per type
_NAMES: dict[type, str] = {}
#: the node events: a step of one looks at every replica (they are rare, and their effects wide)
_NODE_EVENTS = frozenset({NodeLost, NodeJoined, NodeCapacityChanged})


def _name_field(kind: type) -> str:
    got = _NAMES.get(kind)
    if got is None:
        fields = getattr(kind, "__attrs_attrs__", ())
        names = {a.name for a in fields}
        got = _NAMES[kind] = "deployment" if "deployment" in names else "name" if "name" in names else ""
    return got


def _change(before: State, after: State, rid: str) -> PoolChanged | None:
    """The ``PoolChanged`` for ``rid`` between ``before`` and ``after``; None when its membership
    is the same (or it went from gone to draining: a replica that never served is not announced)."""
    n0, n1 = before.index.get(rid), after.index.get(rid)
    dep0 = before.deployments.get(n0) if n0 is not None else None
    dep1 = after.deployments.get(n1) if n1 is not None else None
    rep0 = dep0.replicas.get(rid) if dep0 is not None else None
    rep1 = dep1.replicas.get(rid) if dep1 is not None else None
    return _change_of(rid, dep0, rep0, dep1, rep1)


def _change_of(rid: str, dep0: Deployment | None, rep0: Replica | None, dep1: Deployment | None,
              rep1: Replica | None) -> PoolChanged | None:
    """``_change`` from the records already at hand: ``rid``'s deployment and record before and after
    (None: not held)."""
    if rep0 is rep1 and (dep0 is dep1 or (dep0.weights_version == dep1.weights_version  # type: ignore[union-attr]
                                          and dep0.blues == dep1.blues)):  # type: ignore[union-attr]
        return None  # (the same record, the same version wanted, the same blue-green standing: the same membership)
    m0, m1 = membership(dep0, rep0), membership(dep1, rep1)
    if m0 is m1 or (m0 is GONE and m1 is DRAINING):
        return None
    return _Changed(deployment=(dep1 or dep0).name, replica_id=rid, membership=m1)  # type: ignore[union-attr]


def answer_pool(rid: str, dep0: Deployment, rep0: Replica, dep1: Deployment,
                rep1: Replica | None) -> tuple[PoolChanged | ReplicaModels, ...]:
    """``announce``'s pool commands for the step of a replica's own answer (ready, crashed, stopped)
    that moved no replica but ``rid`` between pools: what ``rankcore.fastpaths`` take, before they
    build their ``Step``, from the records they hold (``rid``'s deployment and record before and
    after; None: gone), so nothing is looked up (a crash's replacement is pending, in no pool), and
    whether the deployment wants replicas changed (``coming``: its starts failing, or no longer).
    The property suite checks the fast paths give ``announce``'s step (tests/property/test_fast_paths.py)."""
    changed = _change_of(rid, dep0, rep0, dep1, rep1)
    # (a fast path changes no target, config or deletion: only a start that failed, or one that ended a run
    # of failures, can change ``coming``; the property suite checks the fast paths give ``announce``'s step)
    came: tuple = ()
    if dep0.start_failures != dep1.start_failures and coming(dep0) is not coming(dep1):
        came = (_Coming(deployment=dep1.name, coming=coming(dep1)),)
    if changed is None:
        return came
    models = _joined(changed, rep1)
    return ((changed,) if models is None else (changed, models)) + came


def announce(before: State, event: object, step: Step) -> Step:
    """``step`` (from ``before`` by ``event``) with the pool commands it implies (``Step.pool``)."""
    after = step.state
    kind = type(event)
    if kind is ControllerRecovered:
        return _Step(state=after, commands=step.commands, stale=step.stale, compactions=step.compactions,
                     recovery=step.recovery, pool=tuple(reset(after)))
    out: list[Any] = []
    commands = step.commands
    rid = getattr(event, "replica_id", None)
    if not commands and kind not in _NODE_EVENTS and not _name_field(kind):  # (the commonest: an answer)
        candidates: list[str] = [rid] if type(rid) is str else []
    else:
        candidates = _candidates(before, after, event, commands)
    switched = _switched(before, after, rid) if type(rid) is str else None
    if switched:
        candidates = list(dict.fromkeys([*candidates, *switched]))
    for rid in candidates:
        changed = _change(before, after, rid)
        if changed is not None:
            out.append(changed)
            if changed.membership != GONE:  # (no lookup for one that left)
                models = _joined(changed, after.replica(rid))
                if models is not None:
                    out.append(models)
    field = _NAMES.get(kind)
    if field is None:
        field = _name_field(kind)
    if field:
        names: Any = (getattr(event, field),)
    elif type(rid) is str and not commands:  # (a replica's answer: its own deployment's starts)
        names = (after.index.get(rid) or before.index.get(rid),)
    else:  # (a Tick's start deadline, a node's loss, a crash's general path: the deployments the step changed)
        b = before.deployments
        names = [n for n, d in after.deployments.items() if b.get(n) is not d]
    for name in names:
        if type(name) is str:
            c0, c1 = coming(before.deployments.get(name)), coming(after.deployments.get(name))
            if c0 is not c1:
                out.append(_Coming(deployment=name, coming=c1))
    if kind is ModelsReported:
        models = _models_reported(before, after, event.replica_id)  # type: ignore[attr-defined]
        if models is not None:
            out.append(models)
    if not out:
        return step
    return _Step(state=after, commands=commands, stale=step.stale, compactions=step.compactions,
                 recovery=step.recovery, pool=tuple(out))


class PoolView:
    """The pools as the pool commands describe them, for whoever follows them without the core's
    state (an executor's status page, the property suite's check that they describe the core's
    pools). Not thread-safe; apply the commands in the order the core emitted them."""

    __slots__ = ("members", "wanted", "models")

    def __init__(self) -> None:
        #: deployment -> replica id -> "serving" | "draining" (gone ones are dropped)
        self.members: dict[str, dict[str, str]] = {}
        #: deployment -> whether replicas are coming (PoolComing / PoolReset)
        self.wanted: dict[str, bool] = {}
        #: replica id -> the multiplexed models it holds (ReplicaModels; dropped when it is gone)
        self.models: dict[str, tuple[str, ...]] = {}

    def apply(self, cmd: object) -> bool:
        """Take one command; False if it is not a pool command (ignored)."""
        kind = type(cmd)
        if kind is PoolChanged:
            pool = self.members.setdefault(cmd.deployment, {})  # type: ignore[attr-defined]
            if cmd.membership == GONE:  # type: ignore[attr-defined]
                pool.pop(cmd.replica_id, None)  # type: ignore[attr-defined]
                self.models.pop(cmd.replica_id, None)  # type: ignore[attr-defined]
            else:
                pool[cmd.replica_id] = cmd.membership  # type: ignore[attr-defined]
        elif kind is PoolComing:
            self.wanted[cmd.deployment] = cmd.coming  # type: ignore[attr-defined]
        elif kind is PoolReset:
            for rid in (*self.members.get(cmd.deployment, {}), *cmd.serving, *cmd.draining):  # type: ignore[attr-defined]
                self.models.pop(rid, None)  # (told again after it: ReplicaModels)
            self.members[cmd.deployment] = {**dict.fromkeys(cmd.draining, DRAINING),  # type: ignore[attr-defined]
                                            **dict.fromkeys(cmd.serving, SERVING)}  # type: ignore[attr-defined]
            self.wanted[cmd.deployment] = cmd.coming  # type: ignore[attr-defined]
        elif kind is ReplicaModels:
            self.models[cmd.replica_id] = cmd.model_ids  # type: ignore[attr-defined]
        else:
            return False
        return True

    def serving(self, deployment: str) -> list[str]:
        return sorted(r for r, m in self.members.get(deployment, {}).items() if m == SERVING)

    def mismatch(self, state: State) -> str | None:
        """How this view differs from ``state``'s pools (None: it does not). The serving replicas and
        ``coming`` must be the same; a draining replica the view holds must be alive and not serving
        (the core does not announce one that never served)."""
        names = set(state.deployments) | {n for n, p in self.members.items() if p} | {n for n, c in self.wanted.items() if c}
        for name in sorted(names):
            dep = state.deployments.get(name)
            s, d = pool_of(dep) if dep is not None else ((), ())
            view = self.members.get(name, {})
            told_s = sorted(r for r, m in view.items() if m == SERVING)
            told_d = {r for r, m in view.items() if m == DRAINING}
            if told_s != sorted(s):
                return f"{name}: serving told {told_s}, the core's {sorted(s)}"
            if not told_d <= set(d):
                return f"{name}: draining told {sorted(told_d)}, the core's {sorted(d)}"
            if self.wanted.get(name, False) is not coming(dep):
                return f"{name}: coming told {self.wanted.get(name, False)}, the core's {coming(dep)}"
            for rid in view:
                rep = dep.replicas.get(rid) if dep is not None else None
                if rep is not None and self.models.get(rid, ()) != rep.models:
                    return f"{name}: {rid}'s models told {self.models.get(rid, ())}, the core's {rep.models}"
        return None
