"""Checkpoint files: round trip (safetensors), older MindSpore ``.ckpt`` files, atomic writes, clear errors."""

from __future__ import annotations

import errno
import json
import os
import socket
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from tests.support.checkpoints import save_mindspore_ckpt
from trainlib.atomic_write import atomic_path, remove_abandoned_temporaries
from trainlib.engine.checkpoint import (
    METADATA_KEY,
    Checkpoint,
    CheckpointError,
    CheckpointMemoryError,
    CheckpointSpaceError,
    check_compatible,
    is_safetensors,
    load_checkpoint,
    load_metadata,
    save_checkpoint,
)
from trainlib.engine.resume import find_resume_checkpoint


@pytest.fixture
def checkpoint() -> Checkpoint:
    rng = np.random.default_rng(0)
    return Checkpoint(
        params={
            "stem.0.weight": rng.standard_normal((4, 3, 3, 3)).astype(np.float32),
            "stem.1.gamma": np.ones(4, np.float32),
            "fc.bias": rng.standard_normal(5).astype(np.float32),
            "optimizer.moments.fc.bias": rng.standard_normal(5).astype(np.float32),
            "optimizer.global_step": np.array([12], np.int32),
        },
        metadata={"network": "resnet_narrow", "epoch": 3, "lr": 0.125, "final": False},
    )


def shapes(params: dict[str, np.ndarray]) -> dict[str, tuple[int, ...]]:
    return {name: tuple(value.shape) for name, value in params.items()}


def test_round_trip_keeps_params_and_metadata(tmp_path, checkpoint):
    path = tmp_path / "model.ckpt"
    save_checkpoint(checkpoint, path)
    loaded = load_checkpoint(path)
    assert loaded.params.keys() == checkpoint.params.keys()
    for name, value in checkpoint.params.items():
        assert loaded.params[name].dtype == value.dtype, name
        np.testing.assert_array_equal(loaded.params[name], value, err_msg=name)
    assert loaded.metadata == checkpoint.metadata
    assert type(loaded.metadata["epoch"]) is int and type(loaded.metadata["final"]) is bool
    assert METADATA_KEY not in loaded.params


def test_network_params_and_optimizer_state_split_on_the_prefix(tmp_path, checkpoint):
    save_checkpoint(checkpoint, tmp_path / "model.ckpt")
    loaded = load_checkpoint(tmp_path / "model.ckpt")
    assert set(loaded.network_params()) == {"stem.0.weight", "stem.1.gamma", "fc.bias"}
    assert set(loaded.optimizer_state()) == {"moments.fc.bias", "global_step"}
    np.testing.assert_array_equal(
        loaded.optimizer_state()["moments.fc.bias"], checkpoint.params["optimizer.moments.fc.bias"]
    )


def test_round_trip_keeps_zero_dimensional_arrays(tmp_path):
    save_checkpoint(Checkpoint({"momentum": np.array(0.9, np.float32)}), tmp_path / "s.ckpt")
    assert load_checkpoint(tmp_path / "s.ckpt").params["momentum"].shape == ()


def test_a_checkpoint_is_a_safetensors_file_with_the_metadata_in_its_header(tmp_path, checkpoint):
    from safetensors import safe_open

    path = tmp_path / "model.ckpt"
    save_checkpoint(checkpoint, path)
    assert is_safetensors(path)
    with safe_open(path, framework="numpy") as file:  # any safetensors reader reads it
        assert set(file.keys()) == set(checkpoint.params)
        assert json.loads(file.metadata()[METADATA_KEY]) == checkpoint.metadata
        np.testing.assert_array_equal(file.get_tensor("stem.0.weight"), checkpoint.params["stem.0.weight"])
    assert load_metadata(path) == checkpoint.metadata


def test_a_safetensors_name_is_written_alike_and_mindspore_reads_it(tmp_path, checkpoint):
    import mindspore as ms

    path = tmp_path / "model.safetensors"
    save_checkpoint(checkpoint, path)
    assert load_checkpoint(path).metadata == checkpoint.metadata
    loaded = ms.load_checkpoint(str(path), format="safetensors")
    np.testing.assert_array_equal(loaded["fc.bias"].asnumpy(), checkpoint.params["fc.bias"])


