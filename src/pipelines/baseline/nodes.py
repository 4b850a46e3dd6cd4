"""Nodes of the ``baseline`` pipeline: the Momentum recipe."""

from __future__ import annotations

import pandas as pd

from ..common.training import train_momentum
from pipelines.engine.checkpoint import Checkpoint
from pipelines.distributed.launch import data_parallel


@data_parallel
def train_baseline(
    initial_weights: Checkpoint,
    manifest: pd.DataFrame,
    class_index: dict[str, int],
    model: dict,
    data: dict,
    runtime: dict,
    distributed: dict,
    baseline: dict,
    boost: dict,
) -> tuple[Checkpoint, pd.DataFrame]:
    """The whole Momentum schedule from the initial weights: final checkpoint and per-epoch history."""
    return train_momentum(
        initial_weights,
        manifest,
        class_index,
        model,
        data,
        runtime,
        distributed,
        baseline,
        stop_epoch=baseline["epochs"],
        schedule_epochs=baseline["epochs"],
        boost=boost,
    )
