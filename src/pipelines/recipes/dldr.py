"""The DLDR (dimension-reduce) recipe on the engine: stage 1, the trajectory's PCA, P-BFGS stage 2, a control.

Recipe (MindSpore's dimension-reduce training tutorial): Momentum for ``stage1.epochs`` of a
``stage1.schedule_epochs``-epoch lr schedule, keeping the trainable weights every K steps or epochs from
``trajectory.start_epoch``; the top-k principal directions of the last N kept weights
(``optim.dim_reduce.pca``); then ``stage2.epochs`` of P-BFGS in that subspace (``optim.dim_reduce.pbfgs``), and, for
comparison, the same number of Momentum epochs continued from stage 1 (the control).

All three trainings run through ``engine.loop.train``: stage 1 and the control with ``recipes.momentum``,
stage 2 with ``PBFGSStep``, whose state in the engine's checkpoints holds, under ``optimizer.``, P-BFGS's
inverse Hessian, last step and projected gradient, residual momenta and the per-step table, so a
resumed stage 2 continues the same numerics and reports every step. ``implementation: mindspore_boost``
trains stage 2 with ``mindspore.boost``'s own DimReduce through ``engine.model_bridge``, in a process of
its own (boost's configuration is a process-wide singleton); see ``train_stage2_with_boost``.

Epochs count from the start of stage 1: stage 2 and the control continue at ``stage1.epochs + 1``.
"""

from __future__ import annotations

import logging
import tempfile
import time
from collections.abc import Callable, Mapping, Sequence
from contextlib import nullcontext
from pathlib import Path

import mindspore as ms
import numpy as np
import pandas as pd

from pipelines.engine.callbacks import Callback
from pipelines.engine.checkpoint import OPTIMIZER_PREFIX, Checkpoint, load_checkpoint, save_checkpoint
from pipelines.engine.evaluation import evaluate
from pipelines.engine.loop import Checkpointing, TrainingResult, TrainingSpec, TrainStep, train
from pipelines.engine.model_bridge import ModelTrainStep
from pipelines.engine.progress import announce_compile
from pipelines.engine.resume import fingerprint
from pipelines.engine.state import network_state
from pipelines.models.loss import CrossEntropySmooth
from pipelines.optim.dim_reduce.boost import boost_config, boost_model, run_in_own_process
from pipelines.optim.dim_reduce.pbfgs import PBFGS, STATE_PREFIX, PBFGSConfig
from pipelines.optim.dim_reduce.pca import TrajectoryPCA, fit_trajectory_pca
from pipelines.optim.dim_reduce.trajectory import TrajectoryRecorder, select_trajectory, verify_trajectory
from pipelines.params import (
    BoostParams,
    CollectParams,
    ControlParams,
    DataParams,
    DistributedParams,
    ModelParams,
    PcaParams,
    RuntimeParams,
    Stage1Params,
    Stage2Params,
)
from pipelines.recipes.common import (
    configure,
    create_network,
    network_from_checkpoint,
    num_classes,
    step_evaluation,
    train_data,
    val_data,
)
from pipelines.recipes.momentum import train_momentum

logger = logging.getLogger(__name__)

# One row per stage-2 step: 1-based epoch, global step (epoch * steps per epoch + step + 1, 0-based
# epoch), the batch's loss before the update, the accepted line-search step size (0: none), trials.
STEP_COLUMNS = ("epoch", "step", "loss", "step_size", "trials")
_INTEGER_COLUMNS = ("epoch", "step", "trials")
# The table travels in the state under optimizer.pbfgs.steps.<column>; the wall-clock time of each step
# (seconds since the Unix epoch) too, so a resumed run logs the earlier steps at their real time.
STEP_TABLE_PREFIX = STATE_PREFIX + "steps."
STEP_TIMESTAMP = "timestamp"

PBFGS_ACCEPTED_FRACTION = "pbfgs/accepted_fraction"  # share of the epoch's steps that accepted a step
PBFGS_MEAN_STEP_SIZE = "pbfgs/mean_step_size"  # mean accepted step size over the epoch (0 for rejected)
PBFGS_MEAN_TRIALS = "pbfgs/mean_trials"  # mean line-search trials per step over the epoch


