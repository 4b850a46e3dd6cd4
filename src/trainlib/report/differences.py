"""By how much the recipes differ, from one source per statement: a multi-seed study (means and 95 % intervals of the
paired differences over its seeds), or single runs at equal budget (one run each, no interval). Single runs of
unequal budget (other epochs, other data or network settings) are not compared: they are listed as left out, with the
reason. Plain data in, plain data out.

Units are the same everywhere, in the tables, the CSV files and the log: differences of accuracies in percentage
points (``pt``), ratios of times as they are, each rounded as it is printed (``POINT_DECIMALS``).
"""

from __future__ import annotations

import math
from collections.abc import Mapping

import pandas as pd

from trainlib import fast_dev_run
from trainlib.readable import counted
from trainlib.report.runs import RunReader, RunRecord

# seeds_to_decide: the study's estimate (study.statistics.seeds_to_decide) of the seeds whose interval would exclude no
# effect at the spread seen; empty for single runs and for a study's paired.csv of before the estimate
DIFFERENCE_COLUMNS = [
    "comparison", "measure", "mean", "ci_low", "ci_high", "n", "seeds_to_decide", "unit", "budget", "source"
]  # fmt: skip
LEFT_OUT_COLUMNS = ["comparison", "reason"]
# differences of accuracies: fractions from the runs, points (x 100) in every table
ACCURACY_DIFFERENCES = ("final_top1_difference", "final_top5_difference", "final_mlm_accuracy_difference")
# the measure a verdict is about: top-1 for the image recipes, masked-LM accuracy for BERT
HEADLINE_MEASURES = ("final_top1_difference", "final_mlm_accuracy_difference")
TARGET_MEASURES = ("time_to_target_ratio", "epochs_to_target_ratio", "steps_to_target_ratio")
POINTS, RATIO, LOSS = "pt", "ratio", "loss"
POINT_DECIMALS = 2  # points and ratios are printed and stored with two decimals
LOSS_DECIMALS = 3
SINGLE_RUNS = "single runs at equal budget"
# A study's interval needs this many seeds: with 2, Student's t has one degree of freedom (quantile 12.7), so the
# interval of an accuracy difference nearly always spans everything it can be, [-100, +100] pt, and says nothing; the
# report gives the seeds it would take instead
MIN_SEEDS = 3
MEASURE_NAMES = {
    "final_top1_difference": "final top-1",
    "final_top5_difference": "final top-5",
    "final_mlm_accuracy_difference": "final masked-LM accuracy",
}


def unit_of(measure: str) -> str:
    """``pt`` for a difference of accuracies, ``loss`` for one of losses, else ``ratio``."""
    if measure in ACCURACY_DIFFERENCES:
        return POINTS
    return LOSS if measure.endswith("_loss_difference") else RATIO


def in_points(differences: pd.DataFrame) -> pd.DataFrame:
    """``differences`` (``comparison``, ``measure``, ``mean``, ``ci_low``, ``ci_high``, ``n``; accuracies as
    fractions) with a ``unit`` column, differences of accuracies in points, every value rounded as it is printed.
    A table that has a ``unit`` column already is in these units and is returned as it is."""
    if "unit" in differences:
        return differences.copy()
    table = differences.copy()
    table["unit"] = table["measure"].map(unit_of)
    for column in ("mean", "ci_low", "ci_high"):
        scale = table["unit"].map({POINTS: 100.0}).fillna(1.0)
        decimals = table["unit"].map({LOSS: LOSS_DECIMALS}).fillna(POINT_DECIMALS)
        table[column] = [
            round(value * factor, int(places)) if math.isfinite(value) else math.nan
            for value, factor, places in zip(table[column].astype(float), scale, decimals, strict=True)
        ]
    return table


def budget_gap(
    this: Mapping[str, float], that: Mapping[str, float], settings: Mapping[str, Mapping[str, str | None]] | None
) -> str:
    """What makes two trainings' budgets unequal: their epochs, and each data or network setting on which their runs
    differ (``settings`` of each, by name under ``this["name"]``/``that["name"]``); empty when equal."""
    gaps = []
    if this["epochs"] != that["epochs"]:
        gaps.append(f"epochs {_count(this['epochs'])} vs {_count(that['epochs'])}")
    if settings is not None:
        ours, theirs = settings.get(str(this.get("name")), {}), settings.get(str(that.get("name")), {})
        for key in sorted({*ours, *theirs}):
            if ours.get(key) != theirs.get(key):
                gaps.append(f"{key} {_setting(ours.get(key))} vs {_setting(theirs.get(key))}")
    return "; ".join(gaps)


def _count(value: float) -> str:
    return str(int(value)) if math.isfinite(value) else "?"


def _budget(epochs: float) -> str:
    return f"{counted(int(epochs), 'epoch')} each" if math.isfinite(epochs) else "? epochs each"


def _setting(value: str | None) -> str:
    return "?" if value is None else value


