"""What a run measured, per deployment, collected by observing every step."""

from __future__ import annotations

import math
from collections import defaultdict
from collections.abc import Callable, Iterable, Mapping
from typing import Any

import attrs

import rankcore as rc
from rankcore import LIVE, Phase

__all__ = ["DeploymentMetrics", "GroupFigures", "Metrics", "imbalance", "percentile", "tier_history", "tier_step"]

LEVELS = ("rank", "node_rank", "local_rank", "any")
#: the levels of contiguity a planner asks about: global ranks, node ranks, local ranks, any of them
CONTIGUITY = ("rank", "node_rank", "local_rank", "any")


_START, _RECONFIGURE, _STOP = rc.StartReplica, rc.ReconfigureReplica, rc.StopReplica
_RECOVERED, _READY, _HEALTH = rc.ControllerRecovered, rc.ReplicaReady, rc.HealthChecked
#: where Deployment.counts keeps the serving phases
_RUNNING, _RECONFIGURING = (list(LIVE).index(p) for p in (Phase.RUNNING, Phase.RECONFIGURING))
_CONTIGUOUS = (False, False, False, False)
_SERVING = (Phase.RUNNING, Phase.RECONFIGURING)
_REFORM = rc.ReformGroup


def tier_step(kind: str, fields: Mapping[str, Any]) -> str | None:
    """What one core command says of its replica's tier (None: nothing): ``PlaceReplica`` of a
    tiered replica "hot<-cold" / "hot<-warm" (its ``source``), ``EvictReplica`` "evicted->warm" /
    "evicted->cold", ``OffloadReplica`` "warm", ``LoadReplica`` "hot<-warm", ``DropWarmCopy``
    "dropped->cold" (the WARM copy that replica left)."""
    if kind == "PlaceReplica":
        source = fields.get("source", "")
        return f"hot<-{source}" if source else None
    if kind == "EvictReplica":
        return f"evicted->{fields['to']}"
    if kind == "OffloadReplica":
        return "warm"
    if kind == "LoadReplica":
        return "hot<-warm"
    if kind == "DropWarmCopy":
        return "dropped->cold"
    return None


def tier_history(commands: Iterable[Any]) -> dict[str, list[str]]:
    """Per replica id, its tier history as the core's commands decided it (``tier_step``), in
    order: the same on every executor that carries them out, so a Ray run and a simulator run
    of one scenario compare replica for replica. ``commands``: rankcore command records, or
    trace records (dicts; only ``kind == "command"`` ones are read)."""
    out: dict[str, list[str]] = {}
    for c in commands:
        if isinstance(c, Mapping):
            if c.get("kind") != "command":
                continue
            kind, fields = str(c["type"]), c["fields"]
        else:
            kind, fields = type(c).__name__, attrs.asdict(c, recurse=False)
        step = tier_step(kind, fields)
        if step is not None:
            out.setdefault(str(fields["replica_id"]), []).append(step)
    return out


def percentile(values: list[float], q: float) -> float | None:
    """Nearest-rank percentile (None for no values)."""
    if not values:
        return None
    s = sorted(values)
    k = max(0, math.ceil(q / 100 * len(s)) - 1)
    return s[k]


def imbalance(counts: Iterable[int]) -> float | None:
    """How unevenly work was spread: the largest count over the mean count (1.0: even; n: all on one
    of n). None for no counts or none above 0. The simulator's ``replica_imbalance``: the requests
    each replica served (``executors.sim.traffic.routing_figures``)."""
    values = list(counts)
    total = sum(values)
    if not values or total <= 0:
        return None
    return max(values) * len(values) / total


@attrs.define
class _GroupRun:
    """One group's epoch being measured: its members, when it is (or was to be) up, when a member
    of it was lost (None: not yet), and when the group first formed."""

    epoch: int
    members: tuple[str, ...]
    up_at: float
    first: float
    broken_at: float | None = None


