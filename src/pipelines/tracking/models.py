"""MLflow models: a training's model folder (``trainlib.predict.export``) logged to its run as an MLflow pyfunc
model, registered under a name when asked; a logged or registered model loaded back.

An image classifier's pyfunc takes a DataFrame with a binary ``image`` column (encoded images; base64 in JSON over
REST, as MLflow reads a binary column) and returns each image's top classes and probabilities
(``predict.classifier``); BERT's takes a ``text`` column with ``[MASK]`` and fills each mask (``predict.fill_mask``).
Loading it
needs this project's package installed beside MindSpore (``mlflow models serve --env-manager local`` from the
project's environment): docs/use-a-model.md."""

from __future__ import annotations

import importlib.metadata
import json
import re
from pathlib import Path

import mlflow
import pandas as pd
from mlflow.models import ModelSignature
from mlflow.types import ColSpec, ParamSchema, ParamSpec, Schema

from trainlib.predict.classifier import ERROR_COLUMN, MindirClassifier
from trainlib.predict.export import DESCRIPTION_FILE, EXAMPLE_FILE, FILL_MASK, IMAGE_CLASSIFICATION, MINDIR_FILE
from trainlib.predict.fill_mask import FILL_MASK_COLUMNS, MindirFillMask

MODEL_CODE = Path(__file__).with_name("pyfunc_model.py")  # what MLflow runs to build a logged model
MODEL_NAME = "model"  # the logged model's name in its run (``runs:/<run id>/model``)
TOP_K = 5
BATCH_SIZE = 250
# each task's input column and type: encoded images (base64 in JSON over REST, as MLflow reads a binary column), texts
INPUT_COLUMNS = {IMAGE_CLASSIFICATION: ("image", "binary"), FILL_MASK: ("text", "string")}
_RUN_ID = re.compile(r"[0-9a-f]{32}")


class ModelUriError(ValueError):
    """A model reference that is none of ``models:/…``, ``runs:/…`` or a run id."""


class MindsporeModel(mlflow.pyfunc.PythonModel):
    """The pyfunc of a training run's model: its MindIR network with its description, by task (an image
    classifier, ``MindirClassifier``; BERT filling masks, ``MindirFillMask``)."""

    def load_context(self, context) -> None:
        description = json.loads(Path(context.artifacts["description"]).read_text())
        self._task = description["task"]
        loaded = MindirClassifier if self._task == IMAGE_CLASSIFICATION else MindirFillMask
        self._model = loaded(context.artifacts["network"], description)

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


def signature(task: str, top_k: int = TOP_K) -> ModelSignature:
    """What a model of ``task`` takes and gives (``INPUT_COLUMNS``; ``prediction_columns``, ``FILL_MASK_COLUMNS``)."""
    column, kind = INPUT_COLUMNS[task]
    if task == IMAGE_CLASSIFICATION:
        ranks = range(1, top_k + 1)
        outputs = [
            *(ColSpec("string", f"class_{k}") for k in ranks),
            *(ColSpec("double", f"probability_{k}") for k in ranks),
            ColSpec("string", ERROR_COLUMN),
        ]
    else:
        outputs = [ColSpec("string", name) for name in FILL_MASK_COLUMNS]
    return ModelSignature(
        inputs=Schema([ColSpec(kind, column)]),
        outputs=Schema(outputs),
        params=ParamSchema([ParamSpec(name, "long", value) for name, value in default_params(task).items()]),
    )


def requirements() -> list[str]:
    """What the pyfunc imports beside this project's own package, pinned to the versions that logged it."""
    packages = ("mindspore", "mlflow", "numpy", "pandas", "tokenizers")
    return [f"{name}=={importlib.metadata.version(name)}" for name in packages]


def log_model(folder: str | Path, *, registered_name: str | None = None) -> str | None:
    """Log the model folder ``folder`` to the active run as its MLflow model ``model`` (a version of the
    registered model ``registered_name`` when given); its URI, or None outside a run."""
    if mlflow.active_run() is None:
        return None
    folder = Path(folder)
    task = json.loads((folder / DESCRIPTION_FILE).read_text())["task"]
    column, kind = INPUT_COLUMNS[task]
    example = (folder / EXAMPLE_FILE).read_bytes()
    info = mlflow.pyfunc.log_model(
        name=MODEL_NAME,
        python_model=str(MODEL_CODE),
        artifacts={"network": str(folder / MINDIR_FILE), "description": str(folder / DESCRIPTION_FILE)},
        signature=signature(task),
        input_example=pd.DataFrame({column: [example if kind == "binary" else example.decode()]}),
        pip_requirements=requirements(),
        registered_model_name=registered_name,
    )
    return info.model_uri


def model_uri(reference: str) -> str:
    """``reference`` as a URI MLflow loads: ``models:/<name>@<alias>``, ``models:/<name>/<version>`` and
    ``runs:/<run id>/model`` as given, a bare run id as its run's model."""
    if reference.startswith(("models:/", "runs:/")):
        return reference
    if _RUN_ID.fullmatch(reference):
        return f"runs:/{reference}/{MODEL_NAME}"
    raise ModelUriError(
        f"predict.model {reference!r} names no model: give models:/<name>@<alias> (e.g. models:/baseline@champion), "
        "models:/<name>/<version>, runs:/<run id>/model or a run id"
    )


def load_model(reference: str) -> mlflow.pyfunc.PyFuncModel:
    """The model ``reference`` names (``model_uri``)."""
    return mlflow.pyfunc.load_model(model_uri(reference))


def model_classes(model: mlflow.pyfunc.PyFuncModel) -> list[str]:
    """The class names of a loaded model (``load_model``) by output."""
    return model.unwrap_python_model().classes


def predictor(model: mlflow.pyfunc.PyFuncModel, *, top_k: int):
    """A function of encoded images to an image ``model``'s predictions (its pyfunc, with its schema checks)."""
    params = {"top_k": top_k}
    column, _ = INPUT_COLUMNS[IMAGE_CLASSIFICATION]
    return lambda images: model.predict(pd.DataFrame({column: images}), params=params)
