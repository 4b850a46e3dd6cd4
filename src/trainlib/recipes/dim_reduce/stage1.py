"""dim_reduce's Momentum trainings and the subspace between them: stage 1 keeping the weight trajectory, the
trajectory's selection and PCA, and the control (stage 1's Momentum continued over stage 2's epochs)."""

from __future__ import annotations

import logging
from collections.abc import Sequence

import numpy as np
import pandas as pd

from trainlib.engine.callbacks import Callback
from trainlib.engine.checkpoint import Checkpoint
from trainlib.engine.loop import TrainingResult
from trainlib.optim.dim_reduce.pca import TrajectoryPCA, fit_trajectory_pca
from trainlib.optim.dim_reduce.trajectory import TrajectoryRecorder, select_trajectory, verify_trajectory
from trainlib.params import (
    BoostParams,
    CollectParams,
    ControlParams,
    NetworkParams,
    PcaParams,
    Stage1Params,
    Stage2Params,
)
from trainlib.recipes.classifier import create_network
from trainlib.recipes.context import TrainingContext
from trainlib.recipes.momentum import train_momentum

logger = logging.getLogger(__name__)


def train_stage1(
    context: TrainingContext,
    start: Checkpoint,
    stage1: Stage1Params,
    *,
    boost: BoostParams,
    callbacks: Sequence[Callback] = (),
) -> tuple[TrainingResult, pd.DataFrame]:
    """Momentum from ``start`` to epoch ``stage1.epochs`` of a ``stage1.schedule_epochs`` schedule, keeping the
    weight trajectory in ``stage1.trajectory.dir``.

    Returns the training's result and the trajectory index (path, epoch, step, global step; empty on the ranks
    that write no files). A resumed stage 1 keeps the trajectory files of the epochs before the resume.
    """
    trajectory = stage1.trajectory
    recorder = TrajectoryRecorder(
        trajectory.dir,
        start_epoch=trajectory.start_epoch,
        every_steps=trajectory.every_steps,
        every_epochs=trajectory.every_epochs,
    )
    result = train_momentum(
        context,
        start,
        stage1,
        name="stage1",
        schedule_epochs=stage1.schedule_epochs,
        boost=boost,
        callbacks=callbacks,
        leader_callbacks=[recorder],
    )
    index = recorder.index
    if len(index):
        logger.info("Stage 1 recorded %d trajectory files in %s", len(index), trajectory.dir)
    return result, index


def collect_trajectory(
    trajectory_index: pd.DataFrame,
    network: NetworkParams,
    class_index: dict[str, int],
    collect: CollectParams,
    pca: PcaParams,
) -> pd.DataFrame:
    """The last ``collect.n_files`` trajectory files, each checked against the network's trainable parameters."""
    chosen = select_trajectory(trajectory_index, n_files=collect.n_files, n_components=pca.n_components)
    net = create_network(network, class_index)
    verify_trajectory(chosen["path"].tolist(), {p.name: tuple(p.shape) for p in net.trainable_params()})
    return chosen


def trajectory_pca(
    selected_trajectory: pd.DataFrame, network: NetworkParams, class_index: dict[str, int], pca: PcaParams
) -> TrajectoryPCA:
    """The top ``pca.n_components`` principal directions of the selected trajectory files (k x n, float32 rows
    over the network's trainable parameters in order, flattened)."""
    names = [p.name for p in create_network(network, class_index).trainable_params()]
    result = fit_trajectory_pca(selected_trajectory["path"].tolist(), names, n_components=pca.n_components)
    logger.info(
        "PCA: %d components of %d parameters explain %.1f%% of the trajectory's variance",
        *result.components.shape,
        100 * float(np.sum(result.explained_variance_ratio)),
    )
    return result


def train_control(
    context: TrainingContext,
    stage1_checkpoint: Checkpoint,
    stage1: Stage1Params,
    stage2: Stage2Params,
    control: ControlParams,
    *,
    boost: BoostParams,
    callbacks: Sequence[Callback] = (),
) -> TrainingResult:
    """Stage 1's Momentum continued from its checkpoint (momentum, step, epoch) for ``stage2.epochs`` epochs."""
    return train_momentum(
        context,
        stage1_checkpoint,
        # evaluated every K steps as stage 2 is, so the two compare at step resolution
        stage1.model_copy(update={"checkpoint": control.checkpoint, "eval_every_steps": stage2.eval_every_steps}),
        name="control",
        epochs=stage1.epochs + stage2.epochs,
        schedule_epochs=stage1.schedule_epochs,
        continue_from_start=True,
        boost=boost,
        callbacks=callbacks,
    )
