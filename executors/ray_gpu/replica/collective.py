"""A ``torch.distributed`` process group that follows the core's collective-group epochs.

A ``collective_group`` deployment's replicas form one group (a gang deployment: one per gang); the
core raises the group's epoch when its members change and tells each member once
(``rankcore.ReformGroup``), and only when every member runs (rankcore.control.groups). The replica
context's ``group`` shows the newest epoch told. ``ProcessGroup.ensure()`` joins it: it destroys the
group of the older epoch in this process and joins the new one through a rendezvous fenced by the
epoch: the epoch's rank 0 starts a ``torch.distributed.TCPStore`` and publishes its address in
Ray's GCS key-value store under the epoch's own key (``GroupContext.rendezvous_key``: the epoch and
its members); the others read it there. A member of an older epoch looks up an older key and never
reaches the new store, so it cannot be counted in the new epoch nor hold the others up.

Survivors keep their process, weights and place: only the communication group is made again, in
about the time the replacement takes to start plus one rendezvous. While the group re-forms, a call
that needs it raises ``GroupReforming`` (a clear error, never a hang: every wait is bounded).

Use it from the user's own loop (a data-parallel step: ``pg.ensure()`` then a collective, and on
an error ``pg.wait_newer()``), or from ``on_group_changed(group)``, which the replica calls after
each ``ReformGroup`` (docs/groups.md).
"""

from __future__ import annotations

import datetime
import threading
import time
from typing import Any

import rankcore as rc

__all__ = ["ProcessGroup", "GroupReforming", "told", "newest"]

#: the GCS key-value namespace the rendezvous addresses are published in
KV_NAMESPACE = "rankcore_groups"

_cond = threading.Condition()
_newest: rc.GroupContext | None = None


class GroupReforming(RuntimeError):
    """The collective group is re-forming (or was never formed): the call that needs it cannot run
    now. Retry, or wait for the next epoch (``ProcessGroup.wait_newer``)."""


def told(group: rc.GroupContext) -> None:
    """The replica was told ``group`` (``ReformGroup``): wake whoever waits for a newer epoch."""
    global _newest
    with _cond:
        if _newest is None or group.epoch > _newest.epoch or group.group_id != _newest.group_id:
            _newest = group
        _cond.notify_all()


def newest() -> rc.GroupContext | None:
    """The newest epoch this replica was told (None: none yet)."""
    return _newest


class ProcessGroup:
    """This replica's ``torch.distributed`` default group, kept at the newest epoch told.

    ``backend``: ``"gloo"`` (CPU) or ``"nccl"`` (GPUs); ``timeout_s`` bounds the rendezvous and each
    collective (a member gone mid-call makes the call fail within it, not hang)."""

    def __init__(self, backend: str = "gloo", timeout_s: float = 30.0) -> None:
        self.backend, self.timeout_s = backend, timeout_s
        self.group: rc.GroupContext | None = None  # the epoch joined
        self._store: Any = None  # the TCPStore of the epoch joined (rank 0 serves it)
        self._key: str | None = None  # the KV key rank 0 published for it

    @property
    def epoch(self) -> int:
        """The epoch joined (0: none)."""
        return self.group.epoch if self.group is not None else 0

    def ensure(self, wait_s: float = 0.0) -> rc.GroupContext:
        """Join the newest epoch told unless joined already; returns it. Waits up to ``wait_s`` for a
        first epoch; raises ``GroupReforming`` when there is none, or when the rendezvous fails (a
        member died meanwhile: a newer epoch is coming)."""
        group = newest()
        if group is None and wait_s > 0:
            group = self.wait_newer(wait_s)
        if group is None:
            raise GroupReforming("no epoch of the collective group has formed yet")
        if self.group is not None and group.epoch == self.group.epoch and group.group_id == self.group.group_id:
            return self.group
        self.destroy()
        try:
            self._join(group)
        except Exception as exc:
            self.destroy()
            raise GroupReforming(f"joining epoch {group.epoch} of {group.group_id} failed: {exc}") from exc
        self.group = group
        return group

    def wait_newer(self, timeout_s: float) -> rc.GroupContext | None:
        """Wait up to ``timeout_s`` for an epoch newer than the one joined; the newest told (None:
        none came)."""
        deadline = time.monotonic() + timeout_s
        with _cond:
            while _newest is None or (self.group is not None and _newest.epoch <= self.group.epoch
                                      and _newest.group_id == self.group.group_id):
                left = deadline - time.monotonic()
                if left <= 0:
                    return _newest if self.group is None else None
                _cond.wait(left)
            return _newest

    def destroy(self) -> None:
        """Leave the group joined (if any): its process group goes; rank 0's store and key go."""
        import torch.distributed as dist

        if dist.is_initialized():
            dist.destroy_process_group()
        if self._key is not None:
            _kv_del(self._key)
        self._store = self._key = None
        self.group = None

    def _join(self, group: rc.GroupContext) -> None:
        import torch.distributed as dist

        timeout = datetime.timedelta(seconds=self.timeout_s)
        key = group.rendezvous_key
        if group.rank == 0:
            import ray

            host = ray.util.get_node_ip_address()
            store = dist.TCPStore(host, 0, group.world_size, is_master=True, timeout=timeout,
                                  wait_for_workers=False)
            _kv_put(key, f"{host}:{store.port}")
            self._key = key
        else:
            address = _kv_wait(key, self.timeout_s)
            host, _, port = address.rpartition(":")
            store = dist.TCPStore(host, int(port), group.world_size, is_master=False, timeout=timeout)
        self._store = store
        dist.init_process_group(self.backend, store=dist.PrefixStore(f"epoch-{group.epoch}", store),
                                rank=group.rank, world_size=group.world_size, timeout=timeout)


def _kv_put(key: str, value: str) -> None:
    from ray.experimental import internal_kv

    internal_kv._internal_kv_put(key, value.encode(), overwrite=True, namespace=KV_NAMESPACE)


def _kv_del(key: str) -> None:
    from ray.experimental import internal_kv

    try:
        internal_kv._internal_kv_del(key, namespace=KV_NAMESPACE)
    except Exception:  # (the GCS going away with the cluster: nothing left to clean)
        pass


def _kv_wait(key: str, timeout_s: float) -> str:
    """The address rank 0 published under ``key``, waiting up to ``timeout_s``."""
    from ray.experimental import internal_kv

    deadline = time.monotonic() + timeout_s
    pause = 0.01
    while True:
        got = internal_kv._internal_kv_get(key, namespace=KV_NAMESPACE)
        if got:
            return got.decode() if isinstance(got, bytes) else str(got)
        if time.monotonic() >= deadline:
            raise TimeoutError(f"no rendezvous for {key} within {timeout_s:g} s (its rank 0 has not published)")
        time.sleep(pause)
        pause = min(pause * 2, 0.2)
