"""The one training entry point of every recipe: ``train``.

A recipe says how to build its step (``make_step(start checkpoint, steps per epoch) -> TrainStep``:
network, optimizer, schedule) and how to evaluate; ``train`` runs the rest, the same for all:

1. find the newest checkpoint of this training (same ``fingerprint``, unfinished) in
   ``checkpoints.directory``; resuming, it is the start and its ``history`` the rows so far;
2. build the step from the start weights and restore its optimizer state (when resuming, or when
   ``continue_from_start`` asks to continue another training's optimizer, e.g. the dim_reduce control);
3. run the epochs: data order seeded per epoch (``data_seed + epoch``, so a resumed run sees the data
   an uninterrupted one would), timing, NaN/Inf and loss-scale overflow checks, evaluation every
   ``eval_interval`` epochs and after the last, callbacks, checkpoints every ``checkpoints.every_epochs``
   epochs written by the node's first worker (the newest ``keep_last`` kept);
4. return the final state (same layout as the periodic checkpoints, its ``checkpoint_dir`` metadata naming
   the periodic checkpoints' folder) and every epoch's row from epoch 1. Whoever saves the final state then
   calls ``resume.remove_finished_checkpoints`` (the project's hooks do, after the catalog saved it).

Before its first step a training logs one start line (what it trains, epochs, steps per epoch, batch, the
lr it starts and ends with), and in GRAPH mode one "Compiling …" line before each long compile
(``progress.announce_compile``): here for a step that is one cell, in the step itself for a step of several.

A step that ``mindspore.Model.train`` must drive (MindSpore's THOR, boost's Adasum) is a
``model_bridge.ModelTrainStep``; the bridge feeds the same rows, callbacks and checkpoints.

Per-epoch rows hold ``epoch`` (1-based) and the keys of ``pipelines.metrics.EPOCH_KEYS``, plus the figures callbacks add
(``thor/…``, ``pbfgs/…``) and ``timestamp`` (wall clock at the end of the epoch, seconds since the Unix
epoch, so a resumed run can log the earlier epochs at their real time).
"""

from __future__ import annotations

import json
import logging
import math
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from pipelines.distributed.launch import rank_context, verify_replicas
from pipelines.engine.callbacks import Callback, ConstantFigures, PeriodicCheckpoint
from pipelines.engine.checkpoint import Checkpoint, load_checkpoint
from pipelines.engine.progress import ProgressReporter, announce_compile, take_compile_announcements
from pipelines.engine.resume import CHECKPOINT_DIR_KEY, CHECKPOINT_PREFIX, KEEP_STALE, find_resume_checkpoint
from pipelines.engine.state import HISTORY_KEY, capture_state, encode_history, history_of, restore_optimizer
from pipelines.images.folder import checked_batches, dataset_figures
from pipelines.metrics import (
    EVAL_TIME_S,
    REPLICA_DIVERGENCE,
    STEP_KEY,
    TIMESTAMP_KEY,
    TRAIN_COMPILE_S,
    TRAIN_ELAPSED_S,
    TRAIN_EPOCH_TIME_S,
    TRAIN_IMAGES_PER_S,
    TRAIN_LOSS,
    TRAIN_LR,
    VAL_STEP_TOP1,
    VAL_STEP_TOP5,
    VAL_TOP1,
    VAL_TOP5,
)

logger = logging.getLogger(__name__)

STEP_HISTORY_KEY = "step_history"  # checkpoint metadata: JSON list of the step rows so far


class NonFiniteLossError(FloatingPointError):
    """The training loss became NaN or Inf."""


class LossScaleOverflowError(NonFiniteLossError):
    """The gradients, scaled by a fixed loss scale, overflowed: the loss scale is too large."""


@dataclass(frozen=True)
class TrainingSpec:
    """How long and how a training runs.

    ``epochs``: the epoch to stop after (1-based; a resumed or continued training starts later).
    ``schedule_epochs``: length of the lr schedule (default ``epochs``; dim_reduce stage 1 stops at 70 of 90).
    ``batch_size``: per rank; ``images_per_step``: all ranks together. ``eval_interval``: evaluate every N
    epochs (0: only after the last). ``data_seed``: seeds epoch ``e``'s shuffle and augmentation with
    ``data_seed + e`` (None: MindSpore's global seed, one stream). ``eval_every_steps``: also evaluate
    every N global steps with ``train``'s ``evaluate_steps`` (0: never).
    """

    epochs: int
    batch_size: int
    images_per_step: int
    schedule_epochs: int | None = None
    eval_interval: int = 0
    data_seed: int | None = None
    eval_every_steps: int = 0


