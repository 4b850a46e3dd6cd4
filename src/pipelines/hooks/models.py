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

from kedro.framework.hooks import hook_impl

from pipelines.hooks.artifacts import declared_file, in_training_run
from pipelines.tracking.models import log_model
from trainlib.params import ModelParams

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
        declared = declared_file(self._catalog, dataset_name, METADATA_KEY)
        if declared is None:
            return
        folder, spec = declared
        with in_training_run(spec.get("training")):
            log_model(folder, registered_name=spec["name"] if self._register else None)
