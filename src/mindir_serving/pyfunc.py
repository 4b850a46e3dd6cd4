"""The pyfunc of a training run's MLflow model (``pipelines.tracking.models`` logs it): its MindIR network with its
description, by task. An image classifier takes a DataFrame with a binary ``image`` column (encoded images; base64
in JSON over REST, as MLflow reads a binary column) and returns each image's top classes and probabilities
(``classifier``); BERT's takes a ``text`` column with ``[MASK]`` and fills each mask (``fill_mask``)."""

from __future__ import annotations

import json
from pathlib import Path

import mlflow
import pandas as pd

from mindir_serving.files import FILL_MASK, IMAGE_CLASSIFICATION

TOP_K = 5
BATCH_SIZE = 250
# each task's input column and type: encoded images (base64 in JSON over REST, as MLflow reads a binary column), texts
INPUT_COLUMNS = {IMAGE_CLASSIFICATION: ("image", "binary"), FILL_MASK: ("text", "string")}
# The distributions a model of each task imports, beside the standard library and this package: its requirements.
# BERT's tokenizer is imported by a fill-mask model only.
REQUIREMENTS = {
    IMAGE_CLASSIFICATION: ("mindspore", "mlflow", "numpy", "pandas", "pillow"),
    FILL_MASK: ("mindspore", "mlflow", "numpy", "pandas", "pillow", "tokenizers"),
}


class MindsporeModel(mlflow.pyfunc.PythonModel):
    """A model folder's MindIR network with its description (``trainlib.predict.export``), by task: an image
    classifier (``classifier.MindirClassifier``) or BERT filling masks (``fill_mask.MindirFillMask``)."""

    def load_context(self, context) -> None:
        description = json.loads(Path(context.artifacts["description"]).read_text())
        self._task = description["task"]
        if self._task == IMAGE_CLASSIFICATION:
            from mindir_serving.classifier import MindirClassifier

            self._model = MindirClassifier(context.artifacts["network"], description)
        else:
            from mindir_serving.fill_mask import MindirFillMask

            self._model = MindirFillMask(context.artifacts["network"], description)

    @property
    def classes(self) -> list[str]:
        """An image classifier's class of each output."""
        return self._model.classes

    def predict(self, context, model_input: pd.DataFrame, params: dict | None = None) -> pd.DataFrame:
        params = {name: int(value) for name, value in {**default_params(self._task), **(params or {})}.items()}
        column, kind = INPUT_COLUMNS[self._task]
        values = [bytes(value) if kind == "binary" else str(value) for value in model_input[column]]
        return self._model.predict(values, **params)


def default_params(task: str) -> dict[str, int]:
    """A model's prediction parameters: ``top_k``; BERT's also ``batch_size`` (an image model's batch is the one
    it was exported for)."""
    return {"top_k": TOP_K, **({"batch_size": BATCH_SIZE} if task == FILL_MASK else {})}
