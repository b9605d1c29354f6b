"""One replica's real model weights in one tier at a time: HOT, WARM or COLD (issue 21).

The executor-side mover the Ray executor calls when the core says "offload",
"load from CPU", "load from disk" or "evict"; it decides nothing itself.

* ``"hot"``: on the device (``"cuda"`` when available, else a CPU copy the
  replica serves from);
* ``"warm"``: in CPU memory, page-locked (pinned) when the device is CUDA;
* ``"cold"``: in one safetensors file, read back without pickle (the header
  is JSON, checked by ``safetensors.safe_open`` and against this object's
  layout; the bytes are read straight into the destination).

Layout. The tensors live in ONE flat ``uint8`` buffer per tier, packed in the
order ``(-element_size, name)``; each tensor is a view into it. That order is
the one a safetensors file may use, so the buffer is byte for byte the data
section of the COLD file, every offset is a multiple of its tensor's element
size (the same alignment ``safetensors.torch.load_file`` gives), and every
move is one contiguous copy: WARM -> HOT is one pinned host-to-device copy,
HOT -> WARM one device-to-host copy into a pinned buffer, WARM -> COLD one
header plus one write. COLD -> HOT on CUDA reads the file in chunks, by up to
12 threads (``os.preadv`` releases the GIL), into pinned staging buffers and
copies each chunk to the device as soon as it is read (the ServerlessLLM
pipeline); on CPU it reads the data section straight into the new buffer.
Tied tensors (one storage under two names) are stored once per name.

Buffers kept. With ``keep_host_buffer=True`` (the default) the WARM buffer
stays allocated while HOT, so HOT -> WARM -> HOT -> WARM page-locks memory
once (pinning 1 GiB costs a few hundred ms, the copy itself ~20 ms); it is
freed on the way to COLD. ``host_nbytes`` says what CPU memory this object
holds now, whatever its tier, for the executor to report. The pinned staging
buffers of the COLD -> HOT pipeline (``readers * 2`` chunks) are shared by
every ``TieredWeights`` of the process and kept once made. Leaving HOT
returns the device buffer and, on CUDA, empties torch's caching allocator
(``release_device_memory=True``) so another process (a trainer) can use it.
New plain (unpinned) CPU buffers ask Linux for transparent huge pages
before their first touch: faulting in 1 GiB of fresh 4 KiB pages cost more
than copying it (0.35-0.55 s against ~0.1 s on the CI machine).

Moving to the tier the weights are in, or to an unknown tier, is a
``TierError``. ``state_dict()`` is valid only while HOT; its tensors are
views of the device buffer, so a caller must not keep them across a move
(they would keep the device memory alive). Not thread-safe: one caller at a
time, as an actor is.
"""

from __future__ import annotations

import ctypes
import json
import os
import struct
import sys
import threading
import time
from collections.abc import Mapping
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path
from typing import Any, ClassVar, Literal

import attrs
import safetensors
import torch

__all__ = [
    "HOT", "WARM", "COLD", "TIERS", "Tier",
    "TierError", "WeightsMismatch", "ColdFileError",
    "Move", "WeightsUpdate", "FlatWeights", "TieredWeights",
]

Tier = Literal["hot", "warm", "cold"]
HOT: Tier = "hot"
WARM: Tier = "warm"
COLD: Tier = "cold"
TIERS: tuple[Tier, ...] = (HOT, WARM, COLD)

#: bytes per chunk of the COLD -> HOT pipeline (big enough that a read and a
#: copy each cost far more than their call, small enough to overlap early; on
#: a lent H100, 8 MiB chunks beat 16-64 MiB at every reader count: 1 GiB from
#: a warm page cache at 29.7 GB/s with 12 readers, 27.5 with 32 MiB)
DEFAULT_CHUNK_BYTES = 8 << 20
#: reader threads of the COLD -> HOT pipeline: one per CPU up to 12, at least
#: 4. Reading the page cache is CPU work (one thread ~5.5 GB/s on the H100
#: machine; 4: 16-19, 8: 24.6, 12: 29.7, 16: 28.8 GB/s on its 16 CPUs); the
#: target is >= 20 GB/s.
DEFAULT_READERS = min(12, max(4, len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity")
                              else (os.cpu_count() or 4)))

