"""``ModelDataset``: a trained classifier's model folder (MindIR, description, example image) as a catalog entry."""

from __future__ import annotations

from pathlib import Path, PurePosixPath
from typing import Any

from kedro.io import AbstractDataset

from trainlib.predict.export import ExportedModel, load_model, save_model


class ModelDataset(AbstractDataset[ExportedModel, ExportedModel]):
    """Loads and saves an ``ExportedModel`` as a folder (``trainlib.predict.export``), swapped in whole on save.

    Example catalog entry::

        "{recipe}.model":
          type: pipelines.catalog.ModelDataset
          filepath: data/06_models/{recipe}/model
    """

    def __init__(self, filepath: str, metadata: dict[str, Any] | None = None):
        self._filepath = PurePosixPath(filepath)
        self.metadata = metadata

    def load(self) -> ExportedModel:
        return load_model(self._filepath)

    def save(self, data: ExportedModel) -> None:
        save_model(data, self._filepath)

    def _exists(self) -> bool:
        return Path(self._filepath).is_dir()

    def _describe(self) -> dict[str, Any]:
        return {"filepath": str(self._filepath)}
