"""``baseline`` pipeline: the Momentum recipe (models repo official/cv/ResNet) with mindspore.boost's options, as
the image training template under the namespace ``baseline``: ``baseline.build_network`` -> ``baseline.train`` ->
``baseline.evaluate``."""

from kedro.pipeline import Pipeline

from pipelines.training.pipeline import training_pipeline


def create_pipeline(**kwargs) -> Pipeline:
    return training_pipeline("baseline")
