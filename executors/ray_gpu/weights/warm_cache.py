"""Each node's WARM cache: the weights an evicted replica left in CPU memory (issue 21).

The core decides what is cached where (``EvictReplica(to="warm")``, the copy
used up by a ``PlaceReplica(source="warm")``, ``DropWarmCopy``); this actor
only holds the bytes. One per node, ``rankcore-warm:<node id>``: detached,
pinned to its node (a hard node affinity), reserving no CPU. An entry is
keyed by (deployment, replica id) and holds a ``TieredWeights`` in WARM: its
own host buffer, page-locked when the node has CUDA (the cache's process
then sees the GPUs). A dropped entry is written to the node's COLD file
first (WARM -> COLD: a later cold start there reads it), then freed. Bytes
are the tensors' real sizes (``TieredWeights.nbytes``).

``Caches`` is the controller's side: the cache actor of each node, and the
path of each node's COLD file of a deployment,
``<cold_dir>/<epoch>/<node id>/<deployment>.safetensors`` (the epoch of
this run: a ``reset`` starts a new one, so a file from before is never read).
The files are removed when their owner stops: a deleted deployment's once the
core forgets it, the epoch's on a ``reset`` and when the controller is told
its run is over (``Controller.remove_cold_files``: ``run_locally``, a scenario
run), each node's by its own cache (``remove_cold``); the default root,
``<temp dir>/rankcore-cold``, goes with its last epoch.
"""

from __future__ import annotations

import logging
import os
import shutil
import tempfile
from collections.abc import Iterable
from typing import Any, Protocol

import ray

from ..base.replicas import NAMESPACE

__all__ = ["Caches", "WarmCache", "cache_name", "held_copies", "warm_cache"]

log = logging.getLogger("rankcore.ray.controller")


def cache_name(node_id: str) -> str:
    return f"rankcore-warm:{node_id}"


class WarmCache:
    """(deployment, replica id) -> the WARM copy that replica left on this node."""

    def __init__(self) -> None:
        self.entries: dict[tuple[str, str], Any] = {}  # a TieredWeights (WARM), or None for a class without weights

    def keep(self, deployment: str, replica_id: str, flat: Any) -> int:
        """Hold a copy of ``flat`` (``FlatWeights``, resolved by Ray from the evicted replica's
        answer; None: its class holds no weights) as that replica's WARM copy; returns its bytes."""
        tiered = None
        if flat is not None:
            from .weights import TieredWeights

            tiered = TieredWeights.from_flat(flat, tier="warm", name=f"{deployment}.{replica_id}")
        self.entries[(deployment, replica_id)] = tiered
        return tiered.nbytes if tiered is not None else 0

    def take(self, deployment: str) -> tuple[str | None, Any]:
        """Use up a WARM copy of ``deployment`` (a placement from it: the core's books no longer
        hold it), the smallest, then the oldest: ``(replica id it came from, FlatWeights or
        None)``; ``(None, None)`` if this node holds none. Called with ``num_returns=2``, so
        the weights go to the replica by their own ObjectRef, not through the controller."""
        mine = [(t.nbytes if t is not None else 0, i, key) for i, (key, t) in enumerate(self.entries.items())
                if key[0] == deployment]
        if not mine:
            return None, None
        key = min(mine)[2]
        tiered = self.entries.pop(key)
        return key[1], (tiered.to_flat() if tiered is not None else None)

    def drop(self, deployment: str, replica_id: str, cold_path: str | None = None) -> int:
        """``DropWarmCopy``: free that copy; with ``cold_path``, write it there first (WARM ->
        COLD). Returns the bytes freed (0: none held)."""
        tiered = self.entries.pop((deployment, replica_id), None)
        if tiered is None:
            return 0
        n = int(tiered.nbytes)
        if cold_path is not None:
            tiered.to_cold(cold_path)
        return n

    def info(self) -> dict:
        """Entry -> bytes held (what tests and tools read)."""
        return {f"{d}/{r}": (t.nbytes if t is not None else 0) for (d, r), t in self.entries.items()}

    def listed(self) -> list[tuple[str, str, int]]:
        """``(deployment, replica id, bytes)`` of each entry, in the order they came (what a
        recovering controller tells the core: ``ControllerRecovered.warm_copies``)."""
        return [(d, r, t.nbytes if t is not None else 0) for (d, r), t in self.entries.items()]

    def held_bytes(self) -> int:
        """CPU memory the entries hold (``TieredWeights.host_nbytes``)."""
        return sum(t.host_nbytes for t in self.entries.values() if t is not None)

    def forget_all(self) -> None:
        self.entries.clear()

    def remove_cold(self, root: str, epoch: str, node_id: str, deployment: str | None = None,
                    prune_root: bool = False) -> None:
        """Remove this node's COLD files of ``epoch`` (``remove_cold_files``; ``deployment``: its
        only), then the folders they leave empty (the root itself only if ``prune_root``)."""
        remove_cold_files(root, epoch, node_id, deployment, prune_root)


