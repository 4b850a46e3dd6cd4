"""``ModelHooks``: a training's saved model folder logged to its MLflow run as the run's MLflow model.

A catalog entry marks a model folder in its metadata::

    "{recipe}.{training}.model":
      type: pipelines.catalog.ModelDataset
      filepath: data/06_models/{recipe}/{training}_model
      metadata:
        mlflow_model:
          name: "{recipe}.{training}"   # the registered model's name, when model.register is true
          training: "{training}"         # optional: the training's child run holds it (tracking.trainings)

After each save the folder becomes the run's model ``model`` (``tracking.models``: a pyfunc running the MindIR
network), and, with ``model.register: true``, a new version of the registered model ``name``."""

from __future__ import annotations

from contextlib import nullcontext
from pathlib import Path

from kedro.framework.hooks import hook_impl

from pipelines.params import ModelParams
from pipelines.tracking.models import log_model
from pipelines.tracking.trainings import training_run

METADATA_KEY = "mlflow_model"


class ModelHooks:
    """Logs each saved catalog dataset that declares ``mlflow_model`` (see the module docstring)."""

    def __init__(self) -> None:
        self._catalog = None
        self._register = False

    @hook_impl
    def before_pipeline_run(self, run_params: dict, pipeline, catalog) -> None:
        self._catalog = catalog
        self._register = ModelParams.model_validate(catalog.load("params:model")).register_model

    @hook_impl
    def after_dataset_saved(self, dataset_name: str, data, node) -> None:
        catalog = self._catalog
        if catalog is None or dataset_name not in catalog:
            return
        dataset = catalog.get(dataset_name)
        spec = (getattr(dataset, "metadata", None) or {}).get(METADATA_KEY)
        if not spec:
            return
        # Kedro has no public accessor for a dataset's file; ``_describe()`` is the one every dataset implements
        # (as in hooks.artifacts)
        folder = Path(dataset._describe()["filepath"])
        training = spec.get("training")
        with training_run(training) if training else nullcontext():
            log_model(folder, registered_name=spec["name"] if self._register else None)
