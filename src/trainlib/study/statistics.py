"""Statistics of a multi-seed study (``kedro run --pipelines=study``): per-run figures, t-intervals, paired
differences and the top-1 against training time figure. Plain data in, plain data out (numpy, pandas, scipy,
matplotlib); no MindSpore, no MLflow.

Accuracies are fractions in [0, 1]; times are training seconds with every evaluation excluded (the engine's
``train/elapsed_s``). Time to target is read at step resolution: the first evaluation every K steps (on the
fixed val subset) whose accuracy reaches the target (top-1 for the image recipes, held-out masked-LM accuracy for
thor_bert's rows); steps to target is that step, epochs to target that step over the steps per epoch.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence

import numpy as np
import pandas as pd
from matplotlib.figure import Figure

from trainlib.metrics import (
    STEP_KEY,
    TRAIN_ELAPSED_S,
    TRAIN_EPOCH_TIME_S,
    VAL_STEP_MLM_ACCURACY,
    VAL_STEP_TOP1,
    VAL_STEP_TOP5,
)
from trainlib.params.recipe_spec import RESULT_KEY, paired_rows

# columns of the per-run table, each summarised per result row by ``summarise`` (a language model's rows have the
# masked-LM figures in place of top-1/top-5; a measure a table lacks, or no run of a result row has, is left out)
MEASURES = (
    "final_top1",
    "final_top5",
    "final_mlm_accuracy",
    "final_mlm_loss",
    "time_to_target_s",
    "steps_to_target",
    "epochs_to_target",
)
CONFIDENCE = 0.95
MOST_SEEDS = 1000  # seeds_to_decide's search: past this many, a difference is not one seeds can decide
# the study's tables: one row per result (``runs_table``), one per step evaluation (``curves_table``); each names its
# training's result row in the column ``result`` (``recipe_spec.RESULT_KEY``)
RUN_COLUMNS = [RESULT_KEY, "seed", *MEASURES, "train_time_s", "steps_per_epoch", "mlflow_run_id", "key"]
CURVE_COLUMNS = [RESULT_KEY, "seed", "step", "elapsed_s", "top1", "top5", "mlm_accuracy"]
# Measures that are accuracies, and the paired differences of accuracies: their intervals are cut to what an
# accuracy can be (a t-interval of a few seeds near 1 otherwise reaches past it)
ACCURACY_BOUNDS = {"final_top1": (0.0, 1.0), "final_top5": (0.0, 1.0), "final_mlm_accuracy": (0.0, 1.0)}
DIFFERENCE_BOUNDS = {
    "final_top1_difference": (-1.0, 1.0),
    "final_top5_difference": (-1.0, 1.0),
    "final_mlm_accuracy_difference": (-1.0, 1.0),
}


def _t_quantile(probability: float, degrees_of_freedom: int) -> float:
    """Student's t quantile."""
    # scipy loaded on use: its array-API layer probes for torch, and the registry must import without it
    from scipy import stats

    return float(stats.t.ppf(probability, degrees_of_freedom))


def first_crossing(
    step_rows: Sequence[Mapping[str, float]], target: float, metric: str = VAL_STEP_TOP1
) -> Mapping[str, float] | None:
    """The first step-evaluation row (in step order) whose ``metric`` reaches ``target``, or None."""
    for row in sorted(step_rows, key=lambda row: row[STEP_KEY]):
        if row[metric] >= target:
            return row
    return None


def run_figures(record: Mapping, target: float) -> dict[str, float]:
    """The per-run measures of a study run's record (its final figures, ``steps_per_epoch``, ``step_history`` and
    ``step_metric``, the step-evaluation key the target is read on): the final figures, time, steps and epochs to
    ``target`` (NaN when never reached)."""
    crossing = first_crossing(record["step_history"], target, record.get("step_metric", VAL_STEP_TOP1))
    # an image recipe has no masked-LM figures and a language model no top-1: NaN, which the statistics skip
    finals = {measure: float(record.get(measure, math.nan)) for measure in MEASURES if measure.startswith("final_")}
    return finals | {
        "time_to_target_s": math.nan if crossing is None else float(crossing[TRAIN_ELAPSED_S]),
        "steps_to_target": math.nan if crossing is None else float(crossing[STEP_KEY]),
        "epochs_to_target": math.nan if crossing is None else crossing[STEP_KEY] / record["steps_per_epoch"],
    }


def runs_table(records: Sequence[Mapping], targets: Mapping[str, float]) -> pd.DataFrame:
    """One row per study record (``RUN_COLUMNS``): its ``run_figures`` against the target of its step metric
    (``targets``: step-evaluation key -> target), its training seconds (its epochs' sum), steps per epoch, MLflow
    run and key."""
    rows = [
        {RESULT_KEY: r[RESULT_KEY], "seed": r["seed"]}
        | run_figures(r, targets[r.get("step_metric", VAL_STEP_TOP1)])
        | {
            "train_time_s": sum(row[TRAIN_EPOCH_TIME_S] for row in r["history"]),
            "steps_per_epoch": r["steps_per_epoch"],
            "mlflow_run_id": r["mlflow_run_id"],
            "key": r["key"],
        }
        for r in records
    ]
    return pd.DataFrame(rows, columns=RUN_COLUMNS)


