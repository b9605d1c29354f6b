"""The autoscaler: ``AutoscalingMetrics`` in, a new target out, through a person's scale path.

Why in the core: a target change is a rank event (``world_size``, victims,
compaction), so the autoscaler's decision goes through the same function as a
person's ``ScaleRequested`` (``moves.scale``: not-yet-serving victims first,
then the highest ranks), and every rank rule applies unchanged. Its state (the
window of samples, since when a change is wanted, burst mode) is plain data in
``Deployment.autoscaler``; the target it decides is ``Deployment.target``, which
``desired_specs`` persists, so it survives a controller restart while the
window does not (a recovered controller starts from fresh metrics, as Ray
Serve's does).

Matched with Ray Serve (``ray/serve/autoscaling_policy.py`` and
``ray/serve/config.py`` ``AutoscalingConfig``, 2.5x; the options' names and
defaults are in ``rankcore/base/options.py``, ``AutoscalingOptions``):

* the window: every sample within ``look_back_period_s`` of the newest,
  aggregated by ``aggregation_function`` (mean, max, min) over the total,
  queued plus in flight (Ray Serve merges its handles' and replicas' series
  into one total and aggregates that; its mean is time-weighted, ours is per
  sample, the same for samples every ``metrics_interval_s``);
* the default policy (``replica_queue_length_autoscaling_policy``): desired =
  running x (total / (target_ongoing_requests x running)), that is total /
  ``target_ongoing_requests`` (``_core_replica_queue_length_policy``);
* the factors (``_apply_scaling_factors``): ceil(running + factor x (desired -
  running)), ``upscaling_factor`` up, ``downscaling_factor`` down (None: 1), a
  downscale stuck by its factor still removes one (a gang deployment: one
  gang, or rounding up would undo it). Ours: without a factor it
  is ceil(desired) itself (Ray Serve's sum rounds 21 / 0.7 to 30 or 31 as
  ``running`` changes, flapping a constant load's target by one), and a
  ``downscaling_factor`` > 1 never overshoots to zero while requests are there
  (the cold start would bring one back at once);
* the bounds (``_apply_bounds``): clamped to [``min_replicas``,
  ``max_replicas``]; a gang deployment's rounded up to whole gangs and clamped
  to the whole gangs inside them (Ray Serve's gang rule);
* the delays (``_apply_delay_logic``): a change is made once it has been
  wanted without a break (no other direction, no "as it is" in between) for
  ``upscale_delay_s`` / ``downscale_delay_s``; Ray Serve counts control-loop
  periods of 0.1 s, we count the seconds between the metrics that wanted it.
  A downscale goes to zero only from one replica (a gang deployment: one
  gang), with ``downscale_to_zero_delay_s`` when set; from more it stops at
  one first;
* scale from zero (``_get_cold_start_scale_up_replicas``): with no replica
  running and requests waiting, the target becomes max(ceil(1 x
  upscaling_factor), target) at once, no delay, no policy call; the requests
  wait in the queue (``PoolComing`` says replicas are coming). Two
  differences, both bugs Ray Serve has had: the cold start is bounded too
  (ray#61731: a factor must not take it past ``max_replicas``), and "requests
  waiting" is the newest sample's (a ``min`` aggregation over a window of
  zeros would hide the first request);
* a custom policy (``register_policy``): a pure function of a
  ``PolicyContext``, called where the default policy is, with the same
  factors, bounds and delays after it (Ray Serve's ``_apply_autoscaling_config``).
  Only its name is in the state (picklable, deterministic).

Ours, off by default: ``burst`` (Knative's panic mode). Over the last 10% of
the window, load at 200% or more of what the running replicas are meant to
hold scales up at once (no upscale delay, factors and bounds applied), and
for a whole ``look_back_period_s`` after the last such sample nothing scales
down (the downscale delay counts from the end of it).

Internal module: import its public names from ``rankcore`` (docs/embedding.md,
"What you may import").
"""

from __future__ import annotations

import math
from collections.abc import Callable

import attrs

from ..base import fields as f
from ..base.errors import InvalidConfig, InvalidEvent
from ..base.events import AutoscalingMetrics, DeploymentApplied
from ..base.lifecycle import Phase
from ..base.options import AutoscalingOptions, DeploymentConfig
from ..base.records import unchecked_copy
from ..base.state import Autoscaler, Deployment
from ..base.transaction import Tx
from .moves import scale

