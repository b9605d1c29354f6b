"""The timeline's actions, one typed record per kind, and their interpreter, one copy for both executors.

Each action class holds in one place its YAML key, its parsing (``parse``,
every error pinned on the key that is wrong), its meaning (``perform``: which
deployment spec it leaves desired, what a recovering controller recovers
with, and the effect it asks of an executor's ``Target``), whether it needs
the controller up (``needs_controller``) and whether it only passes time
(``waits``). ``ACTIONS`` (YAML key -> class) is the one list the parser,
``plan``, the docs and both executors read.

*When* an action runs and *how* an effect is carried out are the executor's:
the simulator runs actions in virtual time on its simulated cluster, the Ray
scenario runner in wall time on real actors. Waits (``Wait``,
``WaitUntilHealthy``) are clock matters and stay with each executor.

This module imports nothing of ``format`` (which imports it): what parsing
needs of the file is ``Checks``, what the meaning needs of a declared
deployment is ``Declared``.
"""

from __future__ import annotations

import enum
from collections.abc import Iterable, Mapping
from typing import Any, ClassVar, Protocol

import attrs

import rankcore as rc

__all__ = ["ACTIONS", "Action", "Deploy", "Scale", "Delete", "UpdateConfig", "Rollout", "Crash", "Hang", "LoseNode", "AddNode",
           "CrashController", "PlaceBundles", "Orphan", "Sleep", "Wake", "PushWeights", "WaitUntilHealthy",
           "WaitUntilServing", "Wait", "AS_DECLARED", "Checks", "Declared", "Desired", "Target", "Planned", "plan",
           "rank_holder", "check_weights_versions"]


class _AsDeclared(enum.Enum):
    AS_DECLARED = "as declared"


#: a ``deploy`` that gives no ``user_config``: the deployment's declared one (None is a config too)
AS_DECLARED = _AsDeclared.AS_DECLARED


class Declared(Protocol):
    """What the timeline reads of a declared deployment (``format.DeploymentSpec``)."""

    @property
    def name(self) -> str: ...

    @property
    def static(self) -> rc.StaticPlacement | None: ...

    def applied(self, **changes: Any) -> rc.DeploymentApplied:
        """Its ``DeploymentApplied``, with ``replicas`` / ``user_config`` changed."""


class Checks(Protocol):
    """What parsing an action asks of the scenario parser (``format._ActionChecks``):
    each check returns the value or raises a ``ScenarioError`` pinned on ``path``."""

    @property
    def declared(self) -> Mapping[str, Declared]:
        """The deployments the file declares, by name."""

    def fail(self, path: tuple, message: str, *, at_key: bool = False) -> Exception: ...

    def mapping(self, value: Any, path: tuple, allowed: tuple | None = None, required: tuple = ()) -> dict: ...

    def count(self, value: Any, path: tuple) -> int: ...

    def number(self, value: Any, path: tuple) -> float: ...

    def name(self, value: Any, path: tuple) -> str: ...

    def deployment(self, value: Any, path: tuple) -> str:
        """The name of a declared deployment."""

    def replicas(self, value: Any, deployment: str, path: tuple) -> int:
        """A replica count within the deployment's ``max_replicas``."""

    def show(self, value: Any) -> str:
        """A value as an error message quotes it."""


# ------------------------------------------------------------------ records
@attrs.frozen(kw_only=True)
class Action:
    """One timeline entry: ``index`` (its place in the file), ``at`` / ``after``
    (when it runs), ``where`` (file:line). Subclasses add the action's own
    arguments and say what it is: its YAML ``key``, whether it ``needs_controller``
    (the others happen to the cluster and run while the controller is down),
    whether it only ``waits``."""

    key: ClassVar[str]
    needs_controller: ClassVar[bool] = True
    waits: ClassVar[bool] = False

    index: int = 0
    at: float | None = None
    after: float | None = None
    where: str = ""

    @classmethod
    def parse(cls, value: Any, path: tuple, c: Checks) -> Action:
        """The action from its YAML value (``path``: where that value is)."""
        raise NotImplementedError

    def perform(self, desired: Desired, target: Target) -> None:
        """Carry the action out through ``target`` (not a wait's: each executor waits its own way)."""
        raise ValueError(f"{self.key} is not performed: waits are the executor's")

    def nodes_needed(self) -> tuple[tuple[tuple, str], ...]:
        """The nodes it names that must exist (in the cluster, or added by an ``add_node``),
        each with its path below the action's key."""
        return ()


