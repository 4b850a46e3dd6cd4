"""dim_reduce's stage 2 with ``mindspore.boost``'s own DimReduce (``implementation: mindspore_builtin``), for
comparison with this project's P-BFGS: trained by ``Model.train`` through ``engine.model_bridge``, in a process
of its own, since boost's configuration is a process-wide singleton."""

from __future__ import annotations

import logging
import tempfile
from collections.abc import Sequence
from contextlib import nullcontext
from pathlib import Path

import mindspore as ms
import numpy as np
import pandas as pd

from trainlib.engine.callbacks import Callback
from trainlib.engine.checkpoint import OPTIMIZER_PREFIX, Checkpoint, load_checkpoint, save_checkpoint
from trainlib.engine.epochs import TrainingSpec
from trainlib.engine.loop import Checkpointing, TrainingResult, train
from trainlib.engine.model_bridge import ModelTrainStep
from trainlib.engine.resume import fingerprint
from trainlib.engine.step import TrainStep
from trainlib.models.loss import CrossEntropySmooth
from trainlib.optim.dim_reduce.mindspore_dim_reduce import (
    builtin_dim_reduce_config,
    builtin_dim_reduce_model,
    run_in_child_process,
)
from trainlib.params import Stage2Params
from trainlib.recipes.classifier import (
    ImageStepFactory,
    configure,
    network_from_checkpoint,
    num_classes,
    train_data,
    val_data,
)
from trainlib.recipes.context import TrainingContext
from trainlib.recipes.dim_reduce import step_table

logger = logging.getLogger(__name__)

# the built-in DimReduce: its training cell's own state goes under optimizer.boost.<parameter name> (the name
# checkpoints already hold)
BUILTIN_STATE_PREFIX = "boost."
# its per-step table under optimizer.boost.steps.<column>
BUILTIN_STEP_TABLE_PREFIX = BUILTIN_STATE_PREFIX + "steps."
BUILTIN_STEP_COLUMNS = ("epoch", "step", "loss")
_INTEGER_COLUMNS = ("epoch", "step")


class BuiltinDimReduceStep(ModelTrainStep):
    """``mindspore.boost``'s DimReduce trained by ``Model.train``
    (``optim.dim_reduce.mindspore_dim_reduce.builtin_dim_reduce_model``).

    Boost renames the network's parameters it wraps (``optimizer.<name>``); the state keeps their own names.
    Under ``optimizer.boost.`` it holds every other parameter of boost's training cell (DimReduce's
    inverse Hessian ``bk``, last step ``sk``, last projected gradient ``gk_last``, residual momenta, SGD's
    buffers), which ``prepare`` loads once the cell exists, and under ``optimizer.boost.steps.`` the
    per-step loss table (``rows``, ``BUILTIN_STEP_COLUMNS``). Boost does not report its accepted step size,
    so ``lr`` is unknown (None).
    """

    title = "DimReduce (mindspore.boost)"

    def __init__(self, net, loss_fn, config: dict, *, loss_scale: float):
        super().__init__(
            lambda: builtin_dim_reduce_model(net, loss_fn, config, loss_scale=loss_scale),
            net,
            None,
            None,
            loss_scale,
            False,
        )
        self.names = {id(p): p.name for p in net.get_parameters()}
        self.rows: list[dict[str, float]] = []
        self.pending: dict[str, np.ndarray] = {}

    def lr(self, step: int) -> float | None:
        return None

    def capture(self) -> dict[str, np.ndarray]:
        params = {self.names[id(p)]: p.asnumpy().copy() for p in self.network.get_parameters()}
        state = {}
        if self.model is not None:
            for p in self.model.train_network.get_parameters():
                if id(p) not in self.names:
                    state[BUILTIN_STATE_PREFIX + p.name] = p.asnumpy().copy()
        state.update(step_table.encode(self.rows, BUILTIN_STEP_COLUMNS, BUILTIN_STEP_TABLE_PREFIX))
        params.update({OPTIMIZER_PREFIX + name: value for name, value in state.items()})
        return params

    def restore(self, checkpoint: Checkpoint) -> None:
        state = checkpoint.optimizer_state()
        if not any(name.startswith(BUILTIN_STATE_PREFIX) for name in state):
            return  # stage 1's checkpoint: boost starts here
        try:
            self.rows = step_table.decode(state, BUILTIN_STEP_COLUMNS, BUILTIN_STEP_TABLE_PREFIX, _INTEGER_COLUMNS)
        except KeyError as missing:
            key = f"optimizer.{missing.args[0]}"
            raise ValueError(f"the stage-2 checkpoint lacks mindspore.boost state {key}") from None
        self.pending = {
            name.removeprefix(BUILTIN_STATE_PREFIX): value
            for name, value in state.items()
            if name.startswith(BUILTIN_STATE_PREFIX) and not name.startswith(BUILTIN_STEP_TABLE_PREFIX)
        }

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
        return pd.DataFrame(self.rows, columns=list(BUILTIN_STEP_COLUMNS))


