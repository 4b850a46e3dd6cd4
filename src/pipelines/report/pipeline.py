"""``report`` pipeline: MLflow runs of the recipes -> comparison table -> figures, the modular pipeline
``report``."""

from kedro.pipeline import Pipeline, node, pipeline

from pipelines.modular import namespaced

from .nodes import compare_recipes, plot_recipes


def create_pipeline(**kwargs) -> Pipeline:
    """Nodes ``report.compare_recipes``, ``report.plot_recipes``."""
    return namespaced(
        pipeline(
            [
                node(
                    compare_recipes,
                    ["params:report", "params:target"],
                    ["table", "histories", "explained_variance", "differences", "summary"],
                    name="compare_recipes",
                ),
                node(
                    plot_recipes,
                    ["histories", "explained_variance", "table", "params:target"],
                    ["top1_vs_epoch_plot", "top1_vs_time_plot", "loss_plot", "explained_variance_plot"],
                    name="plot_recipes",
                ),
            ]
        ),
        "report",
    )
