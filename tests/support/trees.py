"""Tiny ImageNet-style image trees written for the tests (generated, every file different, learnable).

Nothing here imports MindSpore, so a test module may import it before or after ``pipelines``.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path

import numpy as np
from PIL import Image

DEFAULT_SPLIT_DIRS = {"train": "train", "val": "val"}
_PIL_FORMATS = {"png": "PNG", "jpg": "JPEG", "jpeg": "JPEG", "bmp": "BMP"}
# Well separated class colours, so that even a tiny network can tell the classes apart.
_PALETTE = np.array(
    [
        [230, 30, 30],
        [30, 200, 40],
        [40, 60, 230],
        [230, 220, 30],
        [200, 40, 210],
        [30, 210, 220],
        [250, 140, 20],
        [120, 120, 120],
        [20, 20, 20],
        [250, 250, 250],
    ],
    dtype=np.int16,
)


def class_colour(label: int) -> np.ndarray:
    """Base RGB colour (int16, 0-255) of the ``label``-th class of a generated tree."""
    return _PALETTE[label % len(_PALETTE)]


def write_image_tree(
    root: str | Path,
    classes: Sequence[str] = ("a", "b", "c"),
    per_class: Mapping[str, int] | int | None = None,
    split_dirs: Mapping[str, str] | None = None,
    size: int = 12,
    fmt: str = "png",
    seed: int = 0,
    noise: int = 20,
) -> Path:
    """Write a tiny ImageNet-style tree and return ``root``.

    Layout: ``<root>/<split_dirs[split]>/<class>/<class>_<split>_<i>.<fmt>`` for every split named
    in ``per_class`` (default ``{"train": 6, "val": 2}``; an int means that many per class in both
    ``train`` and ``val``). ``split_dirs`` maps split names to folder names (default
    ``train``/``val``; e.g. ``{"train": "ilsvrc", "val": "ilsvrc_eval"}``). Each image is
    ``size`` x ``size`` RGB: the class colour (``class_colour``, by position in ``classes``) plus
    uniform noise of +-``noise``, so every file differs from every other but stays learnable.
    """
    root = Path(root)
    if per_class is None:
        per_class = {"train": 6, "val": 2}
    elif isinstance(per_class, int):
        per_class = {"train": per_class, "val": per_class}
    split_dirs = dict(DEFAULT_SPLIT_DIRS if split_dirs is None else split_dirs)
    fmt = fmt.lower().lstrip(".")
    if fmt not in _PIL_FORMATS:
        raise ValueError(f"unsupported image format {fmt!r}; choose one of {sorted(_PIL_FORMATS)}")
    rng = np.random.default_rng(seed)
    for split, count in per_class.items():
        folder = split_dirs.get(split, split)
        for label, name in enumerate(classes):
            class_dir = root / folder / name
            class_dir.mkdir(parents=True, exist_ok=True)
            for index in range(count):
                jitter = rng.integers(-noise, noise + 1, size=(size, size, 3)) if noise else 0
                pixels = np.clip(class_colour(label) + jitter, 0, 255).astype(np.uint8)
                Image.fromarray(pixels).save(class_dir / f"{name}_{split}_{index:03d}.{fmt}", _PIL_FORMATS[fmt])
    return root
