"""``report`` pipeline: MLflow runs of the recipes -> comparison table -> figures."""

from kedro.pipeline import Pipeline, node, pipeline

from .nodes import compare_recipes, plot_recipes


def create_pipeline(**kwargs) -> Pipeline:
    return pipeline(
        [
            node(
                compare_recipes,
                "params:report",
                ["report_table", "report_histories", "report_explained_variance"],
                name="compare_recipes",
            ),
            node(
                plot_recipes,
                ["report_histories", "report_explained_variance", "params:report"],
                ["report_top1_vs_epoch", "report_top1_vs_time", "report_loss", "report_explained_variance_plot"],
                name="plot_recipes",
            ),
        ]
    )
