"""Nodes of the ``study`` pipeline: the chosen recipes over several seeds, then their statistics and figure.

Each (recipe, seed) run is the recipe's own library training (``recipes.momentum.train_momentum``,
``recipes.thor.train_thor``) with the study's epoch budget and evaluation every ``study.eval_every_steps``
steps, logged into its own MLflow child run of the study's run (tags ``recipe``, ``seed``). A finished run
leaves ``<study.dir>/runs/<key>.json`` (written atomically; the key holds recipe, seed and a fingerprint of
the configuration), so a rerun of a killed study reads the finished runs from there instead of training them
again, and the unfinished run resumes from its last epoch checkpoint in ``<study.dir>/checkpoints/<key>``.
"""

from __future__ import annotations

import json
import logging
import os
import tempfile
from pathlib import Path

import pandas as pd
from matplotlib.figure import Figure

from pipelines import tracking
from pipelines.engine.callbacks import Callback
from pipelines.engine.checkpoint import Checkpoint
from pipelines.engine.loop import STEP_KEY, TRAIN_ELAPSED_S, TRAIN_EPOCH_TIME_S, VAL_STEP_TOP1, VAL_STEP_TOP5
from pipelines.engine.resume import fingerprint, remove_finished_checkpoints
from pipelines.params import (
    BaselineParams,
    BoostParams,
    DataParams,
    DistributedParams,
    ModelParams,
    RuntimeParams,
    StudyParams,
    ThorParams,
)
from pipelines.recipes.common import build_network
from pipelines.recipes.momentum import train_momentum
from pipelines.recipes.thor import thor_model, train_thor
from pipelines.reporting.study import MEASURES, curves_figure, paired_differences, run_figures, summarise

logger = logging.getLogger(__name__)

RUN_COLUMNS = [
    "recipe",
    "seed",
    "final_top1",
    "final_top5",
    "time_to_target_s",
    "epochs_to_target",
    "train_time_s",
    "steps_per_epoch",
    "mlflow_run_id",
    "key",
]
CURVE_COLUMNS = ["recipe", "seed", "step", "elapsed_s", "top1", "top5"]


class _StepsPerEpoch(Callback):
    """Remembers the training's steps per epoch (epochs to target = step / steps per epoch)."""

    steps_per_epoch = 0

    def on_train_begin(self, total_epochs: int, steps_per_epoch: int, start_epoch: int) -> None:
        self.steps_per_epoch = steps_per_epoch


def run_study(
    manifest: pd.DataFrame,
    class_index: dict[str, int],
    model: ModelParams,
    data: DataParams,
    runtime: RuntimeParams,
    distributed: DistributedParams,
    baseline: BaselineParams,
    thor: ThorParams,
    boost: BoostParams,
    study: StudyParams,
) -> tuple[pd.DataFrame, pd.DataFrame]:
    """Every recipe of ``study.recipes`` over every seed of ``study.seeds`` (those not finished earlier).

    Returns one row per run (``RUN_COLUMNS``: final top-1/top-5 on val after the last epoch, time and epochs
    to ``study.target_top1`` at step resolution, training seconds) and the step-evaluation curves
    (``CURVE_COLUMNS``: top-1/top-5 on the step subset against training seconds).
    """
    if distributed.worker_num != 1:
        raise ValueError(
            f"study runs its trainings in this process, one device: distributed.worker_num is "
            f"{distributed.worker_num}, set it to 1 for the study"
        )
    results = Path(study.dir) / "runs"
    results.mkdir(parents=True, exist_ok=True)
    sections = {"baseline": baseline, "thor": thor}
    runs, curves = [], []
    for recipe in study.recipes:
        for seed in study.seeds:
            section = sections[recipe].model_copy(
                update={"epochs": study.epochs, "eval_every_steps": study.eval_every_steps}
            )
            key = f"{recipe}-seed{seed}-" + fingerprint(
                recipe,
                model,
                data,
                section.model_dump(exclude={"checkpoint"}),
                seed,
                boost if recipe == "baseline" else None,
            )
            path = results / f"{key}.json"
            if path.exists():
                logger.info("study: %s finished earlier (%s), not run again", key, path)
                record = json.loads(path.read_text())
            else:
                record, final = _train_one(
                    recipe, seed, key, manifest, class_index, model, data, runtime, distributed, section, boost, study
                )
                _write_atomically(path, record)
                # the result file holds all the study needs: the run's epoch checkpoints (kept for a resume) go
                remove_finished_checkpoints(final)
            runs.append({"recipe": recipe, "seed": seed, **run_figures(record, study.target_top1)} | _run_facts(record))
            curves += [
                {
                    "recipe": recipe,
                    "seed": seed,
                    "step": row[STEP_KEY],
                    "elapsed_s": row[TRAIN_ELAPSED_S],
                    "top1": row[VAL_STEP_TOP1],
                    "top5": row[VAL_STEP_TOP5],
                }
                for row in record["step_history"]
            ]
    return pd.DataFrame(runs, columns=RUN_COLUMNS), pd.DataFrame(curves, columns=CURVE_COLUMNS)


