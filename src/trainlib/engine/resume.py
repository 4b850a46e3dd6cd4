"""Which checkpoint a training resumes from: fingerprints, the newest unfinished checkpoint, stale files.

A training's periodic checkpoints carry the fingerprint of its configuration and start weights; a
rerun of the same training continues from the newest of them, any other training moves them aside
to a ``stale-<time>/`` folder (the newest ``keep_stale`` of those are kept). Once a finished
training's final state is saved, ``remove_finished_checkpoints`` removes its periodic checkpoints.
Which checkpoint is which is read from each file's metadata alone (``checkpoint.load_metadata``: the
safetensors header), so looking through a folder of multi-GB checkpoints reads only their headers.
"""

from __future__ import annotations

import hashlib
import json
import logging
import shutil
import time
from pathlib import Path

import numpy as np

from trainlib.atomic_write import remove_abandoned_temporaries
from trainlib.distributed.launch import barrier, rank_context, sum_over_ranks
from trainlib.engine.checkpoint import Checkpoint, CheckpointError, load_metadata

logger = logging.getLogger(__name__)

# Periodic checkpoints of every training are <checkpoint dir>/epoch_<NNNN>.ckpt.
CHECKPOINT_PREFIX = "epoch"
# Checkpoint metadata: the folder of the training's periodic checkpoints, so that whoever saves its
# final state (the catalog, through pipelines.hooks.checkpoints) can remove them afterwards.
CHECKPOINT_DIR_KEY = "checkpoint_dir"
# Checkpoints of another configuration are moved to <checkpoint dir>/stale-<time>/.
STALE_PREFIX = "stale-"
KEEP_STALE = 3  # stale folders kept per checkpoint folder unless told otherwise (checkpoint.keep_stale)


def fingerprint(*parts) -> str:
    """Short hash of a training's configuration and start weights, stored in its checkpoints.

    Parts may be checkpoints (their parameters are hashed), numpy arrays, parameter models
    (anything with ``model_dump``) or JSON-serialisable values. A checkpoint is resumed only by the
    training that wrote it: same parameters, same start.
    """
    digest = hashlib.sha256()
    for part in parts:
        if isinstance(part, Checkpoint):
            for name in sorted(part.params):
                digest.update(name.encode())
                digest.update(np.ascontiguousarray(part.params[name]).tobytes())
        elif isinstance(part, np.ndarray):
            digest.update(str((part.dtype, part.shape)).encode())
            digest.update(np.ascontiguousarray(part).tobytes())
        else:
            value = part.model_dump() if hasattr(part, "model_dump") else part
            digest.update(json.dumps(value, sort_keys=True, default=str).encode())
    return digest.hexdigest()[:16]


def find_resume_checkpoint(
    directory: str | Path, prefix: str, expected_fingerprint: str, stop_epoch: int, keep_stale: int = KEEP_STALE
) -> Path | None:
    """The newest ``<prefix>_*.ckpt`` in ``directory`` of the same, unfinished training, if any.

    Checkpoints of a different configuration are moved to ``<directory>/stale-<time>/``
    rather than deleted or overwritten, and of those folders the newest ``keep_stale`` are kept;
    those of the same training that already reached ``stop_epoch`` are removed (its result is the
    final checkpoint), so a rerun trains anew. An unreadable checkpoint raises ``CheckpointError``
    naming it (only the headers are read here; the file resumed from is read whole by the caller). With several ranks
    the node's first worker tidies the folder while the others wait, then every rank looks, and they agree on the newest
    epoch that every rank holds: each node writes its own folder, and a node killed between two epochs' checkpoints is
    one behind the others (``keep_last`` of 2 or more keeps the epoch before).
    """
    ranks = rank_context()
    if ranks.is_node_leader:
        _tidy(directory, prefix, expected_fingerprint, stop_epoch)
        trim_stale(directory, keep_stale)
    if ranks.size > 1:
        barrier()
    candidates = _resumable(directory, prefix, expected_fingerprint, stop_epoch)
    if ranks.size == 1:
        return candidates[max(candidates)] if candidates else None
    held = np.zeros(stop_epoch + 1, np.float32)
    held[list(candidates)] = 1.0
    everywhere = [epoch for epoch, count in enumerate(sum_over_ranks(held)) if count == ranks.size]
    if not everywhere:
        if candidates:
            logger.warning(
                "No epoch checkpoint in %s is held by every rank (this one holds epochs %s); training anew",
                directory,
                sorted(candidates),
            )
        return None
    chosen = max(everywhere)
    if chosen < max(candidates):
        logger.warning(
            "Resuming from epoch %d, the newest every rank holds (this node also has epoch %d)",
            chosen,
            max(candidates),
        )
    return candidates[chosen]


