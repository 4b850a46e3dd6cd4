"""Ingest of a tree with the faults of a partial copy, the verdict cache, and files changed after ingest."""

from __future__ import annotations

import logging
import os
import re
import select
import shutil
import signal
import socket
import subprocess
import sys
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
from mindspore import nn
from PIL import Image

from pipelines.data.nodes import build_manifest  # (its import sets Kedro's logging up: before caplog's handler)
from tests.support.config import load_config
from tests.support.trees import class_colour
from trainlib.data import verify as verify_module
from trainlib.data.folder import InputPipelineError, checked_batches, create_dataset, scan_image_tree
from trainlib.data.links import ChangedImageError, link_split
from trainlib.data.verify import FolderFiles, verify_files
from trainlib.params import DataParams

SPLITS = {"train": "train", "val": "val"}
BAD_IMAGES = Path(__file__).parents[1] / "predict" / "bad_images"  # the regression files of mindir_serving.decoding
CLASSES = ("ant", "bee")
SIZE = 16


def write_image(path: Path, label: int, mode: str = "RGB", fmt: str = "JPEG", seed: int = 0) -> Path:
    """A ``SIZE`` x ``SIZE`` image of the class colour plus noise, in ``mode``, encoded as ``fmt``."""
    rng = np.random.default_rng(seed)
    pixels = np.clip(class_colour(label) + rng.integers(-20, 21, (SIZE, SIZE, 3)), 0, 255).astype(np.uint8)
    path.parent.mkdir(parents=True, exist_ok=True)
    Image.fromarray(pixels).convert(mode).save(path, fmt)
    return path


def truncate(path: Path, keep: float = 0.6) -> None:
    data = path.read_bytes()
    path.write_bytes(data[: int(len(data) * keep)])


@pytest.fixture
def fault_tree(tmp_path) -> tuple[Path, dict[str, str], set[str]]:
    """A tree with each fault of a partial copy and each oddity that must still load.

    Returns the root, {fault path: expected start of its reason} and the paths that must load.
    """
    root = tmp_path / "imagenet"
    loads = set()
    for label, name in enumerate(CLASSES):
        for index in range(6):
            loads.add(write_image(root / "train" / name / f"{name}_{index}.JPEG", label, seed=index))
        loads.add(write_image(root / "val" / name / f"{name}_val.jpg", label))
    ant, bee = root / "train" / "ant", root / "train" / "bee"
    loads |= {
        write_image(ant / "cmyk.JPEG", 0, mode="CMYK"),
        write_image(ant / "grey.JPEG", 0, mode="L"),
        write_image(bee / "png_inside.JPEG", 1, fmt="PNG"),
        write_image(bee / "lower_case.jpeg", 1),
        write_image(bee / "UPPER_CASE.JPG", 1),
    }
    truncated = write_image(ant / "truncated.JPEG", 0, seed=99)
    truncate(truncated)
    (ant / "empty.JPEG").write_bytes(b"")
    (ant / ".DS_Store").write_bytes(b"\x00\x00\x00\x01Bud1")
    (ant / "._ant_0.JPEG").write_bytes(b"\x00\x05\x16\x07")  # macOS AppleDouble sidecar
    (bee / "README.txt").write_text("synset n02206856\n")
    (bee / "dangling.JPEG").symlink_to(root / "nowhere.JPEG")
    # A file that cannot be opened. Root opens any file whatever its mode, so use what nobody can
    # open: a link to itself (ELOOP); as another user, a file without read permission as well.
    (bee / "loop.JPEG").symlink_to(bee / "loop.JPEG")
    # the files that ended or hung MindSpore's decoder (issue 52): Pillow's decode refuses each before training sees it
    crashers = {}
    for kept in sorted(BAD_IMAGES.iterdir()):
        copy = (bee if kept.name.startswith("sig") else ant) / kept.name.replace(".jpg", ".JPEG")
        shutil.copyfile(kept, copy)
        if kept.name.startswith("warns_"):
            loads.add(copy)  # decodes, with libjpeg's warning
        else:
            crashers[copy] = "cannot be decoded"
    faults = {
        **crashers,
        truncated: "cannot be decoded",
        ant / "empty.JPEG": "empty file",
        ant / ".DS_Store": "hidden or system file",
        ant / "._ant_0.JPEG": "hidden or system file",
        bee / "README.txt": "not an image file",
        bee / "dangling.JPEG": "broken symbolic link",
        bee / "loop.JPEG": "cannot be opened",
    }
    if os.geteuid() != 0:
        locked = write_image(bee / "locked.JPEG", 1)
        locked.chmod(0)
        faults[locked] = "cannot be opened"
    return root, {str(p): reason for p, reason in faults.items()}, {str(p) for p in loads}


