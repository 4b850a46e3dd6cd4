"""Momentum training from a checkpoint, shared by the baseline, dim_reduce and control nodes."""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence

import pandas as pd

from pipelines.optim.adasum.boost import train_with_boost_adasum
from pipelines.boost.options import boost_enabled, build_train_step
from pipelines.engine.checkpoint import Checkpoint, load_checkpoint
from pipelines.distributed.launch import rank_context, verify_replicas
from pipelines.engine.evaluation import evaluate
from pipelines.models.loss import CrossEntropySmooth
from pipelines.optim.momentum import create_momentum
from pipelines.engine.progress import ProgressReporter
from pipelines.engine.runtime import configure_mindspore
from pipelines.optim.schedules import momentum_lr, scaled_lr_max
from pipelines.tracking import log_metrics, set_tags
from pipelines.engine.loop import (
    Callback,
    MlflowMetrics,
    PeriodicCheckpoint,
    capture_state,
    find_resume_checkpoint,
    fingerprint,
    fit,
    restore_state,
)
from .nodes import network_from_checkpoint, num_classes, train_data, val_data

logger = logging.getLogger(__name__)
CHECKPOINT_PREFIX = "epoch"


def train_momentum(
    start: Checkpoint,
    manifest: pd.DataFrame,
    class_index: dict[str, int],
    model: dict,
    data: dict,
    runtime: dict,
    distributed: dict,
    train: dict,
    stop_epoch: int,
    schedule_epochs: int,
    resume_optimizer: bool = False,
    extra_callbacks: Callable[[object, object], Sequence[Callback]] = lambda net, optimizer: (),
    metric_prefix: str = "",
    boost: dict | None = None,
    adasum: dict | None = None,
) -> tuple[Checkpoint, pd.DataFrame]:
    """Momentum with the recipe's schedule, label smoothing and fixed loss scale, up to ``stop_epoch``.

    The lr schedule spans ``schedule_epochs`` (a recipe may stop before its schedule ends, as
    dim_reduce stage 1 does at 70 of 90). With ``resume_optimizer`` the momentum and step are
    restored from ``start`` and training continues at ``start.metadata["epoch"]``; otherwise
    only the weights are taken and training starts at epoch 0. Returns the final full
    checkpoint (weights, BatchNorm statistics, optimizer state, epoch) and the per-epoch
    history; per-epoch metrics go to MLflow as training runs (names prefixed by ``metric_prefix``).
    ``boost`` (the ``boost`` parameters) switches on mindspore.boost's LessBN, gradient freeze or
    gradient accumulation in the training step (``pipelines.boost.options``). ``adasum`` (the ``adasum``
    parameters) combines the ranks' weight deltas with Adasum instead of averaging gradients.
    """
    from mindspore import nn

    configure_mindspore(runtime["device_target"], runtime["mode"], runtime["seed"])
    checkpoints = train["checkpoint"]
    run_id = fingerprint(
        model,
        data,
        {k: v for k, v in train.items() if k not in ("checkpoint", "eval_interval")},
        runtime["seed"],
        distributed["worker_num"],
        stop_epoch,
        schedule_epochs,
        resume_optimizer,
        start,
        *([boost] if boost_enabled(boost) else []),  # all off: the fingerprint of a plain run
    )
    resume_from = find_resume_checkpoint(checkpoints["dir"], CHECKPOINT_PREFIX, run_id, stop_epoch)
    if resume_from is not None:
        start, resume_optimizer = load_checkpoint(resume_from), True
        logger.info("Resuming from %s (epoch %d of %d)", resume_from, start.metadata["epoch"], stop_epoch)
        set_tags({f"{metric_prefix}resumed_from": str(resume_from)})
    net = network_from_checkpoint(model, class_index, start, "start checkpoint")
    start_epoch = int(start.metadata.get("epoch", 0)) if resume_optimizer else 0
    if not start_epoch <= stop_epoch <= schedule_epochs:
        raise ValueError(
            f"epochs must satisfy start {start_epoch} <= stop {stop_epoch} <= schedule length {schedule_epochs}"
        )
    dataset = train_data(manifest, data, train["batch_size"], runtime["seed"])
    steps_per_epoch = dataset.get_dataset_size()
    schedule = train["lr"]
    lr_per_step = momentum_lr(
        schedule["schedule"],
        schedule["lr_init"],
        scaled_lr_max(schedule["lr_max"], distributed["worker_num"], schedule["reference_devices"]),
        schedule["lr_end"],
        schedule["warmup_epochs"],
        schedule_epochs,
        steps_per_epoch,
        tuple(schedule["milestones"]),
        schedule["step_gamma"],
    )
    optimizer = create_momentum(net, lr_per_step, train["momentum"], train["weight_decay"], train["loss_scale"])
    if resume_optimizer:
        restore_state(net, start, optimizer)
    loss_fn = CrossEntropySmooth(num_classes(model, class_index), train["label_smoothing"])
    validation = val_data(manifest, data)

    def state(epoch: int) -> Checkpoint:
        return capture_state(net, optimizer, {"network": model["name"], "epoch": epoch, "fingerprint": run_id})

    callbacks: list[Callback] = [ProgressReporter(train["batch_size"]), MlflowMetrics(metric_prefix)]
    if rank_context().is_node_leader:  # the other ranks hold the same weights
        callbacks += [
            PeriodicCheckpoint(
                state, checkpoints["dir"], checkpoints["every_epochs"], checkpoints["keep_last"], CHECKPOINT_PREFIX
            ),
            *extra_callbacks(net, optimizer),
        ]
    logger.info(
        "Momentum training of %s, epochs %d-%d of a %d-epoch %s schedule, %d steps/epoch, batch %d, "
        "lr max %.4g, loss scale %g",
        model["name"],
        start_epoch + 1,
        stop_epoch,
        schedule_epochs,
        schedule["schedule"],
        steps_per_epoch,
        train["batch_size"],
        lr_per_step.max(),
        train["loss_scale"],
    )
    loop = {
        "dataset": dataset,
        "epochs": stop_epoch,
        "lr_per_step": lr_per_step,
        "images_per_step": train["batch_size"] * distributed["worker_num"],
        "callbacks": callbacks,
        "start_epoch": start_epoch,
        "evaluate": lambda: evaluate(net, validation),
        "eval_interval": train["eval_interval"],
    }
    if adasum is not None and adasum["implementation"] == "mindspore_boost":
        history = train_with_boost_adasum(net, loss_fn, optimizer, train["loss_scale"], **loop)
    else:
        train_step = _train_step(nn.WithLossCell(net, loss_fn), optimizer, train, runtime, boost, adasum)
        train_step.set_train(True)
        history = fit(train_step, data_seed=runtime["seed"], **loop)
    report_replica_divergence(net, metric_prefix)
    return state(stop_epoch), pd.DataFrame(history)


