"""Nodes of the ``report`` pipeline: read the recipes' MLflow runs, write the comparison."""

from __future__ import annotations

import logging

import pandas as pd
from matplotlib.figure import Figure

from pipelines import tracking
from pipelines.tracking import MlflowRunReader
from trainlib.params import ReportParams, TargetParams
from trainlib.readable import counted
from trainlib.report.compare import compare
from trainlib.report.differences import by_how_much, readable
from trainlib.report.figures import compared_histories, figures

logger = logging.getLogger(__name__)


def compare_recipes(
    report: ReportParams, target: TargetParams
) -> tuple[pd.DataFrame, pd.DataFrame, pd.DataFrame, pd.DataFrame, str]:
    """The comparison table, the per-epoch histories, dim_reduce's explained variance, and by how much the recipes
    differ (a table in points and ``summary.md``): from the newest study of the experiment where it compared the
    same recipes (means and 95 % intervals over its seeds; the table's rows and histories of the recipes it trained
    are its seeds' means), else from the single runs at equal budget; single runs of unequal budget are left out,
    and the summary says why. The report's run is tagged with the runs behind the table (``compared_runs``), which
    its closing link charts.

    Runs are read from the tracking URI and experiment kedro-mlflow set up from ``mlflow.yml``
    for this run itself, so the report reads the same store the training pipelines wrote.
    """
    reader = MlflowRunReader.of_active_run()
    comparison = compare(reader, report.recipes, target.top1, dict(report.run_ids))
    differences, left_out = by_how_much(comparison.finals, reader, settings=comparison.settings)
    # the runs behind the table's rows, so the closing link charts what the table, figures and summary show
    tracking.record_compared_runs(comparison.read_runs)
    for row in comparison.table.itertuples():
        if row.run_status != "missing":
            logger.info("%s", recipe_line(row))
    summary = readable(differences, left_out, target_top1=target.top1)
    logger.info("By how much:\n%s", summary)
    return comparison.table, comparison.histories, comparison.explained_variance, differences, summary


def recipe_line(row) -> str:
    """A table row as the log's line: accuracy, budget, time, speed, the images an epoch saw, target. A figure the row
    has not (dim_reduce's control: its times are stage 2's run's) is left out, not printed as ``nan``."""
    parts = [f"top-1 {100 * row.top1:.2f}%, top-5 {100 * row.top5:.2f}%", counted(int(row.epochs), "epoch")]
    if pd.notna(row.train_time_s):
        parts.append(f"{row.train_time_s:.0f} s training, {row.images_per_s:.0f} img/s")
    if pd.notna(row.epoch_images):
        # fewer than the split: an epoch trains on full batches, the last partial one is dropped
        split = f" of the {row.train_images} train images" if pd.notna(row.train_images) else ""
        parts.append(f"an epoch trains on {row.epoch_images}{split} (full batches)")
    if pd.notna(row.train_time_s):
        reached = "not reached" if pd.isna(row.time_to_target_s) else f"after {row.time_to_target_s:.0f} s"
        parts.append(f"target {100 * row.target_top1:.0f}% {reached}")
    left_out = f" (not compared: {row.left_out})" if isinstance(row.left_out, str) and row.left_out else ""
    return f"{row.recipe} ({row.source}): {', '.join(parts)}{left_out}"


def plot_recipes(
    histories: pd.DataFrame, explained_variance: pd.DataFrame, table: pd.DataFrame, target: TargetParams
) -> tuple[Figure, Figure, Figure, dict[str, Figure]]:
    """Top-1 against epoch and training time, loss against epoch, of the recipes compared side by side (a run of
    unequal budget is left out, as the table's ``left_out`` says); dim_reduce's explained variance only when there
    is a dim_reduce run (an empty mapping writes no file)."""
    drawn = figures(compared_histories(histories, table), explained_variance, target.top1)
    variance = {"explained_variance.png": drawn["explained_variance"]} if "explained_variance" in drawn else {}
    return drawn["top1_vs_epoch"], drawn["top1_vs_time"], drawn["loss"], variance
