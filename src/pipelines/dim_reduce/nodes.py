"""Nodes of the ``dim_reduce`` pipeline: stage 1 with a weight trajectory, PCA, P-BFGS stage 2, a control, their
comparison (the library: ``trainlib.recipes.dim_reduce``). Each training logs into its own MLflow child run (its
nodes are tagged ``training_run``); the ``pca/…`` figures and the comparison into the ``kedro run``'s run. A training
runs on ``distributed.worker_num`` msrun workers when that is above 1, and a rerun resumes from its checkpoints."""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import numpy as np
import pandas as pd
from matplotlib.figure import Figure

from pipelines import tracking
from pipelines.training.nodes import training_context, training_outputs
from trainlib.distributed.launch import on_every_rank
from trainlib.engine.checkpoint import Checkpoint
from trainlib.optim.dim_reduce.pca import explained_variance_table
from trainlib.params import (
    BoostParams,
    CollectParams,
    ControlParams,
    DataParams,
    DistributedParams,
    NetworkParams,
    PcaParams,
    RuntimeParams,
    Stage1Params,
    Stage2Params,
)
from trainlib.params.recipe_spec import recipe_specs
from trainlib.recipes import dim_reduce
from trainlib.report.figures import explained_variance_figure

RECIPE = "dim_reduce"


def train_stage1(
    initial_weights: Checkpoint,
    manifest: pd.DataFrame,
    class_index: dict[str, int],
    network: NetworkParams,
    data: DataParams,
    runtime: RuntimeParams,
    distributed: DistributedParams,
    stage1: Stage1Params,
    boost: BoostParams,
) -> tuple[Checkpoint, pd.DataFrame, pd.DataFrame, pd.DataFrame]:
    """Momentum to ``stage1.epochs`` of a ``stage1.schedule_epochs`` schedule, keeping the weight trajectory: the
    checkpoint of the last step, the per-epoch and step histories and the trajectory index."""
    context = training_context(manifest, class_index, network, data, runtime, distributed)
    result, index = on_every_rank(
        dim_reduce.train_stage1, context, initial_weights, stage1, boost=boost, callbacks=[tracking.EpochMetrics()]
    )
    return *training_outputs(result), index


def collect_trajectory(
    trajectory_index: pd.DataFrame,
    class_index: dict[str, int],
    network: NetworkParams,
    collect: CollectParams,
    pca: PcaParams,
) -> pd.DataFrame:
    """The last ``collect.n_files`` trajectory files, checked against the network's parameters."""
    chosen = dim_reduce.collect_trajectory(trajectory_index, network, class_index, collect, pca)
    tracking.log_metrics({"pca/trajectory_files": len(trajectory_index), "pca/trajectory_length": len(chosen)})
    return chosen


def fit_pca(
    selected_trajectory: pd.DataFrame,
    class_index: dict[str, int],
    network: NetworkParams,
    pca: PcaParams,
) -> tuple[np.ndarray, pd.DataFrame, Figure]:
    """k x n projection of the centred trajectory, its explained-variance table and plot."""
    result = dim_reduce.trajectory_pca(selected_trajectory, network, class_index, pca)
    table = explained_variance_table(result)
    tracking.log_metrics(
        {
            "pca/explained_variance_ratio": float(table["explained_variance_ratio"].sum()),
            "pca/first_component_ratio": float(table["explained_variance_ratio"].iloc[0]),
            "pca/parameters": float(result.components.shape[1]),
        }
    )
    return result.components, table, explained_variance_figure(table)


def _log_pbfgs_steps(rows: Sequence[Mapping[str, float]]) -> None:
    """Each P-BFGS step's loss, accepted step size and trials, at its global step (``on_steps``: picklable)."""
    tracking.log_epoch_rows(dim_reduce.step_metrics(rows), step_key="step")


def train_stage2(
    stage1_checkpoint: Checkpoint,
    pca_matrix: np.ndarray,
    manifest: pd.DataFrame,
    class_index: dict[str, int],
    network: NetworkParams,
    data: DataParams,
    runtime: RuntimeParams,
    distributed: DistributedParams,
    stage2: Stage2Params,
) -> tuple[Checkpoint, pd.DataFrame, pd.DataFrame, pd.DataFrame]:
    """P-BFGS in the PCA subspace for ``stage2.epochs`` epochs from the stage-1 weights (``implementation:
    mindspore_builtin``: ``mindspore.boost``'s DimReduce instead, in a process of its own): the final checkpoint, the
    per-epoch and step histories and the per-step table."""
    context = training_context(manifest, class_index, network, data, runtime, distributed)
    callbacks = [tracking.EpochMetrics()]
    if stage2.implementation == "mindspore_builtin":
        handoff = tracking.MlflowRunHandoff.capture()
        result, steps = dim_reduce.train_stage2_builtin(
            context, stage1_checkpoint, pca_matrix, stage2, callbacks=callbacks, run_handoff=handoff
        )
    else:
        result, steps = on_every_rank(
            dim_reduce.train_stage2, context, stage1_checkpoint, pca_matrix, stage2, callbacks=callbacks,
            on_steps=_log_pbfgs_steps,
        )  # fmt: skip
    return *training_outputs(result), steps


def train_control(
    stage1_checkpoint: Checkpoint,
    manifest: pd.DataFrame,
    class_index: dict[str, int],
    network: NetworkParams,
    data: DataParams,
    runtime: RuntimeParams,
    distributed: DistributedParams,
    stage1: Stage1Params,
    stage2: Stage2Params,
    control: ControlParams,
    boost: BoostParams,
) -> tuple[Checkpoint, pd.DataFrame, pd.DataFrame]:
    """Momentum continued from the stage-1 checkpoint (stage 1's recipe) for as many epochs as stage 2 trains."""
    context = training_context(manifest, class_index, network, data, runtime, distributed)
    result = on_every_rank(
        dim_reduce.train_control, context, stage1_checkpoint, stage1, stage2, control, boost=boost,
        callbacks=[tracking.EpochMetrics()],
    )  # fmt: skip
    return training_outputs(result)


def compare_runs(**reports: dict) -> pd.DataFrame:
    """One row per training, its evaluation report under its name (``stage1``, ``stage2``, ``control``): top-1/top-5
    and the gain over the Momentum control; each result row's top-1 gain over the row it is paired with is logged
    (``dim_reduce/stage2_minus_control_top1``)."""
    table = dim_reduce.compare_runs(reports)
    tracking.log_metrics(
        {
            f"{RECIPE}/{row}_minus_{reference}_top1": reports[row]["top1"] - reports[reference]["top1"]
            for row, reference in recipe_specs()[RECIPE].paired_trainings
        }
    )
    return table