def train_stage1(
    start: Checkpoint,
    manifest: pd.DataFrame,
    class_index: dict[str, int],
    model: ModelParams,
    data: DataParams,
    runtime: RuntimeParams,
    distributed: DistributedParams,
    stage1: Stage1Params,
    boost: BoostParams,
    *,
    callbacks: Sequence[Callback] = (),
) -> tuple[TrainingResult, pd.DataFrame]:
    """Momentum from ``start`` to epoch ``stage1.epochs`` of a ``stage1.schedule_epochs`` schedule, keeping the
    weight trajectory in ``stage1.trajectory.dir``.

    Returns the training's result and the trajectory index (path, epoch, step, global step; empty on the ranks
    that write no files). A resumed stage 1 keeps the trajectory files of the epochs before the resume.
    """
    trajectory = stage1.trajectory
    recorder = TrajectoryRecorder(
        trajectory.dir, trajectory.start_epoch, trajectory.every_steps, trajectory.every_epochs
    )
    result = train_momentum(
        start,
        manifest,
        class_index,
        model,
        data,
        runtime,
        distributed,
        stage1,
        epochs=stage1.epochs,
        schedule_epochs=stage1.schedule_epochs,
        boost=boost,
        callbacks=callbacks,
        leader_callbacks=[recorder],
    )
    index = recorder.index
    if len(index):
        logger.info("Stage 1 recorded %d trajectory files in %s", len(index), trajectory.dir)
    return result, index


def collect_trajectory(
    trajectory_index: pd.DataFrame,
    model: ModelParams,
    class_index: dict[str, int],
    collect: CollectParams,
    pca: PcaParams,
) -> pd.DataFrame:
    """The last ``collect.n_files`` trajectory files, each checked against the network's trainable parameters."""
    chosen = select_trajectory(trajectory_index, collect.n_files, pca.n_components)
    net = create_network(model, class_index)
    verify_trajectory(chosen["path"].tolist(), {p.name: tuple(p.shape) for p in net.trainable_params()})
    return chosen


def trajectory_pca(
    selected_trajectory: pd.DataFrame, model: ModelParams, class_index: dict[str, int], pca: PcaParams
) -> TrajectoryPCA:
    """The top ``pca.n_components`` principal directions of the selected trajectory files (k x n, float32 rows
    over the network's trainable parameters in order, flattened)."""
    names = [p.name for p in create_network(model, class_index).trainable_params()]
    result = fit_trajectory_pca(selected_trajectory["path"].tolist(), names, pca.n_components)
    logger.info(
        "PCA: %d components of %d parameters explain %.1f%% of the trajectory's variance",
        *result.components.shape,
        100 * float(np.sum(result.explained_variance_ratio)),
    )
    return result


def train_control(
    stage1_checkpoint: Checkpoint,
    manifest: pd.DataFrame,
    class_index: dict[str, int],
    model: ModelParams,
    data: DataParams,
    runtime: RuntimeParams,
    distributed: DistributedParams,
    stage1: Stage1Params,
    stage2: Stage2Params,
    control: ControlParams,
    boost: BoostParams,
    *,
    callbacks: Sequence[Callback] = (),
) -> TrainingResult:
    """Stage 1's Momentum continued from its checkpoint (momentum, step, epoch) for ``stage2.epochs`` epochs."""
    return train_momentum(
        stage1_checkpoint,
        manifest,
        class_index,
        model,
        data,
        runtime,
        distributed,
        # evaluated every K steps as stage 2 is, so the two compare at step resolution
        stage1.model_copy(update={"checkpoint": control.checkpoint, "eval_every_steps": stage2.eval_every_steps}),
        epochs=stage1.epochs + stage2.epochs,
        schedule_epochs=stage1.schedule_epochs,
        continue_from_start=True,
        boost=boost,
        callbacks=callbacks,
    )