def _train_step(network_with_loss, optimizer, train: dict, runtime: dict, boost: dict | None, adasum: dict | None):
    """The per-batch step: plain or with boost toggles, or with Adasum across the ranks."""
    if adasum is None:
        return build_train_step(network_with_loss, optimizer, train["loss_scale"], boost, runtime["device_target"])
    from pipelines.optim.adasum.collective import AdasumTrainStep  # loads MindSpore: only when training

    ranks = rank_context()
    logger.info("Adasum of the weight deltas across %d ranks (exchange %s)", ranks.size, adasum["exchange"])
    return AdasumTrainStep(
        network_with_loss,
        optimizer,
        sens=float(train["loss_scale"]),
        rank=ranks.rank,
        rank_size=ranks.size,
        exchange=None if adasum["exchange"] == "auto" else adasum["exchange"],
        average_statistics=adasum["average_batchnorm_statistics"],
    )


def report_replica_divergence(net, metric_prefix: str = "") -> None:
    """With several ranks, log how far this rank's weights are from rank 0's (0 when data parallel works)."""
    if rank_context().size == 1:
        return
    divergence = verify_replicas(net)
    log_metrics({f"{metric_prefix}replica_max_abs_diff": divergence})
    if divergence > 0:
        logger.warning("The ranks' trainable weights differ by up to %g after training", divergence)
    else:
        logger.info("The trainable weights are identical on all %d ranks", rank_context().size)