@dataclass(frozen=True)
class Checkpointing:
    """Periodic full checkpoints ``<directory>/epoch_<NNNN>.ckpt`` every ``every_epochs``, newest ``keep_last`` kept;
    of the ``stale-*`` folders (another configuration's checkpoints, moved aside) the newest ``keep_stale``."""

    directory: str | Path
    every_epochs: int = 1
    keep_last: int = 2
    keep_stale: int = KEEP_STALE

    @classmethod
    def of(cls, params) -> Checkpointing:
        """From a recipe's ``checkpoint`` parameters (``params.CheckpointParams``: the same four keys)."""
        return cls(Path(params.dir), params.every_epochs, params.keep_last, params.keep_stale)


class TrainStep:
    """One optimizer's training step as the engine drives it.

    ``run(images, labels)`` trains on one batch and returns the loss tensor, or
    ``(loss, overflow, loss_scale)`` as ``nn.TrainOneStepWithLossScaleCell`` does. ``network`` is
    what is evaluated and saved; ``optimizer`` (a MindSpore optimizer, optional) holds the state saved
    under ``optimizer.``; ``lr_per_step`` is the schedule (``train/lr`` reads it); ``loss_scale`` the
    fixed factor the gradients are scaled by (named in overflow errors; default the run cell's ``sens``).
    Optimizers with other state (THOR, P-BFGS) override ``capture`` and ``restore``. The engine calls
    ``restore`` (when continuing), then ``prepare`` once before the first batch: a step whose cell depends
    on the restored state (e.g. boost's gradient freeze takes the rest of the schedule from the
    optimizer's step count) builds it there. ``recipe`` names the optimizer in the training's start line.
    """

    recipe = "training"

    def __init__(
        self,
        run: Callable,
        network,
        optimizer=None,
        lr_per_step: np.ndarray | None = None,
        loss_scale: float | None = None,
    ):
        self.run = run
        self.network = network
        self.optimizer = optimizer
        self.lr_per_step = None if lr_per_step is None else np.asarray(lr_per_step)
        self.loss_scale = float(getattr(run, "sens", 1.0) if loss_scale is None else loss_scale)

    def __call__(self, images, labels):
        return self.run(images, labels)

    def lr(self, step: int) -> float | None:
        """The learning rate of global step ``step`` (0-based), or None without a schedule."""
        if self.lr_per_step is None or not len(self.lr_per_step):
            return None
        return float(self.lr_per_step[min(step, len(self.lr_per_step) - 1)])

    def lr_summary(self, first_step: int, last_step: int) -> str:
        """The lr at global steps ``first_step`` and ``last_step`` (0-based), as the start line shows it."""
        first, last = self.lr(first_step), self.lr(last_step)
        if first is None or last is None:
            return "no lr schedule"
        return f"lr {first:.4g}" if first == last else f"lr {first:.4g} at the first step to {last:.4g} at the last"

    def capture(self) -> dict[str, np.ndarray]:
        """Copies of the network's parameters and the optimizer's state (under ``optimizer.``)."""
        return capture_state(self.network, self.optimizer, {}).params

    def restore(self, checkpoint: Checkpoint) -> None:
        """Load the optimizer state of ``checkpoint`` (the network was built from its weights)."""
        if self.optimizer is not None:
            restore_optimizer(self.network, self.optimizer, checkpoint)

    def prepare(self) -> None:
        """Called once after ``restore`` (if any) and before the first batch; nothing to do by default."""


@dataclass
class TrainingResult:
    """The final state (the checkpoint layout), every epoch's row from epoch 1, end-of-training figures
    (``distributed/replica_max_abs_diff`` with several ranks), the trained step and every step evaluation's
    row from epoch 1 (``step``, ``val/step_top1``, ``val/step_top5``, ``train/elapsed_s``, ``eval/time_s``)."""

    checkpoint: Checkpoint
    history: list[dict[str, float]]
    summary: dict[str, float] = field(default_factory=dict)
    step: TrainStep | None = None
    step_history: list[dict[str, float]] = field(default_factory=list)


