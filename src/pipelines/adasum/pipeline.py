"""``adasum`` pipeline: build -> Momentum training with Adasum across ranks -> evaluation."""

from kedro.pipeline import Pipeline, node, pipeline

from pipelines.shared import build_network_pipeline, evaluation_pipeline, training_inputs

from .nodes import train_adasum


def create_pipeline(**kwargs) -> Pipeline:
    return (
        build_network_pipeline("adasum_initial_weights", name="build_adasum_network")
        + pipeline(
            [
                node(
                    train_adasum,
                    ["adasum_initial_weights", *training_inputs("adasum")],
                    ["adasum_final_checkpoint", "adasum_history"],
                    name="train_adasum",
                ),
            ]
        )
        + evaluation_pipeline("adasum_final_checkpoint", "adasum_eval_report", "adasum")
    )
