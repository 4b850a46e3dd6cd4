"""``lars`` pipeline: the Momentum recipe with layer-wise trust ratios (LARS, MLPerf's ResNet-50 optimizer), as the
image training template under the namespace ``lars``: ``lars.build_network`` -> ``lars.train`` -> ``lars.evaluate``."""

from kedro.pipeline import Pipeline

from pipelines.training.pipeline import training_pipeline


def create_pipeline(**kwargs) -> Pipeline:
    return training_pipeline("lars")
