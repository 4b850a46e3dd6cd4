"""``conf/*/parameters_adasum.yml``: the Momentum recipe with its gradients combined by Adasum."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Literal

from trainlib.fast_dev_run import Plan, training_budget
from trainlib.params.base import ImageRecipe
from trainlib.params.baseline import MomentumTraining
from trainlib.params.choices import BUILTIN_ADASUM_MIN_DEVICES, AdasumExchange, Implementation
from trainlib.params.numbers import PositiveInt
from trainlib.params.recipe_spec import ADASUM, ALL_REDUCE, RecipeSpec, ReportRuns, ResultRow


class AdasumParams(MomentumTraining, ImageRecipe):
    implementation: Implementation
    exchange: Literal["auto", AdasumExchange]  # auto: default_exchange of trainlib.optim.adasum
    average_batchnorm_statistics: bool
    epochs: PositiveInt
    # the ranks' updates combined by Adasum (the recipe), or their gradients averaged (false: plain data parallelism,
    # the study's control on the same ranks)
    combine_by_adasum: bool


# The adasum section's training on study.adasum_workers ranks, the updates combined by Adasum and by averaging
def _rehearse(section: Mapping, plan: Plan) -> dict:
    # mindspore.boost's Adasum needs 16 Ascend devices: the project's own Adasum runs the same combination on CPU
    return {**training_budget(section, plan), "implementation": "trainlib"}


def _runnable(parameters) -> list[tuple[str, str]]:
    """mindspore.boost's Adasum needs Ascend servers of 8 devices, two of them at least."""
    device_target, workers = parameters.runtime.device_target, parameters.distributed.worker_num
    if parameters.adasum.implementation == "mindspore_builtin" and (
        device_target != "Ascend" or workers < BUILTIN_ADASUM_MIN_DEVICES
    ):
        return [
            (
                "adasum.implementation",
                "is mindspore_builtin (mindspore.boost's Adasum), which MindSpore runs on Ascend with "
                f"{BUILTIN_ADASUM_MIN_DEVICES} devices or more (Send/Receive between 8-device servers); this run "
                f"has {workers} {device_target} worker(s): use trainlib",
            )
        ]
    return []


RECIPES = (
    RecipeSpec(
        "adasum",
        "adasum",
        AdasumParams,
        (
            ResultRow("adasum", "adasum", ("allreduce",), colour=ADASUM),
            ResultRow("allreduce", "adasum", colour=ALL_REDUCE, values=(("adasum.combine_by_adasum", False),)),
        ),
        colour=ADASUM,
        several_ranks=True,
        trainer="trainlib.recipes.momentum:train_adasum",
        report=ReportRuns(("adasum",)),
        rehearsal=_rehearse,
        cross_section_problems=_runnable,
    ),
)
