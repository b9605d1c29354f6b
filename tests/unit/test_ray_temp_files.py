"""The Ray executor's temp files go when their owner stops (issue 36: one integration run left
43 ``rankcore-start-failures-*`` folders and ``rankcore-cold/`` in the temp folder). No Ray
cluster needed: the removal itself, and a scenario replica once its run's folder is gone."""

from __future__ import annotations

import pytest

from executors.ray_gpu.scenario_models import NoReconfigure
from executors.ray_gpu.weights.warm_cache import remove_cold_files


def _cold(root, epoch: str, node: str, dep: str):
    path = root / epoch / node / f"{dep}.safetensors"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(b"weights")
    return path


def test_an_epochs_cold_files_go_with_the_folders_they_leave_empty_and_others_stay(tmp_path):
    root = tmp_path / "rankcore-cold"
    a, b = _cold(root, "1.0", "n0", "a"), _cold(root, "1.0", "n0", "b")
    other_node, other_run = _cold(root, "1.0", "n1", "a"), _cold(root, "2.0", "n0", "a")
    remove_cold_files(str(root), "1.0", "n0", "a")  # a deleted deployment: its file only
    assert not a.exists() and b.exists() and other_node.exists()
    remove_cold_files(str(root), "1.0", "n0", prune_root=True)  # the run is over on n0
    assert not b.exists() and not (root / "1.0" / "n0").exists()
    assert other_node.exists() and other_run.exists()  # another node's, another run's
    remove_cold_files(str(root), "1.0", "n1", prune_root=True)
    assert sorted(p.name for p in root.iterdir()) == ["2.0"]  # epoch 1.0 gone, the root still holds 2.0
    remove_cold_files(str(root), "2.0", "n0", prune_root=True)
    assert not root.exists()  # the default root goes with its last epoch
    remove_cold_files(str(root), "2.0", "n0", prune_root=True)  # (nothing there: nothing to do)


def test_a_folder_the_user_named_stays_when_its_last_epoch_goes(tmp_path):
    root = tmp_path / "my-cold"
    _cold(root, "1.0", "n0", "a")
    remove_cold_files(str(root), "1.0", "n0")
    assert root.is_dir() and list(root.iterdir()) == []


def test_start_failures_count_in_the_runs_folder_and_none_fail_once_it_is_removed(tmp_path):
    runs = tmp_path / "rankcore-start-failures-x"
    runs.mkdir()
    for k in range(2):
        with pytest.raises(RuntimeError, match=f"construction {k + 1} of 2"):
            NoReconfigure(fail_dir=str(runs), start_failures=2)
    NoReconfigure(fail_dir=str(runs), start_failures=2)  # the third starts
    NoReconfigure(fail_dir=str(tmp_path / "gone"), start_failures=2)  # the run is over: it starts
