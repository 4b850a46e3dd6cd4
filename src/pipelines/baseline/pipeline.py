"""``baseline`` pipeline: build -> Momentum training -> evaluation."""

from kedro.pipeline import Pipeline, node, pipeline

from pipelines.shared import build_network_pipeline, evaluation_pipeline, training_inputs

from .nodes import train_baseline


def create_pipeline(**kwargs) -> Pipeline:
    return (
        build_network_pipeline("baseline_initial_weights", name="build_baseline_network")
        + pipeline(
            [
                node(
                    train_baseline,
                    ["baseline_initial_weights", *training_inputs("baseline"), "params:boost"],
                    ["baseline_final_checkpoint", "baseline_history"],
                    name="train_momentum",
                ),
            ]
        )
        + evaluation_pipeline("baseline_final_checkpoint", "baseline_eval_report", "baseline")
    )
