"""Checkpoint files as the project wrote them before 2026-11-26: MindSpore's ``.ckpt`` (protobuf), for the tests that
check such files still load."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np

from trainlib.engine.checkpoint import METADATA_KEY, SCALARS_KEY, Checkpoint


def save_mindspore_ckpt(checkpoint: Checkpoint, path: Path) -> None:
    """Write ``checkpoint`` to ``path`` with ``mindspore.save_checkpoint``, as ``engine.checkpoint`` did: the metadata
    one JSON string under ``METADATA_KEY``, the names of 0-d arrays (stored as shape (1,)) under ``SCALARS_KEY``."""
    import mindspore as ms

    metadata = {**checkpoint.metadata, SCALARS_KEY: sorted(k for k, v in checkpoint.params.items() if np.ndim(v) == 0)}
    entries = [{"name": name, "data": ms.Tensor(np.asarray(value))} for name, value in checkpoint.params.items()]
    path.parent.mkdir(parents=True, exist_ok=True)
    ms.save_checkpoint(entries, str(path), append_dict={METADATA_KEY: json.dumps(metadata)})
