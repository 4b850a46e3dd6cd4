"""The training loop shared by every pipeline: ``fit`` -> ``train_one_epoch`` -> callbacks.

A training step is any callable ``(images, labels) -> loss tensor`` (a compiled MindSpore
cell), or ``-> (loss, overflow, loss_scale)`` as ``nn.TrainOneStepWithLossScaleCell`` and stage 2 return;
the loop owns epochs, timing, the non-finite-loss and gradient-overflow checks and the callbacks
(progress, MLflow metrics, periodic checkpoints), so every optimizer reuses it.
"""

from __future__ import annotations

import hashlib
import json
import logging
import math
import time
from collections.abc import Callable, Sequence
from pathlib import Path

import numpy as np

from pipelines.engine.checkpoint import OPTIMIZER_PREFIX, Checkpoint, load_checkpoint, save_checkpoint
from pipelines.distributed.launch import barrier, rank_context
from pipelines.tracking import log_metrics

logger = logging.getLogger(__name__)


class NonFiniteLossError(FloatingPointError):
    """The training loss became NaN or Inf."""


class LossScaleOverflowError(NonFiniteLossError):
    """The gradients, scaled by a fixed loss scale, overflowed: the loss scale is too large."""


class Callback:
    """Hooks called by ``fit``; subclasses override what they need."""

    def on_train_begin(self, total_epochs: int, steps_per_epoch: int, start_epoch: int) -> None: ...
    def on_epoch_begin(self, epoch: int) -> None: ...
    def on_step_end(self, epoch: int, step: int, loss: float) -> None: ...
    def on_epoch_end(self, epoch: int, metrics: dict[str, float]) -> None: ...
    def on_train_end(self) -> None: ...


class MlflowMetrics(Callback):
    """Logs each epoch's metrics to the active MLflow run, with the epoch number as step.

    ``prefix`` keeps apart the metrics of several trainings in one run (``stage1_loss``).
    """

    NOT_LOGGED = ("epoch", "images")  # the step already is the epoch; the image count never changes

    def __init__(self, prefix: str = ""):
        self.prefix = prefix

    def on_epoch_end(self, epoch: int, metrics: dict[str, float]) -> None:
        logged = {self.prefix + k: v for k, v in metrics.items() if k not in self.NOT_LOGGED}
        log_metrics(logged, step=epoch + 1)


class PeriodicCheckpoint(Callback):
    """Writes the full training state every ``every_epochs`` epochs, keeping the newest ``keep_last``."""

    def __init__(
        self,
        capture: Callable[[int], Checkpoint],
        directory: str | Path,
        every_epochs: int = 1,
        keep_last: int = 2,
        prefix: str = "epoch",
    ):
        self.capture = capture
        self.directory = Path(directory)
        self.every_epochs = every_epochs
        self.keep_last = keep_last
        self.prefix = prefix

    def on_epoch_end(self, epoch: int, metrics: dict[str, float]) -> None:
        if (epoch + 1) % self.every_epochs:
            return
        save_checkpoint(self.capture(epoch + 1), self.directory / f"{self.prefix}_{epoch + 1:04d}.ckpt")
        for old in sorted(self.directory.glob(f"{self.prefix}_*.ckpt"))[: -self.keep_last]:
            old.unlink()


def fingerprint(*parts) -> str:
    """Short hash of a training's configuration and start weights, stored in its checkpoints.

    A checkpoint is resumed only by the training that wrote it: same parameters, same start.
    """
    digest = hashlib.sha256()
    for part in parts:
        if isinstance(part, Checkpoint):
            for name in sorted(part.params):
                digest.update(name.encode())
                digest.update(np.ascontiguousarray(part.params[name]).tobytes())
        elif isinstance(part, np.ndarray):
            digest.update(str((part.dtype, part.shape)).encode())
            digest.update(np.ascontiguousarray(part).tobytes())
        else:
            digest.update(json.dumps(part, sort_keys=True, default=str).encode())
    return digest.hexdigest()[:16]


def find_resume_checkpoint(
    directory: str | Path, prefix: str, expected_fingerprint: str, stop_epoch: int
) -> Path | None:
    """The newest ``<prefix>_*.ckpt`` in ``directory`` of the same, unfinished training, if any.

    Checkpoints of a different configuration are moved to ``<directory>/stale-<time>/``
    rather than deleted or overwritten; those of the same training that already reached
    ``stop_epoch`` are removed (its result is the final checkpoint), so a rerun trains anew.
    An unreadable checkpoint raises ``CheckpointError`` naming it. With several ranks the node's
    first worker tidies the folder while the others wait, then they look without tidying.
    """
    ranks = rank_context()
    if ranks.size == 1:
        return _find_resume_checkpoint(directory, prefix, expected_fingerprint, stop_epoch, tidy=True)
    if ranks.is_node_leader:
        found = _find_resume_checkpoint(directory, prefix, expected_fingerprint, stop_epoch, tidy=True)
    barrier()
    if ranks.is_node_leader:
        return found
    return _find_resume_checkpoint(directory, prefix, expected_fingerprint, stop_epoch, tidy=False)


def _find_resume_checkpoint(
    directory: str | Path, prefix: str, expected_fingerprint: str, stop_epoch: int, tidy: bool
) -> Path | None:
    directory = Path(directory)
    found = sorted(directory.glob(f"{prefix}_*.ckpt"))
    if not found:
        return None
    newest = found[-1]
    metadata = load_checkpoint(newest).metadata
    if metadata.get("fingerprint") == expected_fingerprint:
        if metadata.get("epoch", 0) < stop_epoch:
            return newest
        if not tidy:
            return None
        logger.info("The checkpoints in %s are of a finished training of this configuration; training anew", directory)
        for path in found:
            path.unlink()
        return None
    if not tidy:
        return None
    stale = directory / time.strftime("stale-%Y%m%d-%H%M%S")
    stale.mkdir()
    for path in found:
        path.rename(stale / path.name)
    logger.warning("Checkpoints in %s come from another configuration; moved them to %s", directory, stale)
    return None


