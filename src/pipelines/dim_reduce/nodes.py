"""Nodes of the ``dim_reduce`` pipeline: stage 1 with a weight trajectory, PCA, P-BFGS stage 2."""

from __future__ import annotations

import json
import logging
import subprocess
import sys
import tempfile
from pathlib import Path

import matplotlib
import numpy as np
import pandas as pd
from matplotlib.figure import Figure

from pipelines.recipes.common import create_network, network_from_checkpoint, num_classes, train_data
from pipelines.recipes.momentum import train_momentum
from pipelines.engine.checkpoint import OPTIMIZER_PREFIX, Checkpoint, load_checkpoint, save_checkpoint
from pipelines.distributed.launch import data_parallel, rank_context
from pipelines.models.loss import CrossEntropySmooth
from pipelines.optim.dldr.pbfgs import PBFGS, PBFGSConfig
from pipelines.optim.dldr.pca import explained_variance_table, fit_trajectory_pca
from pipelines.engine.progress import ProgressReporter
from pipelines.engine.runtime import configure_mindspore
from pipelines.tracking import log_metrics, set_tags
from pipelines.engine.callbacks import Callback, PeriodicCheckpoint
from pipelines.engine.resume import find_resume_checkpoint, fingerprint
from pipelines.engine.state import capture_state, restore_state
from pipelines.optim.dldr.trajectory import TrajectoryRecorder, select_trajectory, verify_trajectory

matplotlib.use("Agg")
logger = logging.getLogger(__name__)
STAGE2_CHECKPOINT_PREFIX = "epoch"
# The step table travels in stage 2's epoch checkpoints, so a resumed run reports every step.
STEP_HISTORY_PREFIX = OPTIMIZER_PREFIX + "stage2_steps."
STEP_COLUMNS = ("epoch", "step", "loss", "step_size", "trials")


@data_parallel
def train_stage1(
    initial_weights: Checkpoint,
    manifest: pd.DataFrame,
    class_index: dict[str, int],
    model: dict,
    data: dict,
    runtime: dict,
    distributed: dict,
    dim_reduce: dict,
    boost: dict,
) -> tuple[Checkpoint, pd.DataFrame, pd.DataFrame]:
    """Momentum training to ``stage1.epochs`` of a ``stage1.schedule_epochs`` schedule, recording the trajectory.

    Returns the full checkpoint of the last step, the per-epoch history and the trajectory index.
    """
    stage1 = dim_reduce["stage1"]
    trajectory = stage1["trajectory"]
    recorders: list[TrajectoryRecorder] = []

    def record(net, optimizer):
        recorders.append(
            TrajectoryRecorder(
                net,
                trajectory["dir"],
                trajectory["start_epoch"],
                trajectory["every_steps"],
                trajectory["every_epochs"],
            )
        )
        return recorders

    checkpoint, history = train_momentum(
        initial_weights,
        manifest,
        class_index,
        model,
        data,
        runtime,
        distributed,
        stage1,
        stop_epoch=stage1["epochs"],
        schedule_epochs=stage1["schedule_epochs"],
        extra_callbacks=record,
        metric_prefix="stage1_",
        boost=boost,
    )
    if not recorders:  # a rank that does not write files; its result is not used
        return checkpoint, history, pd.DataFrame()
    index = recorders[0].index
    log_metrics({"trajectory_files": len(index)})
    logger.info("Stage 1 recorded %d trajectory files in %s", len(index), trajectory["dir"])
    return checkpoint, history, index


def collect_trajectory(
    trajectory_index: pd.DataFrame,
    class_index: dict[str, int],
    model: dict,
    dim_reduce: dict,
) -> pd.DataFrame:
    """The last ``collect.n_files`` trajectory files, checked against the network's parameters."""
    chosen = select_trajectory(trajectory_index, dim_reduce["collect"]["n_files"], dim_reduce["pca"]["n_components"])
    net = create_network(model, class_index)
    verify_trajectory(chosen["path"].tolist(), {p.name: tuple(p.shape) for p in net.trainable_params()})
    log_metrics({"trajectory_length": len(chosen)})
    return chosen


