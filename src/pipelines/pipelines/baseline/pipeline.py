"""``baseline`` pipeline: build -> Momentum training -> evaluation, the modular pipeline ``baseline``."""

from kedro.pipeline import Pipeline, node, pipeline

from pipelines.shared import build_network_node, evaluation_node, namespaced, training_inputs

from .nodes import evaluate_baseline, train_baseline


def create_pipeline(**kwargs) -> Pipeline:
    """Nodes ``baseline.build_network``, ``baseline.train``, ``baseline.evaluate``."""
    return namespaced(
        pipeline(
            [
                build_network_node(),
                node(
                    train_baseline,
                    ["initial_weights", *training_inputs("baseline", "boost")],
                    ["final_checkpoint", "history"],
                    name="train",
                ),
                evaluation_node(evaluate_baseline),
            ]
        ),
        "baseline",
    )
