"""The replica actor: hosts one instance of the user's class.

A threaded Ray actor (``max_concurrency`` > 1), so ``ping`` and ``watch``
answer while requests run, and so a call pending on ``watch`` fails the
moment the actor dies: death is noticed from Ray itself, not from a poll.
"""

from __future__ import annotations

import inspect
import threading
from typing import Any

import rankcore as rc

from . import context


def _takes_rank(fn: Any) -> bool:
    try:
        return "rank" in inspect.signature(fn).parameters
    except (TypeError, ValueError):
        return False


class ReplicaActor:
    def __init__(self, deployment: str, replica_id: str, cls: type, args: tuple, kwargs: dict,
                 lineage: int | None = None) -> None:
        self.deployment, self.replica_id, self.lineage = deployment, replica_id, lineage
        self.cls, self.args, self.kwargs = cls, args, kwargs
        self.instance: Any = None
        self.user_config: Any = rc.UNKNOWN
        self.version = 0
        self.phase = "pending"
        self.world_size = 0
        self.rank: rc.ReplicaRank | None = None
        self._stop = threading.Event()
        self._inflight = 0
        self._idle = threading.Condition()

    # ------------------------------------------------------------ controller
    def node_id(self) -> str:
        import ray

        return ray.get_runtime_context().get_node_id()

    def _set_context(self) -> None:
        assert self.rank is not None
        context._set(context.ReplicaContext(deployment=self.deployment, replica_id=self.replica_id,
                                            rank=self.rank, world_size=self.world_size,
                                            user_config=self.user_config))

    def initialize(self, rank: tuple, world_size: int, user_config: Any, call_reconfigure: bool,
                   pass_rank: bool) -> None:
        self.rank = rc.ReplicaRank(rank=rank[0], node_rank=rank[1], local_rank=rank[2])
        self.world_size, self.user_config = world_size, user_config
        self.phase = "starting"
        self._set_context()
        self.instance = self.cls(*self.args, **self.kwargs)
        if call_reconfigure:
            self._call_reconfigure(user_config, pass_rank)
        self.phase = "running"

    def _call_reconfigure(self, user_config: Any, pass_rank: bool) -> None:
        fn = getattr(self.instance, "reconfigure", None)
        if fn is None:
            return
        if pass_rank and _takes_rank(fn):
            fn(user_config, rank=self.rank)
        else:
            fn(user_config)

    def reconfigure(self, rank: tuple, world_size: int, user_config: Any, version: int, call_user: bool,
                    pass_rank: bool) -> int:
        self.rank = rc.ReplicaRank(rank=rank[0], node_rank=rank[1], local_rank=rank[2])
        self.world_size, self.user_config, self.version = world_size, user_config, version
        self._set_context()  # the context shows the new rank before user code runs
        if call_user:
            self._call_reconfigure(user_config, pass_rank)
        return version

    def update_world_size(self, world_size: int) -> None:
        self.world_size = world_size
        if self.rank is not None:
            self._set_context()

    def report(self) -> dict:
        """What this replica tells a recovering controller."""
        return {
            "replica_id": self.replica_id,
            "deployment": self.deployment,
            "rank": self.rank.as_tuple() if self.rank is not None else None,
            "node_id": self.node_id(),
            "phase": self.phase,
            "world_size": self.world_size,
            "version": self.version,
            "user_config": self.user_config,
            "lineage": self.lineage,
        }

    def ping(self) -> bool:
        """Health check: answers while requests run (a threaded actor); calls the
        user's ``check_health()`` if the class has one (raise = unhealthy)."""
        fn = getattr(self.instance, "check_health", None)
        if fn is not None:
            fn()
        return True

    def watch(self) -> None:
        """Never returns while the replica lives: the controller keeps one call
        pending so the actor's death surfaces at once as an error."""
        self._stop.wait()

    def prepare_stop(self, drain_timeout: float = 30.0) -> None:
        """Graceful stop: let the calls in flight finish (up to ``drain_timeout``)."""
        self.phase = "stopping"
        with self._idle:
            self._idle.wait_for(lambda: self._inflight == 0, timeout=drain_timeout)
        fn = getattr(self.instance, "__del__", None)
        self._stop.set()
        if fn is not None:
            try:
                fn()
            except Exception:  # pragma: no cover - best effort
                pass

    # --------------------------------------------------------------- requests
    def handle_request(self, method: str, args: tuple, kwargs: dict) -> Any:
        if self.instance is None:
            raise RuntimeError(f"replica {self.replica_id} is not initialised yet")
        fn = getattr(self.instance, method)
        with self._idle:
            self._inflight += 1
        try:
            return fn(*args, **kwargs)
        finally:
            with self._idle:
                self._inflight -= 1
                self._idle.notify_all()
