"""The Ray executor as an ``ExecutorSubject`` for ``rankcore.testing.make_timeline_machine``.

The same random timelines the simulator is checked with, carried out on real
replica actors: every snapshot the controller writes is checked with every
invariant, and after settling each deployment must be healthy with contiguous
ranks — and every replica's own context must agree with the controller.
Ray has no virtual clock, so ``advance(s)`` sleeps ``s * time_scale``, and the
fingerprint is the settled outcome (per deployment: global ranks, world size,
user_config), which equal action sequences must reproduce.
"""

from __future__ import annotations

import json
import time
from typing import Any

import ray

from .api.deployments import ask, get_controller
from .control.controller import NAMESPACE, actor_name
from .scenario import CLASSES, _holder

__all__ = ["RaySubject"]

_KIND = {"llm": "with_rank", "embed": "plain"}


class RaySubject:
    capabilities = frozenset({"controller_crash"})
    time_scale = 0.01
    settle_timeout = 60.0

    def __init__(self) -> None:
        self.ctl = get_controller()
        ask(self.ctl, "reset")
        ask(self.ctl, "record", {"scenario": "property timeline"})
        self.applied: dict[str, dict] = {}
        self._text: list[str] = []  # the whole trace
        self._unread: list[str] = []  # what snapshots() has not returned yet
        self._killed: list[tuple[str, str]] = []  # replicas crash_rank killed, maybe not yet seen dead

    def _apply(self, name: str) -> None:
        cur = self.applied[name]
        ask(self.ctl, "apply", name, cur["replicas"], cur["user_config"], CLASSES[_KIND.get(name, "with_rank")],
            (), {}, {"num_cpus": 0.01}, 5, None)

    def deploy(self, name: str, replicas: int, user_config: Any) -> None:
        self.applied[name] = {"replicas": replicas, "user_config": user_config}
        self._apply(name)

    def scale(self, name: str, replicas: int) -> None:
        self.applied[name]["replicas"] = replicas
        ask(self.ctl, "scale", name, replicas, ())

    def update_config(self, name: str, user_config: Any) -> None:
        self.applied[name]["user_config"] = user_config
        self._apply(name)

    def crash_rank(self, name: str, rank: int) -> None:
        rid = _holder(name, rank)
        if rid is not None:
            try:
                ray.kill(ray.get_actor(actor_name(name, rid), namespace=NAMESPACE), no_restart=True)
            except ValueError:
                return  # gone meanwhile
            self._killed.append((name, rid))

    def lose_node(self) -> None:  # pragma: no cover - not in capabilities (one local node)
        raise NotImplementedError

    def add_node(self) -> None:  # pragma: no cover
        raise NotImplementedError

    def crash_controller(self) -> None:
        self._keep(ask(self.ctl, "halt"))  # the trace so far lives in the controller: keep it
        ray.kill(self.ctl, no_restart=False)
        time.sleep(0.5)  # let the kill land before the next call (ask() waits out the restart)

    def advance(self, seconds: float) -> None:
        time.sleep(seconds * self.time_scale)

    def settle(self) -> bool:
        # A killed replica's death reaches the controller a moment later (Ray
        # tells it, then it batches deaths for death_batch_s): until then the
        # deployment may still look healthy with the dead replica in it.
        deadline = time.monotonic() + self.settle_timeout
        while self._killed and time.monotonic() < deadline:
            name, rid = self._killed[-1]
            if rid in ask(self.ctl, "ranks", name):
                time.sleep(0.05)
            else:
                self._killed.pop()
        ok = all(ask(self.ctl, "wait_healthy", name, self.settle_timeout, timeout=self.settle_timeout + 60)
                 for name in sorted(self.applied))
        if ok:
            self._check_contexts()
            self._check_trace()
        return ok

    def _check_trace(self) -> None:
        """The whole trace so far passes ``rankcore check-trace``: no event
        rejected, no replica gone unexplained, every rank rule."""
        from ..checktrace import check_trace_lines

        self._keep(ask(self.ctl, "drain_trace"))
        report = check_trace_lines("".join(self._text).splitlines(), "<ray property trace>")
        assert report.ok, report.violations[:5]

    def _check_contexts(self) -> None:
        """Each serving replica's own context shows the rank and world size the core holds."""
        for name in sorted(self.applied):
            ranks = ask(self.ctl, "ranks", name)
            want = self.applied[name]["replicas"]
            for rid, rank in ranks.items():
                r = ray.get(ray.get_actor(actor_name(name, rid), namespace=NAMESPACE).report.remote(), timeout=30)
                assert tuple(r["rank"]) == tuple(rank), f"{rid}: context {r['rank']} but the core holds {rank}"
                assert r["world_size"] == want, f"{rid}: world_size {r['world_size']}, target {want}"

    def state(self) -> Any:
        from ray import cloudpickle

        return cloudpickle.loads(ask(self.ctl, "state"))

    def _keep(self, text: str) -> None:
        self._text.append(text)
        self._unread.append(text)

    def snapshots(self) -> list:
        self._keep(ask(self.ctl, "drain_trace"))
        text, self._unread = "".join(self._unread), []
        return [json.loads(line) for line in text.splitlines() if line.startswith('{"kind":"snapshot"')]

    def fingerprint(self) -> Any:
        state = self.state()
        out = {}
        for name in sorted(self.applied):
            dep = state.deployments.get(name)
            out[name] = (sorted(dep.ranks.global_rank(r) for r in dep.replicas), dep.world_size,
                         json.dumps(self.applied[name]["user_config"], sort_keys=True, default=repr))
        return out
