"""By how much the recipes differ: each recipe's final accuracy against the baseline's, and dim_reduce's stage 2
against its control, at the budgets they trained (shown); from a multi-seed study when there is one (means and 95 %
intervals over the seeds), else from the single runs compared (labelled so). Plain data in, plain data out.

Differences of accuracies are in points (fractions x 100 in the readable table); their intervals stay within what a
difference of two accuracies can be.
"""

from __future__ import annotations

import math
from collections.abc import Mapping

import pandas as pd

from pipelines import fast_dev_run
from pipelines.report.compare import RunReader

DIFFERENCE_COLUMNS = ["comparison", "measure", "mean", "ci_low", "ci_high", "n", "budget", "source"]
ACCURACY_DIFFERENCES = ("final_top1_difference", "final_top5_difference")
SINGLE_RUNS = "single runs"


def single_run_differences(finals: Mapping[str, Mapping[str, float]], reference: str = "baseline") -> pd.DataFrame:
    """From one run per training: each training's final top-1/top-5 minus ``reference``'s, and ``stage2`` minus
    ``control``. ``finals``: training name -> ``top1``, ``top5``, ``epochs`` (its budget)."""
    pairs = [(name, reference) for name in finals if name not in (reference, "stage1", "control")]
    pairs.append(("stage2", "control"))
    rows = []
    for name, base in pairs:
        if name not in finals or base not in finals:
            continue
        this, that = finals[name], finals[base]
        budget = f"{int(this['epochs'])} vs {int(that['epochs'])} epochs"
        if this["epochs"] != that["epochs"]:
            budget += " (unequal)"
        for key, measure in (("top1", "final_top1_difference"), ("top5", "final_top5_difference")):
            rows.append(
                {
                    "comparison": f"{name} vs {base}",
                    "measure": measure,
                    "mean": this[key] - that[key],
                    "ci_low": math.nan,
                    "ci_high": math.nan,
                    "n": 1,
                    "budget": budget,
                    "source": SINGLE_RUNS,
                }
            )
    return pd.DataFrame(rows, columns=DIFFERENCE_COLUMNS)


def study_differences(paired: pd.DataFrame, seeds: int, epochs: int | None) -> pd.DataFrame:
    """The study's paired differences (``study.statistics.paired_differences``), labelled with its seeds and budget."""
    table = paired.copy()
    table["budget"] = f"{epochs} epochs each" if epochs else "the study's"
    table["source"] = f"study, {seeds} seeds"
    return table[DIFFERENCE_COLUMNS]


def newest_study(reader: RunReader) -> pd.DataFrame | None:
    """The paired differences of the experiment's newest finished study (not a ``fast_dev_run`` rehearsal), labelled
    with its seeds and budget."""
    for run in reader.search("tags.pipeline = 'study' and attributes.status = 'FINISHED'"):
        if fast_dev_run.TAG in run["tags"]:
            continue
        paired = reader.artifact_csv(run["run_id"], "study/paired.csv")
        if paired is not None and len(paired):
            seeds = int(paired.loc[paired["measure"] == "final_top1_difference", "n"].max())
            epochs = run["params"].get("study.epochs", "")
            return study_differences(paired, seeds, int(epochs) if epochs.isdigit() else None)
    return None


def combined(single: pd.DataFrame, study: pd.DataFrame | None) -> pd.DataFrame:
    """The study's rows where it compared the same pair, the single runs' for the other pairs."""
    if study is None or study.empty:
        return single.reset_index(drop=True)
    covered = set(study["comparison"])
    return pd.concat([study, single[~single["comparison"].isin(covered)]], ignore_index=True)[DIFFERENCE_COLUMNS]


def by_how_much(finals: Mapping[str, Mapping[str, float]], reader: RunReader) -> pd.DataFrame:
    """The report's differences: the single runs' (``Comparison.finals``), the newest study's where it has the pair."""
    return combined(single_run_differences(finals), newest_study(reader))


def readable(differences: pd.DataFrame) -> str:
    """A Markdown table: accuracy differences in points, ratios as they are, rounded, intervals beside the means."""
    lines = ["| comparison | measure | mean [95 % CI] | n | budget | source |", "| --- | --- | --- | --- | --- | --- |"]
    for row in differences.itertuples():
        scale, unit = (100.0, " pt") if row.measure in ACCURACY_DIFFERENCES else (1.0, "")
        mean = f"{scale * row.mean:+.2f}{unit}" if unit else f"{row.mean:.2f}"
        if math.isfinite(row.ci_low) and math.isfinite(row.ci_high):
            mean += (
                f" [{scale * row.ci_low:+.2f}, {scale * row.ci_high:+.2f}]"
                if unit
                else (f" [{row.ci_low:.2f}, {row.ci_high:.2f}]")
            )
        lines.append(f"| {row.comparison} | {row.measure} | {mean} | {row.n} | {row.budget} | {row.source} |")
    return "\n".join(lines) + "\n"
