"""Nodes of the ``dim_reduce`` pipeline: stage 1 with a weight trajectory, PCA, P-BFGS stage 2, a control.

The library (``pipelines.recipes.dim_reduce``) trains; the nodes unpack the typed parameters and log. Each of the
three trainings logs into its own MLflow child run of the ``kedro run``'s run (``stage1``, ``stage2``,
``control``); the trajectory and PCA figures (``pca/…``) and the comparison go to the ``kedro run``'s run.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence

import numpy as np
import pandas as pd
from matplotlib.figure import Figure

from pipelines import tracking
from pipelines.distributed.launch import on_every_rank
from pipelines.engine.checkpoint import Checkpoint
from pipelines.metrics import TIMESTAMP_KEY
from pipelines.optim.dim_reduce.pca import explained_variance_table
from pipelines.params import (
    BoostParams,
    CollectParams,
    ControlParams,
    DataParams,
    DistributedParams,
    ModelParams,
    PcaParams,
    RuntimeParams,
    Stage1Params,
    Stage2Params,
)
from pipelines.recipes import dim_reduce as recipe
from pipelines.recipes.context import TrainingContext
from pipelines.report.compare import explained_variance_figure
from pipelines.shared import evaluate_and_log, training_outputs

logger = logging.getLogger(__name__)

STAGE2_MINUS_CONTROL_TOP1 = "dim_reduce/stage2_minus_control_top1"


def train_stage1(
    initial_weights: Checkpoint,
    manifest: pd.DataFrame,
    class_index: dict[str, int],
    model: ModelParams,
    data: DataParams,
    runtime: RuntimeParams,
    distributed: DistributedParams,
    stage1: Stage1Params,
    boost: BoostParams,
) -> tuple[Checkpoint, pd.DataFrame, pd.DataFrame]:
    """Momentum to ``stage1.epochs`` of a ``stage1.schedule_epochs`` schedule, keeping the weight trajectory.

    Returns the full checkpoint of the last step, the per-epoch history and the trajectory index. With
    ``distributed.worker_num`` above 1 it trains on that many msrun workers.
    """
    context = TrainingContext(manifest, class_index, model, data, runtime, distributed)
    with tracking.training_run("stage1", {"dim_reduce.stage1": stage1, "boost": boost}):
        result, index = on_every_rank(
            recipe.train_stage1, context, initial_weights, stage1, boost=boost, callbacks=[tracking.EpochMetrics()]
        )
        checkpoint, history = training_outputs(result)
    tracking.log_metrics({"pca/trajectory_files": len(index)})
    return checkpoint, history, index


def collect_trajectory(
    trajectory_index: pd.DataFrame,
    class_index: dict[str, int],
    model: ModelParams,
    collect: CollectParams,
    pca: PcaParams,
) -> pd.DataFrame:
    """The last ``collect.n_files`` trajectory files, checked against the network's parameters."""
    chosen = recipe.collect_trajectory(trajectory_index, model, class_index, collect, pca)
    tracking.log_metrics({"pca/trajectory_length": len(chosen)})
    return chosen


def fit_pca(
    selected_trajectory: pd.DataFrame,
    class_index: dict[str, int],
    model: ModelParams,
    pca: PcaParams,
) -> tuple[np.ndarray, pd.DataFrame, Figure]:
    """k x n projection of the centred trajectory, its explained-variance table and plot."""
    result = recipe.trajectory_pca(selected_trajectory, model, class_index, pca)
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
    """Each P-BFGS step's loss, accepted step size and trials, at its global step and wall-clock time."""
    tracking.log_epoch_rows(
        [
            {
                "step": row["step"],
                TIMESTAMP_KEY: row[recipe.STEP_TIMESTAMP],
                "pbfgs/step_loss": row["loss"],
                "pbfgs/step_size": row["step_size"],
                "pbfgs/trials": row["trials"],
            }
            for row in rows
        ],
        step_key="step",
    )