@attrs.frozen(kw_only=True)
class Deploy(Action):
    """Apply the deployment as declared, or with its replica count and/or ``user_config`` given here."""

    key: ClassVar[str] = "deploy"

    deployment: str
    replicas: int | None = None  # None: as declared
    user_config: Any = attrs.field(default=AS_DECLARED, hash=False)

    @classmethod
    def parse(cls, value: Any, path: tuple, c: Checks) -> Deploy:
        if isinstance(value, str):
            return cls(deployment=c.deployment(value, path))
        m = c.mapping(value, path, ("deployment", "replicas", "user_config"), required=("deployment",))
        name = c.deployment(m["deployment"], path + ("deployment",))
        replicas = c.replicas(m["replicas"], name, path + ("replicas",)) if "replicas" in m else None
        return cls(deployment=name, replicas=replicas, user_config=m.get("user_config", AS_DECLARED))

    def perform(self, desired: Desired, target: Target) -> None:
        target.apply(desired.deploy(self))


@attrs.frozen(kw_only=True)
class Scale(Action):
    """Change the target replica count (``victims``: replica ids to stop first); scaling
    a deployment never deployed deploys it, at that size."""

    key: ClassVar[str] = "scale"

    deployment: str
    replicas: int
    victims: tuple[str, ...] = ()

    @classmethod
    def parse(cls, value: Any, path: tuple, c: Checks) -> Scale:
        m = c.mapping(value, path, ("deployment", "replicas", "victims"), required=("deployment", "replicas"))
        victims = m.get("victims", [])
        if not isinstance(victims, list) or not all(isinstance(x, str) for x in victims):
            raise c.fail(path + ("victims",), f"must be a list of replica ids, got {c.show(victims)}")
        name = c.deployment(m["deployment"], path + ("deployment",))
        return cls(deployment=name, replicas=c.replicas(m["replicas"], name, path + ("replicas",)),
                   victims=tuple(victims))

    def perform(self, desired: Desired, target: Target) -> None:
        event = desired.scale(self)
        if target.deployed(event.name):
            target.scale(event.name, self.replicas, self.victims)
        else:  # never deployed: the scale deploys it, at that size
            target.apply(event)


def _one_deployment(value: Any, path: tuple, c: Checks) -> str:
    """An action that names one deployment: ``<name>`` or ``{deployment: <name>}``."""
    if not isinstance(value, str):
        value = c.mapping(value, path, ("deployment",), required=("deployment",))["deployment"]
        path = path + ("deployment",)
    return c.deployment(value, path)


@attrs.frozen(kw_only=True)
class Delete(Action):
    """Delete one deployment (``DeploymentDeleted``; Ray Serve's ``serve.delete``): its
    replicas drain and stop, requests still waiting for it fail, the others are untouched.
    A later ``deploy`` (or ``scale``) of it deploys it anew."""

    key: ClassVar[str] = "delete"

    deployment: str

    @classmethod
    def parse(cls, value: Any, path: tuple, c: Checks) -> Delete:
        return cls(deployment=_one_deployment(value, path, c))

    def perform(self, desired: Desired, target: Target) -> None:
        desired.delete(self.deployment)
        target.delete(self.deployment)


@attrs.frozen(kw_only=True)
class UpdateConfig(Action):
    """Redeploy with a new ``user_config``."""

    key: ClassVar[str] = "update_config"

    deployment: str
    user_config: Any = attrs.field(hash=False)

    @classmethod
    def parse(cls, value: Any, path: tuple, c: Checks) -> UpdateConfig:
        m = c.mapping(value, path, ("deployment", "user_config"), required=("deployment", "user_config"))
        return cls(deployment=c.deployment(m["deployment"], path + ("deployment",)), user_config=m["user_config"])

    def perform(self, desired: Desired, target: Target) -> None:
        target.apply(desired.update_config(self))


