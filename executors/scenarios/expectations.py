"""Checking a scenario's expectations against a state and the metrics so far:
one copy for every executor (the simulator checks them in virtual time, the
Ray scenario runner asks its controller to)."""

from __future__ import annotations

from collections.abc import Callable

import attrs

import rankcore as rc

from .format import Expectation
from .metrics import DeploymentMetrics, Metrics, percentile

__all__ = ["ExpectationResult", "check_expectation"]


@attrs.frozen
class ExpectationResult:
    expectation: Expectation | None
    name: str
    passed: bool
    detail: str
    t: float

    def as_record(self) -> dict:
        return {"t": self.t, "name": self.name, "passed": self.passed, "detail": self.detail}



def _planner(e: Expectation, m: DeploymentMetrics | None, res: Callable[[bool, str], ExpectationResult]
             ) -> ExpectationResult:
    """The SLO expectations: availability, time at full strength, time non-contiguous, time to full
    strength, time below k replicas."""
    if m is None or m.first_healthy is None:
        return res(False, "never at full strength: no figure after start-up")
    if e.kind in ("availability", "full_strength"):
        got = m.availability() if e.kind == "availability" else m.full_strength()
        what = "replica-availability" if e.kind == "availability" else "time at full strength"
        if got is None:
            return res(False, f"no time observed after start-up for {what}")
        return res(got + 1e-9 >= e.args["at_least"], f"expected {what} >= {e.args['at_least']:g}%, saw {got:.4f}%")
    if e.kind == "non_contiguous":
        frac = m.noncontiguous_fraction(e.args["level"])
        if frac is None:
            return res(False, "no time observed after start-up")
        return res(frac <= e.args["at_most_fraction"] + 1e-12,
                   f"expected non-contiguous ({e.args['level']}) at most {e.args['at_most_fraction']:g} of the time, "
                   f"saw {frac:.6f}")
    if e.kind == "below":
        k = e.args["replicas"]
        secs, frac = m.seconds_below(k), m.below_fraction(k)
        if frac is None:
            return res(False, f"the target never asked for {k} or more replicas after start-up")
        bad = []
        if "at_most_fraction" in e.args and frac > e.args["at_most_fraction"] + 1e-12:
            bad.append(f"fraction {frac:.6f} > {e.args['at_most_fraction']:g}")
        if "at_most_seconds" in e.args and secs > e.args["at_most_seconds"] + 1e-9:
            bad.append(f"{secs:.1f} s > {e.args['at_most_seconds']:g} s")
        seen = f"below {k} serving for {secs:.1f} s, {frac:.6f} of the time the target asked for {k}+"
        return res(not bad, seen + (f": {'; '.join(bad)}" if bad else ""))
    times = m.to_full_strength
    figures = {"p50_at_most": percentile(times, 50), "p99_at_most": percentile(times, 99),
               "max_at_most": max(times) if times else None}
    bad = [f"{k[:-8]} {figures[k]:.1f} s > {e.args[k]:g} s" for k in figures
           if k in e.args and figures[k] is not None and figures[k] > e.args[k]]
    if m._short_since is not None:
        bad.append(f"still below full strength since t={m._short_since:g}")
    seen = ", ".join(f"{k[:-8]} {'-' if v is None else f'{v:.1f} s'}" for k, v in figures.items())
    return res(not bad, f"{len(times)} drops; {seen}" + (f": {'; '.join(bad)}" if bad else ""))


def _weights(e: Expectation, dep: rc.Deployment, res: Callable[[bool, str], ExpectationResult]
             ) -> ExpectationResult:
    """Sleep, wake and weight versions (docs/tiers.md): ``asleep`` (meant to sleep, every live
    replica WARM), ``serving`` (awake, every live replica running, HOT, holding the deployment's
    weights) and ``weights_version`` (the version pushed, held by every live replica, none pending)."""
    reps = sorted(dep.replicas.values(), key=lambda r: r.replica_id)
    if e.kind == "asleep":
        off = [f"{r.replica_id} {r.residency.value}" for r in reps if r.residency is not rc.Residency.WARM]
        if not dep.asleep or off:
            return res(False, f"expected asleep with every replica warm; {'asleep' if dep.asleep else 'awake'}"
                              + (f", not warm: {', '.join(off)}" if off else ""))
        return res(True, f"asleep: {len(reps)} replicas warm")
    if e.kind == "serving":
        off = [f"{r.replica_id} {r.phase.value}/{r.residency.value}/v{r.weights_version}"
               + ("(pending)" if r.weights_pending else "") for r in reps if not rc.query.is_serving(dep, r)]
        ok = rc.query.fully_serving(dep)
        return res(ok, f"{'asleep' if dep.asleep else 'awake'}, {'healthy' if dep.healthy else 'not healthy'}, "
                       f"weights v{dep.weights_version}" + (f"; not serving: {', '.join(off)}" if off else
                                                            f"; {len(reps)} replicas serving"))
    want = e.args["equals"]
    off = [f"{r.replica_id} v{r.weights_version}" + (" (pending)" if r.weights_pending else "")
           for r in reps if r.weights_version != want or r.weights_pending]
    ok = dep.weights_version == want and not off
    return res(ok, f"expected version {want}, the deployment's is {dep.weights_version}"
                   + (f"; not holding it: {', '.join(off)}" if off else f"; all {len(reps)} replicas hold it"))


