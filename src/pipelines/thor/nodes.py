"""Nodes of the ``thor`` pipeline: THOR second-order training (``pipelines.recipes.thor``)."""

from __future__ import annotations

import pandas as pd

from pipelines.distributed.launch import data_parallel
from pipelines.engine.checkpoint import Checkpoint
from pipelines.params import DataParams, DistributedParams, ModelParams, RuntimeParams, ThorParams
from pipelines.recipes import thor as thor_recipe
from pipelines.recipes.common import build_network
from pipelines.shared import training_outputs
from pipelines.tracking import EpochMetrics


def build_thor_network(
    model: ModelParams, thor: ThorParams, class_index: dict[str, int], runtime: RuntimeParams
) -> Checkpoint:
    """Initial weights as the THOR recipe builds them (``thor.zero_init_last_bn_gamma``)."""
    return build_network(thor_recipe.thor_model(model, thor), class_index, runtime)


@data_parallel
def train_thor(
    initial_weights: Checkpoint,
    manifest: pd.DataFrame,
    class_index: dict[str, int],
    model: ModelParams,
    data: DataParams,
    runtime: RuntimeParams,
    distributed: DistributedParams,
    thor: ThorParams,
) -> tuple[Checkpoint, pd.DataFrame]:
    """THOR training from the initial weights: the final checkpoint (weights, and under ``optimizer.`` the momenta,
    A/G statistics, inverses and counters) and the per-epoch history. ``thor.implementation`` own: this project's
    THOR; mindspore: ``nn.thor`` with ``ModelThor`` (Ascend/GPU). A rerun resumes from the newest checkpoint in
    ``thor.checkpoint.dir`` of the same configuration."""
    result = thor_recipe.train_thor(
        initial_weights,
        manifest,
        class_index,
        model,
        data,
        runtime,
        distributed,
        thor,
        callbacks=[EpochMetrics()],
    )
    return training_outputs(result)
