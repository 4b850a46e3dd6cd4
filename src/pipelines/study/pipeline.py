"""``study`` pipeline: the training context and every recipe's section -> the recipes over several seeds ->
statistics -> figure, the modular pipeline ``study``."""

from kedro.pipeline import Pipeline, node, pipeline

from pipelines.modular import namespaced
from pipelines.training.pipeline import context_node

from .nodes import plot_study, plot_tuning, prepare_inputs, run_recipes, summarise_study


def create_pipeline(**kwargs) -> Pipeline:
    """Nodes ``study.training_context``, ``study.prepare_inputs``, ``study.run``, ``study.summarise``,
    ``study.plot``, ``study.plot_tuning``."""
    return namespaced(
        pipeline(
            [
                context_node(),
                node(
                    prepare_inputs,
                    [
                        "training_context",
                        "params:baseline",
                        "params:thor",
                        "params:dim_reduce",
                        "params:adasum",
                        "params:boost",
                        "params:thor_bert",
                        "params:study",
                    ],
                    "inputs",
                    name="prepare_inputs",
                ),
                node(
                    run_recipes,
                    ["inputs", "params:study", "params:target"],
                    ["runs", "curves", "tuning_choices"],
                    name="run",
                ),
                node(summarise_study, "runs", ["summary", "paired"], name="summarise"),
                node(plot_study, ["curves", "params:target", "params:thor_bert"], "top1_vs_time_plot", name="plot"),
                node(
                    plot_tuning,
                    ["params:study", "tuning_choices"],
                    ["tuning_history_plots", "tuning_importance_plots"],
                    name="plot_tuning",
                ),
            ]
        ),
        "study",
    )
