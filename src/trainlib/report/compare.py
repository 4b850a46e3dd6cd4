"""Comparison of the training recipes from their MLflow runs: one table and a few figures.

Every recipe logs one metric schema (docs/tracking.md#metric-schema): per epoch, with step = epoch
number, ``train/loss``, ``train/lr``, ``train/images_per_s``, ``train/epoch_time_s`` and, on
evaluation epochs, ``val/top1``/``val/top5``; after training ``final/top1``/``final/top5``.
baseline, thor and adasum log them into the ``kedro run``'s own run (tagged ``pipeline``);
dim_reduce's trainings (``stage1``, ``stage2``, ``control``) are child runs of it (tag
``training``), each with the same keys. So one reader serves every recipe.

Times are training time: the sum of the per-epoch ``train/epoch_time_s`` (evaluation, data
ingest and dim_reduce's PCA are not counted); ``wall_time_s`` is the whole ``kedro run``.

This module reads MLflow only through a ``RunReader`` passed in (``pipelines.tracking.reader.MlflowRunReader``),
which hands over plain data; everything here is pandas and matplotlib.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Protocol, TypedDict

import numpy as np
import pandas as pd
from matplotlib.figure import Figure
from matplotlib.ticker import MaxNLocator

from trainlib import fast_dev_run
from trainlib.metrics import (
    EPOCH_KEYS,
    FINAL_KEYS,
    FINAL_PREFIX,
    FINAL_TOP1,
    TRAIN_EPOCH_TIME_S,
    TRAIN_IMAGES_PER_S,
    TRAIN_LOSS,
    VAL_TOP1,
    VAL_TOP5,
)

logger = logging.getLogger(__name__)

TRAINING_TAG = "training"  # names a dim_reduce child run: stage1, stage2 or control
PARENT_TAG = "mlflow.parentRunId"
# Parameters (as kedro-mlflow flattens them) that change what is trained on or what is trained;
# data loading settings that do not change the images (workers, evaluation batch, cache folder) are left out.
DATA_MODEL_PREFIXES = ("data.", "model.")
NOT_DATA_OR_MODEL = ("data.num_workers", "data.eval_batch_size", "data.cache_dir")


@dataclass(frozen=True)
class Recipe:
    """Where a recipe's numbers are among its MLflow runs.

    ``pipelines``: values of the ``pipeline`` tag that are runs of this recipe.
    ``trainings``: child runs (by ``training`` tag) whose epochs, in this order, are the recipe's
    curve, the last one holding the recipe's final evaluation; empty: the ``kedro run`` itself.
    ``side_trainings``: child runs that continue from the first training instead (dim_reduce's
    control, Momentum over stage 2's epochs), drawn beside the curve but not in the table.
    """

    name: str
    pipelines: tuple[str, ...]
    trainings: tuple[str, ...] = ()
    side_trainings: tuple[str, ...] = ()


RECIPES: dict[str, Recipe] = {
    recipe.name: recipe
    for recipe in (
        Recipe("baseline", ("baseline", "__default__")),
        Recipe("dim_reduce", ("dim_reduce",), ("stage1", "stage2"), ("control",)),
        Recipe("thor", ("thor",)),
        Recipe("adasum", ("adasum",)),
    )
}
TABLE_COLUMNS = [
    "recipe",
    "run_id",
    "run_status",
    "env",
    "model",
    "image_size",
    "train_images",
    "seed",
    "epochs",
    "top1",
    "top5",
    "train_time_s",
    "wall_time_s",
    "images_per_s",
    "target_top1",
    "epoch_to_target",
    "time_to_target_s",
    "resumed",
    "differs",
    "left_out",
]
HISTORY_COLUMNS = ["recipe", "run_id", "training", "epoch", *EPOCH_KEYS, "train_time_s"]
VARIANCE_ARTIFACT = "pca/pca_explained_variance.csv"
VARIANCE_COLUMNS = ["component", "explained_variance", "explained_variance_ratio", "cumulative_ratio"]


class RunRecord(TypedDict):
    """One MLflow run as plain data: ``metric_keys`` names the metrics it holds (any step)."""

    run_id: str
    run_name: str | None
    status: str
    start_time_ms: int
    end_time_ms: int | None
    tags: dict[str, str]
    params: dict[str, str]
    metric_keys: list[str]


class RunReader(Protocol):
    """Read access to one MLflow experiment, as plain data (``pipelines.tracking.reader.MlflowRunReader``)."""

    tracking_uri: str
    experiment_name: str
    experiment_exists: bool

    def search(self, filter_string: str) -> list[RunRecord]:
        """The experiment's runs matching an MLflow filter string, newest first."""
        ...

    def get(self, run_id: str) -> RunRecord | None:
        """The run ``run_id`` (any experiment), or ``None`` when there is none."""
        ...

    def metric_history(self, run_id: str, keys: Sequence[str]) -> pd.DataFrame:
        """Every logged value of ``keys``: columns ``key``, ``step``, ``value``, ``timestamp`` (ms)."""
        ...

    def artifact_csv(self, run_id: str, path: str) -> pd.DataFrame | None:
        """The run's CSV artifact at ``path``, or ``None`` when it has none."""
        ...


class NoRunsError(LookupError):
    """No recipe has a run to report."""


@dataclass
class Comparison:
    """What the report is made of: the runs found, the table and the per-epoch histories."""

    runs: dict[str, RunRecord | None]
    table: pd.DataFrame
    histories: pd.DataFrame
    explained_variance: pd.DataFrame
    # each training's final top1/top5 and its budget (epochs), by name: the recipes', dim_reduce's stage2 and control
    finals: dict[str, dict[str, float]] = field(default_factory=dict)
    # the data and model settings of each training's run (data_and_model), by the same names
    settings: dict[str, dict[str, str | None]] = field(default_factory=dict)


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


def children_by_training(reader: RunReader, run: RunRecord) -> dict[str, RunRecord]:
    """The child runs of ``run`` by their ``training`` tag (the newest where a name repeats)."""
    children: dict[str, RunRecord] = {}
    for child in reader.search(f"tags.`{PARENT_TAG}` = '{run['run_id']}'"):  # newest first
        children.setdefault(child["tags"].get(TRAINING_TAG, ""), child)
    children.pop("", None)
    return children


def missing_metrics(recipe: Recipe, run: RunRecord, children: Mapping[str, RunRecord]) -> list[str]:
    """Metrics a complete run of ``recipe`` has and this one lacks (a partial rerun, ``--nodes=...``).

    In-run recipes need ``train/loss`` and ``final/top1``; dim_reduce needs ``train/loss`` in each
    training of its curve and ``final/top1`` in the last (``stage2: final/top1`` when absent).
    """
    if not recipe.trainings:
        return [key for key in (TRAIN_LOSS, FINAL_TOP1) if key not in run["metric_keys"]]
    missing = []
    for training in recipe.trainings:
        needed = (TRAIN_LOSS, FINAL_TOP1) if training == recipe.trainings[-1] else (TRAIN_LOSS,)
        held = children[training]["metric_keys"] if training in children else []
        missing += [f"{training}: {key}" for key in needed if key not in held]
    return missing


def find_run(reader: RunReader, recipe: Recipe, run_id: str | None = None) -> RunRecord | None:
    """The run to report for ``recipe``: ``run_id`` when pinned, else its latest complete FINISHED run that is not a
    rehearsal (``runtime.fast_dev_run``, tagged ``fast_dev_run``).

    A pinned run must exist, be tagged with one of the recipe's pipelines and be complete;
    skipped runs (partial reruns lacking the recipe's metrics) are logged. ``None`` when there is none.
    """
    if run_id:
        run = reader.get(run_id)
        if run is None:
            raise ValueError(f"report.run_ids.{recipe.name}: no MLflow run {run_id!r} at {reader.tracking_uri}")
        tag = run["tags"].get("pipeline")
        if tag not in recipe.pipelines:
            raise ValueError(
                f"report.run_ids.{recipe.name}: run {run_id} is tagged pipeline={tag!r}, "
                f"not {' or '.join(recipe.pipelines)}"
            )
        missing = missing_metrics(recipe, run, children_by_training(reader, run) if recipe.trainings else {})
        if missing:
            raise ValueError(f"report.run_ids.{recipe.name}: run {run_id} lacks the metrics {missing}")
        return run
    candidates: list[RunRecord] = []
    for tag in recipe.pipelines:
        candidates += reader.search(f"tags.pipeline = '{tag}' and attributes.status = 'FINISHED'")
    for run in sorted(candidates, key=lambda r: r["start_time_ms"], reverse=True):
        if fast_dev_run.TAG in run["tags"]:  # a few batches on CPU: not a result
            logger.info(
                "Report: skipping %s run %s, a fast_dev_run rehearsal (not a result)", recipe.name, run["run_id"]
            )
            continue
        missing = missing_metrics(recipe, run, children_by_training(reader, run) if recipe.trainings else {})
        if not missing:
            return run
        logger.info(
            "Report: skipping %s run %s, which lacks %s (a partial rerun?)", recipe.name, run["run_id"], missing
        )
    return None


def epoch_rows(metrics: pd.DataFrame) -> pd.DataFrame:
    """One row per epoch (``epoch`` and the ``EPOCH_KEYS`` columns) from one run's logged metrics.

    ``metrics`` has columns ``key``, ``step``, ``value``, ``timestamp`` (what ``RunReader.metric_history``
    returns). Steps below 1 are not epochs; where a step was logged twice (a resumed training
    relogs its earlier epochs), the latest value counts. A key never logged is an all-NaN column.
    """
    per_epoch = metrics[metrics["key"].isin(EPOCH_KEYS) & (metrics["step"] >= 1)]
    latest = per_epoch.sort_values(["timestamp"], kind="stable").drop_duplicates(["key", "step"], keep="last")
    table = latest.pivot(index="step", columns="key", values="value").reindex(columns=list(EPOCH_KEYS))
    table = table.sort_index().rename_axis(index="epoch", columns=None).reset_index()
    return table.astype({"epoch": "int64", **dict.fromkeys(EPOCH_KEYS, "float64")})


def final_accuracy(metrics: pd.DataFrame) -> dict[str, float]:
    """The final evaluation's top-1/top-5 (fractions), the latest logged values; NaN when absent."""
    accuracy = {}
    for key in FINAL_KEYS:
        logged = metrics[metrics["key"] == key].sort_values("timestamp", kind="stable")
        accuracy[key.removeprefix(FINAL_PREFIX)] = float(logged["value"].iloc[-1]) if len(logged) else math.nan
    return accuracy


def _with_final_at_last_epoch(rows: pd.DataFrame, final: Mapping[str, float]) -> pd.DataFrame:
    # A training evaluated only at its end (eval_interval 0) still reaches its target at its last epoch.
    if len(rows) and math.isnan(rows[VAL_TOP1].iloc[-1]):
        rows = rows.copy()
        rows.loc[rows.index[-1], [VAL_TOP1, VAL_TOP5]] = [final["top1"], final["top5"]]
    return rows


def recipe_history(recipe: Recipe, run_id: str, trainings: Mapping[str, pd.DataFrame]) -> pd.DataFrame:
    """The per-epoch history of a recipe's run (``HISTORY_COLUMNS``), from each training's logged metrics.

    ``trainings`` maps a training name to its run's metrics (``epoch_rows`` input): the recipe's
    name for an in-run recipe, else the child runs' ``training`` tags. The recipe's trainings are
    chained: one whose epochs restart at 1 continues after the one before (stage 2 after stage 1's
    last epoch); a side training continues after the first training. ``train_time_s`` is the
    training time (sum of epoch times) from the recipe's first epoch to the end of the row's epoch.
    An epoch without ``val/top1`` that ends a training takes that training's final evaluation.
    """
    chain = recipe.trainings or (recipe.name,)
    parts, last_epoch, elapsed = [], 0, 0.0
    first_end: tuple[int, float] | None = None
    for name in (*chain, *recipe.side_trainings):
        if name not in trainings:
            continue
        if name in recipe.side_trainings and first_end is not None:
            last_epoch, elapsed = first_end
        rows = _with_final_at_last_epoch(epoch_rows(trainings[name]), final_accuracy(trainings[name]))
        if len(rows) and rows["epoch"].iloc[0] <= last_epoch:
            rows["epoch"] += last_epoch
        rows["train_time_s"] = elapsed + rows[TRAIN_EPOCH_TIME_S].fillna(0.0).cumsum()
        rows.insert(0, "training", name)
        parts.append(rows)
        if len(rows):
            last_epoch, elapsed = int(rows["epoch"].iloc[-1]), float(rows["train_time_s"].iloc[-1])
        if first_end is None:
            first_end = (last_epoch, elapsed)
    history = pd.concat(parts, ignore_index=True) if parts else pd.DataFrame(columns=HISTORY_COLUMNS[2:])
    history.insert(0, "run_id", run_id)
    history.insert(0, "recipe", recipe.name)
    return history[HISTORY_COLUMNS]


def recipe_curve(history: pd.DataFrame) -> pd.DataFrame:
    """The rows of a recipe's own trainings, without side trainings (dim_reduce's control)."""
    side = {name for recipe in RECIPES.values() for name in recipe.side_trainings}
    return history[~history["training"].isin(side)]


def time_to_target(history: pd.DataFrame, target_top1: float) -> tuple[float, float]:
    """(epoch, cumulative training seconds) of the first epoch whose top-1 reaches ``target_top1``; NaN if none."""
    reached = history[history[VAL_TOP1] >= target_top1]
    if reached.empty:
        return math.nan, math.nan
    first = reached.iloc[0]
    return float(first["epoch"]), float(first["train_time_s"])


def _number(value: str | None) -> int | None:
    return int(value) if value is not None and value.lstrip("-").isdigit() else None


def table_row(
    recipe: Recipe, run: RunRecord, history: pd.DataFrame, final: Mapping[str, float], target_top1: float, resumed: bool
) -> dict:
    """One row of the comparison table for a recipe with a run.

    ``history`` is the recipe's curve (``recipe_curve``); ``final`` its last training's final
    evaluation. ``train_images`` is the number of images one epoch trains on (all workers), as
    the first epoch's images/s times its seconds; model, image size and seed are the run's
    logged parameters.
    """
    times = history[TRAIN_EPOCH_TIME_S].to_numpy(dtype=np.float64)
    rates = history[TRAIN_IMAGES_PER_S].to_numpy(dtype=np.float64)
    known = ~(np.isnan(times) | np.isnan(rates))
    epoch, seconds = time_to_target(history, target_top1)
    end = run["end_time_ms"]
    return {
        "recipe": recipe.name,
        "run_id": run["run_id"],
        "run_status": run["status"],
        "env": run["tags"].get("env"),  # runs of different environments train different data
        "model": run["params"].get("model.name"),
        "image_size": _number(run["params"].get("data.image_size")),
        "train_images": round(float(rates[known][0] * times[known][0])) if known.any() else None,
        "seed": _number(run["params"].get("runtime.seed")),
        "top1": final["top1"],
        "top5": final["top5"],
        "epochs": int(history["epoch"].max()) if len(history) else 0,
        "train_time_s": float(np.nansum(times)),
        "wall_time_s": (end - run["start_time_ms"]) / 1000 if end else math.nan,
        # images over seconds of all epochs: each epoch's rate weighted by its duration
        "images_per_s": float((rates * times)[known].sum() / times[known].sum()) if known.any() else math.nan,
        "target_top1": target_top1,
        "epoch_to_target": epoch,
        "time_to_target_s": seconds,
        "resumed": resumed,
    }


def data_and_model(run: RunRecord) -> dict[str, str | None]:
    """The settings that decide what a run trained on and what it trained: its data and model
    parameters and its configuration environment (key ``env``)."""
    settings: dict[str, str | None] = {
        key: value
        for key, value in run["params"].items()
        if key.startswith(DATA_MODEL_PREFIXES) and key not in NOT_DATA_OR_MODEL
    }
    settings["env"] = run["tags"].get("env")
    return settings


def setting_differences(settings: Mapping[str, Mapping[str, str | None]]) -> dict[str, str]:
    """Per recipe, ``key=value`` of each data or model setting on which the compared runs disagree.

    ``settings`` maps a recipe to its run's ``data_and_model``; a setting one run lacks counts as
    differing (its value shows as ``?``). Empty strings when every run agrees.
    """
    keys = sorted({key for values in settings.values() for key in values})
    differing = [key for key in keys if len({values.get(key) for values in settings.values()}) > 1]
    return {
        recipe: "; ".join(f"{key}={'?' if values.get(key) is None else values[key]}" for key in differing)
        for recipe, values in settings.items()
    }


def unequal_budgets(table: pd.DataFrame, settings: Mapping[str, Mapping[str, str | None]]) -> dict[str, str]:
    """Per recipe with a run, why its run is not compared side by side with the reference's (the baseline's, else
    the first recipe's with a run): other epochs, or other data or model settings; empty when the budgets are
    equal."""
    rows = table[table["run_status"] != "missing"].set_index("recipe")
    recipes = [recipe for recipe in rows.index if recipe in settings]
    if not recipes:
        return {}
    reference = "baseline" if "baseline" in recipes else recipes[0]
    reasons = {}
    for recipe in recipes:
        gaps = []
        if rows.at[recipe, "epochs"] != rows.at[reference, "epochs"]:
            gaps.append(f"epochs {rows.at[recipe, 'epochs']} vs {rows.at[reference, 'epochs']}")
        ours, theirs = settings[recipe], settings[reference]
        gaps += [
            f"{key} {ours.get(key) or '?'} vs {theirs.get(key) or '?'}"
            for key in sorted({*ours, *theirs})
            if ours.get(key) != theirs.get(key)
        ]
        reasons[recipe] = f"unequal budget to {reference}'s run: {'; '.join(gaps)}" if gaps else ""
    return reasons


def compare(
    reader: RunReader,
    recipes: Sequence[str],
    target_top1: float,
    run_ids: Mapping[str, str | None] | None = None,
) -> Comparison:
    """Find each recipe's run in ``reader``'s experiment and build the table and histories.

    A recipe without a run is a row with ``run_status`` ``missing`` (and a log line); no run at
    all raises ``NoRunsError``. Runs that differ in data or model are named in a warning and in
    the table's ``differs`` column.
    """
    chosen = recipes_by_name(recipes)
    if not reader.experiment_exists:
        raise NoRunsError(
            f"no MLflow experiment {reader.experiment_name!r} at {reader.tracking_uri}; "
            "run the training pipelines first"
        )
    runs: dict[str, RunRecord | None] = {}
    rows: dict[str, dict] = {}
    settings: dict[str, dict[str, str | None]] = {}
    histories = []
    finals: dict[str, dict[str, float]] = {}
    training_settings: dict[str, dict[str, str | None]] = {}
    for recipe in chosen:
        run = find_run(reader, recipe, (run_ids or {}).get(recipe.name))
        runs[recipe.name] = run
        if run is None:
            logger.warning(
                "Report: no finished run of %s (pipeline tag %s) in experiment %r; listed as missing",
                recipe.name,
                " or ".join(recipe.pipelines),
                reader.experiment_name,
            )
            rows[recipe.name] = {"recipe": recipe.name, "run_status": "missing", "target_top1": target_top1}
            continue
        trained = children_by_training(reader, run) if recipe.trainings else {recipe.name: run}
        metrics = {
            name: reader.metric_history(child["run_id"], (*EPOCH_KEYS, *FINAL_KEYS)) for name, child in trained.items()
        }
        history = recipe_history(recipe, run["run_id"], metrics)
        histories.append(history)
        final = final_accuracy(metrics[(recipe.trainings or (recipe.name,))[-1]])
        resumed = any(key == "resumed_from" for r in (run, *trained.values()) for key in r["tags"])
        rows[recipe.name] = table_row(recipe, run, recipe_curve(history), final, target_top1, resumed)
        settings[recipe.name] = data_and_model(run)
        for name in (*recipe.trainings[1:], *recipe.side_trainings) or (recipe.name,):
            ended = history[history["training"] == name]["epoch"]
            finals[name] = {**final_accuracy(metrics[name]), "epochs": float(ended.max()) if len(ended) else math.nan}
            training_settings[name] = settings[recipe.name]
        for side in recipe.side_trainings:  # dim_reduce's control: beside stage 2 in the table, at its budget
            rows[f"{recipe.name}/{side}"] = {
                "recipe": f"{recipe.name}/{side}",
                "run_id": trained[side]["run_id"],
                "run_status": trained[side]["status"],
                "top1": finals[side]["top1"],
                "top5": finals[side]["top5"],
                "epochs": int(finals[side]["epochs"]),
                "target_top1": target_top1,
            }
        logger.info("Report: %s from run %s", recipe.name, run["run_id"])
    if not histories:
        raise NoRunsError(
            f"no finished run of any recipe ({', '.join(recipes)}) in experiment {reader.experiment_name!r} at "
            f"{reader.tracking_uri}; run e.g. `kedro run --pipelines=baseline` first"
        )
    differences = setting_differences(settings)
    for recipe, differs in differences.items():
        rows[recipe]["differs"] = differs
    if any(differences.values()):
        logger.warning(
            "Report: the compared runs differ in data or model, so their figures are not like for like: %s",
            " | ".join(f"{recipe}: {differs}" for recipe, differs in differences.items()),
        )
    table = pd.DataFrame(list(rows.values()), columns=TABLE_COLUMNS).astype(
        {"epochs": "Int64", "epoch_to_target": "Int64", "image_size": "Int64", "train_images": "Int64", "seed": "Int64"}
    )
    left_out = unequal_budgets(table, settings)
    table["left_out"] = table["recipe"].map(left_out).fillna("")
    for recipe, reason in left_out.items():
        if reason:
            logger.warning("Report: %s is not compared side by side: %s", recipe, reason)
    dim_reduce = runs.get("dim_reduce")
    variance = reader.artifact_csv(dim_reduce["run_id"], VARIANCE_ARTIFACT) if dim_reduce else None
    if dim_reduce and variance is None:
        logger.warning("Report: dim_reduce run %s has no artifact %s", dim_reduce["run_id"], VARIANCE_ARTIFACT)
    return Comparison(
        runs=runs,
        table=table,
        histories=pd.concat(histories, ignore_index=True),
        explained_variance=pd.DataFrame(columns=VARIANCE_COLUMNS) if variance is None else variance,
        finals=finals,
        settings=training_settings,
    )


def stage_boundaries(histories: pd.DataFrame, x: str) -> dict[str, float]:
    """Per recipe with chained trainings, ``x`` (epoch or training time) where its first training ends."""
    boundaries = {}
    for name, recipe in RECIPES.items():
        if len(recipe.trainings) < 2:
            continue
        first = histories[(histories["recipe"] == name) & (histories["training"] == recipe.trainings[0])]
        later = histories[(histories["recipe"] == name) & histories["training"].isin(recipe.trainings[1:])]
        if len(first) and len(later):
            boundaries[name] = float(first[x].iloc[-1])
    return boundaries


def _label_the_end(axes, xs: pd.Series, ys: pd.Series, colour: str) -> None:
    """The line's last value written beside its last point, so the figure says how far each recipe got."""
    if len(xs):
        axes.annotate(
            f"{ys.iloc[-1]:.4g}", (xs.iloc[-1], ys.iloc[-1]), textcoords="offset points", xytext=(4, 4), fontsize=8,
            color=colour,
        )  # fmt: skip


def _curves(histories: pd.DataFrame, x: str, y: str, xlabel: str, ylabel: str, title: str, scale: float = 1.0):
    """One line per recipe (``y`` against ``x``), side trainings dashed from their branch point, and
    a dotted line where a chained recipe switches training (dim_reduce: stage 1 -> stage 2)."""
    figure = Figure(figsize=(7, 4.5), tight_layout=True)
    axes = figure.add_subplot()
    colours = {}
    for recipe, rows in histories.groupby("recipe", sort=False):
        curve = recipe_curve(rows)
        logged = curve[curve[y].notna()]
        (line,) = axes.plot(logged[x], scale * logged[y], marker="o", markersize=4, label=recipe)
        colours[recipe] = line.get_color()
        _label_the_end(axes, logged[x], scale * logged[y], line.get_color())
        side = rows[~rows.index.isin(curve.index)]
        for training, side_rows in side.groupby("training", sort=False):
            first = RECIPES[recipe].trainings[0]
            branch = curve[curve["training"] == first].tail(1)  # the side training starts where this ends
            drawn = pd.concat([branch, side_rows])
            drawn = drawn[drawn[y].notna()]
            axes.plot(
                drawn[x], scale * drawn[y], linestyle="--", marker="s", markersize=3, color=line.get_color(),
                label=f"{recipe} {training}",
            )  # fmt: skip
            _label_the_end(axes, drawn[x], scale * drawn[y], line.get_color())
    for recipe, boundary in stage_boundaries(histories, x).items():
        first, second = RECIPES[recipe].trainings[:2]
        axes.axvline(boundary, color=colours[recipe], linestyle=":", linewidth=1.2, label=f"_{recipe} boundary")
        axes.annotate(
            f"{recipe}: {first} → {second}", (boundary, 0.02), xycoords=("data", "axes fraction"),
            rotation=90, fontsize=8, ha="right", va="bottom", color=colours[recipe],
        )  # fmt: skip
    if x == "epoch":
        axes.xaxis.set_major_locator(MaxNLocator(integer=True))
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
        histories, x, VAL_TOP1, xlabel, "top-1 accuracy on val (%)", f"Top-1 against {xlabel.split(' (')[0]}", 100.0
    )
    if target_top1 is not None:
        axes.axhline(100 * target_top1, color="grey", linestyle="--", linewidth=1, label="_target")
        axes.annotate(f"target {100 * target_top1:g} %", (0.01, 100 * target_top1), xycoords=("axes fraction", "data"))
    return figure