def curves_table(records: Sequence[Mapping]) -> pd.DataFrame:
    """Every step evaluation of the study's records (``CURVE_COLUMNS``): top-1/top-5 on the val subset, or
    masked-LM accuracy on the first held-out examples, against training seconds."""
    rows = [
        {
            RESULT_KEY: r[RESULT_KEY],
            "seed": r["seed"],
            "step": row[STEP_KEY],
            "elapsed_s": row[TRAIN_ELAPSED_S],
            "top1": row.get(VAL_STEP_TOP1),
            "top5": row.get(VAL_STEP_TOP5),
            "mlm_accuracy": row.get(VAL_STEP_MLM_ACCURACY),
        }
        for r in records
        for row in r["step_history"]
    ]
    return pd.DataFrame(rows, columns=CURVE_COLUMNS)


def t_interval(
    values: Sequence[float], confidence: float = CONFIDENCE, bounds: tuple[float, float] | None = None
) -> tuple[float, float, float, int]:
    """(mean, low, high, n) of the finite ``values``: Student-t interval of the mean at ``confidence``, cut to
    ``bounds`` (the range the quantity can take, e.g. [0, 1] for an accuracy) when given.

    With one value the bounds are NaN (no spread to estimate); with none, everything is NaN and n is 0.
    """
    finite = np.asarray([v for v in values if math.isfinite(v)], np.float64)
    n = len(finite)
    if n == 0:
        return math.nan, math.nan, math.nan, 0
    mean = float(finite.mean())
    if n == 1:
        return mean, math.nan, math.nan, 1
    half = float(_t_quantile(0.5 + confidence / 2, n - 1) * finite.std(ddof=1) / math.sqrt(n))
    low, high = mean - half, mean + half
    if bounds is not None:
        low, high = max(low, bounds[0]), min(high, bounds[1])
    return mean, low, high, n


def seeds_to_decide(
    values: Sequence[float], no_effect: float, confidence: float = CONFIDENCE, most: int = MOST_SEEDS
) -> float:
    """How many seeds the observed paired ``values`` would need for their t-interval to exclude ``no_effect`` (0 for
    a difference, 1 for a ratio), if each new seed followed their mean and spread: the smallest n with
    t(n - 1) * sd / sqrt(n) < |mean - no_effect|; the seeds there are when the interval already excludes it. NaN
    when fewer than 2 values, when the mean is no_effect itself, or past ``most`` seeds (no affordable number)."""
    finite = np.asarray([v for v in values if math.isfinite(v)], np.float64)
    if len(finite) < 2:
        return math.nan
    effect, spread = abs(float(finite.mean()) - no_effect), float(finite.std(ddof=1))
    if effect == 0:
        return math.nan
    for n in range(len(finite), most + 1):
        if _t_quantile(0.5 + confidence / 2, n - 1) * spread / math.sqrt(n) < effect:
            return float(n)
    return math.nan


def summarise(runs: pd.DataFrame, confidence: float = CONFIDENCE) -> pd.DataFrame:
    """Per result row (column ``result``, in order of appearance): ``runs`` (seeds), then per measure of ``MEASURES``
    its mean, ``_ci_low``, ``_ci_high`` and ``_n`` (the runs with a value: time and epochs to target count only the
    runs that reached it)."""
    rows = []
    for result, group in runs.groupby(RESULT_KEY, sort=False):
        row: dict[str, float | str | int] = {RESULT_KEY: result, "runs": len(group)}
        for measure in (measure for measure in MEASURES if measure in group):
            mean, low, high, n = t_interval(group[measure].tolist(), confidence, ACCURACY_BOUNDS.get(measure))
            row.update({measure: mean, f"{measure}_ci_low": low, f"{measure}_ci_high": high, f"{measure}_n": n})
        rows.append(row)
    return pd.DataFrame(rows)


