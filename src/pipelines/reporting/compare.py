"""Comparison of the training recipes from their MLflow runs: one table and a few figures.

Each ``kedro run`` is one MLflow run tagged ``pipeline``. A recipe's run holds per-epoch
metrics logged by ``MlflowMetrics`` (step = epoch, names prefixed per training phase, e.g.
``thor_loss`` or ``stage1_loss`` then ``stage2_loss`` for dim_reduce) and the final evaluation
``<final>_top1``/``<final>_top5`` logged without a step (step 0). Some evaluation names equal
per-epoch names (``thor_top1`` is both), so per-epoch values are read from steps >= 1 and the
final evaluation from step 0 only.

Times are training time: the sum of the per-epoch ``epoch_time_s`` (evaluation, data ingest and
dim_reduce's PCA are not counted); ``wall_time_s`` is the whole ``kedro run``.
"""

from __future__ import annotations

import logging
import math
import tempfile
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pandas as pd
from matplotlib.figure import Figure
from mlflow import MlflowClient
from mlflow.entities import Run
from mlflow.exceptions import MlflowException

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class Recipe:
    """Where a recipe's numbers are in its MLflow run.

    ``pipelines``: values of the run's ``pipeline`` tag that are runs of this recipe.
    ``phases``: per-epoch metric prefixes, in the order they trained (epochs continue across them).
    ``final``: prefix of the final evaluation metrics ``<final>_top1`` and ``<final>_top5``.
    """

    name: str
    pipelines: tuple[str, ...]
    phases: tuple[str, ...]
    final: str

    @property
    def required_metrics(self) -> tuple[str, ...]:
        """Metrics a complete run has; a partial rerun (``--nodes=...``) lacks some of them."""
        return (f"{self.phases[0]}loss", f"{self.final}_top1")


RECIPES: dict[str, Recipe] = {
    recipe.name: recipe
    for recipe in (
        Recipe("baseline", ("baseline", "__default__"), ("",), "baseline"),
        Recipe("dim_reduce", ("dim_reduce",), ("stage1_", "stage2_"), "stage2"),
        Recipe("thor", ("thor",), ("thor_",), "thor"),
        Recipe("adasum", ("adasum",), ("",), "adasum"),
    )
}
EPOCH_METRICS = ("loss", "top1", "top5", "epoch_time_s", "images_per_s")
TABLE_COLUMNS = [
    "recipe",
    "run_id",
    "run_status",
    "env",
    "top1",
    "top5",
    "epochs",
    "train_time_s",
    "wall_time_s",
    "images_per_s",
    "target_top1",
    "epoch_to_target",
    "time_to_target_s",
    "resumed",
]
HISTORY_COLUMNS = ["recipe", "run_id", "phase", "epoch", *EPOCH_METRICS, "train_time_s"]
VARIANCE_ARTIFACT = "pca/pca_explained_variance.csv"


class NoRunsError(LookupError):
    """No recipe has a run to report."""


@dataclass
class Comparison:
    """What the report is made of: the runs found, the table and the per-epoch histories."""

    runs: dict[str, Run | None]
    table: pd.DataFrame
    histories: pd.DataFrame
    explained_variance: pd.DataFrame


def absolute_tracking_uri(uri: str, project_path: str | Path) -> str:
    """``uri`` with a relative SQLite path made absolute against ``project_path``.

    kedro-mlflow leaves ``sqlite:///mlflow.db`` relative, which MLflow resolves against the
    working directory: right for ``kedro run`` at the project root, wrong in ``notebooks/``.
    """
    prefix = "sqlite:///"
    if uri.startswith(prefix) and not Path(uri.removeprefix(prefix)).is_absolute():
        return prefix + str(Path(project_path).resolve() / uri.removeprefix(prefix))
    return uri


