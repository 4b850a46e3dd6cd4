"""Epoch/step progress with rate and ETA that shares the console with Kedro's log handler.

On a terminal it draws a rich progress bar on rich's global console, the one Kedro's
RichHandler prints through, so log records scroll above the bar instead of through it.
Elsewhere (CI, files) it logs one line every ``log_every_fraction`` of an epoch.

``announce_compile`` says when a cell is about to be compiled (GRAPH mode), which on its first call
takes seconds on CPU and minutes for a large network, so a training is not silent meanwhile.
"""

from __future__ import annotations

import logging
import time

from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn, TimeRemainingColumn

from trainlib.engine.callbacks import Callback

logger = logging.getLogger(__name__)


# The attribute of a compiled object (a cell, a step, a Model) that holds the names of its graphs announced so far.
ANNOUNCED_GRAPHS = "_announced_graphs"


def announce_compile(owner, what: str = "the training graph") -> bool:
    """Log "Compiling <what>…" once per ``owner`` and ``what``, in GRAPH mode only; returns whether it did, i.e.
    whether the call that follows compiles (the epoch loop times that step apart, ``train/compile_s``).

    MindSpore compiles a cell the first time it runs in GRAPH mode (per train/eval mode); call this just before that
    call. ``owner``: the cell, or the step or ``Model`` whose first call (of the kind ``what`` names) compiles. The
    mark is kept on ``owner`` (``ANNOUNCED_GRAPHS``), as MindSpore keeps the graph with the cell: a new network is
    announced again, the same one never twice, whichever training or evaluation runs it. In PyNative mode nothing
    is compiled and nothing is logged.
    """
    import mindspore as ms

    said = vars(owner).setdefault(ANNOUNCED_GRAPHS, set())
    if what in said:
        return False
    said.add(what)
    if ms.get_context("mode") != ms.GRAPH_MODE:
        return False
    logger.info("Compiling %s…", what)
    return True


def _format_seconds(seconds: float) -> str:
    seconds = int(max(seconds, 0))
    return f"{seconds // 3600:d}:{seconds // 60 % 60:02d}:{seconds % 60:02d}"


class ProgressReporter(Callback):
    """Training callback that shows steps, examples/s (``unit``: ``img``, ``seq``) and ETA for the epoch and the whole
    run."""

    def __init__(
        self, batch_size: int, unit: str = "img", log_every_fraction: float = 0.25, console: Console | None = None
    ):
        from rich import get_console

        self.batch_size = batch_size
        self.unit = unit
        self.log_every_fraction = log_every_fraction
        self.console = console or get_console()
        self.live = self.console.is_terminal
        self._progress: Progress | None = None

    def on_train_begin(self, total_epochs: int, steps_per_epoch: int, start_epoch: int) -> None:
        self.total_epochs = total_epochs
        self.steps_per_epoch = steps_per_epoch
        self.run_start = time.perf_counter()
        self.steps_done_in_run = 0
        self.steps_left_in_run = (total_epochs - start_epoch) * steps_per_epoch
        if self.live:
            self._progress = Progress(
                TextColumn("[bold]{task.description}"),
                BarColumn(),
                MofNCompleteColumn(),
                TextColumn("{task.fields[rate]:>8.1f} " + self.unit + "/s  loss {task.fields[loss]:.4f}"),
                TimeElapsedColumn(),
                TextColumn("ETA"),
                TimeRemainingColumn(),
                console=self.console,
                transient=True,
            )
            self._progress.start()
            self._run_task = self._progress.add_task(
                "run", total=total_epochs, completed=start_epoch, rate=0.0, loss=0.0
            )

    def on_epoch_begin(self, epoch: int) -> None:
        self.epoch = epoch
        self.epoch_start = time.perf_counter()
        self.next_log_step = max(1, int(self.steps_per_epoch * self.log_every_fraction))
        if self._progress:
            self._epoch_task = self._progress.add_task(
                f"epoch {epoch + 1}/{self.total_epochs}", total=self.steps_per_epoch, rate=0.0, loss=0.0
            )

    def on_step_end(self, epoch: int, step: int, loss: float) -> None:
        self.steps_done_in_run += 1
        elapsed = time.perf_counter() - self.epoch_start
        rate = (step + 1) * self.batch_size / max(elapsed, 1e-9)
        if self._progress:
            self._progress.update(self._epoch_task, completed=step + 1, rate=rate, loss=loss)
            return
        if step + 1 >= self.next_log_step or step + 1 == self.steps_per_epoch:
            self.next_log_step += max(1, int(self.steps_per_epoch * self.log_every_fraction))
            run_elapsed = time.perf_counter() - self.run_start
            eta = run_elapsed / self.steps_done_in_run * (self.steps_left_in_run - self.steps_done_in_run)
            logger.info(
                "epoch %d/%d step %d/%d loss %.4f %.1f " + self.unit + "/s ETA epoch %s run %s",
                epoch + 1,
                self.total_epochs,
                step + 1,
                self.steps_per_epoch,
                loss,
                rate,
                _format_seconds(elapsed / (step + 1) * (self.steps_per_epoch - step - 1)),
                _format_seconds(eta),
            )

    def on_epoch_end(self, epoch: int, metrics: dict[str, float]) -> None:
        if self._progress:
            self._progress.remove_task(self._epoch_task)
            self._progress.update(
                self._run_task,
                completed=epoch + 1,
                rate=metrics.get("train/images_per_s", 0.0),
                loss=metrics.get("train/loss", 0.0),
            )
        shown = " ".join(f"{k} {v:.4g}" for k, v in metrics.items() if k not in ("epoch", "timestamp"))
        logger.info("epoch %d/%d done: %s", epoch + 1, self.total_epochs, shown)

    def on_train_end(self) -> None:
        if self._progress:
            self._progress.stop()
            self._progress = None