def _checkpoints(directory: Path, prefix: str) -> list[Path]:
    return sorted(directory.glob(f"{prefix}_*.ckpt"))


def _tidy(directory: str | Path, prefix: str, expected_fingerprint: str, stop_epoch: int) -> None:
    """Remove abandoned temporaries; move another configuration's checkpoints aside, remove a finished run's."""
    directory = Path(directory)
    for path in remove_abandoned_temporaries(directory):
        logger.info("Removed %s, left by an interrupted save", path)
    found = _checkpoints(directory, prefix)
    if not found:
        return
    metadata = load_metadata(found[-1])
    if metadata.get("fingerprint") == expected_fingerprint:
        if metadata.get("epoch", 0) >= stop_epoch:
            logger.info(
                "The checkpoints in %s are of a finished training of this configuration; training anew", directory
            )
            for path in found:
                path.unlink()
        return
    stale = _new_stale_folder(directory)
    for path in found:
        path.rename(stale / path.name)
    logger.warning("Checkpoints in %s come from another configuration; moved them to %s", directory, stale)


def _resumable(directory: str | Path, prefix: str, expected_fingerprint: str, stop_epoch: int) -> dict[int, Path]:
    """Epoch -> checkpoint of this training in ``directory`` that it can resume from (before ``stop_epoch``)."""
    candidates = {}
    for path in _checkpoints(Path(directory), prefix):
        metadata = load_metadata(path)
        epoch = int(metadata.get("epoch", 0))
        if metadata.get("fingerprint") == expected_fingerprint and epoch < stop_epoch:
            candidates[epoch] = path
    return candidates


def _new_stale_folder(directory: Path) -> Path:
    """A new ``stale-<time>`` folder in ``directory``; names sort in the order they were made."""
    name = time.strftime(f"{STALE_PREFIX}%Y%m%d-%H%M%S")
    stale, suffix = directory / name, 1
    while stale.exists():  # a second move within the same second
        stale, suffix = directory / f"{name}-{suffix}", suffix + 1
    stale.mkdir()
    return stale


def trim_stale(directory: str | Path, keep: int) -> list[Path]:
    """Remove all but the newest ``keep`` ``stale-*`` folders of ``directory``; returns those removed.

    They hold checkpoints of other configurations, moved aside by ``find_resume_checkpoint``;
    the oldest go first, each with a log line.
    """
    folders = sorted(p for p in Path(directory).glob(f"{STALE_PREFIX}*") if p.is_dir())
    removed = folders[: max(len(folders) - keep, 0)]
    for folder in removed:
        shutil.rmtree(folder)
        logger.info(
            "Removed %s, the oldest of the folders of set-aside checkpoints (checkpoint.keep_stale keeps %d)",
            folder,
            keep,
        )
    return removed


def remove_finished_checkpoints(final: Checkpoint, prefix: str = CHECKPOINT_PREFIX) -> list[Path]:
    """Remove the periodic checkpoints of the training whose final state ``final`` is; returns those removed.

    Call it only once ``final`` has been saved (``pipelines.hooks.checkpoints`` does, after the catalog saved it),
    so that the periodic checkpoints are never the only copy of the finished state. The folder is
    ``final``'s ``checkpoint_dir`` metadata (none: nothing to do). Only checkpoints with ``final``'s
    fingerprint and an epoch up to its own are removed: another training's are left alone, and so is a
    file that cannot be read (the next run of that folder names it). With several ranks only each
    node's first worker removes, as only it writes them.
    """
    directory = final.metadata.get(CHECKPOINT_DIR_KEY)
    run_id = final.metadata.get("fingerprint")
    if not directory or not run_id or not rank_context().is_node_leader:
        return []
    removed = []
    for path in sorted(Path(directory).glob(f"{prefix}_*.ckpt")):
        try:
            metadata = load_metadata(path)
        except CheckpointError:  # gone already (another node, shared folder) or unreadable
            continue
        if metadata.get("fingerprint") == run_id and metadata.get("epoch", 0) <= final.metadata.get("epoch", 0):
            path.unlink(missing_ok=True)
            removed.append(path)
    if removed:
        logger.info(
            "The finished training's final state is saved; removed its periodic checkpoints from %s (%d files)",
            directory,
            len(removed),
        )
    return removed