class EpochRunner:
    """Turns a training's steps into per-epoch rows and callback calls; the plain loop and the
    ``Model.train`` bridge both drive it, so every recipe gets the same rows, checks and callbacks."""

    def __init__(
        self,
        spec: TrainingSpec,
        step: TrainStep,
        steps_per_epoch: int,
        callbacks: Sequence[Callback],
        evaluate: Callable[[TrainStep], Mapping[str, float]] | None,
        history: list[dict[str, float]],
        evaluate_steps: Callable[[TrainStep], Mapping[str, float]] | None = None,
        step_history: list[dict[str, float]] | None = None,
    ):
        self.spec = spec
        self.step = step
        self.steps_per_epoch = steps_per_epoch
        self.callbacks = list(callbacks)
        self.evaluate = evaluate
        self.history = history
        self.evaluate_steps = evaluate_steps if spec.eval_every_steps else None
        self.step_history = [] if step_history is None else step_history
        self.ended = False

    def train_begin(self, start_epoch: int) -> None:
        for callback in self.callbacks:
            callback.on_train_begin(self.spec.epochs, self.steps_per_epoch, start_epoch)

    def epoch_begin(self, epoch: int) -> None:
        for callback in self.callbacks:
            callback.on_epoch_begin(epoch)
        self.loss_sum, self.loss_count = 0.0, 0
        self.evaluating_s = 0.0  # step evaluations of this epoch, taken out of its training time
        self.compiling_s = 0.0  # steps of this epoch that compiled a graph, taken out too
        self.started = time.perf_counter()

    def step_end(self, epoch: int, index: int, output, compiled_from: float | None = None) -> None:
        """Check one step's output (loss, or loss, overflow flag and loss scale) and pass the loss on.

        ``compiled_from``: the ``perf_counter`` time at which a step that compiled a graph was called; its
        whole time (compilation and the step's own work, until the loss is read) goes to ``train/compile_s``.
        """
        where = f"at epoch {epoch + 1}, step {index + 1}/{self.steps_per_epoch}"
        loss_scale = self.step.loss_scale
        if isinstance(output, tuple):
            output, overflow, loss_scale = output[0], bool(output[1].asnumpy()), float(output[2].asnumpy())
            if overflow:
                raise _overflow_error(where, loss_scale)
        loss = float(output.asnumpy())
        if compiled_from is not None:
            self.compiling_s += time.perf_counter() - compiled_from
        if not math.isfinite(loss):
            remedy = "Lower the learning rate"
            if loss_scale > 1:
                remedy += f", or the loss scale ({loss_scale:g}) if the scaled gradients overflow"
            raise NonFiniteLossError(
                f"training loss became {loss} {where}; the last good checkpoint is kept. {remedy}."
            )
        self.loss_sum += loss
        self.loss_count += 1
        for callback in self.callbacks:
            callback.on_step_end(epoch, index, loss)
        global_step = epoch * self.steps_per_epoch + index + 1
        if self.evaluate_steps is not None and global_step % self.spec.eval_every_steps == 0:
            self._evaluate_at(epoch, global_step)

    def _evaluate_at(self, epoch: int, global_step: int) -> None:
        """Evaluate on the step subset; the row's training time excludes this and every earlier evaluation."""
        before = time.perf_counter()
        earlier_epochs = sum(row[TRAIN_EPOCH_TIME_S] for row in self.history if row["epoch"] <= epoch)
        trained_s = earlier_epochs + before - self.started - self.evaluating_s - self.compiling_s
        accuracy = self.evaluate_steps(self.step)
        took = time.perf_counter() - before
        self.evaluating_s += took
        row = {
            STEP_KEY: global_step,
            VAL_STEP_TOP1: float(accuracy["top1"]),
            VAL_STEP_TOP5: float(accuracy["top5"]),
            TRAIN_ELAPSED_S: trained_s,
            EVAL_TIME_S: took,
            TIMESTAMP_KEY: time.time(),
        }
        self.step_history.append(row)
        for callback in self.callbacks:
            callback.on_step_evaluation(row)

    def epoch_end(self, epoch: int) -> dict[str, float]:
        """The epoch's row: training figures, evaluation when due, the callbacks' own figures."""
        elapsed = time.perf_counter() - self.started - self.evaluating_s - self.compiling_s
        row: dict[str, float] = {
            "epoch": epoch + 1,
            TRAIN_LOSS: self.loss_sum / self.loss_count if self.loss_count else math.nan,
        }
        lr = self.step.lr((epoch + 1) * self.steps_per_epoch - 1)
        if lr is not None:
            row[TRAIN_LR] = lr
        row[TRAIN_IMAGES_PER_S] = self.steps_per_epoch * self.spec.images_per_step / elapsed
        row[TRAIN_EPOCH_TIME_S] = elapsed
        row[TRAIN_COMPILE_S] = self.compiling_s
        interval = self.spec.eval_interval
        if self.evaluate is not None and (epoch + 1 == self.spec.epochs or (interval and (epoch + 1) % interval == 0)):
            accuracy = self.evaluate(self.step)
            row[VAL_TOP1], row[VAL_TOP5] = float(accuracy["top1"]), float(accuracy["top5"])
        for callback in self.callbacks:
            row.update(callback.epoch_metrics(epoch))
        row[TIMESTAMP_KEY] = time.time()
        self.history.append(row)
        for callback in self.callbacks:
            callback.on_epoch_end(epoch, row)
        return row

    def train_end(self) -> None:
        """End the callbacks once, also when training raised."""
        if not self.ended:
            self.ended = True
            for callback in self.callbacks:
                callback.on_train_end()