#: a rollout's pace and way, options of the deployment (``rollout:`` may set them for that rollout)
_PACE = ("max_unavailable", "max_surge", "update_mode")


@attrs.frozen(kw_only=True)
class Rollout(Action):
    """Redeploy with a new code ``version`` (a heavyweight change): every replica is replaced, each by one
    on its ranks, at most ``max_unavailable`` short at once and ``max_surge`` above the target
    (rankcore.control.rollouts), or a whole new set first with ``update_mode: blue_green``
    (rankcore.control.bluegreen)."""

    key: ClassVar[str] = "rollout"

    deployment: str
    version: str
    max_unavailable: int | float | None = None
    max_surge: int | float | None = None
    update_mode: str | None = None

    @classmethod
    def parse(cls, value: Any, path: tuple, c: Checks) -> Rollout:
        m = c.mapping(value, path, ("deployment", "version", *_PACE), required=("deployment", "version"))
        version = m["version"]
        if not isinstance(version, (str, int, float)) or isinstance(version, bool) or not str(version):
            raise c.fail(path + ("version",), f"must be a version name (text or a number), got {version!r}")
        for key in _PACE:  # checked by the option's own rule (rankcore.base.options.RolloutOptions)
            if m.get(key) is not None:
                try:
                    rc.DeploymentConfig.of({key: m[key]})
                except rc.InvalidConfig as exc:
                    raise c.fail(path + (key,), str(exc).split(f".{key} ", 1)[-1]) from None
        return cls(deployment=c.deployment(m["deployment"], path + ("deployment",)), version=str(version),
                   max_unavailable=m.get("max_unavailable"), max_surge=m.get("max_surge"),
                   update_mode=m.get("update_mode"))

    def perform(self, desired: Desired, target: Target) -> None:
        target.apply(desired.rollout(self))


def _one_form(action: _Hit, attribute: Any, value: Any) -> None:
    if (action.replica is None) == (action.deployment is None or action.rank is None):
        raise ValueError(f"{action.key}: a replica, or a deployment and a rank")


@attrs.frozen(kw_only=True)
class _Hit(Action):
    """An action on one replica: ``replica`` (an id), or the live holder of ``rank`` in
    ``deployment`` (``rank_holder``); nothing matching is a passing line, not an error."""

    needs_controller: ClassVar[bool] = False

    replica: str | None = None
    deployment: str | None = None
    rank: int | None = attrs.field(default=None, validator=_one_form)

    @classmethod
    def parse(cls, value: Any, path: tuple, c: Checks) -> _Hit:
        m = c.mapping(value, path, ("replica", "deployment", "rank"))
        if "replica" in m:
            if "rank" in m:
                raise c.fail(path, "name a 'replica', or a 'deployment' and 'rank', not both")
            return cls(replica=c.name(m["replica"], path + ("replica",)))
        if "deployment" not in m or "rank" not in m:
            raise c.fail(path, "needs 'replica', or 'deployment' and 'rank'")
        return cls(deployment=c.deployment(m["deployment"], path + ("deployment",)),
                   rank=c.count(m["rank"], path + ("rank",)))

    @property
    def by_rank(self) -> tuple[str, int] | None:
        """(deployment, rank) when it names a rank's holder; None when it names a replica."""
        if self.deployment is None or self.rank is None:
            return None
        return self.deployment, self.rank

    def as_dict(self) -> dict[str, Any]:
        """Its arguments as the file gave them (how results and the trace name it)."""
        if self.replica is not None:
            return {"replica": self.replica}
        return {"deployment": self.deployment, "rank": self.rank}


@attrs.frozen(kw_only=True)
class Crash(_Hit):
    """Kill one replica; its replacement takes the same rank."""

    key: ClassVar[str] = "crash"

    def perform(self, desired: Desired, target: Target) -> None:
        target.crash(self)


@attrs.frozen(kw_only=True)
class Hang(_Hit):
    """A serving replica stops answering: its health checks fail, so does a recovery's report call."""

    key: ClassVar[str] = "hang"

    def perform(self, desired: Desired, target: Target) -> None:
        target.hang(self)