__all__ = ["PolicyContext", "Policy", "DEFAULT_POLICY", "default_policy", "register_policy", "policy",
           "BURST_WINDOW", "BURST_THRESHOLD", "check", "bounds", "bounded", "applied", "refuse_scale",
           "observe", "running", "sampled", "aggregate", "cold_start", "factored", "delayed", "burst"]

_copy = unchecked_copy
_EMPTY = Autoscaler()

#: Ray Serve's default policy's name (``ray.serve.autoscaling_policy``); ``policy=None`` is it
DEFAULT_POLICY = "replica_queue_length_autoscaling_policy"
#: burst mode (Knative's panic mode): its window, a fraction of ``look_back_period_s``, and the
#: load, as a multiple of what the running replicas are meant to hold, that enters it
BURST_WINDOW = 0.1
BURST_THRESHOLD = 2.0


@attrs.frozen(kw_only=True)
class PolicyContext:
    """What a policy decides from (Ray Serve's ``AutoscalingContext``, the parts the core has)."""

    deployment: str
    now: float
    #: the target now, and the replicas serving (running) now
    target: int
    running: int
    #: queued plus in flight, aggregated over the window (Ray Serve's ``total_num_requests``)
    total_requests: float
    #: the newest sample: requests queued, and in flight per replica
    queued: int
    ongoing: tuple[tuple[str, int], ...]
    #: the bounds the result will be clamped to (gangs: whole gangs)
    min_replicas: int
    max_replicas: int
    options: AutoscalingOptions


#: a policy: the number of replicas wanted (any number >= 0; factors, bounds and delays follow)
Policy = Callable[[PolicyContext], "int | float"]


def default_policy(ctx: PolicyContext) -> float:
    """Ray Serve's ``replica_queue_length_autoscaling_policy``: total requests / target_ongoing_requests."""
    return ctx.total_requests / ctx.options.target_ongoing_requests


_POLICIES: dict[str, Policy] = {DEFAULT_POLICY: default_policy}


def register_policy(name: str, fn: Policy, *, replace: bool = False) -> None:
    """Register ``fn`` (pure: ``(PolicyContext) -> replicas``) as policy ``name``, for
    ``DeploymentApplied(policy=name)``. Register it in every process that steps the core (a
    recovered controller too): the state holds only the name. Another function under a taken
    name is refused unless ``replace`` (a state's decisions would change under it)."""
    if not isinstance(name, str) or not name:
        raise InvalidConfig(f"register_policy: the name must be a non-empty str, got {f.shown(name)}")
    if not callable(fn):
        raise InvalidConfig(f"register_policy({name!r}): the policy must be callable, got {f.shown(fn)}")
    if name == DEFAULT_POLICY or (_POLICIES.get(name, fn) is not fn and not replace):
        raise InvalidConfig(f"register_policy({name!r}): that name is taken (replace=True replaces it; "
                            f"{DEFAULT_POLICY!r} is Ray Serve's default and stays)")
    _POLICIES[name] = fn


def policy(name: str | None) -> Policy:
    """The policy registered as ``name`` (None: the default); ``InvalidConfig`` naming it if none is."""
    fn = _POLICIES.get(DEFAULT_POLICY if name is None else name)
    if fn is None:
        raise InvalidConfig(f"policy={name!r} is not registered in this process (rankcore.register_policy; "
                            f"registered: {', '.join(sorted(_POLICIES))})")
    return fn


# ------------------------------------------------------------------ the deployment's side
def check(e: DeploymentApplied) -> None:
    """A ``DeploymentApplied`` naming a policy nobody registered is refused, naming it."""
    if e.config.autoscaler.policy is not None:
        try:
            policy(e.config.autoscaler.policy)
        except InvalidConfig as exc:
            raise InvalidConfig(f"DeploymentApplied({e.name!r}).{exc}") from None


def bounds(config: DeploymentConfig, max_replicas: int) -> tuple[int, int]:
    """[min_replicas, max_replicas], both whole gangs (the smallest at or above the one, the
    largest at or below the other; ``DeploymentApplied`` checks one lies between)."""
    k = config.gang.gang_size
    return _whole(config.autoscaler.min_replicas, k), max_replicas // k * k


def bounded(dep: Deployment, n: int) -> int:
    """``n`` rounded up to whole gangs and clamped to the bounds (Ray Serve's ``_apply_bounds``)."""
    lo, hi = bounds(dep.config, dep.max_replicas)
    return max(lo, min(hi, _whole(n, dep.config.gang.gang_size)))