def _count_names(e: Expectation) -> tuple[str, str]:
    """Which count a reconfigures / reassignments expectation reads: its label's qualifier
    (``(rank)``, ``(any reason)``, ``(any level)``) and what its number is (``rank reconfigures``)."""
    if e.kind == "reconfigures":
        reason = e.args["reason"]
        if reason == "any":
            return " (any reason)", "reconfigures (rank or user_config)"
        return f" ({reason})", f"{reason} reconfigures"
    if e.kind == "reassignments":
        level = e.args["level"]
        return f" ({level} level)", f"replicas moved ({level} level)"
    return "", e.kind.replace("_", " ")


def _counted(e: Expectation, now: float) -> str:
    """What a count expectation's number is, and over which window (from the run's start to the
    check): ``rank reconfigures by t=350.1``."""
    return f"{_count_names(e)[1]} by t={now:g}"


def check_expectation(e: Expectation, state: rc.State, metrics: Metrics, now: float) -> ExpectationResult:
    """One expectation against a state and the metrics so far (any executor)."""
    name = e.args["deployment"]
    dep = state.deployments.get(name)
    m = metrics.deployments.get(name)
    label = f"expect[{e.index}] {e.kind}{_count_names(e)[0]} of {name}" + ("" if e.at is None else f" at t={e.at:g}")

    def res(ok: bool, detail: str) -> ExpectationResult:
        return ExpectationResult(e, label, ok, detail, now)

    if dep is None:
        return res(False, f"deployment {name!r} does not exist (never deployed, or the controller is down)")
    ranks = dep.ranks
    if e.kind == "world_size":
        return res(dep.world_size == e.args["equals"], f"expected {e.args['equals']}, saw {dep.world_size}")
    if e.kind == "running":
        n = dep.count(rc.Phase.RUNNING)
        return res(n == e.args["equals"], f"expected {e.args['equals']} running, saw {n}")
    if e.kind in ("availability", "full_strength", "non_contiguous", "to_full_strength", "below"):
        return _planner(e, m, res)
    if e.kind in ("asleep", "serving", "weights_version"):
        return _weights(e, dep, res)
    if e.kind == "status":
        return res(dep.status == e.args["equals"], f"expected {e.args['equals']}, saw {dep.status}"
                                                     + (f" ({dep.status_message})" if dep.status_message else ""))
    if e.kind == "failed":
        n = dep.count(rc.Phase.FAILED)
        return res(n == e.args["equals"], f"expected {e.args['equals']} FAILED (a bundle's node lost), saw {n}")
    if e.kind in ("contiguous", "ranks"):
        got = sorted(ranks.global_rank(r) for r in dep.replicas)
        if e.kind == "ranks" and "global" in e.args and got != sorted(e.args["global"]):
            return res(False, f"expected global ranks {sorted(e.args['global'])}, saw {got}")
        if e.kind == "contiguous" or e.args.get("contiguous") is not None:
            want = True if e.kind == "contiguous" else e.args["contiguous"]
            lb = ranks.lower_bound()
            is_c = lb.replicas == 0
            if is_c != want:
                return res(False, f"expected contiguous={want}; global ranks {got}, "
                                  f"{lb.replicas} replicas off (rank {lb.rank}, node {lb.node_rank}, local {lb.local_rank})")
        return res(True, f"global ranks {got}")
    if e.kind == "healthy":
        return res(dep.healthy, f"{'healthy' if dep.healthy else 'not healthy'}: "
                                f"{dep.count(rc.Phase.RUNNING)} running of target {dep.target}, "
                                f"{len(dep.replicas)} live")
    if e.kind in ("reconfigures", "reassignments", "packed", "evictions", "cold_loads", "warm_loads"):
        if e.kind == "packed":
            n = dep.packing_gap()
        elif m is None:
            n = 0
        elif e.kind in ("evictions", "cold_loads", "warm_loads"):  # GPU memory tiers, as carried out
            n = getattr(m, e.kind)
        elif e.kind == "reconfigures":
            reason = e.args["reason"]
            n = sum(m.reconfigures.values()) if reason == "any" else m.reconfigures[reason]
        else:
            n = m.reassignments[e.args["level"]]
        problems = []
        if "at_most" in e.args and n > e.args["at_most"]:
            problems.append(f"at most {e.args['at_most']}")
        if "at_least" in e.args and n < e.args["at_least"]:
            problems.append(f"at least {e.args['at_least']}")
        if "equals" in e.args and n != e.args["equals"]:
            problems.append(f"exactly {e.args['equals']}")
        what = " node changes beyond one block of ranks per node" if e.kind == "packed" else f" {_counted(e, now)}"
        return res(not problems, f"expected {' and '.join(problems)}, saw {n}{what}" if problems else f"saw {n}{what}")
    raise AssertionError(e.kind)  # pragma: no cover