@attrs.frozen(kw_only=True)
class LoseNode(Action):
    """The node and every replica on it vanish (a static deployment's bundles there are no longer placed)."""

    key: ClassVar[str] = "lose_node"
    needs_controller: ClassVar[bool] = False

    node: str

    @classmethod
    def parse(cls, value: Any, path: tuple, c: Checks) -> LoseNode:
        return cls(node=c.name(value, path))

    def perform(self, desired: Desired, target: Target) -> None:
        desired.lose_node(self.node)
        target.lose_node(self.node)

    def nodes_needed(self) -> tuple[tuple[tuple, str], ...]:
        return (((), self.node),)


@attrs.frozen(kw_only=True)
class AddNode(Action):
    """A new, empty node (``gpus``: 8 unless given)."""

    key: ClassVar[str] = "add_node"
    needs_controller: ClassVar[bool] = False

    node: str
    gpus: float = 8.0

    @classmethod
    def parse(cls, value: Any, path: tuple, c: Checks) -> AddNode:
        m = c.mapping(value, path, ("name", "gpus"), required=("name",))
        return cls(node=c.name(m["name"], path + ("name",)), gpus=c.number(m.get("gpus", 8), path + ("gpus",)))

    def perform(self, desired: Desired, target: Target) -> None:
        target.add_node(self.node, self.gpus)


@attrs.frozen(kw_only=True)
class CrashController(Action):
    """The controller loses its memory and is back after ``recover_after`` seconds."""

    key: ClassVar[str] = "crash_controller"

    recover_after: float = 10.0

    @classmethod
    def parse(cls, value: Any, path: tuple, c: Checks) -> CrashController:
        m = c.mapping({} if value is None else value, path, ("recover_after",))
        return cls(recover_after=c.number(m.get("recover_after", 10.0), path + ("recover_after",)))

    def perform(self, desired: Desired, target: Target) -> None:
        target.crash_controller(self.recover_after)


@attrs.frozen(kw_only=True)
class PlaceBundles(Action):
    """The caller's placement group of a static deployment has its bundles on these nodes
    now (None: not placed)."""

    key: ClassVar[str] = "place_bundles"
    needs_controller: ClassVar[bool] = False

    deployment: str
    bundles: tuple[str | None, ...]

    @classmethod
    def parse(cls, value: Any, path: tuple, c: Checks) -> PlaceBundles:
        m = c.mapping(value, path, ("deployment", "bundles"), required=("deployment", "bundles"))
        name = c.deployment(m["deployment"], path + ("deployment",))
        static = c.declared[name].static
        if static is None:
            raise c.fail(path + ("deployment",), f"{name!r} has no static_placement")
        b = m["bundles"]
        if not isinstance(b, list) or len(b) != static.bundle_count:
            raise c.fail(path + ("bundles",), f"must list a node (or null) for each of the group's "
                                              f"{static.bundle_count} bundles, got {c.show(b)}")
        return cls(deployment=name, bundles=tuple(None if x is None else c.name(x, path + ("bundles", i))
                                                  for i, x in enumerate(b)))

    def perform(self, desired: Desired, target: Target) -> None:
        desired.bundles(self.deployment, self.bundles)
        target.place_bundles(self.deployment, self.bundles)

    def nodes_needed(self) -> tuple[tuple[tuple, str], ...]:
        return tuple((("bundles", i), b) for i, b in enumerate(self.bundles) if b is not None)


@attrs.frozen(kw_only=True)
class Orphan(Action):
    """A live replica of a deployment no spec names (left from an earlier run, a deployment
    deleted while its stop was lost): the next recovery finds it."""

    key: ClassVar[str] = "orphan"
    needs_controller: ClassVar[bool] = False

    deployment: str
    replica: str

    @classmethod
    def parse(cls, value: Any, path: tuple, c: Checks) -> Orphan:
        m = c.mapping({"deployment": value} if isinstance(value, str) else value, path, ("deployment", "replica"),
                      required=("deployment",))
        name = c.name(m["deployment"], path + ("deployment",))
        if name in c.declared:
            raise c.fail(path + ("deployment",), f"{name!r} is a declared deployment: an orphan is a replica of a "
                                                 f"deployment no spec names (use crash or hang on {name!r}'s replicas)")
        if ":" in name:
            raise c.fail(path + ("deployment",), f"must not contain ':' (a replica actor is named "
                                                 f"ModelActor:<deployment>:<replica>), got {name!r}")
        rid = c.name(m.get("replica", f"{name}#0"), path + ("replica",))
        if rid.rpartition("#")[0] != name or rc.query.parse_replica_number(rid) is None:
            raise c.fail(path + ("replica",), f"must be '{name}#<number>' (an id as the controller names "
                                              f"{name!r}'s replicas), got {rid!r}")
        return cls(deployment=name, replica=rid)

    def perform(self, desired: Desired, target: Target) -> None:
        target.orphan(self.deployment, self.replica)


