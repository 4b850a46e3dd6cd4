"""``conf/*/parameters_lars.yml``: LARS, the optimizer of MLPerf's ResNet-50 (layer-wise trust ratios on top of
Momentum), the worked example of a recipe added to the project (docs/add-a-recipe.md)."""

from __future__ import annotations

from trainlib.params.base import ImageRecipe
from trainlib.params.baseline import MomentumTraining
from trainlib.params.numbers import NonNegativeFloat, PositiveFloat, PositiveInt
from trainlib.params.recipe_spec import RecipeSpec, ReportRuns, ResultRow

LAYER_WISE = "#edc948"  # Tableau 10's yellow: its runs' colour family in MLflow's charts


class LarsParams(MomentumTraining, ImageRecipe):
    """The Momentum recipe's keys with LARS's: each weight's step scaled by ``trust_coefficient * ||w|| / (||g|| +
    weight_decay * ||w|| + epsilon)`` (BatchNorm parameters and biases: plain Momentum, no decay)."""

    epochs: PositiveInt
    trust_coefficient: PositiveFloat  # MLPerf's eta
    epsilon: NonNegativeFloat  # added to the ratio's denominator; MLPerf's reference: 0


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
