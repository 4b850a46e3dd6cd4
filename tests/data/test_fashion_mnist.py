"""Fashion-MNIST IDX files turned into a PNG image tree (with small fake IDX files)."""

from __future__ import annotations

import gzip
import struct
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

from trainlib.data import fashion_mnist
from trainlib.data.fashion_mnist import CLASS_NAMES, COMPLETE_MARKER, SPLIT_FILES, is_materialised, materialise

COUNTS = {"train": 13, "val": 7}


def idx_bytes(array: np.ndarray) -> bytes:
    """IDX encoding: magic 0x0000 08 <ndim>, big-endian uint32 dims, then the uint8 values."""
    header = struct.pack(">I", 0x00000800 | array.ndim) + b"".join(struct.pack(">I", d) for d in array.shape)
    return header + array.astype(np.uint8).tobytes()


def write_idx(path: Path, array: np.ndarray, cut: int = 0) -> None:
    data = idx_bytes(array)
    with gzip.open(path, "wb") as handle:
        handle.write(data[: len(data) - cut])


def fake_split(n: int, seed: int) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(seed)
    images = rng.integers(0, 256, size=(n, 28, 28), dtype=np.uint8)
    labels = (np.arange(n) % len(CLASS_NAMES)).astype(np.uint8)  # every class present in train
    rng.shuffle(labels)
    return images, labels


@pytest.fixture
def source(tmp_path) -> tuple[Path, dict[str, tuple[np.ndarray, np.ndarray]]]:
    folder = tmp_path / "debian"
    folder.mkdir()
    arrays = {}
    for seed, (split, (images_file, labels_file)) in enumerate(SPLIT_FILES.items()):
        images, labels = fake_split(COUNTS[split], seed)
        write_idx(folder / images_file, images)
        write_idx(folder / labels_file, labels)
        arrays[split] = (images, labels)
    return folder, arrays


def test_idx_header_magic_numbers():
    assert idx_bytes(np.zeros((2, 28, 28), np.uint8))[:4] == bytes.fromhex("00000803")
    assert idx_bytes(np.zeros(2, np.uint8))[:4] == bytes.fromhex("00000801")


def test_split_files_are_the_debian_names():
    assert SPLIT_FILES == {
        "train": ("train-images-idx3-ubyte.gz", "train-labels-idx1-ubyte.gz"),
        "val": ("t10k-images-idx3-ubyte.gz", "t10k-labels-idx1-ubyte.gz"),
    }


def test_materialise_writes_the_tree(tmp_path, source):
    folder, arrays = source
    root = tmp_path / "fmnist"
    assert not is_materialised(root)
    assert materialise(root, source=folder) == root
    assert is_materialised(root)
    assert (root / COMPLETE_MARKER).is_file()
    assert sorted(p.name for p in root.iterdir() if p.is_dir()) == ["train", "val"]
    for split, (images, labels) in arrays.items():
        # every class gets a folder, even one without images in this split
        assert sorted(p.name for p in (root / split).iterdir()) == sorted(CLASS_NAMES)
        pngs = sorted((root / split).glob("*/*.png"))
        assert len(pngs) == COUNTS[split]
        for label, name in enumerate(CLASS_NAMES):
            assert len(list((root / split / name).glob("*.png"))) == int((labels == label).sum()), (split, name)
        for index, (pixels, label) in enumerate(zip(images, labels, strict=True)):
            path = root / split / CLASS_NAMES[label] / f"{index:05d}.png"
            with Image.open(path) as image:
                assert image.mode == "L" and image.size == (28, 28)
                np.testing.assert_array_equal(np.asarray(image), pixels, err_msg=str(path))


def test_no_partial_folder_remains(tmp_path, source):
    root = tmp_path / "fmnist"
    materialise(root, source=source[0])
    assert sorted(p.name for p in tmp_path.iterdir()) == ["debian", "fmnist"]


def test_second_call_is_a_no_op(tmp_path, source):
    folder, _ = source
    root = materialise(tmp_path / "fmnist", source=folder)
    png = next(root.glob("train/*/*.png"))
    png.write_bytes(b"marker")  # a rewrite would replace this
    for file in folder.iterdir():  # and the sources are not read again
        file.unlink()
    assert materialise(root, source=folder) == root
    assert png.read_bytes() == b"marker"


def test_incomplete_tree_is_rebuilt(tmp_path, source):
    root = tmp_path / "fmnist"
    (root / "train" / "leftover").mkdir(parents=True)  # no completion marker: e.g. a copy cut short
    materialise(root, source=source[0])
    assert not (root / "train" / "leftover").exists()
    assert is_materialised(root)


@pytest.mark.parametrize("missing", [name for files in SPLIT_FILES.values() for name in files])
def test_missing_source_file_names_it_and_the_package(tmp_path, source, missing):
    folder, _ = source
    (folder / missing).unlink()
    root = tmp_path / "fmnist"
    with pytest.raises(FileNotFoundError) as error:
        materialise(root, source=folder)
    message = str(error.value)
    assert str(folder / missing) in message
    assert "apt-get install dataset-fashion-mnist" in message
    assert not root.exists()


def test_default_source_is_the_debian_package_folder():
    assert Path("/usr/share/datasets/fashion-mnist") == fashion_mnist.DEBIAN_SOURCE


@pytest.mark.parametrize("which", [0, 1], ids=["images", "labels"])
def test_truncated_idx_raises_value_error_naming_the_file(tmp_path, source, which):
    folder, arrays = source
    images, labels = arrays["val"]
    name = SPLIT_FILES["val"][which]
    write_idx(folder / name, (images, labels)[which], cut=5)
    root = tmp_path / "fmnist"
    with pytest.raises(ValueError, match="truncated") as error:
        materialise(root, source=folder)
    assert str(folder / name) in str(error.value)
    assert not root.exists()
    assert not is_materialised(root)


def test_failed_materialise_leaves_no_partial_folder(tmp_path, source):
    folder, arrays = source
    write_idx(folder / SPLIT_FILES["val"][0], arrays["val"][0], cut=5)
    with pytest.raises(ValueError):
        materialise(tmp_path / "fmnist", source=folder)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["debian"]


def test_non_idx_file_is_rejected_naming_it(tmp_path, source):
    folder, _ = source
    name = SPLIT_FILES["train"][0]
    with gzip.open(folder / name, "wb") as handle:
        handle.write(b"\x89PNG not an idx file")
    with pytest.raises(ValueError, match="not an unsigned-byte IDX file") as error:
        materialise(tmp_path / "fmnist", source=folder)
    assert str(folder / name) in str(error.value)


def test_image_and_label_counts_must_agree(tmp_path, source):
    folder, arrays = source
    images, labels = arrays["train"]
    write_idx(folder / SPLIT_FILES["train"][1], labels[:-1])
    with pytest.raises(ValueError, match="differ in length"):
        materialise(tmp_path / "fmnist", source=folder)
    assert not (tmp_path / "fmnist").exists()
