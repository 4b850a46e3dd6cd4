"""Manifest rows as a tree of symbolic links: the input of MindSpore's C++ ``ImageFolderDataset``.

``ImageFolderDataset`` reads a ``<root>/<class>/<file>`` tree at native speed, with sharding and a
seeded shuffle, but takes every file it finds. Giving it a tree of links to exactly the manifest's
files keeps bad-file exclusion and subsets, and costs no copy of the images:

- ``<cache_dir>/links/classes/<key>/<n:08d><ext>`` link to one class's files of one split, in
  manifest order, ``key`` a hash of those rows (path, size, mtime);
- ``<cache_dir>/links/views/<key>/<label:05d>`` link to the class folders of one split
  (``key`` a hash of the split's labels and class folders); the view is the dataset's root.

Every folder is built under a ``.partial`` name and renamed into place, so a reader never sees a
half-built one and an interrupted build restarts that folder cleanly (finished ones are kept). A
folder is reused while its rows are unchanged, so a changed manifest rebuilds only the classes
that changed. Concurrent processes (the ranks of a node, two runs) take a file lock; the first
builds, the others then find the folders ready. Unused folders are never read again and may be
deleted with the cache. Disk cost: one symbolic link per image (an inode, plus a 4 KiB block on
ext4 when the target path is longer than 59 bytes), no image data.

Each call checks every file against the size and mtime the manifest recorded at ingest. A file
changed since is decoded again; if it no longer decodes, it stops the run with a one-line error
naming it (``data.on_bad_file: fail``) or is left out and reported (``exclude``).
"""

from __future__ import annotations

import fcntl
import hashlib
import logging
import os
import shutil
import socket
import time
from dataclasses import dataclass
from pathlib import Path

import pandas as pd

from trainlib.data.verify import content_problem

logger = logging.getLogger(__name__)

LINKS_FORMAT = "links-v1"  # part of every folder's hash: change it when the layout changes
SKIPPED_COLUMNS = ["path", "reason"]


class ChangedImageError(RuntimeError):
    """A file changed on disk after ingest and no longer decodes (policy ``fail``)."""


@dataclass
class LinkedSplit:
    """One split's rows as an ``ImageFolderDataset`` tree, and the files left out of it."""

    root: Path  # holds one folder per label, named by ``class_indexing``
    class_indexing: dict[str, int]
    rows: int
    skipped: pd.DataFrame  # columns path, reason: changed since ingest and no longer usable


def changed_message(path: str, reason: str) -> str:
    return (
        f"{path} changed on disk after ingest and can no longer be used ({reason}); restore it and rerun "
        "the data pipeline, or set data.on_bad_file: exclude to skip it"
    )


def _hash(*parts: str) -> str:
    digest = hashlib.sha256(LINKS_FORMAT.encode())
    for part in parts:
        digest.update(part.encode(errors="surrogateescape"))
        digest.update(b"\0")
    return digest.hexdigest()[:32]


def check_unchanged(rows: pd.DataFrame, on_bad_file: str) -> tuple[pd.DataFrame, pd.DataFrame]:
    """``rows`` whose files are still usable, and the (path, reason) of those that are not.

    A file whose size or mtime differs from the manifest's is decoded again: still usable, it is
    kept (with a warning); otherwise ``fail`` raises ``ChangedImageError`` and ``exclude`` drops it.
    """
    usable, skipped = [], []
    for position, (path, size, mtime_ns) in enumerate(rows[["path", "size", "mtime_ns"]].itertuples(index=False)):
        try:
            status = os.stat(path)
        except FileNotFoundError:
            problem = "no longer exists"
        except OSError as error:
            problem = f"cannot be opened: {error.strerror or error}"
        else:
            if (status.st_size, status.st_mtime_ns) == (size, mtime_ns):
                usable.append(position)
                continue
            problem = content_problem(path, "decode")
            if problem is None:
                logger.warning("%s changed since ingest but still decodes; using it as it is now", path)
                usable.append(position)
                continue
        if on_bad_file == "fail":
            raise ChangedImageError(changed_message(path, problem))
        skipped.append((path, problem))
    if skipped:
        logger.warning(
            "%d file(s) changed since ingest and can no longer be used; left out (data.on_bad_file: exclude): %s",
            len(skipped),
            ", ".join(path for path, _ in skipped[:5]),
        )
    return rows.iloc[usable], pd.DataFrame(skipped, columns=SKIPPED_COLUMNS)


def link_split(rows: pd.DataFrame, cache_dir: str | Path, on_bad_file: str = "fail") -> LinkedSplit:
    """The link tree of ``rows`` (one split of a manifest), building what is missing.

    Files changed since ingest are handled first (``check_unchanged``). The tree lists each label's
    files in manifest order; ``ImageFolderDataset`` reads them in (label, manifest) order.
    """
    rows, skipped = check_unchanged(rows, on_bad_file)
    base = Path(cache_dir) / "links"
    classes = {}  # label -> (key, paths)
    for label, group in rows.groupby("label", sort=True):
        paths = group["path"].tolist()
        key = _hash(*(f"{p}\0{s}\0{m}" for p, s, m in group[["path", "size", "mtime_ns"]].itertuples(index=False)))
        classes[int(label)] = (key, paths)
    class_indexing = {f"{label:05d}": label for label in classes}
    view_key = _hash(*(f"{name}\0{classes[label][0]}" for name, label in class_indexing.items()))
    view = base / "views" / view_key
    if not view.is_dir():
        base.mkdir(parents=True, exist_ok=True)
        with open(base / ".lock", "a") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)  # released when the file closes
            _remove_abandoned_partials(base)
            if not view.is_dir():
                _build(base, view, classes, class_indexing)
    return LinkedSplit(view, class_indexing, len(rows), skipped)


def _build(base: Path, view: Path, classes: dict[int, tuple[str, list[str]]], class_indexing: dict[str, int]) -> None:
    """Write the missing class folders, then the view (called holding the lock)."""
    started, linked = time.perf_counter(), 0
    for key, paths in classes.values():
        folder = base / "classes" / key
        if not folder.is_dir():
            with _partial(folder) as partial:
                for index, path in enumerate(paths):
                    os.symlink(path, partial / f"{index:08d}{os.path.splitext(path)[1]}")
            linked += len(paths)
    with _partial(view) as partial:
        for name, label in class_indexing.items():
            os.symlink(os.path.join("..", "..", "classes", classes[label][0]), partial / name)
    logger.info(
        "Linked %d image(s) in %.1f s for the native reader under %s", linked, time.perf_counter() - started, view
    )


class _partial:
    """``with _partial(folder) as partial``: build in ``partial``, renamed to ``folder`` on success."""

    def __init__(self, folder: Path):
        self.folder = folder
        self.partial = folder.with_name(f"{folder.name}.partial-{socket.gethostname()}-{os.getpid()}")

    def __enter__(self) -> Path:
        shutil.rmtree(self.partial, ignore_errors=True)
        self.partial.mkdir(parents=True)
        return self.partial

    def __exit__(self, error_type, error, traceback) -> None:
        if error_type is None:
            os.rename(self.partial, self.folder)
        else:
            shutil.rmtree(self.partial, ignore_errors=True)


def _remove_abandoned_partials(base: Path) -> None:
    """Delete ``.partial`` folders this host's killed builds left (called holding the lock, so no
    build on this host is under way)."""
    for partial in base.glob(f"*/*.partial-{socket.gethostname()}-*"):
        shutil.rmtree(partial, ignore_errors=True)
