"""The one training entry point of every recipe: ``train``.

A recipe says how to build its step and how to evaluate it (``step.StepFactory``: ``make_step(start checkpoint, steps
per epoch) -> TrainStep`` with network, optimizer and schedule; ``evaluate(step, dataset)``); ``train`` runs the rest,
the same for all:

1. find the newest checkpoint of this training (same ``fingerprint``, unfinished) in
   ``checkpoints.directory``; resuming, it is the start and its ``history`` the rows so far;
2. build the step from the start weights and restore its optimizer state (when resuming, or when
   ``continue_from_start`` asks to continue another training's optimizer, e.g. the dim_reduce control);
3. run the epochs, as Lightning's loops do: the fit loop (``fit.FitLoop``: the epochs, data order seeded per epoch
   with ``data_seed + epoch``, so a resumed run sees the data an uninterrupted one would) runs each epoch with the
   epoch loop (``epochs.EpochLoop``: one call of the step per batch, timing, NaN/Inf and loss-scale overflow checks,
   evaluation every ``eval_interval`` epochs and after the last, the epoch's row); the step trains on one batch.
   Callbacks (progress, checkpoints every ``checkpoints.every_epochs`` epochs written by the node's first worker,
   the newest ``keep_last`` kept, the recipe's own) are called through one ``callbacks.CallbackList``;
4. return the final state (same layout as the periodic checkpoints, its ``checkpoint_dir`` metadata naming
   the periodic checkpoints' folder) and every epoch's row from epoch 1. Whoever saves the final state then
   calls ``resume.remove_finished_checkpoints`` (the project's hooks do, after the catalog saved it).

Before its first step a training logs one start line (what it trains, epochs, steps per epoch, batch, the
lr it starts and ends with), and in GRAPH mode one "Compiling …" line before each long compile
(``progress.announce_compile``): the epoch loop's, before the first call of each graph the step names
(``TrainStep.next_graph``: its cell, or for a step of several graphs the one its next call runs).

A step that ``mindspore.Model.train`` must drive (MindSpore's THOR, boost's Adasum) is a
``model_bridge.ModelTrainStep``: its fit loop (``model_bridge.ModelFitLoop``) runs ``Model.train``, which feeds
the same epoch loop, callbacks and checkpoints. ``TrainStep`` is in ``engine.step``, ``TrainingSpec`` and the epoch
loop in ``engine.epochs``, the fit loop in ``engine.fit``.

Per-epoch rows hold ``epoch`` (1-based) and the keys of ``trainlib.metrics.EPOCH_KEYS``, plus the figures callbacks add
(``thor/…``, ``pbfgs/…``) and ``timestamp`` (wall clock at the end of the epoch, seconds since the Unix
epoch, so a resumed run can log the earlier epochs at their real time).
"""

from __future__ import annotations

import json
import logging
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from trainlib.data.folder import dataset_figures
from trainlib.distributed.launch import rank_context, verify_replicas
from trainlib.engine.callbacks import Callback, CallbackList, ConstantFigures, PeriodicCheckpoint, training_observers
from trainlib.engine.checkpoint import Checkpoint, load_checkpoint
from trainlib.engine.epochs import EpochLoop, TrainingSpec
from trainlib.engine.fit import FitLoop
from trainlib.engine.progress import ProgressReporter
from trainlib.engine.resume import CHECKPOINT_DIR_KEY, CHECKPOINT_PREFIX, KEEP_STALE, find_resume_checkpoint
from trainlib.engine.state import HISTORY_KEY, encode_history, history_of
from trainlib.engine.step import StepFactory, TrainStep
from trainlib.metrics import REPLICA_DIVERGENCE, THROUGHPUT_UNITS

logger = logging.getLogger(__name__)

STEP_HISTORY_KEY = "step_history"  # checkpoint metadata: JSON list of the step rows so far


@dataclass(frozen=True)
class Checkpointing:
    """Periodic full checkpoints ``<directory>/epoch_<NNNN>.ckpt`` every ``every_epochs``, newest ``keep_last`` kept;
    of the ``stale-*`` folders (another configuration's checkpoints, moved aside) the newest ``keep_stale``."""

    directory: str | Path
    every_epochs: int = 1
    keep_last: int = 2
    keep_stale: int = KEEP_STALE

    @classmethod
    def of(cls, params) -> Checkpointing:
        """From a recipe's ``checkpoint`` parameters (``params.CheckpointParams``: the same four keys)."""
        return cls(Path(params.dir), params.every_epochs, params.keep_last, params.keep_stale)


@dataclass
class TrainingResult:
    """The final state (the checkpoint layout), every epoch's row from epoch 1, end-of-training figures
    (``distributed/replica_max_abs_diff`` with several ranks), the steps per epoch, every step evaluation's row from
    epoch 1 (``step``, ``val/step_top1``, ``val/step_top5``, ``train/elapsed_s``, ``eval/time_s``) and the trained
    step. A result travels between processes (from an msrun rank back to the node) without its step: MindSpore's
    cells stay in the process that trained."""

    checkpoint: Checkpoint
    history: list[dict[str, float]]
    summary: dict[str, float] = field(default_factory=dict)
    steps_per_epoch: int = 0
    step_history: list[dict[str, float]] = field(default_factory=list)
    step: TrainStep | None = None

    def __getstate__(self) -> dict:
        return {**self.__dict__, "step": None}

    def release(self) -> None:
        """Free the trained step's network, optimizer and graphs (``TrainStep.release``): a process that trains
        again and again (the study) calls it once it is done with ``step``."""
        if self.step is not None:
            self.step.release()
            self.step = None


