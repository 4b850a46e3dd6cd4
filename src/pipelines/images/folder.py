"""ImageNet-style image trees: scanning into a manifest, and MindSpore input pipelines.

A tree is ``<root>/<train_dir>/<class>/<image>`` and ``<root>/<val_dir>/<class>/<image>``
(``train``/``val`` or the tutorials' ``ilsvrc``/``ilsvrc_eval``). Scanning produces a manifest
table (path, class_name, label, split) that every later step reads, so a file found bad at
ingest never reaches training.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pandas as pd
from PIL import Image, UnidentifiedImageError

logger = logging.getLogger(__name__)

IMAGE_EXTENSIONS = (".jpeg", ".jpg", ".png", ".bmp", ".webp")
VERIFY_MODES = ("none", "header", "decode")
BAD_FILE_POLICIES = ("exclude", "fail")
MANIFEST_COLUMNS = ["path", "class_name", "label", "split"]
# ImageNet channel statistics, in 0-255 pixel units (recipe values).
MEAN = [0.485 * 255, 0.456 * 255, 0.406 * 255]
STD = [0.229 * 255, 0.224 * 255, 0.225 * 255]


class DataLayoutError(ValueError):
    """The image tree is missing, empty or not laid out as ``<split>/<class>/<image>``."""


class BadImageError(ValueError):
    """Files that cannot be used as images were found and the policy is ``fail``."""


@dataclass
class ScanResult:
    manifest: pd.DataFrame
    class_index: dict[str, int]
    class_counts: pd.DataFrame
    bad_files: pd.DataFrame


def _check_image(path: Path, verify: str) -> str | None:
    """Reason why ``path`` is not a usable image, or None when it is."""
    if path.suffix.lower() not in IMAGE_EXTENSIONS:
        return f"not an image file (extension {path.suffix or 'none'!r})"
    if path.stat().st_size == 0:
        return "empty file"
    if verify == "none":
        return None
    try:
        with Image.open(path) as image:
            if verify == "decode":
                image.load()
            else:
                image.verify()
    except (UnidentifiedImageError, OSError, SyntaxError, ValueError) as error:
        return f"cannot be decoded: {error}"
    return None


def _class_dirs(split_root: Path) -> list[Path]:
    if not split_root.is_dir():
        raise DataLayoutError(f"split folder {split_root} does not exist")
    entries = sorted(split_root.iterdir())
    stray_files = [e for e in entries if e.is_file() and not e.name.startswith(".")]
    if stray_files:
        raise DataLayoutError(
            f"{split_root} must hold one folder per class, but holds files such as {stray_files[0]}; "
            "expected layout <split>/<class>/<image>"
        )
    classes = [e for e in entries if e.is_dir() and not e.name.startswith(".")]
    if not classes:
        raise DataLayoutError(f"{split_root} holds no class folders; expected layout <split>/<class>/<image>")
    return classes


def scan_image_tree(
    root: str | Path,
    split_dirs: dict[str, str],
    verify: str = "header",
    on_bad_file: str = "fail",
) -> ScanResult:
    """Scan ``root`` into a manifest, a class-index map and per-class counts.

    ``split_dirs`` maps split names (``train``, ``val``) to folder names under ``root``.
    Labels follow the sorted train class folder names. Files that are not usable images are
    listed in ``bad_files`` with a reason and logged by path; ``on_bad_file="fail"`` raises
    instead. An empty class folder, or a val class absent from train, is always an error.
    """
    if verify not in VERIFY_MODES:
        raise ValueError(f"verify must be one of {VERIFY_MODES}, got {verify!r}")
    if on_bad_file not in BAD_FILE_POLICIES:
        raise ValueError(f"on_bad_file must be one of {BAD_FILE_POLICIES}, got {on_bad_file!r}")
    root = Path(root)
    if not root.is_dir():
        raise DataLayoutError(f"data folder {root} does not exist")
    if "train" not in split_dirs:
        raise DataLayoutError("split_dirs must name the 'train' folder")

    class_dirs = {split: _class_dirs(root / folder) for split, folder in split_dirs.items()}
    class_names = [d.name for d in class_dirs["train"]]
    class_index = {name: label for label, name in enumerate(class_names)}
    for split, dirs in class_dirs.items():
        unknown = sorted(d.name for d in dirs if d.name not in class_index)
        if unknown:
            raise DataLayoutError(
                f"{root / split_dirs[split]} has classes absent from {root / split_dirs['train']}: "
                f"{', '.join(unknown[:10])}{' ...' if len(unknown) > 10 else ''}"
            )

    rows, bad = [], []
    for split, dirs in class_dirs.items():
        for class_dir in dirs:
            usable = 0
            for path in sorted(p for p in class_dir.rglob("*") if p.is_file() and not p.name.startswith(".")):
                reason = _check_image(path, verify)
                if reason is None:
                    rows.append((str(path.resolve()), class_dir.name, class_index[class_dir.name], split))
                    usable += 1
                else:
                    bad.append((str(path.resolve()), split, reason))
                    logger.warning("Bad file %s: %s", path, reason)
            if usable == 0:
                raise DataLayoutError(f"class folder {class_dir} holds no usable image")

    bad_files = pd.DataFrame(bad, columns=["path", "split", "reason"])
    if bad and on_bad_file == "fail":
        listed = "\n".join(f"  {p}: {r}" for p, _, r in bad[:20])
        raise BadImageError(
            f"{len(bad)} unusable file(s) under {root}:\n{listed}\n"
            "Remove them, or set data.on_bad_file: exclude to leave them out of the manifest."
        )
    if bad:
        logger.warning("Excluded %d unusable file(s); see the bad_files table", len(bad))
    manifest = pd.DataFrame(rows, columns=MANIFEST_COLUMNS)
    counts = manifest.groupby(["split", "class_name"]).size().unstack("split", fill_value=0)
    counts = counts.reindex(class_names, fill_value=0).reset_index()
    counts.columns.name = None
    counts.insert(1, "label", [class_index[name] for name in counts["class_name"]])
    return ScanResult(manifest, class_index, counts, bad_files)


def subset_manifest(manifest: pd.DataFrame, max_per_class: dict[str, int | None], seed: int) -> pd.DataFrame:
    """Keep at most ``max_per_class[split]`` images of each class (a seeded, stratified sample)."""
    parts = []
    for (split, _), group in manifest.groupby(["split", "label"], sort=True):
        limit = max_per_class.get(split)
        if limit is not None and len(group) > limit:
            parts.append(group.sample(n=limit, random_state=seed).sort_values("path"))
        else:
            parts.append(group)
    return pd.concat(parts, ignore_index=True) if parts else manifest.iloc[:0]


class _EncodedImages:
    """Random-access source of (encoded bytes, label): decoding happens in MindSpore's ops."""

    def __init__(self, paths: list[str], labels: list[int]):
        self.paths = paths
        self.labels = labels

    def __len__(self) -> int:
        return len(self.paths)

    def __getitem__(self, index: int):
        with open(self.paths[index], "rb") as handle:
            encoded = np.frombuffer(handle.read(), dtype=np.uint8)
        return encoded, np.int32(self.labels[index])


