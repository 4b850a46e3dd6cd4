"""ImageNet-style image trees: scanning into a manifest, and MindSpore input pipelines.

A tree is ``<root>/<train_dir>/<class>/<image>`` and ``<root>/<val_dir>/<class>/<image>``
(``train``/``val`` or the tutorials' ``ilsvrc``/``ilsvrc_eval``). Scanning produces a manifest
table (path, class_name, label, split, size, mtime_ns) that every later step reads, so a file
found bad at ingest never reaches training, and a file changed since is noticed
(``trainlib.data.links``). Every file left out is listed in ``bad_files`` with its reason.
"""

from __future__ import annotations

import logging
import os
import re
import tempfile
from array import array
from dataclasses import dataclass
from pathlib import Path
from typing import get_args

import numpy as np
import pandas as pd

# the evaluation's decode and resize are a logged model's too (``mindir_serving`` ships with it): defined there once
from mindir_serving.images import eval_image_ops, normalise_ops
from trainlib.data.links import link_split
from trainlib.data.verify import (
    FolderFiles,
    content_problem,
    entry_problem,
    is_hidden_or_system,
    verify_files,
)
from trainlib.params import BadFilePolicy, VerifyMode

logger = logging.getLogger(__name__)

BAD_FILE_POLICIES = get_args(BadFilePolicy)
# the levels of trainlib.data.verify, read here: its spawned workers need not build the parameter models
VERIFY_MODES = get_args(VerifyMode)
MANIFEST_COLUMNS = ["path", "class_name", "label", "split", "size", "mtime_ns"]
BAD_FILE_COLUMNS = ["path", "split", "reason"]
# Per-class counts are logged class by class up to this many classes, summarised beyond.
_LOGGED_CLASSES = 30
SKIPPED_FILES_METRIC = "data/skipped_files"  # per epoch: files of the manifest changed since ingest and left out
# MindSpore names the file a failed row came from in its pipeline error.
_FAILED_FILE = re.compile(r"corresponding data file is: (\S+?)\.?\s")


class DataLayoutError(ValueError):
    """The image tree is missing, empty or not laid out as ``<split>/<class>/<image>``."""


class BadImageError(ValueError):
    """Files that cannot be used as images were found and the policy is ``fail``."""


class InputPipelineError(RuntimeError):
    """MindSpore's input pipeline failed while a training or evaluation read it."""


@dataclass
class ScanResult:
    manifest: pd.DataFrame
    class_index: dict[str, int]
    class_counts: pd.DataFrame
    bad_files: pd.DataFrame
    verified_files: int  # files whose content was read by this scan (the rest came from the cache)


def _list_class(class_dir: str) -> tuple[FolderFiles, list[tuple[str, str]]]:
    """Candidate images under ``class_dir`` (sub-folders included) and the entries refused outright."""
    files, refused, pending = FolderFiles(class_dir), [], [(class_dir, "")]
    while pending:
        folder, prefix = pending.pop()
        with os.scandir(folder) as entries:
            for entry in entries:
                if entry.is_dir(follow_symlinks=False):
                    if is_hidden_or_system(entry.name):
                        refused.append((entry.path, "hidden or system folder"))
                    else:
                        pending.append((entry.path, prefix + entry.name + os.sep))
                    continue
                problem, status = entry_problem(entry)
                if problem is None:
                    files.add(prefix + entry.name, status.st_size, status.st_mtime_ns)
                else:
                    refused.append((entry.path, problem))
    files.sort()
    return files, refused


def _class_dirs(split_root: Path) -> tuple[list[Path], list[tuple[str, str]]]:
    """Class folders of a split, sorted, and the hidden or system entries beside them."""
    if not split_root.is_dir():
        raise DataLayoutError(f"split folder {split_root} does not exist")
    entries = sorted(split_root.iterdir())
    hidden = [e for e in entries if is_hidden_or_system(e.name)]
    entries = [e for e in entries if e not in hidden]
    stray_files = [e for e in entries if not e.is_dir()]
    if stray_files:
        raise DataLayoutError(
            f"{split_root} must hold one folder per class, but holds files such as {stray_files[0]}; "
            "expected layout <split>/<class>/<image>"
        )
    if not entries:
        raise DataLayoutError(f"{split_root} holds no class folders; expected layout <split>/<class>/<image>")
    refused = [(str(e.resolve()), "hidden or system " + ("folder" if e.is_dir() else "file")) for e in hidden]
    return entries, refused