def every_file(root: Path) -> set[str]:
    """Every entry under the split folders that is not a folder (links included, broken or not)."""
    found = set()
    for folder, dirs, files in os.walk(root):
        found.update(os.path.join(folder, name) for name in files)
        found.update(os.path.join(folder, name) for name in dirs if os.path.islink(os.path.join(folder, name)))
    return found


def test_every_fault_is_listed_with_its_reason_and_every_oddity_loads(fault_tree, tmp_path):
    root, faults, loads = fault_tree
    result = scan_image_tree(root, SPLITS, on_bad_file="exclude", cache_path=tmp_path / "verdicts.sqlite")
    bad = result.bad_files.set_index("path")["reason"]
    assert set(bad.index) == set(faults)
    for path, reason in faults.items():
        assert bad[path].startswith(reason), (path, bad[path])
    assert set(result.manifest["path"]) == loads
    # nothing on disk is dropped without a line in bad_files
    assert every_file(root) == set(result.manifest["path"]) | set(bad.index)


def test_a_training_epoch_over_the_rest_completes(fault_tree, tmp_path):
    root, _, loads = fault_tree
    manifest = scan_image_tree(root, SPLITS, on_bad_file="exclude").manifest
    dataset = create_dataset(manifest, "train", SIZE, 4, training=True, num_workers=1, cache_dir=tmp_path / "cache")
    network = nn.SequentialCell(nn.Flatten(), nn.Dense(3 * SIZE * SIZE, len(CLASSES)))
    loss = nn.SoftmaxCrossEntropyWithLogits(sparse=True, reduction="mean")
    step = nn.TrainOneStepCell(nn.WithLossCell(network, loss), nn.Momentum(network.trainable_params(), 0.01, 0.9))
    train_rows = [p for p in loads if "/train/" in p]
    losses = [float(step(images, labels).asnumpy()) for images, labels in dataset.create_tuple_iterator(num_epochs=1)]
    assert len(losses) == len(train_rows) // 4 == dataset.get_dataset_size()
    assert all(np.isfinite(losses))


def test_the_log_gives_per_class_counts_and_the_excluded_files(fault_tree, caplog):
    root, faults, loads = fault_tree
    with caplog.at_level(logging.INFO, logger="trainlib.data"):
        scan_image_tree(root, SPLITS, on_bad_file="exclude")
    per_class = {name: sum(f"/train/{name}/" in p for p in loads) for name in CLASSES}
    assert f"train: {sum(per_class.values())} images in 2 classes: ant {per_class['ant']}, bee {per_class['bee']}" in (
        caplog.text
    )
    assert "val: 2 images in 2 classes: ant 1, bee 1" in caplog.text
    assert f"Excluded {len(faults)} file(s) (" in caplog.text
    for path in faults:
        assert f"Bad file {path}: " in caplog.text


def test_verification_reports_progress_with_rate_and_eta(jpeg_tree, caplog, monkeypatch):
    monkeypatch.setattr(verify_module._Progress, "LOG_EVERY_S", 0.0)  # a line per batch, not every 10 s
    with caplog.at_level(logging.INFO, logger="trainlib.data.verify"):
        scan_image_tree(jpeg_tree, SPLITS)
    assert re.search(r"Verifying images \(decode\): 14/14 files \(100\.0%\), \d+ files/s, ETA 0:00", caplog.text)


def test_bad_files_fail_the_ingest_naming_each(fault_tree):
    root, faults, _ = fault_tree
    with pytest.raises(ValueError, match=f"{len(faults)} unusable file") as error:
        scan_image_tree(root, SPLITS, on_bad_file="fail")
    for path in faults:
        assert path in str(error.value)


# ---------------------------------------------------------------- the verdict cache


@pytest.fixture
def jpeg_tree(make_image_tree) -> Path:
    return make_image_tree(classes=CLASSES, per_class={"train": 5, "val": 2}, fmt="jpg", size=SIZE)