def recipes_by_name(names: Sequence[str]) -> list[Recipe]:
    """The recipes named in ``report.recipes``; an unknown name is an error listing the known ones."""
    unknown = [name for name in names if name not in RECIPES]
    if unknown:
        raise ValueError(f"report.recipes names unknown recipes {unknown}; known: {', '.join(RECIPES)}")
    if not names:
        raise ValueError("report.recipes is empty; name at least one of " + ", ".join(RECIPES))
    return [RECIPES[name] for name in names]


def _missing_metrics(run: Run, recipe: Recipe) -> list[str]:
    return [name for name in recipe.required_metrics if name not in run.data.metrics]


def find_run(client: MlflowClient, experiment_id: str, recipe: Recipe, run_id: str | None = None) -> Run | None:
    """The run to report for ``recipe``: ``run_id`` when pinned, else its latest complete FINISHED run.

    A pinned run must exist and be tagged with one of the recipe's pipelines; skipped runs
    (partial reruns lacking the recipe's metrics) are logged. ``None`` when there is none.
    """
    if run_id:
        try:
            run = client.get_run(run_id)
        except MlflowException as error:
            raise ValueError(f"report.run_ids.{recipe.name}: no MLflow run {run_id!r} ({error.message})") from error
        tag = run.data.tags.get("pipeline")
        if tag not in recipe.pipelines:
            raise ValueError(
                f"report.run_ids.{recipe.name}: run {run_id} is tagged pipeline={tag!r}, "
                f"not {' or '.join(recipe.pipelines)}"
            )
        missing = _missing_metrics(run, recipe)
        if missing:
            raise ValueError(f"report.run_ids.{recipe.name}: run {run_id} lacks the metrics {missing}")
        return run
    candidates = []
    for tag in recipe.pipelines:
        candidates += client.search_runs(
            [experiment_id],
            f"tags.pipeline = '{tag}' and attributes.status = 'FINISHED'",
            order_by=["attributes.start_time DESC"],
            max_results=200,
        )
    for run in sorted(candidates, key=lambda r: r.info.start_time, reverse=True):
        missing = _missing_metrics(run, recipe)
        if not missing:
            return run
        logger.info(
            "Report: skipping %s run %s, which lacks %s (a partial rerun?)", recipe.name, run.info.run_id, missing
        )
    return None


def _history(client: MlflowClient, run_id: str, metric: str) -> dict[int, float]:
    """Step -> value of ``metric``; the latest value where a step was logged twice."""
    values = {}
    for m in sorted(client.get_metric_history(run_id, metric), key=lambda m: (m.step, m.timestamp)):
        values[m.step] = m.value
    return values


def epoch_history(client: MlflowClient, run: Run, recipe: Recipe) -> pd.DataFrame:
    """One row per trained epoch of ``run`` (columns ``HISTORY_COLUMNS``).

    ``top1``/``top5`` are NaN in epochs without a per-epoch evaluation, except the last epoch,
    which takes the final evaluation when it had none of its own (dim_reduce stage 2 has none).
    ``train_time_s`` is the cumulative training time at the end of the epoch.
    """
    run_id = run.info.run_id
    rows: dict[int, dict] = {}
    for phase in recipe.phases:
        for metric in EPOCH_METRICS:
            for step, value in _history(client, run_id, phase + metric).items():
                if step >= 1:  # step 0 holds the final evaluation where the names coincide
                    rows.setdefault(step, {"phase": phase.rstrip("_") or recipe.name, "epoch": step})[metric] = value
    history = pd.DataFrame([rows[step] for step in sorted(rows)], columns=HISTORY_COLUMNS[2:-1])
    history.insert(0, "run_id", run_id)
    history.insert(0, "recipe", recipe.name)
    history["train_time_s"] = history["epoch_time_s"].fillna(0.0).cumsum()
    final = final_accuracy(client, run, recipe)
    if len(history) and math.isnan(history["top1"].iloc[-1]):
        history.loc[history.index[-1], ["top1", "top5"]] = [final["top1"], final["top5"]]
    return history