@attrs.frozen(kw_only=True)
class Sleep(Action):
    """Put a deployment to sleep (RL: the trainer needs the GPUs): ``SleepRequested``."""

    key: ClassVar[str] = "sleep"

    deployment: str

    @classmethod
    def parse(cls, value: Any, path: tuple, c: Checks) -> Sleep:
        return cls(deployment=_one_deployment(value, path, c))

    def perform(self, desired: Desired, target: Target) -> None:
        target.request(rc.SleepRequested(deployment=self.deployment))


@attrs.frozen(kw_only=True)
class Wake(Action):
    """Wake a deployment, with new weights when ``weights_version`` is given: ``WakeRequested``."""

    key: ClassVar[str] = "wake"

    deployment: str
    weights_version: int | None = None

    @classmethod
    def parse(cls, value: Any, path: tuple, c: Checks) -> Wake:
        if isinstance(value, str):
            return cls(deployment=c.deployment(value, path))
        m = c.mapping(value, path, ("deployment", "weights_version"), required=("deployment",))
        version = m.get("weights_version")
        return cls(deployment=c.deployment(m["deployment"], path + ("deployment",)),
                   weights_version=None if version is None else c.count(version, path + ("weights_version",)))

    def perform(self, desired: Desired, target: Target) -> None:
        target.request(rc.WakeRequested(deployment=self.deployment, weights_version=self.weights_version))


@attrs.frozen(kw_only=True)
class PushWeights(Action):
    """New weights, ``version`` (above every earlier one), for every replica of the deployment:
    ``WeightsPushed``."""

    key: ClassVar[str] = "push_weights"

    deployment: str
    version: int

    @classmethod
    def parse(cls, value: Any, path: tuple, c: Checks) -> PushWeights:
        m = c.mapping(value, path, ("deployment", "version"), required=("deployment", "version"))
        return cls(deployment=c.deployment(m["deployment"], path + ("deployment",)),
                   version=c.count(m["version"], path + ("version",)))

    def perform(self, desired: Desired, target: Target) -> None:
        target.request(rc.WeightsPushed(deployment=self.deployment, version=self.version))


def check_weights_versions(timeline: tuple[Action, ...]) -> tuple[Action, str] | None:
    """The first action whose weights version goes back (the core refuses it, ``InvalidEvent``):
    per deployment, in the timeline's order, a ``push_weights`` above every version before it
    (0: the initial weights), a ``wake`` at least the last one. None: every version goes up."""
    last: dict[str, int] = {}
    for a in timeline:
        if isinstance(a, PushWeights) and a.version <= last.get(a.deployment, 0):
            return a, (f"version {a.version} is not above the last one pushed to {a.deployment!r}, "
                       f"{last.get(a.deployment, 0)} (versions only go up; 0 is the initial weights)")
        if isinstance(a, Wake) and a.weights_version is not None and a.weights_version < last.get(a.deployment, 0):
            return a, (f"weights_version {a.weights_version} is older than the last one pushed to "
                       f"{a.deployment!r}, {last[a.deployment]} (versions only go up)")
        if isinstance(a, PushWeights) or (isinstance(a, Wake) and a.weights_version is not None):
            last[a.deployment] = a.version if isinstance(a, PushWeights) else a.weights_version or 0
    return None


