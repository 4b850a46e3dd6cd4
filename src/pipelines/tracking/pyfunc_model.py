"""The MLflow model of a training run, as MLflow's models-from-code reads it: ``tracking.models.log_model`` logs this
file beside the model's artifacts and the package ``mindir_serving`` (its ``code_paths``), and MLflow runs it to
build the model when it loads one (no pickled object). It imports only MLflow and that package, so the model loads
where this project is not installed."""

import mlflow

from mindir_serving.pyfunc import MindsporeModel

mlflow.models.set_model(MindsporeModel())