def create_dataset(
    manifest: pd.DataFrame,
    split: str,
    image_size: int,
    batch_size: int,
    training: bool,
    crop_scale: tuple[float, float] = (0.08, 1.0),
    eval_resize_ratio: float = 0.875,
    rank: int = 0,
    rank_size: int = 1,
    num_workers: int = 2,
    seed: int = 0,
):
    """A batched MindSpore dataset over the manifest rows of ``split``, sharded by rank.

    Train: RandomCropDecodeResize, horizontal flip, normalise, HWC->CHW (shuffled, last
    partial batch dropped). Eval: Decode, Resize(image_size / eval_resize_ratio),
    CenterCrop(image_size), normalise, HWC->CHW (every image kept).
    """
    import mindspore.dataset as ds
    from mindspore import dtype as mstype
    from mindspore.dataset import vision
    from mindspore.dataset.transforms import TypeCast

    rows = manifest[manifest["split"] == split]
    if rows.empty:
        raise DataLayoutError(f"the manifest has no '{split}' images")
    per_rank = len(rows) // rank_size
    if training and per_rank < batch_size:
        raise ValueError(
            f"batch_size {batch_size} is larger than the {per_rank} '{split}' images each of "
            f"{rank_size} rank(s) reads; lower batch_size or use more data"
        )
    ds.config.set_seed(seed)
    source = _EncodedImages(rows["path"].tolist(), rows["label"].astype(int).tolist())
    dataset = ds.GeneratorDataset(
        source,
        column_names=["image", "label"],
        shuffle=training,
        num_shards=rank_size if rank_size > 1 else None,
        shard_id=rank if rank_size > 1 else None,
        num_parallel_workers=1,
        python_multiprocessing=False,
    )
    if training:
        image_ops = [
            vision.RandomCropDecodeResize(image_size, scale=tuple(crop_scale), ratio=(0.75, 1.333)),
            vision.RandomHorizontalFlip(prob=0.5),
        ]
    else:
        image_ops = [
            vision.Decode(),
            vision.Resize(int(round(image_size / eval_resize_ratio))),
            vision.CenterCrop(image_size),
        ]
    image_ops += [vision.Normalize(mean=MEAN, std=STD), vision.HWC2CHW()]
    dataset = dataset.map(operations=image_ops, input_columns="image", num_parallel_workers=num_workers)
    dataset = dataset.map(operations=TypeCast(mstype.int32), input_columns="label", num_parallel_workers=1)
    return dataset.batch(batch_size, drop_remainder=training)