def remove_cold_files(root: str, epoch: str, node_id: str, deployment: str | None = None,
                      prune_root: bool = False) -> None:
    """Remove ``<root>/<epoch>/<node id>`` (``deployment``: its ``<deployment>.safetensors`` only)
    and the folders that leaves empty, up to ``<root>/<epoch>`` (up to ``root`` with ``prune_root``:
    the default temp one, not a folder the user named). What another run still holds stays."""
    here = os.path.join(root, epoch, node_id)
    if deployment is None:
        shutil.rmtree(here, ignore_errors=True)
    else:
        try:
            os.unlink(os.path.join(here, f"{deployment}.safetensors"))
        except FileNotFoundError:
            pass
    for folder in (here, os.path.join(root, epoch)) + ((root,) if prune_root else ()):
        try:
            os.rmdir(folder)
        except OSError:  # not empty (another node's, another run's, another deployment's), or gone
            pass


async def held_copies(node_ids: Iterable[str], timeout_s: float) -> list[tuple[str, str, str, int]]:
    """``(node id, deployment, replica id, bytes)`` of every entry the caches of ``node_ids`` hold,
    node by node, each in the order they came. A cache is looked up by name, never made (a node
    without one holds none); one that is gone or does not answer in ``timeout_s`` holds none
    either (its copies are lost: the core places from disk)."""
    import asyncio

    async def one(node_id: str) -> list[tuple[str, str, int]]:
        try:
            actor = ray.get_actor(cache_name(node_id), namespace=NAMESPACE)
        except ValueError:
            return []
        try:
            return list(await asyncio.wait_for(actor.listed.remote(), timeout=timeout_s))
        except Exception as exc:
            log.warning("the WARM cache of node %s did not list its copies: %r", node_id, exc)
            return []

    nodes = list(node_ids)
    held = await asyncio.gather(*(one(n) for n in nodes))
    return [(n, d, r, int(b)) for n, entries in zip(nodes, held) for d, r, b in entries]


def warm_cache(node_id: str, cuda: bool = False) -> Any:
    """The node's cache actor (made on first use, on that node; ``cuda``: it sees the GPUs, so
    its copies are pinned)."""
    from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

    from ..base.replicas import NOSET_CUDA

    extra: dict[str, Any] = {"runtime_env": {"env_vars": {NOSET_CUDA: "1"}}} if cuda else {}
    return ray.remote(WarmCache).options(
        name=cache_name(node_id), namespace=NAMESPACE, lifetime="detached", get_if_exists=True, num_cpus=0,
        max_restarts=0, scheduling_strategy=NodeAffinitySchedulingStrategy(node_id=node_id, soft=False), **extra,
    ).remote()