def single_run_differences(
    finals: Mapping[str, Mapping[str, float]],
    *,
    settings: Mapping[str, Mapping[str, str | None]] | None = None,
    reference: str = "baseline",
) -> tuple[pd.DataFrame, pd.DataFrame]:
    """From one run per training, at equal budget: each training's final top-1/top-5 minus ``reference``'s, and
    ``stage2`` minus ``control``, in points. ``finals``: training name -> ``top1``, ``top5`` (fractions) and
    ``epochs`` (its budget); ``settings``: training name -> its run's data and network settings
    (``compare.data_and_network``). Returns the differences and the pairs left out for an unequal budget, with why."""
    pairs = [(name, reference) for name in finals if name not in (reference, "stage1", "control")]
    pairs.append(("stage2", "control"))
    rows, left_out = [], []
    for name, base in pairs:
        if name not in finals or base not in finals:
            continue
        this, that = {**finals[name], "name": name}, {**finals[base], "name": base}
        gap = budget_gap(this, that, None if name == "stage2" and base == "control" else settings)
        if gap:
            left_out.append({"comparison": f"{name} vs {base}", "reason": f"unequal budget: {gap}"})
            continue
        for key, measure in (("top1", "final_top1_difference"), ("top5", "final_top5_difference")):
            rows.append(
                {
                    "comparison": f"{name} vs {base}",
                    "measure": measure,
                    "mean": this[key] - that[key],
                    "ci_low": math.nan,
                    "ci_high": math.nan,
                    "n": 1,
                    "budget": _budget(this["epochs"]),
                    "source": SINGLE_RUNS,
                }
            )
    differences = in_points(pd.DataFrame(rows, columns=[c for c in DIFFERENCE_COLUMNS if c != "unit"]))
    return differences[DIFFERENCE_COLUMNS], pd.DataFrame(left_out, columns=LEFT_OUT_COLUMNS)


def study_differences(paired: pd.DataFrame, seeds: int, epochs: int | None) -> pd.DataFrame:
    """The study's paired differences (``study.statistics.paired_differences``, or its ``paired.csv`` in points),
    in points and labelled with its seeds and budget; a row of fewer than ``MIN_SEEDS`` seeds has no interval."""
    table = in_points(paired)
    if "seeds_to_decide" not in table:
        table["seeds_to_decide"] = math.nan
    too_few = table["n"] < MIN_SEEDS  # no interval below MIN_SEEDS: readable() says how many seeds it would take
    table.loc[too_few, ["ci_low", "ci_high"]] = math.nan
    table["budget"] = _budget(epochs) if epochs else "the study's"
    table["source"] = f"study, {counted(seeds, 'seed')}"
    return table[DIFFERENCE_COLUMNS]


def newest_study_run(reader: RunReader) -> tuple[RunRecord, pd.DataFrame] | None:
    """The experiment's newest finished study with paired differences (not a ``fast_dev_run`` rehearsal), and those
    differences in points, labelled with its seeds and budget."""
    for run in reader.search("tags.pipeline = 'study' and attributes.status = 'FINISHED'"):
        if fast_dev_run.TAG in run["tags"]:
            continue
        paired = reader.artifact_csv(run["run_id"], "study/paired.csv")
        if paired is not None and len(paired):
            headline = paired[paired["measure"].isin(HEADLINE_MEASURES)]
            seeds = int((headline if len(headline) else paired)["n"].max())
            epochs = run["params"].get("study.epochs", "")
            return run, study_differences(paired, seeds, int(epochs) if epochs.isdigit() else None)
    return None


def newest_study(reader: RunReader) -> pd.DataFrame | None:
    """The paired differences of the experiment's newest finished study (``newest_study_run``)."""
    found = newest_study_run(reader)
    return None if found is None else found[1]


def combined(single: pd.DataFrame, study: pd.DataFrame | None) -> pd.DataFrame:
    """The study's rows where it compared the same pair, the single runs' for the other pairs."""
    if study is None or study.empty:
        return single.reset_index(drop=True)
    covered = set(study["comparison"])
    return pd.concat([study, single[~single["comparison"].isin(covered)]], ignore_index=True)[DIFFERENCE_COLUMNS]


def by_how_much(
    finals: Mapping[str, Mapping[str, float]],
    reader: RunReader,
    *,
    settings: Mapping[str, Mapping[str, str | None]] | None = None,
) -> tuple[pd.DataFrame, pd.DataFrame]:
    """The report's differences, in points: the newest study's where it has the pair, else the single runs'
    (``Comparison.finals``, ``Comparison.settings``) at equal budget; and the single-run pairs left out, with why
    (and that the study compares the pair instead, where it does)."""
    study = newest_study(reader)
    single, left_out = single_run_differences(finals, settings=settings)
    if study is not None:
        studied = left_out["comparison"].isin(set(study["comparison"]))
        left_out.loc[studied, "reason"] += "; the study compares this pair at equal budget instead"
    return combined(single, study), left_out


def _number(value: float, unit: str) -> str:
    places = LOSS_DECIMALS if unit == LOSS else POINT_DECIMALS
    sign = "+" if unit in (POINTS, LOSS) else ""
    return f"{value:{sign}.{places}f}" + (" pt" if unit == POINTS else "")


