"""Which library function trains each image recipe's section: the training template's ``train`` node
(``pipelines.training``) calls ``train_recipe`` with whichever section it was given (baseline, adasum,
thor), so a new image recipe is a section model and a trainer here, not a new node."""

from __future__ import annotations

from collections.abc import Sequence

from trainlib.distributed.launch import is_power_of_two
from trainlib.engine.callbacks import Callback
from trainlib.engine.checkpoint import Checkpoint
from trainlib.engine.loop import TrainingResult
from trainlib.params import AdasumParams, BaselineParams, BoostParams, DistributedParams, LarsParams, ThorParams
from trainlib.recipes.context import TrainingContext
from trainlib.recipes.lars import train_lars
from trainlib.recipes.momentum import train_adasum, train_baseline
from trainlib.recipes.thor import train_thor


def train_recipe(
    context: TrainingContext,
    start: Checkpoint,
    recipe: BaselineParams | AdasumParams | ThorParams | LarsParams,
    *,
    boost: BoostParams,
    callbacks: Sequence[Callback] = (),
) -> TrainingResult:
    """``recipe``'s whole training from ``start``: Momentum (with ``boost``'s options, mindspore.boost in the step),
    Momentum with Adasum across the ranks (or averaged gradients, ``combine_by_adasum`` false), THOR or LARS, chosen
    by the section's type. Adasum, THOR and LARS leave ``boost`` aside, as Adasum and THOR always have (the boost
    section's options are the Momentum baseline's)."""
    if isinstance(recipe, BaselineParams):
        return train_baseline(context, start, recipe, boost=boost, callbacks=callbacks)
    if isinstance(recipe, AdasumParams):
        return train_adasum(context, start, recipe, combine_by_adasum=recipe.combine_by_adasum, callbacks=callbacks)
    if isinstance(recipe, ThorParams):
        return train_thor(context, start, recipe, callbacks=callbacks)
    if isinstance(recipe, LarsParams):
        return train_lars(context, start, recipe, callbacks=callbacks)
    raise TypeError(f"no image recipe trains a {type(recipe).__name__} section")


def check_launch(recipe: BaselineParams | AdasumParams | ThorParams, distributed: DistributedParams) -> None:
    """Refuse, before any worker starts, a rank layout ``recipe`` cannot train on: Adasum combines ranks
    recursively in pairs."""
    if (
        isinstance(recipe, AdasumParams)
        and recipe.implementation == "trainlib"
        and not is_power_of_two(distributed.worker_num)
    ):
        raise ValueError(
            f"distributed.worker_num is {distributed.worker_num}; Adasum combines ranks recursively in pairs "
            "and needs a power of two (1, 2, 4, 8, 16, ...)"
        )
