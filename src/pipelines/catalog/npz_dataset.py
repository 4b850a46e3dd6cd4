"""``NpzArraysDataset``: named numpy arrays (a table of columns) as one ``.npz`` file, saved atomically."""

from __future__ import annotations

import io
import zipfile
from pathlib import Path
from typing import Any

import numpy as np
from kedro.io import AbstractDataset, DatasetError

from trainlib.atomic_write import remove_abandoned_temporaries, write_atomically


class NpzArraysDataset(AbstractDataset[dict[str, np.ndarray], dict[str, np.ndarray]]):
    """Named arrays in one uncompressed ``.npz``: thor_bert's pre-training examples (``input_ids``, …).

    Example catalog entry::

        thor_bert.examples.train_examples:
          type: pipelines.catalog.NpzArraysDataset
          filepath: data/05_model_input/thor_bert/train_examples.npz

    Example in Python::

        NpzArraysDataset(filepath="examples.npz").save({"input_ids": np.zeros((2, 8), np.int32)})
    """

    def __init__(self, filepath: str, metadata: dict[str, Any] | None = None):
        self._filepath = Path(filepath)
        self.metadata = metadata

    def load(self) -> dict[str, np.ndarray]:
        try:
            with np.load(self._filepath, allow_pickle=False) as arrays:
                return {name: arrays[name] for name in arrays.files}
        except (OSError, ValueError, zipfile.BadZipFile) as error:
            raise DatasetError(f"{self._filepath} is missing, truncated or not a .npz of arrays: {error}") from error

    def save(self, data: dict[str, np.ndarray]) -> None:
        self._filepath.parent.mkdir(parents=True, exist_ok=True)
        remove_abandoned_temporaries(self._filepath.parent)
        buffer = io.BytesIO()
        np.savez(buffer, **data)
        write_atomically(self._filepath, buffer.getvalue())

    def _exists(self) -> bool:
        return self._filepath.is_file()

    def _describe(self) -> dict[str, Any]:
        return {"filepath": str(self._filepath)}