@attrs.define
class GroupFigures:
    """A deployment's collective groups (``collective_group``; rankcore.control.groups), as the core
    formed them: epochs formed, members that re-formed in place or joined, and each group's time up.
    A group is up from ``reform_s`` after its epoch formed (the re-form's cost: the scenario's
    ``latency.reform`` in the simulator; 0 elsewhere) until a member of that epoch stops serving;
    an outage runs from that loss until the next epoch is up."""

    reforms: int = 0
    in_place: int = 0
    joined: int = 0
    outages: list = attrs.field(factory=list)
    #: closed up-intervals so far (group-seconds), and each group's epoch being measured, by group id
    up_seconds: float = 0.0
    open: dict = attrs.field(factory=dict)
    #: as of the last ``settle``: group-seconds since each group first formed, and of those up
    total: float = 0.0
    total_up: float = 0.0

    def formed(self, gid: str, epoch: int, members: tuple[str, ...], t: float, reform_s: float) -> None:
        """Epoch ``epoch`` of ``gid`` formed at ``t``: the last one worked until now (or its outage
        ends once this one is up, ``reform_s`` later)."""
        cur = self.open.get(gid)
        if cur is not None:
            if cur.broken_at is None:
                self.up_seconds += max(0.0, t - cur.up_at)
            else:
                self.outages.append(t + reform_s - cur.broken_at)
        self.open[gid] = _GroupRun(epoch, members, t + reform_s, cur.first if cur is not None else t)
        self.reforms += 1

    def lost(self, run: _GroupRun, t: float) -> None:
        """A member of ``run`` stopped serving at ``t``: the group is down from now."""
        run.broken_at = t
        self.up_seconds += max(0.0, t - run.up_at)

    def settle(self, t: float) -> None:
        """Read the figures up to ``t`` (the open intervals stay open)."""
        self.total = sum(max(0.0, t - g.first) for g in self.open.values())
        self.total_up = self.up_seconds + sum(max(0.0, t - g.up_at) for g in self.open.values() if g.broken_at is None)

    def as_dict(self) -> dict:
        return {"group_reforms": self.reforms, "group_in_place": self.in_place, "group_joined": self.joined,
                "group_availability_pct": _round(100.0 * self.total_up / self.total) if self.total > 0 else None,
                "group_outages": len(self.outages), "group_outage_p50": percentile(self.outages, 50),
                "group_outage_max": round(max(self.outages), 6) if self.outages else None}