def test_a_mindspore_ckpt_written_before_safetensors_still_loads(tmp_path, checkpoint):
    path = tmp_path / "epoch_0003.ckpt"
    scalars = Checkpoint({**checkpoint.params, "momentum": np.array(0.9, np.float32)}, checkpoint.metadata)
    save_mindspore_ckpt(scalars, path)
    assert not is_safetensors(path)
    loaded = load_checkpoint(path)
    assert loaded.metadata == checkpoint.metadata
    assert loaded.params.keys() == scalars.params.keys()
    for name, value in scalars.params.items():
        assert loaded.params[name].dtype == value.dtype and loaded.params[name].shape == value.shape, name
        np.testing.assert_array_equal(loaded.params[name], value, err_msg=name)
    assert load_metadata(path) == checkpoint.metadata


def test_a_resume_takes_the_newest_checkpoint_whichever_the_format(tmp_path, checkpoint):
    """A training interrupted before the switch resumes from its .ckpt, then writes safetensors beside it."""
    folder = tmp_path / "epochs"
    for epoch in (1, 2):
        save_mindspore_ckpt(
            Checkpoint(checkpoint.params, {"epoch": epoch, "fingerprint": "f"}), folder / f"epoch_{epoch:04d}.ckpt"
        )
    assert find_resume_checkpoint(folder, "epoch", "f", stop_epoch=5) == folder / "epoch_0002.ckpt"
    save_checkpoint(Checkpoint(checkpoint.params, {"epoch": 3, "fingerprint": "f"}), folder / "epoch_0003.ckpt")
    assert find_resume_checkpoint(folder, "epoch", "f", stop_epoch=5) == folder / "epoch_0003.ckpt"


