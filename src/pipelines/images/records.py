"""Manifest rows written to MindRecord files: the input of the native (C++) training reader.

A split's rows are cut into chunks of consecutive classes (at most ``MAX_CHUNKS`` per split).
Each chunk is one MindRecord file (plus MindSpore's ``.db`` index) in a folder named by the hash
of its rows (path, label, size, mtime), so:

- it is written once and reused by every training while those rows are unchanged;
- a changed manifest rewrites only the chunks whose rows changed;
- it is written into a ``.partial`` folder and renamed into place, so a reader never sees a half
  written chunk and an interrupted conversion restarts that chunk cleanly (finished ones are kept);
- concurrent processes (the ranks of one node, two runs) take a file lock; the first converts,
  the others then find the chunks ready.

The bytes copied are those verified at ingest: each file is checked against the size and mtime
the manifest recorded. A file changed since then is decoded again; if it no longer decodes the
conversion stops with a one-line error naming it (``data.on_bad_file: fail``) or leaves it out
and reports it (``exclude``). Disk cost: the images' own size plus about 0.1 KB per image.
"""

from __future__ import annotations

import fcntl
import hashlib
import io
import json
import logging
import os
import shutil
import socket
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pandas as pd

from pipelines.images.verify import content_problem, decode_problem

logger = logging.getLogger(__name__)

RECORD_FORMAT = "images-v1"  # part of every chunk's hash: change it when the chunk layout changes
MAX_CHUNKS = 64  # per split; ImageNet: about 16 classes, 20,000 images, 2 GB per chunk
RECORD_FILE = "images.mindrecord"
SKIPPED_FILE = "skipped.json"
PATHS_FILE = "paths.json"  # the source file of each row, in row order: names a row that fails to decode
SCHEMA = {"image": {"type": "bytes"}, "label": {"type": "int32"}}
_WRITE_ROWS = 256  # rows handed to the writer at once: bounds memory to a few batches of images
SKIPPED_COLUMNS = ["path", "reason"]


class ChangedImageError(RuntimeError):
    """A file changed on disk after ingest and no longer decodes (policy ``fail``)."""


@dataclass
class RecordSet:
    """The MindRecord files of one split, in manifest order, and what was left out of them."""

    files: list[str]
    rows: int
    skipped: pd.DataFrame  # columns path, reason: changed since ingest and no longer usable


def chunk_bounds(labels: np.ndarray, max_chunks: int = MAX_CHUNKS) -> list[tuple[int, int]]:
    """Row ranges [start, stop) of ``labels`` (sorted) grouping consecutive classes into chunks.

    Chunks depend on the split's classes only, not on row counts, so a file added to one class
    changes one chunk.
    """
    classes = np.unique(labels)
    groups = np.array_split(classes, min(max_chunks, len(classes)))
    return [
        (int(np.searchsorted(labels, group[0], "left")), int(np.searchsorted(labels, group[-1], "right")))
        for group in groups
    ]


def chunk_key(rows: pd.DataFrame) -> str:
    digest = hashlib.sha256(RECORD_FORMAT.encode())
    for path, label, size, mtime_ns in rows[["path", "label", "size", "mtime_ns"]].itertuples(index=False):
        digest.update(f"{path}\0{label}\0{size}\0{mtime_ns}\n".encode(errors="surrogateescape"))
    return digest.hexdigest()[:32]


def write_records(rows: pd.DataFrame, cache_dir: str | Path, on_bad_file: str = "fail") -> RecordSet:
    """MindRecord files holding ``rows`` (one split of a manifest), converting the missing chunks.

    Rows are read in (label, manifest) order. ``on_bad_file``: what to do with a file that changed
    since ingest and no longer decodes: ``fail`` raises ``ChangedImageError`` naming it,
    ``exclude`` leaves it out and lists it in ``RecordSet.skipped``.
    """
    rows = rows.sort_values("label", kind="stable").reset_index(drop=True)
    folder = Path(cache_dir) / "records"
    chunks = [(chunk_key(rows.iloc[a:b]), rows.iloc[a:b]) for a, b in chunk_bounds(rows["label"].to_numpy())]
    missing = [(key, part) for key, part in chunks if not (folder / key).is_dir()]
    if missing:
        folder.mkdir(parents=True, exist_ok=True)
        with open(folder / ".lock", "a") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)  # released when the file closes
            _remove_abandoned_partials(folder)
            missing = [(key, part) for key, part in missing if not (folder / key).is_dir()]
            started, images = time.perf_counter(), sum(len(part) for _, part in missing)
            for number, (key, part) in enumerate(missing, 1):
                _convert_chunk(part, folder / key, on_bad_file)
                logger.info("MindRecord chunk %d/%d written (%d images)", number, len(missing), len(part))
            if missing:
                elapsed = time.perf_counter() - started
                logger.info(
                    "Converted %d images to MindRecord in %.1f s (%.2f s per 1,000) under %s",
                    images,
                    elapsed,
                    1000 * elapsed / max(images, 1),
                    folder,
                )
    files, skipped, count = [], [], 0
    for key, part in chunks:
        with open(folder / key / SKIPPED_FILE) as handle:
            left_out = json.load(handle)
        skipped.extend(left_out)
        if len(left_out) < len(part):
            files.append(str(folder / key / RECORD_FILE))
            count += len(part) - len(left_out)
    skipped_table = pd.DataFrame(skipped, columns=SKIPPED_COLUMNS)
    if not skipped_table.empty:
        if on_bad_file == "fail":
            first = skipped_table.iloc[0]
            raise ChangedImageError(_changed_message(first["path"], first["reason"]))
        logger.warning(
            "%d file(s) changed since ingest and no longer decode; left out (data.on_bad_file: exclude): %s",
            len(skipped_table),
            ", ".join(skipped_table["path"].head(5)),
        )
    return RecordSet(files, count, skipped_table)