class PBFGSStep(TrainStep):
    """P-BFGS as the engine's step: one ``PBFGS.step`` per batch, returning ``(loss, overflow, loss_scale)``.

    ``rows`` is the per-step table (``STEP_COLUMNS`` and ``timestamp``). ``capture`` saves the network, the
    P-BFGS state and the table (under ``optimizer.``); ``restore`` loads them from a stage-2 checkpoint, while
    from a checkpoint without P-BFGS state (stage 1's) P-BFGS starts afresh at that checkpoint's epoch.
    ``lr`` is the step size the last step accepted, the factor its subspace direction was applied with.
    """

    recipe = "P-BFGS"

    def __init__(self, trainer: PBFGS, steps_per_epoch: int):
        super().__init__(self._train_batch, trainer.net, loss_scale=trainer.config.loss_scale)
        self.trainer = trainer
        self.steps_per_epoch = steps_per_epoch
        self.steps_done = 0
        self.rows: list[dict[str, float]] = []
        self._loss_scale = ms.Tensor(trainer.config.loss_scale, ms.float32)

    def _train_batch(self, images, labels):
        announce_compile(self.trainer, "the training graph (P-BFGS: gradient, line search, update)")
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
        params.update({OPTIMIZER_PREFIX + name: value for name, value in self.trainer.state().items()})
        for column in (*STEP_COLUMNS, STEP_TIMESTAMP):
            values = np.array([row[column] for row in self.rows], np.float64)
            params[OPTIMIZER_PREFIX + STEP_TABLE_PREFIX + column] = values
        return params

    def restore(self, checkpoint: Checkpoint) -> None:
        self.steps_done = int(checkpoint.metadata.get("epoch", 0)) * self.steps_per_epoch
        state = checkpoint.optimizer_state()
        if not any(name.startswith(STATE_PREFIX) for name in state):
            return  # stage 1's checkpoint: P-BFGS starts here
        try:
            self.trainer.load_state(state)
            columns = {column: state[STEP_TABLE_PREFIX + column] for column in (*STEP_COLUMNS, STEP_TIMESTAMP)}
        except KeyError as missing:
            raise ValueError(f"the stage-2 checkpoint lacks P-BFGS state optimizer.{missing.args[0]}") from None
        self.rows = [
            {c: int(v[i]) if c in _INTEGER_COLUMNS else float(v[i]) for c, v in columns.items()}
            for i in range(len(columns["step"]))
        ]

    def table(self) -> pd.DataFrame:
        """The per-step table, ``STEP_COLUMNS``."""
        return pd.DataFrame(self.rows, columns=[*STEP_COLUMNS, STEP_TIMESTAMP])[list(STEP_COLUMNS)]


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
    return PBFGSConfig(
        rho=stage2.rho,
        max_trials=stage2.max_trials,
        sigma=stage2.sigma,
        gamma=stage2.gamma,
        alpha=stage2.alpha,
        loss_scale=stage2.loss_scale,
    )


