"""Nodes of the ``baseline`` pipeline: the Momentum recipe."""

from __future__ import annotations

import logging

import pandas as pd

from ..common.nodes import network_from_checkpoint, num_classes
from ..lib.checkpoint import Checkpoint
from ..lib.data import create_dataset
from ..lib.evaluation import evaluate
from ..lib.loss import CrossEntropySmooth
from ..lib.optim import create_momentum
from ..lib.progress import ProgressReporter
from ..lib.runtime import configure_mindspore
from ..lib.schedules import momentum_lr, scaled_lr_max
from ..lib.training import MlflowMetrics, PeriodicCheckpoint, capture_state, fit

logger = logging.getLogger(__name__)


def require_single_process(distributed: dict) -> None:
    if distributed["worker_num"] != 1:
        raise NotImplementedError(
            f"distributed.worker_num is {distributed['worker_num']}, but launching several workers "
            "through msrun is not implemented yet; set distributed.worker_num: 1 to train on one device"
        )


def train_momentum(
    initial_weights: Checkpoint,
    manifest: pd.DataFrame,
    class_index: dict[str, int],
    model: dict,
    data: dict,
    runtime: dict,
    distributed: dict,
    train: dict,
) -> tuple[Checkpoint, pd.DataFrame]:
    """Momentum training with the recipe's schedule, label smoothing and fixed loss scale.

    Returns the final full checkpoint (weights, BatchNorm statistics, momentum, step) and the
    per-epoch history table; per-epoch metrics also go to MLflow as training runs.
    """
    from mindspore import nn

    require_single_process(distributed)
    configure_mindspore(runtime["device_target"], runtime["mode"], runtime["seed"])
    net = network_from_checkpoint(model, class_index, initial_weights, "initial weights")
    dataset = create_dataset(
        manifest,
        "train",
        data["image_size"],
        train["batch_size"],
        training=True,
        crop_scale=data["crop_scale"],
        num_workers=data["num_workers"],
        seed=runtime["seed"],
    )
    steps_per_epoch = dataset.get_dataset_size()
    schedule = train["lr"]
    lr_per_step = momentum_lr(
        schedule["schedule"],
        schedule["lr_init"],
        scaled_lr_max(schedule["lr_max"], distributed["worker_num"], schedule["reference_devices"]),
        schedule["lr_end"],
        schedule["warmup_epochs"],
        train["epochs"],
        steps_per_epoch,
        tuple(schedule["milestones"]),
        schedule["step_gamma"],
    )
    optimizer = create_momentum(net, lr_per_step, train["momentum"], train["weight_decay"], train["loss_scale"])
    loss_fn = CrossEntropySmooth(num_classes(model, class_index), train["label_smoothing"])
    train_step = nn.TrainOneStepCell(nn.WithLossCell(net, loss_fn), optimizer, sens=float(train["loss_scale"]))
    train_step.set_train(True)

    val_dataset = create_dataset(
        manifest,
        "val",
        data["image_size"],
        data["eval_batch_size"],
        training=False,
        eval_resize_ratio=data["eval_resize_ratio"],
        num_workers=data["num_workers"],
    )
    checkpoints = train["checkpoint"]

    def state(epoch: int) -> Checkpoint:
        return capture_state(net, optimizer, {"network": model["name"], "epoch": epoch})

    callbacks = [
        ProgressReporter(train["batch_size"]),
        MlflowMetrics(),
        PeriodicCheckpoint(state, checkpoints["dir"], checkpoints["every_epochs"], checkpoints["keep_last"]),
    ]
    logger.info(
        "Training %s for %d epochs, %d steps/epoch, batch %d, lr %s max %.4g, loss scale %g",
        model["name"],
        train["epochs"],
        steps_per_epoch,
        train["batch_size"],
        schedule["schedule"],
        lr_per_step.max(),
        train["loss_scale"],
    )
    history = fit(
        train_step,
        dataset,
        train["epochs"],
        lr_per_step,
        train["batch_size"] * distributed["worker_num"],
        callbacks,
        evaluate=lambda: evaluate(net, val_dataset),
        eval_interval=train["eval_interval"],
    )
    return state(train["epochs"]), pd.DataFrame(history)