class BuiltinStepLosses(Callback):
    """Adds each step's loss to the bound ``BuiltinDimReduceStep``'s table (1-based epoch, global step, loss)."""

    def bind(self, step: TrainStep) -> None:
        self.step = step

    def on_train_begin(self, total_epochs: int, steps_per_epoch: int, start_epoch: int) -> None:
        self.steps_per_epoch = steps_per_epoch

    def on_step_end(self, epoch: int, step: int, loss: float) -> None:
        self.step.rows.append({"epoch": epoch + 1, "step": epoch * self.steps_per_epoch + step + 1, "loss": loss})


def train_stage2_builtin(
    context: TrainingContext,
    stage1_checkpoint: Checkpoint,
    pca_matrix: np.ndarray,
    stage2: Stage2Params,
    *,
    callbacks: Sequence[Callback] = (),
    run_handoff=None,
) -> tuple[TrainingResult, pd.DataFrame]:
    """Stage 2 with ``mindspore.boost``'s DimReduce, in a process of its own, through the engine.

    Same epochs, data, evaluation, checkpoints and resume as ``stage2.train_stage2``; ``callbacks`` (picklable)
    run in that process, where ``run_handoff`` (``distributed.launch.RunHandoff``, optional) makes the caller's
    tracking run active. Returns the training's result (without its step) and the per-step loss table.
    """
    with tempfile.TemporaryDirectory(prefix="builtin_stage2_") as folder:
        work = Path(folder)
        save_checkpoint(stage1_checkpoint, work / "stage1.ckpt")
        np.save(work / "pca.npy", pca_matrix)  # boost reads it by path and writes its slices beside it
        logger.info("Stage 2 with mindspore.boost's DimReduce in a process of its own")
        return run_in_child_process(
            _train_stage2_builtin_here,
            {
                "context": context,
                "start_path": work / "stage1.ckpt",
                "pca_path": work / "pca.npy",
                "stage2": stage2,
                "callbacks": list(callbacks),
                "run_handoff": run_handoff,
            },
            work,
        )


class BuiltinStage2StepFactory(ImageStepFactory):
    """mindspore.boost's DimReduce steps from stage 1's weights, with ``config`` (``builtin_dim_reduce_config``)."""

    def __init__(self, context: TrainingContext, stage2: Stage2Params, config):
        self.context, self.stage2, self.config = context, stage2, config
        classes = num_classes(context.network, context.class_index)
        self.loss_fn = CrossEntropySmooth(classes, stage2.label_smoothing)

    def make_step(self, start: Checkpoint, steps_per_epoch: int) -> BuiltinDimReduceStep:
        net = network_from_checkpoint(self.context.network, self.context.class_index, start, "of stage 1")
        return BuiltinDimReduceStep(net, self.loss_fn, self.config, loss_scale=self.stage2.loss_scale)


def _train_stage2_builtin_here(
    context: TrainingContext,
    start_path: Path,
    pca_path: Path,
    stage2: Stage2Params,
    callbacks: Sequence[Callback],
    run_handoff,
) -> tuple[TrainingResult, pd.DataFrame]:
    """The process side of ``train_stage2_builtin``."""
    manifest, network, data, runtime = context.manifest, context.network, context.data, context.runtime
    with run_handoff.attached() if run_handoff is not None else nullcontext():
        configure(runtime)
        start = load_checkpoint(start_path)
        pca_matrix = np.load(pca_path)
        run_id = fingerprint(
            network, data, stage2.model_dump(exclude={"checkpoint"}), runtime.seed, 1, start, pca_matrix
        )
        config = builtin_dim_reduce_config(
            pca_path,
            n_components=pca_matrix.shape[0],
            rho=stage2.rho,
            gamma=stage2.gamma,
            alpha=stage2.alpha,
            sigma=stage2.sigma,
            device_number=1,  # one process: trainlib.params refuses mindspore with distributed.worker_num above 1
        )
        factory = BuiltinStage2StepFactory(context, stage2, config)
        validation = val_data(manifest, data)
        checkpoint = stage2.checkpoint
        result = train(
            TrainingSpec(
                epochs=int(start.metadata.get("epoch", 0)) + stage2.epochs,
                batch_size=stage2.batch_size,
                examples_per_step=stage2.batch_size,
                data_seed=runtime.seed,
            ),
            train_data(manifest, data, stage2.batch_size, runtime.seed),
            factory,
            start=start,
            fingerprint=run_id,
            checkpoints=Checkpointing.of(checkpoint),
            validation=validation,
            callbacks=[BuiltinStepLosses(), *callbacks],
            continue_from_start=True,
            metadata={"network": network.name, "training": "stage2"},
        )
        return result, result.step.table()  # the result travels back without its step (TrainingResult)