def _train_one(
    recipe: str,
    seed: int,
    key: str,
    manifest: pd.DataFrame,
    class_index: dict[str, int],
    model: ModelParams,
    data: DataParams,
    runtime: RuntimeParams,
    distributed: DistributedParams,
    section: BaselineParams | ThorParams,
    boost: BoostParams,
    study: StudyParams,
) -> tuple[dict, Checkpoint]:
    """Train one (recipe, seed) run in its MLflow child run; its record for the result file, and its final state."""
    seeded = runtime.model_copy(update={"seed": seed})
    checkpoint = section.checkpoint.model_copy(update={"dir": str(Path(study.dir) / "checkpoints" / key)})
    section = section.model_copy(update={"checkpoint": checkpoint})
    steps = _StepsPerEpoch()
    callbacks = [tracking.EpochMetrics(), steps]
    logger.info("study: training %s (%d epochs, seed %d)", key, study.epochs, seed)
    with tracking.training_run(f"{recipe}-seed{seed}") as run:
        tracking.set_tags({"recipe": recipe, "seed": str(seed), "study_key": key})
        if recipe == "thor":
            initial = build_network(thor_model(model, section), class_index, seeded)
            result = train_thor(
                initial, manifest, class_index, model, data, seeded, distributed, section, callbacks=callbacks
            )
        else:
            initial = build_network(model, class_index, seeded)
            result = train_momentum(
                initial,
                manifest,
                class_index,
                model,
                data,
                seeded,
                distributed,
                section,
                epochs=section.epochs,
                schedule_epochs=section.epochs,
                boost=boost,
                callbacks=callbacks,
            )
        last = result.history[-1]  # the engine evaluates on the whole val split after the last epoch
        final = {"top1": last["val/top1"], "top5": last["val/top5"]}
        tracking.log_final(final)
    record = {
        "recipe": recipe,
        "seed": seed,
        "key": key,
        "mlflow_run_id": None if run is None else run.info.run_id,
        "final_top1": final["top1"],
        "final_top5": final["top5"],
        "steps_per_epoch": steps.steps_per_epoch,
        "history": result.history,
        "step_history": result.step_history,
    }
    return record, result.checkpoint


def _run_facts(record: dict) -> dict:
    return {
        "train_time_s": sum(row[TRAIN_EPOCH_TIME_S] for row in record["history"]),
        "steps_per_epoch": record["steps_per_epoch"],
        "mlflow_run_id": record["mlflow_run_id"],
        "key": record["key"],
    }


def _write_atomically(path: Path, record: dict) -> None:
    """Write ``record`` as JSON to ``path`` through a temporary file and a rename: a killed study leaves either
    the whole file or none."""
    with tempfile.NamedTemporaryFile("w", dir=path.parent, suffix=".tmp", delete=False) as handle:
        json.dump(record, handle, indent=1)
        handle.flush()
        os.fsync(handle.fileno())
    os.replace(handle.name, path)


def summarise_study(runs: pd.DataFrame, study: StudyParams) -> tuple[pd.DataFrame, pd.DataFrame]:
    """Per recipe mean and 95 % t-interval of each measure, and the paired differences against the first recipe;
    the means go to the study's MLflow run (``study/<recipe>/<measure>``, ``study/<recipe>_vs_<first>/<measure>``)."""
    summary = summarise(runs)
    paired = paired_differences(runs, reference=study.recipes[0])
    metrics = {
        f"study/{row['recipe']}/{measure}": row[measure] for _, row in summary.iterrows() for measure in MEASURES
    }
    metrics |= {
        f"study/{row['comparison'].replace(' vs ', '_vs_')}/{row['measure']}": row["mean"]
        for _, row in paired.iterrows()
    }
    tracking.log_metrics(metrics)
    _log_table(summary, paired)
    return summary, paired


def _log_table(summary: pd.DataFrame, paired: pd.DataFrame) -> None:
    lines = ["study (mean [95% CI], n):"]
    for _, row in summary.iterrows():
        cells = [
            f"{m} {row[m]:.4g} [{row[f'{m}_ci_low']:.4g}, {row[f'{m}_ci_high']:.4g}] n={row[f'{m}_n']}"
            for m in MEASURES
        ]
        lines.append(f"  {row['recipe']}: " + "; ".join(cells))
    for _, row in paired.iterrows():
        lines.append(
            f"  {row['comparison']} {row['measure']}: {row['mean']:.4g} [{row['ci_low']:.4g}, {row['ci_high']:.4g}] "
            f"n={row['n']}"
        )
    logger.info("\n".join(lines))


def plot_study(curves: pd.DataFrame, study: StudyParams) -> Figure:
    """Top-1 on the step subset against training time, per recipe: seeds, mean and 95 % band."""
    return curves_figure(curves, study.target_top1)
