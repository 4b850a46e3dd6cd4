"""The epoch loop: ``EpochLoop`` runs one epoch's batches through the step, checks each step's output (NaN/Inf,
loss-scale overflow), times it, evaluates when due and makes the epoch's row, calling the callbacks as it goes. The
same checks, rows and calls whoever iterates the batches: its own ``run``, or ``Model.train`` through
``model_bridge``. ``TrainingSpec`` says how long and how."""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass

from trainlib.engine.callbacks import CallbackList
from trainlib.engine.progress import announce_compile
from trainlib.engine.step import TrainStep
from trainlib.metrics import (
    EVAL_TIME_S,
    IMAGE_EVALUATION,
    IMAGE_STEP_EVALUATION,
    STEP_KEY,
    TIMESTAMP_KEY,
    TRAIN_COMPILE_S,
    TRAIN_ELAPSED_S,
    TRAIN_EPOCH_TIME_S,
    TRAIN_IMAGES_PER_S,
    TRAIN_LOSS,
    TRAIN_LR,
)


class NonFiniteLossError(FloatingPointError):
    """The training loss became NaN or Inf."""


class LossScaleOverflowError(NonFiniteLossError):
    """The gradients, scaled by a fixed loss scale, overflowed: the loss scale is too large."""


@dataclass(frozen=True)
class TrainingSpec:
    """How long and how a training runs.

    ``epochs``: the epoch to stop after (1-based; a resumed or continued training starts later).
    ``schedule_epochs``: length of the lr schedule (default ``epochs``; dim_reduce stage 1 stops at 70 of 90).
    ``batch_size``: per rank; ``examples_per_step``: all ranks together. ``eval_interval``: evaluate every N
    epochs (0: only after the last). ``data_seed``: seeds epoch ``e``'s shuffle and augmentation with
    ``data_seed + e`` (None: MindSpore's global seed, one stream). ``eval_every_steps``: also evaluate
    every N global steps with ``train``'s ``evaluate_steps`` (0: never). ``throughput_key``: the row key of
    examples per second; ``evaluation_keys`` / ``step_evaluation_keys``: (name the evaluation returns, row key)
    pairs (image recipes: top-1/top-5; a language model: masked-LM accuracy and loss, ``trainlib.metrics``).
    """

    epochs: int
    batch_size: int
    examples_per_step: int
    schedule_epochs: int | None = None
    eval_interval: int = 0
    data_seed: int | None = None
    eval_every_steps: int = 0
    throughput_key: str = TRAIN_IMAGES_PER_S
    evaluation_keys: tuple[tuple[str, str], ...] = IMAGE_EVALUATION
    step_evaluation_keys: tuple[tuple[str, str], ...] = IMAGE_STEP_EVALUATION


class EpochLoop:
    """One epoch at a time: ``run`` calls the step once per batch, ``begin``, ``step_done`` and ``end`` are the
    epoch's start, each step's output and its row (``Model.train``'s bridge calls them itself), so every recipe gets
    the same rows, checks and callback calls. ``history`` and ``step_history`` (the rows so far) grow as it goes."""

    def __init__(
        self,
        spec: TrainingSpec,
        step: TrainStep,
        steps_per_epoch: int,
        callbacks: CallbackList,
        evaluate: Callable[[TrainStep], Mapping[str, float]] | None,
        history: list[dict[str, float]],
        evaluate_steps: Callable[[TrainStep], Mapping[str, float]] | None = None,
        step_history: list[dict[str, float]] | None = None,
    ):
        self.spec = spec
        self.step = step
        self.steps_per_epoch = steps_per_epoch
        self.callbacks = callbacks
        self.evaluate = evaluate
        self.history = history
        self.evaluate_steps = evaluate_steps if spec.eval_every_steps else None
        self.step_history = [] if step_history is None else step_history

    def run(self, epoch: int, batches: Iterable[tuple]) -> dict[str, float]:
        """Epoch ``epoch`` (0-based): one step per batch of ``batches``; returns its row.

        Before each call the step names the graph that call runs (``TrainStep.next_graph``); the first call of each
        graph is announced, and timed apart as compilation.
        """
        self.begin(epoch)
        for index, batch in enumerate(batches):
            graph = self.step.next_graph()
            compiles = graph is not None and announce_compile(*graph)
            called = time.perf_counter()
            output = self.step(*batch)
            self.step_done(epoch, index, output, called if compiles else None)
        return self.end(epoch)

    def begin(self, epoch: int) -> None:
        self.callbacks.on_epoch_begin(epoch)
        self.loss_sum, self.loss_count = 0.0, 0
        self.evaluating_s = 0.0  # step evaluations of this epoch, taken out of its training time
        self.compiling_s = 0.0  # steps of this epoch that compiled a graph, taken out too
        self.started = time.perf_counter()

    def step_done(self, epoch: int, index: int, output, compiled_from: float | None = None) -> None:
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
        self.callbacks.on_step_end(epoch, index, loss)
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
            **{key: float(accuracy[name]) for name, key in self.spec.step_evaluation_keys},
            TRAIN_ELAPSED_S: trained_s,
            EVAL_TIME_S: took,
            TIMESTAMP_KEY: time.time(),
        }
        self.step_history.append(row)
        self.callbacks.on_step_evaluation(row)

    def end(self, epoch: int) -> dict[str, float]:
        """The epoch's row: training figures, evaluation when due, the callbacks' own figures. The training's last
        step is always step-evaluated: a curve whose interval outlasts the training (an epoch of 15 steps,
        ``eval_every_steps`` 20) still has its end point, and every curve reaches the training's end."""
        last_step = (epoch + 1) * self.steps_per_epoch
        if self.evaluate_steps is not None and epoch + 1 == self.spec.epochs and last_step % self.spec.eval_every_steps:
            self._evaluate_at(epoch, last_step)
        elapsed = time.perf_counter() - self.started - self.evaluating_s - self.compiling_s
        row: dict[str, float] = {
            "epoch": epoch + 1,
            TRAIN_LOSS: self.loss_sum / self.loss_count if self.loss_count else math.nan,
        }
        lr = self.step.lr((epoch + 1) * self.steps_per_epoch - 1)
        if lr is not None:
            row[TRAIN_LR] = lr
        row[self.spec.throughput_key] = self.steps_per_epoch * self.spec.examples_per_step / elapsed
        row[TRAIN_EPOCH_TIME_S] = elapsed
        row[TRAIN_COMPILE_S] = self.compiling_s
        interval = self.spec.eval_interval
        if self.evaluate is not None and (epoch + 1 == self.spec.epochs or (interval and (epoch + 1) % interval == 0)):
            figures = self.evaluate(self.step)
            row.update({key: float(figures[name]) for name, key in self.spec.evaluation_keys})
            self.callbacks.on_evaluation(epoch, figures)
        row.update(self.callbacks.epoch_metrics(epoch))
        row[TIMESTAMP_KEY] = time.time()
        self.history.append(row)
        self.callbacks.on_epoch_end(epoch, row)
        return row


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
