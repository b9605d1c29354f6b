"""Weights shared once with the replicas on the trainer's node, then updated in place (issue 21, "Weight sync").

An RL trainer pushes new weights every step. Through Ray's object store each
push copies every byte twice (into the store, out of it), and for weights on
a GPU a pinned round trip through the host as well. Handing the replicas a
CUDA IPC handle at each push is no better: opening one took 189-284 ms for
1 GiB on an H100, against 40 ms for the pinned round trip. So the memory is
**shared once and updated in place**:

* ``share_weights(state_dict)`` (in the trainer's process) copies the weights
  into one flat buffer that other processes on the node can map: CUDA memory
  exported by CUDA IPC when the tensors are on a GPU, a file under
  ``/dev/shm`` otherwise. It returns a ``WeightsShare``, which owns the
  buffer (keep it alive while replicas use it);
* ``share.write(state_dict, version)`` copies new weights in (device to
  device on a GPU) and stamps ``version``;
  ``push_weights(name, share, version)`` then sends each replica the small
  ``SharedWeights`` handle, not the bytes;
* a replica opens a handle the first time it sees it (``open_shared``; the
  cost above, once) and at every push copies from the mapping into its own
  buffer (``ReplicaWeights.update``): a receive took 0.66 ms on the H100.

Why each replica copies instead of serving from the trainer's memory: a
replica must hold exactly the version the core believes it holds, while the
trainer goes on writing the next one. The **stamp** (8 bytes of host shared
memory beside the buffer) says which version the buffer holds: ``write``
sets it to -1 first and to ``version`` once the bytes are in (after a device
synchronise), and a reader checks it before and after its copy; a buffer
that holds another version, or was written during the copy, is refused
(``SharedWeightsMoved``) rather than served half-written. So a trainer waits
for a push to be taken (``push_weights(..., wait=True)``) before writing
the next version into the same share.

Replicas on another node cannot map the buffer. ``push_weights`` then also
puts a CPU copy in the object store (``SharedWeights.fallback``) when a
replica of the deployment runs elsewhere at the time of the push; a replica
started elsewhere later without one fails its start with
``SharedWeightsUnavailable`` naming both nodes (push again, by state_dict,
to reach it).

CUDA note: Ray gives each actor its own ``CUDA_VISIBLE_DEVICES``, so device
indices differ between processes; the handle names the GPU by its UUID and
the reader maps it to its own index. This path ran on a lent H100: a test
that CI skips without CUDA (``tests/unit/test_shared_weights.py``) and
``benchmarks/bench_shared_weights.py --device cuda`` on Ray (docs/benchmarks.md);
the POSIX shared-memory path is what CI runs.
"""

from __future__ import annotations

import os
import uuid
import weakref
from collections.abc import Mapping
from typing import Any

import attrs
import torch

from .weights import _ST_DTYPE, _ST_NAME, WeightsMismatch, _layout, _views

__all__ = ["SharedWeights", "WeightsShare", "SharedWeightsError", "SharedWeightsMoved", "SharedWeightsUnavailable",
           "share_weights", "open_shared", "this_node"]

#: where the CPU buffers and every stamp live (tmpfs: memory, not disk)
SHM_DIR = "/dev/shm"
_WRITING = -1


class SharedWeightsError(RuntimeError):
    """A shared buffer could not be used."""


class SharedWeightsMoved(SharedWeightsError):
    """The buffer holds another version than the one asked for, or was written during the copy."""


class SharedWeightsUnavailable(SharedWeightsError):
    """The buffer cannot be mapped here (another node, a closed share, a GPU this process cannot see)."""


def this_node() -> str:
    """Ray's node id when Ray is up in this process, else the host name: where a buffer can be mapped."""
    try:
        import ray

        if ray.is_initialized():
            return str(ray.get_runtime_context().get_node_id())
    except ImportError:  # pragma: no cover - Ray is a dependency of this package
        pass
    import socket

    return socket.gethostname()


@attrs.frozen
class SharedWeights:
    """What travels to a replica: where the buffer is and how its tensors lie in it (a few hundred bytes).

    ``kind`` is ``"shm"`` (``path`` is the buffer's file) or ``"cuda"``
    (``cuda`` is the IPC handle's rebuild arguments, ``device_uuid`` the GPU).
    ``slots`` are ``(name, dtype name, shape, begin, end)`` as in
    ``weights.FlatWeights``. ``fallback``: an ObjectRef of a CPU state_dict
    for replicas on other nodes (``api.push_weights`` adds it), or None.
    """

    share_id: str
    node_id: str
    kind: str
    slots: tuple[tuple[str, str, tuple[int, ...], int, int], ...]
    nbytes: int
    stamp_path: str
    path: str | None = None
    cuda: tuple | None = None
    device_uuid: str | None = None
    fallback: Any = attrs.field(default=None, eq=False)

    def here(self) -> bool:
        """Whether this process's node is the one the buffer lives on."""
        return self.node_id == this_node()


