"""``dim_reduce`` pipeline: stage 1 -> trajectory -> PCA -> P-BFGS stage 2 -> evaluation with a control.

The modular pipeline ``dim_reduce``, one nested namespace per stage, each a box in kedro-viz that expands:
``dim_reduce.stage1`` (build, Momentum keeping the weight trajectory), ``dim_reduce.trajectory_pca``,
``dim_reduce.stage2`` (P-BFGS), ``dim_reduce.control`` (Momentum for the same epochs) and
``dim_reduce.evaluation`` (the three evaluations and their comparison). A stage's datasets carry its namespace
(``dim_reduce.stage2.final_checkpoint``); the evaluations write theirs into their training's
(``dim_reduce.stage2.eval_report``), so a training's files and MLflow artifacts go together.
"""

from kedro.pipeline import Pipeline, node, pipeline

from pipelines.shared import build_network_node, evaluation_node, namespaced, training_inputs

from .nodes import (
    collect_trajectory,
    compare_runs,
    evaluate_control,
    evaluate_stage1,
    evaluate_stage2,
    fit_pca,
    train_control,
    train_stage1,
    train_stage2,
)

NAMESPACE = "dim_reduce"
STAGE1_CHECKPOINT = f"{NAMESPACE}.stage1.final_checkpoint"


def create_pipeline(**kwargs) -> Pipeline:
    """Nodes ``dim_reduce.<stage>.<node>``: ``dim_reduce.stage1.train``, ``dim_reduce.stage2.train``, …"""
    stage1 = pipeline(
        [
            build_network_node(),
            node(
                train_stage1,
                ["initial_weights", *training_inputs("dim_reduce.stage1", "boost")],
                ["final_checkpoint", "history", "trajectory_index"],
                name="train",
            ),
        ]
    )
    trajectory_pca = pipeline(
        [
            node(
                collect_trajectory,
                [
                    "trajectory_index",
                    "class_index",
                    "params:model",
                    "params:dim_reduce.collect",
                    "params:dim_reduce.pca",
                ],
                "selected_trajectory",
                name="collect_trajectory",
            ),
            node(
                fit_pca,
                ["selected_trajectory", "class_index", "params:model", "params:dim_reduce.pca"],
                ["pca_matrix", "explained_variance", "explained_variance_plot"],
                name="fit_pca",
            ),
        ]
    )
    stage2 = pipeline(
        [
            node(
                train_stage2,
                ["stage1_checkpoint", "pca_matrix", *training_inputs("dim_reduce.stage2")],
                ["final_checkpoint", "history", "steps"],
                name="train",
            ),
        ]
    )
    control = pipeline(
        [
            node(
                train_control,
                [
                    "stage1_checkpoint",
                    *training_inputs("dim_reduce.stage1", "dim_reduce.stage2", "dim_reduce.control", "boost"),
                ],
                ["final_checkpoint", "history"],
                name="train",
            ),
        ]
    )
    evaluation = pipeline(
        [
            evaluation_node(evaluate_stage1, "stage1_checkpoint", "stage1_report", "evaluate_stage1"),
            evaluation_node(evaluate_stage2, "stage2_checkpoint", "stage2_report", "evaluate_stage2"),
            evaluation_node(evaluate_control, "control_checkpoint", "control_report", "evaluate_control"),
            node(
                compare_runs,
                ["stage1_report", "stage2_report", "control_report"],
                "comparison",
                name="compare_runs",
            ),
        ]
    )
    trainings = ("stage1", "stage2", "control")
    return (
        namespaced(stage1, f"{NAMESPACE}.stage1")
        + namespaced(
            trajectory_pca,
            f"{NAMESPACE}.trajectory_pca",
            inputs={"trajectory_index": f"{NAMESPACE}.stage1.trajectory_index"},
        )
        + namespaced(
            stage2,
            f"{NAMESPACE}.stage2",
            inputs={"stage1_checkpoint": STAGE1_CHECKPOINT, "pca_matrix": f"{NAMESPACE}.trajectory_pca.pca_matrix"},
        )
        + namespaced(control, f"{NAMESPACE}.control", inputs={"stage1_checkpoint": STAGE1_CHECKPOINT})
        + namespaced(
            evaluation,
            f"{NAMESPACE}.evaluation",
            inputs={f"{t}_checkpoint": f"{NAMESPACE}.{t}.final_checkpoint" for t in trainings},
            outputs={f"{t}_report": f"{NAMESPACE}.{t}.eval_report" for t in trainings},
        )
    )
