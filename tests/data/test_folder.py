"""Image-tree scanning, manifest subsets and the MindSpore input pipeline."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from mindir_serving.images import MEAN, STD
from tests.support.trees import class_colour
from trainlib.data.folder import (
    MANIFEST_COLUMNS,
    BadImageError,
    DataLayoutError,
    create_dataset,
    scan_image_tree,
    subset_manifest,
)

SPLITS = {"train": "train", "val": "val"}
# Class folder names whose sorted order differs from the order they are written in.
CLASSES = ("cat", "ant", "bee")


@pytest.fixture
def tree(make_image_tree) -> Path:
    """3 classes, 6 train and 2 val PNGs of 12 x 12 each."""
    return make_image_tree(classes=CLASSES, per_class={"train": 6, "val": 2})


@pytest.fixture
def manifest(tree) -> pd.DataFrame:
    return scan_image_tree(tree, SPLITS).manifest


# ---------------------------------------------------------------- scan_image_tree


def test_scan_builds_the_manifest(tree):
    result = scan_image_tree(tree, SPLITS)
    manifest = result.manifest
    assert list(manifest.columns) == MANIFEST_COLUMNS == ["path", "class_name", "label", "split", "size", "mtime_ns"]
    assert len(manifest) == 3 * (6 + 2)
    assert (manifest["split"] == "train").sum() == 18
    assert (manifest["split"] == "val").sum() == 6
    # one row per file on disk, absolute paths
    on_disk = {str(p.resolve()) for p in tree.glob("*/*/*.png")}
    assert set(manifest["path"]) == on_disk
    assert manifest["path"].is_unique
    assert all(Path(p).is_absolute() for p in manifest["path"])
    # each row's class is the folder the file lies in, and its label follows that class
    for row in manifest.itertuples():
        assert Path(row.path).parent.name == row.class_name
        assert Path(row.path).parent.parent.name == row.split
        assert row.label == result.class_index[row.class_name]
        # the version of the file that was verified, so a later change is noticed
        status = Path(row.path).stat()
        assert (row.size, row.mtime_ns) == (status.st_size, status.st_mtime_ns)


def test_labels_follow_sorted_train_class_names(tree):
    result = scan_image_tree(tree, SPLITS)
    assert result.class_index == {"ant": 0, "bee": 1, "cat": 2}
    assert result.manifest["label"].dtype.kind == "i"


def test_class_counts_table(tree):
    counts = scan_image_tree(tree, SPLITS).class_counts
    assert list(counts.columns) == ["class_name", "label", "train", "val"]
    assert counts["class_name"].tolist() == ["ant", "bee", "cat"]
    assert counts["label"].tolist() == [0, 1, 2]
    assert counts["train"].tolist() == [6, 6, 6]
    assert counts["val"].tolist() == [2, 2, 2]


def test_class_counts_follow_uneven_classes(make_image_tree):
    root = make_image_tree(classes=("x",), per_class={"train": 4, "val": 1})
    make_image_tree(classes=("y",), per_class={"train": 2, "val": 3}, seed=1)  # same root: "data"
    counts = scan_image_tree(root, SPLITS).class_counts
    assert counts.set_index("class_name")[["train", "val"]].to_dict("index") == {
        "x": {"train": 4, "val": 1},
        "y": {"train": 2, "val": 3},
    }


def test_val_may_hold_a_subset_of_the_train_classes(make_image_tree):
    root = make_image_tree(classes=("a", "b"), per_class={"train": 2, "val": 1})
    (root / "val" / "b" / "b_val_000.png").unlink()
    (root / "val" / "b").rmdir()
    result = scan_image_tree(root, SPLITS)
    counts = result.class_counts.set_index("class_name")
    assert counts.loc["b", "val"] == 0
    assert counts.loc["b", "train"] == 2


def test_ilsvrc_folder_names(make_image_tree):
    split_dirs = {"train": "ilsvrc", "val": "ilsvrc_eval"}
    root = make_image_tree(split_dirs=split_dirs, per_class={"train": 3, "val": 1}, fmt="jpg")
    assert sorted(p.name for p in root.iterdir()) == ["ilsvrc", "ilsvrc_eval"]
    result = scan_image_tree(root, split_dirs)
    manifest = result.manifest
    assert sorted(manifest["split"].unique()) == ["train", "val"]  # split names, not folder names
    assert (manifest["split"] == "train").sum() == 9
    assert all(Path(p).parent.parent.name == "ilsvrc_eval" for p in manifest.loc[manifest["split"] == "val", "path"])
    assert all(p.endswith(".jpg") for p in manifest["path"])
    # the default folder names do not exist here
    with pytest.raises(DataLayoutError, match="does not exist"):
        scan_image_tree(root, SPLITS)


def test_train_only_split_dirs(tree):
    manifest = scan_image_tree(tree, {"train": "train"}).manifest
    assert set(manifest["split"]) == {"train"}


def test_hidden_files_and_folders_are_listed_not_used(tree):
    store = tree / "train" / "ant" / ".DS_Store"
    store.write_bytes(b"\x00\x01")
    hidden_folder = tree / "train" / ".cache"
    hidden_folder.mkdir()
    result = scan_image_tree(tree, SPLITS, on_bad_file="exclude")
    assert result.bad_files.set_index("path")["reason"].to_dict() == {
        str(hidden_folder.resolve()): "hidden or system folder",
        str(store.resolve()): "hidden or system file",
    }
    assert len(result.manifest) == 24
    assert ".cache" not in result.class_index


@pytest.fixture
def tree_with_bad_files(tree) -> tuple[Path, Path, Path]:
    corrupt = tree / "train" / "bee" / "corrupt.png"
    corrupt.write_bytes(np.random.default_rng(0).integers(0, 256, 300, dtype=np.uint8).tobytes())
    foreign = tree / "val" / "cat" / "notes.txt"
    foreign.write_text("not an image\n")
    return tree, corrupt, foreign


def test_bad_files_are_listed_and_excluded(tree_with_bad_files):
    tree, corrupt, foreign = tree_with_bad_files
    result = scan_image_tree(tree, SPLITS, on_bad_file="exclude")
    bad = result.bad_files.set_index("path")
    assert list(result.bad_files.columns) == ["path", "split", "reason"]
    assert set(bad.index) == {str(corrupt.resolve()), str(foreign.resolve())}
    assert bad.loc[str(corrupt.resolve()), "split"] == "train"
    assert "cannot be decoded" in bad.loc[str(corrupt.resolve()), "reason"]
    assert bad.loc[str(foreign.resolve()), "split"] == "val"
    assert "not an image file" in bad.loc[str(foreign.resolve()), "reason"]
    assert ".txt" in bad.loc[str(foreign.resolve()), "reason"]
    # excluded from the manifest, everything else kept
    assert not set(result.manifest["path"]) & set(bad.index)
    assert len(result.manifest) == 24
    assert result.class_counts.set_index("class_name").loc["bee", "train"] == 6


def test_bad_files_fail_naming_each_path(tree_with_bad_files):
    tree, corrupt, foreign = tree_with_bad_files
    with pytest.raises(BadImageError, match="2 unusable file") as error:
        scan_image_tree(tree, SPLITS, on_bad_file="fail")
    message = str(error.value)
    assert str(corrupt.resolve()) in message
    assert str(foreign.resolve()) in message
    assert "on_bad_file" in message


def test_fail_is_the_default_policy(tree_with_bad_files):
    with pytest.raises(BadImageError):
        scan_image_tree(tree_with_bad_files[0], SPLITS)


def test_empty_image_file_is_bad(tree):
    empty = tree / "train" / "ant" / "empty.png"
    empty.write_bytes(b"")
    result = scan_image_tree(tree, SPLITS, verify="none", on_bad_file="exclude")
    assert result.bad_files["path"].tolist() == [str(empty.resolve())]
    assert result.bad_files["reason"].tolist() == ["empty file"]


@pytest.mark.parametrize(("verify", "caught"), [("none", False), ("header", False), ("decode", True)])
def test_verify_levels_on_a_truncated_jpeg(make_image_tree, verify, caught):
    root = make_image_tree(classes=("a",), per_class={"train": 2}, size=64, fmt="jpg")
    victim = sorted((root / "train" / "a").iterdir())[0]
    data = victim.read_bytes()
    victim.write_bytes(data[: len(data) * 2 // 3])
    result = scan_image_tree(root, {"train": "train"}, verify=verify, on_bad_file="exclude")
    assert (str(victim.resolve()) in set(result.bad_files["path"])) is caught
    assert len(result.manifest) == (1 if caught else 2)


def test_missing_split_folder(tree):
    with pytest.raises(DataLayoutError, match="split folder") as error:
        scan_image_tree(tree, {"train": "train", "val": "validation"})
    assert str(tree / "validation") in str(error.value)


def test_split_dirs_must_name_train(tree):
    with pytest.raises(DataLayoutError, match="'train'"):
        scan_image_tree(tree, {"val": "val"})


def test_class_folder_holding_only_bad_files_is_an_error_even_when_excluding(tree):
    (tree / "val" / "ant" / "readme.txt").write_text("x")
    for png in (tree / "val" / "ant").glob("*.png"):
        png.unlink()
    with pytest.raises(DataLayoutError) as error:
        scan_image_tree(tree, SPLITS, on_bad_file="exclude")
    assert str(tree / "val" / "ant") in str(error.value)


def test_split_folder_without_class_folders(tmp_path):
    (tmp_path / "data" / "train").mkdir(parents=True)
    with pytest.raises(DataLayoutError, match="no class folders"):
        scan_image_tree(tmp_path / "data", {"train": "train"})


@pytest.mark.parametrize(("option", "value"), [("verify", "full"), ("on_bad_file", "skip")])
def test_invalid_options_are_rejected(tree, option, value):
    with pytest.raises(ValueError, match=option):
        scan_image_tree(tree, SPLITS, **{option: value})


# ---------------------------------------------------------------- subset_manifest


@pytest.fixture
def big_manifest(make_image_tree) -> pd.DataFrame:
    root = make_image_tree(classes=("a", "b", "c"), per_class={"train": 10, "val": 4}, size=4, noise=0)
    return scan_image_tree(root, SPLITS, verify="none").manifest


def test_subset_limits_each_class_of_each_split(big_manifest):
    subset = subset_manifest(big_manifest, {"train": 3, "val": 1}, seed=0)
    counts = subset.groupby(["split", "label"]).size()
    assert counts.loc["train"].tolist() == [3, 3, 3]
    assert counts.loc["val"].tolist() == [1, 1, 1]
    assert list(subset.columns) == MANIFEST_COLUMNS
    assert set(subset["path"]) <= set(big_manifest["path"])
    # rows are unchanged copies of manifest rows
    merged = subset.merge(big_manifest, on=MANIFEST_COLUMNS, how="left", indicator=True)
    assert (merged["_merge"] == "both").all()


def test_subset_without_limit_or_with_a_large_one_keeps_everything(big_manifest):
    subset = subset_manifest(big_manifest, {"train": None, "val": 100}, seed=0)
    assert len(subset) == len(big_manifest)
    unnamed = subset_manifest(big_manifest, {"train": 2}, seed=0)  # val not named: kept whole
    assert (unnamed["split"] == "val").sum() == 12
    assert (unnamed["split"] == "train").sum() == 6


def test_subset_is_deterministic_by_seed(big_manifest):
    first = subset_manifest(big_manifest, {"train": 3, "val": 2}, seed=5)
    again = subset_manifest(big_manifest, {"train": 3, "val": 2}, seed=5)
    pd.testing.assert_frame_equal(first, again)
    picks = {seed: tuple(subset_manifest(big_manifest, {"train": 3}, seed=seed)["path"]) for seed in range(6)}
    assert len(set(picks.values())) > 1  # the seed matters


def test_subset_of_an_empty_manifest_is_empty():
    empty = pd.DataFrame(columns=MANIFEST_COLUMNS)
    assert subset_manifest(empty, {"train": 1}, seed=0).empty


# ---------------------------------------------------------------- create_dataset


def batches(dataset) -> list[tuple[np.ndarray, np.ndarray]]:
    return [(x.asnumpy(), y.asnumpy()) for x, y in dataset.create_tuple_iterator(num_epochs=1)]


def test_train_batches(manifest):
    dataset = create_dataset(manifest, "train", image_size=12, batch_size=4, training=True, num_workers=1)
    assert dataset.get_dataset_size() == 18 // 4  # the last partial batch is dropped
    got = batches(dataset)
    assert len(got) == 4
    for images, labels in got:
        assert images.shape == (4, 3, 12, 12)
        assert images.dtype == np.float32
        assert labels.shape == (4,)
        assert labels.dtype == np.int32
        assert set(labels.tolist()) <= {0, 1, 2}
        assert np.all(np.isfinite(images))


def test_train_images_are_resized_to_image_size(manifest):
    dataset = create_dataset(manifest, "train", image_size=8, batch_size=6, training=True, num_workers=1)
    images, _ = batches(dataset)[0]
    assert images.shape == (6, 3, 8, 8)


def test_eval_keeps_every_image_in_manifest_order(manifest):
    dataset = create_dataset(manifest, "val", image_size=12, batch_size=4, training=False, num_workers=1)
    got = batches(dataset)
    assert [len(labels) for _, labels in got] == [4, 2]
    labels = np.concatenate([labels for _, labels in got])
    assert labels.tolist() == manifest.loc[manifest["split"] == "val", "label"].tolist()


def test_eval_images_are_normalised_with_imagenet_statistics(manifest):
    dataset = create_dataset(manifest, "val", image_size=12, batch_size=6, training=False, num_workers=1)
    images, labels = batches(dataset)[0]
    for image, label in zip(images, labels, strict=True):
        class_name = sorted(CLASSES)[int(label)]
        colour = class_colour(CLASSES.index(class_name))  # colours follow the order the tree was written in
        expected = (colour - np.array(MEAN)) / np.array(STD)
        # +-20 uniform noise averages out over 144 pixels; 0.15 is about 8 pixel units
        np.testing.assert_allclose(image.mean(axis=(1, 2)), expected, atol=0.15)


def test_sharding_splits_eval_data_into_disjoint_halves(manifest):
    def image_keys(rank: int | None) -> list[bytes]:
        sharding = {} if rank is None else {"rank": rank, "rank_size": 2}
        dataset = create_dataset(manifest, "val", 12, 1, training=False, num_workers=1, **sharding)
        return [np.round(images[0], 4).tobytes() for images, _ in batches(dataset)]

    everything, half0, half1 = image_keys(None), image_keys(0), image_keys(1)
    assert len(everything) == len(set(everything)) == 6
    assert len(half0) == len(half1) == 3
    assert not set(half0) & set(half1)
    assert sorted(half0 + half1) == sorted(everything)


def test_sharding_train_data(manifest):
    sizes = [
        create_dataset(manifest, "train", 12, 4, training=True, rank=rank, rank_size=2).get_dataset_size()
        for rank in (0, 1)
    ]
    assert sizes == [2, 2]  # 9 images per rank, batches of 4, remainder dropped


@pytest.mark.parametrize(("batch_size", "rank_size"), [(19, 1), (10, 2)])
def test_batch_larger_than_the_data_is_rejected(manifest, batch_size, rank_size):
    with pytest.raises(ValueError, match="batch_size") as error:
        create_dataset(manifest, "train", 12, batch_size, training=True, rank_size=rank_size)
    assert f"batch_size {batch_size}" in str(error.value)


def test_eval_batch_larger_than_the_data_is_allowed(manifest):
    dataset = create_dataset(manifest, "val", 12, 100, training=False, num_workers=1)
    assert [len(labels) for _, labels in batches(dataset)] == [6]


def test_split_without_rows_is_a_layout_error(manifest):
    with pytest.raises(DataLayoutError, match="no 'test' images"):
        create_dataset(manifest, "test", 12, 4, training=False)


def test_jpeg_tree_feeds_the_pipeline(make_image_tree):
    root = make_image_tree(per_class={"train": 4, "val": 1}, fmt="jpg")
    manifest = scan_image_tree(root, SPLITS, verify="decode").manifest
    images, labels = batches(create_dataset(manifest, "train", 12, 4, training=True, num_workers=1))[0]
    assert images.shape == (4, 3, 12, 12)
    assert labels.dtype == np.int32
