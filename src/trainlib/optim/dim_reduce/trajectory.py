"""Weight trajectory of stage-1 training: recorded during training, selected and checked for PCA."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

import pandas as pd

from trainlib.engine.callbacks import Callback
from trainlib.engine.checkpoint import Checkpoint, CheckpointError, check_compatible, load_checkpoint, save_checkpoint

if TYPE_CHECKING:
    from trainlib.engine.step import TrainStep

INDEX_COLUMNS = ["path", "epoch", "step", "global_step"]


class TrajectoryRecorder(Callback):
    """Saves the trainable weights (only) every ``every_steps`` steps or ``every_epochs`` epochs (one of the
    two is None; ``dim_reduce.stage1.trajectory`` in trainlib.params requires exactly one).

    The weights are those of the bound training step's network. Recording starts at epoch
    ``start_epoch`` (1-based), as the DLDR tutorial drops early weights. Files are
    ``<directory>/traj_<global step>.ckpt``, written atomically; ``index`` lists them in order.
    At the start, files of an earlier run in ``directory`` are removed, except, when training
    resumes at an epoch, the ones recorded before that epoch.
    """

    def __init__(
        self,
        directory: str | Path,
        *,
        start_epoch: int,
        every_steps: int | None,
        every_epochs: int | None,
    ):
        self.directory = Path(directory)
        self.start_epoch = start_epoch
        self.every_steps = every_steps
        self.every_epochs = every_epochs
        self.rows: list[tuple[str, int, int, int]] = []

    def bind(self, step: TrainStep) -> None:
        self.net = step.network

    def on_train_begin(self, total_epochs: int, steps_per_epoch: int, start_epoch: int) -> None:
        self.steps_per_epoch = steps_per_epoch
        self.directory.mkdir(parents=True, exist_ok=True)
        for path in sorted(self.directory.glob("traj_*.ckpt")):
            global_step = int(path.stem.removeprefix("traj_"))
            if global_step <= start_epoch * steps_per_epoch:
                epoch, step = divmod(global_step - 1, steps_per_epoch)
                self.rows.append((str(path), epoch + 1, step + 1, global_step))
            else:
                path.unlink()

    def _record(self, epoch: int, step: int) -> None:
        global_step = epoch * self.steps_per_epoch + step + 1
        path = self.directory / f"traj_{global_step:08d}.ckpt"
        params = {p.name: p.asnumpy() for p in self.net.trainable_params()}
        save_checkpoint(Checkpoint(params, {"epoch": epoch + 1, "step": step + 1}), path)
        self.rows.append((str(path), epoch + 1, step + 1, global_step))

    def on_step_end(self, epoch: int, step: int, loss: float) -> None:
        if self.every_steps and epoch + 1 >= self.start_epoch:
            if (epoch * self.steps_per_epoch + step + 1) % self.every_steps == 0:
                self._record(epoch, step)

    def on_epoch_end(self, epoch: int, metrics: dict[str, float]) -> None:
        if self.every_epochs and epoch + 1 >= self.start_epoch and (epoch + 1) % self.every_epochs == 0:
            self._record(epoch, self.steps_per_epoch - 1)

    @property
    def index(self) -> pd.DataFrame:
        return pd.DataFrame(self.rows, columns=INDEX_COLUMNS)


def select_trajectory(index: pd.DataFrame, *, n_files: int | None, n_components: int) -> pd.DataFrame:
    """The last ``n_files`` trajectory files (all when None); more than ``n_components`` are needed."""
    chosen = index.sort_values("global_step")
    if n_files is not None:
        chosen = chosen.tail(n_files)
    if len(chosen) <= n_components:
        raise ValueError(
            f"PCA needs more trajectory files than n_components={n_components}, but "
            f"{len(chosen)} were selected (of {len(index)} recorded). Record more often "
            "(trajectory.every_steps), start earlier (trajectory.start_epoch), raise collect.n_files, "
            "or lower pca.n_components."
        )
    return chosen.reset_index(drop=True)


def verify_trajectory(paths: list[str], expected: dict[str, tuple[int, ...]]) -> None:
    """Every file must hold exactly the network's trainable parameter names and shapes.

    Raises ``CheckpointError`` naming the first offending (or unreadable) file.
    """
    for path in paths:
        if not Path(path).is_file():
            raise CheckpointError(f"trajectory file {path} does not exist")
        check_compatible(expected, load_checkpoint(path), str(path))