def paired_differences(
    runs: pd.DataFrame, pairs: Sequence[tuple[str, str]] | None = None, confidence: float = CONFIDENCE
) -> pd.DataFrame:
    """Each result row of ``pairs`` (default: every recipe's, ``recipe_spec.paired_rows``: THOR against the baseline and
    against its recipe without the preconditioner, dim_reduce's stage 2 against its control, Adasum against averaged
    gradients, …) present with its reference, on the seeds both ran: per seed the ratio of times to
    target (``time_to_target_ratio``, row / reference, seeds where both reached it), of epochs to target
    (``epochs_to_target_ratio``: the same without the cost per step, graph compilation included; and of steps, for
    a language model's pair) and the differences of final top-1 and top-5 (``final_top1_difference``, row -
    reference, same epochs; masked-LM accuracy and loss for a language model's pair); mean and t-interval of each.

    Columns: ``comparison`` (``thor vs baseline``), ``measure``, ``mean``, ``ci_low``, ``ci_high``, ``n``, and
    ``seeds_to_decide`` (``seeds_to_decide``: ``n`` when the interval excludes no effect already).
    """
    by_seed = runs.set_index([RESULT_KEY, "seed"])
    present = set(runs[RESULT_KEY])
    rows = []
    for result, reference in paired_rows() if pairs is None else pairs:
        if result not in present or reference not in present:
            continue
        other, base = by_seed.loc[result], by_seed.loc[reference]
        seeds = sorted(set(other.index) & set(base.index))
        ours, theirs = other.loc[seeds], base.loc[seeds]
        measures = {"time_to_target_ratio": (ours["time_to_target_s"] / theirs["time_to_target_s"]).tolist()}
        if "final_mlm_accuracy" in runs and theirs["final_mlm_accuracy"].notna().all():  # a language model's pair
            measures |= {
                "steps_to_target_ratio": (ours["steps_to_target"] / theirs["steps_to_target"]).tolist(),
                "final_mlm_accuracy_difference": (ours["final_mlm_accuracy"] - theirs["final_mlm_accuracy"]).tolist(),
                "final_mlm_loss_difference": (ours["final_mlm_loss"] - theirs["final_mlm_loss"]).tolist(),
            }
        else:
            measures |= {
                "epochs_to_target_ratio": (ours["epochs_to_target"] / theirs["epochs_to_target"]).tolist(),
                "final_top1_difference": (ours["final_top1"] - theirs["final_top1"]).tolist(),
                "final_top5_difference": (ours["final_top5"] - theirs["final_top5"]).tolist(),
            }
        for measure, values in measures.items():
            mean, low, high, n = t_interval(values, confidence, DIFFERENCE_BOUNDS.get(measure))
            no_effect = 1.0 if measure.endswith("_ratio") else 0.0
            rows.append(
                {"comparison": f"{result} vs {reference}", "measure": measure, "mean": mean}
                | {"ci_low": low, "ci_high": high, "n": n}
                | {"seeds_to_decide": seeds_to_decide(values, no_effect, confidence)}
            )
    return pd.DataFrame(rows, columns=["comparison", "measure", "mean", "ci_low", "ci_high", "n", "seeds_to_decide"])


def curves_figure(
    curves: pd.DataFrame, target_top1: float | None = None, points: int = 60, confidence: float = CONFIDENCE
) -> Figure:
    """Accuracy on the step subset against training seconds: per result row each seed's curve (thin) and the mean
    over seeds with its t-interval as a band, on a common time grid up to the shortest run's last evaluation
    (linear interpolation between evaluations). ``curves``: columns result, seed, elapsed_s, top1 (a language
    model's rows: its held-out masked-LM accuracy, column mlm_accuracy, in place of top-1)."""
    figure = Figure(figsize=(7, 4.5), tight_layout=True)
    axes = figure.add_subplot()
    for index, (result, rows) in enumerate(curves.groupby(RESULT_KEY, sort=False)):
        colour = f"C{index}"
        language = "mlm_accuracy" in rows and rows["top1"].isna().all()
        group = rows.assign(top1=rows["mlm_accuracy"]) if language else rows
        series = [run.sort_values("elapsed_s") for _, run in group.groupby("seed")]
        for run in series:
            # a marker at each evaluation: a seed evaluated once (at its training's end) is a point, not nothing
            axes.plot(run["elapsed_s"], run["top1"], color=colour, alpha=0.25, linewidth=0.8, marker="o", markersize=3)
        end = min(run["elapsed_s"].max() for run in series)
        start = max(run["elapsed_s"].min() for run in series)
        if len(series) > 1 and end > start:
            grid = np.linspace(start, end, points)
            values = np.stack([np.interp(grid, run["elapsed_s"], run["top1"]) for run in series])
            mean = values.mean(axis=0)
            half = _t_quantile(0.5 + confidence / 2, len(series) - 1) * values.std(axis=0, ddof=1)
            half /= math.sqrt(len(series))
            axes.fill_between(grid, np.clip(mean - half, 0, 1), np.clip(mean + half, 0, 1), color=colour, alpha=0.25)
            axes.plot(grid, mean, color=colour, label=f"{result} (mean of {len(series)} seeds, {confidence:.0%} CI)")
        else:
            axes.plot([], [], color=colour, label=result)
    if target_top1 is not None:
        axes.axhline(target_top1, color="grey", linestyle="--", linewidth=0.8, label=f"target {target_top1:g}")
    axes.set_xlabel("training time (s, evaluations excluded)")
    axes.set_ylabel("val top-1, or held-out masked-LM accuracy (step subset)")
    axes.legend(loc="lower right")
    axes.grid(alpha=0.3)
    return figure