def fit_pca(
    selected_trajectory: pd.DataFrame,
    class_index: dict[str, int],
    model: dict,
    dim_reduce: dict,
) -> tuple[np.ndarray, pd.DataFrame, Figure]:
    """k x n projection of the centred trajectory, its explained-variance table and plot."""
    names = [p.name for p in create_network(model, class_index).trainable_params()]
    pca = dim_reduce["pca"]
    result = fit_trajectory_pca(selected_trajectory["path"].tolist(), names, pca["n_components"])
    table = explained_variance_table(result)
    log_metrics(
        {
            "pca_explained_variance_ratio": float(table["explained_variance_ratio"].sum()),
            "pca_first_component_ratio": float(table["explained_variance_ratio"].iloc[0]),
            "pca_parameters": float(result.components.shape[1]),
        }
    )
    logger.info(
        "PCA: %d components of %d parameters explain %.1f%% of the trajectory's variance",
        *result.components.shape,
        100 * table["explained_variance_ratio"].sum(),
    )
    return result.components, table, _variance_figure(table)


def _variance_figure(table: pd.DataFrame) -> Figure:
    figure = Figure(figsize=(6, 3.5), tight_layout=True)
    axes = figure.add_subplot()
    axes.bar(table["component"], table["explained_variance_ratio"], label="component")
    axes.plot(table["component"], table["cumulative_ratio"], color="black", marker=".", label="cumulative")
    axes.set_xlabel("principal component")
    axes.set_ylabel("explained variance ratio")
    axes.set_ylim(0, 1)
    axes.legend()
    return figure


class _StepMetrics(Callback):
    """Logs each P-BFGS step's loss, accepted step size and trial count to MLflow and keeps them."""

    def __init__(self, trainer: PBFGS):
        self.trainer = trainer
        self.rows: list[dict] = []

    def on_train_begin(self, total_epochs: int, steps_per_epoch: int, start_epoch: int) -> None:
        self.steps_per_epoch = steps_per_epoch

    def on_step_end(self, epoch: int, step: int, loss: float) -> None:
        result = self.trainer.last_result
        row = {
            "epoch": epoch + 1,
            "step": epoch * self.steps_per_epoch + step + 1,
            "loss": result.loss,
            "step_size": result.step_size,
            "trials": result.trials,
        }
        self.rows.append(row)
        log_metrics(
            {"stage2_step_loss": row["loss"], "stage2_step_size": row["step_size"], "stage2_trials": row["trials"]},
            step=row["step"],
        )


