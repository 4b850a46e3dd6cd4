"""The engine's state: a training's full state captured and restored (network, optimizer), and which checkpoint a
training resumes from (the newest of the same unfinished training; another configuration's moved aside, the stale
folders trimmed)."""

from __future__ import annotations

import numpy as np
import pytest

from tests.support.training import CLASSES, build, write_epoch
from trainlib.engine.checkpoint import OPTIMIZER_PREFIX, load_checkpoint, save_checkpoint
from trainlib.engine.resume import find_resume_checkpoint
from trainlib.engine.state import capture_state, restore_state
from trainlib.models.resnet import create_resnet
from trainlib.optim.schedules import warmup_schedule

BATCH, IMAGE_SIZE = 4, 12


def lr_schedule() -> np.ndarray:
    return warmup_schedule("linear", 0.01, 0.1, 0.0, 1, 2, 4)


def all_params(cell) -> dict[str, np.ndarray]:
    return {p.name: p.asnumpy().copy() for p in cell.get_parameters()}


def test_capture_and_restore_state_round_trip(mindspore_cpu, tmp_path):
    ms = mindspore_cpu
    rng = np.random.default_rng(0)
    images = ms.Tensor(rng.standard_normal((BATCH, 3, IMAGE_SIZE, IMAGE_SIZE)).astype(np.float32))
    labels = ms.Tensor(np.array([0, 1, 2, 0], np.int32))
    lr_per_step = lr_schedule()

    net, optimizer, step = build(1, lr_per_step)
    for _ in range(3):
        step(images, labels)
    state = capture_state(net, optimizer, {"network": "resnet_narrow", "epoch": 1})
    assert state.metadata == {"network": "resnet_narrow", "epoch": 1}
    # network params (BatchNorm statistics included) under their own names, optimizer state prefixed
    assert set(state.network_params()) == set(all_params(net))
    assert any(name.endswith("moving_mean") for name in state.network_params())
    assert {"moments.fc.weight", "global_step", "learning_rate", "momentum"} <= set(state.optimizer_state())
    assert not any(name.startswith(OPTIMIZER_PREFIX + "fc.") for name in state.params)  # no duplicates
    assert int(state.optimizer_state()["global_step"].reshape(-1)[0]) == 3
    assert np.abs(state.optimizer_state()["moments.fc.weight"]).max() > 0

    fresh_net, fresh_optimizer, fresh_step = build(2, lr_per_step)
    assert not np.array_equal(all_params(fresh_net)["fc.weight"], state.params["fc.weight"])
    restore_state(fresh_net, state, fresh_optimizer)
    restored_net, restored_optimizer = all_params(fresh_net), all_params(fresh_optimizer)
    for name, value in all_params(net).items():
        np.testing.assert_array_equal(restored_net[name], value, err_msg=name)
    for name, value in all_params(optimizer).items():
        np.testing.assert_array_equal(restored_optimizer[name].reshape(value.shape), value, err_msg=name)

    # the restored pair continues exactly like the original, also after a trip through a file
    save_checkpoint(state, tmp_path / "state.ckpt")
    disk_net, disk_optimizer, disk_step = build(3, lr_per_step)
    restore_state(disk_net, load_checkpoint(tmp_path / "state.ckpt"), disk_optimizer)
    expected = float(step(images, labels).asnumpy())
    assert float(fresh_step(images, labels).asnumpy()) == expected
    assert float(disk_step(images, labels).asnumpy()) == expected
    np.testing.assert_array_equal(all_params(fresh_net)["fc.weight"], all_params(net)["fc.weight"])
    np.testing.assert_array_equal(all_params(disk_net)["fc.weight"], all_params(net)["fc.weight"])


def test_capture_without_optimizer_holds_only_network_params():
    net = create_resnet("resnet_narrow", CLASSES)
    state = capture_state(net, None, {"epoch": 0})
    assert state.optimizer_state() == {}
    assert set(state.params) == set(all_params(net))


