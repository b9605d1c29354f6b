"""Weights shared once and updated in place (executors/ray_gpu/weights/shared.py), without Ray: the
POSIX shared-memory path, the version stamp that refuses half-written or moved-on buffers, and a
replica's ``ReplicaWeights.update`` from a share."""

from __future__ import annotations

import multiprocessing as mp
import os

import attrs
import pytest
import torch

from executors.ray_gpu.weights import shared as sw
from executors.ray_gpu.weights.replica import ReplicaWeights
from executors.ray_gpu.weights.weights import TieredWeights, WeightsMismatch


def _weights(v: float) -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(int(v * 10))
    return {"w": torch.randn(64, 32, generator=g), "b": torch.full((32,), v, dtype=torch.float16),
            "n": torch.arange(7, dtype=torch.int64) * int(v)}


def _child_reads(handle: sw.SharedWeights, version: int, out: mp.Queue) -> None:
    """In another process: open the handle and send back what it reads, as numpy arrays (pickled
    by value: a torch tensor put on a queue is sent as a file descriptor this process must still
    serve when the parent reads it, and it may have exited by then: ConnectionResetError in CI)."""
    try:
        got = sw.open_shared(handle).copy_into(lambda views: {k: v.numpy().copy() for k, v in views.items()},
                                               version)
        out.put(("ok", got))
    except Exception as exc:  # the parent asserts on it
        out.put(("error", f"{type(exc).__name__}: {exc}"))


def test_another_process_maps_the_buffer_and_sees_writes_in_place() -> None:
    share = sw.share_weights(_weights(1.0), 1)
    try:
        ctx = mp.get_context("spawn")
        for version in (1, 2):
            if version == 2:
                share.write(_weights(2.0), 2)
            q = ctx.Queue()
            p = ctx.Process(target=_child_reads, args=(share.handle, version, q))
            p.start()
            status, got = q.get(timeout=60)
            p.join(30)
            assert status == "ok", got
            for k, t in _weights(float(version)).items():
                assert torch.equal(torch.from_numpy(got[k]), t), k
    finally:
        share.close()
    assert not os.path.exists(share.handle.path) and not os.path.exists(share.handle.stamp_path)


def test_a_reader_refuses_another_version_and_a_write_under_way() -> None:
    share = sw.share_weights(_weights(1.0), 1)
    try:
        opened = sw.OpenShare(share.handle)
        share.write(_weights(2.0), 2)
        with pytest.raises(sw.SharedWeightsMoved, match="version 2, not version 1"):
            opened.copy_into(lambda views: None, 1)

        def trainer_writes_meanwhile(views: dict) -> None:
            share._stamp[0] = 3  # the trainer stamped a new version during this copy

        with pytest.raises(sw.SharedWeightsMoved, match="written during the copy"):
            opened.copy_into(trainer_writes_meanwhile, 2)
        share._stamp[0] = -1
        with pytest.raises(sw.SharedWeightsMoved, match="being written"):
            opened.copy_into(lambda views: None, 3)
    finally:
        share.close()


def test_write_refuses_another_layout_and_changes_nothing() -> None:
    share = sw.share_weights(_weights(1.0), 1)
    try:
        bad = dict(_weights(2.0))
        bad["w"] = torch.zeros(64, 33)
        with pytest.raises(WeightsMismatch, match="'w'"):
            share.write(bad, 2)
        with pytest.raises(WeightsMismatch, match="missing \\['n'\\]"):
            share.write({k: v for k, v in _weights(2.0).items() if k != "n"}, 2)
        assert share.version == 1
        assert all(torch.equal(share.state_dict()[k], t) for k, t in _weights(1.0).items())
        with pytest.raises(ValueError, match="version"):
            share.write(_weights(2.0), -3)
    finally:
        share.close()
    with pytest.raises(WeightsMismatch, match="non-empty"):
        sw.share_weights({})


def test_a_closed_share_or_another_node_cannot_be_opened() -> None:
    share = sw.share_weights(_weights(1.0), 1)
    elsewhere = attrs.evolve(share.handle, node_id="some-other-node")
    with pytest.raises(sw.SharedWeightsUnavailable, match="some-other-node"):
        sw.OpenShare(elsewhere)
    share.close()
    with pytest.raises(sw.SharedWeightsUnavailable, match="closed"):
        sw.OpenShare(share.handle)


