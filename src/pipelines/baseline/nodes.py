"""Nodes of the ``baseline`` pipeline: the Momentum recipe."""

from __future__ import annotations

import pandas as pd

from pipelines.distributed.launch import data_parallel
from pipelines.engine.checkpoint import Checkpoint
from pipelines.params import BaselineParams, BoostParams, DataParams, DistributedParams, ModelParams, RuntimeParams
from pipelines.recipes.momentum import train_momentum
from pipelines.shared import training_outputs
from pipelines.tracking import EpochMetrics


@data_parallel
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
    """The whole Momentum schedule from the initial weights: final checkpoint and per-epoch history."""
    result = train_momentum(
        initial_weights,
        manifest,
        class_index,
        model,
        data,
        runtime,
        distributed,
        baseline,
        epochs=baseline.epochs,
        schedule_epochs=baseline.epochs,
        boost=boost,
        callbacks=[EpochMetrics()],
    )
    return training_outputs(result)