def test_restore_state_needs_optimizer_state_when_given_an_optimizer():
    lr_per_step = lr_schedule()
    net, optimizer, _ = build(0, lr_per_step)
    weights_only = capture_state(net, None, {})
    other_net, other_optimizer, _ = build(1, lr_per_step)
    with pytest.raises(ValueError, match="lacks optimizer state"):
        restore_state(other_net, weights_only, other_optimizer)
    restore_state(other_net, weights_only)  # the network alone is fine
    np.testing.assert_array_equal(all_params(other_net)["fc.weight"], all_params(net)["fc.weight"])


def test_restore_state_rejects_a_checkpoint_missing_network_params():
    net = create_resnet("resnet_narrow", CLASSES)
    state = capture_state(net, None, {})
    del state.params["fc.bias"]
    with pytest.raises(ValueError, match="fc.bias"):
        restore_state(create_resnet("resnet_narrow", CLASSES), state)


def test_resume_picks_the_newest_checkpoint_of_the_same_unfinished_training(tmp_path):
    assert find_resume_checkpoint(tmp_path, "epoch", "abc", stop_epoch=5) is None
    write_epoch(tmp_path, 2, "abc")
    write_epoch(tmp_path, 3, "abc")
    assert find_resume_checkpoint(tmp_path, "epoch", "abc", stop_epoch=5) == tmp_path / "epoch_0003.ckpt"


def test_checkpoints_of_another_configuration_are_moved_aside(tmp_path):
    write_epoch(tmp_path, 2, "other")
    assert find_resume_checkpoint(tmp_path, "epoch", "abc", stop_epoch=5) is None
    stale = [p for p in tmp_path.iterdir() if p.is_dir()]
    assert len(stale) == 1 and stale[0].name.startswith("stale-")
    assert [p.name for p in stale[0].iterdir()] == ["epoch_0002.ckpt"]
    assert not list(tmp_path.glob("*.ckpt"))


def test_a_finished_training_is_not_resumed(tmp_path):
    write_epoch(tmp_path, 4, "abc")
    write_epoch(tmp_path, 5, "abc")
    assert find_resume_checkpoint(tmp_path, "epoch", "abc", stop_epoch=5) is None
    assert not list(tmp_path.iterdir())  # a new run's epoch_0001 must not be rotated away by old files


def make_stale(folder, names) -> None:
    for name in names:
        (folder / name).mkdir(parents=True)
        write_epoch(folder / name, 1, name)


def test_stale_folders_beyond_keep_stale_are_removed_oldest_first(tmp_path, caplog):
    keep = 2
    old = [f"stale-20200101-00000{i}" for i in range(keep + 2)]
    make_stale(tmp_path, old)
    with caplog.at_level("INFO", logger="trainlib.engine.resume"):
        assert find_resume_checkpoint(tmp_path, "epoch", "abc", stop_epoch=5, keep_stale=keep) is None
    assert sorted(p.name for p in tmp_path.iterdir()) == old[-keep:]
    removed = [r.getMessage() for r in caplog.records if r.getMessage().startswith("Removed ")]
    assert len(removed) == 2 and str(tmp_path / old[0]) in removed[0] and str(tmp_path / old[1]) in removed[1]

    # checkpoints of another configuration make a new stale folder, the newest of the ones kept
    write_epoch(tmp_path, 2, "other")
    assert find_resume_checkpoint(tmp_path, "epoch", "abc", stop_epoch=5, keep_stale=keep) is None
    kept = sorted(p.name for p in tmp_path.iterdir())
    assert len(kept) == keep and kept[0] == old[-1] and kept[1] > old[-1]
    assert [p.name for p in (tmp_path / kept[1]).iterdir()] == ["epoch_0002.ckpt"]


def test_two_moves_in_the_same_second_make_two_stale_folders(tmp_path):
    for run_id in ("first", "second"):
        write_epoch(tmp_path, 2, run_id)
        assert find_resume_checkpoint(tmp_path, "epoch", "abc", stop_epoch=5) is None
    assert len([p for p in tmp_path.iterdir() if p.name.startswith("stale-")]) == 2
