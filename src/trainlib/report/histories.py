"""A recipe's per-epoch history from its runs' logged metrics (docs/tracking.md#metric-schema: per epoch, with step =
epoch number, ``train/loss``, ``train/lr``, ``train/images_per_s``, ``train/epoch_time_s`` and, on evaluation epochs,
``val/top1``/``val/top5``; after training ``final/top1``/``final/top5``), its trainings chained, and when it first
reached a target.

Times are training time: the sum of the per-epoch ``train/epoch_time_s`` (evaluation, data ingest and dim_reduce's
PCA are not counted).
"""

from __future__ import annotations

import math
from collections.abc import Mapping

import pandas as pd

from trainlib.metrics import EPOCH_KEYS, FINAL_KEYS, FINAL_PREFIX, TRAIN_EPOCH_TIME_S, VAL_TOP1, VAL_TOP5
from trainlib.report.runs import Recipe, report_recipes

HISTORY_COLUMNS = ["recipe", "run_id", "training", "epoch", *EPOCH_KEYS, "train_time_s"]


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
    side = {name for recipe in report_recipes().values() for name in recipe.side_trainings}
    return history[~history["training"].isin(side)]


def time_to_target(history: pd.DataFrame, target_top1: float) -> tuple[float, float]:
    """(epoch, cumulative training seconds) of the first epoch whose top-1 reaches ``target_top1``; NaN if none."""
    reached = history[history[VAL_TOP1] >= target_top1]
    if reached.empty:
        return math.nan, math.nan
    first = reached.iloc[0]
    return float(first["epoch"]), float(first["train_time_s"])
