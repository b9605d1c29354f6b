"""Memory-booked placement on Ray: what each node declares to the core (issue 21).

Off by default: nodes join as they always did (GPUs counted). Once the user
asks for it (``api.book_memory(gpu_memory=..., cpu_cache=...)``), every node
with GPUs joins as a *device node*: ``NodeJoined.devices`` (each GPU's memory
in bytes) and ``cpu_cache_bytes`` (CPU memory for WARM copies of evicted
models), and the core books models with ``model_bytes`` on them by memory.

``gpu_memory``:

* ``"cuda"``: each GPU's total memory as CUDA reports it on that node
  (``torch.cuda.get_device_properties(i).total_memory``, read by a probe task
  there that sees every GPU);
* an int: that many bytes on each of the node's GPUs (Ray's ``GPU`` count:
  logical GPUs in CI);
* a list: one entry per GPU;
* a mapping: per node, keyed by node id or by the node's name label
  (``NODE_NAME_LABEL``; a scenario cluster names its nodes so), each value
  one of the above; ``"*"`` for the rest. A node it does not name keeps its
  GPUs counted.

``cpu_cache``: an int (every node), or a mapping like ``gpu_memory``'s.
``cold_dir``: where each node keeps its COLD files (default: the temp
directory's ``rankcore-cold``).

Pure apart from the probe (``probe_cuda``), so the rules are unit-tested.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import attrs

import rankcore as rc

from .cluster import SCENARIO_NODE_LABEL

__all__ = ["NODE_NAME_LABEL", "MemoryBooking", "probe_cuda"]

#: a node's name for ``book_memory``'s mappings (the scenario cluster sets it)
NODE_NAME_LABEL = SCENARIO_NODE_LABEL


def _bytes(value: Any, what: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise rc.InvalidConfig(f"book_memory: {what} must be a number of bytes >= 0, got {value!r}")
    return value


def _check(value: Any, what: str, per_gpu: bool) -> Any:
    if per_gpu and value == "cuda":
        return value
    if per_gpu and isinstance(value, (list, tuple)):
        return tuple(_bytes(v, f"{what}[{i}]") for i, v in enumerate(value))
    return _bytes(value, what)


@attrs.frozen
class MemoryBooking:
    """The user's ``book_memory`` options, checked (module docstring)."""

    gpu_memory: Any
    cpu_cache: Any = 0
    #: where each node's COLD files go (``warm_cache.Caches.cold_path``); None: the temp directory
    cold_dir: str | None = None

    @classmethod
    def make(cls, gpu_memory: Any, cpu_cache: Any = 0, cold_dir: str | None = None) -> MemoryBooking:
        if isinstance(gpu_memory, Mapping):
            gpu = {str(k): _check(v, f"gpu_memory[{k!r}]", True) for k, v in gpu_memory.items()}
            checked_gpu: Any = tuple(sorted(gpu.items()))
        else:
            checked_gpu = _check(gpu_memory, "gpu_memory", True)
        if isinstance(cpu_cache, Mapping):
            checked_cache: Any = tuple(sorted((str(k), _bytes(v, f"cpu_cache[{k!r}]")) for k, v in cpu_cache.items()))
        else:
            checked_cache = _bytes(cpu_cache, "cpu_cache")
        if cold_dir is not None and not isinstance(cold_dir, str):
            raise rc.InvalidConfig(f"book_memory: cold_dir must be a path (str), got {cold_dir!r}")
        return cls(gpu_memory=checked_gpu, cpu_cache=checked_cache, cold_dir=cold_dir)

    @staticmethod
    def _for(value: Any, joined: rc.NodeJoined) -> Any:
        if not isinstance(value, tuple) or not value or not isinstance(value[0], tuple):
            return value  # one value for every node
        per = dict(value)
        name = dict(joined.labels).get(NODE_NAME_LABEL)
        for key in (joined.node_id, name, "*"):
            if key is not None and key in per:
                return per[key]
        return None

    def wants_cuda(self, joined: rc.NodeJoined) -> bool:
        """This node's GPU memory is read from CUDA (a probe there)."""
        return self._for(self.gpu_memory, joined) == "cuda"

    def declare(self, joined: rc.NodeJoined, cuda: tuple[int, ...] | None = None) -> rc.NodeJoined:
        """``joined`` with its devices and CPU cache (``cuda``: the probe's answer for that
        node). A node without GPUs, or one the options do not name, is left as it is. With CUDA
        the node's ``GPU`` count becomes the devices' (a logical count that differs is Ray's)."""
        res = dict(joined.resources)
        gpus = int(res.get("GPU", 0))
        mem = self._for(self.gpu_memory, joined)
        if mem is None or (gpus <= 0 and mem != "cuda"):
            return joined
        if mem == "cuda":
            if not cuda:
                return joined
            devices = tuple(cuda)
        elif isinstance(mem, tuple):
            if len(mem) != gpus:
                raise rc.InvalidConfig(f"book_memory: gpu_memory for node {joined.node_id} lists {len(mem)} "
                                       f"GPUs, Ray says it has {gpus}")
            devices = mem
        else:
            devices = (int(mem),) * gpus
        res["GPU"] = float(len(devices))  # (whole GPUs, one per device entry: the core checks it)
        cache = self._for(self.cpu_cache, joined) or 0
        return attrs.evolve(joined, resources=res, devices=devices, cpu_cache_bytes=int(cache))


def probe_cuda() -> tuple[int, ...]:
    """Each CUDA device's total memory on this node (a task run there, seeing every GPU)."""
    try:
        import torch
    except ImportError:
        return ()
    if not torch.cuda.is_available():
        return ()
    return tuple(int(torch.cuda.get_device_properties(i).total_memory) for i in range(torch.cuda.device_count()))
