"""Fashion-MNIST (Debian package ``dataset-fashion-mnist``) written out as an image tree.

The default run trains on it through exactly the decode path used for ImageNet, so the
IDX files are turned once into PNG files under ``<root>/train/<class>/`` and
``<root>/val/<class>/`` (the 10,000 test images form ``val``).
"""

from __future__ import annotations

import gzip
import logging
import shutil
from pathlib import Path

import numpy as np
from PIL import Image

logger = logging.getLogger(__name__)

DEBIAN_SOURCE = Path("/usr/share/datasets/fashion-mnist")
CLASS_NAMES = (
    "tshirt_top",
    "trouser",
    "pullover",
    "dress",
    "coat",
    "sandal",
    "shirt",
    "sneaker",
    "bag",
    "ankle_boot",
)
SPLIT_FILES = {
    "train": ("train-images-idx3-ubyte.gz", "train-labels-idx1-ubyte.gz"),
    "val": ("t10k-images-idx3-ubyte.gz", "t10k-labels-idx1-ubyte.gz"),
}
COMPLETE_MARKER = ".complete"
# Where the default run writes it (conf/base's data.root, relative to the project): a missing data.root elsewhere is
# a mistake named before any work, unless data.create_root asks for it (pipelines.data.nodes.locate_image_tree)
DEFAULT_ROOT = "data/01_raw/fashion_mnist"


def _read_idx(path: Path) -> np.ndarray:
    """Array stored in an IDX file (big-endian magic: 0, 0, dtype code, number of dims)."""
    with gzip.open(path, "rb") as handle:
        raw = handle.read()
    if raw[:2] != b"\x00\x00" or raw[2] != 0x08:
        raise ValueError(f"{path} is not an unsigned-byte IDX file")
    ndim = raw[3]
    shape = tuple(int.from_bytes(raw[4 + 4 * i : 8 + 4 * i], "big") for i in range(ndim))
    data = np.frombuffer(raw, dtype=np.uint8, offset=4 + 4 * ndim)
    if data.size != int(np.prod(shape)):
        raise ValueError(f"{path} is truncated: expected {int(np.prod(shape))} values, found {data.size}")
    return data.reshape(shape)


def is_materialised(root: str | Path) -> bool:
    return (Path(root) / COMPLETE_MARKER).is_file()


def materialise(root: str | Path, source: str | Path = DEBIAN_SOURCE) -> Path:
    """Write the complete Fashion-MNIST as PNG files under ``root`` (once; later calls return at once).

    The tree is built in a temporary sibling folder and renamed into place, so an interrupted
    run never leaves a partial tree that looks complete.
    """
    root, source = Path(root), Path(source)
    if is_materialised(root):
        return root
    missing = [source / name for files in SPLIT_FILES.values() for name in files if not (source / name).is_file()]
    if missing:
        raise FileNotFoundError(
            f"Fashion-MNIST files not found: {', '.join(map(str, missing))}. "
            "Install them with `apt-get install dataset-fashion-mnist` (scripts/setup.sh does this)."
        )
    staging = root.with_name(root.name + ".partial")
    shutil.rmtree(staging, ignore_errors=True)
    try:
        for split, (images_file, labels_file) in SPLIT_FILES.items():
            images, labels = _read_idx(source / images_file), _read_idx(source / labels_file)
            if len(images) != len(labels):
                raise ValueError(f"{source / images_file} and {source / labels_file} differ in length")
            for name in CLASS_NAMES:
                (staging / split / name).mkdir(parents=True, exist_ok=True)
            logger.info("Writing %d Fashion-MNIST %s images under %s", len(images), split, root)
            for index, (pixels, label) in enumerate(zip(images, labels, strict=True)):
                Image.fromarray(pixels, mode="L").save(staging / split / CLASS_NAMES[label] / f"{index:05d}.png")
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)
        raise
    (staging / COMPLETE_MARKER).write_text("fashion-mnist complete\n")
    if root.exists():
        shutil.rmtree(root)
    root.parent.mkdir(parents=True, exist_ok=True)
    staging.rename(root)
    return root