def final_accuracy(client: MlflowClient, run: Run, recipe: Recipe) -> dict[str, float]:
    """The final evaluation's top-1/top-5 (fractions), logged by the evaluation node at step 0."""
    accuracy = {}
    for key in ("top1", "top5"):
        logged = _history(client, run.info.run_id, f"{recipe.final}_{key}")
        accuracy[key] = logged.get(0, math.nan)
    return accuracy


def time_to_target(history: pd.DataFrame, target_top1: float) -> tuple[float, float]:
    """(epoch, cumulative training seconds) of the first epoch whose top-1 reaches ``target_top1``; NaN if none."""
    reached = history[history["top1"] >= target_top1]
    if reached.empty:
        return math.nan, math.nan
    first = reached.iloc[0]
    return float(first["epoch"]), float(first["train_time_s"])


def table_row(client: MlflowClient, run: Run, recipe: Recipe, history: pd.DataFrame, target_top1: float) -> dict:
    """One row of the comparison table for a recipe with a run."""
    final = final_accuracy(client, run, recipe)
    times = history["epoch_time_s"].to_numpy(dtype=np.float64)
    rates = history["images_per_s"].to_numpy(dtype=np.float64)
    known = ~(np.isnan(times) | np.isnan(rates))
    epoch, seconds = time_to_target(history, target_top1)
    end = run.info.end_time
    return {
        "recipe": recipe.name,
        "run_id": run.info.run_id,
        "run_status": run.info.status,
        "env": run.data.tags.get("env"),  # runs of different environments train different data
        "top1": final["top1"],
        "top5": final["top5"],
        "epochs": int(history["epoch"].max()) if len(history) else 0,
        "train_time_s": float(np.nansum(times)),
        "wall_time_s": (end - run.info.start_time) / 1000 if end else math.nan,
        # images over seconds of all epochs: each epoch's rate weighted by its duration
        "images_per_s": float((rates * times)[known].sum() / times[known].sum()) if known.any() else math.nan,
        "target_top1": target_top1,
        "epoch_to_target": epoch,
        "time_to_target_s": seconds,
        "resumed": any(key.endswith("resumed_from") for key in run.data.tags),
    }


def explained_variance(client: MlflowClient, run: Run | None) -> pd.DataFrame:
    """dim_reduce's explained-variance table (artifact ``pca/pca_explained_variance.csv``); empty if absent."""
    columns = ["component", "explained_variance", "explained_variance_ratio", "cumulative_ratio"]
    if run is None:
        return pd.DataFrame(columns=columns)
    with tempfile.TemporaryDirectory() as folder:
        try:
            path = client.download_artifacts(run.info.run_id, VARIANCE_ARTIFACT, folder)
        except (MlflowException, OSError):
            logger.warning("Report: dim_reduce run %s has no artifact %s", run.info.run_id, VARIANCE_ARTIFACT)
            return pd.DataFrame(columns=columns)
        return pd.read_csv(path)


def compare(
    tracking_uri: str,
    experiment_name: str,
    recipes: Sequence[str],
    target_top1: float,
    run_ids: Mapping[str, str | None] | None = None,
) -> Comparison:
    """Find each recipe's run in ``experiment_name`` at ``tracking_uri`` and build the table and histories.

    A recipe without a run is a row with ``run_status`` ``missing`` (and a log line); no run at
    all raises ``NoRunsError``.
    """
    client = MlflowClient(tracking_uri=tracking_uri)
    chosen = recipes_by_name(recipes)
    experiment = client.get_experiment_by_name(experiment_name)
    if experiment is None:
        raise NoRunsError(
            f"no MLflow experiment {experiment_name!r} at {tracking_uri}; run the training pipelines first"
        )
    runs: dict[str, Run | None] = {}
    rows, histories = [], []
    for recipe in chosen:
        run = find_run(client, experiment.experiment_id, recipe, (run_ids or {}).get(recipe.name))
        runs[recipe.name] = run
        if run is None:
            logger.warning(
                "Report: no finished run of %s (pipeline tag %s) in experiment %r; listed as missing",
                recipe.name,
                " or ".join(recipe.pipelines),
                experiment_name,
            )
            rows.append({"recipe": recipe.name, "run_status": "missing", "target_top1": target_top1})
            continue
        history = epoch_history(client, run, recipe)
        histories.append(history)
        rows.append(table_row(client, run, recipe, history, target_top1))
        logger.info("Report: %s from run %s", recipe.name, run.info.run_id)
    if not histories:
        raise NoRunsError(
            f"no finished run of any recipe ({', '.join(recipes)}) in experiment {experiment_name!r} at "
            f"{tracking_uri}; run e.g. `kedro run --pipelines=baseline` first"
        )
    table = pd.DataFrame(rows, columns=TABLE_COLUMNS).astype({"epochs": "Int64", "epoch_to_target": "Int64"})
    return Comparison(
        runs=runs,
        table=table,
        histories=pd.concat(histories, ignore_index=True),
        explained_variance=explained_variance(client, runs.get("dim_reduce")),
    )


