"""``conf/*/parameters_thor.yml``: THOR on ResNet, and the options of this project's THOR that the BERT training
(``thor_bert.thor``) shares."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Annotated

from pydantic import Field, model_validator

from trainlib.fast_dev_run import THOR_FREQUENCY, Plan, training_budget
from trainlib.params.base import CheckpointParams, ImageRecipe, Section
from trainlib.params.choices import AmpLevel, ComputeMethod, DampingMethod, Implementation, StatisticsDtype
from trainlib.params.errors import CrossKeyProblems
from trainlib.params.numbers import Fraction, NonNegativeFloat, NonNegativeInt, PositiveFloat, PositiveInt
from trainlib.params.recipe_spec import SECOND_ORDER, WITHOUT_PRECONDITIONER, RecipeSpec, ReportRuns, ResultRow
from trainlib.params.schedules import Schedule


class MindsporeBuiltinThor(Section):
    """Options of implementation: mindspore_builtin (nn.thor + ModelThor)."""

    amp_level: AmpLevel
    keep_batchnorm_fp32: bool
    dataset_sink_mode: bool


class AdamGraft(Section):
    """Adam grafting (Shampoo's layer-wise grafting): each preconditioned layer's THOR direction is rescaled to the
    norm of the Adam update ``m_hat / (sqrt(v_hat) + eps)`` of the same gradients (moments kept per layer)."""

    beta1: Fraction
    beta2: Fraction
    eps: PositiveFloat


class ThorOptions(Section):
    """The options of this project's THOR (``implementation: trainlib``), one name each for the ResNet (``thor``) and
    BERT (``thor_bert.thor``) sections; every default is today's THOR (``trainlib.optim.thor`` has the maths)."""

    # fixed: sqrt(damping / P) added to A and to G (nn.thor) | factored: Martens & Grosse's pi-scaled split
    damping_method: DampingMethod = "fixed"
    # inverse: damped factor inverses (Cholesky) | eigen: eigendecomposed factors, damping on the eigenvalue products
    compute_method: ComputeMethod = "inverse"
    kl_clip: PositiveFloat | None = None  # kfac-pytorch's bound on lr^2 * sum(g . direction); None: off
    adam_graft: AdamGraft | None = None  # None: off
    # float32: A and G by oneDNN's float32 GEMM, whose bits depend on the CPU's L2 cache size | float64: the same
    # products in float64, rounded once to float32: the same bits whatever the cores and L2 cache, not whatever the
    # CPU family (docs/recipes.md#thor-options)
    statistics_dtype: StatisticsDtype = "float32"


class ThorSettings(ThorOptions):
    """What THOR's step reads from a section (``optim.thor.create_thor_step``, ``ThorPreconditioner``), set alike
    by the ResNet (``thor``) and BERT (``thor_bert.thor``) sections: the shared Momentum's settings, the loss scale,
    the statistics' cadence and blocks, and the options. The section itself is passed: no dict in between."""

    momentum: Fraction
    weight_decay: NonNegativeFloat
    loss_scale: PositiveFloat
    frequency: Annotated[int, Field(ge=2)]  # 1 would recompute the inverses every step
    block_size: PositiveInt | None  # None: full inverses

    def option_problems(self, section: str) -> list[tuple[str, str]]:
        """Combinations the options cannot run (``section``: the dotted name of this section, for the message)."""
        if self.compute_method == "eigen" and self.block_size is not None:
            return [(f"{section}.compute_method", f"eigen decomposes the full factors; set {section}.block_size: null")]
        return []


class ThorParams(ImageRecipe, ThorSettings):
    implementation: Implementation
    # false: THOR's recipe (schedules, weight decay, initialisation, loss scale) with the gradients passed to the
    # optimizer unchanged: what the curvature adds, measured against THOR's own recipe (implementation trainlib only)
    precondition: bool
    epochs: PositiveInt
    batch_size: PositiveInt
    lr: Schedule
    damping: Schedule
    label_smoothing: Fraction
    trace_rule: Annotated[list[float], Field(min_length=2, max_length=2)] | None  # [skip, stop]
    zero_init_last_bn_gamma: bool  # the initial weights' last BatchNorm gamma of each residual block is 0
    # nn.thor's allreduce fusion groups of the A/G statistics (implementation mindspore_builtin)
    split_indices: list[int]
    eval_interval: NonNegativeInt
    eval_every_steps: NonNegativeInt  # also evaluate on data.step_eval_images every N steps; 0: off
    checkpoint: CheckpointParams
    mindspore_builtin: MindsporeBuiltinThor

    @model_validator(mode="after")
    def _consistent(self) -> ThorParams:
        problems = []
        if self.trace_rule is not None and not 0 <= self.trace_rule[1] <= self.trace_rule[0]:
            problems.append(("thor.trace_rule", f"is {self.trace_rule}; give [skip, stop] with 0 <= stop <= skip"))
        if self.compute_method == "eigen" and self.trace_rule is not None:
            problems.append(("thor.compute_method", "eigen has no trace rule; set thor.trace_rule: null"))
        problems += self.option_problems("thor")
        changed = [key for key, value in ThorOptions().model_dump().items() if getattr(self, key) != value]
        if changed and self.implementation != "trainlib":
            problems.append(
                (
                    f"thor.{changed[0]}",
                    "is an option of this project's THOR; nn.thor (implementation mindspore_builtin) has none",
                )
            )
        if not self.precondition and self.implementation != "trainlib":
            problems.append(
                (
                    "thor.precondition",
                    "is false, which switches off this project's preconditioner; MindSpore's nn.thor "
                    "(thor.implementation: mindspore_builtin) has no such switch: use implementation trainlib",
                )
            )
        CrossKeyProblems.raise_if_any(problems)
        return self


def _rehearse(section: Mapping, plan: Plan) -> dict:
    return {
        **training_budget(section, plan),
        "implementation": "trainlib",  # MindSpore's nn.thor kernels exist only on Ascend and GPU
        "frequency": THOR_FREQUENCY,
    }


def _runnable(parameters) -> list[tuple[str, str]]:
    """MindSpore's nn.thor has its kernels on Ascend and GPU only."""
    if parameters.thor.implementation == "mindspore_builtin" and parameters.runtime.device_target == "CPU":
        return [
            (
                "thor.implementation",
                "is mindspore_builtin, whose kernels (ThorIm2Col, CholeskyTrsm, UpdateThorGradient) exist only "
                "on Ascend and GPU, but runtime.device_target is CPU; use thor.implementation: trainlib (this "
                "project's THOR, every backend), or run on Ascend/GPU (--env=ascend, --env=gpu)",
            )
        ]
    return []


# THOR, compared with the baseline and with its own recipe without the preconditioner (thor.precondition false)
RECIPES = (
    RecipeSpec(
        "thor",
        "thor",
        ThorParams,
        (
            ResultRow(
                "thor",
                "thor",
                ("baseline", "thor_first_order"),
                tunable=True,
                preconditioned=True,
                colour=SECOND_ORDER,
            ),
        ),
        colour=SECOND_ORDER,
        report=ReportRuns(("thor",)),
        trainer="trainlib.recipes.thor:train_thor",
        rehearsal=_rehearse,
        cross_section_problems=_runnable,
    ),
    RecipeSpec(
        "thor_first_order",
        "thor",
        ThorParams,
        (
            ResultRow(
                "thor_first_order",
                "thor",
                tunable=True,
                colour=WITHOUT_PRECONDITIONER,
                values=(("thor.precondition", False),),
            ),
        ),
        colour=WITHOUT_PRECONDITIONER,
        pipeline="thor",  # the thor pipeline with thor.precondition false
        cross_section_problems=_runnable,
    ),
)