class LedgerView(Protocol):
    """What the caches read of the controller's ``Ledger`` (``executors.ray_gpu.control.ledger``,
    above this plane): its clock's epoch and time, the GPUs each node reported, the memory
    booking, the tier log and the driver's trace."""

    t0: float
    cuda: dict[str, tuple[int, ...]]
    booking: Any
    tier_log: list[dict]
    driver: Any

    def now(self) -> float: ...


class Caches:
    """The controller's view of the nodes' WARM caches and COLD files (module docstring)."""

    def __init__(self, ledger: LedgerView) -> None:
        self.ledger = ledger
        self.actors: dict[str, Any] = {}
        #: node id -> the COLD root of the paths given for it this epoch (what ``remove_cold`` removes)
        self.cold: dict[str, str] = {}

    def get(self, node_id: str) -> Any:
        if node_id not in self.actors:
            self.actors[node_id] = warm_cache(node_id, bool(self.ledger.cuda.get(node_id)))
        return self.actors[node_id]

    def cold_path(self, node_id: str | None, deployment: str) -> str:
        booking = self.ledger.booking
        root = getattr(booking, "cold_dir", None) or os.path.join(tempfile.gettempdir(), "rankcore-cold")
        if node_id is not None:
            self.cold[node_id] = root  # (removed when their owner stops: ``remove_cold``)
        return os.path.join(root, f"{self.ledger.t0:.6f}", node_id or "unknown", f"{deployment}.safetensors")

    async def remove_cold(self, deployment: str | None = None) -> None:
        """Remove this epoch's COLD files (``deployment``: its only) on every node given a COLD
        path, each by its node's cache; a node that is gone took its files with it."""
        epoch = f"{self.ledger.t0:.6f}"
        default = os.path.join(tempfile.gettempdir(), "rankcore-cold")
        for node, root in sorted(self.cold.items()):
            try:
                await self.get(node).remove_cold.remote(root, epoch, node, deployment, root == default)
            except Exception as exc:
                log.warning("the COLD files of node %s were not removed: %r", node, exc)
        if deployment is None:
            self.cold.clear()

    def missing(self, rid: str, node_id: str | None, deployment: str) -> None:
        """A replica placed from a WARM copy that its node's cache does not hold (lost with a
        failed eviction, or its cache's process): it loads COLD, and the trace says so."""
        led = self.ledger
        log.warning("replica %s: no WARM copy on its node: loading COLD", rid)
        led.tier_log.append({"replica": rid, "deployment": deployment, "move": "warm_copy_missing"})
        if led.driver.trace is not None:  # (the simulator's record of the same fact)
            led.driver.trace.fault(led.now(), "warm_copy_missing", node=node_id, deployment=deployment, replica=rid,
                                   command="PlaceReplica", loads_from="cold")

    async def drop(self, node_id: str, deployment: str, replica_id: str) -> None:
        led = self.ledger
        entry = {"replica": replica_id, "deployment": deployment, "move": "drop", "nbytes": 0, "error": ""}
        try:
            entry["nbytes"] = await self.get(node_id).drop.remote(deployment, replica_id,
                                                                  self.cold_path(node_id, deployment))
        except Exception as exc:
            entry["error"] = repr(exc)[:500]
            log.warning("DropWarmCopy(%s, %s, %s) failed: %r", node_id, deployment, replica_id, exc)
        led.tier_log.append(entry)

    async def info(self) -> dict:
        """Node -> its cache's entries (bytes each) and the CPU memory they hold."""
        out = {}
        for node, actor in sorted(self.actors.items()):
            try:
                out[node] = {"entries": await actor.info.remote(), "held_bytes": await actor.held_bytes.remote()}
            except Exception as exc:
                out[node] = {"error": repr(exc)}
        return out

    async def forget_all(self) -> None:
        """Empty every cache (``reset``): what the next run's core knows nothing of."""
        for actor in list(self.actors.values()):
            try:
                await actor.forget_all.remote()
            except Exception:
                pass