def test_a_rerun_on_an_unchanged_tree_verifies_no_file(jpeg_tree, tmp_path):
    cache = tmp_path / "verdicts.sqlite"
    first = scan_image_tree(jpeg_tree, SPLITS, cache_path=cache)
    assert first.verified_files == 14
    again = scan_image_tree(jpeg_tree, SPLITS, cache_path=cache)
    assert again.verified_files == 0
    pd.testing.assert_frame_equal(first.manifest, again.manifest)


def test_a_changed_file_is_verified_again(jpeg_tree, tmp_path):
    cache = tmp_path / "verdicts.sqlite"
    scan_image_tree(jpeg_tree, SPLITS, cache_path=cache)
    victim = jpeg_tree / "train" / "bee" / "bee_train_001.jpg"
    truncate(victim)
    result = scan_image_tree(jpeg_tree, SPLITS, on_bad_file="exclude", cache_path=cache)
    assert result.verified_files == 1
    assert result.bad_files["path"].tolist() == [str(victim)]
    # repaired: verified again, and usable again
    write_image(victim, 1)
    repaired = scan_image_tree(jpeg_tree, SPLITS, cache_path=cache)
    assert repaired.verified_files == 1
    assert str(victim) in set(repaired.manifest["path"])


def test_a_header_verdict_does_not_answer_a_decode_check(jpeg_tree, tmp_path):
    cache = tmp_path / "verdicts.sqlite"
    victim = jpeg_tree / "train" / "ant" / "ant_train_000.jpg"
    Image.fromarray(np.random.default_rng(0).integers(0, 256, (64, 64, 3), dtype=np.uint8)).save(victim, "JPEG")
    truncate(victim, keep=0.7)  # the header is whole, the pixels are not
    header = scan_image_tree(jpeg_tree, SPLITS, verify="header", on_bad_file="exclude", cache_path=cache)
    assert header.verified_files == 14 and header.bad_files.empty  # the risk of header: it passes
    decode = scan_image_tree(jpeg_tree, SPLITS, verify="decode", on_bad_file="exclude", cache_path=cache)
    assert decode.verified_files == 14
    assert decode.bad_files["path"].tolist() == [str(victim)]
    # a decode verdict answers a header check
    again = scan_image_tree(jpeg_tree, SPLITS, verify="header", on_bad_file="exclude", cache_path=cache)
    assert again.verified_files == 0


def test_parallel_verification_agrees_with_inline_and_resumes(make_image_tree, tmp_path):
    root = make_image_tree(classes=("a", "b"), per_class={"train": 60}, size=4, noise=0)
    bad = root / "train" / "b" / "b_train_007.png"
    truncate(bad)
    folders = []
    for folder in sorted((root / "train").iterdir()):
        files = FolderFiles(str(folder))
        for path in sorted(folder.iterdir()):
            files.add(path.name, path.stat().st_size, path.stat().st_mtime_ns)
        folders.append(files)
    inline, _ = verify_files(folders, "decode", None, workers=1)
    cache = tmp_path / "verdicts.sqlite"
    # an interrupted run: only folder "a" got verified
    assert verify_files(folders[:1], "decode", cache, workers=2)[1] == 60
    parallel, read = verify_files(folders, "decode", cache, workers=2)
    assert read == 60  # the rest, not what the first run had done
    assert parallel == inline
    assert [p for p, problem in parallel.items() if problem] == [str(bad)]


# ---------------------------------------------------------------- files changed after ingest


@pytest.fixture
def ingested(jpeg_tree) -> pd.DataFrame:
    return scan_image_tree(jpeg_tree, SPLITS).manifest


def test_a_file_broken_after_ingest_stops_with_one_line_naming_it(jpeg_tree, ingested, tmp_path):
    victim = jpeg_tree / "train" / "bee" / "bee_train_003.jpg"
    truncate(victim)
    with pytest.raises(ChangedImageError) as error:
        create_dataset(ingested, "train", SIZE, 2, training=True, cache_dir=tmp_path / "cache")
    message = str(error.value)
    assert "\n" not in message
    assert str(victim) in message
    assert "data.on_bad_file: exclude" in message
    assert not list((tmp_path / "cache").rglob("*.partial-*"))  # nothing half built is left


