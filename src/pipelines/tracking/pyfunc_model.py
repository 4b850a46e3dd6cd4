"""The MLflow model of a training run, as MLflow's models-from-code reads it: ``tracking.models.log_model`` logs this
file beside the model's artifacts, and MLflow runs it to build the model when it loads one (no pickled object)."""

import mlflow

from pipelines.tracking.models import MindsporeModel

mlflow.models.set_model(MindsporeModel())