def scan_image_tree(
    root: str | Path,
    split_dirs: dict[str, str],
    verify: str = "decode",
    on_bad_file: str = "fail",
    cache_path: str | Path | None = None,
    workers: int | None = None,
) -> ScanResult:
    """Scan ``root`` into a manifest, a class-index map and per-class counts.

    ``split_dirs`` maps split names (``train``, ``val``) to folder names under ``root``.
    Labels follow the sorted train class folder names. Every file that is not a usable image
    (``verify`` sets how far each is read: ``trainlib.data.verify``) is listed in ``bad_files``
    with a reason and logged; ``on_bad_file="fail"`` raises instead. Content verdicts are cached
    in the SQLite file ``cache_path`` (None: not cached) and checked in ``workers`` processes
    (None: every core). An empty class folder, or a val class absent from train, is always an error.
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

    class_dirs, bad = {}, []
    for split, folder in split_dirs.items():
        class_dirs[split], hidden = _class_dirs(root / folder)
        bad.extend((path, split, reason) for path, reason in hidden)
    class_names = [d.name for d in class_dirs["train"]]
    class_index = {name: label for label, name in enumerate(class_names)}
    for split, dirs in class_dirs.items():
        unknown = sorted(d.name for d in dirs if d.name not in class_index)
        if unknown:
            raise DataLayoutError(
                f"{root / split_dirs[split]} has classes absent from {root / split_dirs['train']}: "
                f"{', '.join(unknown[:10])}{' ...' if len(unknown) > 10 else ''}"
            )

    listed = []  # (split, class folder, candidate files)
    for split, dirs in class_dirs.items():
        for class_dir in dirs:
            folder = str(class_dir.resolve())
            files, refused = _list_class(folder)
            bad.extend((path, split, reason) for path, reason in refused)
            listed.append((split, class_dir, files))
    problems, verified = {}, 0
    if verify != "none":
        problems, verified = verify_files([files for _, _, files in listed], verify, cache_path, workers)

    # The manifest is built column by column, each class folder's files released as it is taken: the file list,
    # the table being built and pandas's copy are never all held at once (ImageNet: 1.28 M files).
    path_chunks, sizes, mtimes = [], array("q"), array("q")  # paths: one Arrow string array per class folder
    labels, splits = array("l"), []
    listed.reverse()
    while listed:
        split, class_dir, files = listed.pop()
        paths = []
        for index in range(len(files)):
            path = files.path(index)
            problem = problems.get(path)
            if problem is None:
                paths.append(path)
                sizes.append(files.sizes[index])
                mtimes.append(files.mtimes_ns[index])
            else:
                bad.append((path, split, problem))
        if not paths:
            raise DataLayoutError(f"class folder {class_dir} holds no usable image")
        path_chunks.append(pd.Series(pd.array(paths, dtype="str")))
        labels.extend([class_index[class_dir.name]] * len(paths))
        splits.append((split, len(paths)))
        del files, paths

    bad_files = pd.DataFrame(sorted(bad), columns=BAD_FILE_COLUMNS)
    for path, _, reason in bad[:20]:
        logger.warning("Bad file %s: %s", path, reason)
    if bad and on_bad_file == "fail":
        listing = "\n".join(f"  {p}: {r}" for p, _, r in bad[:20])
        raise BadImageError(
            f"{len(bad)} unusable file(s) under {root}:\n{listing}\n"
            "Remove them, or set data.on_bad_file: exclude to leave them out of the manifest."
        )
    label_column = np.frombuffer(labels, dtype=np.int_) if len(labels) else np.zeros(0, np.int_)
    manifest = pd.DataFrame(
        {
            "path": pd.concat(path_chunks, ignore_index=True).array if path_chunks else pd.array([], dtype="str"),
            "class_name": pd.Categorical.from_codes(label_column, class_names).astype("str"),
            "label": label_column.astype(np.int64),
            "split": pd.array(np.repeat([split for split, _ in splits], [count for _, count in splits]), dtype="str"),
            "size": np.frombuffer(sizes, dtype=np.int64) if len(sizes) else np.zeros(0, np.int64),
            "mtime_ns": np.frombuffer(mtimes, dtype=np.int64) if len(mtimes) else np.zeros(0, np.int64),
        },
        columns=MANIFEST_COLUMNS,
    )
    counts = manifest.groupby(["split", "class_name"]).size().unstack("split", fill_value=0)
    counts = counts.reindex(class_names, fill_value=0).reset_index()
    counts.columns.name = None
    counts.insert(1, "label", [class_index[name] for name in counts["class_name"]])
    _log_counts(counts, bad_files)
    return ScanResult(manifest, class_index, counts, bad_files, verified)


def _log_counts(counts: pd.DataFrame, bad_files: pd.DataFrame) -> None:
    """Per-class image counts of each split, and how many files were left out (and why, by reason)."""
    for split in counts.columns[2:]:
        per_class = counts.set_index("class_name")[split]
        if len(per_class) <= _LOGGED_CLASSES:
            shown = ", ".join(f"{name} {count}" for name, count in per_class.items())
        else:
            shown = (
                f"min {per_class.min()} ({per_class.idxmin()}), median {per_class.median():g}, "
                f"max {per_class.max()} ({per_class.idxmax()}); every class in class_counts"
            )
        logger.info("%s: %d images in %d classes: %s", split, per_class.sum(), len(per_class), shown)
    if bad_files.empty:
        logger.info("No file excluded")
        return
    reasons = bad_files["reason"].str.replace(r"(: .*| to .*| \(.*)$", "", regex=True).value_counts()
    logger.warning(
        "Excluded %d file(s) (%s); each is listed with its reason in bad_files",
        len(bad_files),
        ", ".join(f"{count} {reason}" for reason, count in reasons.items()),
    )


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


def default_cache_dir() -> Path:
    """Where ``create_dataset`` keeps its link trees when the caller names no folder."""
    return Path(tempfile.gettempdir()) / f"pipelines-images-{os.getuid()}"


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
    cache_dir: str | Path | None = None,
    on_bad_file: str = "fail",
):
    """A batched MindSpore dataset over the manifest rows of ``split``, sharded by rank.

    The rows are read by MindSpore's C++ ``ImageFolderDataset`` from a tree of links to exactly
    those files, built once under ``cache_dir`` (default: ``default_cache_dir()``;
    ``trainlib.data.links``), in a seeded shuffle for training and in (label, manifest) order for
    evaluation. ``on_bad_file``: what to do with a file changed since ingest that no longer decodes
    (``fail``: raise naming it; ``exclude``: leave it out). The files left out are the dataset's
    ``skipped_files`` (a table of path, reason).

    Train: RandomCropDecodeResize, horizontal flip, normalise, HWC->CHW (shuffled, last
    partial batch dropped). Eval: Decode, Resize(image_size / eval_resize_ratio),
    CenterCrop(image_size), normalise, HWC->CHW (every image kept).
    """
    import mindspore.dataset as ds
    from mindspore.dataset import vision

    rows = manifest[manifest["split"] == split]
    if rows.empty:
        raise DataLayoutError(f"the manifest has no '{split}' images")
    missing = [column for column in MANIFEST_COLUMNS if column not in rows.columns]
    if missing:
        raise DataLayoutError(f"the manifest lacks columns {missing}: rerun the data pipeline to rebuild it")
    linked = link_split(rows, cache_dir or default_cache_dir(), on_bad_file)
    per_rank = linked.rows // rank_size
    if training and per_rank < batch_size:
        raise ValueError(
            f"batch_size {batch_size} is larger than the {per_rank} '{split}' images each of "
            f"{rank_size} rank(s) reads; lower batch_size or use more data"
        )
    ds.config.set_seed(seed)
    dataset = ds.ImageFolderDataset(
        str(linked.root),
        shuffle=training,
        class_indexing=linked.class_indexing,
        num_shards=rank_size if rank_size > 1 else None,
        shard_id=rank if rank_size > 1 else None,
    )
    if training:
        image_ops = [
            vision.RandomCropDecodeResize(image_size, scale=tuple(crop_scale), ratio=(0.75, 1.333)),
            vision.RandomHorizontalFlip(prob=0.5),
            *normalise_ops(),
        ]
    else:
        image_ops = eval_image_ops(image_size, eval_resize_ratio)
    dataset = dataset.map(operations=image_ops, input_columns="image", num_parallel_workers=num_workers)
    dataset = dataset.batch(batch_size, drop_remainder=training)
    dataset.skipped_files = linked.skipped
    return dataset


def dataset_figures(dataset) -> dict[str, float]:
    """Figures for every epoch's row of a training over ``dataset`` (from ``create_dataset``):
    ``data/skipped_files`` when files changed since ingest were left out."""
    skipped = getattr(dataset, "skipped_files", None)
    return {SKIPPED_FILES_METRIC: float(len(skipped))} if skipped is not None and len(skipped) else {}


def checked_batches(iterator):
    """The batches of a MindSpore dataset ``iterator``; a failure of the input pipeline becomes
    an ``InputPipelineError`` of one line naming the image that failed and the setting to change."""
    while True:
        try:
            batch = next(iterator)
        except StopIteration:
            return
        except RuntimeError as error:
            raise InputPipelineError(explain_pipeline_error(error)) from None
        yield batch


def explain_pipeline_error(error: RuntimeError) -> str:
    """One line for a MindSpore input-pipeline error: the source image that failed and why, when
    MindSpore names it, else MindSpore's own message."""
    text = str(error)
    lines = [line.strip() for line in text.splitlines() if line.strip().startswith("[ERROR]")]
    cause = (lines[0].removeprefix("[ERROR]").strip() if lines else text.strip().splitlines()[0]) or repr(error)
    failed = _FAILED_FILE.search(text)
    if failed is None:
        return f"the input pipeline failed: {cause}"
    source = os.path.realpath(failed.group(1))  # the link tree's entry -> the image itself
    problem = content_problem(source, "decode") or cause
    return (
        f"{source} cannot be used ({problem}): it changed on disk after ingest, or data.verify 'header' or "
        "'none' let it in; restore it, or rerun the data pipeline with data.verify: decode, which lists and "
        "excludes it"
    )
