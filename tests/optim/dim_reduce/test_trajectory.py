"""Stage-1 weight trajectory: recording cadence, selection, and checks against the network."""

from __future__ import annotations

import mindspore as ms
import numpy as np
import pandas as pd
import pytest
from mindspore import nn

from trainlib.engine.checkpoint import Checkpoint, CheckpointError, load_checkpoint, save_checkpoint
from trainlib.engine.step import TrainStep
from trainlib.optim.dim_reduce.trajectory import TrajectoryRecorder, select_trajectory, verify_trajectory


def recorder_of(
    net, directory, start_epoch: int, every_steps: int | None = None, every_epochs: int | None = None
) -> TrajectoryRecorder:
    """A recorder bound, as the engine binds its callbacks, to a training step of ``net``; one cadence given."""
    recorder = TrajectoryRecorder(
        directory, start_epoch=start_epoch, every_steps=every_steps, every_epochs=every_epochs
    )
    recorder.bind(TrainStep(None, net))
    return recorder


def drive(recorder: TrajectoryRecorder, epochs: int, steps: int) -> None:
    """Call the recorder as ``fit`` does, changing the weights every step."""
    recorder.on_train_begin(epochs, steps, 0)
    for epoch in range(epochs):
        recorder.on_epoch_begin(epoch)
        for step in range(steps):
            for p in recorder.net.trainable_params():
                p.set_data(p + 1.0)
            recorder.on_step_end(epoch, step, 0.0)
        recorder.on_epoch_end(epoch, {})


def test_records_every_k_steps_from_the_start_epoch(tmp_path):
    net = nn.Dense(3, 2)
    (tmp_path / "traj_99999999.ckpt").write_bytes(b"stale file of an earlier run")
    recorder = recorder_of(net, tmp_path, start_epoch=2, every_steps=3)
    drive(recorder, epochs=3, steps=4)
    index = recorder.index
    # global steps 1..12; epoch 1 (steps 1-4) is skipped; multiples of 3 from epoch 2 on
    assert list(index["global_step"]) == [6, 9, 12]
    assert list(index["epoch"]) == [2, 3, 3]
    assert sorted(p.name for p in tmp_path.iterdir()) == [f"traj_{s:08d}.ckpt" for s in (6, 9, 12)]
    saved = load_checkpoint(index["path"].iloc[0])
    assert set(saved.params) == {"weight", "bias"}  # trainable weights only
    start = 1.0 * 6  # every step added 1.0 to each weight
    assert np.allclose(saved.params["bias"] - (net.bias.asnumpy() - 12), start)


def test_records_every_epoch(tmp_path):
    recorder = recorder_of(nn.Dense(3, 2), tmp_path, start_epoch=1, every_epochs=2)
    drive(recorder, epochs=5, steps=2)
    assert list(recorder.index["epoch"]) == [2, 4]


def index_of(n: int) -> pd.DataFrame:
    return pd.DataFrame(
        {"path": [f"t{i}.ckpt" for i in range(n)], "epoch": 1, "step": range(n), "global_step": range(n)}
    )


def test_select_takes_the_last_files():
    chosen = select_trajectory(index_of(10), n_files=4, n_components=3)
    assert list(chosen["global_step"]) == [6, 7, 8, 9]
    assert len(select_trajectory(index_of(10), n_files=None, n_components=3)) == 10


@pytest.mark.parametrize(("recorded", "n_files", "k"), [(10, 4, 4), (3, None, 3), (0, None, 2)])
def test_too_few_checkpoints_is_a_clear_error(recorded, n_files, k):
    with pytest.raises(ValueError, match=rf"more trajectory files than n_components={k}.*n_files"):
        select_trajectory(index_of(recorded), n_files=n_files, n_components=k)


def write_trajectory(folder, shapes: dict, count: int) -> list[str]:
    paths = []
    for i in range(count):
        path = folder / f"traj_{i:08d}.ckpt"
        save_checkpoint(Checkpoint({k: np.full(s, i, np.float32) for k, s in shapes.items()}), path)
        paths.append(str(path))
    return paths


def test_verify_accepts_matching_files(tmp_path):
    shapes = {"weight": (2, 3), "bias": (2,)}
    verify_trajectory(write_trajectory(tmp_path, shapes, 3), shapes)


@pytest.mark.parametrize(
    ("bad", "message"),
    [
        ({"weight": (2, 3)}, "missing"),
        ({"weight": (2, 3), "bias": (2,), "extra": (1,)}, "unexpected"),
        ({"weight": (3, 3), "bias": (2,)}, "shape"),
    ],
)
def test_mismatched_checkpoint_is_named(tmp_path, bad, message):
    shapes = {"weight": (2, 3), "bias": (2,)}
    paths = write_trajectory(tmp_path, shapes, 3)
    save_checkpoint(Checkpoint({k: np.zeros(s, np.float32) for k, s in bad.items()}), paths[1])
    with pytest.raises(CheckpointError, match=rf"{paths[1]}.*{message}"):
        verify_trajectory(paths, shapes)


def test_truncated_or_missing_trajectory_file_is_named(tmp_path):
    shapes = {"weight": (2, 3), "bias": (2,)}
    paths = write_trajectory(tmp_path, shapes, 3)
    data = open(paths[2], "rb").read()
    open(paths[2], "wb").write(data[: len(data) // 2])
    with pytest.raises(CheckpointError, match=paths[2]):
        verify_trajectory(paths, shapes)
    with pytest.raises(CheckpointError, match="gone.ckpt"):
        verify_trajectory([*paths[:2], str(tmp_path / "gone.ckpt")], shapes)


def test_recorded_weights_follow_training(tmp_path):
    ms.set_seed(0)
    net = nn.Dense(3, 2)
    recorder = recorder_of(net, tmp_path, start_epoch=1, every_steps=1)
    drive(recorder, epochs=1, steps=3)
    values = [load_checkpoint(p).params["bias"] for p in recorder.index["path"]]
    assert np.allclose(values[1] - values[0], 1.0) and np.allclose(values[2] - values[1], 1.0)


def test_resumed_recording_keeps_the_files_before_the_resume_epoch(tmp_path):
    recorder = recorder_of(nn.Dense(3, 2), tmp_path, start_epoch=1, every_steps=2)
    drive(recorder, epochs=3, steps=4)  # global steps 2, 4, ..., 12
    resumed = recorder_of(recorder.net, tmp_path, start_epoch=1, every_steps=2)
    resumed.on_train_begin(3, 4, 1)  # resuming after epoch 1: steps 2 and 4 stay, the rest goes
    assert list(resumed.index["global_step"]) == [2, 4]
    assert list(resumed.index["epoch"]) == [1, 1] and list(resumed.index["step"]) == [2, 4]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["traj_00000002.ckpt", "traj_00000004.ckpt"]
