"""The recipe's Kedro pipeline: the project's image template under the namespace ``nesterov``."""

from kedro.pipeline import Pipeline

from pipelines.training.pipeline import training_pipeline


def create_pipeline(**kwargs) -> Pipeline:
    return training_pipeline("nesterov")