_VERSION_KEY = "rankcore.weights_version"

# torch dtype <-> safetensors dtype name (the names of the safetensors format)
_ST_NAME: dict[Any, str] = {
    torch.float64: "F64", torch.float32: "F32", torch.float16: "F16", torch.bfloat16: "BF16",
    torch.int64: "I64", torch.int32: "I32", torch.int16: "I16", torch.int8: "I8",
    torch.uint8: "U8", torch.bool: "BOOL",
}
for _attr, _name in (("float8_e4m3fn", "F8_E4M3"), ("float8_e5m2", "F8_E5M2"),
                     ("uint16", "U16"), ("uint32", "U32"), ("uint64", "U64")):
    if hasattr(torch, _attr):
        _ST_NAME[getattr(torch, _attr)] = _name
_ST_DTYPE = {name: dtype for dtype, name in _ST_NAME.items()}


class TierError(ValueError):
    """A move or call this object refuses: same tier, unknown tier, not HOT, no file path."""


class WeightsMismatch(TierError):
    """New or stored weights that do not fit this object's names, shapes and dtypes (names the tensor)."""


class ColdFileError(TierError):
    """The COLD file is missing, is not a safetensors file, or is not the one this object wrote."""


@attrs.frozen
class Move:
    """What one move did, for the executor to report: tiers, bytes moved, wall seconds (device synchronised)."""

    from_tier: Tier
    to_tier: Tier
    nbytes: int
    seconds: float


@attrs.frozen
class WeightsUpdate:
    """What one ``update`` did: in which tier, the version now held, bytes written, wall seconds."""

    tier: Tier
    version: int
    nbytes: int
    seconds: float


@attrs.frozen
class _Slot:
    """One tensor's place in the flat buffer: ``[begin, end)`` bytes, its dtype and shape."""

    name: str
    dtype: Any
    shape: tuple[int, ...]
    begin: int
    end: int


@attrs.frozen
class FlatWeights:
    """Weights as one flat byte array and its layout: what travels between a replica and its
    node's WARM cache (``warm_cache.py``). ``data`` is a ``numpy`` uint8 array, so Ray moves it
    through its object store without pickling the bytes; ``slots`` are ``(name, dtype name,
    shape, begin, end)``."""

    slots: tuple[tuple[str, str, tuple[int, ...], int, int], ...]
    version: int
    data: Any

    @property
    def nbytes(self) -> int:
        return int(self.data.nbytes)

    def state_dict(self) -> dict[str, Any]:
        """Each tensor as a CPU view of ``data`` (read-only bytes: copy before writing)."""
        import warnings

        with warnings.catch_warnings():  # a read-only array from the object store: only read here
            warnings.simplefilter("ignore", UserWarning)
            flat = torch.from_numpy(self.data)
        return {name: flat[b:e].view(_ST_DTYPE[dt]).view(shape) for name, dt, shape, b, e in self.slots}


def _layout(state_dict: Mapping[str, Any]) -> tuple[tuple[_Slot, ...], int]:
    """Packed slots in ``(-element_size, name)`` order (each offset aligned to its element size), and the total."""
    slots = []
    offset = 0
    items = sorted(state_dict.items(), key=lambda kv: (-kv[1].element_size(), kv[0]))
    for name, tensor in items:
        if not isinstance(name, str):
            raise WeightsMismatch(f"tensor name {name!r} is not a str")
        if not isinstance(tensor, torch.Tensor):
            raise WeightsMismatch(f"{name!r} is a {type(tensor).__name__}, not a torch.Tensor")
        if tensor.dtype not in _ST_NAME:
            raise WeightsMismatch(f"{name!r} has dtype {tensor.dtype}, which a safetensors file cannot hold")
        if tensor.is_sparse or tensor.layout != torch.strided:
            raise WeightsMismatch(f"{name!r} is not a dense (strided) tensor")
        n = tensor.numel() * tensor.element_size()
        slots.append(_Slot(name, tensor.dtype, tuple(tensor.shape), offset, offset + n))
        offset += n
    return tuple(slots), offset


