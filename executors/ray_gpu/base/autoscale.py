"""Autoscaling on Ray (issue 23): the routers' load reaches the core as ``AutoscalingMetrics``.

The policy is the core's (``rankcore.control.autoscaling``); this module only carries the facts, as
Ray Serve's handles push theirs to its controller:

* ``LoadReporter`` (one per ``router.Router``): every ``metrics_interval_s`` it pushes one
  small record to the controller (``Controller.report_load``): its queued requests and its
  in-flight count per replica. Only while it has something, plus the one record that says it
  has nothing left; idle, it sends nothing. The controller's answer is the deployment's
  ``metrics_interval_s`` (read from the core's config: no second copy of the default), or None
  when the deployment is not autoscaled (the reporter then stays quiet for ``RECHECK_S``). A
  request queued with no replica serving is pushed at once (``urgent``): scale from zero does
  not wait for the next interval. A failed push (the controller restarting) is dropped: the
  router keeps routing and the next interval pushes again.
* ``LoadBook`` (the controller's): the latest record of each router, summed per deployment;
  a router silent for 2 intervals is dropped (its process ended, or it went idle).
  ``Controller`` feeds one ``AutoscalingMetrics`` per autoscaled deployment every
  ``metrics_interval_s``, none while it recovers; a restarted controller starts with an empty
  book (fresh metrics, as Ray Serve's does).
* ``from_ray_serve``: ``@deployment(num_replicas="auto", autoscaling_config={...})`` as Ray
  Serve users write it, mapped onto the core's flat options.
"""

from __future__ import annotations

import threading
import time
import uuid
from typing import Any

import attrs
import ray

import rankcore as rc

__all__ = ["LoadReporter", "LoadBook", "from_ray_serve", "AUTOSCALING_KEYS", "AUTO_DEFAULTS", "RECHECK_S"]

#: a deployment found not autoscaled is asked again after this long (it may be applied anew)
RECHECK_S = 10.0
#: urgent pushes (a request queued, no replica serving) at most this often per router
URGENT_GAP_S = 0.2
#: ``autoscaling_config`` keys: the core's autoscaling options (rankcore.base.options.AutoscalingOptions)
#: and ``max_replicas`` (the deployment's own bound, declared once in DeploymentApplied)
AUTOSCALING_KEYS: tuple[str, ...] = tuple(
    a.name for a in attrs.fields(rc.options.AutoscalingOptions) if a.name != "autoscaling") + ("max_replicas",)
#: Ray Serve's ``num_replicas="auto"`` (ray#42613, 2.32): these unless autoscaling_config says otherwise
AUTO_DEFAULTS = {"min_replicas": 1, "max_replicas": 100, "target_ongoing_requests": 2.0}
#: Ray Serve's AutoscalingConfig.max_replicas default (an autoscaling_config without num_replicas="auto")
SERVE_MAX_REPLICAS = 1


def from_ray_serve(name: Any, num_replicas: Any, autoscaling_config: Any) -> tuple[int | None, dict]:
    """``num_replicas`` and ``autoscaling_config`` as Ray Serve takes them -> (the replica count,
    or None when not autoscaled; the core's flat options with ``max_replicas``). An unknown key,
    or a count beside an autoscaling_config: ``rankcore.InvalidConfig`` naming it."""
    where = f"deployment {name!r}" if name else "@deployment(...)"
    auto = num_replicas == "auto"
    if autoscaling_config is None and not auto:
        return None, {}
    if isinstance(num_replicas, str) and not auto:
        raise rc.InvalidConfig(f"{where}: num_replicas must be an int or 'auto', got {num_replicas!r}")
    if num_replicas is not None and not auto:
        raise rc.InvalidConfig(f"{where}: num_replicas={num_replicas!r} and autoscaling_config do not mix (the "
                               f"autoscaler sets the count: give min_replicas / initial_replicas, or "
                               f"num_replicas='auto')")
    cfg = autoscaling_config if autoscaling_config is not None else {}
    if not isinstance(cfg, dict):
        raise rc.InvalidConfig(f"{where}: autoscaling_config must be a dict, got {cfg!r:.80}")
    unknown = sorted(str(k) for k in cfg if k not in AUTOSCALING_KEYS)
    if unknown:
        raise rc.InvalidConfig(f"{where}: autoscaling_config: unknown key(s) {', '.join(unknown)} (known: "
                               f"{', '.join(AUTOSCALING_KEYS)})")
    opts = {**(AUTO_DEFAULTS if auto else {"max_replicas": SERVE_MAX_REPLICAS}), **cfg, "autoscaling": True}
    lo, hi = opts.get("min_replicas", rc.options.DEFAULTS.min_replicas), opts["max_replicas"]
    if isinstance(lo, int) and isinstance(hi, int) and lo > hi:
        raise rc.InvalidConfig(f"{where}: autoscaling_config: min_replicas={lo!r} is above max_replicas={hi!r}")
    initial = opts.get("initial_replicas")
    count = int(initial if initial is not None else opts.get("min_replicas", rc.options.DEFAULTS.min_replicas))
    return count, opts