def _overflow_error(where: str, loss_scale: float) -> NonFiniteLossError:
    if loss_scale <= 1:
        return NonFiniteLossError(
            f"the gradients became non-finite {where} (no loss scale involved); the last good checkpoint "
            "is kept. Lower the learning rate."
        )
    return LossScaleOverflowError(
        f"the gradients scaled by the fixed loss scale {loss_scale:g} overflowed {where}: the loss scale is "
        "too large for this network. The last good checkpoint is kept; lower this training's loss_scale "
        "parameter (e.g. baseline.loss_scale, dim_reduce.stage2.loss_scale)."
    )


def train(
    spec: TrainingSpec,
    dataset,
    make_step: Callable[[Checkpoint | None, int], TrainStep],
    *,
    start: Checkpoint | None = None,
    fingerprint: str = "",
    checkpoints: Checkpointing | None = None,
    evaluate: Callable[[TrainStep], Mapping[str, float]] | None = None,
    callbacks: Sequence[Callback] = (),
    continue_from_start: bool = False,
    metadata: Mapping[str, int | float | bool | str] | None = None,
    evaluate_steps: Callable[[TrainStep], Mapping[str, float]] | None = None,
) -> TrainingResult:
    """Train from ``start`` (or the newest checkpoint of this training) to ``spec.epochs``.

    ``dataset``: this rank's batched training data. ``make_step(start, steps_per_epoch)`` builds the
    network from ``start``'s weights (None: fresh) and the optimizer for a schedule of
    ``spec.schedule_epochs`` epochs. ``fingerprint`` identifies the configuration and start weights
    (``resume.fingerprint``); with ``checkpoints`` the training resumes from, and writes, periodic
    checkpoints. ``evaluate(step)`` returns ``top1`` and ``top5``. ``continue_from_start``: ``start``
    is another training's checkpoint whose optimizer state and epoch this one continues. ``metadata``
    goes into every checkpoint beside ``epoch``, ``fingerprint`` and ``history``. ``evaluate_steps(step)``:
    the evaluation every ``spec.eval_every_steps`` steps (a fixed val subset), its rows ``step_history``.
    """
    stop = spec.epochs
    schedule = spec.schedule_epochs or spec.epochs
    history: list[dict[str, float]] = []
    step_history: list[dict[str, float]] = []
    resume_from = None
    if checkpoints is not None:
        resume_from = find_resume_checkpoint(
            checkpoints.directory, CHECKPOINT_PREFIX, fingerprint, stop, checkpoints.keep_stale
        )
    if resume_from is not None:
        start = load_checkpoint(resume_from)
        history = history_of(start)
        step_history = json.loads(start.metadata.get(STEP_HISTORY_KEY, "[]"))
        logger.info("Resuming from %s (epoch %d of %d)", resume_from, start.metadata["epoch"], stop)
    continuing = resume_from is not None or continue_from_start
    start_epoch = int(start.metadata.get("epoch", 0)) if continuing and start is not None else 0
    if not start_epoch <= stop <= schedule:
        raise ValueError(f"epochs must satisfy start {start_epoch} <= stop {stop} <= schedule length {schedule}")
    steps_per_epoch = dataset.get_dataset_size()
    if steps_per_epoch == 0:
        raise ValueError("the training dataset yields no full batch")
    step = make_step(start, steps_per_epoch)
    if continuing:
        step.restore(start)
    step.prepare()
    logger.info(
        "%s: epochs %d-%d of a %d-epoch schedule, %d steps/epoch, batch %d per rank, %s",
        step.recipe,
        start_epoch + 1,
        stop,
        schedule,
        steps_per_epoch,
        spec.batch_size,
        step.lr_summary(start_epoch * steps_per_epoch, stop * steps_per_epoch - 1),
    )

    def capture(epoch: int) -> Checkpoint:
        state = {**(metadata or {}), "epoch": epoch, "fingerprint": fingerprint, HISTORY_KEY: encode_history(history)}
        if checkpoints is not None:  # where the periodic checkpoints are, to remove once the final state is saved
            state[CHECKPOINT_DIR_KEY] = str(checkpoints.directory)
        if step_history:
            state[STEP_HISTORY_KEY] = encode_history(step_history)
        return Checkpoint(step.capture(), state)

    chosen: list[Callback] = [ProgressReporter(spec.batch_size), ConstantFigures(dataset_figures(dataset)), *callbacks]
    if checkpoints is not None and rank_context().is_node_leader:  # the other ranks hold the same state
        chosen.append(
            PeriodicCheckpoint(capture, checkpoints.directory, checkpoints.every_epochs, checkpoints.keep_last)
        )
    for callback in chosen:
        callback.bind(step)
        if resume_from is not None:
            callback.on_resume(resume_from, history)
            for row in step_history:  # the earlier epochs' step evaluations, e.g. for the run's metrics
                callback.on_step_evaluation(row)
    runner = EpochRunner(spec, step, steps_per_epoch, chosen, evaluate, history, evaluate_steps, step_history)
    from pipelines.engine.model_bridge import ModelTrainStep, train_with_model  # loads mindspore.train

    if isinstance(step, ModelTrainStep):
        train_with_model(step, dataset, runner, start_epoch)
    else:
        _train_epochs(step, dataset, runner, start_epoch)
    return TrainingResult(capture(stop), history, _replica_divergence(step.network), step, step_history)


