"""TieredWeights: real weights moved HOT / WARM / COLD bit-identically, files without pickle (issue 21; CPU)."""

from __future__ import annotations

import itertools
import json
import os
import pickle
import struct

import pytest

torch = pytest.importorskip("torch")
safetensors = pytest.importorskip("safetensors")
safetensors_torch = pytest.importorskip("safetensors.torch")

from executors.ray_gpu.weights.weights import (  # noqa: E402
    COLD,
    HOT,
    WARM,
    ColdFileError,
    TieredWeights,
    TierError,
    WeightsMismatch,
    load_pipelined,
)


class Net(torch.nn.Module):
    """Two seeded Linear layers, plus buffers of other dtypes so the packed layout mixes element sizes."""

    def __init__(self, seed: int) -> None:
        super().__init__()
        g = torch.Generator().manual_seed(seed)
        self.a = torch.nn.Linear(16, 33)
        self.b = torch.nn.Linear(33, 5)
        with torch.no_grad():
            for p in self.parameters():
                p.copy_(torch.randn(p.shape, generator=g))
        self.register_buffer("steps", torch.tensor(seed * 1000 + 7, dtype=torch.int64))
        self.register_buffer("scale", torch.randn(3, generator=g).to(torch.bfloat16))
        self.register_buffer("mask", torch.tensor([True, False, True]))

    def forward(self, x):
        return self.b(torch.relu(self.a(x)))


def _snapshot(sd):
    return {k: v.detach().clone() for k, v in sd.items()}


def _out(model, sd, x):
    return torch.func.functional_call(model, sd, (x,))


X = torch.randn(4, 16, generator=torch.Generator().manual_seed(99))


@pytest.fixture
def net():
    return Net(seed=1)


@pytest.fixture
def weights(net, tmp_path):
    return TieredWeights(net.state_dict(), directory=tmp_path, name="r0", device="cpu", version=1)


def _assert_same(sd, ref):
    assert set(sd) == set(ref)
    for k in ref:
        assert sd[k].dtype == ref[k].dtype, k
        assert torch.equal(sd[k].cpu(), ref[k]), k


def test_round_trip_hot_warm_cold_hot_is_bit_identical_and_answers_the_same(weights, net, tmp_path):
    ref = _snapshot(net.state_dict())
    expected = net(X)
    assert weights.tier == HOT
    _assert_same(weights.state_dict(), ref)
    moves = [weights.to_warm(), weights.to_cold(), weights.to_hot()]
    assert [(m.from_tier, m.to_tier) for m in moves] == [(HOT, WARM), (WARM, COLD), (COLD, HOT)]
    assert all(m.nbytes == weights.nbytes and m.seconds >= 0 for m in moves)
    assert weights.tier == HOT
    _assert_same(weights.state_dict(), ref)
    assert torch.equal(_out(net, weights.state_dict(), X), expected)
    # the served weights are this object's copy, not the module's tensors
    with torch.no_grad():
        net.a.weight.add_(1.0)
    _assert_same(weights.state_dict(), ref)


def test_hot_to_cold_directly_and_cold_to_warm(weights, net, tmp_path):
    ref = _snapshot(net.state_dict())
    weights.move_to(COLD, tmp_path / "elsewhere.safetensors")
    assert weights.path == tmp_path / "elsewhere.safetensors"
    assert weights.host_nbytes == 0
    weights.move_to(WARM)
    assert weights.path is None
    weights.move_to(HOT)
    _assert_same(weights.state_dict(), ref)


def test_nbytes_is_the_tensors_bytes_and_the_files_tensor_bytes(weights, net):
    independent = sum(t.numel() * t.element_size() for t in net.state_dict().values())
    assert independent > 0
    assert weights.nbytes == independent
    weights.to_cold()
    path = weights.path
    with safetensors.safe_open(str(path), framework="pt") as f:
        in_file = {k: f.get_tensor(k) for k in f.keys()}  # noqa: SIM118 (safe_open is not a dict)
        metadata = f.metadata()
    assert sum(t.numel() * t.element_size() for t in in_file.values()) == independent
    with open(path, "rb") as fh:
        (n,) = struct.unpack("<Q", fh.read(8))
    assert os.path.getsize(path) - 8 - n == independent
    _assert_same(in_file, _snapshot(net.state_dict()))
    assert metadata["rankcore.weights_version"] == "1"


_UNPICKLED: list[str] = []


def _mark():
    _UNPICKLED.append("unpickled")
    return {}


class _Trap:
    """Unpickling this calls ``_mark`` (what a pickle loader would run)."""

    def __reduce__(self):
        return (_mark, ())


