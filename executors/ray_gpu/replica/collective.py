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
an error ``pg.failed(wait_s)``: leave the broken epoch at once, so no survivor waits out its timeout
on this one, and wait for the next), or from ``on_group_changed(group)``, which the replica calls
after each ``ReformGroup`` (docs/groups.md).
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
        #: the rendezvous of the epoch joined: rank 0's TCPStore, ``"host:port"`` (None: none joined)
        self.address: str | None = None
        #: the epoch a collective of which failed (``failed``), as (group id, epoch, until when it is not
        #: joined again unless no newer one came: a failure that was no member's death)
        self._broken: tuple[str, int, float] | None = None

    @property
    def epoch(self) -> int:
        """The epoch joined (0: none)."""
        return self.group.epoch if self.group is not None else 0

    def ensure(self, wait_s: float = 0.0) -> rc.GroupContext:
        """Join the newest epoch told unless joined already; returns it. Waits up to ``wait_s`` for a
        first epoch; raises ``GroupReforming`` when there is none, or when the rendezvous fails (a
        member died meanwhile: a newer epoch is coming)."""
        group = newest()
        if (group is None or self._is_broken(group)) and wait_s > 0:
            group = self.wait_newer(wait_s) or group
        if group is None:
            raise GroupReforming("no epoch of the collective group has formed yet")
        if self._is_broken(group):
            raise GroupReforming(f"epoch {group.epoch} of {group.group_id} failed; waiting for the next one")
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

    def failed(self, wait_s: float = 0.0) -> rc.GroupContext | None:
        """A collective of the epoch joined failed (a member died mid-call): leave it at once and do not
        join it again. Leaving closes this member's connections, so a member still blocked waiting on
        this one fails now instead of at its timeout, and every survivor is free for the next epoch
        the moment the core tells it. Waits up to ``wait_s`` for that epoch (the newest, or None).
        (If no newer epoch comes within ``timeout_s``, the failure was no member's death: ``ensure``
        joins the same epoch again.)"""
        group = self.group
        self.destroy()
        if group is not None:  # (from when it has left: leaving may take a while)
            self._broken = (group.group_id, group.epoch, time.monotonic() + self.timeout_s)
        return self.wait_newer(wait_s) if wait_s > 0 else None

    def _is_broken(self, group: rc.GroupContext) -> bool:
        b = self._broken
        return b is not None and (b[0], b[1]) == (group.group_id, group.epoch) and time.monotonic() < b[2]

    def _past(self, group: rc.GroupContext) -> bool:
        """``group`` is no newer than the epoch joined or failed (nothing new to join)."""
        mine = self.group
        if mine is not None and group.group_id == mine.group_id and group.epoch <= mine.epoch:
            return True
        return self._is_broken(group)

    def wait_newer(self, timeout_s: float) -> rc.GroupContext | None:
        """Wait up to ``timeout_s`` for an epoch newer than the one joined (or failed); the newest
        told (None: none came)."""
        deadline = time.monotonic() + timeout_s
        with _cond:
            while _newest is None or self._past(_newest):
                left = deadline - time.monotonic()
                if left <= 0:
                    return None
                _cond.wait(min(left, 0.1))
            return _newest

    def destroy(self) -> None:
        """Leave the group joined (if any): its process group goes; rank 0's store and key go."""
        import torch.distributed as dist

        if dist.is_initialized():
            dist.destroy_process_group()
        if self._key is not None:
            _kv_del(self._key)
        self._store = self._key = self.address = None
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
            address = f"{host}:{store.port}"
            _kv_put(key, address)
            self._key = key
        else:
            store, address = _connect(group, key, self.timeout_s)
        self._store, self.address = store, address
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


def _superseded(group: rc.GroupContext) -> bool:
    n = _newest
    return n is not None and n.group_id == group.group_id and n.epoch > group.epoch


def _connect(group: rc.GroupContext, key: str, timeout_s: float) -> tuple[Any, str]:
    """A client of the TCPStore rank 0 published under ``key``, and its address, within ``timeout_s``: the address read
    again after a refused connection (a rank 0 that joined the same epoch again published a new one),
    given up at once when a newer epoch is told (this one will never form)."""
    import torch.distributed as dist

    deadline = time.monotonic() + timeout_s
    while True:
        address = _kv_wait(group, key, deadline)
        host, _, port = address.rpartition(":")
        left = deadline - time.monotonic()
        try:
            return dist.TCPStore(host, int(port), group.world_size, is_master=False,
                                 timeout=datetime.timedelta(seconds=max(0.1, min(2.0, left)))), address
        except Exception:
            if time.monotonic() >= deadline or _superseded(group):
                raise
            time.sleep(0.05)


def _kv_wait(group: rc.GroupContext, key: str, deadline: float) -> str:
    """The address rank 0 published under ``key``, waiting until ``deadline`` (``time.monotonic``),
    or until a newer epoch is told."""
    from ray.experimental import internal_kv

    pause = 0.01
    while True:
        got = internal_kv._internal_kv_get(key, namespace=KV_NAMESPACE)
        if got:
            return got.decode() if isinstance(got, bytes) else str(got)
        if _superseded(group):
            raise GroupReforming(f"epoch {group.epoch} of {group.group_id} was superseded before it formed")
        if time.monotonic() >= deadline:
            raise TimeoutError(f"no rendezvous for {key} by its deadline (its rank 0 has not published)")
        time.sleep(pause)
        pause = min(pause * 2, 0.2)