@data_parallel
def train_stage2(
    stage1_checkpoint: Checkpoint,
    pca_matrix: np.ndarray,
    manifest: pd.DataFrame,
    class_index: dict[str, int],
    model: dict,
    data: dict,
    runtime: dict,
    distributed: dict,
    dim_reduce: dict,
) -> tuple[Checkpoint, pd.DataFrame]:
    """P-BFGS in the PCA subspace for ``stage2.epochs`` epochs, from the stage-1 weights.

    Every ``stage2.checkpoint.every_epochs`` epochs the weights, BatchNorm statistics, P-BFGS
    state (inverse Hessian, last step and projected gradient, residual momenta) and the step
    table go to ``stage2.checkpoint.dir``; a rerun of the same configuration continues from the
    newest of them.
    """
    import mindspore as ms

    stage2 = dim_reduce["stage2"]
    if stage2["implementation"] == "mindspore_boost":
        return _train_stage2_with_boost(
            stage1_checkpoint, pca_matrix, manifest, class_index, model, data, runtime, dim_reduce
        )
    if stage2["implementation"] != "own":
        raise ValueError(
            f"dim_reduce.stage2.implementation is {stage2['implementation']!r}; choose own or mindspore_boost"
        )
    configure_mindspore(runtime["device_target"], runtime["mode"], runtime["seed"])
    net = network_from_checkpoint(model, class_index, stage1_checkpoint, "of stage 1")
    config = PBFGSConfig(
        rho=stage2["rho"],
        max_trials=stage2["max_trials"],
        sigma=stage2["sigma"],
        gamma=stage2["gamma"],
        alpha=stage2["alpha"],
        loss_scale=stage2["loss_scale"],
    )
    trainer = PBFGS(
        net,
        CrossEntropySmooth(num_classes(model, class_index), stage2["label_smoothing"]),
        pca_matrix,
        config,
        rank_size=distributed["worker_num"],
    )

    def step(images, labels):
        # fit's (loss, overflow, loss scale) form: an overflow stops training as a loss-scale problem
        result = trainer.step(images, labels)
        return ms.Tensor(result.loss), ms.Tensor(result.overflow), ms.Tensor(config.loss_scale)

    start_epoch = int(stage1_checkpoint.metadata.get("epoch", 0))
    stop = start_epoch + stage2["epochs"]
    checkpoints = stage2["checkpoint"]
    run_id = fingerprint(
        model,
        data,
        {k: v for k, v in stage2.items() if k != "checkpoint"},
        runtime["seed"],
        distributed["worker_num"],
        stage1_checkpoint,
        pca_matrix,
    )
    step_metrics = _StepMetrics(trainer)
    resume_from = find_resume_checkpoint(checkpoints["dir"], STAGE2_CHECKPOINT_PREFIX, run_id, stop)
    if resume_from is not None:
        resumed = load_checkpoint(resume_from)
        restore_state(net, resumed)
        trainer.load_state(resumed.optimizer_state())
        step_metrics.rows = _step_rows(resumed)
        start_epoch = int(resumed.metadata["epoch"])
        logger.info("Resuming from %s (epoch %d of %d)", resume_from, start_epoch, stop)
        set_tags({"stage2_resumed_from": str(resume_from)})

    def state(epoch: int, with_steps: bool = False) -> Checkpoint:
        captured = capture_state(net, None, {"network": model["name"], "epoch": epoch, "fingerprint": run_id})
        captured.params.update({OPTIMIZER_PREFIX + name: value for name, value in trainer.state().items()})
        if with_steps:
            table = pd.DataFrame(step_metrics.rows, columns=STEP_COLUMNS)
            captured.params.update({STEP_HISTORY_PREFIX + c: table[c].to_numpy(np.float64) for c in STEP_COLUMNS})
        return captured

    callbacks: list[Callback] = [ProgressReporter(stage2["batch_size"]), MlflowMetrics("stage2_"), step_metrics]
    if rank_context().is_node_leader:  # the other ranks hold the same weights and P-BFGS state
        callbacks.append(
            PeriodicCheckpoint(
                lambda epoch: state(epoch, with_steps=True),
                checkpoints["dir"],
                checkpoints["every_epochs"],
                checkpoints["keep_last"],
                STAGE2_CHECKPOINT_PREFIX,
            )
        )
    dataset = train_data(manifest, data, stage2["batch_size"], runtime["seed"])
    fit(
        step,
        dataset,
        stop,
        np.ones(stop * dataset.get_dataset_size(), np.float32),
        stage2["batch_size"] * distributed["worker_num"],
        callbacks,
        start_epoch=start_epoch,
        data_seed=runtime["seed"],
    )
    report_replica_divergence(net, "stage2_")
    history = pd.DataFrame(step_metrics.rows, columns=STEP_COLUMNS)
    logger.info(
        "Stage 2: %d steps, %.0f%% accepted a step, mean trials %.2f",
        len(history),
        100 * (history["step_size"] > 0).mean(),
        history["trials"].mean(),
    )
    return state(stop), history


def _step_rows(checkpoint: Checkpoint) -> list[dict]:
    """The step table saved in a stage-2 epoch checkpoint, as ``_StepMetrics`` rows."""
    columns = {c: checkpoint.params[STEP_HISTORY_PREFIX + c] for c in STEP_COLUMNS}
    integer = ("epoch", "step", "trials")
    return [
        {c: int(columns[c][i]) if c in integer else float(columns[c][i]) for c in STEP_COLUMNS}
        for i in range(len(columns["step"]))
    ]


