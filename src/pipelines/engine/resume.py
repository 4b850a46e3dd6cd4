"""Which checkpoint a training resumes from: fingerprints, the newest unfinished checkpoint, stale files.

A training's periodic checkpoints carry the fingerprint of its configuration and start weights; a
rerun of the same training continues from the newest of them, any other training leaves them be.
"""

from __future__ import annotations

import hashlib
import json
import logging
import time
from pathlib import Path

import numpy as np

from pipelines.distributed.launch import barrier, rank_context
from pipelines.engine.checkpoint import Checkpoint, load_checkpoint

logger = logging.getLogger(__name__)

# Periodic checkpoints of every training are <checkpoint dir>/epoch_<NNNN>.ckpt.
CHECKPOINT_PREFIX = "epoch"


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
    directory: str | Path, prefix: str, expected_fingerprint: str, stop_epoch: int
) -> Path | None:
    """The newest ``<prefix>_*.ckpt`` in ``directory`` of the same, unfinished training, if any.

    Checkpoints of a different configuration are moved to ``<directory>/stale-<time>/``
    rather than deleted or overwritten; those of the same training that already reached
    ``stop_epoch`` are removed (its result is the final checkpoint), so a rerun trains anew.
    An unreadable checkpoint raises ``CheckpointError`` naming it. With several ranks the node's
    first worker tidies the folder while the others wait, then they look without tidying.
    """
    ranks = rank_context()
    if ranks.size == 1:
        return _find_resume_checkpoint(directory, prefix, expected_fingerprint, stop_epoch, tidy=True)
    if ranks.is_node_leader:
        found = _find_resume_checkpoint(directory, prefix, expected_fingerprint, stop_epoch, tidy=True)
    barrier()
    if ranks.is_node_leader:
        return found
    return _find_resume_checkpoint(directory, prefix, expected_fingerprint, stop_epoch, tidy=False)


def _find_resume_checkpoint(
    directory: str | Path, prefix: str, expected_fingerprint: str, stop_epoch: int, tidy: bool
) -> Path | None:
    directory = Path(directory)
    found = sorted(directory.glob(f"{prefix}_*.ckpt"))
    if not found:
        return None
    newest = found[-1]
    metadata = load_checkpoint(newest).metadata
    if metadata.get("fingerprint") == expected_fingerprint:
        if metadata.get("epoch", 0) < stop_epoch:
            return newest
        if not tidy:
            return None
        logger.info("The checkpoints in %s are of a finished training of this configuration; training anew", directory)
        for path in found:
            path.unlink()
        return None
    if not tidy:
        return None
    stale = directory / time.strftime("stale-%Y%m%d-%H%M%S")
    stale.mkdir()
    for path in found:
        path.rename(stale / path.name)
    logger.warning("Checkpoints in %s come from another configuration; moved them to %s", directory, stale)
    return None