def loss_figure(histories: pd.DataFrame) -> Figure:
    """Training loss (mean over each epoch) against epoch, one line per recipe."""
    figure, _ = _curves(histories, "epoch", TRAIN_LOSS, "epoch", "training loss (mean over the epoch)", "Training loss")
    return figure


def explained_variance_figure(table: pd.DataFrame) -> Figure:
    """dim_reduce's PCA: each component's explained-variance ratio (bars) and the cumulative ratio."""
    figure = Figure(figsize=(7, 4.5), tight_layout=True)
    axes = figure.add_subplot()
    axes.set_xlabel("principal component")
    axes.set_ylabel("explained variance ratio")
    axes.set_title("dim_reduce: PCA of the stage-1 trajectory")
    axes.set_ylim(0, 1)
    axes.bar(table["component"], table["explained_variance_ratio"], label="component")
    axes.plot(table["component"], table["cumulative_ratio"], color="black", marker=".", label="cumulative")
    axes.xaxis.set_major_locator(MaxNLocator(integer=True))
    axes.legend()
    return figure


def compared_histories(histories: pd.DataFrame, table: pd.DataFrame) -> pd.DataFrame:
    """The rows of ``histories`` of the recipes compared side by side: those whose ``left_out`` (``table``) is
    empty, at the reference run's budget."""
    left_out = set(table.loc[table["left_out"].fillna("") != "", "recipe"]) if "left_out" in table else set()
    return histories[~histories["recipe"].isin(left_out)]


def figures(histories: pd.DataFrame, explained_variance: pd.DataFrame, target_top1: float) -> dict[str, Figure]:
    """The report's figures by name: top-1 against epoch and time, loss, and dim_reduce's explained variance when
    there is a dim_reduce run (no empty figure)."""
    drawn = {
        "top1_vs_epoch": top1_figure(histories, "epoch", target_top1),
        "top1_vs_time": top1_figure(histories, "train_time_s", target_top1),
        "loss": loss_figure(histories),
    }
    if not explained_variance.empty:
        drawn["explained_variance"] = explained_variance_figure(explained_variance)
    return drawn
