"""``mindspore.Model.train`` run with this project's training callbacks.

MindSpore's own optimizers that need its ``Model`` (``nn.thor`` through ``ModelThor``, boost's Adasum)
train through ``Model.train``; this bridge gives them the same progress, MLflow metrics, history rows and
periodic checkpoints as ``training.fit``.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Sequence

import numpy as np
from mindspore.train import Callback as MindsporeCallback

from pipelines.engine.loop import Callback, NonFiniteLossError


class EpochCallbacks(MindsporeCallback):
    """Runs this project's training callbacks (``training.Callback``) from ``Model.train``, one metrics row per epoch.

    Each row holds what ``training.fit`` records: epoch, loss (mean of the losses MindSpore reported to callbacks that
    epoch: ``ModelThor`` reports its second-order steps and the last of each run of reuse steps), lr and
    ``extra_metrics(step)`` at the epoch's last step, epoch_time_s, images_per_s, and top1/top5 when ``evaluate``
    runs (every ``eval_interval`` epochs and after the last). A NaN/Inf loss raises ``NonFiniteLossError``.
    """

    def __init__(
        self,
        callbacks: Sequence[Callback],
        total_epochs: int,
        start_epoch: int,
        steps_per_epoch: int,
        lr_per_step: np.ndarray,
        images_per_step: int,
        evaluate: Callable[[], dict[str, float]] | None = None,
        eval_interval: int = 0,
        extra_metrics: Callable[[int], dict[str, float]] = lambda step: {},
    ):
        super().__init__()
        self.callbacks = list(callbacks)
        self.total_epochs = total_epochs
        self.start_epoch = start_epoch
        self.steps_per_epoch = steps_per_epoch
        self.lr_per_step = np.asarray(lr_per_step)
        self.images_per_step = images_per_step
        self.evaluate = evaluate
        self.eval_interval = eval_interval
        self.extra_metrics = extra_metrics
        self.rows: list[dict[str, float]] = []
        self.ended = False

    def on_train_begin(self, run_context) -> None:
        for callback in self.callbacks:
            callback.on_train_begin(self.total_epochs, self.steps_per_epoch, self.start_epoch)

    def on_train_epoch_begin(self, run_context) -> None:
        params = run_context.original_args()
        self.epoch = params.cur_epoch_num - 1
        self.first_step = params.cur_step_num
        self.losses: list[float] = []
        self.started = time.perf_counter()
        for callback in self.callbacks:
            callback.on_epoch_begin(self.epoch)

    def on_train_step_end(self, run_context) -> None:
        params = run_context.original_args()
        outputs = params.net_outputs
        loss = float((outputs[0] if isinstance(outputs, tuple | list) else outputs).asnumpy())
        step = params.cur_step_num - self.first_step - 1
        if not math.isfinite(loss):
            raise NonFiniteLossError(
                f"training loss became {loss} at epoch {self.epoch + 1}, step {step + 1}/{self.steps_per_epoch}; "
                "the last good checkpoint is kept. Lower the learning rate or the loss scale."
            )
        self.losses.append(loss)
        for callback in self.callbacks:
            callback.on_step_end(self.epoch, step, loss)

    def on_train_epoch_end(self, run_context) -> None:
        elapsed = time.perf_counter() - self.started
        last_step = min((self.epoch + 1) * self.steps_per_epoch, len(self.lr_per_step)) - 1
        metrics = {
            "epoch": float(self.epoch + 1),
            "loss": float(np.mean(self.losses)) if self.losses else float("nan"),
            "lr": float(self.lr_per_step[last_step]),
            "epoch_time_s": elapsed,
            "images_per_s": self.steps_per_epoch * self.images_per_step / elapsed,
            **self.extra_metrics(last_step),
        }
        last = self.epoch + 1 == self.total_epochs
        if self.evaluate is not None and (last or (self.eval_interval and (self.epoch + 1) % self.eval_interval == 0)):
            metrics.update(self.evaluate())
        self.rows.append(metrics)
        for callback in self.callbacks:
            callback.on_epoch_end(self.epoch, metrics)

    def on_train_end(self, run_context) -> None:
        self.close()

    def close(self) -> None:
        """Ends this project's callbacks once; call it also when ``Model.train`` raised (it then skips train end)."""
        if not self.ended:
            self.ended = True
            for callback in self.callbacks:
                callback.on_train_end()