@pytest.mark.parametrize("writer", ["pickle", "torch.save"])
def test_a_pickle_in_place_of_the_cold_file_is_refused_not_unpickled(weights, writer):
    weights.to_cold()
    path = weights.path
    _UNPICKLED.clear()
    with open(path, "wb") as fh:
        if writer == "pickle":
            pickle.dump(_Trap(), fh)
        else:
            torch.save({"a.weight": _Trap()}, fh)
    with pytest.raises(ColdFileError, match="not a safetensors file"):
        weights.to_hot()
    assert _UNPICKLED == []
    assert weights.tier == COLD
    # the trap is real: a pickle loader would have run it
    with open(path, "rb") as fh:
        if writer == "pickle":
            pickle.load(fh)
        else:
            torch.load(fh, weights_only=False)
    assert _UNPICKLED == ["unpickled"]


def test_a_safetensors_file_of_other_weights_is_refused_naming_the_tensor(weights, net):
    weights.to_cold()
    sd = {k: v.clone() for k, v in net.state_dict().items()}
    sd["a.weight"] = torch.zeros(16, 33)
    safetensors_torch.save_file(sd, str(weights.path), metadata={"rankcore.weights_version": "1"})
    with pytest.raises(WeightsMismatch, match=r"'a\.weight'"):
        weights.to_warm()
    assert weights.tier == COLD


def test_a_cold_file_of_another_version_is_refused(weights, net, tmp_path):
    weights.to_cold()
    other = TieredWeights(net.state_dict(), directory=tmp_path, name="other", device="cpu", version=5)
    other.to_cold(weights.path)
    with pytest.raises(ColdFileError, match="version '5', expected 1"):
        weights.to_hot()
    os.remove(weights.path)
    with pytest.raises(ColdFileError, match="missing"):
        weights.to_hot()


@pytest.mark.parametrize("tier", [HOT, WARM, COLD])
def test_update_in_each_tier_then_hot_serves_the_new_weights(weights, tier):
    new_net = Net(seed=2)
    new = _snapshot(new_net.state_dict())
    if tier != HOT:
        weights.move_to(tier)
    result = weights.update(new_net.state_dict(), version=7)
    assert (result.tier, result.version, result.nbytes) == (tier, 7, weights.nbytes)
    assert weights.version == 7 and weights.tier == tier
    if tier == COLD:
        with safetensors.safe_open(str(weights.path), framework="pt") as f:
            assert f.metadata()["rankcore.weights_version"] == "7"
    if tier != HOT:
        weights.to_hot()
    _assert_same(weights.state_dict(), new)
    assert torch.equal(_out(new_net, weights.state_dict(), X), new_net(X))
    assert not torch.equal(_out(new_net, weights.state_dict(), X), Net(seed=1)(X))


@pytest.mark.parametrize("tier", [HOT, WARM, COLD])
@pytest.mark.parametrize(
    ("change", "message"),
    [
        (lambda sd: sd.update({"a.weight": torch.zeros(33, 17)}), r"'a.weight' has shape \(33, 17\), expected \(33, 16\)"),
        (lambda sd: sd.update({"b.bias": sd["b.bias"].double()}), r"'b.bias' has dtype torch.float64"),
        (lambda sd: sd.pop("scale"), r"missing \['scale'\]"),
        (lambda sd: sd.update({"c.weight": torch.zeros(1)}), r"unexpected \['c.weight'\]"),
    ],
    ids=["shape", "dtype", "missing", "extra"],
)
def test_mismatched_update_is_refused_naming_the_tensor_and_changes_nothing(weights, net, tier, change, message):
    ref = _snapshot(net.state_dict())
    if tier != HOT:
        weights.move_to(tier)
    new = _snapshot(Net(seed=3).state_dict())
    change(new)
    with pytest.raises(WeightsMismatch, match=message):
        weights.update(new, version=9)
    assert weights.version == 1 and weights.tier == tier
    if tier != HOT:
        weights.to_hot()
    _assert_same(weights.state_dict(), ref)


def test_moving_to_the_current_tier_or_an_unknown_one_is_refused(weights):
    with pytest.raises(TierError, match="already hot"):
        weights.to_hot()
    with pytest.raises(TierError, match="already hot"):
        weights.move_to("hot")
    weights.to_warm()
    with pytest.raises(TierError, match="already warm"):
        weights.to_warm()
    weights.to_cold()
    with pytest.raises(TierError, match="already cold"):
        weights.to_cold()
    with pytest.raises(TierError, match="unknown tier 'lukewarm'"):
        weights.move_to("lukewarm")
    with pytest.raises(TierError, match="unknown tier"):
        TieredWeights({}, tier="frozen", device="cpu")
    assert weights.tier == COLD


