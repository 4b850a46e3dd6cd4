"""dim_reduce's stage 2 with this project's P-BFGS (``optim.dim_reduce.pbfgs``) in the trajectory's PCA subspace.

``PBFGSStep`` is P-BFGS as the engine's step: its state in the engine's checkpoints holds, under ``optimizer.``,
P-BFGS's inverse Hessian, last step and projected gradient, residual momenta and the per-step table, so a resumed
stage 2 continues the same numerics and reports every step.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import fields
from pathlib import Path

import mindspore as ms
import numpy as np
import pandas as pd

from trainlib.engine.callbacks import Callback
from trainlib.engine.checkpoint import OPTIMIZER_PREFIX, Checkpoint
from trainlib.engine.loop import TrainingResult
from trainlib.engine.state import network_state
from trainlib.engine.step import TrainStep
from trainlib.metrics import TIMESTAMP_KEY
from trainlib.models.loss import CrossEntropySmooth
from trainlib.optim.dim_reduce.pbfgs import PBFGS, STATE_PREFIX, PBFGSConfig
from trainlib.params import Stage2Params
from trainlib.recipes import classifier
from trainlib.recipes.context import TrainingContext
from trainlib.recipes.dim_reduce import step_table

logger = logging.getLogger(__name__)

# One row per stage-2 step: 1-based epoch, global step (epoch * steps per epoch + step + 1, 0-based
# epoch), the batch's loss before the update, the accepted line-search step size (0: none), trials.
STEP_COLUMNS = ("epoch", "step", "loss", "step_size", "trials")
_INTEGER_COLUMNS = ("epoch", "step", "trials")
# The table travels in the state under optimizer.pbfgs.steps.<column>; the wall-clock time of each step
# (seconds since the Unix epoch) too, so a resumed run logs the earlier steps at their real time.
STEP_TABLE_PREFIX = STATE_PREFIX + "steps."
STEP_TIMESTAMP = "timestamp"
_TABLE_COLUMNS = (*STEP_COLUMNS, STEP_TIMESTAMP)

PBFGS_ACCEPTED_FRACTION = "pbfgs/accepted_fraction"  # share of the epoch's steps that accepted a step
PBFGS_MEAN_STEP_SIZE = "pbfgs/mean_step_size"  # mean accepted step size over the epoch (0 for rejected)
PBFGS_MEAN_TRIALS = "pbfgs/mean_trials"  # mean line-search trials per step over the epoch


def step_metrics(rows: Sequence[Mapping[str, float]]) -> list[dict[str, float]]:
    """Step table rows as per-step metrics: each P-BFGS step's loss, accepted step size and trials
    (``pbfgs/step_loss``, ``pbfgs/step_size``, ``pbfgs/trials``) at its global ``step`` and wall-clock time."""
    return [
        {
            "step": row["step"],
            TIMESTAMP_KEY: row[STEP_TIMESTAMP],
            "pbfgs/step_loss": row["loss"],
            "pbfgs/step_size": row["step_size"],
            "pbfgs/trials": row["trials"],
        }
        for row in rows
    ]


class PBFGSStep(TrainStep):
    """P-BFGS as the engine's step: one ``PBFGS.step`` per batch, returning ``(loss, overflow, loss_scale)``.

    ``rows`` is the per-step table (``STEP_COLUMNS`` and ``timestamp``). ``capture`` saves the network, the
    P-BFGS state and the table (under ``optimizer.``); ``restore`` loads them from a stage-2 checkpoint, while
    from a checkpoint without P-BFGS state (stage 1's) P-BFGS starts afresh at that checkpoint's epoch.
    ``lr`` is the step size the last step accepted, the factor its subspace direction was applied with.
    """

    title = "P-BFGS"

    def __init__(self, trainer: PBFGS, steps_per_epoch: int):
        super().__init__(self._train_batch, trainer.net, loss_scale=trainer.config.loss_scale)
        self.trainer = trainer
        self.steps_per_epoch = steps_per_epoch
        self.steps_done = 0
        self.rows: list[dict[str, float]] = []
        self._loss_scale = ms.Tensor(trainer.config.loss_scale, ms.float32)

    def next_graph(self) -> tuple[object, str]:
        return self.trainer, "the training graph (P-BFGS: gradient, line search, update)"

    def _train_batch(self, images, labels):
        result = self.trainer.step(images, labels)
        self.steps_done += 1
        self.rows.append(
            {
                "epoch": (self.steps_done - 1) // self.steps_per_epoch + 1,
                "step": self.steps_done,
                "loss": result.loss,
                "step_size": result.step_size,
                "trials": result.trials,
                STEP_TIMESTAMP: time.time(),
            }
        )
        # the loop's (loss, overflow, loss scale) form: an overflow stops training as a loss-scale problem
        return ms.Tensor(result.loss, ms.float32), ms.Tensor(result.overflow), self._loss_scale

    def lr(self, step: int) -> float | None:
        """The step size the last step accepted (P-BFGS has no schedule; ``step`` is not needed)."""
        last = self.trainer.last_result
        return None if last is None else last.step_size

    def lr_summary(self, first_step: int, last_step: int) -> str:
        config = self.trainer.config
        return f"lr: the step size each step's line search accepts, {config.rho:g}^k with k < {config.max_trials}"

    def capture(self) -> dict[str, np.ndarray]:
        params = network_state(self.network)
        state = {**self.trainer.state(), **step_table.encode(self.rows, _TABLE_COLUMNS, STEP_TABLE_PREFIX)}
        params.update({OPTIMIZER_PREFIX + name: value for name, value in state.items()})
        return params

    def restore(self, checkpoint: Checkpoint) -> None:
        self.steps_done = int(checkpoint.metadata.get("epoch", 0)) * self.steps_per_epoch
        state = checkpoint.optimizer_state()
        if not any(name.startswith(STATE_PREFIX) for name in state):
            return  # stage 1's checkpoint: P-BFGS starts here
        try:
            self.trainer.load_state(state)
            self.rows = step_table.decode(state, _TABLE_COLUMNS, STEP_TABLE_PREFIX, _INTEGER_COLUMNS)
        except KeyError as missing:
            raise ValueError(f"the stage-2 checkpoint lacks P-BFGS state optimizer.{missing.args[0]}") from None

    def table(self) -> pd.DataFrame:
        """The per-step table, ``STEP_COLUMNS``."""
        return pd.DataFrame(self.rows, columns=list(_TABLE_COLUMNS))[list(STEP_COLUMNS)]


class PBFGSFigures(Callback):
    """Adds P-BFGS's figures to each epoch's row (``pbfgs/…``) and passes the step rows to ``on_steps``.

    ``on_steps`` (e.g. an MLflow logger) gets each step's row as it ends, and on resume the rows of the
    steps before, which the checkpoint carries.
    """

    def __init__(self, on_steps: Callable[[Sequence[Mapping[str, float]]], None] | None = None):
        self.on_steps = on_steps

    def bind(self, step: TrainStep) -> None:
        self.step = step

    def on_resume(self, source: Path, history: Sequence[Mapping[str, float]]) -> None:
        if self.on_steps is not None and self.step.rows:
            self.on_steps(self.step.rows)

    def on_step_end(self, epoch: int, step: int, loss: float) -> None:
        if self.on_steps is not None:
            self.on_steps(self.step.rows[-1:])

    def epoch_metrics(self, epoch: int) -> dict[str, float]:
        rows = [row for row in self.step.rows if row["epoch"] == epoch + 1]
        if not rows:
            return {}
        sizes = np.array([row["step_size"] for row in rows], np.float64)
        return {
            PBFGS_ACCEPTED_FRACTION: float((sizes > 0).mean()),
            PBFGS_MEAN_STEP_SIZE: float(sizes.mean()),
            PBFGS_MEAN_TRIALS: float(np.mean([row["trials"] for row in rows])),
        }

    def on_train_end(self) -> None:
        rows = self.step.rows
        if rows:
            logger.info(
                "Stage 2: %d steps, %.0f%% accepted a step, mean trials %.2f",
                len(rows),
                100 * np.mean([row["step_size"] > 0 for row in rows]),
                np.mean([row["trials"] for row in rows]),
            )


def pbfgs_config(stage2: Stage2Params) -> PBFGSConfig:
    """P-BFGS's constants from the ``dim_reduce.stage2`` parameters."""
    return PBFGSConfig(**{field.name: getattr(stage2, field.name) for field in fields(PBFGSConfig)})


class Stage2StepFactory(classifier.ImageStepFactory):
    """Stage 2's steps (``engine.step.StepFactory``): the network from stage 1's weights, P-BFGS in the subspace of
    ``pca_matrix`` with the section's constants (``pbfgs_config``)."""

    def __init__(self, context: TrainingContext, stage2: Stage2Params, pca_matrix: np.ndarray):
        self.context, self.pca_matrix, self.config = context, pca_matrix, pbfgs_config(stage2)
        classes = classifier.num_classes(context.network, context.class_index)
        self.loss_fn = CrossEntropySmooth(classes, stage2.label_smoothing)

    def make_step(self, start: Checkpoint, steps_per_epoch: int) -> PBFGSStep:
        context, config = self.context, self.config
        network = context.network
        net = classifier.network_from_checkpoint(network, context.class_index, start, "of stage 1")
        logger.info(
            "P-BFGS stage 2 of %s in a %d-dimensional subspace: rho %g, %d trials, sigma %g, gamma %g, alpha %g",
            network.name,
            self.pca_matrix.shape[0],
            config.rho,
            config.max_trials,
            config.sigma,
            config.gamma,
            config.alpha,
        )
        pbfgs = PBFGS(net, self.loss_fn, self.pca_matrix, config, rank_size=context.distributed.worker_num)
        return PBFGSStep(pbfgs, steps_per_epoch)


def train_stage2(
    context: TrainingContext,
    stage1_checkpoint: Checkpoint,
    pca_matrix: np.ndarray,
    stage2: Stage2Params,
    *,
    callbacks: Sequence[Callback] = (),
    on_steps: Callable[[Sequence[Mapping[str, float]]], None] | None = None,
) -> tuple[TrainingResult, pd.DataFrame]:
    """P-BFGS in the PCA subspace (``pca_matrix``, k x n) for ``stage2.epochs`` epochs from stage 1's weights.

    Resumes from the newest checkpoint of the same configuration in ``stage2.checkpoint.dir``. ``callbacks``
    run on every rank; ``on_steps`` gets the per-step rows (``PBFGSFigures``). Returns the training's result
    and the per-step table (``STEP_COLUMNS``).
    """
    classifier.configure(context.runtime)
    run_id = classifier.training_fingerprint(context, stage2, stage1_checkpoint, pca_matrix)
    result = classifier.train_classifier(
        context,
        stage2,
        Stage2StepFactory(context, stage2, pca_matrix),
        name="stage2",
        start=stage1_checkpoint,
        fingerprint=run_id,
        epochs=int(stage1_checkpoint.metadata.get("epoch", 0)) + stage2.epochs,
        continue_from_start=True,
        callbacks=[PBFGSFigures(on_steps), *callbacks],
    )
    return result, result.step.table()