def train(
    spec: TrainingSpec,
    dataset,
    factory: StepFactory,
    *,
    start: Checkpoint | None = None,
    fingerprint: str = "",
    checkpoints: Checkpointing | None = None,
    validation=None,
    step_validation=None,
    callbacks: Sequence[Callback] = (),
    continue_from_start: bool = False,
    metadata: Mapping[str, int | float | bool | str] | None = None,
) -> TrainingResult:
    """Train ``factory``'s steps from ``start`` (or the newest checkpoint of this training) to ``spec.epochs``.

    ``dataset``: this rank's batched training data. ``factory.make_step(start, steps_per_epoch)`` builds the
    network from ``start``'s weights (None: fresh) and the optimizer for a schedule of
    ``spec.schedule_epochs`` epochs. ``fingerprint`` identifies the configuration and start weights
    (``resume.fingerprint``); with ``checkpoints`` the training resumes from, and writes, periodic
    checkpoints. ``factory.evaluate(step, validation)`` every ``spec.eval_interval`` epochs and after the last (no
    evaluation without ``validation``); ``factory.evaluate(step, step_validation)`` every ``spec.eval_every_steps``
    steps (a fixed val subset), its rows ``step_history``. ``continue_from_start``: ``start`` is another training's
    checkpoint whose optimizer state and epoch this one continues. ``metadata`` goes into every checkpoint beside
    ``epoch``, ``fingerprint`` and ``history``.
    """
    stop = spec.epochs
    schedule = spec.schedule_epochs or spec.epochs
    history: list[dict[str, float]] = []
    step_history: list[dict[str, float]] = []
    resume_from = None
    if checkpoints is not None:
        resume_from = find_resume_checkpoint(
            checkpoints.directory, CHECKPOINT_PREFIX, fingerprint, stop, checkpoints.keep_stale
        )
    if resume_from is not None:
        start = load_checkpoint(resume_from)
        history = history_of(start)
        step_history = json.loads(start.metadata.get(STEP_HISTORY_KEY, "[]"))
        logger.info("Resuming from %s (epoch %d of %d)", resume_from, start.metadata["epoch"], stop)
    continuing = resume_from is not None or continue_from_start
    start_epoch = int(start.metadata.get("epoch", 0)) if continuing and start is not None else 0
    if not start_epoch <= stop <= schedule:
        raise ValueError(f"epochs must satisfy start {start_epoch} <= stop {stop} <= schedule length {schedule}")
    steps_per_epoch = dataset.get_dataset_size()
    if steps_per_epoch == 0:
        raise ValueError("the training dataset yields no full batch")
    step = factory.make_step(start, steps_per_epoch)
    if continuing:
        step.restore(start)
    del start  # the step holds the state now: a checkpoint loaded to resume from is freed while the training runs
    step.prepare()
    logger.info(
        "%s: epochs %d-%d of a %d-epoch schedule, %d steps/epoch, batch %d per rank, %s",
        step.title,
        start_epoch + 1,
        stop,
        schedule,
        steps_per_epoch,
        spec.batch_size,
        step.lr_summary(start_epoch * steps_per_epoch, stop * steps_per_epoch - 1),
    )

    def capture(epoch: int) -> Checkpoint:
        state = {**(metadata or {}), "epoch": epoch, "fingerprint": fingerprint, HISTORY_KEY: encode_history(history)}
        if checkpoints is not None:  # where the periodic checkpoints are, to remove once the final state is saved
            state[CHECKPOINT_DIR_KEY] = str(checkpoints.directory)
        if step_history:
            state[STEP_HISTORY_KEY] = encode_history(step_history)
        return Checkpoint(step.capture(), state)

    progress = ProgressReporter(spec.batch_size, THROUGHPUT_UNITS[spec.throughput_key])
    chosen: list[Callback] = [progress, ConstantFigures(dataset_figures(dataset)), *callbacks, *training_observers()]
    if checkpoints is not None and rank_context().is_node_leader:  # the other ranks hold the same state
        chosen.append(
            PeriodicCheckpoint(capture, checkpoints.directory, checkpoints.every_epochs, checkpoints.keep_last)
        )
    dispatcher = CallbackList(chosen)
    dispatcher.bind(step)
    if resume_from is not None:
        dispatcher.on_resume(resume_from, history)
        for row in step_history:  # the earlier epochs' step evaluations, e.g. for the run's metrics
            dispatcher.on_step_evaluation(row)
    evaluate = None if validation is None else lambda trained: factory.evaluate(trained, validation)
    evaluate_steps = None if step_validation is None else lambda trained: factory.evaluate(trained, step_validation)
    epoch_loop = EpochLoop(spec, step, steps_per_epoch, dispatcher, evaluate, history, evaluate_steps, step_history)
    _fit_loop_of(step)(epoch_loop, start_epoch).run(dataset)
    return TrainingResult(
        capture(stop), history, _replica_divergence(step.network), steps_per_epoch, step_history, step
    )


def _fit_loop_of(step: TrainStep) -> type[FitLoop]:
    """The fit loop that trains ``step``: ``Model.train``'s for a ``ModelTrainStep``, else one call per batch."""
    from trainlib.engine.model_bridge import ModelFitLoop, ModelTrainStep  # loads mindspore.train: only to train

    return ModelFitLoop if isinstance(step, ModelTrainStep) else FitLoop


def _replica_divergence(network) -> dict[str, float]:
    """With several ranks, how far this rank's trainable weights are from rank 0's (0 when data parallel works)."""
    ranks = rank_context()
    if ranks.size == 1:
        return {}
    divergence = verify_replicas(network)
    if divergence > 0:
        logger.warning("The ranks' trainable weights differ by up to %g after training", divergence)
    else:
        logger.info("The trainable weights are identical on all %d ranks", ranks.size)
    return {REPLICA_DIVERGENCE: divergence}
