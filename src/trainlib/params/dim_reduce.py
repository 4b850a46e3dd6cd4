"""``conf/*/parameters_dim_reduce.yml``: stage 1 (Momentum, keeping its weights), the PCA, stage 2 (P-BFGS in
the subspace) and the control (Momentum over stage 2's epochs)."""

from __future__ import annotations

from collections.abc import Mapping

from pydantic import model_validator

from trainlib.fast_dev_run import Plan, training_budget
from trainlib.params.base import CheckpointParams, Section
from trainlib.params.baseline import MomentumTraining
from trainlib.params.choices import Implementation
from trainlib.params.errors import CrossKeyProblems
from trainlib.params.numbers import Fraction, NonNegativeFloat, NonNegativeInt, OpenFraction, PositiveFloat, PositiveInt
from trainlib.params.recipe_spec import SUBSPACE, WARM_START, RecipeSpec, ReportRuns, ResultRow


class TrajectoryParams(Section):
    """Stage-1 weights kept for the PCA: from ``start_epoch`` every N steps or every N epochs."""

    dir: str
    start_epoch: PositiveInt  # 1-based
    every_steps: PositiveInt | None
    every_epochs: PositiveInt | None


class Stage1Params(MomentumTraining):
    epochs: PositiveInt
    schedule_epochs: PositiveInt
    trajectory: TrajectoryParams


class CollectParams(Section):
    n_files: PositiveInt | None  # the last N trajectory files; None: all


class PcaParams(Section):
    n_components: PositiveInt


class Stage2Params(Section):
    """P-BFGS in the PCA subspace."""

    implementation: Implementation
    epochs: PositiveInt
    batch_size: PositiveInt
    rho: OpenFraction
    max_trials: PositiveInt
    sigma: OpenFraction
    gamma: Fraction
    alpha: NonNegativeFloat
    loss_scale: PositiveFloat
    label_smoothing: Fraction
    checkpoint: CheckpointParams
    # also evaluate on data.step_eval_images every N steps, stage 2 and the control alike (trainlib only); 0:
    # off
    eval_every_steps: NonNegativeInt


class ControlParams(Section):
    checkpoint: CheckpointParams


class DimReduceParams(Section):
    stage1: Stage1Params
    collect: CollectParams
    pca: PcaParams
    stage2: Stage2Params
    control: ControlParams

    @model_validator(mode="after")
    def _consistent_stages(self) -> DimReduceParams:
        problems = []
        stage1, n_files, k = self.stage1, self.collect.n_files, self.pca.n_components
        if n_files is not None and k >= n_files:
            problems.append(
                ("dim_reduce.pca.n_components", f"is {k} but must be below dim_reduce.collect.n_files ({n_files})")
            )
        if stage1.epochs > stage1.schedule_epochs:
            problems.append(
                ("dim_reduce.stage1.epochs", f"is {stage1.epochs}, beyond schedule_epochs {stage1.schedule_epochs}")
            )
        if stage1.trajectory.start_epoch > stage1.epochs:
            problems.append(
                ("dim_reduce.stage1.trajectory.start_epoch", f"is after the last stage-1 epoch ({stage1.epochs})")
            )
        steps, epochs = stage1.trajectory.every_steps, stage1.trajectory.every_epochs
        if steps is not None and epochs is not None:
            problems.append(
                (
                    "dim_reduce.stage1.trajectory.every_epochs",
                    f"is {epochs} while every_steps is {steps}: set exactly one, the other null",
                )
            )
        if steps is None and epochs is None:
            problems.append(("dim_reduce.stage1.trajectory.every_steps", "and every_epochs are both null: set one"))
        if self.stage2.eval_every_steps and self.stage2.implementation != "trainlib":
            problems.append(
                (
                    "dim_reduce.stage2.eval_every_steps",
                    "needs dim_reduce.stage2.implementation trainlib (mindspore.boost's DimReduce trains whole epochs "
                    "in Model.train)",
                )
            )
        CrossKeyProblems.raise_if_any(problems)
        return self


def _rehearse(section: Mapping, plan: Plan) -> dict:
    stage1 = section["stage1"]
    # stage 1 stops before its schedule ends when the recipe's does (70 of 90 epochs)
    schedule_epochs = 2 if stage1["epochs"] < stage1["schedule_epochs"] else 1
    # one epoch: a second one of ResNet-50 (3 steps, an evaluation, 3 more weight files) proved nothing the first
    # does not, and cost 14 s of the slowest rehearsal
    values = {f"stage1.{k}": v for k, v in training_budget(stage1, plan).items()}
    values |= {
        "stage1.schedule_epochs": schedule_epochs,
        "stage1.trajectory.dir": plan.relocated(stage1["trajectory"]["dir"]),
        "stage1.trajectory.start_epoch": 1,
        "stage1.trajectory.every_steps": 1,  # an epoch of >= 3 steps: >= 3 weight files
        "stage1.trajectory.every_epochs": None,
        "collect.n_files": 3,
        "pca.n_components": 2,  # below n_files, as the PCA needs
        "stage2.implementation": "trainlib",  # boost's DimReduce runs outside msrun, on one worker only
    }
    values |= {f"stage2.{k}": v for k, v in training_budget(section["stage2"], plan).items()}
    values["control.checkpoint.dir"] = plan.relocated(section["control"]["checkpoint"]["dir"])
    return values


NAME = "dim_reduce"  # the recipe, its section and its pipeline


def _runnable(parameters) -> list[tuple[str, str]]:
    """mindspore.boost's DimReduce: evaluated only at its epochs' ends, in one process of its own."""
    problems = []
    implementation = parameters.dim_reduce.stage2.implementation
    if NAME in parameters.study.recipes and implementation != "trainlib":
        problems.append(
            (
                "dim_reduce.stage2.implementation",
                "is mindspore_builtin, but study.recipes has dim_reduce, whose stage 2 the study evaluates every "
                "study.eval_every_steps steps: use trainlib (or take dim_reduce out of study.recipes)",
            )
        )
    if implementation == "mindspore_builtin" and (workers := parameters.distributed.worker_num) > 1:
        problems.append(
            (
                "dim_reduce.stage2.implementation",
                "is mindspore_builtin (mindspore.boost's DimReduce), which runs in one process of its own, outside "
                f"msrun; with distributed.worker_num {workers} use trainlib (P-BFGS averages gradients and losses "
                "across the ranks)",
            )
        )
    return problems


# DimReduce: stage 1, the PCA of its trajectory, then P-BFGS stage 2 against the Momentum control from the same stage-1
# checkpoint (the control evaluates as stage 2 does; neither is tuned: the control has no schedule of its own)
RECIPES = (
    RecipeSpec(
        NAME,
        NAME,
        DimReduceParams,
        (
            ResultRow("stage2", "dim_reduce.stage2", ("control",), budgeted=("eval_every_steps",), colour=SUBSPACE),
            ResultRow("control", "dim_reduce.control", budgeted=()),
        ),
        colour=SUBSPACE,
        other_trainings=(("stage1", WARM_START),),
        report=ReportRuns((NAME,), ("stage1", "stage2"), ("control",)),
        rehearsal=_rehearse,
        cross_section_problems=_runnable,
    ),
)
