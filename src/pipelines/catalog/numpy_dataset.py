"""``NumpyArrayDataset``: one numpy array as a ``.npy`` file, saved atomically."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import numpy as np
from kedro.io import AbstractDataset, DatasetError

from trainlib.atomic_write import atomic_path, remove_abandoned_temporaries


class NumpyArrayDataset(AbstractDataset[np.ndarray, np.ndarray]):
    """A ``.npy`` array: the format ``mindspore.boost`` reads as ``pca_mat_path``.

    Example catalog entry::

        pca_matrix:
          type: pipelines.catalog.NumpyArrayDataset
          filepath: data/06_models/dim_reduce/pca_matrix.npy

    Example in Python::

        NumpyArrayDataset(filepath="pca.npy").save(np.eye(3, dtype=np.float32))
    """

    def __init__(self, filepath: str, metadata: dict[str, Any] | None = None):
        self._filepath = Path(filepath)
        self.metadata = metadata

    def load(self) -> np.ndarray:
        try:
            return np.load(self._filepath, allow_pickle=False)
        except (OSError, ValueError) as error:
            raise DatasetError(f"{self._filepath} is missing, truncated or not a .npy array: {error}") from error

    def save(self, data: np.ndarray) -> None:
        self._filepath.parent.mkdir(parents=True, exist_ok=True)
        remove_abandoned_temporaries(self._filepath.parent)
        tmp = atomic_path(self._filepath)
        try:
            with open(tmp, "wb") as handle:
                np.save(handle, data, allow_pickle=False)
            os.replace(tmp, self._filepath)
        finally:
            tmp.unlink(missing_ok=True)

    def _exists(self) -> bool:
        return self._filepath.is_file()

    def _describe(self) -> dict[str, Any]:
        return {"filepath": str(self._filepath)}
