"""A multi-seed study: each chosen recipe over each seed, on the same data and evaluation, resumable.

Recipes: ``baseline`` (Momentum) and ``thor`` train ``StudyPlan.epochs`` epochs each; ``dim_reduce`` trains
its own stage 1, fits the PCA of its trajectory, then P-BFGS stage 2 and, from the same stage-1 checkpoint,
the Momentum control for the same epochs, giving two result rows, ``stage2`` and ``control``; ``adasum``
trains the adasum section's Momentum for ``StudyPlan.epochs`` on ``StudyPlan.adasum_workers`` msrun ranks
twice, combining the ranks' updates by Adasum (row ``adasum``) and by averaging gradients (``allreduce``),
from the same initial weights; ``thor_bert`` trains BERT with THOR (row ``thor_bert``) and with its first-order
control (``thor_bert_control``) from the same initial weights for ``StudyPlan.epochs`` each, on the corpus,
tokenizer and examples prepared once (``StudyInputs.language``). Every training evaluates every
``eval_every_steps`` steps on the fixed val subset (``data.step_eval_images``; thor_bert: the first
``thor_bert.step_eval_examples`` held-out examples), so time to target is read at step resolution.

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

from trainlib.atomic_write import write_atomically
from trainlib.distributed.launch import on_every_rank
from trainlib.engine.callbacks import Callback
from trainlib.engine.loop import TrainingResult
from trainlib.engine.resume import fingerprint, remove_finished_checkpoints
from trainlib.metrics import (
    VAL_MLM_ACCURACY,
    VAL_MLM_LOSS,
    VAL_STEP_MLM_ACCURACY,
    VAL_STEP_TOP1,
    VAL_TOP1,
    VAL_TOP5,
)
from trainlib.params import (
    AdasumParams,
    BaselineParams,
    BoostParams,
    DimReduceParams,
    ThorBertParams,
    ThorParams,
)
from trainlib.params.recipe_spec import result_rows
from trainlib.recipes.classifier import build_network
from trainlib.recipes.context import LanguageModelContext, TrainingContext
from trainlib.recipes.dim_reduce import collect_trajectory, train_control, train_stage1, train_stage2, trajectory_pca
from trainlib.recipes.language_model import build_bert
from trainlib.recipes.momentum import train_adasum, train_baseline
from trainlib.recipes.thor import train_thor
from trainlib.recipes.thor_bert import train_bert_control, train_bert_thor
from trainlib.study.budget import budget_update

logger = logging.getLogger(__name__)


class StudyTracking(Protocol):
    """What the study needs of experiment tracking (the ``study`` pipeline passes MLflow's). Each training's run
    is tagged ``recipe`` (the study's), ``result`` (its result row; ``stage1`` for dim_reduce's first stage),
    ``seed`` and ``study_key``; a result file is ``<study_key>.<result>.json``."""

    def run(
        self, name: str, tags: Mapping[str, str], params: Mapping[str, object]
    ) -> AbstractContextManager[str | None]:
        """A child run of the study's run for one training, active meanwhile, with the parameter sections
        ``params`` it trained with; yields its id (None: no tracking)."""

    def callbacks(self) -> list[Callback]:
        """Engine callbacks that log each epoch into the active child run."""

    def log_final(self, accuracy: Mapping[str, float]) -> None:
        """Log the final full-val ``top1``/``top5`` (a language model's ``mlm_accuracy``/``mlm_loss``) into the
        active child run."""

    def set_tags(self, tags: Mapping[str, str]) -> None:
        """Set ``tags`` on the active child run (a tuning trial's state)."""

    def fail_runs(self, run_ids: Sequence[str], *, error: str) -> None:
        """End FAILED, tagged ``trial_state`` FAIL and ``trial_error`` ``error``, the child runs ``run_ids`` of a
        tuning trial whose process died (maybe on another machine), and the study runs they belong to."""


@dataclass(frozen=True)
class StudyInputs:
    """The data and shared sections (``context``), every recipe's own section, and thor_bert's prepared corpus,
    tokenizer and examples (``language``; None when the study has no thor_bert)."""

    context: TrainingContext
    baseline: BaselineParams
    thor: ThorParams
    dim_reduce: DimReduceParams
    adasum: AdasumParams
    boost: BoostParams
    thor_bert: ThorBertParams
    language: LanguageModelContext | None = None


@dataclass(frozen=True)
class StudyPlan:
    recipes: Sequence[str]
    seeds: Sequence[int]
    epochs: int  # baseline's and thor's budget; dim_reduce keeps its stage1.epochs + stage2.epochs
    eval_every_steps: int
    directory: Path
    adasum_workers: int = 2  # msrun ranks of adasum's two trainings (on this node)
    # the result rows to train, None: every row of each recipe; a tuning trial of one of thor_bert's two trainings
    # trains that one alone (the other rows' recipes give one row, or all of theirs)
    results: Sequence[str] | None = None


def run_study(inputs: StudyInputs, plan: StudyPlan, tracking: StudyTracking) -> list[dict]:
    """Every recipe of the plan over every seed, skipping the runs finished earlier; one record per result row.

    A record: ``recipe`` (a result row's name, ``recipe_spec.result_rows``), ``seed``, ``key``, ``mlflow_run_id``,
    ``final_top1``/``final_top5`` on the whole val split after the last epoch (thor_bert's rows:
    ``final_mlm_accuracy``/``final_mlm_loss`` on every held-out example), ``step_metric`` (the step-evaluation key
    time to target reads), ``steps_per_epoch``, and the engine's ``history`` (per epoch) and ``step_history`` (per
    step evaluation).
    """
    workers = inputs.context.distributed.worker_num
    if workers != 1:
        raise ValueError(
            f"study runs its trainings in this process, one device: distributed.worker_num is {workers}, set it to "
            "1 for the study"
        )
    results = plan.directory / "runs"
    results.mkdir(parents=True, exist_ok=True)
    records: list[dict] = []
    warned: set[str] = set()  # the result rows warned of an epoch shorter than the evaluation interval
    for recipe in plan.recipes:
        for seed in plan.seeds:
            key = f"{recipe}-seed{seed}-{_configuration(inputs, plan, recipe, seed)}"
            paths = {row: results / f"{key}.{row}.json" for row in result_rows()[recipe] if _trains(plan, row)}
            if all(path.exists() for path in paths.values()):
                logger.info("study: %s finished earlier (%s), not run again", key, results)
                records += [json.loads(path.read_text()) for path in paths.values()]
                _warn_of_short_epochs(records, plan.eval_every_steps, warned)
                continue
            logger.info("study: training %s (seed %d)", key, seed)
            trained, finals = _TRAINERS[recipe](inputs, plan, seed, key, tracking)
            for row, record in trained.items():
                write_atomically(paths[row], json.dumps(record, indent=1).encode())
            # the result files hold all the study needs: the epoch checkpoints (kept for a resume) go
            for final in finals:
                remove_finished_checkpoints(final)
            records += trained.values()
            _warn_of_short_epochs(records, plan.eval_every_steps, warned)
    return records


def short_epochs(records: Sequence[Mapping], eval_every_steps: int) -> dict[str, int]:
    """The result rows of ``records`` whose epoch has fewer steps than ``eval_every_steps``, with their steps per
    epoch: their step evaluations fall across epochs, or only at the training's end (``EpochLoop.end``)."""
    return {
        record["recipe"]: record["steps_per_epoch"]
        for record in records
        if 0 < record["steps_per_epoch"] < eval_every_steps
    }


def _warn_of_short_epochs(records: Sequence[Mapping], eval_every_steps: int, warned: set[str]) -> None:
    # once per result row: its seeds share the steps per epoch
    for recipe, steps in short_epochs(records, eval_every_steps).items():
        if recipe in warned:
            continue
        warned.add(recipe)
        logger.warning(
            "study.eval_every_steps is %d, but an epoch of %s has %d steps: its curve has a point every %d steps "
            "across epochs and one at the training's end; set study.eval_every_steps to at most %d for a point in "
            "every epoch",
            eval_every_steps,
            recipe,
            steps,
            eval_every_steps,
            steps,
        )


def _configuration(inputs: StudyInputs, plan: StudyPlan, recipe: str, seed: int) -> str:
    sections = {
        "baseline": (_baseline(inputs, plan).model_dump(exclude={"checkpoint"}), inputs.boost),
        "thor": (_thor(inputs, plan, precondition=True).model_dump(exclude={"checkpoint"}),),
        "thor_first_order": (_thor(inputs, plan, precondition=False).model_dump(exclude={"checkpoint"}),),
        "adasum": (_adasum(inputs, plan).model_dump(exclude={"checkpoint"}), plan.adasum_workers),
        "thor_bert": (
            _bert(inputs.thor_bert.thor, plan).model_dump(exclude={"checkpoint"}),
            _bert(inputs.thor_bert.control, plan).model_dump(exclude={"checkpoint"}),
            inputs.thor_bert.model_dump(exclude={"thor", "control"}),
        ),
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
    return fingerprint(recipe, inputs.context.model, inputs.context.data, seed, *sections)


def _trains(plan: StudyPlan, row: str) -> bool:
    return plan.results is None or row in plan.results


def _budget(section: str, plan: StudyPlan) -> dict[str, int]:
    return budget_update(section, epochs=plan.epochs, eval_every_steps=plan.eval_every_steps)


def _baseline(inputs: StudyInputs, plan: StudyPlan) -> BaselineParams:
    return inputs.baseline.model_copy(update=_budget("baseline", plan))


def _thor(inputs: StudyInputs, plan: StudyPlan, *, precondition: bool) -> ThorParams:
    """The thor section on the study's budget; ``precondition`` False: thor_first_order, its recipe without the
    preconditioner."""
    return inputs.thor.model_copy(update={**_budget("thor", plan), "precondition": precondition})


def _adasum(inputs: StudyInputs, plan: StudyPlan) -> AdasumParams:
    return inputs.adasum.model_copy(update=_budget("adasum", plan))


def _bert(section, plan: StudyPlan):
    """A thor_bert training section (thor or control) on the study's budget and step evaluation."""
    return section.model_copy(update=_budget("thor_bert.thor", plan))


def _checkpoint_dir(section, folder: Path):
    return section.checkpoint.model_copy(update={"dir": str(folder)})


def _figures(result: TrainingResult) -> dict:
    """What the study keeps of a training (plain data, kept in its result file)."""
    last = result.history[-1]  # the engine evaluates on the whole val split after the last epoch
    if VAL_MLM_ACCURACY in last:
        finals = {"final_mlm_accuracy": last[VAL_MLM_ACCURACY], "final_mlm_loss": last[VAL_MLM_LOSS]}
        finals["step_metric"] = VAL_STEP_MLM_ACCURACY
    else:
        finals = {"final_top1": last[VAL_TOP1], "final_top5": last[VAL_TOP5], "step_metric": VAL_STEP_TOP1}
    return {
        **finals,
        "steps_per_epoch": result.steps_per_epoch,
        "history": result.history,
        "step_history": result.step_history,
    }


def _record(recipe: str, seed: int, key: str, run_id: str | None, figures: dict, tracking: StudyTracking) -> dict:
    """A result row's record; its final figures go to the active child run."""
    if "final_mlm_accuracy" in figures:
        tracking.log_final({"mlm_accuracy": figures["final_mlm_accuracy"], "mlm_loss": figures["final_mlm_loss"]})
    else:
        tracking.log_final({"top1": figures["final_top1"], "top5": figures["final_top5"]})
    return {"recipe": recipe, "seed": seed, "key": key, "mlflow_run_id": run_id, **figures}


def _train_single(recipe: str):
    """baseline, thor or thor_first_order over one seed: the nodes' recipe functions, in one child run."""

    def train_one(inputs: StudyInputs, plan: StudyPlan, seed: int, key: str, tracking: StudyTracking):
        context = inputs.context.with_seed(seed)
        folder = plan.directory / "checkpoints" / key
        if recipe == "baseline":
            section = _baseline(inputs, plan)
        else:
            section = _thor(inputs, plan, precondition=recipe == "thor")
        section = section.model_copy(update={"checkpoint": _checkpoint_dir(section, folder)})
        tags = {"recipe": recipe, "result": recipe, "seed": str(seed), "study_key": key}
        params = {"baseline" if recipe == "baseline" else "thor": section, "runtime": context.runtime}
        with tracking.run(f"{recipe}/seed{seed}", tags, params) as run_id:
            initial = build_network(
                context.model,
                context.class_index,
                context.runtime,
                zero_init_last_bn_gamma=section.zero_init_last_bn_gamma,
            )
            if recipe == "baseline":
                result = train_baseline(context, initial, section, boost=inputs.boost, callbacks=tracking.callbacks())
            else:
                result = train_thor(context, initial, section, callbacks=tracking.callbacks())
            record = _record(recipe, seed, key, run_id, _figures(result), tracking)
        result.release()  # the study trains on in this process
        return {recipe: record}, [result.checkpoint]

    return train_one


def _train_dim_reduce(inputs: StudyInputs, plan: StudyPlan, seed: int, key: str, tracking: StudyTracking):
    """Stage 1 -> PCA -> stage 2 and the control from the same stage-1 checkpoint, each a child run."""
    context = inputs.context.with_seed(seed)
    model, class_index = context.model, context.class_index
    folder = plan.directory / "checkpoints" / key
    dim = inputs.dim_reduce
    stage1 = dim.stage1.model_copy(
        update={
            "checkpoint": _checkpoint_dir(dim.stage1, folder / "stage1"),
            "trajectory": dim.stage1.trajectory.model_copy(update={"dir": str(folder / "trajectory")}),
        }
    )
    stage2 = dim.stage2.model_copy(
        update={"checkpoint": _checkpoint_dir(dim.stage2, folder / "stage2"), **_budget("dim_reduce.stage2", plan)}
    )
    control = dim.control.model_copy(update={"checkpoint": _checkpoint_dir(dim.control, folder / "control")})
    tags = {"recipe": "dim_reduce", "seed": str(seed), "study_key": key}
    runtime = {"runtime": context.runtime}
    with tracking.run(
        f"dim_reduce/stage1/seed{seed}", tags | {"result": "stage1"}, {"dim_reduce.stage1": stage1, **runtime}
    ):
        initial = build_network(
            model, class_index, context.runtime, zero_init_last_bn_gamma=stage1.zero_init_last_bn_gamma
        )
        first, trajectory = train_stage1(context, initial, stage1, boost=inputs.boost, callbacks=tracking.callbacks())
        # its final evaluation, as dim_reduce's stage1 child run has one
        tracking.log_final({"top1": first.history[-1]["val/top1"], "top5": first.history[-1]["val/top5"]})
        first.release()
    chosen = collect_trajectory(trajectory, model, class_index, dim.collect, dim.pca)
    components = trajectory_pca(chosen, model, class_index, dim.pca).components
    records, finals = {}, [first.checkpoint]
    for row in result_rows()["dim_reduce"]:
        sections = {"dim_reduce.stage2": stage2} if row == "stage2" else {"dim_reduce.control": control}
        with tracking.run(f"dim_reduce/{row}/seed{seed}", tags | {"result": row}, {**sections, **runtime}) as run_id:
            if row == "stage2":
                result, _ = train_stage2(context, first.checkpoint, components, stage2, callbacks=tracking.callbacks())
            else:
                result = train_control(
                    context,
                    first.checkpoint,
                    stage1,
                    stage2,
                    control,
                    boost=inputs.boost,
                    callbacks=tracking.callbacks(),
                )
            records[row] = _record(row, seed, key, run_id, _figures(result), tracking)
        result.release()
        finals.append(result.checkpoint)
    return records, finals


def _train_adasum(inputs: StudyInputs, plan: StudyPlan, seed: int, key: str, tracking: StudyTracking):
    """Adasum and plain data parallelism, each one msrun job of ``plan.adasum_workers`` ranks, same start."""
    context = inputs.context.with_seed(seed).with_workers(plan.adasum_workers)
    initial = build_network(
        context.model,
        context.class_index,
        context.runtime,
        zero_init_last_bn_gamma=inputs.adasum.zero_init_last_bn_gamma,
    )
    records, finals = {}, []
    for row in result_rows()["adasum"]:
        section = _adasum(inputs, plan)
        section = section.model_copy(
            update={"checkpoint": _checkpoint_dir(section, plan.directory / "checkpoints" / key / row)}
        )
        tags = {"recipe": "adasum", "result": row, "seed": str(seed), "study_key": key}
        params = {"adasum": section, "runtime": context.runtime, "distributed": context.distributed}
        with tracking.run(f"adasum/{row}/seed{seed}", tags | {"workers": str(plan.adasum_workers)}, params) as run_id:
            result = on_every_rank(
                train_adasum,
                context,
                initial,
                section,
                combine_by_adasum=row == "adasum",
                callbacks=tracking.callbacks(),
            )
            records[row] = _record(row, seed, key, run_id, _figures(result), tracking)
        finals.append(result.checkpoint)
    return records, finals


def _train_thor_bert(inputs: StudyInputs, plan: StudyPlan, seed: int, key: str, tracking: StudyTracking):
    """BERT with THOR and with its first-order control from the same initial weights, each a child run (those of
    ``plan.results``)."""
    context = inputs.language.with_seed(seed)
    initial = build_bert(context.network, context.vocab_size, context.runtime)
    records, finals = {}, []
    trainings = {"thor_bert": (inputs.thor_bert.thor, train_bert_thor)}
    trainings["thor_bert_control"] = (inputs.thor_bert.control, train_bert_control)
    for row, (configured, train) in trainings.items():
        if not _trains(plan, row):
            continue
        budgeted = _bert(configured, plan)
        section = budgeted.model_copy(
            update={"checkpoint": _checkpoint_dir(budgeted, plan.directory / "checkpoints" / key / row)}
        )
        tags = {"recipe": "thor_bert", "result": row, "seed": str(seed), "study_key": key}
        params = {f"thor_bert.{'thor' if row == 'thor_bert' else 'control'}": section, "runtime": context.runtime}
        with tracking.run(f"thor_bert/{row.removeprefix('thor_bert_') or 'thor'}/seed{seed}", tags, params) as run_id:
            result = train(context, initial, section, callbacks=tracking.callbacks())
            records[row] = _record(row, seed, key, run_id, _figures(result), tracking)
        result.release()
        finals.append(result.checkpoint)
    return records, finals


_TRAINERS = {
    "baseline": _train_single("baseline"),
    "thor": _train_single("thor"),
    "thor_first_order": _train_single("thor_first_order"),
    "dim_reduce": _train_dim_reduce,
    "adasum": _train_adasum,
    "thor_bert": _train_thor_bert,
}