def test_with_exclude_a_file_broken_after_ingest_is_skipped_and_counted(jpeg_tree, ingested, tmp_path):
    victim = jpeg_tree / "val" / "ant" / "ant_val_001.jpg"
    victim.unlink()
    dataset = create_dataset(
        ingested, "val", SIZE, 10, training=False, cache_dir=tmp_path / "cache", on_bad_file="exclude"
    )
    assert dataset.skipped_files.to_dict("records") == [{"path": str(victim), "reason": "no longer exists"}]
    labels = np.concatenate([labels.asnumpy() for _, labels in dataset.create_tuple_iterator(num_epochs=1)])
    assert len(labels) == 3


def test_a_file_changed_after_ingest_that_still_decodes_is_used(jpeg_tree, ingested, tmp_path):
    victim = jpeg_tree / "val" / "bee" / "bee_val_000.jpg"
    write_image(victim, 0, seed=5)  # rewritten with other pixels: size and mtime differ
    dataset = create_dataset(ingested, "val", SIZE, 10, training=False, cache_dir=tmp_path / "cache")
    assert dataset.skipped_files.empty
    assert sum(len(labels) for _, labels in dataset.create_tuple_iterator(num_epochs=1)) == 4


def test_an_image_that_fails_in_training_is_named_in_one_line(make_image_tree, tmp_path):
    """With data.verify: header a file cut short after its header reaches training."""
    root = make_image_tree(classes=CLASSES, per_class={"train": 3}, fmt="jpg")
    victim = root / "train" / "bee" / "bee_train_001.jpg"
    # large enough that MindSpore's libjpeg fails on it (it fills small cut-short images with grey)
    Image.fromarray(np.random.default_rng(0).integers(0, 256, (375, 500, 3), dtype=np.uint8)).save(victim, "JPEG")
    truncate(victim, keep=0.5)
    manifest = scan_image_tree(root, {"train": "train"}, verify="header").manifest
    assert str(victim) in set(manifest["path"])  # the risk of header: it passes ingest
    dataset = create_dataset(manifest, "train", SIZE, 6, training=True, num_workers=1, cache_dir=tmp_path / "cache")
    with pytest.raises(InputPipelineError) as error:
        for _ in checked_batches(dataset.create_tuple_iterator(num_epochs=1)):
            pass
    message = str(error.value)
    assert "\n" not in message
    assert message.startswith(f"{victim} cannot be used (cannot be decoded")
    assert "data.verify: decode" in message


# ---------------------------------------------------------------- the link trees the native reader reads


def class_folders(cache: Path) -> dict[str, int]:
    """Class folder name -> its inode (a rebuilt folder has a new one)."""
    return {d.name: d.stat().st_ino for d in (cache / "links" / "classes").iterdir()}


def test_link_folders_are_reused_while_the_rows_are_unchanged(jpeg_tree, ingested, tmp_path):
    cache = tmp_path / "cache"
    train = ingested[ingested["split"] == "train"]
    first = link_split(train, cache)
    assert first.class_indexing == {"00000": 0, "00001": 1}
    # each label's folder links to its files, in manifest order
    for name, label in first.class_indexing.items():
        linked = sorted((first.root / name).iterdir())
        assert [os.readlink(p) for p in linked] == train.loc[train["label"] == label, "path"].tolist()
    built = class_folders(cache)
    assert len(built) == len(CLASSES)
    again = link_split(train, cache)
    assert again.root == first.root and class_folders(cache) == built
    # a file of one class replaced and ingested again: only that class's folder is built anew
    write_image(jpeg_tree / "train" / "bee" / "bee_train_002.jpg", 1, seed=7)
    rescanned = scan_image_tree(jpeg_tree, SPLITS).manifest
    third = link_split(rescanned[rescanned["split"] == "train"], cache)
    assert third.root != first.root
    now = class_folders(cache)
    assert len(now) == 3 and {k: v for k, v in now.items() if k in built} == built


def test_an_interrupted_build_restarts_cleanly(ingested, tmp_path):
    cache = tmp_path / "cache"
    train = ingested[ingested["split"] == "train"]
    first = link_split(train, cache)
    # as a killed build leaves it: a class folder half built under its partial name, no view
    classes = cache / "links" / "classes"
    folder = sorted(classes.iterdir())[0]
    partial = folder.rename(classes / f"{folder.name}.partial-{socket.gethostname()}-999999999")
    next(partial.iterdir()).unlink()
    shutil.rmtree(first.root)
    again = link_split(train, cache)
    assert not partial.exists()
    assert folder.is_dir() and again.rows == len(train)
    dataset = create_dataset(ingested, "train", SIZE, 2, training=True, cache_dir=cache)
    assert sum(len(labels) for _, labels in dataset.create_tuple_iterator(num_epochs=1)) == 10


