"""Nodes of the ``adasum`` pipeline: the Momentum recipe with Adasum across the data-parallel ranks."""

from __future__ import annotations

import pandas as pd

from ..common.training import train_momentum
from ..lib.checkpoint import Checkpoint
from ..lib.distributed import data_parallel


@data_parallel
def train_adasum(
    initial_weights: Checkpoint,
    manifest: pd.DataFrame,
    class_index: dict[str, int],
    model: dict,
    data: dict,
    runtime: dict,
    distributed: dict,
    adasum: dict,
) -> tuple[Checkpoint, pd.DataFrame]:
    """The whole schedule with Adasum of the ranks' weight deltas: final checkpoint and per-epoch history."""
    return train_momentum(
        initial_weights,
        manifest,
        class_index,
        model,
        data,
        runtime,
        distributed,
        adasum,
        stop_epoch=adasum["epochs"],
        schedule_epochs=adasum["epochs"],
        adasum=adasum,
        metric_prefix="",
    )