def _views(flat: Any, slots: tuple[_Slot, ...]) -> dict[str, Any]:
    """Each tensor as a view of ``flat``, in the caller's name order."""
    return {s.name: flat[s.begin:s.end].view(s.dtype).view(s.shape) for s in slots}


_HUGE = 2 << 20
_MADV_HUGEPAGE = 14
_libc: Any = None


def _empty(nbytes: int, device: Any, pin: bool = False) -> Any:
    """A new flat ``uint8`` buffer; on plain CPU memory, huge pages are asked for before it is touched.

    Faulting in a fresh 1 GiB in 4 KiB pages took ~0.6 s on the CI machine,
    in 2 MiB pages ~0.15 s (what torch's ``THP_MEM_ALLOC_ENABLE=1`` does,
    here without needing the environment variable). Best effort, Linux only.
    """
    buf = torch.empty(nbytes, dtype=torch.uint8, device=device, pin_memory=pin)
    if buf.device.type == "cpu" and not pin and nbytes >= 2 * _HUGE and sys.platform.startswith("linux"):
        global _libc
        try:
            if _libc is None:
                _libc = ctypes.CDLL(None, use_errno=True)
            start = -(-buf.data_ptr() // _HUGE) * _HUGE
            end = (buf.data_ptr() + nbytes) // _HUGE * _HUGE
            if end > start:
                _libc.madvise(ctypes.c_void_p(start), ctypes.c_size_t(end - start), _MADV_HUGEPAGE)
        except (OSError, AttributeError):
            pass
    return buf


def _sync(device: Any) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def _pread_full(fd: int, buf: memoryview, offset: int) -> None:
    """Read exactly ``len(buf)`` bytes at ``offset`` into ``buf`` (the GIL is released while reading)."""
    done = 0
    n = len(buf)
    while done < n:
        got = os.preadv(fd, [buf[done:]], offset + done)
        if got <= 0:
            raise ColdFileError(f"file ended {n - done} bytes early (at byte {offset + done})")
        done += got


def _byte_view(tensor: Any) -> memoryview:
    """The bytes of a contiguous CPU tensor as a writable memoryview (bf16 etc. through uint8)."""
    return memoryview(tensor.reshape(-1).view(torch.uint8).numpy()).cast("B")


class _Staging:
    """The process's pinned staging chunks for COLD -> HOT, made once on first use and reused.

    ``busy`` is held for a whole pipelined load, so two loads never share a chunk.
    """

    busy = threading.Lock()
    _lock = threading.Lock()
    _buffers: ClassVar[list[Any]] = []
    _chunk = 0

    @classmethod
    def get(cls, count: int, chunk: int, pin: bool) -> list[Any]:
        with cls._lock:
            if cls._chunk != chunk or len(cls._buffers) < count:
                cls._buffers = [torch.empty(chunk, dtype=torch.uint8, pin_memory=pin) for _ in range(count)]
                cls._chunk = chunk
            return cls._buffers[:count]


def load_pipelined(fd: int, data_start: int, dest: Any, *, chunk_bytes: int = DEFAULT_CHUNK_BYTES,
                   readers: int = DEFAULT_READERS, staging: list[Any] | None = None) -> None:
    """Read ``dest.numel()`` bytes of ``fd`` from ``data_start`` into the flat ``uint8`` tensor ``dest``.

    Chunks are read by ``readers`` threads into staging buffers (``2 * readers``
    of them, pinned when ``dest`` is on CUDA) and each is copied to ``dest`` as
    soon as it is read: on CUDA asynchronously on the current stream, an event
    telling the reader when its buffer may be refilled, one synchronise at the
    end. On CPU the copies are plain (this is what the CPU tests run).
    """
    total = dest.numel()
    if total == 0:
        return
    cuda = dest.device.type == "cuda"
    depth = max(1, 2 * readers)
    chunks = [(off, min(chunk_bytes, total - off)) for off in range(0, total, chunk_bytes)]
    if staging is None:
        with _Staging.busy:
            staging = _Staging.get(min(depth, len(chunks)), chunk_bytes, pin=cuda)
            _pipeline(fd, data_start, dest, chunks, staging, readers, cuda)
    else:
        short = [b.numel() for b in staging if b.numel() < chunk_bytes]
        if not staging or short:
            raise TierError(f"staging buffers must be at least chunk_bytes={chunk_bytes} bytes, got {short}")
        _pipeline(fd, data_start, dest, chunks, staging, readers, cuda)
    _sync(dest.device)


def _pipeline(fd: int, data_start: int, dest: Any, chunks: list[tuple[int, int]], staging: list[Any],
              readers: int, cuda: bool) -> None:
    """``load_pipelined``'s loop over chunks, with its staging buffers chosen."""
    depth = len(staging)
    views = [memoryview(b.numpy()) for b in staging]

    def read(k: int, slot: int, wait: Any) -> None:
        if wait is not None:
            wait.synchronize()  # the copy out of this buffer is done
        off, n = chunks[k]
        _pread_full(fd, views[slot][:n], data_start + off)

    with ThreadPoolExecutor(max_workers=max(1, readers), thread_name_prefix="weights-read") as pool:
        pending: list[Future[None]] = [pool.submit(read, k, k, None) for k in range(min(depth, len(chunks)))]
        for k, (off, n) in enumerate(chunks):
            pending[k].result()
            slot = k % depth
            dest[off:off + n].copy_(staging[slot][:n], non_blocking=cuda)
            event = None
            if cuda:
                event = torch.cuda.Event()
                event.record()
            if k + depth < len(chunks):
                pending.append(pool.submit(read, k + depth, slot, event))


class TieredWeights:
    """One replica's weights (name -> tensor), in exactly one tier at a time; see the module docstring.

    ``state_dict`` is copied into this object's own buffers (in ``tier``:
    ``"hot"`` by default); the caller's tensors are not kept. ``directory`` and
    ``name`` give the COLD file, ``<directory>/<name>.safetensors``, unless a
    move names a path itself.
    """

    def __init__(self, state_dict: Mapping[str, Any], *, version: int = 0, device: Any = None,
                 tier: str = HOT, directory: str | os.PathLike[str] | None = None, name: str = "weights",
                 keep_host_buffer: bool = True, release_device_memory: bool = True,
                 chunk_bytes: int = DEFAULT_CHUNK_BYTES, readers: int = DEFAULT_READERS) -> None:
        self._device = torch.device(device if device is not None else
                                    ("cuda" if torch.cuda.is_available() else "cpu"))
        self._pin = self._device.type == "cuda"
        self._slots, self._total = _layout(state_dict)
        self._version = _check_version(version)
        self._directory = Path(directory) if directory is not None else None
        self._name = name
        self._keep_host = keep_host_buffer
        self._release_device = release_device_memory
        self._chunk_bytes = int(chunk_bytes)
        self._readers = int(readers)
        if self._chunk_bytes <= 0 or self._readers <= 0:
            raise TierError(f"chunk_bytes and readers must be positive, got {chunk_bytes} and {readers}")
        self._dev: Any = None  # flat buffer on the device while HOT
        self._host: Any = None  # flat CPU buffer: the weights while WARM, kept for reuse while HOT
        self._path: Path | None = None  # the COLD file while COLD
        self._tier: Tier = WARM
        self._host = self._alloc_host()
        views = _views(self._host, self._slots)
        for s in self._slots:
            views[s.name].copy_(state_dict[s.name].detach())
        target = _check_tier(tier)
        if target != WARM:
            self.move_to(target)

    # ---- what an executor reports -------------------------------------------------------------

    @property
    def tier(self) -> Tier:
        """Where the weights are now."""
        return self._tier

    @property
    def nbytes(self) -> int:
        """Sum of ``numel() * element_size()`` over the tensors: the bytes the core is told."""
        return self._total

    @property
    def version(self) -> int:
        """The weight version held (set at construction and by ``update``; stored in the COLD file)."""
        return self._version

    @property
    def device(self) -> Any:
        """The device HOT weights live on."""
        return self._device

    @property
    def path(self) -> Path | None:
        """The COLD file while COLD, else None (a file left by an earlier COLD spell is not deleted)."""
        return self._path if self._tier == COLD else None

    @property
    def host_nbytes(self) -> int:
        """CPU memory this object holds now (the WARM copy, or the buffer kept for reuse while HOT)."""
        held = 0 if self._host is None else self._host.numel()
        if self._dev is not None and self._device.type == "cpu":
            held += self._dev.numel()
        return held

    def state_dict(self) -> dict[str, Any]:
        """The tensors to serve from: views of the device buffer; only while HOT."""
        if self._tier != HOT:
            raise TierError(f"state_dict() serves HOT weights; these are {self._tier}")
        return _views(self._dev, self._slots)

    # ---- moves --------------------------------------------------------------------------------

    def move_to(self, tier: str, path: str | os.PathLike[str] | None = None) -> Move:
        """Move to ``tier`` (``"hot"``, ``"warm"`` or ``"cold"``); ``path`` only for ``"cold"``."""
        target = _check_tier(tier)
        if target == self._tier:
            raise TierError(f"the weights are already {target}")
        if path is not None and target != COLD:
            raise TierError(f"a path is for a move to cold, not to {target}")
        return {HOT: self.to_hot, WARM: self.to_warm}[target]() if target != COLD else self.to_cold(path)

    def to_hot(self) -> Move:
        """WARM -> HOT (one pinned H2D copy) or COLD -> HOT (a pipelined chunked read; no WARM step)."""
        source = self._refuse_same(HOT)
        t0 = self._start()
        dev = _empty(self._total, self._device)
        if source == WARM:
            dev.copy_(self._host, non_blocking=self._pin)
            _sync(self._device)
            if not self._keep_host:
                self._host = None
        else:
            assert self._path is not None
            self._read_cold(self._path, dev)
            self._path = None
        self._dev = dev
        self._tier = HOT
        return Move(source, HOT, self._total, time.perf_counter() - t0)

    def to_warm(self) -> Move:
        """HOT -> WARM (one D2H copy into the kept pinned buffer) or COLD -> WARM (a read into it)."""
        source = self._refuse_same(WARM)
        t0 = self._start()
        if self._host is None:
            self._host = self._alloc_host()
        if source == HOT:
            self._host.copy_(self._dev, non_blocking=self._pin)
            _sync(self._device)
            self._drop_device()
        else:
            assert self._path is not None
            self._read_cold(self._path, self._host)
            self._path = None
        self._tier = WARM
        return Move(source, WARM, self._total, time.perf_counter() - t0)

    def to_cold(self, path: str | os.PathLike[str] | None = None) -> Move:
        """HOT or WARM -> COLD: write the safetensors file (replaced atomically), then free the buffers."""
        source = self._refuse_same(COLD)
        target = self._cold_path(path)
        t0 = self._start()
        if source == HOT and self._device.type == "cpu":
            data = self._dev
        else:
            if source == HOT:
                if self._host is None:
                    self._host = self._alloc_host()
                self._host.copy_(self._dev, non_blocking=self._pin)
                _sync(self._device)
            data = self._host
        self._write_file(target, [data])
        del data
        self._drop_device()
        self._host = None
        self._path = target
        self._tier = COLD
        return Move(source, COLD, self._total, time.perf_counter() - t0)

    # ---- to and from other processes and files -------------------------------------------------

    def to_flat(self) -> FlatWeights:
        """The bytes held now as ``FlatWeights`` (for a node's WARM cache). WARM: a view of the host
        buffer; HOT on the CPU: of the device buffer; HOT on CUDA: copied into the kept host buffer
        first. The caller serialises it before the next move (a Ray return value is)."""
        if self._tier == COLD:
            raise TierError("to_flat() needs the weights in memory; these are cold")
        if self._tier == HOT and self._device.type == "cpu":
            data = self._dev
        else:
            if self._tier == HOT:
                if self._host is None:
                    self._host = self._alloc_host()
                self._host.copy_(self._dev, non_blocking=self._pin)
                _sync(self._device)
            data = self._host
        slots = tuple((s.name, _ST_NAME[s.dtype], s.shape, s.begin, s.end) for s in self._slots)
        return FlatWeights(slots=slots, version=self._version, data=data.numpy())

    @classmethod
    def from_flat(cls, flat: FlatWeights, *, tier: str = WARM, device: Any = None,
                  directory: str | os.PathLike[str] | None = None, name: str = "weights") -> TieredWeights:
        """A ``TieredWeights`` holding a copy of ``flat``'s bytes (its own buffers), in ``tier``."""
        return cls(flat.state_dict(), version=flat.version, tier=tier, device=device, directory=directory,
                   name=name)

    def load_file(self, path: str | os.PathLike[str], version: int | None = None) -> int:
        """Read a COLD file this layout wrote (another ``TieredWeights`` of the same names, shapes
        and dtypes, and of ``version`` unless None: checked before any byte is read; no pickle)
        into the buffer of the current tier (HOT or WARM), in place; the file's weight version
        becomes this object's, and is returned."""
        if self._tier == COLD:
            raise TierError("load_file() reads into HOT or WARM weights; these are cold")
        path = Path(path)
        data_start, version = self._check_file(path, version)
        dest = self._dev if self._tier == HOT else self._host
        fd = os.open(path, os.O_RDONLY)
        try:
            if dest.device.type == "cuda":
                with torch.cuda.device(dest.device):
                    load_pipelined(fd, data_start, dest, chunk_bytes=self._chunk_bytes, readers=self._readers)
            elif self._total:
                _pread_full(fd, _byte_view(dest), data_start)
        finally:
            os.close(fd)
        self._version = version
        return version

    # ---- new weights --------------------------------------------------------------------------

    def update(self, new_state_dict: Mapping[str, Any], version: int) -> WeightsUpdate:
        """Write new weights in place in the current tier; same names, shapes and dtypes, or nothing changes.

        HOT / WARM: ``copy_`` into the existing tensors. COLD: the file is
        rewritten (a new file replacing the old one atomically).
        """
        version = _check_version(version)
        self._check_fits(new_state_dict)
        t0 = self._start()
        if self._tier == COLD:
            assert self._path is not None
            parts = [new_state_dict[s.name].detach().to("cpu").contiguous() for s in self._slots]
            self._write_file(self._path, parts, version=version)
        else:
            views = _views(self._dev if self._tier == HOT else self._host, self._slots)
            for s in self._slots:
                views[s.name].copy_(new_state_dict[s.name].detach())
            _sync(self._device)
        self._version = version
        return WeightsUpdate(self._tier, version, self._total, time.perf_counter() - t0)

    # ---- internals ----------------------------------------------------------------------------

    def _refuse_same(self, target: Tier) -> Tier:
        if self._tier == target:
            raise TierError(f"the weights are already {target}")
        return self._tier

    def _start(self) -> float:
        _sync(self._device)  # work queued before the move is not the move's time
        return time.perf_counter()

    def _alloc_host(self) -> Any:
        return _empty(self._total, "cpu", pin=self._pin)

    def _drop_device(self) -> None:
        self._dev = None
        if self._device.type == "cuda" and self._release_device:
            torch.cuda.empty_cache()

    def _cold_path(self, path: str | os.PathLike[str] | None) -> Path:
        if path is not None:
            return Path(path)
        if self._directory is None:
            raise TierError("a move to cold needs a path: none given and no directory at construction")
        return self._directory / f"{self._name}.safetensors"

    def _check_fits(self, new: Mapping[str, Any]) -> None:
        ours = {s.name for s in self._slots}
        theirs = set(new)
        if theirs != ours:
            missing, extra = sorted(ours - theirs), sorted(theirs - ours, key=str)
            raise WeightsMismatch(f"tensor names differ: missing {missing}, unexpected {extra}")
        for s in self._slots:
            t = new[s.name]
            if not isinstance(t, torch.Tensor):
                raise WeightsMismatch(f"{s.name!r} is a {type(t).__name__}, not a torch.Tensor")
            if tuple(t.shape) != s.shape:
                raise WeightsMismatch(f"{s.name!r} has shape {tuple(t.shape)}, expected {s.shape}")
            if t.dtype != s.dtype:
                raise WeightsMismatch(f"{s.name!r} has dtype {t.dtype}, expected {s.dtype}")

    def _header(self, version: int) -> bytes:
        """The safetensors header (JSON, padded with spaces to 8 bytes) for this layout and ``version``."""
        head: dict[str, Any] = {"__metadata__": {"format": "pt", _VERSION_KEY: str(version)}}
        for s in self._slots:
            head[s.name] = {"dtype": _ST_NAME[s.dtype], "shape": list(s.shape), "data_offsets": [s.begin, s.end]}
        raw = json.dumps(head, separators=(",", ":")).encode()
        raw += b" " * (-len(raw) % 8)
        return struct.pack("<Q", len(raw)) + raw

    def _write_file(self, target: Path, parts: list[Any], version: int | None = None) -> None:
        """Header, then ``parts`` (contiguous CPU tensors, in slot order) to a temporary file, then rename."""
        target.parent.mkdir(parents=True, exist_ok=True)
        tmp = target.with_name(f".{target.name}.{os.getpid()}.tmp")
        try:
            with open(tmp, "wb") as f:
                f.write(self._header(self._version if version is None else version))
                for part in parts:
                    if part.numel():
                        f.write(_byte_view(part))
            os.replace(tmp, target)
        finally:
            if tmp.exists():
                tmp.unlink()

    def _read_cold(self, path: Path, dest: Any) -> None:
        """Check ``path`` is this object's safetensors file (no pickle), then read its data into ``dest``."""
        data_start, _ = self._check_file(path, self._version)
        fd = os.open(path, os.O_RDONLY)
        try:
            if dest.device.type == "cuda":
                with torch.cuda.device(dest.device):  # events on the destination's current stream
                    load_pipelined(fd, data_start, dest, chunk_bytes=self._chunk_bytes, readers=self._readers)
            elif self._total:
                _pread_full(fd, _byte_view(dest), data_start)
        finally:
            os.close(fd)

    def _check_file(self, path: Path, version: int | None) -> tuple[int, int]:
        """The data section's offset in ``path`` and the weight version it holds, once it is known to
        be this layout's safetensors file (of ``version``, unless None)."""
        if not path.is_file():
            raise ColdFileError(f"the COLD file {str(path)!r} is missing")
        try:
            with safetensors.safe_open(str(path), framework="pt") as f:  # validates; reads no tensor
                metadata = f.metadata() or {}
        except Exception as exc:  # SafetensorError, or an OSError
            raise ColdFileError(f"{str(path)!r} is not a safetensors file ({exc})") from exc
        with open(path, "rb") as f:
            (n,) = struct.unpack("<Q", f.read(8))
            head = json.loads(f.read(n))
        head.pop("__metadata__", None)
        if set(head) != {s.name for s in self._slots}:
            raise WeightsMismatch(f"{str(path)!r} holds tensors {sorted(head)}, not this replica's")
        for s in self._slots:
            entry = head[s.name]
            expected = {"dtype": _ST_NAME[s.dtype], "shape": list(s.shape), "data_offsets": [s.begin, s.end]}
            if entry != expected:
                raise WeightsMismatch(f"{s.name!r} in {str(path)!r} is {entry}, expected {expected}")
        held = metadata.get(_VERSION_KEY)
        if version is not None and held != str(version):
            raise ColdFileError(f"{str(path)!r} holds weights version {held!r}, expected {version}")
        try:
            return 8 + n, _check_version(int(held or ""))
        except (ValueError, TierError):
            raise ColdFileError(f"{str(path)!r} holds no weight version ({held!r})") from None


def _check_tier(tier: object) -> Tier:
    for t in TIERS:
        if tier == t:
            return t
    raise TierError(f"unknown tier {tier!r}; the tiers are {', '.join(TIERS)}")


def _check_version(version: object) -> int:
    if not isinstance(version, int) or isinstance(version, bool):
        raise TierError(f"a weight version is an int, got {version!r}")
    return version