@attrs.frozen(kw_only=True)
class WaitUntilHealthy(Action):
    """Block the timeline until the deployment is healthy (``timeout``: then a failure, and go on)."""

    key: ClassVar[str] = "wait_until_healthy"
    waits: ClassVar[bool] = True

    deployment: str
    timeout: float | None = None

    @classmethod
    def parse(cls, value: Any, path: tuple, c: Checks) -> WaitUntilHealthy:
        if isinstance(value, str):
            return cls(deployment=c.deployment(value, path))
        m = c.mapping(value, path, ("deployment", "timeout"), required=("deployment",))
        timeout = None if m.get("timeout") is None else c.number(m["timeout"], path + ("timeout",))
        return cls(deployment=c.deployment(m["deployment"], path + ("deployment",)), timeout=timeout)


@attrs.frozen(kw_only=True)
class WaitUntilServing(Action):
    """Block the timeline until the deployment is healthy, awake and every replica serves: running,
    its weights on its GPU, holding the last version pushed (``timeout``: then a failure, and go on).
    A sleeping deployment stays healthy for the ranks, so ``wait_until_healthy`` does not wait for a wake."""

    key: ClassVar[str] = "wait_until_serving"
    waits: ClassVar[bool] = True

    deployment: str
    timeout: float | None = None

    @classmethod
    def parse(cls, value: Any, path: tuple, c: Checks) -> WaitUntilServing:
        w = WaitUntilHealthy.parse(value, path, c)
        return cls(deployment=w.deployment, timeout=w.timeout)


@attrs.frozen(kw_only=True)
class Wait(Action):
    """Let ``seconds`` pass."""

    key: ClassVar[str] = "wait"
    needs_controller: ClassVar[bool] = False
    waits: ClassVar[bool] = True

    seconds: float

    @classmethod
    def parse(cls, value: Any, path: tuple, c: Checks) -> Wait:
        return cls(seconds=c.number(value, path))


#: every action, by its YAML key, in the docs' order (docs/scenarios.md's table is checked against it)
ACTIONS: dict[str, type[Action]] = {cls.key: cls for cls in (
    Deploy, Scale, Delete, UpdateConfig, Rollout, Crash, Hang, LoseNode, AddNode, CrashController, PlaceBundles, Orphan,
    Sleep, Wake, PushWeights, WaitUntilHealthy, WaitUntilServing, Wait)}


# ------------------------------------------------------------------ planning
@attrs.frozen
class Planned:
    """When an action runs on the timeline's own clock (the simulator's):
    ``start``, and whether the controller is down then (``controller_down``:
    the action runs without it; a later one planned with it up runs only once
    it recovered)."""

    start: float
    controller_down: bool


def plan(timeline: tuple[Action, ...]) -> list[Planned]:
    """Each action's start as the simulator runs it, so an executor without a
    virtual clock keeps the same order against controller recoveries: ``at``
    (never before the previous action ended) or ``after`` the previous one; a
    ``wait`` takes its seconds (a ``wait_until_healthy`` counts as none: it
    needs the controller anyway); a ``crash_controller`` keeps it down for
    ``recover_after``, and an action that needs it meanwhile is held until
    the recovery (the next one counts from there)."""
    t, back, out = 0.0, None, []
    for a in timeline:
        if a.at is not None:
            t = max(t, a.at)
        elif a.after is not None:
            t += a.after
        if back is not None and t >= back:
            back = None  # recovered before this action is due
        if back is not None and a.needs_controller:
            t, back = back, None  # held until the recovery
        out.append(Planned(start=t, controller_down=back is not None))
        if isinstance(a, Wait):
            t += a.seconds
        elif isinstance(a, CrashController):
            back = t + a.recover_after
    return out


#: the replica phases (``rankcore.Phase`` values, as replicas report them) in which a replica can be crashed
_CRASHABLE = frozenset(p.value for p in rc.LIVE) - {rc.Phase.STOPPING.value}


def rank_holder(replicas: Iterable[tuple[str, int | None, str]], rank: int) -> str | None:
    """Who ``crash: {deployment, rank}`` hits, from ``(replica id, global rank,
    phase)`` as each replica sees itself (the rank in its context; one not yet
    initialised: the global rank it was started with): the live one, not
    being stopped, holding ``rank``; the lowest id if several. Both executors
    ask this."""
    hits = [rid for rid, held, phase in replicas if held == rank and phase in _CRASHABLE]
    return min(hits) if hits else None


