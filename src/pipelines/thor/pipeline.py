"""``thor`` pipeline: build -> THOR training -> evaluation."""

from kedro.pipeline import Pipeline, node, pipeline

from pipelines.shared import evaluation_pipeline, training_inputs

from .nodes import build_thor_network, train_thor


def create_pipeline(**kwargs) -> Pipeline:
    return pipeline(
        [
            node(
                build_thor_network,
                ["params:model", "params:thor", "class_index", "params:runtime"],
                "thor_initial_weights",
                name="build_thor_network",
            ),
            node(
                train_thor,
                ["thor_initial_weights", *training_inputs("thor")],
                ["thor_final_checkpoint", "thor_history"],
                name="train_thor",
            ),
        ]
    ) + evaluation_pipeline("thor_final_checkpoint", "thor_eval_report", "thor")