@attrs.define
class DeploymentMetrics:
    reassignments: dict = attrs.field(factory=lambda: dict.fromkeys(LEVELS, 0))
    reconfigures: dict = attrs.field(factory=lambda: {"rank": 0, "user_config": 0})
    starts: int = 0
    crashes: int = 0
    #: replicas the core replaced because their start timed out (``faults.start_timeout``): not crashes
    timeouts: int = 0
    #: replica starts that waited for a new worker process (the ``process`` latency) / that took an
    #: idle spare process instead (``spare_processes``); together, every replica's process
    process_starts: int = 0
    spare_hits: int = 0
    #: weights moves carried out (issue 21): sleeps (GPU -> CPU memory), wakes (back), weight
    #: updates, and the bytes they moved (the deployment's ``model_bytes`` each); told by the executor
    offloads: int = 0
    loads: int = 0
    weight_updates: int = 0
    bytes_moved: int = 0
    #: GPU memory tiers (issue 21), told by the executor: placements loaded from disk / from the
    #: node's WARM copy (``PlaceReplica.source`` as carried out), "warm" ones that found no copy and
    #: loaded from disk (counted in cold_loads too), evictions carried out (``EvictReplica``)
    cold_loads: int = 0
    warm_loads: int = 0
    warm_fallbacks: int = 0
    evictions: int = 0
    #: replica-seconds with weights on a GPU and serving (from ready, or a wake, until the
    #: replica stopped, died or went to sleep)
    hot_seconds: float = 0.0
    #: what the replicas cost (issue 23), told by the executor: seconds each held its node's GPUs
    #: (placed until it stopped or died: starting and draining count), and those times its GPUs
    replica_seconds: float = 0.0
    gpu_seconds: float = 0.0
    #: per replica: the seconds from its StartReplica (it was asked for) to ready, or (one that
    #: never was: stopped, died or still waiting at the end) to its end; never_hot counts those
    wait_to_hot: list = attrs.field(factory=list)
    never_hot: int = 0
    noncontiguous_seconds: float = 0.0
    unavailable_replica_seconds: float = 0.0
    crash_to_ready: list = attrs.field(factory=list)
    #: rollouts (rankcore.control.rollouts): replicas replaced by a successor on their ranks, and the
    #: seconds from each rollout's start (the apply of a new revision) to its last outdated replica gone
    rollout_replacements: int = 0
    rollout_seconds: list = attrs.field(factory=list)
    _rolling_since: float | None = None
    first_healthy: float | None = None
    #: its collective groups (None: it has none)
    groups: GroupFigures | None = None
    #: after start-up (from first_healthy): seconds spent at each (target,
    #: serving) pair; availability, full strength, shortfalls and time below
    #: k replicas are all read from it
    by_strength: dict = attrs.field(factory=dict)
    #: seconds non-contiguous per level (after start-up)
    noncontiguous_by_level: dict = attrs.field(factory=lambda: dict.fromkeys(CONTIGUITY, 0.0))
    #: seconds from each drop below full strength (a fall in serving replicas
    #: under an unchanged target, not a new target or the ramp to it) to full strength again
    to_full_strength: list = attrs.field(factory=list)
    # integration state
    _hot: int = 0  # replicas HOT now
    _hot_since: float = 0.0  # hot_seconds integrated up to here
    _serving: int = 0
    _target: int = 0
    #: non-contiguous now, per level of CONTIGUITY (the last: at any level)
    _off: tuple = (False, False, False, False)
    _short_since: float | None = None
    #: the integrand above has been constant since this time (integrated up to it)
    _since: float = 0.0
    #: the rank table _off was read from (a step that
    #: kept it, most answers, needs no new reading)
    _ranks: object = attrs.field(default=None, eq=False, repr=False)

    @property
    def observed_seconds(self) -> float:
        return sum(self.by_strength.values())

    @property
    def target_replica_seconds(self) -> float:
        return sum(target * sec for (target, _), sec in self.by_strength.items())

    @property
    def serving_replica_seconds(self) -> float:
        return sum(min(serving, target) * sec for (target, serving), sec in self.by_strength.items())

    @property
    def full_strength_seconds(self) -> float:
        return sum(sec for (target, serving), sec in self.by_strength.items() if serving >= target)

    @property
    def short_seconds(self) -> dict[int, float]:
        """Seconds per count of missing replicas (1, 2, ...)."""
        out: dict[int, float] = {}
        for (target, serving), sec in self.by_strength.items():
            if serving < target:
                out[target - serving] = out.get(target - serving, 0.0) + sec
        return out

    def availability(self) -> float | None:
        """Serving / target replica-seconds after start-up, in percent (None before full strength)."""
        if self.target_replica_seconds <= 0:
            return None
        return 100.0 * self.serving_replica_seconds / self.target_replica_seconds

    def full_strength(self) -> float | None:
        """Percent of the time after start-up with every target replica serving."""
        return 100.0 * self.full_strength_seconds / self.observed_seconds if self.observed_seconds > 0 else None

    def seconds_below(self, k: int) -> float:
        """Seconds after start-up with fewer than ``k`` replicas serving while
        the target asked for at least ``k`` (a nightly downscale to fewer than
        ``k`` is not a shortfall)."""
        return sum(s for (target, serving), s in self.by_strength.items() if target >= k and serving < k)

    def below_fraction(self, k: int) -> float | None:
        """``seconds_below(k)`` over the seconds after start-up with a target of at least ``k``."""
        asked = sum(s for (target, _), s in self.by_strength.items() if target >= k)
        return self.seconds_below(k) / asked if asked > 0 else None

    def noncontiguous_fraction(self, level: str = "any") -> float | None:
        return self.noncontiguous_by_level[level] / self.observed_seconds if self.observed_seconds > 0 else None

    def as_dict(self) -> dict:
        return {
            "reassignments": dict(self.reassignments),
            "reconfigures": dict(self.reconfigures),
            "starts": self.starts,
            "crashes": self.crashes,
            "timeouts": self.timeouts,
            "process_starts": self.process_starts,
            "spare_hits": self.spare_hits,
            "offloads": self.offloads,
            "loads": self.loads,
            "weight_updates": self.weight_updates,
            "bytes_moved": self.bytes_moved,
            "cold_loads": self.cold_loads,
            "warm_loads": self.warm_loads,
            "warm_fallbacks": self.warm_fallbacks,
            "evictions": self.evictions,
            "hot_seconds": round(self.hot_seconds, 6),
            "replica_seconds": round(self.replica_seconds, 6),
            "gpu_hours": round(self.gpu_seconds / 3600.0, 6),
            "wait_to_hot_s": round(sum(self.wait_to_hot), 6),
            "wait_to_hot_max": round(max(self.wait_to_hot), 6) if self.wait_to_hot else None,
            "wait_to_hot_p50": percentile(self.wait_to_hot, 50),
            "never_hot": self.never_hot,
            "noncontiguous_seconds": round(self.noncontiguous_seconds, 6),
            "unavailable_replica_seconds": round(self.unavailable_replica_seconds, 6),
            "crash_to_ready_p50": percentile(self.crash_to_ready, 50),
            "crash_to_ready_p99": percentile(self.crash_to_ready, 99),
            "replacements_ready": len(self.crash_to_ready),
            "rollout_replacements": self.rollout_replacements,
            "rollouts_done": len(self.rollout_seconds),
            "rollout_s_max": round(max(self.rollout_seconds), 6) if self.rollout_seconds else None,
            "first_healthy": self.first_healthy,
            "availability_pct": _round(self.availability()),
            "full_strength_pct": _round(self.full_strength()),
            "observed_seconds": round(self.observed_seconds, 6),
            "seconds_short_by": {str(k): round(v, 6) for k, v in sorted(self.short_seconds.items())},
            # "target/serving" -> seconds after start-up: time below any k from the output alone
            "seconds_at_strength": {f"{t}/{n}": round(v, 6) for (t, n), v in sorted(self.by_strength.items())},
            "noncontiguous_fraction": {lv: _round(self.noncontiguous_fraction(lv)) for lv in CONTIGUITY},
            "to_full_strength_p50": percentile(self.to_full_strength, 50),
            "to_full_strength_p99": percentile(self.to_full_strength, 99),
            "to_full_strength_max": max(self.to_full_strength) if self.to_full_strength else None,
            "drops_below_full_strength": len(self.to_full_strength) + (self._short_since is not None),
            **(self.groups.as_dict() if self.groups is not None else {}),
        }


