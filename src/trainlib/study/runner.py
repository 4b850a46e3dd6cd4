"""A multi-seed study: each chosen recipe over each seed, on the same data and evaluation, resumable.

A recipe trains what its own pipeline trains (``kedro run --pipelines=<recipe>``): the study is given a
``RecipeTrainer`` (the ``study`` pipeline's runs that pipeline per seed), sets the study's budget on each result
row's section (``recipe_spec.ResultRow.budgeted``: ``study.epochs`` and ``study.eval_every_steps``; dim_reduce
keeps its stages' epochs) and keeps one record per result row. Every training evaluates every ``eval_every_steps``
steps on a fixed subset (``data.step_eval_images``; thor_bert: ``thor_bert.step_eval_examples`` held-out examples),
so time to target is read at step resolution.

A finished (recipe, seed) run leaves ``<dir>/runs/<key>.<result>.json`` (the key holds recipe, seed and a
fingerprint of every parameter its pipeline reads), written atomically; a rerun reads it instead of training again,
and an unfinished run resumes from its epoch checkpoints in ``<dir>/checkpoints/<key>``. Kedro and MLflow come in
as ``RecipeTrainer`` and ``StudyTracking``, so this module imports neither.
"""

from __future__ import annotations

import json
import logging
import shutil
from collections.abc import Mapping, Sequence
from contextlib import AbstractContextManager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Protocol

from trainlib.atomic_write import write_atomically
from trainlib.engine.callbacks import Callback
from trainlib.metrics import (
    VAL_MLM_ACCURACY,
    VAL_MLM_LOSS,
    VAL_STEP_MLM_ACCURACY,
    VAL_STEP_TOP1,
    VAL_TOP1,
    VAL_TOP5,
)
from trainlib.params.recipe_spec import RESULT_KEY, RecipeSpec, ResultRow, recipe_specs, result_named, result_rows

logger = logging.getLogger(__name__)


class StudyTracking(Protocol):
    """What the study needs of experiment tracking (the ``study`` pipeline passes MLflow's). Each training's run
    is tagged ``recipe`` (the study's), ``result`` (its result row; ``stage1`` for dim_reduce's first stage),
    ``seed`` and ``study_key``; a result file is ``<study_key>.<result>.json``."""

    def run(
        self, name: str, tags: Mapping[str, str], params: Mapping[str, object]
    ) -> AbstractContextManager[str | None]:
        """A child run of the study's run for one training, active meanwhile, with the parameter sections
        ``params`` it trained with (a child of that name is continued); yields its id (None: no tracking)."""

    def callbacks(self) -> list[Callback]:
        """Engine callbacks the study adds to those of the recipe's own code (a tuning trial's pruner)."""

    def log_final(self, accuracy: Mapping[str, float]) -> None:
        """Log the final full-val ``top1``/``top5`` (a language model's ``mlm_accuracy``/``mlm_loss``) into the
        active child run."""

    def set_tags(self, tags: Mapping[str, str]) -> None:
        """Set ``tags`` on the active child run (a tuning trial's state)."""

    def fail_runs(self, run_ids: Sequence[str], *, error: str) -> None:
        """End FAILED, tagged ``trial_state`` FAIL and ``trial_error`` ``error``, the child runs ``run_ids`` of a
        tuning trial whose process died (maybe on another machine), and the study runs they belong to."""


@dataclass(frozen=True)
class Trained:
    """One result row's training as the study keeps it: its child run, the engine's per-epoch rows (the last holds
    the evaluation on the whole val split), its step evaluations and steps per epoch."""

    run_id: str | None
    history: list[dict[str, float]]
    step_history: list[dict[str, float]]
    steps_per_epoch: int


class RecipeTrainer(Protocol):
    """How the study trains a recipe: what its pipeline runs, with the study's changes to the configuration."""

    def configured(self, key: str) -> object:
        """The configured value of the dotted parameter key ``key`` (``thor.lr.peak``)."""

    def configuration(self, recipe: str, seed: int, values: Mapping[str, object]) -> str:
        """A fingerprint of every parameter ``recipe``'s trainings read on ``seed``, with ``values`` (dotted keys)
        set: two runs of one fingerprint train the same."""

    def train(
        self,
        recipe: str,
        seed: int,
        key: str,
        results: Sequence[str],
        values: Mapping[str, object],
        tracking: StudyTracking,
    ) -> dict[str, Trained]:
        """Train ``recipe``'s result rows ``results`` on ``seed`` with ``values`` set, each in a child run of
        ``tracking``, checkpoints under ``<dir>/checkpoints/<key>``."""


@dataclass(frozen=True)
class StudyPlan:
    recipes: Sequence[str]
    seeds: Sequence[int]
    epochs: int  # the budgeted rows' epochs; dim_reduce keeps its stage1.epochs + stage2.epochs
    eval_every_steps: int
    directory: Path
    adasum_workers: int = 2  # msrun ranks of the trainings of a recipe that trains on several (adasum)
    # the result rows to train, None: every row of each recipe; a tuning trial of one of thor_bert's two trainings
    # trains that one alone (the other rows' recipes give one row, or all of theirs)
    results: Sequence[str] | None = None
    # dotted parameter keys set on top of the configuration: a tuning trial's draw, a tuned recipe's choice
    values: Mapping[str, object] = field(default_factory=dict)