# ---------------------------------------------------------------- through Kedro and MLflow


# The process side of the next test: the verification pool open (first batch done), the parent blocked.
_POOL_SCRIPT = """
import sys
import pipelines  # noqa: F401  (sets MindSpore's environment first, as every entry point does)
from pathlib import Path
from trainlib.data.verify import FileState, check_contents
paths = sorted(Path(sys.argv[1]).rglob("*.png"))
files = [FileState(str(p), p.stat().st_size, p.stat().st_mtime_ns) for p in paths]
batches = check_contents(iter(files), len(files), "decode", workers=2)
next(batches)
print("verifying", flush=True)
sys.stdin.read()
"""


def _children(pid: int) -> list[int]:
    found = []
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        if int(fields[1]) == pid:
            found.append(int(stat.parent.name))
    return found


def test_verification_workers_end_with_a_killed_parent(make_image_tree):
    """``kill -9`` of the process that verifies (``kedro run``'s data node) leaves nothing of its pool behind:
    the workers are its own children and end with it, and so does multiprocessing's resource tracker."""
    root = make_image_tree(classes=("a", "b"), per_class={"train": 200}, size=4, noise=0)
    parent = subprocess.Popen(
        [sys.executable, "-c", _POOL_SCRIPT, str(root)], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True
    )
    try:
        assert parent.stdout.readline() == "verifying\n"  # the pool is up and has answered
        children = _children(parent.pid)
        assert len(children) >= 2, f"expected the verification workers among the children, found {children}"
        handles = {pid: os.pidfd_open(pid) for pid in children}
        os.kill(parent.pid, signal.SIGKILL)
        parent.wait()
        # a pidfd becomes readable when its process ends
        alive = dict(handles)
        while alive:
            ready, _, _ = select.select(list(alive.values()), [], [], 30)
            assert ready, f"processes {sorted(alive)} outlived their killed parent by 30 s"
            alive = {pid: fd for pid, fd in alive.items() if fd not in ready}
    finally:
        parent.kill()


@pytest.mark.parametrize("level", ["header", "none", "decode"])
def test_a_level_below_decode_is_warned_of_at_ingest(jpeg_tree, tmp_path, caplog, level):
    """The data pipeline's ingest says that files reach MindSpore's decoder unchecked below ``decode``."""
    data = {**load_config()["data"], "verify": level, "cache_dir": str(tmp_path / "cache")}
    with caplog.at_level(logging.WARNING, logger="pipelines.data"):
        build_manifest(DataParams(**{**data, "source": "folder", "root": str(jpeg_tree)}))
    warned = f"data.verify is {level!r}: image contents reach MindSpore's decoder unchecked" in caplog.text
    assert warned == (level != "decode")


def test_a_missing_data_root_is_named_and_only_the_default_folder_or_create_root_writes_fashion_mnist(tmp_path):
    """A mistyped ``data.root`` stops before any work whatever ``data.source`` says, and creates nothing; Fashion-MNIST
    is written under a missing root at its default folder, or where ``data.create_root`` asks."""
    from pipelines.data.nodes import locate_image_tree, missing_root
    from trainlib.data.fashion_mnist import DEFAULT_ROOT
    from trainlib.data.folder import DataLayoutError

    data = load_config()["data"]
    assert data["root"] == DEFAULT_ROOT and data["create_root"] is False  # conf/base's default is the one allowed
    nope = tmp_path / "nope"
    for source in ("fashion_mnist", "folder"):
        with pytest.raises(DataLayoutError, match=rf"^data.root {nope} does not exist"):
            locate_image_tree(DataParams(**{**data, "source": source, "root": str(nope)}))
    assert not nope.exists() and list(tmp_path.iterdir()) == []
    assert missing_root(DataParams(**{**data, "root": str(nope), "create_root": True})) is None
    assert missing_root(DataParams(**{**data, "root": DEFAULT_ROOT})) is None
    assert missing_root(DataParams(**{**data, "root": str(nope), "source": "folder", "create_root": True})) is not None