class _Module(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        for k, t in _weights(0.5).items():
            self.register_buffer(k, t.clone())


def test_a_replica_opens_a_share_once_and_copies_each_version() -> None:
    rw = ReplicaWeights("m#0")
    rw.attach(_Module(), device="cpu")
    share = sw.share_weights(_weights(1.0), 1)
    try:
        before = sw.opened()
        assert rw.update(1, share.handle) == rw.nbytes
        share.write(_weights(2.0), 2)
        rw.update(2, share.handle)
        assert sw.opened() == before + 1  # shared once: the second push read the same mapping
        served = dict(rw.instance.state_dict())
        for k, t in _weights(2.0).items():
            assert torch.equal(served[k], t), k
        share.write(_weights(3.0), 3)  # the replica's own copy: the trainer's next write is not served
        assert torch.equal(rw.instance.state_dict()["b"], _weights(2.0)["b"])
        info = rw.info()
        assert info["version"] == 2 and info["shared"] == share.handle.share_id
        with pytest.raises(sw.SharedWeightsMoved):
            rw.update(4, share.handle)  # the share holds 3
        assert rw.version == 2
    finally:
        share.close()


def test_a_replica_elsewhere_without_a_fallback_is_told_to_push_a_state_dict() -> None:
    rw = ReplicaWeights("m#1")
    rw.attach(_Module(), device="cpu")
    share = sw.share_weights(_weights(1.0), 1)
    try:
        with pytest.raises(sw.SharedWeightsUnavailable, match="push it again as a state_dict"):
            rw.update(1, attrs.evolve(share.handle, node_id="node-b"))
        assert rw.version == 0
    finally:
        share.close()


def test_tiered_weights_take_views_of_a_share() -> None:
    share = sw.share_weights(_weights(1.0), 1)
    try:
        tw = TieredWeights(_weights(0.0), device="cpu")
        sw.open_shared(share.handle).copy_into(lambda views: tw.update(views, 1), 1)
        tw.to_warm()
        tw.to_hot()
        assert all(torch.equal(tw.state_dict()[k], t) for k, t in _weights(1.0).items())
    finally:
        share.close()


# ------------------------------------------------------------------ CUDA (a lent GPU only)
CUDA = torch.cuda.is_available()


def _cuda_replica(inbox: mp.Queue, out: mp.Queue) -> None:
    """Another process on the GPU, as a colocated replica: weights HOT on CUDA, updated from the
    trainer's CUDA share at each (verb, handle, version) it is sent; answers what it serves, on the host."""
    try:
        rw = ReplicaWeights("m#cuda")
        rw.attach(_Module(), device="cuda")
        while True:
            verb, handle, version = inbox.get(timeout=120)
            if verb == "stop":
                return
            try:
                if verb == "sleep-then-push":  # a push to a sleeper lands in its WARM copy; it wakes with it
                    rw.offload()
                    rw.update(version, handle)
                    asleep = (rw.tier, rw.tiered.tier, rw.tiered.version)
                    rw.load()
                else:
                    asleep = ()
                    rw.update(version, handle)
                served = {k: v.detach().cpu().numpy().copy() for k, v in rw.instance.state_dict().items()}
                devices = sorted({v.device.type for v in rw.instance.state_dict().values()})
                out.put(("ok", {"served": served, "devices": devices, "info": rw.info(), "opened": sw.opened(),
                                "asleep": asleep}))
            except Exception as exc:  # the parent asserts on it
                out.put(("error", f"{type(exc).__name__}: {exc}"))
    except Exception as exc:
        out.put(("error", f"{type(exc).__name__}: {exc}"))


@pytest.mark.skipif(not CUDA, reason="needs a CUDA GPU (CUDA IPC); run on a lent GPU: docs/benchmarks.md")
def test_on_cuda_a_colocated_replica_maps_the_trainers_share_once_and_takes_each_version_in_every_tier() -> None:
    share = sw.share_weights(_weights(1.0), 1, device="cuda")
    assert share.handle.kind == "cuda" and share.handle.path is None and share.handle.device_uuid
    ctx = mp.get_context("spawn")
    inbox, out = ctx.Queue(), ctx.Queue()
    p = ctx.Process(target=_cuda_replica, args=(inbox, out))
    p.start()
    try:
        for version, verb in ((1, "push"), (2, "push"), (3, "sleep-then-push")):
            if version > 1:
                share.write(_weights(float(version)), version)  # in place, on the GPU
            inbox.put((verb, share.handle, version))
            status, got = out.get(timeout=120)
            assert status == "ok", got
            assert got["devices"] == ["cuda"] and got["info"]["version"] == version
            assert got["info"]["shared"] == share.handle.share_id and got["opened"] == 1  # mapped once
            for k, t in _weights(float(version)).items():
                assert torch.equal(torch.from_numpy(got["served"][k]), t), (version, k)
            if verb == "sleep-then-push":
                assert got["asleep"] == ("warm", "warm", version)  # taken while WARM, on the host
        inbox.put(("push", share.handle, 4))  # the share holds 3: refused, never served half-written
        status, got = out.get(timeout=120)
        assert status == "error" and "SharedWeightsMoved" in got and "not version 4" in got, got
        inbox.put(("stop", None, 0))
        p.join(60)
        assert p.exitcode == 0
    finally:
        if p.is_alive():
            p.kill()
        share.close()
    assert not os.path.exists(share.handle.stamp_path)
