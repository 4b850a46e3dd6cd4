"""Training callbacks: the hooks the engine's loops call, through one dispatcher (``CallbackList``), and the periodic
checkpoint writer.

Epochs are 0-based in the hooks (``epoch`` 0 is the first) and 1-based in the rows and file
names (``"epoch": 1``, ``epoch_0001.ckpt``), as MLflow steps and people count them.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from contextvars import ContextVar
from pathlib import Path
from typing import TYPE_CHECKING

from trainlib.engine.checkpoint import Checkpoint, save_checkpoint
from trainlib.engine.resume import CHECKPOINT_PREFIX

if TYPE_CHECKING:
    from trainlib.engine.step import TrainStep


class Callback:
    """Hooks called by the engine, in this order; subclasses override what they need.

    ``bind(step)`` once the training step (network, optimizer) exists; ``on_resume`` when the
    training continues from a checkpoint, with the rows of the epochs before; ``on_train_begin``;
    per epoch ``on_epoch_begin``, ``on_step_end`` per step, ``on_evaluation(epoch, figures)`` when the epoch
    was evaluated (the recipe's ``StepFactory.evaluate`` figures), ``epoch_metrics`` (figures of the
    callback's own added to the epoch's row, e.g. ``thor/damping``) and ``on_epoch_end`` with the
    complete row; ``on_train_end`` once, also when training raised. ``on_step_evaluation(row)`` after
    each evaluation every ``eval_every_steps`` steps (right after that step's ``on_step_end``; on resume
    also once per earlier row, after ``on_resume``).
    """

    def bind(self, step: TrainStep) -> None: ...
    def on_resume(self, source: Path, history: Sequence[Mapping[str, float]]) -> None: ...
    def on_train_begin(self, total_epochs: int, steps_per_epoch: int, start_epoch: int) -> None: ...
    def on_epoch_begin(self, epoch: int) -> None: ...
    def on_step_end(self, epoch: int, step: int, loss: float) -> None: ...
    def on_evaluation(self, epoch: int, figures: Mapping[str, float]) -> None: ...
    def epoch_metrics(self, epoch: int) -> dict[str, float]:
        return {}

    def on_epoch_end(self, epoch: int, metrics: dict[str, float]) -> None: ...
    def on_step_evaluation(self, row: Mapping[str, float]) -> None: ...
    def on_train_end(self) -> None: ...


# Callbacks of whoever runs a recipe's code without calling the engine itself: the study runs a recipe's Kedro
# pipeline, whose nodes choose their own callbacks, and its tuning still has to see each training's step evaluations
# (Optuna's pruner). Scoped to a context, not global: a training elsewhere in the process sees none of them.
_OBSERVERS: ContextVar[tuple[Callback, ...]] = ContextVar("trainlib_training_observers", default=())


@contextmanager
def observing_trainings(callbacks: Sequence[Callback]) -> Iterator[None]:
    """Every training the engine runs in this context (this thread; not msrun's other processes) also calls
    ``callbacks``, after its own."""
    token = _OBSERVERS.set((*_OBSERVERS.get(), *callbacks))
    try:
        yield
    finally:
        _OBSERVERS.reset(token)


def training_observers() -> tuple[Callback, ...]:
    """The callbacks ``observing_trainings`` added in this context."""
    return _OBSERVERS.get()


class CallbackList(Callback):
    """A training's callbacks as one: each hook calls theirs in their order, and ``epoch_metrics`` merges their
    figures in that order (a later callback's figure wins). The loops call every hook through it."""

    def __init__(self, callbacks: Sequence[Callback]):
        self.callbacks = list(callbacks)

    def _call(self, hook: str, *args) -> None:
        for callback in self.callbacks:
            getattr(callback, hook)(*args)

    def bind(self, step: TrainStep) -> None:
        self._call("bind", step)

    def on_resume(self, source: Path, history: Sequence[Mapping[str, float]]) -> None:
        self._call("on_resume", source, history)

    def on_train_begin(self, total_epochs: int, steps_per_epoch: int, start_epoch: int) -> None:
        self._call("on_train_begin", total_epochs, steps_per_epoch, start_epoch)

    def on_epoch_begin(self, epoch: int) -> None:
        self._call("on_epoch_begin", epoch)

    def on_step_end(self, epoch: int, step: int, loss: float) -> None:
        self._call("on_step_end", epoch, step, loss)

    def on_evaluation(self, epoch: int, figures: Mapping[str, float]) -> None:
        self._call("on_evaluation", epoch, figures)

    def epoch_metrics(self, epoch: int) -> dict[str, float]:
        figures: dict[str, float] = {}
        for callback in self.callbacks:
            figures.update(callback.epoch_metrics(epoch))
        return figures

    def on_epoch_end(self, epoch: int, metrics: dict[str, float]) -> None:
        self._call("on_epoch_end", epoch, metrics)

    def on_step_evaluation(self, row: Mapping[str, float]) -> None:
        self._call("on_step_evaluation", row)

    def on_train_end(self) -> None:
        self._call("on_train_end")


class ConstantFigures(Callback):
    """Figures that hold for the whole training, added to every epoch's row (e.g. the training data's
    ``data/skipped_files``); nothing when empty."""

    def __init__(self, figures: Mapping[str, float]):
        self.figures = dict(figures)

    def epoch_metrics(self, epoch: int) -> dict[str, float]:
        return dict(self.figures)


class PeriodicCheckpoint(Callback):
    """Writes the full training state every ``every_epochs`` epochs, keeping the newest ``keep_last``.

    ``capture(epochs_done)`` returns the state after that many epochs; files are
    ``<directory>/<prefix>_<epoch:04d>.ckpt``, written atomically, older ones of the same prefix removed.
    """

    def __init__(
        self,
        capture: Callable[[int], Checkpoint],
        directory: str | Path,
        every_epochs: int = 1,
        keep_last: int = 2,
        prefix: str = CHECKPOINT_PREFIX,
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
