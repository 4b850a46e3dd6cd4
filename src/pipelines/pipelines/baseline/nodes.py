"""Nodes of the ``baseline`` pipeline: the Momentum recipe."""

from __future__ import annotations

import pandas as pd

from pipelines.distributed.launch import on_every_rank
from pipelines.engine.checkpoint import Checkpoint
from pipelines.params import BaselineParams, BoostParams, DataParams, DistributedParams, ModelParams, RuntimeParams
from pipelines.recipes.context import TrainingContext
from pipelines.recipes.momentum import train_baseline as train_momentum_recipe
from pipelines.shared import evaluate_and_log, training_outputs
from pipelines.tracking import EpochMetrics


def train_baseline(
    initial_weights: Checkpoint,
    manifest: pd.DataFrame,
    class_index: dict[str, int],
    model: ModelParams,
    data: DataParams,
    runtime: RuntimeParams,
    distributed: DistributedParams,
    baseline: BaselineParams,
    boost: BoostParams,
) -> tuple[Checkpoint, pd.DataFrame]:
    """The whole Momentum schedule from the initial weights: final checkpoint and per-epoch history.

    With ``distributed.worker_num`` above 1 it trains on that many msrun workers.
    """
    context = TrainingContext(manifest, class_index, model, data, runtime, distributed)
    result = on_every_rank(
        train_momentum_recipe, context, initial_weights, baseline, boost=boost, callbacks=[EpochMetrics()]
    )
    return training_outputs(result)


def evaluate_baseline(
    checkpoint: Checkpoint,
    manifest: pd.DataFrame,
    class_index: dict[str, int],
    model: ModelParams,
    data: DataParams,
    runtime: RuntimeParams,
) -> dict:
    """Top-1/top-5 of the final checkpoint on val (``baseline: top-1 …``), logged as ``final/top1``, ``final/top5``."""
    return evaluate_and_log(checkpoint, manifest, class_index, model, data, runtime, label="baseline")
