"""Nodes of the ``baseline`` pipeline: the Momentum recipe."""

from __future__ import annotations

import pandas as pd

from pipelines.distributed.launch import data_parallel
from pipelines.engine.checkpoint import Checkpoint
from pipelines.params import BaselineParams, BoostParams, DataParams, DistributedParams, ModelParams, RuntimeParams
from pipelines.recipes.momentum import train_momentum
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

    With ``distributed.worker_num`` above 1 it trains on that many msrun workers (``_train_on_every_rank``).
    """
    return _train_on_every_rank(
        initial_weights, manifest, class_index, model, data, runtime, distributed, baseline, boost
    )


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


# The node's function is the plain one above, so that kedro-viz shows this file and its code: a decorated
# function's code object is the decorator's.
@data_parallel
def _train_on_every_rank(
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
