"""``CheckpointDataset``: a checkpoint file (``engine.checkpoint``: safetensors, any size) as a Kedro catalog entry."""

from __future__ import annotations

from pathlib import PurePosixPath
from typing import Any

from kedro.io import AbstractDataset

from trainlib.engine.checkpoint import Checkpoint, load_checkpoint, save_checkpoint


class CheckpointDataset(AbstractDataset[Checkpoint, Checkpoint]):
    """Loads and saves a ``Checkpoint`` (parameter arrays plus metadata) as a safetensors file named ``.ckpt`` (or
    ``.safetensors``); an older MindSpore ``.ckpt`` at the path loads too.

    Saving is atomic (temporary file, then rename); loading a truncated or corrupt file
    raises an error naming it.

    Example catalog entry::

        baseline_final_checkpoint:
          type: pipelines.catalog.CheckpointDataset
          filepath: data/06_models/baseline/final.ckpt

    Example in Python::

        dataset = CheckpointDataset(filepath="data/06_models/final.ckpt")
        dataset.save(Checkpoint({"fc.weight": weights}, {"epoch": 3}))
        reloaded = dataset.load()
    """

    def __init__(self, filepath: str, metadata: dict[str, Any] | None = None):
        self._filepath = PurePosixPath(filepath)
        self.metadata = metadata

    def load(self) -> Checkpoint:
        return load_checkpoint(self._filepath)

    def save(self, data: Checkpoint) -> None:
        save_checkpoint(data, self._filepath)

    def _exists(self) -> bool:
        from pathlib import Path

        return Path(self._filepath).is_file()

    def _describe(self) -> dict[str, Any]:
        return {"filepath": str(self._filepath)}
