"""``adasum`` pipeline: the Momentum recipe with the ranks' weight deltas combined by Adasum (seed 004), as the image
training template under the namespace ``adasum``: ``adasum.build_network`` -> ``adasum.train`` -> ``adasum.evaluate``.
A rank count that is not a power of two is refused before any worker starts."""

from kedro.pipeline import Pipeline

from pipelines.training.pipeline import training_pipeline


def create_pipeline(**kwargs) -> Pipeline:
    return training_pipeline("adasum")