def _stamp(path: str, create: bool) -> Any:
    """The 8-byte version stamp: an int64 tensor mapped from ``path`` (shared between processes)."""
    if create:
        with open(path, "wb") as f:
            f.write((_WRITING).to_bytes(8, "little", signed=True))
    elif not os.path.exists(path):
        raise SharedWeightsUnavailable(f"the shared weights' stamp {path} is gone: the share was closed")
    return torch.from_file(path, shared=True, size=1, dtype=torch.int64)


def _unlink(*paths: str | None) -> None:
    for p in paths:
        if p is not None:
            try:
                os.unlink(p)
            except FileNotFoundError:
                pass


def _uuid_of(index: int) -> str:
    return str(torch.cuda.get_device_properties(index).uuid)


class WeightsShare:
    """The trainer's side: owns the buffer and the stamp; ``handle`` is what replicas are sent.

    The buffer lives as long as this object (or until ``close``): replicas
    that mapped a ``/dev/shm`` file keep their mapping after it is unlinked,
    but a replica opening the handle later cannot.
    """

    def __init__(self, state_dict: Mapping[str, Any], version: int = 0, *, device: Any = None) -> None:
        if not isinstance(state_dict, Mapping) or not state_dict:
            raise WeightsMismatch("share_weights needs a non-empty state_dict (a mapping of names to tensors)")
        slots, total = _layout(state_dict)
        first = next(iter(state_dict.values()))
        self.device = torch.device(device) if device is not None else first.device
        if self.device.type not in ("cpu", "cuda"):
            raise WeightsMismatch(f"weights on {self.device} cannot be shared: CPU or CUDA only")
        sid = uuid.uuid4().hex
        self._slots = slots
        self._stamp_path = os.path.join(SHM_DIR, f"rankcore-share-{sid}.stamp")
        self._path: str | None = None
        cuda: tuple | None = None
        dev_uuid: str | None = None
        if self.device.type == "cuda":
            from torch.multiprocessing.reductions import reduce_tensor

            index = self.device.index if self.device.index is not None else torch.cuda.current_device()
            self.device = torch.device("cuda", index)
            self._flat = torch.empty(total, dtype=torch.uint8, device=self.device)
            _fn, args = reduce_tensor(self._flat)
            cuda, dev_uuid = tuple(args), _uuid_of(index)
        else:
            self._path = os.path.join(SHM_DIR, f"rankcore-share-{sid}.bin")
            with open(self._path, "wb") as f:
                f.truncate(total)
            self._flat = torch.from_file(self._path, shared=True, size=total, dtype=torch.uint8)
        self._stamp = _stamp(self._stamp_path, create=True)
        self._finalizer = weakref.finalize(self, _unlink, self._path, self._stamp_path)
        self.handle = SharedWeights(
            share_id=sid, node_id=this_node(), kind=self.device.type if self.device.type == "cuda" else "shm",
            slots=tuple((s.name, _ST_NAME[s.dtype], s.shape, s.begin, s.end) for s in slots), nbytes=total,
            stamp_path=self._stamp_path, path=self._path, cuda=cuda, device_uuid=dev_uuid)
        self.write(state_dict, version)

    @property
    def version(self) -> int:
        """The version the buffer holds (-1 while a write is under way)."""
        return int(self._stamp[0])

    @property
    def nbytes(self) -> int:
        return self.handle.nbytes

    def write(self, state_dict: Mapping[str, Any], version: int) -> None:
        """Copy ``state_dict`` (same names, shapes and dtypes as at ``share_weights``) in, then stamp ``version``."""
        if self._finalizer.alive is False:
            raise SharedWeightsUnavailable("this share was closed")
        if not isinstance(version, int) or isinstance(version, bool) or version < 0:
            raise ValueError(f"version must be an int >= 0, got {version!r}")
        views = _views(self._flat, self._slots)
        missing = sorted(set(views) - set(state_dict))
        extra = sorted(set(state_dict) - set(views), key=str)
        if missing or extra:
            raise WeightsMismatch(f"tensor names differ from the share's: missing {missing}, unexpected {extra}")
        for name, view in views.items():
            t = state_dict[name]
            if not isinstance(t, torch.Tensor) or tuple(t.shape) != tuple(view.shape) or t.dtype != view.dtype:
                raise WeightsMismatch(f"{name!r}: expected a {view.dtype} tensor of shape {tuple(view.shape)}, got "
                                      f"{getattr(t, 'dtype', type(t).__name__)} {tuple(getattr(t, 'shape', ()))}")
        self._stamp[0] = _WRITING
        for name, view in views.items():
            view.copy_(state_dict[name].detach())
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)
        self._stamp[0] = version

    def state_dict(self) -> dict[str, Any]:
        """Views of the buffer (read them; write through ``write``, which stamps)."""
        return _views(self._flat, self._slots)

    def cpu_state_dict(self) -> dict[str, Any]:
        """A CPU copy (what ``push_weights`` puts in the object store for replicas on other nodes)."""
        return {k: v.detach().to("cpu", copy=True) for k, v in self.state_dict().items()}

    def close(self) -> None:
        """Unlink the files (mappings already open stay valid); the CUDA memory goes with this object."""
        self._finalizer()


