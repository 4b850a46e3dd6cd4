"""A training step: ``TrainStep`` trains on one batch and returns its outputs, and holds what a training's state is
(network, optimizer state, schedule). It knows nothing of epochs: the loops (``engine.fit``, ``engine.epochs``) call it
once per batch. ``StepFactory``: what a recipe gives the engine, its steps and their evaluation (Lightning's
LightningModule to its Trainer: the recipe says what one step and one evaluation are, the engine's loop owns the
rest)."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Protocol

import numpy as np

from trainlib.engine.checkpoint import Checkpoint
from trainlib.engine.state import capture_state, restore_optimizer


class TrainStep:
    """One optimizer's training step as the engine drives it.

    ``run(*batch)`` trains on one batch (its columns: images and labels, or a language model's token columns) and
    returns the loss tensor, or
    ``(loss, overflow, loss_scale)`` as ``nn.TrainOneStepWithLossScaleCell`` does. ``network`` is
    what is evaluated and saved; ``optimizer`` (a MindSpore optimizer, optional) holds the state saved
    under ``optimizer.``; ``lr_per_step`` is the schedule (``train/lr`` reads it); ``loss_scale`` the
    fixed factor the gradients are scaled by (named in overflow errors; default the run cell's ``sens``).
    Optimizers with other state (THOR, P-BFGS) override ``capture`` and ``restore``. The engine calls
    ``restore`` (when continuing), then ``prepare`` once before the first batch: a step whose cell depends
    on the restored state (e.g. boost's gradient freeze takes the rest of the schedule from the
    optimizer's step count) builds it there. ``title`` names the optimizer in the training's start line.
    """

    title = "training"

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

    def __call__(self, *batch):
        return self.run(*batch)

    def next_graph(self) -> tuple[object, str] | None:
        """The graph MindSpore compiles for the next call in GRAPH mode, as ``(owner, name)``: the object it is
        compiled for, and what the epoch loop's "Compiling <name>…" line calls it (once per owner and name); None when
        the call runs no cell. By default the step's cell, ``the training graph``; a step of several graphs names the
        one its next call runs."""
        from mindspore import nn

        return (self.run, "the training graph") if isinstance(self.run, nn.Cell) else None

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

    def release(self) -> None:
        """Free what the step holds in MindSpore (``release_cells``); the step is unusable afterwards."""
        release_cells(self)


class StepFactory(Protocol):
    """A recipe's training as the engine runs it (``loop.train``): ``make_step(start, steps_per_epoch)`` builds the
    network from ``start``'s weights (None: fresh) and its optimizer for a schedule of ``steps_per_epoch`` steps per
    epoch; ``evaluate(step, dataset)`` scores ``step`` on ``dataset`` (e.g. ``top1``, ``top5``). A recipe's factory is
    an object of its own, holding its section (``recipes.thor.ThorStepFactory``), not closures handed to the loop."""

    def make_step(self, start: Checkpoint | None, steps_per_epoch: int) -> TrainStep: ...

    def evaluate(self, step: TrainStep, dataset) -> Mapping[str, float]: ...


# the objects whose attributes may hold a step's cells: this project's, and MindSpore's Model (ModelThor, boost)
_HOLDERS = ("trainlib.", "mindspore.train.")


def release_cells(root: object) -> None:
    """Free the compiled graphs of every cell reachable from ``root`` and empty those cells.

    MindSpore never frees a cell whose ``construct`` takes ``*args`` once it has run in GRAPH mode (MindSpore 2.10:
    something in C++ keeps a reference, and ``ms_memory_recycle`` does not drop it), nor the graphs compiled for it:
    ``TrainOneStepCell`` and this project's step cells, so each training kept its network, optimizer and graphs, about
    0.85 GB a THOR training in a long study process. Emptied, only the cells' shells stay.
    """
    from mindspore import nn
    from mindspore.graph.api import _cell_graph_executor

    cells, seen, todo = [], set(), [root]
    while todo:
        obj = todo.pop()
        if id(obj) in seen:
            continue
        seen.add(id(obj))
        if isinstance(obj, nn.Cell):
            cells.append(obj)
            todo.extend(vars(obj).values())  # its _cells, _params and _primitives too
        elif isinstance(obj, list | tuple | set | frozenset):
            todo.extend(obj)
        elif isinstance(obj, dict):
            todo.extend(obj.values())
        elif type(obj).__module__.startswith(_HOLDERS) and hasattr(obj, "__dict__"):
            todo.extend(vars(obj).values())
    for cell in cells:
        compiled = vars(cell).get("_compile_cache")  # the set behind Cell.compile_cache; None: never compiled
        if compiled:
            _cell_graph_executor.del_net_res(cell, set(compiled))
            compiled.clear()
        vars(cell).clear()
