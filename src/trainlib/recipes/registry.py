"""Which library function trains each image recipe's section: the training template's ``train`` node
(``pipelines.training``) calls ``train_recipe`` with whichever section it was given, and the recipe whose section
it is names its trainer (``RecipeSpec.trainer``), so a new image recipe is a section model, a specification and a
trainer, not a new node nor a line here."""

from __future__ import annotations

from collections.abc import Sequence
from importlib import import_module

from pydantic import BaseModel

from trainlib.distributed.launch import is_power_of_two
from trainlib.engine.callbacks import Callback
from trainlib.engine.checkpoint import Checkpoint
from trainlib.engine.loop import TrainingResult
from trainlib.params import AdasumParams, BoostParams, DistributedParams
from trainlib.params.recipe_spec import template_trainers
from trainlib.recipes.context import TrainingContext


def train_recipe(
    context: TrainingContext,
    start: Checkpoint,
    recipe: BaseModel,
    *,
    boost: BoostParams,
    callbacks: Sequence[Callback] = (),
) -> TrainingResult:
    """``recipe``'s whole training from ``start``, by the trainer its specification names for its section's type
    (baseline: Momentum with ``boost``'s options, mindspore.boost in the step; adasum: Momentum with Adasum across
    the ranks, or averaged gradients with ``combine_by_adasum`` false; thor; lars). Only a recipe that
    ``takes_boost`` gets ``boost``: the boost section's options are the Momentum baseline's."""
    spec = template_trainers().get(type(recipe))
    if spec is None:
        raise TypeError(f"no image recipe trains a {type(recipe).__name__} section (RecipeSpec.trainer)")
    module, _, function = spec.trainer.partition(":")
    trainer = getattr(import_module(module), function)
    extra = {"boost": boost} if spec.takes_boost else {}
    return trainer(context, start, recipe, callbacks=callbacks, **extra)


def check_launch(recipe: BaseModel, distributed: DistributedParams) -> None:
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