def _interval(row) -> str:
    places = LOSS_DECIMALS if row.unit == LOSS else POINT_DECIMALS
    sign = "+" if row.unit in (POINTS, LOSS) else ""
    return f"[{row.ci_low:{sign}.{places}f}, {row.ci_high:{sign}.{places}f}]"


def _has_interval(row) -> bool:
    return math.isfinite(row.ci_low) and math.isfinite(row.ci_high)


def seeds_needed(row) -> str:
    """Why a study's row has no interval and how many seeds would give one: ``from 2 seeds, too few for a 95 %
    interval; about 11 seeds would decide at this spread``. The count is the study's ``seeds_to_decide`` where it is
    more than ``MIN_SEEDS``, else ``MIN_SEEDS``, the fewest that give an interval at all."""
    n = int(row.n)
    needed = row.seeds_to_decide
    where = f"from {counted(n, 'seed')}, too few for a 95 % interval"
    if n < 2:
        return f"{where} (one has no spread); run at least {MIN_SEEDS}"
    if not math.isfinite(needed):  # the mean is no effect itself, or no affordable count would tell it from none
        return f"{where}; at this spread no number of seeds would tell it from no difference"
    if needed > MIN_SEEDS:
        return f"{where}; about {needed:.0f} seeds would decide at this spread"
    return f"{where}; run at least {MIN_SEEDS}"


def verdict(differences: pd.DataFrame) -> str:
    """One sentence: who won the first comparison (the study's where there is one), by how much, with the 95 %
    interval of the paired difference; ``Inconclusive`` when the interval spans zero or there is none (one run
    each, or a study of fewer than ``MIN_SEEDS`` seeds: then with the seeds it would take, ``seeds_needed``)."""
    headline = differences[differences["measure"].isin(HEADLINE_MEASURES)]
    if headline.empty:
        return (
            "No verdict: no study in the experiment and no pair of single runs at equal budget to compare, so no "
            "differences.csv (see what was left out below)."
        )
    studied = headline[headline["source"] != SINGLE_RUNS]
    row = next((studied if len(studied) else headline).itertuples())
    ours, theirs = row.comparison.split(" vs ")
    what = MEASURE_NAMES[row.measure]
    where = f"{row.source}, {row.budget}"
    if not _has_interval(row) and row.source != SINGLE_RUNS:
        return f"Inconclusive: {ours} - {theirs} is {_number(row.mean, row.unit)} {what} {seeds_needed(row)} ({where})."
    if not _has_interval(row):
        return (
            f"Inconclusive: {ours} - {theirs} is {_number(row.mean, row.unit)} {what} from one run each ({where}), "
            "with no interval; run the study for one."
        )
    interval = f"95 % CI {_interval(row)} pt"
    if row.ci_low > 0:
        return f"{ours} beat {theirs} by {_number(row.mean, row.unit)} {what} ({interval}; {where})."
    if row.ci_high < 0:
        against = f"{interval} for {ours} - {theirs}"
        return f"{theirs} beat {ours} by {_number(-row.mean, row.unit)} {what} ({against}; {where})."
    return (
        f"Inconclusive: {ours} - {theirs} is {_number(row.mean, row.unit)} {what}, but the {interval} spans zero "
        f"({where})."
    )


def _cell(row) -> str:
    if row.n == 0 or not math.isfinite(row.mean):
        return "—"
    if _has_interval(row):
        return f"{_number(row.mean, row.unit)} {_interval(row)}"
    if row.source == SINGLE_RUNS:  # one run each: the heading says there is no interval
        return _number(row.mean, row.unit)
    return f"{_number(row.mean, row.unit)} ({seeds_needed(row)})"


def readable(differences: pd.DataFrame, left_out: pd.DataFrame | None = None, *, target_top1: float) -> str:
    """``summary.md``: the verdict sentence first, then one table per source under a heading that names it (the
    study; single runs at equal budget), then the pairs left out and why. Accuracy differences in points, ratios as
    they are, rounded as in the CSV files."""
    lines = [verdict(differences), ""]
    for source, rows in differences.groupby("source", sort=False):
        heading = "Single runs at equal budget (one run each, no interval)" if source == SINGLE_RUNS else source
        lines += [
            f"## From the {heading[0].lower() + heading[1:]}",
            "",
            "| comparison | measure | mean [95 % CI] | n | budget |",
            "| --- | --- | --- | --- | --- |",
        ]
        lines += [f"| {r.comparison} | {r.measure} | {_cell(r)} | {r.n} | {r.budget} |" for r in rows.itertuples()]
        unreached = rows[(rows["n"] == 0) & rows["measure"].isin(TARGET_MEASURES)]
        if len(unreached):
            lines += [
                "",
                f"—: no seed on which both recipes reached the target top-1 of {100 * target_top1:g} % (target.top1), "
                "so there is no ratio to average.",
            ]
        lines.append("")
    if left_out is not None and len(left_out):
        lines += ["## Left out", ""]
        lines += [
            f"- {r.comparison} (single runs): {r.reason}; not compared side by side." for r in left_out.itertuples()
        ]
        lines.append("")
    return "\n".join(lines)