def applied(dep: Deployment, e: DeploymentApplied, new: bool) -> Deployment:
    """``dep`` (holding ``e``'s config) at the target ``e`` leaves it, not yet announced.

    Not autoscaled: ``e.num_replicas`` (the autoscaler's state dropped). Autoscaled,
    ``num_replicas`` is no target (Ray Serve refuses it beside an autoscaling_config): a new
    deployment starts at ``initial_replicas``, else ``min_replicas`` (Ray Serve's rule); one
    applied again keeps the autoscaler's target, moved into the new bounds, and its window
    cut to the new ``look_back_period_s`` (a shorter one must not aggregate older samples)."""
    check(e)
    auto = dep.config.autoscaler
    if not auto.autoscaling:
        return _copy(dep, target=e.num_replicas, autoscaler=None)
    start = dep.target
    if new:
        start = auto.min_replicas if auto.initial_replicas is None else auto.initial_replicas
    state = dep.autoscaler
    if state is not None and state.window:
        state = _copy(state, window=_since(state.window, state.window[-1][0] - auto.look_back_period_s))
    return _copy(dep, target=bounded(dep, start), autoscaler=state)


def refuse_scale(dep: Deployment) -> None:
    """A person's scale of an autoscaled deployment is refused (Ray Serve: num_replicas and
    autoscaling_config do not mix); its bounds change with ``DeploymentApplied``."""
    if dep.config.autoscaler.autoscaling:
        raise InvalidEvent(f"ScaleRequested: deployment {dep.name!r} is autoscaled (its target is the "
                           f"autoscaler's): change min_replicas / max_replicas, or autoscaling=False, with a "
                           f"DeploymentApplied")


# ------------------------------------------------------------------ one decision
def observe(tx: Tx, dep: Deployment, e: AutoscalingMetrics) -> bool:
    """Take one sample and decide (the module docstring): False when it changes nothing
    (a deployment being deleted; a sample older than the window's newest)."""
    auto = dep.config.autoscaler
    if not auto.autoscaling:
        raise InvalidEvent(f"AutoscalingMetrics: deployment {dep.name!r} is not autoscaled "
                           f"(DeploymentApplied(autoscaling=True) turns it on)")
    state = dep.autoscaler or _EMPTY
    if dep.deleting or (state.window and e.now < state.window[-1][0]):
        return False
    state = _copy(state, window=sampled(state.window, e, auto.look_back_period_s))
    running_now = running(dep)
    total = aggregate(state.window, auto.aggregation_function)
    n = cold_start(dep, running_now, total, e)
    if n is not None:  # (no decision of the policy's: nothing was wanted without a break)
        state = _copy(state, wanted=0, since=None)
    else:
        lo, hi = bounds(dep.config, dep.max_replicas)
        ctx = PolicyContext(deployment=dep.name, now=e.now, target=dep.target, running=running_now,
                            total_requests=total, queued=e.queued, ongoing=e.ongoing, min_replicas=lo,
                            max_replicas=hi, options=auto)
        n = bounded(dep, factored(_wanted(ctx), running_now, auto, dep.config.gang.gang_size))
        n, state = burst(dep, state, n, running_now, e.now) if auto.burst else delayed(dep, state, n, e.now)
    tx.put(scale(tx, _copy(dep, autoscaler=state), n))
    return True


def running(dep: Deployment) -> int:
    """Replicas serving now (Ray Serve's ``running``: running, or being told a new rank)."""
    return dep.count(Phase.RUNNING) + dep.count(Phase.RECONFIGURING)


def sampled(window: tuple[tuple[float, int, int], ...], e: AutoscalingMetrics,
            look_back_s: float) -> tuple[tuple[float, int, int], ...]:
    """The window with ``e``'s sample, less those older than ``look_back_s`` before it."""
    return (*_since(window, e.now - look_back_s), (e.now, e.queued, e.total - e.queued))


def _since(window: tuple[tuple[float, int, int], ...], oldest: float) -> tuple[tuple[float, int, int], ...]:
    """The samples of ``window`` taken at ``oldest`` or later."""
    return tuple(s for s in window if s[0] >= oldest)


def aggregate(window: tuple[tuple[float, int, int], ...], how: str) -> float:
    """The window's totals (queued + in flight) by ``aggregation_function``."""
    totals = [q + o for _, q, o in window]
    if how == "max":
        return float(max(totals))
    if how == "min":
        return float(min(totals))
    return sum(totals) / len(totals)


