"""MLflow models: a training's model folder (``trainlib.predict.export``) logged to its run as an MLflow pyfunc
model, registered under a name when asked; a logged or registered model loaded back.

The pyfunc is ``mindir_serving.pyfunc``: an image classifier takes a binary ``image`` column and returns each image's
top classes, BERT's takes a ``text`` column and fills each mask. The package ``mindir_serving`` is logged inside the
model (``code_paths``) and the model's requirements pin what it imports, so a logged model loads in any Python with
those requirements, this project's package or not (``mlflow models serve`` with MLflow's own environment managers
included): docs/use-a-model.md."""

from __future__ import annotations

import importlib.metadata
import json
import re
import shutil
import tempfile
from pathlib import Path

import mlflow
import pandas as pd
from mlflow.models import ModelSignature
from mlflow.types import ColSpec, ParamSchema, ParamSpec, Schema

import mindir_serving
from mindir_serving.classifier import ERROR_COLUMN, WARNING_COLUMN
from mindir_serving.files import DESCRIPTION_FILE, EXAMPLE_FILE, IMAGE_CLASSIFICATION, MINDIR_FILE
from mindir_serving.fill_mask import FILL_MASK_COLUMNS
from mindir_serving.pyfunc import (
    INPUT_COLUMNS,
    REQUIREMENTS,
    TOP_K,
    MindsporeModel,  # noqa: F401  (a model logged before issue 43 imports it from here)
    default_params,
)

MODEL_CODE = Path(__file__).with_name("pyfunc_model.py")  # what MLflow runs to build a logged model
MODEL_NAME = "model"  # the logged model's name in its run (``runs:/<run id>/model``)
_RUN_ID = re.compile(r"[0-9a-f]{32}")


class ModelUriError(ValueError):
    """A model reference that is none of ``models:/…``, ``runs:/…`` or a run id."""


def signature(task: str, top_k: int = TOP_K) -> ModelSignature:
    """What a model of ``task`` takes and gives (``INPUT_COLUMNS``; ``prediction_columns``, ``FILL_MASK_COLUMNS``)."""
    column, kind = INPUT_COLUMNS[task]
    if task == IMAGE_CLASSIFICATION:
        ranks = range(1, top_k + 1)
        outputs = [
            *(ColSpec("string", f"class_{k}") for k in ranks),
            *(ColSpec("double", f"probability_{k}") for k in ranks),
            ColSpec("string", ERROR_COLUMN),
            ColSpec("string", WARNING_COLUMN),
        ]
    else:
        outputs = [ColSpec("string", name) for name in FILL_MASK_COLUMNS]
    return ModelSignature(
        inputs=Schema([ColSpec(kind, column)]),
        outputs=Schema(outputs),
        params=ParamSchema([ParamSpec(name, "long", value) for name, value in default_params(task).items()]),
    )


def requirements(task: str) -> list[str]:
    """What a model of ``task`` imports beside the standard library and its shipped ``mindir_serving``
    (``mindir_serving.pyfunc.REQUIREMENTS``), pinned to the versions that logged it."""
    return [f"{name}=={importlib.metadata.version(name)}" for name in REQUIREMENTS[task]]


def log_model(folder: str | Path, *, registered_name: str | None = None) -> str | None:
    """Log the model folder ``folder`` to the active run as its MLflow model ``model`` (a version of the
    registered model ``registered_name`` when given); its URI, or None outside a run."""
    if mlflow.active_run() is None:
        return None
    folder = Path(folder)
    task = json.loads((folder / DESCRIPTION_FILE).read_text())["task"]
    column, kind = INPUT_COLUMNS[task]
    example = (folder / EXAMPLE_FILE).read_bytes()
    with tempfile.TemporaryDirectory() as staging:
        shipped = Path(staging) / "mindir_serving"  # the package's sources, without the bytecode beside them
        shutil.copytree(Path(mindir_serving.__file__).parent, shipped, ignore=shutil.ignore_patterns("__pycache__"))
        info = mlflow.pyfunc.log_model(
            name=MODEL_NAME,
            python_model=str(MODEL_CODE),
            code_paths=[str(shipped)],
            artifacts={"network": str(folder / MINDIR_FILE), "description": str(folder / DESCRIPTION_FILE)},
            signature=signature(task),
            input_example=pd.DataFrame({column: [example if kind == "binary" else example.decode()]}),
            pip_requirements=requirements(task),
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
