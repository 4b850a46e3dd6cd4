"""Comparison of the training recipes from their MLflow runs: one table (a row per recipe, its run's budget,
accuracy, speed and time to target) and the histories behind it (``report.histories``), from the runs
``report.runs`` finds; ``report.figures`` draws them.

Times are training time: the sum of the per-epoch ``train/epoch_time_s`` (evaluation, data ingest and dim_reduce's
PCA are not counted); ``wall_time_s`` is the whole ``kedro run``.

This module reads MLflow only through a ``RunReader`` passed in (``pipelines.tracking.reader.MlflowRunReader``),
which hands over plain data; everything here is pandas.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

import numpy as np
import pandas as pd

from trainlib.metrics import EPOCH_KEYS, FINAL_KEYS, TRAIN_EPOCH_TIME_S, TRAIN_IMAGES_PER_S
from trainlib.params.recipe_spec import RESULT_KEY, recipe_specs, reference_among, result_named
from trainlib.params.renames import RENAMED_KEYS
from trainlib.readable import counted
from trainlib.report.differences import newest_study_run
from trainlib.report.histories import final_accuracy, recipe_curve, recipe_history, time_to_target
from trainlib.report.runs import (
    NoRunsError,
    Recipe,
    RunReader,
    RunRecord,
    children_by_training,
    find_run,
    missing_metrics,
    recipes_by_name,
)

logger = logging.getLogger(__name__)

# Parameters (as kedro-mlflow flattens them) that change what is trained on or what is trained;
# data loading settings that do not change the images (workers, evaluation batch, cache folder) are left out.
DATA_NETWORK_PREFIXES = ("data.", "network.")
NOT_DATA_OR_NETWORK = ("data.num_workers", "data.eval_batch_size", "data.cache_dir")
TABLE_COLUMNS = [
    "recipe",
    "run_id",
    "run_status",
    "env",
    "network",
    "image_size",
    "train_images",
    "epoch_images",
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
    "source",
]
SINGLE_RUN = "single run"
VARIANCE_ARTIFACT = "pca/pca_explained_variance.csv"
STUDY_RUNS_ARTIFACT = "study/runs.csv"  # a study's results: result (its result row), seed, mlflow_run_id, ...
STUDY_SUMMARY_ARTIFACT = "study/summary.csv"  # its means per result row: final_top1, final_top1_n, ...
VARIANCE_COLUMNS = ["component", "explained_variance", "explained_variance_ratio", "cumulative_ratio"]


@dataclass
class Comparison:
    """What the report is made of: the runs found, the table and the per-epoch histories."""

    runs: dict[str, RunRecord | None]
    table: pd.DataFrame
    histories: pd.DataFrame
    explained_variance: pd.DataFrame
    # each training's final top1/top5 and its budget (epochs), by name: the recipes', dim_reduce's stage2 and control
    finals: dict[str, dict[str, float]] = field(default_factory=dict)
    # the data and network settings of each training's run (data_and_network), by the same names
    settings: dict[str, dict[str, str | None]] = field(default_factory=dict)
    # the runs behind the table's rows, for the report's closing link: the single runs, and the study's trainings of
    # the recipes reported from the study
    read_runs: list[str] = field(default_factory=list)


def _number(value: str | None) -> int | None:
    return int(value) if value is not None and value.lstrip("-").isdigit() else None


def epoch_images(history: pd.DataFrame) -> int | None:
    """The images the first epoch of ``history`` (one training's curve) trained on, all workers: its images/s times
    its seconds, which the engine logs as steps x batch x workers over those seconds. Full batches only: the last,
    partial batch of an epoch is dropped, so a split of 3,000 images in batches of 64 gives 46 x 64 = 2,944. Of one
    run's history, not of a mean over seeds: the mean rate times the mean time is not the images (it is more)."""
    times = history[TRAIN_EPOCH_TIME_S].to_numpy(dtype=np.float64)
    rates = history[TRAIN_IMAGES_PER_S].to_numpy(dtype=np.float64)
    known = ~(np.isnan(times) | np.isnan(rates))
    return round(float(rates[known][0] * times[known][0])) if known.any() else None


def table_row(
    recipe: Recipe, run: RunRecord, history: pd.DataFrame, final: Mapping[str, float], target_top1: float, resumed: bool
) -> dict:
    """One row of the comparison table for a recipe with a run.

    ``history`` is the recipe's curve (``recipe_curve``); ``final`` its last training's final evaluation.
    ``train_images`` is the run's train split as its tag says (the manifest's count, as on every run);
    ``epoch_images`` the images one epoch trained on (``epoch_images``: full batches, so fewer); network, image size
    and seed are the run's logged parameters.
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
        "network": run_params(run).get("network.name"),
        "image_size": _number(run["params"].get("data.image_size")),
        "train_images": _number(run["tags"].get("train_images")),
        "epoch_images": epoch_images(history),
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


def run_params(run: RunRecord) -> dict[str, str | None]:
    """A run's params by their current keys: a run logged before a rename (``model.name``, now ``network.name``,
    ``params.renames``) reads as a new one."""
    return {RENAMED_KEYS.get(key, key): value for key, value in run["params"].items()}


def data_and_network(run: RunRecord) -> dict[str, str | None]:
    """The settings that decide what a run trained on and what it trained: its data and network
    parameters and its configuration environment (key ``env``)."""
    settings: dict[str, str | None] = {
        key: value
        for key, value in run_params(run).items()
        if key.startswith(DATA_NETWORK_PREFIXES) and key not in NOT_DATA_OR_NETWORK
    }
    settings["env"] = run["tags"].get("env")
    return settings


def setting_differences(settings: Mapping[str, Mapping[str, str | None]]) -> dict[str, str]:
    """Per recipe, ``key=value`` of each data or network setting on which the compared runs disagree.

    ``settings`` maps a recipe to its run's ``data_and_network``; a setting one run lacks counts as
    differing (its value shows as ``?``). Empty strings when every run agrees.
    """
    keys = sorted({key for values in settings.values() for key in values})
    differing = [key for key in keys if len({values.get(key) for values in settings.values()}) > 1]
    return {
        recipe: "; ".join(f"{key}={'?' if values.get(key) is None else values[key]}" for key in differing)
        for recipe, values in settings.items()
    }


def unequal_budgets(table: pd.DataFrame, settings: Mapping[str, Mapping[str, str | None]]) -> dict[str, str]:
    """Per recipe with a run, why its run is not compared side by side with the reference's (``reference_among``:
    the baseline's, else the first recipe's with a run): other epochs, or other data or network settings; empty
    when the budgets are equal."""
    rows = table[table["run_status"] != "missing"].set_index("recipe")
    recipes = [recipe for recipe in rows.index if recipe in settings]
    if not recipes:
        return {}
    reference = reference_among(recipes)
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


def study_trainings(reader: RunReader, study: RunRecord) -> dict[str, dict[int, dict[str, RunRecord]]]:
    """The finished training runs behind ``study``'s results, by their ``recipe`` tag, seed and result row:
    ``{"dim_reduce": {0: {"stage1": ..., "stage2": ..., "control": ...}}}``. Read from its ``runs.csv`` (each
    result's MLflow run), not from its child runs: a resumed study reads a result trained by an earlier, killed
    run, whose run is that run's child; and a tuning's trials are not results. A recipe's other trainings, which give
    no result row (dim_reduce's stage 1), are the runs of the same ``study_key``. A study of before the rename names
    the result row ``recipe`` in its runs.csv: read as ``result`` (``recipe_spec.result_named``)."""
    table = reader.artifact_csv(study["run_id"], STUDY_RUNS_ARTIFACT)
    table = None if table is None else result_named(table)
    found: dict[str, dict[int, dict[str, RunRecord]]] = {}
    for row in [] if table is None else table.itertuples():
        run = reader.get(row.mlflow_run_id) if isinstance(row.mlflow_run_id, str) else None
        if run is None or run["status"] != "FINISHED":
            continue
        tags = run["tags"]
        result = getattr(row, RESULT_KEY)
        by_result = found.setdefault(tags.get("recipe", result), {}).setdefault(int(row.seed), {})
        by_result[result] = run
        spec = recipe_specs().get(tags.get("recipe", ""))
        if spec is None or "study_key" not in tags:
            continue
        for other, _ in spec.other_trainings:
            if other not in by_result and (
                runs := reader.search(
                    f"tags.study_key = '{tags['study_key']}' and tags.result = '{other}' "
                    "and attributes.status = 'FINISHED'"
                )
            ):
                by_result[other] = runs[0]
    return found


def studied_seeds(recipe: Recipe, trainings: Mapping[int, Mapping[str, RunRecord]]) -> dict[int, dict[str, RunRecord]]:
    """The seeds on which the study trained all of ``recipe``'s trainings, each complete (``missing_metrics``)."""
    names = (*recipe.trainings, *recipe.side_trainings) or (recipe.name,)
    complete = {}
    for seed, by_result in sorted(trainings.items()):
        if not all(name in by_result for name in names):
            continue
        run = by_result[recipe.name] if not recipe.trainings else by_result[recipe.trainings[-1]]
        if not missing_metrics(recipe, run, by_result):
            complete[seed] = {name: by_result[name] for name in names}
    return complete


def mean_history(histories: Sequence[pd.DataFrame]) -> pd.DataFrame:
    """The per-epoch mean of several seeds' histories of one recipe (``recipe_history``), epoch by epoch."""
    keys = ["recipe", "run_id", "training", "epoch"]
    joined = pd.concat(histories, ignore_index=True)
    numbers = [column for column in joined.columns if column not in keys]
    return joined.groupby(keys, sort=False, as_index=False)[numbers].mean()[list(joined.columns)]


def compare(
    reader: RunReader,
    recipes: Sequence[str],
    target_top1: float,
    run_ids: Mapping[str, str | None] | None = None,
) -> Comparison:
    """Find each recipe's runs in ``reader``'s experiment and build the table and histories.

    A recipe the newest study (``newest_study_run``, the one ``by_how_much`` compares) trained is reported from the
    study, unless ``run_ids`` pins its run: its row holds the means over the study's seeds (``source`` ``study, N
    seeds``), its history their per-epoch mean; so the table, the figures and the summary tell one story. Another
    recipe is reported from its single run (``find_run``); one of these whose source differs from the reference's
    (the baseline's) is left out of the side-by-side comparison, with why. A recipe without a run is a row with
    ``run_status`` ``missing`` (and a log line); no run at all raises ``NoRunsError``. Runs that differ in data or
    network are named in a warning and in the table's ``differs`` column.
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
    sources: dict[str, str] = {}
    read_runs: list[str] = []
    study = newest_study_run(reader)
    studied = study_trainings(reader, study[0]) if study else {}
    for recipe in chosen:
        seeds = studied_seeds(recipe, studied.get(recipe.name, {}))
        if seeds and study and not (run_ids or {}).get(recipe.name):
            history, rows[recipe.name] = _studied(reader, recipe, study[0], seeds, target_top1)
            histories.append(history)
            sources[recipe.name] = rows[recipe.name]["source"]
            settings[recipe.name] = data_and_network(study[0])
            read_runs += [training["run_id"] for by_result in seeds.values() for training in by_result.values()]
            runs[recipe.name] = None  # no single run: its figures are the study's
            logger.info("Report: %s from study %s (%s)", recipe.name, study[0]["run_id"], sources[recipe.name])
            continue
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
        rows[recipe.name]["source"] = sources[recipe.name] = SINGLE_RUN
        settings[recipe.name] = data_and_network(run)
        read_runs.append(run["run_id"])
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
                "source": SINGLE_RUN,
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
            "Report: the compared runs differ in data or network, so their figures are not like for like: %s",
            " | ".join(f"{recipe}: {differs}" for recipe, differs in differences.items()),
        )
    table = pd.DataFrame(list(rows.values()), columns=TABLE_COLUMNS).astype(
        {
            "epochs": "Int64",
            "epoch_to_target": "Int64",
            "image_size": "Int64",
            "train_images": "Int64",
            "epoch_images": "Int64",
            "seed": "Int64",
        }  # fmt: skip
    )
    left_out = unequal_budgets(table, settings) | other_sources(sources)
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
        read_runs=read_runs,
    )


def _studied(
    reader: RunReader, recipe: Recipe, study: RunRecord, seeds: Mapping[int, Mapping[str, RunRecord]], target: float
) -> tuple[pd.DataFrame, dict]:
    """A recipe reported from the study: its per-epoch mean history over ``seeds`` (its trainings' runs by seed)
    and its table row (the study's run, the means of the seeds' final evaluations: the study's own, ``study_means``,
    where it averaged these seeds)."""
    histories, finals = [], []
    last = (recipe.trainings or (recipe.name,))[-1]  # the result row of the recipe's final evaluation
    for trained in seeds.values():
        metrics = {
            name: reader.metric_history(child["run_id"], (*EPOCH_KEYS, *FINAL_KEYS)) for name, child in trained.items()
        }
        histories.append(recipe_history(recipe, study["run_id"], metrics))
        finals.append(final_accuracy(metrics[last]))
    history = mean_history(histories)
    final = {key: float(np.mean([each[key] for each in finals])) for key in ("top1", "top5")}
    final |= study_means(reader, study, last, len(seeds))
    resumed = any("resumed_from" in child["tags"] for trained in seeds.values() for child in trained.values())
    row = table_row(recipe, study, recipe_curve(history), final, target, resumed)
    # the study's run is not one training: no single seed, and its wall time is every recipe's; the images an epoch
    # saw are one seed's (every seed's are the same), not the product of the mean rate and the mean time
    row |= {"seed": None, "wall_time_s": math.nan, "source": f"study, {counted(len(seeds), 'seed')}"}
    row["epoch_images"] = epoch_images(recipe_curve(histories[0]))
    return history, row


def study_means(reader: RunReader, study: RunRecord, result: str, seeds: int) -> dict[str, float]:
    """The study's own means of ``result``'s final top-1/top-5 (its ``summary.csv``) when they are over ``seeds``
    seeds, the ones the report read: so comparison.csv shows the number summary.csv shows, not a second computation
    of it that may round the other way (the study averages its runs.csv, rounded to six digits, and 0.2666665 then
    reads 0.266666 where the mean of the unrounded metrics reads 0.266667). Empty where the study has no such row."""
    summary = reader.artifact_csv(study["run_id"], STUDY_SUMMARY_ARTIFACT)
    summary = None if summary is None else result_named(summary)  # a study's of before the rename: ``recipe``
    if summary is None or RESULT_KEY not in summary:
        return {}
    rows = summary[summary[RESULT_KEY] == result]
    averaged = [key for key in ("top1", "top5") if {f"final_{key}", f"final_{key}_n"} <= set(summary.columns)]
    return {
        key: float(rows[f"final_{key}"].iloc[0])
        for key in averaged
        if len(rows) and rows[f"final_{key}_n"].iloc[0] == seeds
    }


def other_sources(sources: Mapping[str, str]) -> dict[str, str]:
    """Per recipe reported from another source than the reference's (``reference_among``: the baseline's, else the
    first recipe's): why it is not compared side by side. A study's means and a single run are not a pair."""
    if not sources:
        return {}
    reference = reference_among(sources)
    return {
        recipe: (
            f"from {source}, {reference} from {sources[reference]}: not a pair; "
            + (f"add {recipe} to study.recipes" if source == SINGLE_RUN else f"pin {recipe}'s run (report.run_ids)")
        )
        for recipe, source in sources.items()
        if source != sources[reference]
    }
