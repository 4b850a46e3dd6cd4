"""Nodes of the ``study`` pipeline: the chosen recipes over several seeds (``study.runner``), then their
statistics and figure (``study.statistics``). Each training is an MLflow child run of the study's run (tags
``recipe``, ``result``: its result row, ``seed``); finished runs are kept in ``study.dir`` and never trained again.
The study's tables name each training's result row in the column ``result``; one written before, which named it
``recipe`` (a rerun from ``study.summarise`` on an earlier runs.csv), is read through ``recipe_spec.result_named``."""

from __future__ import annotations

import logging
import math
from pathlib import Path

import pandas as pd
from matplotlib.figure import Figure

from pipelines import tracking
from pipelines.study.recipe_runs import RecipePipelines, plain
from trainlib.metrics import VAL_STEP_MLM_ACCURACY, VAL_STEP_TOP1
from trainlib.params import StudyParams, TargetParams, ThorBertParams
from trainlib.params.recipe_spec import RESULT_KEY, result_named
from trainlib.report.differences import in_points
from trainlib.study.runner import StudyPlan, run_study
from trainlib.study.statistics import (
    MEASURES,
    curves_figure,
    curves_table,
    paired_differences,
    runs_table,
    summarise,
)
from trainlib.study.tuning import CHOICE_COLUMNS, choices_rows, run_tuned_study, tuning_figures

logger = logging.getLogger(__name__)


def run_recipes(
    manifest: pd.DataFrame,
    class_index: dict[str, int],
    parameters: dict,
    study: StudyParams,
    target: TargetParams,
) -> tuple[pd.DataFrame, pd.DataFrame, pd.DataFrame]:
    """Every recipe of ``study.recipes`` over every seed of ``study.seeds`` (those not finished earlier), each
    seed's trainings the recipe's own pipeline (``recipe_runs``) on the data pipeline's ``manifest`` and
    ``class_index`` and the configuration ``parameters``; with ``study.tuning.trials`` > 0 each recipe's trainings
    are first tuned (``study.tuning``; thor_bert's two each with their own trials, on
    ``thor_bert.target_mlm_accuracy``) and their best values train on those seeds.

    Returns one row per result (``statistics.RUN_COLUMNS``: the result row in the column ``result``, final
    top-1/top-5 on val after the last epoch, time, steps and epochs to ``target.top1`` at step resolution, training
    seconds; thor_bert's rows: the held-out masked-LM accuracy and loss, and the target
    ``thor_bert.target_mlm_accuracy``), the step-evaluation curves
    (``statistics.CURVE_COLUMNS``: top-1/top-5, or masked-LM accuracy, on the step subset against training seconds)
    and the tuning's chosen values beside the documented ones (``CHOICE_COLUMNS``; no rows without tuning).
    """
    target_mlm_accuracy = plain(parameters)["thor_bert"]["target_mlm_accuracy"]
    targets = {VAL_STEP_TOP1: target.top1, VAL_STEP_MLM_ACCURACY: target_mlm_accuracy}
    plan = StudyPlan(
        study.recipes, study.seeds, study.epochs, study.eval_every_steps, Path(study.dir), study.adasum_workers
    )
    trainer = RecipePipelines(parameters, manifest, class_index, plan)
    tunings = []
    study_runs = tracking.StudyRuns()
    if study.tuning.trials:
        records, tunings = run_tuned_study(trainer, plan, study_runs, tuning=study.tuning, targets=targets)
    else:
        records = run_study(trainer, plan, study_runs)
    choices = pd.DataFrame(choices_rows(tunings, tuning=study.tuning), columns=CHOICE_COLUMNS)
    return runs_table(records, targets), curves_table(records), choices


def summarise_study(runs: pd.DataFrame) -> tuple[pd.DataFrame, pd.DataFrame]:
    """Per result row mean and 95 % t-interval of each measure, and the paired differences (thor against
    baseline, stage2 against control, adasum against allreduce), differences of accuracies in points, rounded as
    logged (column ``unit``); the means go to the study's MLflow run as fractions, as every accuracy metric
    (``study/<result>/<measure>``, ``study/<result>_vs_<reference>/<measure>``)."""
    runs = result_named(runs)
    summary = summarise(runs)
    paired = paired_differences(runs)
    metrics = {
        f"study/{row[RESULT_KEY]}/{measure}": row[measure]
        for _, row in summary.iterrows()
        for measure in MEASURES
        if measure in row
    }
    metrics |= {
        f"study/{row['comparison'].replace(' vs ', '_vs_')}/{row['measure']}": row["mean"]
        for _, row in paired.iterrows()
    }
    tracking.log_metrics(metrics)
    paired = in_points(paired)  # paired.csv as the log prints it: accuracy differences in points, rounded
    _log_table(summary, paired)
    return summary, paired


def _log_table(summary: pd.DataFrame, paired: pd.DataFrame) -> None:
    lines = ["study (mean [95% CI], n):"]
    for _, row in summary.iterrows():
        cells = [
            f"{m} {row[m]:.4g} [{row[f'{m}_ci_low']:.4g}, {row[f'{m}_ci_high']:.4g}] n={row[f'{m}_n']}"
            for m in MEASURES
            if row.get(f"{m}_n", 0) > 0  # a row's own measures: top-1 or masked-LM accuracy
        ]
        lines.append(f"  {row[RESULT_KEY]}: " + "; ".join(cells))
    for _, row in paired.iterrows():
        unit = " pt" if row["unit"] == "pt" else ""
        if row["n"] == 0:  # a time ratio needs a seed on which both reached the target
            lines.append(f"  {row['comparison']} {row['measure']}: none (no seed on which both reached the target)")
            continue
        lines.append(
            f"  {row['comparison']} {row['measure']}: {row['mean']:g}{unit} [{row['ci_low']:g}, {row['ci_high']:g}] "
            f"n={row['n']}{_undecided(row)}"
        )
    logger.info("\n".join(lines))


def _undecided(row: pd.Series) -> str:
    needed = row["seeds_to_decide"]
    if not math.isfinite(needed) or needed <= row["n"]:
        return ""  # decided, or no count of seeds would be
    return f" (undecided: about {needed:.0f} seeds at this spread)"


def plot_study(curves: pd.DataFrame, target: TargetParams, thor_bert: ThorBertParams) -> Figure:
    """Top-1 (thor_bert's rows: held-out masked-LM accuracy) on the step subset against training time, per result
    row: seeds, mean and 95 % band; the target line is top-1's, or the masked-LM one in a study of thor_bert only."""
    curves = result_named(curves)
    language_only = curves["top1"].isna().all() and curves["mlm_accuracy"].notna().any()
    return curves_figure(curves, thor_bert.target_mlm_accuracy if language_only else target.top1)


def plot_tuning(study: StudyParams, tuning_choices: pd.DataFrame) -> tuple[dict[str, Figure], dict[str, Figure]]:
    """Each tuned training's (``tuning_choices``, by result row) Optuna optimization history and parameter
    importances, as ``<result>.png``, read from ``study.tuning.storage``; none without tuning."""
    tuning_choices = result_named(tuning_choices)
    return tuning_figures(list(tuning_choices[RESULT_KEY].unique()), tuning=study.tuning)