class LoadReporter:
    """One router's pushes (module docstring). ``load()`` -> (queued, ((replica id, in flight), ...))
    read under the router's lock; ``push(key, queued, ongoing, urgent)`` -> an ObjectRef of the
    controller's answer."""

    def __init__(self, load: Any, push: Any) -> None:
        self._load, self._push = load, push
        self.key = uuid.uuid4().hex[:12]
        self.interval: float | None = None  # the deployment's metrics_interval_s, once the controller said
        self.quiet_until = 0.0  # not autoscaled: nothing pushed before this
        self.pushes = 0  # records sent (tests)
        self._lock = threading.Lock()
        self._active = False  # a timer is pending (the pushes go on)
        self._urgent_at = 0.0
        self._idle_sent = True  # the last record sent said: nothing (or none was sent)
        self._job = _job()  # the Ray job this router's controller handle belongs to
        self._pending = False  # a push is unanswered (one at a time: a restarting controller is not flooded)

    def _alive(self) -> bool:
        """Ray is still the one this reporter was made in: a push after ``ray.shutdown`` would
        start a new Ray from a timer thread (``.remote`` initialises Ray), and one in a later
        ``ray.init`` would use a dead controller's handle."""
        return ray.is_initialized() and _job() == self._job

    def kick(self, urgent: bool = False) -> None:
        """A request came: start the pushes if they are stopped; ``urgent`` (queued, no replica
        serving) pushes now whatever the timer says."""
        if time.monotonic() < self.quiet_until:
            return
        with self._lock:
            start, self._active = not self._active, True
        if start:
            self._tick(urgent=urgent)
        elif urgent and time.monotonic() >= self._urgent_at + URGENT_GAP_S:  # (a burst at zero: one push)
            self._urgent_at = time.monotonic()
            self._tick(reschedule=False, urgent=True)

    def _tick(self, reschedule: bool = True, urgent: bool = False) -> None:
        """Push the router's load if it has some, or once when it has none left; go on every
        interval while it has some (``reschedule``: this is the timer's own tick)."""
        if not self._alive():
            with self._lock:
                self._active = False  # (for good: this router's Ray is gone)
            return
        queued, ongoing = self._load()
        busy = queued > 0 or any(n for _, n in ongoing)
        if busy or not self._idle_sent:
            self._idle_sent = not busy
            self._send(queued, ongoing, urgent)
        if not reschedule:
            return
        with self._lock:
            self._active = busy and time.monotonic() >= self.quiet_until
            if self._active:
                timer = threading.Timer(self.interval or 0.5, self._tick)
                timer.daemon = True
                timer.start()

    def _send(self, queued: int, ongoing: tuple, urgent: bool) -> None:
        with self._lock:
            if self._pending:
                return  # (the last push is unanswered: the controller is busy or restarting)
            self._pending = True
        try:
            ref = self._push(self.key, queued, ongoing, urgent)
        except Exception:  # (Ray shutting down)
            self._pending = False
            return
        self.pushes += 1
        ref.future().add_done_callback(self._answered)

    def _answered(self, fut: Any) -> None:
        self._pending = False
        try:
            interval = fut.result()
        except Exception:  # the controller restarting: the next interval pushes again
            return
        if interval is None:  # not autoscaled
            self.quiet_until = time.monotonic() + RECHECK_S  # (the pending tick stops)
            return
        self.interval = float(interval)


def _job() -> str | None:
    """The current Ray job's id (None: Ray is not initialised)."""
    if not ray.is_initialized():
        return None
    return ray.get_runtime_context().get_job_id()


class LoadBook:
    """The controller's view of the routers' load: the latest record of each, per deployment."""

    def __init__(self) -> None:
        #: deployment -> router key -> (when received, monotonic; queued; ((replica id, n), ...))
        self.records: dict[str, dict[str, tuple[float, int, tuple]]] = {}
        self.next_due: dict[str, float] = {}  # deployment -> when its next sample is fed (monotonic)

    def report(self, name: str, key: str, queued: int, ongoing: tuple, now: float) -> None:
        self.records.setdefault(name, {})[key] = (now, int(queued), tuple((str(r), int(n)) for r, n in ongoing))

    def sample(self, name: str, now: float, interval: float) -> tuple[int, tuple[tuple[str, int], ...]]:
        """The routers' records summed (queued; in flight per replica), dropping routers silent
        for 2 intervals."""
        book = self.records.get(name, {})
        for key in [k for k, (t, _, _) in book.items() if now - t > 2 * interval]:
            del book[key]
        queued = 0
        ongoing: dict[str, int] = {}
        for _, q, pairs in book.values():
            queued += q
            for rid, n in pairs:
                ongoing[rid] = ongoing.get(rid, 0) + n
        return queued, tuple(sorted(ongoing.items()))

    def forget(self, name: str) -> None:
        self.records.pop(name, None)
        self.next_due.pop(name, None)

    def due(self, state: rc.State, now: float) -> list[tuple[str, float]]:
        """The autoscaled deployments whose interval came round (name, interval), their next
        sample scheduled; deployments no longer autoscaled are forgotten."""
        out = []
        for name in list(self.next_due):
            dep = state.deployments.get(name)
            if dep is None or not dep.config.autoscaler.autoscaling or dep.deleting:
                self.forget(name)
        for name, dep in state.deployments.items():
            auto = dep.config.autoscaler
            if not auto.autoscaling or dep.deleting:
                continue
            due = self.next_due.setdefault(name, now + auto.metrics_interval_s)
            if now >= due:
                self.next_due[name] = max(due + auto.metrics_interval_s, now + 0.5 * auto.metrics_interval_s)
                out.append((name, auto.metrics_interval_s))
        return out

    def wait_s(self, now: float) -> float:
        """How long the controller's loop may sleep (the earliest due sample, at most 1 s)."""
        return max(0.01, min([1.0, *(t - now for t in self.next_due.values())]))

