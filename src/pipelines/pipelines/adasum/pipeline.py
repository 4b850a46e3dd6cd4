"""``adasum`` pipeline: build -> Momentum training with Adasum across ranks -> evaluation, the modular pipeline
``adasum``."""

from kedro.pipeline import Pipeline, node, pipeline

from pipelines.shared import build_network_node, evaluation_node, namespaced, training_inputs

from .nodes import evaluate_adasum, train_adasum


def create_pipeline(**kwargs) -> Pipeline:
    """Nodes ``adasum.build_network``, ``adasum.train``, ``adasum.evaluate``."""
    return namespaced(
        pipeline(
            [
                build_network_node(),
                node(
                    train_adasum,
                    ["initial_weights", *training_inputs("adasum")],
                    ["final_checkpoint", "history"],
                    name="train",
                ),
                evaluation_node(evaluate_adasum),
            ]
        ),
        "adasum",
    )