def run_study(trainer: RecipeTrainer, plan: StudyPlan, tracking: StudyTracking) -> list[dict]:
    """Every recipe of the plan over every seed, skipping the runs finished earlier; one record per result row.

    A record: ``result`` (a result row's name, ``recipe_spec.result_rows``), ``seed``, ``key``, ``mlflow_run_id``,
    ``final_top1``/``final_top5`` on the whole val split after the last epoch (thor_bert's rows:
    ``final_mlm_accuracy``/``final_mlm_loss`` on every held-out example), ``step_metric`` (the step-evaluation key
    time to target reads), ``steps_per_epoch``, and the engine's ``history`` (per epoch) and ``step_history`` (per
    step evaluation). A result file of before the rename holds the row under ``recipe``: it is read as ``result``
    (``recipe_spec.result_named``).
    """
    results = plan.directory / "runs"
    results.mkdir(parents=True, exist_ok=True)
    records: list[dict] = []
    warned: set[str] = set()  # the result rows warned of an epoch shorter than the evaluation interval
    for recipe in plan.recipes:
        rows = [row for row in result_rows()[recipe] if plan.results is None or row in plan.results]
        for seed in plan.seeds:
            key = f"{recipe}-seed{seed}-{trainer.configuration(recipe, seed, plan.values)}"
            paths = {row: results / f"{key}.{row}.json" for row in rows}
            if all(path.exists() for path in paths.values()):
                logger.info("study: %s finished earlier (%s), not run again", key, results)
                reused = [result_named(json.loads(path.read_text())) for path in paths.values()]
                for record in reused:
                    _log_reused(recipe, record, tracking)
                records += reused
                _warn_of_short_epochs(records, plan.eval_every_steps, warned)
                continue
            logger.info("study: training %s (seed %d)", key, seed)
            trained = trainer.train(recipe, seed, key, rows, plan.values, tracking)
            for row in rows:
                record = {RESULT_KEY: row, "seed": seed, "key": key, **figures(trained[row])}
                write_atomically(paths[row], json.dumps(record, indent=1).encode())
                records.append(record)
            # the result files hold all the study needs: the epoch checkpoints (kept for a resume) go
            shutil.rmtree(plan.directory / "checkpoints" / key, ignore_errors=True)
            _warn_of_short_epochs(records, plan.eval_every_steps, warned)
    return records


def _log_reused(recipe: str, record: Mapping, tracking: StudyTracking) -> None:
    """A child run for a result read back, so that every training of this study (every tuning trial's too) has
    one: tagged ``reused`` with ``reused_from``, the run that trained it, where its curves are; its final figures.
    The record keeps pointing at that run."""
    spec = recipe_specs()[recipe]
    row = next(row for row in spec.results if row.name == record[RESULT_KEY])
    seed = record["seed"]
    tags = {"recipe": recipe, "result": row.name, "seed": str(seed), "study_key": record["key"], "reused": "true"}
    if record.get("mlflow_run_id"):
        tags["reused_from"] = record["mlflow_run_id"]
    with tracking.run(training_title(spec, row.section, row, seed), tags, {}):
        tracking.log_final(final_accuracy(record["history"]))


def training_title(spec: RecipeSpec, training: str, row: ResultRow | None, seed: int) -> str:
    """A study training's run name: ``baseline/seed0``; a recipe of several trainings ``dim_reduce/stage2/seed0``,
    ``thor_bert/control/seed0`` (``training``: its namespace, for a training that gives no result row)."""
    if len(spec.results) == 1 and not spec.other_trainings:
        return f"{spec.name}/seed{seed}"
    part = training.rpartition(".")[2]
    if row is not None and row.name != spec.name:
        part = row.name.removeprefix(f"{spec.name}_")
    return f"{spec.name}/{part}/seed{seed}"


def final_accuracy(history: Sequence[Mapping[str, float]]) -> dict[str, float]:
    """The accuracy of the whole val split (every held-out example) after the last epoch, from the engine's last
    row: ``top1``/``top5``, or a language model's ``mlm_accuracy``/``mlm_loss``."""
    last = history[-1]
    if VAL_MLM_ACCURACY in last:
        return {"mlm_accuracy": last[VAL_MLM_ACCURACY], "mlm_loss": last[VAL_MLM_LOSS]}
    return {"top1": last[VAL_TOP1], "top5": last[VAL_TOP5]}


def figures(trained: Trained) -> dict:
    """What the study keeps of a training (plain data, kept in its result file)."""
    final = final_accuracy(trained.history)
    step_metric = VAL_STEP_MLM_ACCURACY if "mlm_accuracy" in final else VAL_STEP_TOP1
    return {
        "mlflow_run_id": trained.run_id,
        **{f"final_{name}": value for name, value in final.items()},
        "step_metric": step_metric,
        "steps_per_epoch": trained.steps_per_epoch,
        "history": trained.history,
        "step_history": trained.step_history,
    }


def short_epochs(records: Sequence[Mapping], eval_every_steps: int) -> dict[str, int]:
    """The result rows of ``records`` whose epoch has fewer steps than ``eval_every_steps``, with their steps per
    epoch: their step evaluations fall across epochs, or only at the training's end (``EpochLoop.end``)."""
    return {
        record[RESULT_KEY]: record["steps_per_epoch"]
        for record in records
        if 0 < record["steps_per_epoch"] < eval_every_steps
    }


def _warn_of_short_epochs(records: Sequence[Mapping], eval_every_steps: int, warned: set[str]) -> None:
    # once per result row: its seeds share the steps per epoch
    for result, steps in short_epochs(records, eval_every_steps).items():
        if result in warned:
            continue
        warned.add(result)
        logger.warning(
            "study.eval_every_steps is %d, but an epoch of %s has %d steps: its curve has a point every %d steps "
            "across epochs and one at the training's end; set study.eval_every_steps to at most %d for a point in "
            "every epoch",
            eval_every_steps,
            result,
            steps,
            eval_every_steps,
            steps,
        )