def test_state_dict_only_while_hot_and_cold_needs_a_path(net):
    w = TieredWeights(net.state_dict(), device="cpu", tier=WARM)
    with pytest.raises(TierError, match="these are warm"):
        w.state_dict()
    with pytest.raises(TierError, match="needs a path"):
        w.to_cold()
    assert w.tier == WARM
    with pytest.raises(TierError, match="version is an int"):
        w.update(net.state_dict(), version="2")


def test_warm_buffer_is_reused_across_round_trips_unless_asked_not_to(net):
    w = TieredWeights(net.state_dict(), device="cpu")
    w.to_warm()
    first = w._host.data_ptr()
    w.to_hot()
    assert w.host_nbytes == 2 * w.nbytes  # CPU "device" copy + the kept WARM buffer
    w.to_warm()
    assert w._host.data_ptr() == first
    lean = TieredWeights(net.state_dict(), device="cpu", keep_host_buffer=False)
    assert lean.host_nbytes == lean.nbytes  # only the CPU "device" copy
    lean.to_warm()
    assert lean.host_nbytes == lean.nbytes


def test_pipelined_reader_with_its_defaults_is_byte_exact_over_several_chunks(tmp_path):
    """The default chunk size and reader count (tuned on a lent H100) across 2.5 chunks and a short tail."""
    from executors.ray_gpu.weights.weights import DEFAULT_CHUNK_BYTES, DEFAULT_READERS

    assert DEFAULT_READERS >= 1 and DEFAULT_CHUNK_BYTES > 0
    g = torch.Generator().manual_seed(6)
    payload = torch.randint(0, 256, (DEFAULT_CHUNK_BYTES * 5 // 2 + 3,), dtype=torch.uint8, generator=g)
    path = tmp_path / "blob"
    path.write_bytes(b"h" * 24 + payload.numpy().tobytes())
    dest = torch.zeros(payload.numel(), dtype=torch.uint8)
    fd = os.open(path, os.O_RDONLY)
    try:
        load_pipelined(fd, 24, dest)
    finally:
        os.close(fd)
    assert torch.equal(dest, payload)


@pytest.mark.parametrize(("chunk", "readers"), [(1000, 3), (7, 1), (1 << 20, 2)])
def test_pipelined_chunked_reader_is_byte_exact(tmp_path, chunk, readers):
    g = torch.Generator().manual_seed(5)
    payload = torch.randint(0, 256, (12_345,), dtype=torch.uint8, generator=g)
    path = tmp_path / "blob"
    head = b"x" * 40
    path.write_bytes(head + payload.numpy().tobytes() + b"tail")
    dest = torch.zeros(payload.numel(), dtype=torch.uint8)
    fd = os.open(path, os.O_RDONLY)
    try:
        load_pipelined(fd, len(head), dest, chunk_bytes=chunk, readers=readers)
        assert torch.equal(dest, payload)
        dest.zero_()
        staging = [torch.empty(chunk, dtype=torch.uint8) for _ in range(2)]
        load_pipelined(fd, len(head), dest, chunk_bytes=chunk, readers=readers, staging=staging)
        assert torch.equal(dest, payload)
        with pytest.raises(TierError, match="staging buffers"):
            load_pipelined(fd, len(head), dest, chunk_bytes=chunk + 1, staging=staging)
        short = torch.zeros(payload.numel() + 10, dtype=torch.uint8)
        with pytest.raises(ColdFileError, match="ended"):
            load_pipelined(fd, len(head) + 10, short, chunk_bytes=chunk, readers=readers)
    finally:
        os.close(fd)


def test_header_is_plain_json_in_packed_element_size_order(weights):
    weights.to_cold()
    with open(weights.path, "rb") as fh:
        (n,) = struct.unpack("<Q", fh.read(8))
        head = json.loads(fh.read(n))
    assert n % 8 == 0
    head.pop("__metadata__")
    spans = sorted((e["data_offsets"], k) for k, e in head.items())
    assert spans[0][0][0] == 0
    for (prev, _), (cur, name) in itertools.pairwise(spans):
        assert cur[0] == prev[1], name  # no holes
    sizes = {"F32": 4, "I64": 8, "BF16": 2, "BOOL": 1}
    for offsets, name in spans:
        assert offsets[0] % sizes[head[name]["dtype"]] == 0, name
