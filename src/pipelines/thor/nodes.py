"""Nodes of the ``thor`` pipeline: training with the THOR second-order optimizer."""

from __future__ import annotations

import json
import logging
import statistics
import time
from collections.abc import Callable

import mindspore.dataset as ds
import pandas as pd

from ..common.nodes import build_network, network_from_checkpoint, num_classes, train_data, val_data
from ..common.training import report_replica_divergence
from pipelines.engine.checkpoint import OPTIMIZER_PREFIX, Checkpoint, load_checkpoint
from pipelines.distributed.launch import data_parallel, rank_context
from pipelines.engine.evaluation import evaluate
from pipelines.models.loss import CrossEntropySmooth
from pipelines.engine.model_bridge import EpochCallbacks
from pipelines.engine.progress import ProgressReporter
from pipelines.engine.runtime import configure_mindspore
from pipelines.optim.schedules import thor_damping, thor_lr
from pipelines.optim.thor.preconditioner import THOR
from pipelines.optim.thor.mindspore_thor import capture_thor_state, create_thor_model, restore_thor_state
from pipelines.tracking import set_tags
from pipelines.engine.loop import (
    Callback,
    MlflowMetrics,
    PeriodicCheckpoint,
    find_resume_checkpoint,
    fingerprint,
    fit,
)

logger = logging.getLogger(__name__)
THOR_STATISTICS = "thor_stats."  # buffers THOR adds to the wrapped layers; not part of the network
CHECKPOINT_PREFIX = "epoch"


def thor_model(model: dict, thor: dict) -> dict:
    """The shared model section with THOR's own choice of zero-initialised last BatchNorm gamma."""
    return {**model, "zero_init_last_bn_gamma": thor["zero_init_last_bn_gamma"]}


def build_thor_network(model: dict, thor: dict, class_index: dict[str, int], runtime: dict) -> Checkpoint:
    """Initial weights as the THOR recipe builds them (``thor.zero_init_last_bn_gamma``)."""
    return build_network(thor_model(model, thor), class_index, runtime)


class StepKindTimer(Callback):
    """Adds to each epoch's metrics the median second-order and reuse step times, damping and counters."""

    def __init__(self, trainer: THOR):
        self.trainer = trainer
        self.times: dict[str, list[float]] = {"second_order": [], "reuse": []}

    def on_epoch_begin(self, epoch: int) -> None:
        self.times = {"second_order": [], "reuse": []}
        self.last = time.perf_counter()
        self.second_order_seen = self.trainer.second_order_steps

    def on_step_end(self, epoch: int, step: int, loss: float) -> None:
        now = time.perf_counter()
        kind = "second_order" if self.trainer.second_order_steps > self.second_order_seen else "reuse"
        self.second_order_seen = self.trainer.second_order_steps
        self.times[kind].append(now - self.last)
        self.last = now

    def on_epoch_end(self, epoch: int, metrics: dict[str, float]) -> None:
        step = self.trainer.steps - 1
        metrics["damping"] = float(self.trainer.damping_per_step[min(step, len(self.trainer.damping_per_step) - 1)])
        metrics["second_order_steps"] = float(self.trainer.second_order_steps)
        metrics["trace_skips"] = float(self.trainer.trace_skips)
        for kind, times in self.times.items():
            if times:
                metrics[f"{kind}_step_s"] = statistics.median(times)


class EpochHistory(Callback):
    """Every epoch's metrics row, those of the earlier attempts of a resumed training first."""

    def __init__(self, rows: list[dict[str, float]]):
        self.rows = list(rows)

    def on_epoch_end(self, epoch: int, metrics: dict[str, float]) -> None:
        self.rows.append(dict(metrics))