def _train_epochs(step: TrainStep, dataset, runner: EpochRunner, start_epoch: int) -> None:
    import mindspore.dataset as ds
    from mindspore import nn

    data_seed = runner.spec.data_seed
    take_compile_announcements()  # earlier ones (another training's evaluation) are not this training's
    if isinstance(step.run, nn.Cell) and start_epoch < runner.spec.epochs:  # a step of several cells: in the step
        announce_compile(step.run)
    runner.train_begin(start_epoch)
    try:
        for epoch in range(start_epoch, runner.spec.epochs):
            if data_seed is not None:
                ds.config.set_seed(data_seed + epoch)  # read when the iterator starts its pipeline
            iterator = dataset.create_tuple_iterator(num_epochs=1)
            runner.epoch_begin(epoch)
            for index, (images, labels) in enumerate(checked_batches(iterator)):  # a bad image: one line naming it
                called = time.perf_counter()
                output = step(images, labels)
                runner.step_end(epoch, index, output, called if take_compile_announcements() else None)
                take_compile_announcements()  # the step evaluation's own graph is evaluation time
            runner.epoch_end(epoch)
            take_compile_announcements()
    finally:
        runner.train_end()


def _replica_divergence(network) -> dict[str, float]:
    """With several ranks, how far this rank's trainable weights are from rank 0's (0 when data parallel works)."""
    ranks = rank_context()
    if ranks.size == 1:
        return {}
    divergence = verify_replicas(network)
    if divergence > 0:
        logger.warning("The ranks' trainable weights differ by up to %g after training", divergence)
    else:
        logger.info("The trainable weights are identical on all %d ranks", ranks.size)
    return {REPLICA_DIVERGENCE: divergence}
