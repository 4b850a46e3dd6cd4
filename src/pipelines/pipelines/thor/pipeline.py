"""``thor`` pipeline: build -> THOR training -> evaluation, the modular pipeline ``thor``."""

from kedro.pipeline import Pipeline, node, pipeline

from pipelines.shared import evaluation_node, namespaced, training_inputs

from .nodes import build_thor_network, evaluate_thor, train_thor


def create_pipeline(**kwargs) -> Pipeline:
    """Nodes ``thor.build_network``, ``thor.train``, ``thor.evaluate``."""
    return namespaced(
        pipeline(
            [
                node(
                    build_thor_network,
                    ["params:model", "params:thor.zero_init_last_bn_gamma", "class_index", "params:runtime"],
                    "initial_weights",
                    name="build_network",
                ),
                node(
                    train_thor,
                    ["initial_weights", *training_inputs("thor")],
                    ["final_checkpoint", "history"],
                    name="train",
                ),
                evaluation_node(evaluate_thor),
            ]
        ),
        "thor",
    )
