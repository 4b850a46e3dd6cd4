"""``dim_reduce`` pipeline: stage 1 -> trajectory -> PCA -> P-BFGS stage 2, and a Momentum control, each evaluated.

The modular pipeline ``dim_reduce``, one nested namespace per stage, each a box in kedro-viz that expands:
``dim_reduce.stage1`` (build, Momentum keeping the weight trajectory, evaluate), ``dim_reduce.trajectory_pca``,
``dim_reduce.stage2`` (P-BFGS, evaluate), ``dim_reduce.control`` (Momentum for the same epochs, evaluate) and
``dim_reduce.comparison``. The build, evaluate and export nodes are the image training template's, and the three
trainings read its ``CONTEXT_INPUTS`` as its ``train`` does; their nodes are tagged ``training_run``, so each logs
into an MLflow child run of its own (``stage1``, ``stage2``, ``control``; ``hooks.training_runs``); stage 2's and
the control's also hold their exported models (``hooks.models``).
"""

from kedro.pipeline import Pipeline, node, pipeline

from pipelines.modular import TRAINING_RUN_TAG, namespaced
from pipelines.training.pipeline import CONTEXT_INPUTS, RECIPE, build_node, evaluate_node, export_node
from trainlib.params.recipe_spec import recipe_specs

from .nodes import collect_trajectory, compare_runs, fit_pca, train_control, train_stage1, train_stage2

NAMESPACE = "dim_reduce"
STAGE1_CHECKPOINT = f"{NAMESPACE}.stage1.final_checkpoint"
# The trainings, each a namespace of its own under dim_reduce: the recipe's one that gives no result row (stage 1),
# then where its result rows train (stage 2, the control)
_SPEC = recipe_specs()[NAMESPACE]
TRAININGS = (
    *(name for name, _ in _SPEC.other_trainings),
    *_SPEC.result_trainings.values(),
)


def create_pipeline(**kwargs) -> Pipeline:
    """Nodes ``dim_reduce.<stage>.<node>``: ``dim_reduce.stage1.train_stage1``, ``dim_reduce.stage2.evaluate``, …"""
    # the initial weights are built outside the training's child run: that node logs nothing. Stage 1 exports no
    # model: its network is where stage 2 and the control start, the pipeline's results are theirs. Each training's
    # node reads the shared sections in its child run, which so logs them beside the training's own
    stage1 = pipeline([build_node()]) + pipeline(
        [
            node(
                train_stage1,
                ["initial_weights", *CONTEXT_INPUTS, f"params:{RECIPE}", "params:boost"],
                ["final_checkpoint", "history", "step_history", "trajectory_index"],
                name="train_stage1",
            ),
            evaluate_node(),
        ],
        tags=TRAINING_RUN_TAG,
    )
    trajectory_pca = pipeline(
        [
            node(
                collect_trajectory,
                ["trajectory_index", "class_index", "params:network", "params:collect", "params:pca"],
                "selected_trajectory",
                name="collect_trajectory",
            ),
            node(
                fit_pca,
                ["selected_trajectory", "class_index", "params:network", "params:pca"],
                ["pca_matrix", "explained_variance", "explained_variance_plot"],
                name="fit_pca",
            ),
        ]
    )
    stage2 = pipeline(
        [
            node(
                train_stage2,
                ["stage1_checkpoint", "pca_matrix", *CONTEXT_INPUTS, "params:stage2"],
                ["final_checkpoint", "history", "step_history", "steps"],
                name="train_stage2",
            ),
            evaluate_node(),
        ],
        tags=TRAINING_RUN_TAG,
    ) + pipeline([export_node()])
    control = pipeline(
        [
            node(
                train_control,
                [
                    "stage1_checkpoint",
                    *CONTEXT_INPUTS,
                    "params:stage1",
                    "params:stage2",
                    "params:control",
                    "params:boost",
                ],
                ["final_checkpoint", "history", "step_history"],
                name="train_control",
            ),
            evaluate_node(),
        ],
        tags=TRAINING_RUN_TAG,
    ) + pipeline([export_node()])
    # each training's report, as compare_runs' argument of the training's name
    reports = {training: f"{training}_report" for training in TRAININGS}
    comparison = pipeline([node(compare_runs, reports, "comparison", name="compare_runs")])
    sections = {name: f"{NAMESPACE}.{name}" for name in (*TRAININGS, "collect", "pca")}
    return (
        namespaced(stage1, f"{NAMESPACE}.stage1", sections={RECIPE: f"{NAMESPACE}.stage1"})
        + namespaced(
            trajectory_pca,
            f"{NAMESPACE}.trajectory_pca",
            inputs={"trajectory_index": f"{NAMESPACE}.stage1.trajectory_index"},
            sections=sections,
        )
        + namespaced(
            stage2,
            f"{NAMESPACE}.stage2",
            inputs={"stage1_checkpoint": STAGE1_CHECKPOINT, "pca_matrix": f"{NAMESPACE}.trajectory_pca.pca_matrix"},
            sections=sections,
        )
        + namespaced(
            control, f"{NAMESPACE}.control", inputs={"stage1_checkpoint": STAGE1_CHECKPOINT}, sections=sections
        )
        + namespaced(
            comparison,
            f"{NAMESPACE}.comparison",
            inputs={f"{t}_report": f"{NAMESPACE}.{t}.eval_report" for t in TRAININGS},
        )
    )