def train_stage2(
    stage1_checkpoint: Checkpoint,
    pca_matrix: np.ndarray,
    manifest: pd.DataFrame,
    class_index: dict[str, int],
    model: ModelParams,
    data: DataParams,
    runtime: RuntimeParams,
    distributed: DistributedParams,
    stage2: Stage2Params,
) -> tuple[Checkpoint, pd.DataFrame, pd.DataFrame]:
    """P-BFGS in the PCA subspace for ``stage2.epochs`` epochs from the stage-1 weights (``implementation:
    mindspore``: ``mindspore.boost``'s DimReduce instead, in a process of its own).

    Returns the final checkpoint, the per-epoch history and the per-step table. A rerun of the same
    configuration resumes from the newest checkpoint in ``stage2.checkpoint.dir``. With
    ``distributed.worker_num`` above 1 it trains on that many msrun workers.
    """
    context = TrainingContext(manifest, class_index, model, data, runtime, distributed)
    with tracking.training_run("stage2", {"dim_reduce.stage2": stage2}):
        if stage2.implementation == "mindspore":
            result, steps = recipe.train_stage2_with_boost(
                context,
                stage1_checkpoint,
                pca_matrix,
                stage2,
                callbacks=[tracking.EpochMetrics()],
                run_handoff=tracking.MlflowRunHandoff.capture(),
            )
        else:
            result, steps = on_every_rank(
                recipe.train_stage2,
                context,
                stage1_checkpoint,
                pca_matrix,
                stage2,
                callbacks=[tracking.EpochMetrics()],
                on_steps=_log_pbfgs_steps,
            )
        checkpoint, history = training_outputs(result)
    return checkpoint, history, steps


def train_control(
    stage1_checkpoint: Checkpoint,
    manifest: pd.DataFrame,
    class_index: dict[str, int],
    model: ModelParams,
    data: DataParams,
    runtime: RuntimeParams,
    distributed: DistributedParams,
    stage1: Stage1Params,
    stage2: Stage2Params,
    control: ControlParams,
    boost: BoostParams,
) -> tuple[Checkpoint, pd.DataFrame]:
    """Momentum continued from the stage-1 checkpoint (stage 1's recipe) for as many epochs as stage 2 trains.

    With ``distributed.worker_num`` above 1 it trains on that many msrun workers.
    """
    context = TrainingContext(manifest, class_index, model, data, runtime, distributed)
    with tracking.training_run("control", {"dim_reduce.stage1": stage1, "dim_reduce.control": control}):
        result = on_every_rank(
            recipe.train_control,
            context,
            stage1_checkpoint,
            stage1,
            stage2,
            control,
            boost=boost,
            callbacks=[tracking.EpochMetrics()],
        )
        return training_outputs(result)


def evaluate_stage1(
    checkpoint: Checkpoint,
    manifest: pd.DataFrame,
    class_index: dict[str, int],
    model: ModelParams,
    data: DataParams,
    runtime: RuntimeParams,
) -> dict:
    """Top-1/top-5 of stage 1's checkpoint on val, logged as ``final/top1``, ``final/top5`` of its child run."""
    return evaluate_and_log(checkpoint, manifest, class_index, model, data, runtime, "stage1", child_run="stage1")


def evaluate_stage2(
    checkpoint: Checkpoint,
    manifest: pd.DataFrame,
    class_index: dict[str, int],
    model: ModelParams,
    data: DataParams,
    runtime: RuntimeParams,
) -> dict:
    """Top-1/top-5 of stage 2's checkpoint on val, logged as ``final/top1``, ``final/top5`` of its child run."""
    return evaluate_and_log(checkpoint, manifest, class_index, model, data, runtime, "stage2", child_run="stage2")


def evaluate_control(
    checkpoint: Checkpoint,
    manifest: pd.DataFrame,
    class_index: dict[str, int],
    model: ModelParams,
    data: DataParams,
    runtime: RuntimeParams,
) -> dict:
    """Top-1/top-5 of the control's checkpoint on val, logged as ``final/top1``, ``final/top5`` of its child run."""
    return evaluate_and_log(checkpoint, manifest, class_index, model, data, runtime, "control", child_run="control")


def compare_runs(stage1_report: dict, stage2_report: dict, control_report: dict) -> pd.DataFrame:
    """One row per model: top-1/top-5 and the gain over the Momentum control."""
    reports = {"stage1": stage1_report, "stage2": stage2_report, "control": control_report}
    table = pd.DataFrame(
        [{"model": name, **{key: report[key] for key in ("epoch", "top1", "top5")}} for name, report in reports.items()]
    )
    table["top1_minus_control"] = table["top1"] - control_report["top1"]
    gain = stage2_report["top1"] - control_report["top1"]
    tracking.log_metrics({STAGE2_MINUS_CONTROL_TOP1: gain})
    logger.info(
        "dim_reduce: stage 1 top-1 %.2f%%, stage 2 %.2f%%, control %.2f%% (stage 2 - control: %+.2f points)",
        100 * stage1_report["top1"],
        100 * stage2_report["top1"],
        100 * control_report["top1"],
        100 * gain,
    )
    return table