# ------------------------------------------------------------------ meaning
class Desired:
    """The ``DeploymentApplied`` each action means, from the deployment as the
    timeline has set it so far (a scale changes its replica count, the caller's
    group its bundles). Not what a recovery starts from: a restarted controller
    is given the core's own ``rankcore.query.desired_specs``, persisted at the crash."""

    def __init__(self, declared: Mapping[str, Declared]) -> None:
        self.declared = declared
        self.applied: dict[str, rc.DeploymentApplied] = {}

    def _base(self, name: str) -> rc.DeploymentApplied:
        return self.applied.get(name) or self.declared[name].applied()

    def deploy(self, action: Deploy) -> rc.DeploymentApplied:
        spec = self.declared[action.deployment]
        changes: dict[str, Any] = {}
        if action.replicas is not None:
            changes["replicas"] = action.replicas
        if action.user_config is not AS_DECLARED:
            changes["user_config"] = action.user_config
        event = spec.applied(**changes)
        self.applied[spec.name] = event
        return event

    def scale(self, action: Scale) -> rc.DeploymentApplied:
        name = action.deployment
        self.applied[name] = attrs.evolve(self._base(name), num_replicas=action.replicas)
        return self.applied[name]

    def delete(self, name: str) -> None:
        """Deleted: a later action on it starts again from its declaration."""
        self.applied.pop(name, None)

    def update_config(self, action: UpdateConfig) -> rc.DeploymentApplied:
        name = action.deployment
        self.applied[name] = attrs.evolve(self._base(name), user_config=action.user_config)
        return self.applied[name]

    def rollout(self, action: Rollout) -> rc.DeploymentApplied:
        name = action.deployment
        changes: dict[str, Any] = {"version": action.version}
        for key in _PACE:
            if getattr(action, key) is not None:
                changes[key] = getattr(action, key)
        self.applied[name] = self._base(name).replace(**changes)
        return self.applied[name]

    def bundles(self, name: str, bundle_nodes: tuple[str | None, ...]) -> None:
        """The caller's group of a static deployment has its bundles there now
        (what a recovering executor reads from the group)."""
        base = self._base(name)
        if base.static_placement is not None:
            self.applied[name] = base.replace(static_placement=base.static_placement.with_nodes(bundle_nodes))

    def lose_node(self, node: str) -> None:
        """Bundles on a lost node are no longer placed."""
        for name in sorted(self.applied):
            sp = self.applied[name].static_placement
            if sp is not None and node in sp.bundle_nodes:
                self.applied[name] = self.applied[name].replace(static_placement=sp.lose(node))


class Target(Protocol):
    """What an executor does for each effect of the timeline."""

    def apply(self, event: rc.DeploymentApplied) -> None:
        """Deploy, or update, a deployment to this spec."""

    def scale(self, deployment: str, replicas: int, victims: tuple[str, ...]) -> None:
        """Scale a deployment that exists (``victims``: replica ids to stop first)."""

    def deployed(self, deployment: str) -> bool:
        """Whether the deployment is deployed (a scale deploys it if not; one deleted is not)."""

    def delete(self, deployment: str) -> None:
        """Delete a deployment (``DeploymentDeleted``); one never deployed, or already deleted,
        is a failed line of the run naming why, and the run goes on."""

    def crash(self, action: Crash) -> None:
        """Kill a replica: ``action.replica``, or the holder of a rank (``action.by_rank``)."""

    def hang(self, action: Hang) -> None:
        """Make a replica hang (it stops answering: its health checks fail), named as for ``crash``."""

    def lose_node(self, node: str) -> None: ...

    def add_node(self, node: str, gpus: float) -> None: ...

    def crash_controller(self, recover_after: float) -> None: ...

    def orphan(self, deployment: str, replica: str) -> None:
        """Leave a live replica ``replica`` of ``deployment``, a deployment no spec names,
        in the cluster (the controller does not know it: the next recovery finds it)."""

    def place_bundles(self, deployment: str, bundle_nodes: tuple[str | None, ...]) -> None:
        """The caller's placement group of a static deployment now has its bundles on these nodes."""

    def request(self, event: rc.SleepRequested | rc.WakeRequested | rc.WeightsPushed) -> None:
        """Hand the core a request about a deployment's weights (``sleep``, ``wake``, ``push_weights``)."""
