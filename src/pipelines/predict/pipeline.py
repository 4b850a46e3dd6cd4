"""``predict`` pipeline: a trained model from MLflow and images -> predictions and the images it could not read,
the modular pipeline ``predict``."""

from kedro.pipeline import Pipeline, node, pipeline

from pipelines.modular import namespaced

from .nodes import predict_images


def create_pipeline(**kwargs) -> Pipeline:
    """Node ``predict.predict_images``."""
    return namespaced(
        pipeline([node(predict_images, "params:predict", ["predictions", "bad_images"], name="predict_images")]),
        "predict",
    )
