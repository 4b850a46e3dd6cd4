"""Nodes of the ``thor`` pipeline: training with the THOR second-order optimizer."""

from __future__ import annotations

import logging
import statistics
import time

import pandas as pd

from ..common.nodes import build_network, network_from_checkpoint, num_classes, train_data, val_data
from ..common.training import require_single_process
from ..lib.checkpoint import OPTIMIZER_PREFIX, Checkpoint
from ..lib.evaluation import evaluate
from ..lib.loss import CrossEntropySmooth
from ..lib.progress import ProgressReporter
from ..lib.runtime import configure_mindspore
from ..lib.schedules import thor_damping, thor_lr
from ..lib.thor import THOR
from ..lib.training import Callback, MlflowMetrics, fit

logger = logging.getLogger(__name__)
THOR_STATISTICS = "thor_stats."  # buffers THOR adds to the wrapped layers; not part of the network


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
    """THOR training from the initial weights; the final network and THOR state, and the history."""
    require_single_process(distributed)
    if thor["implementation"] == "mindspore":
        # refused on CPU by parameter validation; the Ascend/GPU path is not written yet
        raise NotImplementedError("thor.implementation: mindspore is not wired in yet; use thor.implementation: own")
    configure_mindspore(runtime["device_target"], runtime["mode"], runtime["seed"])
    net = network_from_checkpoint(thor_model(model, thor), class_index, initial_weights, "initial weights")
    dataset = train_data(manifest, data, thor["batch_size"], runtime["seed"])
    steps_per_epoch = dataset.get_dataset_size()
    lr, damping = thor["lr"], thor["damping"]
    lr_per_step = thor_lr(
        lr["lr_init"], lr["lr_decay"], lr["lr_end_epoch"], thor["epochs"], steps_per_epoch, lr["decay_epoch"]
    )
    damping_per_step = thor_damping(damping["damping_init"], damping["damping_decay"], thor["epochs"], steps_per_epoch)
    trainer = THOR(
        net,
        CrossEntropySmooth(num_classes(model, class_index), thor["label_smoothing"]),
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
    validation = val_data(manifest, data)
    logger.info(
        "THOR training of %s for %d epochs, %d steps/epoch, batch %d, frequency %d, lr %.4g -> %.4g",
        model["name"],
        thor["epochs"],
        steps_per_epoch,
        thor["batch_size"],
        thor["frequency"],
        lr_per_step[0],
        lr_per_step[-1],
    )
    history = fit(
        trainer.step,
        dataset,
        thor["epochs"],
        lr_per_step,
        thor["batch_size"] * distributed["worker_num"],
        [ProgressReporter(thor["batch_size"]), StepKindTimer(trainer), MlflowMetrics("thor_")],
        evaluate=lambda: evaluate(net, validation),
        eval_interval=thor["eval_interval"],
        data_seed=runtime["seed"],
    )
    params = {p.name: p.asnumpy().copy() for p in net.get_parameters() if not p.name.startswith(THOR_STATISTICS)}
    params.update({OPTIMIZER_PREFIX + name: value for name, value in trainer.state().items()})
    logger.info(
        "THOR: %d second-order steps, %d reuse steps, %d trace-rule skips",
        trainer.second_order_steps,
        trainer.reuse_steps,
        trainer.trace_skips,
    )
    return Checkpoint(params, {"network": model["name"], "epoch": thor["epochs"]}), pd.DataFrame(history)
