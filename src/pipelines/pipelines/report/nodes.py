"""Nodes of the ``report`` pipeline: read the recipes' MLflow runs, write the comparison."""

from __future__ import annotations

import logging

import pandas as pd
from matplotlib.figure import Figure

from pipelines import tracking
from pipelines.params import ReportParams
from pipelines.report.compare import compare, figures
from pipelines.report.differences import by_how_much, readable
from pipelines.tracking import MlflowRunReader

logger = logging.getLogger(__name__)


def compare_recipes(report: ReportParams) -> tuple[pd.DataFrame, pd.DataFrame, pd.DataFrame, pd.DataFrame, str]:
    """The comparison table, the per-epoch histories, dim_reduce's explained variance, and by how much the recipes
    differ (a table and its readable Markdown): from the newest study of the experiment where it compared the same
    recipes (means and 95 % intervals over its seeds), else from the single runs compared.

    Runs are read from the tracking URI and experiment kedro-mlflow set up from ``mlflow.yml``
    for this run itself, so the report reads the same store the training pipelines wrote.
    """
    reader = MlflowRunReader.of_active_run()
    comparison = compare(reader, report.recipes, report.target_top1, report.run_ids.model_dump())
    differences = by_how_much(comparison.finals, reader)
    tracking.record_compared_runs([run_id for run_id in comparison.table["run_id"] if isinstance(run_id, str)])
    for row in comparison.table.itertuples():
        if row.run_status == "missing":
            continue
        logger.info(
            "%s: top-1 %.2f%%, top-5 %.2f%%, %d epochs, %.0f s training, %.0f img/s, target %.0f%% %s",
            row.recipe,
            100 * row.top1,
            100 * row.top5,
            row.epochs,
            row.train_time_s,
            row.images_per_s,
            100 * row.target_top1,
            "not reached" if pd.isna(row.time_to_target_s) else f"after {row.time_to_target_s:.0f} s",
        )
    summary = readable(differences)
    logger.info("By how much (%s):\n%s", ", ".join(sorted(set(differences["source"]))), summary)
    return comparison.table, comparison.histories, comparison.explained_variance, differences, summary


def plot_recipes(
    histories: pd.DataFrame, explained_variance: pd.DataFrame, report: ReportParams
) -> tuple[Figure, Figure, Figure, Figure]:
    """Top-1 against epoch and training time, loss against epoch, dim_reduce's explained variance."""
    drawn = figures(histories, explained_variance, report.target_top1)
    return drawn["top1_vs_epoch"], drawn["top1_vs_time"], drawn["loss"], drawn["explained_variance"]