def _curves(histories: pd.DataFrame, x: str, y: str, xlabel: str, ylabel: str, title: str, scale: float = 1.0):
    figure = Figure(figsize=(7, 4.5), tight_layout=True)
    axes = figure.add_subplot()
    for recipe, rows in histories.groupby("recipe", sort=False):
        logged = rows[rows[y].notna()]
        axes.plot(logged[x], scale * logged[y], marker="o", markersize=4, label=recipe)
    axes.set_xlabel(xlabel)
    axes.set_ylabel(ylabel)
    axes.set_title(title)
    axes.grid(alpha=0.3)
    axes.legend()
    return figure, axes


def top1_figure(histories: pd.DataFrame, x: str = "epoch", target_top1: float | None = None) -> Figure:
    """Top-1 (%) on val against ``epoch`` or ``train_time_s``, one line per recipe, the target dashed."""
    xlabel = {"epoch": "epoch", "train_time_s": "training time (s, sum of epoch times)"}[x]
    figure, axes = _curves(
        histories, x, "top1", xlabel, "top-1 accuracy on val (%)", f"Top-1 against {xlabel.split(' (')[0]}", 100.0
    )
    if target_top1 is not None:
        axes.axhline(100 * target_top1, color="grey", linestyle="--", linewidth=1, label="_target")
        axes.annotate(f"target {100 * target_top1:g} %", (0.01, 100 * target_top1), xycoords=("axes fraction", "data"))
    return figure


def loss_figure(histories: pd.DataFrame) -> Figure:
    """Training loss (mean over each epoch) against epoch, one line per recipe."""
    figure, _ = _curves(histories, "epoch", "loss", "epoch", "training loss (mean over the epoch)", "Training loss")
    return figure


def explained_variance_figure(table: pd.DataFrame) -> Figure:
    """dim_reduce's PCA: each component's explained-variance ratio (bars) and the cumulative ratio."""
    figure = Figure(figsize=(7, 4.5), tight_layout=True)
    axes = figure.add_subplot()
    axes.set_xlabel("principal component")
    axes.set_ylabel("explained variance ratio")
    axes.set_title("dim_reduce: PCA of the stage-1 trajectory")
    axes.set_ylim(0, 1)
    if table.empty:
        axes.text(0.5, 0.5, "no dim_reduce run", ha="center", va="center", transform=axes.transAxes)
        return figure
    axes.bar(table["component"], table["explained_variance_ratio"], label="component")
    axes.plot(table["component"], table["cumulative_ratio"], color="black", marker=".", label="cumulative")
    axes.legend()
    return figure


def figures(histories: pd.DataFrame, explained_variance: pd.DataFrame, target_top1: float) -> dict[str, Figure]:
    """The report's figures by name: top-1 against epoch and time, loss, dim_reduce's explained variance."""
    return {
        "top1_vs_epoch": top1_figure(histories, "epoch", target_top1),
        "top1_vs_time": top1_figure(histories, "train_time_s", target_top1),
        "loss": loss_figure(histories),
        "explained_variance": explained_variance_figure(explained_variance),
    }