def capture_state(net, optimizer, metadata: dict) -> Checkpoint:
    """Network parameters (BatchNorm statistics included), optimizer state and ``metadata``."""
    # asnumpy() shares memory with the parameter on CPU: copy so later steps do not change the state
    params = {p.name: p.asnumpy().copy() for p in net.get_parameters()}
    if optimizer is not None:
        params.update(
            {OPTIMIZER_PREFIX + p.name: p.asnumpy().copy() for p in optimizer.get_parameters() if p.name not in params}
        )
    return Checkpoint(params, dict(metadata))


def restore_state(net, checkpoint: Checkpoint, optimizer=None) -> None:
    """Load ``checkpoint`` into ``net`` (and ``optimizer``'s state, when given); names must match."""
    import mindspore as ms

    def as_params(arrays: dict[str, np.ndarray]) -> dict:
        return {name: ms.Parameter(ms.Tensor(value), name=name) for name, value in arrays.items()}

    not_loaded, _ = ms.load_param_into_net(net, as_params(checkpoint.network_params()), strict_load=True)
    if not_loaded:
        raise ValueError(f"checkpoint lacks network parameters {not_loaded[:5]}")
    if optimizer is not None:
        optimizer_state = checkpoint.optimizer_state()
        own = {p.name for p in optimizer.get_parameters()} - {p.name for p in net.get_parameters()}
        missing = sorted(own - set(optimizer_state))
        if missing:
            raise ValueError(f"checkpoint lacks optimizer state {missing[:5]}")
        ms.load_param_into_net(optimizer, as_params(optimizer_state), strict_load=True)


def train_one_epoch(train_step, iterator, epoch: int, steps_per_epoch: int, callbacks: Sequence[Callback]) -> float:
    """Run one epoch of ``train_step`` over ``iterator``; returns the mean loss."""
    total = 0.0
    step = -1
    # TrainOneStepCell keeps its fixed loss scale as ``sens``; a step without one scales nothing
    loss_scale = float(getattr(train_step, "sens", 1.0))
    for step, (images, labels) in enumerate(iterator):
        output = train_step(images, labels)
        where = f"at epoch {epoch + 1}, step {step + 1}/{steps_per_epoch}"
        if isinstance(output, tuple):
            output, overflow, loss_scale = output[0], bool(output[1].asnumpy()), float(output[2].asnumpy())
            if overflow:
                raise _overflow_error(where, loss_scale)
        loss = float(output.asnumpy())
        if not math.isfinite(loss):
            remedy = "Lower the learning rate"
            if loss_scale > 1:
                remedy += f", or the loss scale ({loss_scale:g}) if the scaled gradients overflow"
            raise NonFiniteLossError(
                f"training loss became {loss} {where}; the last good checkpoint is kept. {remedy}."
            )
        total += loss
        for callback in callbacks:
            callback.on_step_end(epoch, step, loss)
    return total / max(step + 1, 1)


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


def fit(
    train_step,
    dataset,
    epochs: int,
    lr_per_step: np.ndarray,
    images_per_step: int,
    callbacks: Sequence[Callback] = (),
    start_epoch: int = 0,
    evaluate: Callable[[], dict[str, float]] | None = None,
    eval_interval: int = 0,
    data_seed: int | None = None,
) -> list[dict[str, float]]:
    """Train from ``start_epoch`` to ``epochs``; returns one metrics row per epoch.

    Each row holds epoch, loss (mean over the epoch), lr (at the epoch's last step),
    epoch_time_s, images_per_s (all ranks), and top1/top5 when ``evaluate`` ran that epoch
    (every ``eval_interval`` epochs and after the last one). With ``data_seed`` each epoch's
    shuffle and augmentation are seeded by ``data_seed + epoch``, so a run resumed at an epoch
    boundary sees the same data as an uninterrupted one.
    """
    import mindspore.dataset as ds

    steps_per_epoch = dataset.get_dataset_size()
    if steps_per_epoch == 0:
        raise ValueError("the training dataset yields no full batch")
    history = []
    for callback in callbacks:
        callback.on_train_begin(epochs, steps_per_epoch, start_epoch)
    try:
        for epoch in range(start_epoch, epochs):
            for callback in callbacks:
                callback.on_epoch_begin(epoch)
            if data_seed is not None:
                ds.config.set_seed(data_seed + epoch)  # read when the iterator starts its pipeline
            iterator = dataset.create_tuple_iterator(num_epochs=1)
            started = time.perf_counter()
            mean_loss = train_one_epoch(train_step, iterator, epoch, steps_per_epoch, callbacks)
            elapsed = time.perf_counter() - started
            metrics = {
                "epoch": float(epoch + 1),
                "loss": mean_loss,
                "lr": float(lr_per_step[min((epoch + 1) * steps_per_epoch, len(lr_per_step)) - 1]),
                "epoch_time_s": elapsed,
                "images_per_s": steps_per_epoch * images_per_step / elapsed,
            }
            if evaluate is not None and (epoch + 1 == epochs or (eval_interval and (epoch + 1) % eval_interval == 0)):
                metrics.update(evaluate())
            history.append(metrics)
            for callback in callbacks:
                callback.on_epoch_end(epoch, metrics)
    finally:
        for callback in callbacks:
            callback.on_train_end()
    return history