def train_stage2(
    stage1_checkpoint: Checkpoint,
    pca_matrix: np.ndarray,
    manifest: pd.DataFrame,
    class_index: dict[str, int],
    model: ModelParams,
    data: DataParams,
    runtime: RuntimeParams,
    distributed: DistributedParams,
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
    configure(runtime)
    worker_num = distributed.worker_num
    run_id = fingerprint(
        model,
        data,
        stage2.model_dump(exclude={"checkpoint", "eval_every_steps"}),
        runtime.seed,
        worker_num,
        stage1_checkpoint,
        pca_matrix,
    )
    config = pbfgs_config(stage2)
    loss_fn = CrossEntropySmooth(num_classes(model, class_index), stage2.label_smoothing)

    def make_step(start: Checkpoint, steps_per_epoch: int) -> PBFGSStep:
        net = network_from_checkpoint(model, class_index, start, "of stage 1")
        logger.info(
            "P-BFGS stage 2 of %s in a %d-dimensional subspace: rho %g, %d trials, sigma %g, gamma %g, alpha %g",
            model.name,
            pca_matrix.shape[0],
            config.rho,
            config.max_trials,
            config.sigma,
            config.gamma,
            config.alpha,
        )
        return PBFGSStep(PBFGS(net, loss_fn, pca_matrix, config, rank_size=worker_num), steps_per_epoch)

    validation = val_data(manifest, data)
    spec = TrainingSpec(
        epochs=int(stage1_checkpoint.metadata.get("epoch", 0)) + stage2.epochs,
        batch_size=stage2.batch_size,
        images_per_step=stage2.batch_size * worker_num,
        data_seed=runtime.seed,
        eval_every_steps=stage2.eval_every_steps,
    )
    checkpoint = stage2.checkpoint
    result = train(
        spec,
        train_data(manifest, data, stage2.batch_size, runtime.seed),
        make_step,
        start=stage1_checkpoint,
        fingerprint=run_id,
        checkpoints=Checkpointing.of(checkpoint),
        evaluate=lambda step: evaluate(step.network, validation),
        callbacks=[PBFGSFigures(on_steps), *callbacks],
        continue_from_start=True,
        metadata={"network": model.name},
        evaluate_steps=step_evaluation(manifest, data, stage2.eval_every_steps),
    )
    return result, result.step.table()


# boost's DimReduce: its training cell's own state goes under optimizer.boost.<parameter name>.
BOOST_STATE_PREFIX = "boost."
BOOST_STEP_COLUMNS = ("epoch", "step", "loss")


class BoostDimReduceStep(ModelTrainStep):
    """``mindspore.boost``'s DimReduce trained by ``Model.train`` (``optim.dim_reduce.boost.boost_model``).

    Boost renames the network's parameters it wraps (``optimizer.<name>``); the state keeps their own names.
    Under ``optimizer.boost.`` it holds every other parameter of boost's training cell (DimReduce's
    inverse Hessian ``bk``, last step ``sk``, last projected gradient ``gk_last``, residual momenta, SGD's
    buffers), which ``prepare`` loads once the cell exists, and under ``optimizer.boost.steps.`` the
    per-step loss table (``rows``, ``BOOST_STEP_COLUMNS``). Boost does not report its accepted step size,
    so ``lr`` is unknown (None).
    """

    recipe = "DimReduce (mindspore.boost)"

    def __init__(self, net, loss_fn, config: dict, loss_scale: float):
        super().__init__(lambda: boost_model(net, loss_fn, config, loss_scale), net, None, None, loss_scale, False)
        self.names = {id(p): p.name for p in net.get_parameters()}
        self.rows: list[dict[str, float]] = []
        self.pending: dict[str, np.ndarray] = {}

    def lr(self, step: int) -> float | None:
        return None

    def capture(self) -> dict[str, np.ndarray]:
        params = {self.names[id(p)]: p.asnumpy().copy() for p in self.network.get_parameters()}
        prefix = OPTIMIZER_PREFIX + BOOST_STATE_PREFIX
        if self.model is not None:
            for p in self.model.train_network.get_parameters():
                if id(p) not in self.names:
                    params[prefix + p.name] = p.asnumpy().copy()
        for column in BOOST_STEP_COLUMNS:
            params[prefix + "steps." + column] = np.array([row[column] for row in self.rows], np.float64)
        return params

    def restore(self, checkpoint: Checkpoint) -> None:
        state = {
            name.removeprefix(BOOST_STATE_PREFIX): value
            for name, value in checkpoint.optimizer_state().items()
            if name.startswith(BOOST_STATE_PREFIX)
        }
        if not state:
            return  # stage 1's checkpoint: boost starts here
        table = {column: state.pop("steps." + column) for column in BOOST_STEP_COLUMNS}
        self.rows = [
            {c: float(v[i]) if c == "loss" else int(v[i]) for c, v in table.items()} for i in range(len(table["step"]))
        ]
        self.pending = state

    def prepare(self) -> None:
        super().prepare()
        if self.pending:
            # set by identity: load_param_into_net would match the network's renamed parameters by name too
            own = {p.name: p for p in self.model.train_network.get_parameters() if id(p) not in self.names}
            missing = sorted(set(own) - set(self.pending))
            if missing:
                raise ValueError(f"the stage-2 checkpoint lacks mindspore.boost state optimizer.boost.{missing[0]}")
            for name, parameter in own.items():
                parameter.set_data(ms.Tensor(self.pending[name].reshape(parameter.shape), parameter.dtype))
            logger.info("Restored mindspore.boost's DimReduce state (%d parameters)", len(own))

    def table(self) -> pd.DataFrame:
        return pd.DataFrame(self.rows, columns=list(BOOST_STEP_COLUMNS))


class BoostStepLosses(Callback):
    """Adds each step's loss to the bound ``BoostDimReduceStep``'s table (1-based epoch, global step, loss)."""

    def bind(self, step: TrainStep) -> None:
        self.step = step

    def on_train_begin(self, total_epochs: int, steps_per_epoch: int, start_epoch: int) -> None:
        self.steps_per_epoch = steps_per_epoch

    def on_step_end(self, epoch: int, step: int, loss: float) -> None:
        self.step.rows.append({"epoch": epoch + 1, "step": epoch * self.steps_per_epoch + step + 1, "loss": loss})


def train_stage2_with_boost(
    stage1_checkpoint: Checkpoint,
    pca_matrix: np.ndarray,
    manifest: pd.DataFrame,
    class_index: dict[str, int],
    model: ModelParams,
    data: DataParams,
    runtime: RuntimeParams,
    distributed: DistributedParams,
    stage2: Stage2Params,
    *,
    callbacks: Sequence[Callback] = (),
    run_handoff=None,
) -> tuple[TrainingResult, pd.DataFrame]:
    """Stage 2 with ``mindspore.boost``'s DimReduce, in a process of its own, through the engine.

    Same epochs, data, evaluation, checkpoints and resume as ``train_stage2``; ``callbacks`` (picklable) run
    in that process, where ``run_handoff`` (``distributed.launch.RunHandoff``, optional) makes the caller's
    tracking run active. Returns the training's result (without its step) and the per-step loss table.
    """
    if distributed.worker_num > 1:
        raise ValueError(
            "dim_reduce.stage2.implementation mindspore_boost trains in one process; set distributed.worker_num: 1"
        )
    with tempfile.TemporaryDirectory(prefix="boost_stage2_") as folder:
        work = Path(folder)
        save_checkpoint(stage1_checkpoint, work / "stage1.ckpt")
        np.save(work / "pca.npy", pca_matrix)  # boost reads it by path and writes its slices beside it
        logger.info("Stage 2 with mindspore.boost's DimReduce in a process of its own")
        return run_in_own_process(
            _train_stage2_with_boost_here,
            {
                "start_path": work / "stage1.ckpt",
                "pca_path": work / "pca.npy",
                "manifest": manifest,
                "class_index": class_index,
                "model": model,
                "data": data,
                "runtime": runtime,
                "distributed": distributed,
                "stage2": stage2,
                "callbacks": list(callbacks),
                "run_handoff": run_handoff,
            },
            work,
        )


def _train_stage2_with_boost_here(
    start_path: Path,
    pca_path: Path,
    manifest: pd.DataFrame,
    class_index: dict[str, int],
    model: ModelParams,
    data: DataParams,
    runtime: RuntimeParams,
    distributed: DistributedParams,
    stage2: Stage2Params,
    callbacks: Sequence[Callback],
    run_handoff,
) -> tuple[TrainingResult, pd.DataFrame]:
    """The process side of ``train_stage2_with_boost``."""
    with run_handoff.attached() if run_handoff is not None else nullcontext():
        configure(runtime)
        start = load_checkpoint(start_path)
        pca_matrix = np.load(pca_path)
        run_id = fingerprint(model, data, stage2.model_dump(exclude={"checkpoint"}), runtime.seed, 1, start, pca_matrix)
        config = boost_config(pca_path, pca_matrix.shape[0], stage2.rho, stage2.gamma, stage2.alpha, stage2.sigma)
        loss_fn = CrossEntropySmooth(num_classes(model, class_index), stage2.label_smoothing)

        def make_step(start: Checkpoint, steps_per_epoch: int) -> BoostDimReduceStep:
            net = network_from_checkpoint(model, class_index, start, "of stage 1")
            return BoostDimReduceStep(net, loss_fn, config, stage2.loss_scale)

        validation = val_data(manifest, data)
        checkpoint = stage2.checkpoint
        result = train(
            TrainingSpec(
                epochs=int(start.metadata.get("epoch", 0)) + stage2.epochs,
                batch_size=stage2.batch_size,
                images_per_step=stage2.batch_size,
                data_seed=runtime.seed,
            ),
            train_data(manifest, data, stage2.batch_size, runtime.seed),
            make_step,
            start=start,
            fingerprint=run_id,
            checkpoints=Checkpointing.of(checkpoint),
            evaluate=lambda step: evaluate(step.network, validation),
            callbacks=[BoostStepLosses(), *callbacks],
            continue_from_start=True,
            metadata={"network": model.name},
        )
        # the step (MindSpore cells) stays here; the caller gets plain data
        return TrainingResult(result.checkpoint, result.history, result.summary), result.step.table()
