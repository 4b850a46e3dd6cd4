"""Nodes of the ``thor`` pipeline: THOR second-order training (``pipelines.recipes.thor``)."""

from __future__ import annotations

import pandas as pd

from pipelines.distributed.launch import on_every_rank
from pipelines.engine.checkpoint import Checkpoint
from pipelines.params import DataParams, DistributedParams, ModelParams, RuntimeParams, ThorParams
from pipelines.recipes import thor as thor_recipe
from pipelines.recipes.classifier import build_network
from pipelines.recipes.context import TrainingContext
from pipelines.shared import evaluate_and_log, training_outputs
from pipelines.tracking import EpochMetrics


def build_thor_network(
    model: ModelParams, zero_init_last_bn_gamma: bool, class_index: dict[str, int], runtime: RuntimeParams
) -> Checkpoint:
    """Initial weights as the THOR recipe builds them: the shared model section with THOR's own
    ``thor.zero_init_last_bn_gamma``."""
    thor_model = model.model_copy(update={"zero_init_last_bn_gamma": zero_init_last_bn_gamma})
    return build_network(thor_model, class_index, runtime)


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
    ``thor.checkpoint.dir`` of the same configuration. With ``distributed.worker_num`` above 1 it trains on that
    many msrun workers."""
    context = TrainingContext(manifest, class_index, model, data, runtime, distributed)
    result = on_every_rank(thor_recipe.train_thor, context, initial_weights, thor, callbacks=[EpochMetrics()])
    return training_outputs(result)


def evaluate_thor(
    checkpoint: Checkpoint,
    manifest: pd.DataFrame,
    class_index: dict[str, int],
    model: ModelParams,
    data: DataParams,
    runtime: RuntimeParams,
) -> dict:
    """Top-1/top-5 of the final checkpoint on val (``thor: top-1 …``), logged as ``final/top1``, ``final/top5``."""
    return evaluate_and_log(checkpoint, manifest, class_index, model, data, runtime, label="thor")