def cold_start(dep: Deployment, running: int, total: float, e: AutoscalingMetrics) -> int | None:
    """With no replica running, Ray Serve's fast path: requests waiting scale up at once (to
    ceil(upscaling_factor), bounded; never below the target), none leave the target as it is.
    None: replicas run, the policy decides."""
    if running:
        return None
    if not (total or e.total):  # (the event's sum only when the window's is zero)
        return dep.target
    factor = dep.config.autoscaler.upscaling_factor or 1.0
    return max(bounded(dep, math.ceil(factor)), dep.target)


def _wanted(ctx: PolicyContext) -> float:
    """The policy's answer, checked: a finite number of replicas >= 0."""
    name = ctx.options.policy
    n = policy(name)(ctx)
    if not f.finite(n) or n < 0:
        raise InvalidConfig(f"autoscaling policy {name or DEFAULT_POLICY!r} of {ctx.deployment!r} returned "
                            f"{f.shown(n)}, not a number of replicas >= 0")
    return float(n)


def factored(desired: float, running: int, auto: AutoscalingOptions, unit: int = 1) -> int:
    """Ray Serve's ``_apply_scaling_factors``: the step from ``running`` towards ``desired``
    times its factor, rounded up; a downscale its factor would stall still removes one
    ``unit`` (a gang: rounding up to whole gangs would undo less)."""
    delta = desired - running
    factor = (auto.upscaling_factor if delta > 0 else auto.downscaling_factor) or 1.0
    # (factor 1: ceil(desired) itself; running + (desired - running) can round past an integer
    # and flap the target by one as running changes under a constant load)
    n = math.ceil(desired) if factor == 1.0 else math.ceil(running + factor * delta)
    if _whole(math.ceil(desired), unit) < running <= _whole(n, unit):
        n = running - unit
    return max(n, 1 if desired > 0 else 0)  # (a factor > 1 never takes it to zero while requests are there)


def _whole(n: int, unit: int) -> int:
    """``n`` rounded up to whole ``unit``s (gangs)."""
    return -(-n // unit) * unit


def delayed(dep: Deployment, state: Autoscaler, n: int, now: float) -> tuple[int, Autoscaler]:
    """Ray Serve's ``_apply_delay_logic``: ``n`` only once a change that way has been wanted
    without a break for its delay, else the target as it is. Down to zero only from one replica
    (one gang), with ``downscale_to_zero_delay_s`` when set; from more, down to one first."""
    auto, target = dep.config.autoscaler, dep.target
    if n == target:
        return target, _copy(state, wanted=0, since=None)
    way = 1 if n > target else -1
    since = state.since if state.wanted == way and state.since is not None else now
    if way > 0:
        delay = auto.upscale_delay_s
    elif target == dep.config.gang.gang_size:  # (the last one: to zero)
        delay = auto.downscale_delay_s if auto.downscale_to_zero_delay_s is None else auto.downscale_to_zero_delay_s
    else:
        n, delay = max(n, dep.config.gang.gang_size), auto.downscale_delay_s
    if now - since >= delay:
        return n, _copy(state, wanted=0, since=None)
    return target, _copy(state, wanted=way, since=since)


def burst(dep: Deployment, state: Autoscaler, n: int, running: int, now: float) -> tuple[int, Autoscaler]:
    """Burst mode (Knative's panic): load over the last ``BURST_WINDOW`` of the window at
    ``BURST_THRESHOLD`` x what the running replicas are meant to hold enters it (again); in it,
    an upscale is made at once to the larger of ``n`` and the burst window's own want, and nothing
    scales down; a whole window after its last such sample it ends and ``delayed`` decides again."""
    auto = dep.config.autoscaler
    recent = [q + o for t, q, o in state.window if t >= now - BURST_WINDOW * auto.look_back_period_s]
    want = sum(recent) / len(recent) / auto.target_ongoing_requests
    since = state.burst_since
    if want >= BURST_THRESHOLD * max(running, 1):
        since = now
    elif since is not None and now - since >= auto.look_back_period_s:
        since = None
    if since is None:
        return delayed(dep, _copy(state, burst_since=None), n, now)
    top = max(n, bounded(dep, factored(want, running, auto, dep.config.gang.gang_size)))
    return max(dep.target, top), _copy(state, wanted=0, since=None, burst_since=since)
