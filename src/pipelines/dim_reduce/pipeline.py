"""``dim_reduce`` pipeline: stage 1 -> trajectory -> PCA -> P-BFGS stage 2 -> evaluation with a control."""

from kedro.pipeline import Pipeline, node, pipeline

from pipelines.shared import build_network_pipeline, evaluation_pipeline, training_inputs

from .nodes import collect_trajectory, compare_runs, fit_pca, train_control, train_stage1, train_stage2

TRAINING_INPUTS = training_inputs("dim_reduce")


def create_pipeline(**kwargs) -> Pipeline:
    return (
        build_network_pipeline("dim_reduce_initial_weights", name="build_dim_reduce_network")
        + pipeline(
            [
                node(
                    train_stage1,
                    ["dim_reduce_initial_weights", *TRAINING_INPUTS, "params:boost"],
                    ["stage1_checkpoint", "stage1_history", "trajectory_index"],
                    name="train_stage1",
                ),
                node(
                    collect_trajectory,
                    ["trajectory_index", "class_index", "params:model", "params:dim_reduce"],
                    "selected_trajectory",
                    name="collect_trajectory",
                ),
                node(
                    fit_pca,
                    ["selected_trajectory", "class_index", "params:model", "params:dim_reduce"],
                    ["pca_matrix", "pca_explained_variance", "pca_explained_variance_plot"],
                    name="fit_pca",
                ),
                node(
                    train_stage2,
                    ["stage1_checkpoint", "pca_matrix", *TRAINING_INPUTS],
                    ["stage2_checkpoint", "stage2_history", "stage2_steps"],
                    name="train_stage2",
                ),
                node(
                    train_control,
                    ["stage1_checkpoint", *TRAINING_INPUTS, "params:boost"],
                    ["control_checkpoint", "control_history"],
                    name="train_control",
                ),
                node(
                    compare_runs,
                    ["stage1_eval_report", "stage2_eval_report", "control_eval_report"],
                    "dim_reduce_report",
                    name="compare_runs",
                ),
            ]
        )
        + evaluation_pipeline("stage1_checkpoint", "stage1_eval_report", "stage1", child_run="stage1")
        + evaluation_pipeline("stage2_checkpoint", "stage2_eval_report", "stage2", child_run="stage2")
        + evaluation_pipeline("control_checkpoint", "control_eval_report", "control", child_run="control")
    )
