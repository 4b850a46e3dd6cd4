"""``conf/*/parameters_lars.yml``: LARS, the optimizer of MLPerf's ResNet-50 (layer-wise trust ratios on top of
Momentum), the worked example of a recipe added to the project (docs/add-a-recipe.md)."""

from __future__ import annotations

from trainlib.params.base import ImageRecipe, Section
from trainlib.params.baseline import MomentumTraining
from trainlib.params.numbers import Fraction, NonNegativeFloat, PositiveFloat, PositiveInt
from trainlib.params.recipe_spec import RecipeSpec, ReportRuns, ResultRow

LAYER_WISE = "#edc948"  # Tableau 10's yellow: its runs' colour family in MLflow's charts


class LarsSettings(Section):
    """What the LARS optimizer reads from a section (``optim.lars.LARS``, ``create_lars``): the section itself is
    passed, validated once, no dict in between."""

    momentum: Fraction
    weight_decay: NonNegativeFloat  # inside LARS's step, also in the trust ratio's denominator
    trust_coefficient: PositiveFloat  # MLPerf's eta
    epsilon: NonNegativeFloat  # added to the ratio's denominator; MLPerf's reference: 0
    loss_scale: PositiveFloat  # the gradients arrive multiplied by it; divided out before the norms


# LarsSettings first among the bases: the Momentum recipe's keys still lead the section's key order
class LarsParams(LarsSettings, MomentumTraining, ImageRecipe):
    """The Momentum recipe's keys with LARS's: each weight's step scaled by ``trust_coefficient * ||w|| / (||g|| +
    weight_decay * ||w|| + epsilon)`` (BatchNorm parameters and biases: plain Momentum, no decay)."""

    epochs: PositiveInt


RECIPES = (
    RecipeSpec(
        "lars",
        "lars",
        LarsParams,
        (ResultRow("lars", "lars", ("baseline",), tunable=True, colour=LAYER_WISE),),
        colour=LAYER_WISE,
        report=ReportRuns(("lars",)),
        trainer="trainlib.recipes.lars:train_lars",
    ),
)
