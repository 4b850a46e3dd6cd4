"""The recipe's section and specification: what resnet-recipes' study, tuning, report and registry read."""

from __future__ import annotations

from trainlib.params.base import ImageRecipe
from trainlib.params.baseline import MomentumTraining
from trainlib.params.numbers import PositiveInt
from trainlib.params.recipe_spec import RecipeSpec, ReportRuns, ResultRow

LOOK_AHEAD = "#9c755f"  # Tableau 10's brown: its runs' colour in MLflow's charts


class NesterovParams(MomentumTraining, ImageRecipe):
    """The Momentum recipe's keys; the step looks ahead along the momentum (Nesterov)."""

    epochs: PositiveInt


RECIPES = (
    RecipeSpec(
        "nesterov",
        "nesterov",
        NesterovParams,
        (ResultRow("nesterov", "nesterov", ("baseline",), tunable=True, colour=LOOK_AHEAD),),
        colour=LOOK_AHEAD,
        report=ReportRuns(("nesterov",)),
        trainer="nesterov_recipe.train:train_nesterov",
        pipeline_module="nesterov_recipe.pipeline",
    ),
)