def _changed_message(path: str, reason: str) -> str:
    return (
        f"{path} changed on disk after ingest and can no longer be used ({reason}); restore it and rerun "
        "the data pipeline, or set data.on_bad_file: exclude to skip it"
    )


def _convert_chunk(rows: pd.DataFrame, destination: Path, on_bad_file: str) -> None:
    """Write ``rows`` into ``destination`` (a new folder), atomically."""
    partial = destination.with_name(f"{destination.name}.partial-{socket.gethostname()}-{os.getpid()}")
    shutil.rmtree(partial, ignore_errors=True)
    partial.mkdir()
    skipped: list[tuple[str, str]] = []
    written: list[str] = []
    writer = None
    batch: list[dict] = []
    for path, label, size, mtime_ns in rows[["path", "label", "size", "mtime_ns"]].itertuples(index=False):
        data, problem = _read_verified(path, int(size), int(mtime_ns))
        if problem is not None:
            if on_bad_file == "fail":
                shutil.rmtree(partial, ignore_errors=True)
                raise ChangedImageError(_changed_message(path, problem))
            skipped.append((path, problem))
            continue
        batch.append({"image": data, "label": int(label)})
        written.append(path)
        if len(batch) == _WRITE_ROWS:
            writer = _write(writer, partial, batch)
            batch = []
    if batch:
        writer = _write(writer, partial, batch)
    if writer is not None:
        writer.commit()
    (partial / SKIPPED_FILE).write_text(json.dumps(skipped))
    (partial / PATHS_FILE).write_text(json.dumps(written))
    os.rename(partial, destination)


def _write(writer, folder: Path, batch: list[dict]):
    from mindspore.mindrecord import FileWriter

    if writer is None:
        writer = FileWriter(str(folder / RECORD_FILE), shard_num=1, overwrite=True)
        writer.add_schema(SCHEMA, "images")
    writer.write_raw_data(batch)
    return writer


def _read_verified(path: str, size: int, mtime_ns: int) -> tuple[bytes | None, str | None]:
    """The bytes of ``path``, or why it cannot be used: a file changed since ingest is decoded again."""
    try:
        status = os.stat(path)
        if (status.st_size, status.st_mtime_ns) != (size, mtime_ns):
            problem = content_problem(path, "decode")
            if problem is not None:
                return None, problem
            logger.warning("%s changed since ingest but still decodes; using it as it is now", path)
        with open(path, "rb") as handle:
            return handle.read(), None
    except FileNotFoundError:
        return None, "no longer exists"
    except OSError as error:
        return None, f"cannot be read: {error.strerror or error}"


def _remove_abandoned_partials(folder: Path) -> None:
    """Delete ``.partial`` folders this host's killed conversions left (called holding the lock,
    so no conversion on this host is under way)."""
    for partial in folder.glob(f"*.partial-{socket.gethostname()}-*"):
        shutil.rmtree(partial, ignore_errors=True)


def undecodable_rows(record_file: str | Path) -> list[tuple[str, str]]:
    """(source path, problem) of each row of a chunk whose bytes do not decode.

    MindSpore names only the MindRecord file when a row fails to decode in training; this finds
    the rows (a chunk is at most a few percent of a split) and the files they were copied from.
    """
    from mindspore.mindrecord import FileReader

    record_file = Path(record_file)
    paths = json.loads((record_file.parent / PATHS_FILE).read_text())
    reader = FileReader(str(record_file), columns=["image"])
    try:
        found = []
        for index, row in enumerate(reader.get_next()):
            problem = decode_problem(io.BytesIO(row["image"]))
            if problem is not None:
                found.append((paths[index], problem))
        return found
    finally:
        reader.close()
