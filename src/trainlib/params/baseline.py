"""``conf/*/parameters_baseline.yml``: the Momentum recipe, whose keys adasum and dim_reduce's stage 1 share."""

from __future__ import annotations

from trainlib.params.base import CheckpointParams, ImageRecipe, Section
from trainlib.params.numbers import Fraction, NonNegativeFloat, NonNegativeInt, PositiveFloat, PositiveInt
from trainlib.params.recipe_spec import RecipeSpec, ReportRuns, ResultRow
from trainlib.params.schedules import Schedule


class MomentumTraining(Section):
    """The Momentum recipe's keys, shared by baseline, adasum and dim_reduce stage 1."""

    batch_size: PositiveInt  # per device
    lr: Schedule
    momentum: Fraction
    weight_decay: NonNegativeFloat
    label_smoothing: Fraction
    loss_scale: PositiveFloat
    zero_init_last_bn_gamma: bool  # the initial weights' last BatchNorm gamma of each residual block is 0
    eval_interval: NonNegativeInt  # 0: only after the last epoch
    checkpoint: CheckpointParams
    eval_every_steps: NonNegativeInt  # also evaluate on data.step_eval_images every N steps; 0: off


class BaselineParams(MomentumTraining, ImageRecipe):
    epochs: PositiveInt


# The Momentum baseline: MindSpore's documented ResNet-50 recipe (conf/base/parameters_baseline.yml)
RECIPES = (
    RecipeSpec(
        "baseline",
        "baseline",
        BaselineParams,
        (ResultRow("baseline", "baseline", tunable=True),),
        report=ReportRuns(("baseline", "__default__")),  # the default pipeline is the baseline's
        trainer="trainlib.recipes.momentum:train_baseline",
        takes_boost=True,
        reference=True,
    ),
)
