"""A multi-seed study: each chosen recipe over each seed, on the same data and evaluation, resumable.

Recipes: ``baseline`` (Momentum) and ``thor`` train ``StudyPlan.epochs`` epochs each; ``dim_reduce`` trains
its own stage 1, fits the PCA of its trajectory, then P-BFGS stage 2 and, from the same stage-1 checkpoint,
the Momentum control for the same epochs, giving two result rows, ``stage2`` and ``control``; ``adasum``
trains the adasum section's Momentum for ``StudyPlan.epochs`` on ``StudyPlan.adasum_workers`` msrun ranks
twice, combining the ranks' updates by Adasum (row ``adasum``) and by averaging gradients (``allreduce``),
from the same initial weights. Every training
evaluates every ``eval_every_steps`` steps on the fixed val subset (``data.step_eval_images``), so time to
target is read at step resolution.

A finished (recipe, seed) run leaves ``<dir>/runs/<key>.json`` (the key holds recipe, seed and a
fingerprint of the configuration), written atomically; a rerun reads it instead of training again, and an
unfinished run resumes from its epoch checkpoints in ``<dir>/checkpoints/<key>``. Tracking (MLflow) comes
in as ``StudyTracking``, so this module imports neither Kedro nor MLflow.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Mapping, Sequence
from contextlib import AbstractContextManager
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

import pandas as pd

from pipelines.distributed.launch import data_parallel
from pipelines.engine.callbacks import Callback
from pipelines.engine.checkpoint import Checkpoint, write_atomically
from pipelines.engine.loop import TrainingResult
from pipelines.engine.resume import fingerprint, remove_finished_checkpoints
from pipelines.params import (
    AdasumParams,
    BaselineParams,
    BoostParams,
    DataParams,
    DimReduceParams,
    DistributedParams,
    ModelParams,
    RuntimeParams,
    ThorParams,
)
from pipelines.recipes.common import build_network
from pipelines.recipes.dim_reduce import collect_trajectory, train_control, train_stage1, train_stage2, trajectory_pca
from pipelines.recipes.momentum import train_momentum
from pipelines.recipes.thor import thor_model, train_thor

logger = logging.getLogger(__name__)

# The result rows a recipe of the study gives: dim_reduce's stage 2 and its control are compared as a pair, and
# Adasum against plain data parallelism (gradients averaged by AllReduce) on the same ranks and settings.
RESULT_ROWS = {
    "baseline": ("baseline",),
    "thor": ("thor",),
    "thor_first_order": ("thor_first_order",),
    "dim_reduce": ("stage2", "control"),
    "adasum": ("adasum", "allreduce"),
}


class StudyTracking(Protocol):
    """What the study needs of experiment tracking (the ``study`` pipeline passes MLflow's). Each training's run
    is tagged ``recipe`` (the study's), ``result`` (its result row; ``stage1`` for dim_reduce's first stage),
    ``seed`` and ``study_key``; a result file is ``<study_key>.<result>.json``."""

    def run(self, name: str, tags: Mapping[str, str]) -> AbstractContextManager[str | None]:
        """A child run of the study's run for one training, active meanwhile; yields its id (None: no tracking)."""

    def callbacks(self) -> list[Callback]:
        """Engine callbacks that log each epoch into the active child run."""

    def log_final(self, accuracy: Mapping[str, float]) -> None:
        """Log the final full-val ``top1``/``top5`` into the active child run."""


@dataclass(frozen=True)
class StudyInputs:
    """The data and every section the recipes read."""

    manifest: pd.DataFrame
    class_index: dict[str, int]
    model: ModelParams
    data: DataParams
    runtime: RuntimeParams
    distributed: DistributedParams
    baseline: BaselineParams
    thor: ThorParams
    dim_reduce: DimReduceParams
    adasum: AdasumParams
    boost: BoostParams


@dataclass(frozen=True)
class StudyPlan:
    recipes: Sequence[str]
    seeds: Sequence[int]
    epochs: int  # baseline's and thor's budget; dim_reduce keeps its stage1.epochs + stage2.epochs
    eval_every_steps: int
    directory: Path
    adasum_workers: int = 2  # msrun ranks of adasum's two trainings (on this node)


class _StepsPerEpoch(Callback):
    """Remembers the training's steps per epoch (epochs to target = step / steps per epoch)."""

    steps_per_epoch = 0

    def on_train_begin(self, total_epochs: int, steps_per_epoch: int, start_epoch: int) -> None:
        self.steps_per_epoch = steps_per_epoch


def run_study(inputs: StudyInputs, plan: StudyPlan, tracking: StudyTracking) -> list[dict]:
    """Every recipe of the plan over every seed, skipping the runs finished earlier; one record per result row.

    A record: ``recipe`` (a result row's name, ``RESULT_ROWS``), ``seed``, ``key``, ``mlflow_run_id``,
    ``final_top1``/``final_top5`` on the whole val split after the last epoch, ``steps_per_epoch``, and the
    engine's ``history`` (per epoch) and ``step_history`` (per step evaluation).
    """
    if inputs.distributed.worker_num != 1:
        raise ValueError(
            f"study runs its trainings in this process, one device: distributed.worker_num is "
            f"{inputs.distributed.worker_num}, set it to 1 for the study"
        )
    results = plan.directory / "runs"
    results.mkdir(parents=True, exist_ok=True)
    records = []
    for recipe in plan.recipes:
        for seed in plan.seeds:
            key = f"{recipe}-seed{seed}-{_configuration(inputs, plan, recipe, seed)}"
            paths = {row: results / f"{key}.{row}.json" for row in RESULT_ROWS[recipe]}
            if all(path.exists() for path in paths.values()):
                logger.info("study: %s finished earlier (%s), not run again", key, results)
                records += [json.loads(path.read_text()) for path in paths.values()]
                continue
            logger.info("study: training %s (seed %d)", key, seed)
            trained, finals = _TRAINERS[recipe](inputs, plan, seed, key, tracking)
            for row, record in trained.items():
                write_atomically(paths[row], json.dumps(record, indent=1).encode())
            # the result files hold all the study needs: the epoch checkpoints (kept for a resume) go
            for final in finals:
                remove_finished_checkpoints(final)
            records += trained.values()
    return records


def _configuration(inputs: StudyInputs, plan: StudyPlan, recipe: str, seed: int) -> str:
    sections = {
        "baseline": (_baseline(inputs, plan).model_dump(exclude={"checkpoint"}), inputs.boost),
        "thor": (_thor(inputs, plan, precondition=True).model_dump(exclude={"checkpoint"}),),
        "thor_first_order": (_thor(inputs, plan, precondition=False).model_dump(exclude={"checkpoint"}),),
        "adasum": (_adasum(inputs, plan).model_dump(exclude={"checkpoint"}), plan.adasum_workers),
        "dim_reduce": (
            inputs.dim_reduce.model_dump(
                exclude={
                    "stage1": {"checkpoint": True, "trajectory": {"dir"}},
                    "stage2": {"checkpoint": True},
                    "control": {"checkpoint": True},
                }
            ),
            inputs.boost,
            plan.eval_every_steps,
        ),
    }[recipe]
    return fingerprint(recipe, inputs.model, inputs.data, seed, *sections)


def _baseline(inputs: StudyInputs, plan: StudyPlan) -> BaselineParams:
    return inputs.baseline.model_copy(update={"epochs": plan.epochs, "eval_every_steps": plan.eval_every_steps})


def _thor(inputs: StudyInputs, plan: StudyPlan, *, precondition: bool) -> ThorParams:
    """The thor section on the study's budget; ``precondition`` False: thor_first_order, its recipe without the
    preconditioner."""
    return inputs.thor.model_copy(
        update={"epochs": plan.epochs, "eval_every_steps": plan.eval_every_steps, "precondition": precondition}
    )


def _adasum(inputs: StudyInputs, plan: StudyPlan) -> AdasumParams:
    return inputs.adasum.model_copy(update={"epochs": plan.epochs, "eval_every_steps": plan.eval_every_steps})


def _checkpoint_dir(section, folder: Path):
    return section.checkpoint.model_copy(update={"dir": str(folder)})


def _figures(result: TrainingResult, steps: _StepsPerEpoch) -> dict:
    """What the study keeps of a training (plain data: it travels back from an msrun rank 0 too)."""
    last = result.history[-1]  # the engine evaluates on the whole val split after the last epoch
    return {
        "final_top1": last["val/top1"],
        "final_top5": last["val/top5"],
        "steps_per_epoch": steps.steps_per_epoch,
        "history": result.history,
        "step_history": result.step_history,
    }


def _record(recipe: str, seed: int, key: str, run_id: str | None, figures: dict, tracking: StudyTracking) -> dict:
    """A result row's record; its final accuracy goes to the active child run."""
    tracking.log_final({"top1": figures["final_top1"], "top5": figures["final_top5"]})
    return {"recipe": recipe, "seed": seed, "key": key, "mlflow_run_id": run_id, **figures}


def _train_single(recipe: str):
    def train_one(inputs: StudyInputs, plan: StudyPlan, seed: int, key: str, tracking: StudyTracking):
        runtime = inputs.runtime.model_copy(update={"seed": seed})
        if recipe == "baseline":
            section = _baseline(inputs, plan)
        else:
            section = _thor(inputs, plan, precondition=recipe == "thor")
        checkpoint = _checkpoint_dir(section, plan.directory / "checkpoints" / key)
        section = section.model_copy(update={"checkpoint": checkpoint})
        common = (inputs.manifest, inputs.class_index, inputs.model, inputs.data, runtime, inputs.distributed)
        steps = _StepsPerEpoch()
        tags = {"recipe": recipe, "result": recipe, "seed": str(seed), "study_key": key}
        with tracking.run(f"{recipe}-seed{seed}", tags) as run_id:
            callbacks = [*tracking.callbacks(), steps]
            if recipe != "baseline":
                initial = build_network(thor_model(inputs.model, section), inputs.class_index, runtime)
                result = train_thor(initial, *common, section, callbacks=callbacks)
            else:
                initial = build_network(inputs.model, inputs.class_index, runtime)
                result = train_momentum(
                    initial,
                    *common,
                    section,
                    epochs=section.epochs,
                    schedule_epochs=section.epochs,
                    boost=inputs.boost,
                    callbacks=callbacks,
                )
            record = _record(recipe, seed, key, run_id, _figures(result, steps), tracking)
        return {recipe: record}, [result.checkpoint]

    return train_one


def _train_dim_reduce(inputs: StudyInputs, plan: StudyPlan, seed: int, key: str, tracking: StudyTracking):
    """Stage 1 -> PCA -> stage 2 and the control from the same stage-1 checkpoint, each a child run."""
    runtime = inputs.runtime.model_copy(update={"seed": seed})
    folder = plan.directory / "checkpoints" / key
    dim = inputs.dim_reduce
    stage1 = dim.stage1.model_copy(
        update={
            "checkpoint": _checkpoint_dir(dim.stage1, folder / "stage1"),
            "trajectory": dim.stage1.trajectory.model_copy(update={"dir": str(folder / "trajectory")}),
        }
    )
    stage2 = dim.stage2.model_copy(
        update={"checkpoint": _checkpoint_dir(dim.stage2, folder / "stage2"), "eval_every_steps": plan.eval_every_steps}
    )
    control = dim.control.model_copy(update={"checkpoint": _checkpoint_dir(dim.control, folder / "control")})
    common = (inputs.manifest, inputs.class_index, inputs.model, inputs.data, runtime, inputs.distributed)
    tags = {"recipe": "dim_reduce", "seed": str(seed), "study_key": key}
    with tracking.run(f"stage1-seed{seed}", tags | {"result": "stage1"}):
        initial = build_network(inputs.model, inputs.class_index, runtime)
        first, trajectory = train_stage1(initial, *common, stage1, inputs.boost, callbacks=tracking.callbacks())
    chosen = collect_trajectory(trajectory, inputs.model, inputs.class_index, dim.collect, dim.pca)
    components = trajectory_pca(chosen, inputs.model, inputs.class_index, dim.pca).components
    records, finals = {}, [first.checkpoint]
    for row in RESULT_ROWS["dim_reduce"]:
        steps = _StepsPerEpoch()
        with tracking.run(f"{row}-seed{seed}", tags | {"result": row}) as run_id:
            callbacks = [*tracking.callbacks(), steps]
            if row == "stage2":
                result, _ = train_stage2(first.checkpoint, components, *common, stage2, callbacks=callbacks)
            else:
                result = train_control(
                    first.checkpoint, *common, stage1, stage2, control, inputs.boost, callbacks=callbacks
                )
            records[row] = _record(row, seed, key, run_id, _figures(result, steps), tracking)
        finals.append(result.checkpoint)
    return records, finals


def _train_adasum(inputs: StudyInputs, plan: StudyPlan, seed: int, key: str, tracking: StudyTracking):
    """Adasum and plain data parallelism, each one msrun job of ``plan.adasum_workers`` ranks, same start."""
    runtime = inputs.runtime.model_copy(update={"seed": seed})
    workers = plan.adasum_workers
    distributed = inputs.distributed.model_copy(update={"worker_num": workers, "local_worker_num": workers})
    initial = build_network(inputs.model, inputs.class_index, runtime)
    records, finals = {}, []
    for row in RESULT_ROWS["adasum"]:
        section = _adasum(inputs, plan)
        section = section.model_copy(
            update={"checkpoint": _checkpoint_dir(section, plan.directory / "checkpoints" / key / row)}
        )
        tags = {"recipe": "adasum", "result": row, "seed": str(seed), "study_key": key, "workers": str(workers)}
        with tracking.run(f"{row}-seed{seed}", tags) as run_id:
            trained = _train_on_ranks(
                initial,
                inputs.manifest,
                inputs.class_index,
                inputs.model,
                inputs.data,
                runtime,
                distributed,
                section,
                row == "adasum",
                tracking,
            )
            records[row] = _record(row, seed, key, run_id, trained["figures"], tracking)
        finals.append(trained["checkpoint"])
    return records, finals


@data_parallel
def _train_on_ranks(
    initial: Checkpoint,
    manifest: pd.DataFrame,
    class_index: dict[str, int],
    model: ModelParams,
    data: DataParams,
    runtime: RuntimeParams,
    distributed: DistributedParams,
    section: AdasumParams,
    with_adasum: bool,
    tracking: StudyTracking,
) -> dict:
    """One msrun rank's Momentum training, updates combined by Adasum or by averaged gradients; what the study
    keeps of it (picklable: it travels back from rank 0)."""
    steps = _StepsPerEpoch()
    result = train_momentum(
        initial,
        manifest,
        class_index,
        model,
        data,
        runtime,
        distributed,
        section,
        epochs=section.epochs,
        schedule_epochs=section.epochs,
        adasum=section if with_adasum else None,
        callbacks=[*tracking.callbacks(), steps],
    )
    return {"figures": _figures(result, steps), "checkpoint": result.checkpoint}


_TRAINERS = {
    "baseline": _train_single("baseline"),
    "thor": _train_single("thor"),
    "thor_first_order": _train_single("thor_first_order"),
    "dim_reduce": _train_dim_reduce,
    "adasum": _train_adasum,
}