def truncations(data: bytes) -> dict[str, bytes]:
    """A safetensors file cut inside its header length, inside its header, and inside its arrays; its header broken."""
    header_end = 8 + int.from_bytes(data[:8], "little")
    return {
        "length": data[:5],
        "header": data[: header_end // 2],
        "arrays": data[: (header_end + len(data)) // 2],
        "last-byte": data[:-1],
        "bad-header": data[:9] + b"\x00" * (header_end - 9) + data[header_end:],
        "bad-metadata": data.replace(b'"{\\"network', b'"[\\"network', 1),  # our JSON inside a valid header
    }


@pytest.mark.parametrize("cut", ["length", "header", "arrays", "last-byte", "bad-header", "bad-metadata"])
def test_a_truncated_or_corrupt_safetensors_checkpoint_raises_checkpoint_error_naming_it(tmp_path, checkpoint, cut):
    path = tmp_path / "epoch_0001.ckpt"
    save_checkpoint(checkpoint, path)
    path.write_bytes(truncations(path.read_bytes())[cut])
    for read in (load_checkpoint, load_metadata):
        with pytest.raises(CheckpointError, match="truncated or corrupt") as error:
            read(path)
        assert not isinstance(error.value, CheckpointMemoryError)
        assert str(path) in str(error.value)


def test_a_failed_write_leaves_no_partial_file_and_the_old_checkpoint_whole(tmp_path, checkpoint, monkeypatch):
    """The writer dies halfway (an I/O error after part of the file): the old checkpoint is untouched, no temporary
    is left, and the name never held a partial file."""
    import safetensors.numpy

    path = tmp_path / "model.ckpt"
    save_checkpoint(checkpoint, path)
    before = path.read_bytes()

    def write_half(tensors, filename, metadata=None):
        Path(filename).write_bytes(safetensors.numpy.save(tensors, metadata)[:100])
        raise OSError(errno.EIO, "Input/output error")

    monkeypatch.setattr(safetensors.numpy, "save_file", write_half)
    with pytest.raises(OSError, match="Input/output error"):
        save_checkpoint(Checkpoint({"w": np.ones(1000, np.float32)}, {"epoch": 4}), path)
    with pytest.raises(OSError, match="Input/output error"):
        save_checkpoint(checkpoint, tmp_path / "new.ckpt")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["model.ckpt"]
    assert path.read_bytes() == before


def test_save_creates_parent_folders_and_leaves_no_temporary_file(tmp_path, checkpoint):
    folder = tmp_path / "deep" / "er"
    save_checkpoint(checkpoint, folder / "model.ckpt")
    assert sorted(p.name for p in folder.iterdir()) == ["model.ckpt"]
    assert not atomic_path(folder / "model.ckpt").exists()


def test_save_overwrites_an_existing_checkpoint(tmp_path, checkpoint):
    path = tmp_path / "model.ckpt"
    save_checkpoint(checkpoint, path)
    newer = Checkpoint({"w": np.full((2, 2), 7.0, np.float32)}, {"epoch": 4})
    save_checkpoint(newer, path)
    loaded = load_checkpoint(path)
    assert set(loaded.params) == {"w"}
    assert loaded.metadata == {"epoch": 4}
    assert sorted(p.name for p in tmp_path.iterdir()) == ["model.ckpt"]


def test_path_must_end_in_ckpt_or_safetensors(tmp_path, checkpoint):
    with pytest.raises(CheckpointError, match=r"must end in \.ckpt or \.safetensors"):
        save_checkpoint(checkpoint, tmp_path / "model.pt")
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize("content", [b"", b"not a checkpoint at all" * 10], ids=["empty", "garbage"])
def test_corrupt_file_raises_checkpoint_error_naming_the_path(tmp_path, content):
    path = tmp_path / "bad.ckpt"
    path.write_bytes(content)
    with pytest.raises(CheckpointError) as error:
        load_checkpoint(path)
    assert str(path) in str(error.value)


def test_an_intact_file_larger_than_the_available_memory_is_not_called_corrupt(tmp_path, checkpoint, monkeypatch):
    from pipelines.failures import Failure
    from trainlib.engine import checkpoint as checkpoints

    path = tmp_path / "model.ckpt"
    save_checkpoint(checkpoint, path)
    monkeypatch.setattr(checkpoints, "available_memory", lambda: 100)  # bytes; the file has about 1,000
    with pytest.raises(CheckpointMemoryError) as error:
        load_checkpoint(path)
    failure = Failure.of(error.value)
    assert str(path) in failure.lines[0] and "corrupt" not in failure.summary()
    assert "free memory" in failure.advice and "delete" not in failure.advice
    monkeypatch.undo()
    assert load_checkpoint(path).params.keys() == checkpoint.params.keys()  # the file was kept as it was


def test_running_out_of_memory_while_reading_the_arrays_is_not_called_corrupt(tmp_path, checkpoint, monkeypatch):
    import safetensors

    class OutOfMemory:
        def __init__(self, *args, **kwargs):
            self.file = real(*args, **kwargs)

        def __enter__(self):
            self.file.__enter__()
            return self

        def __exit__(self, *exc):
            return self.file.__exit__(*exc)

        def metadata(self):
            return self.file.metadata()

        def keys(self):
            return self.file.keys()

        def get_tensor(self, name):
            raise MemoryError

    path = tmp_path / "model.ckpt"
    save_checkpoint(checkpoint, path)
    real = safetensors.safe_open
    monkeypatch.setattr(safetensors, "safe_open", OutOfMemory)
    with pytest.raises(CheckpointMemoryError, match="does not fit in the available memory") as error:
        load_checkpoint(path)
    assert str(path) in str(error.value)


def test_a_mindspore_ckpt_running_out_of_memory_while_parsed_is_not_called_corrupt(tmp_path, checkpoint, monkeypatch):
    import mindspore as ms

    def parse_out_of_memory(*_args, **_kwargs):  # what MindSpore raises when protobuf's parse runs out of memory
        raise ValueError("For 'load_checkpoint', not enough memory to load checkpoint protobuf content") from (
            MemoryError()
        )

    path = tmp_path / "model.ckpt"
    save_mindspore_ckpt(checkpoint, path)
    monkeypatch.setattr(ms, "load_checkpoint", parse_out_of_memory)
    with pytest.raises(CheckpointMemoryError, match="does not fit in the available memory"):
        load_checkpoint(path)


def test_page_cache_counts_as_memory_for_a_mindspore_ckpt_load(tmp_path, checkpoint, monkeypatch):
    """MindSpore's own probe counts free pages only; with the page cache full it would refuse any file."""
    from mindspore.train import serialization

    path = tmp_path / "model.ckpt"
    save_mindspore_ckpt(checkpoint, path)
    monkeypatch.setattr(serialization, "_get_available_memory", lambda: 1000)  # free pages: next to none
    assert load_checkpoint(path).params.keys() == checkpoint.params.keys()
    assert serialization._get_available_memory() == 1000  # MindSpore's probe is its own again after the load


def test_missing_file_raises_checkpoint_error_naming_the_path(tmp_path):
    path = tmp_path / "nowhere" / "model.ckpt"
    with pytest.raises(CheckpointError, match="does not exist") as error:
        load_checkpoint(path)
    assert str(path) in str(error.value)


def test_checkpoint_error_is_a_value_error():
    assert issubclass(CheckpointError, ValueError)


def test_check_compatible_accepts_matching_shapes(checkpoint):
    check_compatible(shapes(checkpoint.network_params()), checkpoint, "initial weights")  # no error


def test_check_compatible_ignores_optimizer_state(checkpoint):
    expected = shapes(checkpoint.network_params())
    assert not any(name.startswith("optimizer.") for name in expected)
    check_compatible(expected, checkpoint, "resume")  # the optimizer entries are not "unexpected"


def test_check_compatible_names_source_and_missing_params(checkpoint):
    expected = shapes(checkpoint.network_params()) | {"fc.weight": (5, 4)}
    with pytest.raises(CheckpointError, match="missing") as error:
        check_compatible(expected, checkpoint, "data/06_models/initial.ckpt")
    message = str(error.value)
    assert "data/06_models/initial.ckpt" in message
    assert "fc.weight" in message


def test_check_compatible_names_source_and_unexpected_params(checkpoint):
    expected = shapes(checkpoint.network_params())
    del expected["fc.bias"]
    with pytest.raises(CheckpointError, match="unexpected") as error:
        check_compatible(expected, checkpoint, "pretrained weights")
    assert "pretrained weights" in str(error.value)
    assert "fc.bias" in str(error.value)


def test_check_compatible_names_source_and_reshaped_params(checkpoint):
    expected = shapes(checkpoint.network_params()) | {"fc.bias": (10,)}
    with pytest.raises(CheckpointError) as error:
        check_compatible(expected, checkpoint, "resume checkpoint")
    message = str(error.value)
    assert "resume checkpoint" in message
    assert "fc.bias has shape (5,) instead of (10,)" in message
    assert "missing" not in message and "unexpected" not in message


def test_check_compatible_reports_every_kind_of_problem_at_once(checkpoint):
    expected = {"stem.0.weight": (8, 3, 3, 3), "stem.1.gamma": (4,), "fc.weight": (5, 4)}
    with pytest.raises(CheckpointError) as error:
        check_compatible(expected, checkpoint, "src")
    message = str(error.value)
    assert "missing ['fc.weight']" in message
    assert "unexpected ['fc.bias']" in message
    assert "stem.0.weight has shape (4, 3, 3, 3) instead of (8, 3, 3, 3)" in message


@pytest.mark.parametrize(
    "bad",
    [
        Checkpoint({"w": np.zeros(2, np.float32)}, {"milestones": [30, 60]}),  # metadata JSON could hold it: refused
        Checkpoint({"w": np.zeros(2, np.float32)}, {"shape": (1, 2)}),
        Checkpoint({"w": np.array([object(), object()], dtype=object)}, {}),  # not a tensor at all
    ],
    ids=["list-metadata", "tuple-metadata", "object-array"],
)
def test_failed_save_leaves_the_existing_checkpoint_untouched(tmp_path, checkpoint, bad):
    path = tmp_path / "model.ckpt"
    save_checkpoint(checkpoint, path)
    before = path.read_bytes()
    with pytest.raises((CheckpointError, TypeError, ValueError, RuntimeError)):
        save_checkpoint(bad, path)
    assert path.read_bytes() == before
    assert sorted(p.name for p in tmp_path.iterdir()) == ["model.ckpt"]
    assert load_checkpoint(path).metadata == checkpoint.metadata


def test_non_scalar_metadata_error_names_the_offending_key(tmp_path):
    with pytest.raises(CheckpointError, match="milestones"):
        save_checkpoint(Checkpoint({"w": np.zeros(1, np.float32)}, {"milestones": [1]}), tmp_path / "m.ckpt")


def dead_pid() -> int:
    """The pid of a process that has exited (and been reaped)."""
    process = subprocess.run(
        [sys.executable, "-c", "import os; print(os.getpid())"], check=True, capture_output=True, text=True
    )
    return int(process.stdout)


def test_a_resume_removes_the_temporaries_an_interrupted_save_left(tmp_path, checkpoint):
    """A kill or a full disk during a save leaves our temporary or MindSpore's own (``.tmp.tmp``); the next look
    for a checkpoint to resume from removes those of dead processes of this host, and nothing else."""
    folder = tmp_path / "epochs"
    save_checkpoint(
        Checkpoint(checkpoint.params, {**checkpoint.metadata, "fingerprint": "f"}), folder / "epoch_0001.ckpt"
    )
    host = socket.gethostname()
    dead, alive = dead_pid(), os.getpid()
    abandoned = [folder / f".epoch_0002.{host}-{dead}.tmp.tmp", folder / f".epoch_0002.{host}-{dead}.tmp.ckpt"]
    kept = [folder / f".epoch_0002.{host}-{alive}.tmp.ckpt", folder / f".epoch_0002.otherhost-{dead}.tmp.ckpt"]
    for path in abandoned + kept:
        path.write_bytes(b"partial")
    found = find_resume_checkpoint(folder, "epoch", "f", stop_epoch=5)
    assert found == folder / "epoch_0001.ckpt"
    assert sorted(p.name for p in folder.iterdir()) == sorted(["epoch_0001.ckpt", *(p.name for p in kept)])
    assert remove_abandoned_temporaries(folder) == []


@pytest.fixture
def small_disk(tmp_path):
    """A 1 MB tmpfs (needs root, as CI runs): a real full disk."""
    mount = tmp_path / "small_disk"
    mount.mkdir()
    result = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", "size=1m", "tmpfs", str(mount)], check=False, capture_output=True
    )
    if result.returncode != 0:
        if os.environ.get("CI") == "true":
            pytest.fail(f"mounting a tmpfs failed under CI: {result.stderr.decode()}")
        pytest.skip(f"cannot mount a tmpfs here (not root?): {result.stderr.decode().strip()}")
    yield mount
    subprocess.run(["umount", str(mount)], check=True)


def test_a_full_disk_names_the_folder_and_the_space_a_checkpoint_needs_and_leaves_nothing(small_disk):
    folder = small_disk / "epochs"
    small = Checkpoint({"w": np.zeros(1000, np.float32)}, {"epoch": 1})
    save_checkpoint(small, folder / "epoch_0001.ckpt")
    large = Checkpoint({"w": np.zeros(600_000, np.float32)}, {"epoch": 2})  # 2.4 MB
    with pytest.raises(CheckpointSpaceError) as raised:
        save_checkpoint(large, folder / "epoch_0002.ckpt")
    message = str(raised.value)
    assert raised.value.errno == errno.ENOSPC
    assert f"no space left on the device of {folder}" in message
    assert "needs about 2.4 MB" in message and "MB are free" in message and "rerun the same command" in message
    assert sorted(p.name for p in folder.iterdir()) == ["epoch_0001.ckpt"]  # no temporary of either kind
    assert load_checkpoint(folder / "epoch_0001.ckpt").metadata["epoch"] == 1
