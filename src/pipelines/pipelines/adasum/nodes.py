"""Nodes of the ``adasum`` pipeline: the Momentum recipe with Adasum across the data-parallel ranks."""

from __future__ import annotations

import pandas as pd

from pipelines.distributed.launch import is_power_of_two, on_every_rank
from pipelines.engine.checkpoint import Checkpoint
from pipelines.params import AdasumParams, DataParams, DistributedParams, ModelParams, RuntimeParams
from pipelines.recipes.context import TrainingContext
from pipelines.recipes.momentum import train_adasum as train_adasum_recipe
from pipelines.shared import evaluate_and_log, training_outputs
from pipelines.tracking import EpochMetrics


def train_adasum(
    initial_weights: Checkpoint,
    manifest: pd.DataFrame,
    class_index: dict[str, int],
    model: ModelParams,
    data: DataParams,
    runtime: RuntimeParams,
    distributed: DistributedParams,
    adasum: AdasumParams,
) -> tuple[Checkpoint, pd.DataFrame]:
    """The whole schedule with Adasum of the ranks' weight deltas: final checkpoint and per-epoch history.

    A rank count that is not a power of two is refused here, before any worker starts.
    """
    if adasum.implementation == "own" and not is_power_of_two(distributed.worker_num):
        raise ValueError(
            f"distributed.worker_num is {distributed.worker_num}; Adasum combines ranks recursively in pairs "
            "and needs a power of two (1, 2, 4, 8, 16, ...)"
        )
    context = TrainingContext(manifest, class_index, model, data, runtime, distributed)
    result = on_every_rank(
        train_adasum_recipe, context, initial_weights, adasum, combine_by_adasum=True, callbacks=[EpochMetrics()]
    )
    return training_outputs(result)


def evaluate_adasum(
    checkpoint: Checkpoint,
    manifest: pd.DataFrame,
    class_index: dict[str, int],
    model: ModelParams,
    data: DataParams,
    runtime: RuntimeParams,
) -> dict:
    """Top-1/top-5 of the final checkpoint on val (``adasum: top-1 …``), logged as ``final/top1``, ``final/top5``."""
    return evaluate_and_log(checkpoint, manifest, class_index, model, data, runtime, label="adasum")
