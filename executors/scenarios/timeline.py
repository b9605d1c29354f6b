"""The timeline interpreter, one copy for both executors.

What a timeline action *means* lives here: which deployment spec a
``deploy``/``scale``/``update_config`` leaves desired (what a restarted
controller recovers with), that scaling a deployment never deployed deploys
it, which actions need the controller up, and which effect each action has.
*When* it runs and *how* an effect is carried out are the executor's: the
simulator runs actions in virtual time on its simulated cluster, the Ray
scenario runner in wall time on real actors. Waits (``wait``,
``wait_until_healthy``) are clock matters and stay with each executor.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any, Protocol

import attrs

import rankcore as rc

from .format import Action, Scenario

__all__ = ["WITHOUT_CONTROLLER", "WAITS", "Desired", "Target", "Planned", "needs_controller", "perform", "plan",
           "rank_holder"]

#: actions that happen to the cluster, not through the controller: they run
#: while it is down (the others wait for it to come back)
WITHOUT_CONTROLLER = frozenset({"wait", "lose_node", "add_node", "crash", "hang", "place_bundles", "orphan"})
#: actions that only pass time; each executor waits its own way
WAITS = frozenset({"wait", "wait_until_healthy"})


def needs_controller(action: Action) -> bool:
    return action.kind not in WITHOUT_CONTROLLER


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
        if back is not None and needs_controller(a):
            t, back = back, None  # held until the recovery
        out.append(Planned(start=t, controller_down=back is not None))
        if a.kind == "wait":
            t += a.args["seconds"]
        elif a.kind == "crash_controller":
            back = t + a.args["recover_after"]
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


class Desired:
    """The ``DeploymentApplied`` each action means, from the deployment as the
    timeline has set it so far (a scale changes its replica count, the caller's
    group its bundles). Not what a recovery starts from: a restarted controller
    is given the core's own ``rankcore.desired_specs``, persisted at the crash."""

    def __init__(self, scenario: Scenario) -> None:
        self.scenario = scenario
        self.applied: dict[str, rc.DeploymentApplied] = {}

    def _base(self, name: str) -> rc.DeploymentApplied:
        return self.applied.get(name) or self.scenario.deployments[name].applied()

    def deploy(self, args: dict) -> rc.DeploymentApplied:
        spec = self.scenario.deployments[args["deployment"]]
        event = spec.applied(**{k: args[k] for k in ("replicas", "user_config") if k in args})
        self.applied[spec.name] = event
        return event

    def scale(self, args: dict) -> rc.DeploymentApplied:
        name = args["deployment"]
        self.applied[name] = attrs.evolve(self._base(name), num_replicas=args["replicas"])
        return self.applied[name]

    def update_config(self, args: dict) -> rc.DeploymentApplied:
        name = args["deployment"]
        self.applied[name] = attrs.evolve(self._base(name), user_config=args["user_config"])
        return self.applied[name]

    def bundles(self, name: str, bundle_nodes: tuple[str | None, ...]) -> None:
        """The caller's group of a static deployment has its bundles there now
        (what a recovering executor reads from the group)."""
        base = self._base(name)
        if base.static_placement is not None:
            self.applied[name] = attrs.evolve(base, static_placement=base.static_placement.with_nodes(bundle_nodes))

    def lose_node(self, node: str) -> None:
        """Bundles on a lost node are no longer placed."""
        for name in sorted(self.applied):
            sp = self.applied[name].static_placement
            if sp is not None and node in sp.bundle_nodes:
                self.applied[name] = attrs.evolve(self.applied[name], static_placement=sp.lose(node))


class Target(Protocol):
    """What an executor does for each effect of the timeline."""

    def apply(self, event: rc.DeploymentApplied) -> None:
        """Deploy, or update, a deployment to this spec."""

    def scale(self, deployment: str, replicas: int, victims: tuple[str, ...]) -> None:
        """Scale a deployment that exists (``victims``: replica ids to stop first)."""

    def deployed(self, deployment: str) -> bool:
        """Whether the deployment was ever deployed (a scale deploys it if not)."""

    def crash(self, args: dict[str, Any]) -> None:
        """Kill a replica: ``args["replica"]``, or the holder of ``args["rank"]`` in ``args["deployment"]``."""

    def hang(self, args: dict[str, Any]) -> None:
        """Make a replica hang (it stops answering: its health checks fail): ``args`` as for ``crash``."""

    def lose_node(self, node: str) -> None: ...

    def add_node(self, node: str, gpus: float) -> None: ...

    def crash_controller(self, recover_after: float) -> None: ...

    def orphan(self, deployment: str, replica: str) -> None:
        """Leave a live replica ``replica`` of ``deployment``, a deployment no spec names,
        in the cluster (the controller does not know it: the next recovery finds it)."""

    def place_bundles(self, deployment: str, bundle_nodes: tuple[str | None, ...]) -> None:
        """The caller's placement group of a static deployment now has its bundles on these nodes."""


def perform(kind: str, args: dict[str, Any], desired: Desired, target: Target) -> None:
    """Carry out one action (``Action.kind``, ``Action.args``) that is not a wait, through ``target``."""
    if kind == "deploy":
        target.apply(desired.deploy(args))
    elif kind == "scale":
        event = desired.scale(args)
        if target.deployed(event.name):
            target.scale(event.name, args["replicas"], tuple(args.get("victims", ())))
        else:  # never deployed: the scale deploys it, at that size
            target.apply(event)
    elif kind == "update_config":
        target.apply(desired.update_config(args))
    elif kind == "crash":
        target.crash(args)
    elif kind == "hang":
        target.hang(args)
    elif kind == "lose_node":
        desired.lose_node(args["node"])
        target.lose_node(args["node"])
    elif kind == "place_bundles":
        desired.bundles(args["deployment"], tuple(args["bundles"]))
        target.place_bundles(args["deployment"], tuple(args["bundles"]))
    elif kind == "add_node":
        target.add_node(args["node"], args["gpus"])
    elif kind == "crash_controller":
        target.crash_controller(args["recover_after"])
    elif kind == "orphan":
        target.orphan(args["deployment"], args["replica"])
    else:
        raise ValueError(f"perform() does not take {kind!r} (waits are the executor's)")