def _train_stage2_with_boost(
    stage1_checkpoint: Checkpoint,
    pca_matrix: np.ndarray,
    manifest: pd.DataFrame,
    class_index: dict[str, int],
    model: dict,
    data: dict,
    runtime: dict,
    dim_reduce: dict,
) -> tuple[Checkpoint, pd.DataFrame]:
    """Stage 2 through ``mindspore.boost`` in a process of its own (its configuration is a singleton)."""
    stage2 = dim_reduce["stage2"]
    start_epoch = int(stage1_checkpoint.metadata.get("epoch", 0))
    with tempfile.TemporaryDirectory(prefix="boost_stage2_") as work_dir:
        work = Path(work_dir)
        save_checkpoint(stage1_checkpoint, work / "start.ckpt")
        manifest.to_csv(work / "manifest.csv", index=False)
        np.save(work / "pca.npy", pca_matrix)  # boost writes its per-rank copies beside this file
        job = {
            "device_target": runtime["device_target"],
            "mode": runtime["mode"],
            "seed": runtime["seed"],
            "model": model,
            "num_classes": num_classes(model, class_index),
            "data": data,
            "manifest": str(work / "manifest.csv"),
            "start_checkpoint": str(work / "start.ckpt"),
            "pca_path": str(work / "pca.npy"),
            "batch_size": stage2["batch_size"],
            "epochs": stage2["epochs"],
            "end_epoch": start_epoch + stage2["epochs"],
            "stage2": stage2,
            "output": str(work / "stage2.ckpt"),
            "history": str(work / "history.csv"),
        }
        (work / "job.json").write_text(json.dumps(job))
        logger.info("Stage 2 with mindspore.boost dim_reduce in a separate process")
        result = subprocess.run(
            [sys.executable, "-m", "pipelines.optim.dldr.boost_stage2", str(work / "job.json")],
            capture_output=True,
            text=True,
            check=False,
        )
        if result.returncode != 0:
            raise RuntimeError(f"mindspore.boost stage 2 failed:\n{result.stderr[-5000:]}")
        history = pd.read_csv(work / "history.csv")
        return load_checkpoint(work / "stage2.ckpt"), history


@data_parallel
def train_control(
    stage1_checkpoint: Checkpoint,
    manifest: pd.DataFrame,
    class_index: dict[str, int],
    model: dict,
    data: dict,
    runtime: dict,
    distributed: dict,
    dim_reduce: dict,
    boost: dict,
) -> tuple[Checkpoint, pd.DataFrame]:
    """Momentum continued from the stage-1 checkpoint for as many epochs as stage 2 trains."""
    stage1 = dim_reduce["stage1"]
    control = {**stage1, "checkpoint": dim_reduce["control"]["checkpoint"]}
    return train_momentum(
        stage1_checkpoint,
        manifest,
        class_index,
        model,
        data,
        runtime,
        distributed,
        control,
        stop_epoch=stage1["epochs"] + dim_reduce["stage2"]["epochs"],
        schedule_epochs=stage1["schedule_epochs"],
        resume_optimizer=True,
        metric_prefix="control_",
        boost=boost,
    )


def compare_runs(stage1_report: dict, stage2_report: dict, control_report: dict) -> pd.DataFrame:
    """One row per model: top-1/top-5 and the gain over the Momentum control."""
    rows = []
    for name, report in (("stage1", stage1_report), ("stage2", stage2_report), ("control", control_report)):
        rows.append({"model": name, "epoch": report["epoch"], "top1": report["top1"], "top5": report["top5"]})
    table = pd.DataFrame(rows)
    table["top1_minus_control"] = table["top1"] - control_report["top1"]
    gain = stage2_report["top1"] - control_report["top1"]
    log_metrics({"stage2_minus_control_top1": gain})
    logger.info(
        "dim_reduce: stage 1 top-1 %.2f%%, stage 2 %.2f%%, control %.2f%% (stage 2 - control: %+.2f points)",
        100 * stage1_report["top1"],
        100 * stage2_report["top1"],
        100 * control_report["top1"],
        100 * gain,
    )
    return table