@data_parallel
def train_thor(
    initial_weights: Checkpoint,
    manifest: pd.DataFrame,
    class_index: dict[str, int],
    model: dict,
    data: dict,
    runtime: dict,
    distributed: dict,
    thor: dict,
) -> tuple[Checkpoint, pd.DataFrame]:
    """THOR training from the initial weights; the final network and THOR state, and the per-epoch history.

    ``thor.implementation`` own: this project's THOR (``pipelines.optim.thor.preconditioner``); mindspore: ``nn.thor`` with ``ModelThor``
    (Ascend/GPU). Every ``thor.checkpoint.every_epochs`` epochs the full state (weights, BatchNorm statistics,
    momenta, A/G statistics, inverses, step counters, the history so far) is written to ``thor.checkpoint.dir``;
    rerun with the same configuration and initial weights, training resumes from the newest of them.
    """
    configure_mindspore(runtime["device_target"], runtime["mode"], runtime["seed"])
    network = thor_model(model, thor)
    checkpoints = thor["checkpoint"]
    recipe = {k: v for k, v in thor.items() if k not in ("checkpoint", "eval_interval")}
    if thor["implementation"] == "own":
        recipe.pop("mindspore")
    run_id = fingerprint(network, data, recipe, runtime["seed"], distributed["worker_num"], initial_weights)
    start, start_epoch, earlier = initial_weights, 0, []
    resume_from = find_resume_checkpoint(checkpoints["dir"], CHECKPOINT_PREFIX, run_id, thor["epochs"])
    if resume_from is not None:
        start = load_checkpoint(resume_from)
        start_epoch, earlier = int(start.metadata["epoch"]), json.loads(start.metadata["history"])
        logger.info("Resuming from %s (epoch %d of %d)", resume_from, start_epoch, thor["epochs"])
        set_tags({"thor_resumed_from": str(resume_from)})
    net = network_from_checkpoint(network, class_index, start, str(resume_from or "initial weights"))
    dataset = train_data(manifest, data, thor["batch_size"], runtime["seed"])
    steps_per_epoch = dataset.get_dataset_size()
    lr, damping = thor["lr"], thor["damping"]
    lr_per_step = thor_lr(
        lr["lr_init"], lr["lr_decay"], lr["lr_end_epoch"], thor["epochs"], steps_per_epoch, lr["decay_epoch"]
    )
    damping_per_step = thor_damping(damping["damping_init"], damping["damping_decay"], thor["epochs"], steps_per_epoch)
    loss_fn = CrossEntropySmooth(num_classes(model, class_index), thor["label_smoothing"])
    validation = val_data(manifest, data)
    history = EpochHistory(earlier)

    def metadata(epoch: int) -> dict:
        return {"network": model["name"], "epoch": epoch, "fingerprint": run_id, "history": json.dumps(history.rows)}

    def callbacks(state: Callable[[int], Checkpoint], *extra: Callback) -> list[Callback]:
        chosen = [ProgressReporter(thor["batch_size"]), *extra, MlflowMetrics("thor_"), history]
        if rank_context().is_node_leader:  # the other ranks hold the same state
            chosen.append(
                PeriodicCheckpoint(
                    state, checkpoints["dir"], checkpoints["every_epochs"], checkpoints["keep_last"], CHECKPOINT_PREFIX
                )
            )
        return chosen

    logger.info(
        "THOR (%s) training of %s, epochs %d-%d, %d steps/epoch, batch %d, frequency %d, lr %.4g -> %.4g",
        thor["implementation"],
        model["name"],
        start_epoch + 1,
        thor["epochs"],
        steps_per_epoch,
        thor["batch_size"],
        thor["frequency"],
        lr_per_step[0],
        lr_per_step[-1],
    )
    if thor["implementation"] == "mindspore":
        model_thor, optimizer = create_thor_model(
            net,
            loss_fn,
            lr_per_step,
            damping_per_step,
            momentum=thor["momentum"],
            weight_decay=thor["weight_decay"],
            loss_scale=thor["loss_scale"],
            batch_size=thor["batch_size"],
            frequency=thor["frequency"],
            split_indices=thor["mindspore"]["split_indices"],
            amp_level=thor["mindspore"]["amp_level"],
            keep_batchnorm_fp32=thor["mindspore"]["keep_batchnorm_fp32"],
        )
        if resume_from is not None:
            restore_thor_state(net, optimizer, start)

        def state(epoch: int) -> Checkpoint:
            return capture_thor_state(net, optimizer, metadata(epoch))

        def evaluate_now() -> dict[str, float]:  # on a plain float32 copy: the trained net is converted and cast
            return evaluate(network_from_checkpoint(network, class_index, state(0), "the THOR network"), validation)

        driver = EpochCallbacks(
            callbacks(state),
            thor["epochs"],
            start_epoch,
            steps_per_epoch,
            lr_per_step,
            thor["batch_size"] * distributed["worker_num"],
            evaluate=evaluate_now,
            eval_interval=thor["eval_interval"],
            extra_metrics=lambda step: {"damping": float(damping_per_step[step])},
        )
        ds.config.set_seed(runtime["seed"] + start_epoch)  # one shuffle stream for all epochs of model.train
        try:
            model_thor.train(
                thor["epochs"],
                dataset,
                callbacks=[driver],
                sink_size=steps_per_epoch,
                dataset_sink_mode=thor["mindspore"]["dataset_sink_mode"],
                initial_epoch=start_epoch,
            )
        finally:
            driver.close()
        return state(thor["epochs"]), pd.DataFrame(history.rows)

    trainer = THOR(
        net,
        loss_fn,
        lr_per_step,
        damping_per_step,
        momentum=thor["momentum"],
        weight_decay=thor["weight_decay"],
        loss_scale=thor["loss_scale"],
        frequency=thor["frequency"],
        block_size=thor["block_size"],
        trace_rule=tuple(thor["trace_rule"]) if thor["trace_rule"] else None,
        rank_size=distributed["worker_num"],
    )
    if resume_from is not None:
        trainer.load_state(start.optimizer_state())

    def own_state(epoch: int) -> Checkpoint:
        params = {p.name: p.asnumpy().copy() for p in net.get_parameters() if not p.name.startswith(THOR_STATISTICS)}
        params.update({OPTIMIZER_PREFIX + name: value for name, value in trainer.state().items()})
        return Checkpoint(params, metadata(epoch))

    fit(
        trainer.step,
        dataset,
        thor["epochs"],
        lr_per_step,
        thor["batch_size"] * distributed["worker_num"],
        callbacks(own_state, StepKindTimer(trainer)),
        start_epoch=start_epoch,
        evaluate=lambda: evaluate(net, validation),
        eval_interval=thor["eval_interval"],
        data_seed=runtime["seed"],
    )
    logger.info(
        "THOR: %d second-order steps, %d reuse steps, %d trace-rule skips",
        trainer.second_order_steps,
        trainer.reuse_steps,
        trainer.trace_skips,
    )
    report_replica_divergence(net, "thor_")
    return own_state(thor["epochs"]), pd.DataFrame(history.rows)