def share_weights(state_dict: Mapping[str, Any], version: int = 0, *, device: Any = None) -> WeightsShare:
    """Share ``state_dict`` (stamped ``version``) with the replicas on this node; see the module docstring."""
    return WeightsShare(state_dict, version, device=device)


class OpenShare:
    """A replica's mapping of one ``SharedWeights`` (opened once, read at every push)."""

    def __init__(self, handle: SharedWeights) -> None:
        if not handle.here():
            raise SharedWeightsUnavailable(
                f"weights shared on node {handle.node_id} cannot be mapped on node {this_node()}"
                + ("" if handle.fallback is None else " (use the fallback copy)"))
        self.handle = handle
        self._stamp = _stamp(handle.stamp_path, create=False)
        if handle.kind == "cuda":
            self.device = torch.device("cuda", self._local_index(handle.device_uuid))
            from torch.multiprocessing.reductions import rebuild_cuda_tensor

            args = list(handle.cuda or ())
            args[6] = self.device.index  # (storage_device: this process's index of that GPU)
            flat = rebuild_cuda_tensor(*args)
        else:
            if handle.path is None or not os.path.exists(handle.path):
                raise SharedWeightsUnavailable(f"the shared weights' buffer {handle.path} is gone: the share was closed")
            self.device = torch.device("cpu")
            flat = torch.from_file(handle.path, shared=True, size=handle.nbytes, dtype=torch.uint8)
        self._views = {n: flat[b:e].view(_ST_DTYPE[dt]).view(shape) for n, dt, shape, b, e in handle.slots}

    @staticmethod
    def _local_index(device_uuid: str | None) -> int:
        if not torch.cuda.is_available():
            raise SharedWeightsUnavailable("weights shared on a GPU, but this process sees no CUDA device")
        for i in range(torch.cuda.device_count()):
            if _uuid_of(i) == device_uuid:
                return i
        raise SharedWeightsUnavailable(f"weights shared on GPU {device_uuid}, which this process cannot see "
                                       f"(CUDA_VISIBLE_DEVICES={os.environ.get('CUDA_VISIBLE_DEVICES')!r})")

    def version(self) -> int:
        return int(self._stamp[0])

    def copy_into(self, take: Any, version: int) -> Any:
        """Call ``take(views)`` (which copies them) if the buffer holds ``version`` before and after it;
        returns what ``take`` returned, else raises ``SharedWeightsMoved``."""
        before = self.version()
        if before != version:
            raise SharedWeightsMoved(self._moved(version, before))
        out = take(self._views)
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)
        after = self.version()
        if after != before:
            raise SharedWeightsMoved(f"the shared weights were written during the copy of version {version} "
                                     f"(now {after}): the trainer must wait for a push before writing the next")
        return out

    @staticmethod
    def _moved(version: int, held: int) -> str:
        what = "being written" if held == _WRITING else f"version {held}"
        return (f"the shared weights hold {what}, not version {version}: the trainer wrote again before every "
                f"replica took version {version} (push with wait=True before the next write)")


_OPEN: dict[str, OpenShare] = {}


def open_shared(handle: SharedWeights) -> OpenShare:
    """This process's mapping of ``handle``, opened on first use and kept (one per share)."""
    got = _OPEN.get(handle.share_id)
    if got is None:
        got = _OPEN[handle.share_id] = OpenShare(handle)
    return got


def opened() -> int:
    """How many shares this process has opened (the "shared once" tests read it)."""
    return len(_OPEN)
