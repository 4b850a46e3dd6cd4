"""``study`` pipeline: the data pipeline's manifest and class index and the configuration -> each recipe's own
pipeline over several seeds -> statistics -> figure, the modular pipeline ``study``."""

from kedro.pipeline import Pipeline, node, pipeline

from pipelines.modular import namespaced

from .nodes import plot_study, plot_tuning, run_recipes, summarise_study


def create_pipeline(**kwargs) -> Pipeline:
    """Nodes ``study.run``, ``study.summarise``, ``study.plot``, ``study.plot_tuning``."""
    return namespaced(
        pipeline(
            [
                node(
                    run_recipes,
                    ["manifest", "class_index", "parameters", "params:study", "params:target"],
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