def moved_levels(old: tuple, new: tuple) -> list[str]:
    """The levels (rank, node_rank, local_rank) at which a replica's ranks ``old`` and ``new``
    (``ReplicaRank.as_tuple()``) differ: what a rank reassignment is counted by, here and in the
    Ray executor's metrics."""
    return [level for level, a, b in zip(LEVELS, old, new) if a != b]


def _round(v: float | None, digits: int = 6) -> float | None:
    return None if v is None else round(v, digits)


class Metrics:
    """A driver observer: ``Metrics()(t, event, before, result)`` after every step. ``reform_s``:
    a deployment's collective-group re-form cost in seconds (``GroupFigures``; default none)."""

    def __init__(self, reform_s: Callable[[str], float] | None = None) -> None:
        self.reform_s = reform_s or (lambda deployment: 0.0)
        #: deployment -> its figures, made at first use (a plain lookup per step: no call)
        self.deployments: defaultdict[str, DeploymentMetrics] = defaultdict(DeploymentMetrics)
        self.last_t = 0.0
        self.events = 0
        self.stale = 0
        self._crashed_at: dict[tuple[str, int], float] = {}
        #: (deployment, global rank) -> when its holder died while the controller was down (nobody
        #: heard it: no replacement names it); the recovery's start on that rank is its replacement
        self._unheard: dict[tuple[str, int], float] = {}

    def advance(self, t: float) -> None:
        """Integrate every deployment's figures up to ``t`` (before reading them)."""
        for m in self.deployments.values():
            self._settle(m, t)
            self._settle_hot(m, t)
            if m.groups is not None:
                m.groups.settle(t)
        self.last_t = max(self.last_t, t)

    @staticmethod
    def _settle(m: DeploymentMetrics, t: float) -> None:
        """Integrate ``m``'s figures from ``m._since`` to ``t``. They are
        piecewise constant, so they are integrated only when one is about to
        change (most steps change none: a placed replica, one getting ready
        while others are short ...), not at every step."""
        dt = t - m._since
        if dt > 0:
            m.unavailable_replica_seconds += max(0, m._target - m._serving) * dt
            noncontiguous = m._off[3]
            if m.first_healthy is not None and m._target > 0:  # after start-up
                key = (m._target, m._serving)
                m.by_strength[key] = m.by_strength.get(key, 0.0) + dt
                if noncontiguous:
                    for level, off in zip(CONTIGUITY, m._off):
                        if off:
                            m.noncontiguous_by_level[level] += dt
            if noncontiguous:
                m.noncontiguous_seconds += dt
            m._since = t

    def __call__(self, t: float, event: object, before: rc.State, result: rc.Step) -> None:
        self.events += 1
        if result.stale:
            self.stale += 1
        after = result.state
        kind = type(event)
        recovered = kind is _RECOVERED
        if after.deployments is before.deployments and not recovered:
            # Nothing any deployment holds changed (a Tick with nothing due, a
            # stale answer): nothing measured changes either.
            return
        if recovered:
            # A crash the controller never heard of (it was down): the recovery
            # starts a new replica on the free rank, and that is its replacement.
            if self._unheard:
                for cmd in result.commands:
                    if type(cmd) is _START and cmd.replaces is None and cmd.lineage is not None:
                        t0 = self._unheard.pop((cmd.deployment, cmd.global_rank), None)
                        if t0 is not None:
                            self._crashed_at.setdefault((cmd.deployment, cmd.lineage), t0)
                self._unheard.clear()  # (a rank not started again: never replaced)
            # What each replica said against what it holds now (recovery and any
            # compaction in the same step together).
            for r in event.reports:  # type: ignore[attr-defined]
                dep = after.deployments.get(r.deployment)
                rk = dep.ranks.rank_of(r.replica_id) if dep is not None and r.replica_id in dep.ranks else None
                if rk is not None:
                    said = (r.rank.rank, r.rank.node_rank, r.rank.local_rank)
                    now = rk.as_tuple()
                    known = tuple(n if s is None else s for s, n in zip(said, now))  # unsaid = unchanged
                    self._count_change(self.deployments[r.deployment], known, now)
        elif result.compactions:
            for comp in result.compactions:
                m = self.deployments[comp.deployment]
                for ch in comp.changes:
                    self._count_change(m, ch.old.as_tuple(), ch.new.as_tuple())
        # A replica still starting that the core stops at once because its start
        # deadline had passed at this step's time is a timeout (the step's Tick,
        # or the clock an event carried, expired it), not a crash; its
        # replacement may start later (the restart backoff).
        for cmd in result.commands:
            ctype = type(cmd)
            if ctype is _START:
                m = self.deployments[cmd.deployment]
                m.starts += 1
                if cmd.replaces is not None and cmd.lineage is not None:
                    old = before.replica(cmd.replaces)
                    if kind is not _HEALTH and ((old is not None and old.retiring)
                                                or rc.query.is_held(before.cluster, cmd.replica_id)
                                                or after.replica(cmd.replaces) is not None):
                        # a rollout's successor (a gang's, held until its gang stopped; a surge's, its
                        # predecessor still draining), not a crash's replacement (an unhealthy replica's
                        # is one, even while its predecessor drains: rankcore.control.health)
                        m.rollout_replacements += 1
                    else:
                        self._crashed_at.setdefault((cmd.deployment, cmd.lineage), t)
            elif ctype is _RECONFIGURE:
                self.deployments[cmd.deployment].reconfigures[cmd.reason] += 1
            elif ctype is _STOP and not cmd.graceful_shutdown_timeout_s:
                deadlines = before.cluster.deadlines
                due = deadlines.get(cmd.replica_id) if deadlines else None
                if due is not None and due <= t:
                    old = before.replica(cmd.replica_id)
                    if old is not None and old.phase is rc.Phase.STARTING:
                        self.deployments[cmd.deployment].timeouts += 1
        delayed = after.cluster.delayed
        if delayed is not before.cluster.delayed:
            # A replacement held back by the restart backoff: its StartReplica
            # comes later, but its wait began now, with the failure.
            for rid in delayed:
                if rid not in before.cluster.delayed and not rc.query.is_held(after.cluster, rid):
                    name = after.index[rid]
                    self._crashed_at.setdefault((name, after.deployments[name].replicas[rid].lineage), t)
        if kind is _READY and not result.stale and self._crashed_at:
            rid = event.replica_id  # type: ignore[attr-defined]
            name = after.index.get(rid)
            if name is not None:
                rep = after.deployments[name].replicas[rid]
                t0 = self._crashed_at.pop((name, rep.lineage), None)
                if t0 is not None:
                    self.deployments[name].crash_to_ready.append(t - t0)
        was = before.deployments
        for name, dep in after.deployments.items():
            if was.get(name) is dep and name in self.deployments:
                continue  # unchanged: what was measured of it still holds
            m = self.deployments[name]
            if dep.groups:
                self._groups(m, dep, t, result.commands)
            if dep.rolling != (m._rolling_since is not None):
                if dep.rolling:
                    m._rolling_since = t
                else:
                    m.rollout_seconds.append(t - m._rolling_since)  # type: ignore[operator]
                    m._rolling_since = None
            ranks = dep.ranks
            if ranks is not m._ranks:
                m._ranks = ranks
                if ranks.is_contiguous():
                    off = _CONTIGUOUS
                else:
                    lb = ranks.lower_bound()
                    off = (lb.rank > 0, lb.node_rank > 0, lb.local_rank > 0, True)
                if off != m._off:
                    self._settle(m, t)
                    m._off = off
            counts = dep.counts
            # (during a blue-green switch only the blues serve: the new set stands by, rankcore.query.is_serving)
            serving = dep.blues or counts[_RUNNING] + counts[_RECONFIGURING]
            target = dep.target
            healthy = m.first_healthy is None and target > 0 and dep.healthy
            if serving == m._serving and target == m._target and not healthy:
                continue  # nothing measured of it changes
            self._settle(m, t)
            fell = serving < m._serving and target == m._target
            m._target, m._serving = target, serving
            if healthy:
                m.first_healthy = t
            self._full_strength(m, t, fell)

    def _groups(self, m: DeploymentMetrics, dep: rc.Deployment, t: float, commands: Iterable[Any]) -> None:
        """``dep``'s collective groups after a step at ``t`` that changed it: an epoch formed (the
        last one worked until now; up again after the re-form's cost), or a member of the working
        epoch no longer serving (the group is down from now)."""
        gf = m.groups
        if gf is None:
            gf = m.groups = GroupFigures()
        for gid, g in dep.groups.items():
            cur = gf.open.get(gid)
            if g.epoch and (cur is None or g.epoch != cur.epoch):
                gf.formed(gid, g.epoch, g.members, t, self.reform_s(dep.name))
            elif cur is not None and cur.broken_at is None and not all(
                    (r := dep.replicas.get(rid)) is not None and r.phase in _SERVING for rid in cur.members):
                gf.lost(cur, t)
        for c in commands:
            if type(c) is _REFORM and c.deployment == dep.name:
                if c.group.in_place:
                    gf.in_place += 1
                else:
                    gf.joined += 1

    @staticmethod
    def _full_strength(m: DeploymentMetrics, t: float, fell: bool) -> None:
        """Time each drop below full strength until it is over. A drop is a
        fall in the serving count under an unchanged target (a crash, a node
        lost): a new target is not one, nor is the ramp up to it."""
        if m.first_healthy is None:
            return
        if m._serving >= m._target:
            if m._short_since is not None:
                m.to_full_strength.append(t - m._short_since)
                m._short_since = None
        elif fell and m._short_since is None:
            m._short_since = t

    def crashed(self, t: float, deployment: str, serving: bool, rank: int | None = None,
                heard: bool = True) -> None:
        """The cluster lost a replica (told by the executor, so crashes while the
        controller is down count too); a serving one is unavailable from now.
        ``heard`` False: the controller was down (``rank``: the global rank the
        replica held); its replacement is the replica the recovery starts on
        that rank, and crash_to_ready counts from now to it ready."""
        m = self.deployments[deployment]
        self._settle(m, t)
        m.crashes += 1
        if not heard and rank is not None:
            self._unheard.setdefault((deployment, rank), t)
        if serving:
            m._serving -= 1
            self._full_strength(m, t, True)

    def process_started(self, deployment: str, spared: bool) -> None:
        """A replica's worker process: a spare one it took (``spared``), or a new one it waited for."""
        m = self.deployments[deployment]
        if spared:
            m.spare_hits += 1
        else:
            m.process_starts += 1

    def transferred(self, deployment: str, what: str, nbytes: int) -> None:
        """A replica's weights moved (``what``: offload, load or update; ``nbytes`` of them)."""
        m = self.deployments[deployment]
        if what == "offload":
            m.offloads += 1
        elif what == "load":
            m.loads += 1
        else:
            m.weight_updates += 1
        m.bytes_moved += nbytes

    def loaded(self, deployment: str, source: str, fell_back: bool = False) -> None:
        """A tiered replica landed on its node and loads its weights from ``source`` ("warm": the
        node's WARM copy; "cold": disk); ``fell_back``: the core said warm, no copy was there."""
        m = self.deployments[deployment]
        if source == "warm":
            m.warm_loads += 1
        else:
            m.cold_loads += 1
        m.warm_fallbacks += fell_back

    def held(self, deployment: str, seconds: float, gpus: float) -> None:
        """A replica of ``deployment`` held its node and ``gpus`` GPUs for ``seconds`` (its cost)."""
        m = self.deployments[deployment]
        m.replica_seconds += seconds
        m.gpu_seconds += seconds * gpus

    def evicted(self, deployment: str) -> None:
        """An ``EvictReplica`` was carried out (the replica drains, then leaves its GPU)."""
        self.deployments[deployment].evictions += 1

    @staticmethod
    def _settle_hot(m: DeploymentMetrics, t: float) -> None:
        if t > m._hot_since:
            m.hot_seconds += m._hot * (t - m._hot_since)
            m._hot_since = t

    def hot(self, t: float, deployment: str, delta: int) -> None:
        """``delta`` replicas of ``deployment`` became HOT (+1) or stopped being HOT (-1) at ``t``."""
        m = self.deployments[deployment]
        self._settle_hot(m, t)
        m._hot += delta

    def waited_for_hot(self, deployment: str, seconds: float, ready: bool = True) -> None:
        """A replica became ready ``seconds`` after its StartReplica (not ``ready``: it stopped,
        died or the run ended that long after, never ready)."""
        m = self.deployments[deployment]
        m.wait_to_hot.append(seconds)
        m.never_hot += not ready

    @staticmethod
    def _count_change(m: DeploymentMetrics, old: tuple, new: tuple) -> None:
        moved = moved_levels(old, new)
        for level in moved:
            m.reassignments[level] += 1
        m.reassignments["any"] += bool(moved)

    def as_dict(self) -> dict:
        return {
            "events": self.events,
            "stale_events": self.stale,
            "deployments": {name: m.as_dict() for name, m in sorted(self.deployments.items())},
        }


