"""The THOR recipe on the engine: this project's preconditioner + Momentum, or MindSpore's ``nn.thor``.

Recipe (models repo official/cv/ResNet, THOR): the THOR lr and damping schedules (``thor.lr``, ``thor.damping``:
shapes thor and exponential), label smoothing, a fixed loss scale, the last BatchNorm gamma of each block
zero-initialised (``thor.zero_init_last_bn_gamma``), statistics and inverses refreshed every
``frequency`` steps. ``implementation: trainlib``: ``optim.thor.step`` (the gradients of every Conv2d/Dense
preconditioned, then the baseline's Momentum), a step the engine calls per batch; ``thor.precondition: false``
keeps all of that recipe but passes the gradients to the Momentum unchanged (what the curvature adds);
``implementation: mindspore_builtin``: ``nn.thor`` trained by ``ModelThor`` through ``engine.model_bridge``
(Ascend/GPU). ``ThorStepFactory`` builds the steps and evaluates them; ``train_thor`` hands it to the engine
(``engine.loop.train``), which runs everything else (resume, epochs, evaluation, checkpoints, rows), like
``recipes.momentum``.

Both keep the engine's one state layout: network weights (BatchNorm statistics included) under their
names; under ``optimizer.`` the optimizer's state and THOR's buffers (statistics, inverses, counters).
Each epoch's row adds ``thor/damping`` and, for ``own``, ``thor/second_order_step_s`` and
``thor/reuse_step_s`` (median seconds of the epoch's steps of each kind, data loading included),
``thor/second_order_steps``, ``thor/trace_skips`` and ``thor/inverses_computed`` (totals since the start of
training; 0 with ``thor.precondition: false``, whose rows have no step times of either kind).
"""

from __future__ import annotations

import logging
import statistics
import time
from collections.abc import Sequence

import numpy as np
from mindspore import nn

from trainlib.engine.callbacks import Callback
from trainlib.engine.checkpoint import OPTIMIZER_PREFIX, Checkpoint
from trainlib.engine.evaluation import evaluate
from trainlib.engine.loop import TrainingResult
from trainlib.engine.model_bridge import ModelTrainStep
from trainlib.engine.step import TrainStep
from trainlib.models.loss import CrossEntropySmooth
from trainlib.optim.schedules import per_step
from trainlib.optim.thor.capture import is_statistic
from trainlib.optim.thor.step import ThorStep, create_thor_step
from trainlib.params import BertThorTraining, ThorParams
from trainlib.recipes import classifier
from trainlib.recipes.context import TrainingContext

logger = logging.getLogger(__name__)

THOR_DAMPING = "thor/damping"  # damping of the epoch's last step
THOR_SECOND_ORDER_STEP_S = "thor/second_order_step_s"  # median over the epoch's second-order steps
THOR_REUSE_STEP_S = "thor/reuse_step_s"  # median over the epoch's reuse steps
THOR_SECOND_ORDER_STEPS = "thor/second_order_steps"  # since the start of training
THOR_TRACE_SKIPS = "thor/trace_skips"  # (layer, second-order step) pairs that kept old inverses
THOR_INVERSES_COMPUTED = "thor/inverses_computed"  # (layer, second-order step) pairs that computed inverses


def thor_schedules(thor: ThorParams | BertThorTraining, steps_per_epoch: int) -> tuple[np.ndarray, np.ndarray]:
    """Per-step learning rate and damping of ``thor.epochs`` epochs of ``steps_per_epoch`` steps."""
    lr = per_step(thor.lr, epochs=thor.epochs, steps_per_epoch=steps_per_epoch)
    damping = per_step(thor.damping, epochs=thor.epochs, steps_per_epoch=steps_per_epoch)
    return lr, damping


def trainlib_thor_step(
    net, loss_fn, thor: ThorParams, lr_per_step: np.ndarray, damping: np.ndarray, *, rank_size: int
) -> TrainlibThorStep:
    """This project's THOR for ``net`` with the recipe's settings (``thor``) and schedules."""
    step = create_thor_step(
        net,
        nn.WithLossCell(net, loss_fn),
        lr_per_step,
        damping,
        thor,
        rank_size=rank_size,
        precondition=thor.precondition,
        trace_rule=tuple(thor.trace_rule) if thor.trace_rule else None,
    )
    return TrainlibThorStep(step)


class TrainlibThorStep(TrainStep):
    """This project's THOR as the engine's step: ``ThorStep`` per batch; the state adds the preconditioner's buffers.

    The wrapped layers' statistics buffers (``thor_stats.*``) are network parameters of the training net but
    optimizer state in the checkpoint (``optimizer.thor.thor_stats.*``), so the saved network loads into a plain one.
    With ``thor.precondition`` false there is no preconditioner (``preconditioner`` None): the state is the
    optimizer's alone.
    """

    def __init__(self, thor: ThorStep):
        super().__init__(thor, thor.net, thor.optimizer, thor.lr_per_step, thor.loss_scale)
        self.thor = thor
        self.preconditioner = thor.preconditioner
        self.damping = thor.damping
        self.title = "THOR" if thor.preconditioner is not None else "THOR's recipe without the preconditioner"

    def next_graph(self) -> tuple[object, str]:
        # THOR compiles its second-order step and the steps between separately, each on its first use
        if self.preconditioner is None:
            kind = "first order: the preconditioner is off"
        else:
            kind = "second-order step" if self.preconditioner.second_order_now() else "step reusing the inverses"
        return self, f"the training graph (THOR, {kind})"

    def capture(self) -> dict[str, np.ndarray]:
        params = {name: value for name, value in super().capture().items() if not is_statistic(name)}
        if self.preconditioner is not None:
            params.update({OPTIMIZER_PREFIX + name: value for name, value in self.preconditioner.state().items()})
        return params

    def restore(self, checkpoint: Checkpoint) -> None:
        super().restore(checkpoint)
        if self.preconditioner is not None:
            self.preconditioner.load_state(checkpoint.optimizer_state())


class MindsporeThorStep(ModelTrainStep):
    """``nn.thor`` trained by ``ModelThor``; the state is ``capture_thor_state``'s (statistics and inverses under
    ``optimizer.``, the weights as float32 network parameters). ``nn.thor`` keeps its counters to itself:
    ``preconditioner`` is None."""

    title = "THOR (MindSpore nn.thor)"
    preconditioner = None

    def __init__(self, net, loss_fn, optimizer, lr_per_step, damping, thor: ThorParams):
        from trainlib.optim.thor.mindspore_thor import create_thor_model

        super().__init__(
            lambda: create_thor_model(net, loss_fn, optimizer, thor),
            net,
            optimizer,
            lr_per_step,
            thor.loss_scale,
            thor.mindspore_builtin.dataset_sink_mode,
        )
        self.damping = np.asarray(damping)

    def capture(self) -> dict[str, np.ndarray]:
        from trainlib.optim.thor.mindspore_thor import capture_thor_state

        return capture_thor_state(self.network, self.optimizer, {}).params

    def restore(self, checkpoint: Checkpoint) -> None:
        from trainlib.optim.thor.mindspore_thor import restore_thor_state

        restore_thor_state(self.network, self.optimizer, checkpoint)


class ThorFigures(Callback):
    """Adds THOR's figures to each epoch's row: the damping of its last step (``step.damping``) and, with
    this project's preconditioner (``step.preconditioner``), the median step time of each kind and the counters.
    With the preconditioner off (``thor.precondition: false``) the counters are 0 and no step is of either kind;
    ``nn.thor`` keeps its counters to itself, so its rows have none."""

    def bind(self, step: TrainStep) -> None:
        self.damping = step.damping
        self.preconditioner = step.preconditioner
        self.first_order = isinstance(step, TrainlibThorStep) and step.preconditioner is None
        self.steps_per_epoch = 0

    def on_train_begin(self, total_epochs: int, steps_per_epoch: int, start_epoch: int) -> None:
        self.steps_per_epoch = steps_per_epoch

    def on_epoch_begin(self, epoch: int) -> None:
        self.times: dict[str, list[float]] = {THOR_SECOND_ORDER_STEP_S: [], THOR_REUSE_STEP_S: []}
        self.last = time.perf_counter()
        self.second_order_seen = self._second_order_steps()

    def _second_order_steps(self) -> int:
        return 0 if self.preconditioner is None else self.preconditioner.second_order_steps

    def on_step_end(self, epoch: int, step: int, loss: float) -> None:
        now = time.perf_counter()
        done = self._second_order_steps()
        kind = THOR_SECOND_ORDER_STEP_S if done > self.second_order_seen else THOR_REUSE_STEP_S
        self.second_order_seen = done
        self.times[kind].append(now - self.last)
        self.last = now

    def on_step_evaluation(self, row) -> None:
        self.last = time.perf_counter()  # the next step's time starts after the evaluation

    def epoch_metrics(self, epoch: int) -> dict[str, float]:
        last_step = min((epoch + 1) * self.steps_per_epoch, len(self.damping)) - 1
        figures = {THOR_DAMPING: float(self.damping[last_step])}
        if self.preconditioner is not None:
            figures[THOR_SECOND_ORDER_STEPS] = float(self.preconditioner.second_order_steps)
            figures[THOR_TRACE_SKIPS] = float(self.preconditioner.trace_skips)
            figures[THOR_INVERSES_COMPUTED] = float(self.preconditioner.inverses_computed)
            figures.update({kind: statistics.median(times) for kind, times in self.times.items() if times})
        elif self.first_order:
            figures.update(dict.fromkeys((THOR_SECOND_ORDER_STEPS, THOR_TRACE_SKIPS, THOR_INVERSES_COMPUTED), 0.0))
        return figures

    def on_train_end(self) -> None:
        if self.preconditioner is not None:
            logger.info(
                "THOR: %d second-order steps, %d reuse steps, %d trace-rule skips",
                self.preconditioner.second_order_steps,
                self.preconditioner.reuse_steps,
                self.preconditioner.trace_skips,
            )


class ThorStepFactory(classifier.ImageStepFactory):
    """THOR's steps (``engine.step.StepFactory``): the network from the start weights, the section's lr and damping
    schedules (``thor_schedules``), label smoothing, and this project's THOR (``trainlib_thor_step``: the section
    itself is its settings) or MindSpore's ``nn.thor`` (``implementation: mindspore_builtin``)."""

    def __init__(self, context: TrainingContext, thor: ThorParams):
        self.context, self.thor = context, thor
        self.classes = classifier.num_classes(context.network, context.class_index)  # a mismatch stops before any work

    def make_step(self, start: Checkpoint, steps_per_epoch: int) -> TrainStep:
        context, thor = self.context, self.thor
        network, class_index = context.network, context.class_index
        net = classifier.network_from_checkpoint(network, class_index, start, "start checkpoint")
        lr_per_step, damping = thor_schedules(thor, steps_per_epoch)
        loss_fn = CrossEntropySmooth(self.classes, thor.label_smoothing)
        if thor.precondition:
            logger.info(
                "THOR (%s) training of %s, batch %d, frequency %d, lr %.4g -> %.4g, damping %.4g -> %.4g",
                thor.implementation,
                network.name,
                thor.batch_size,
                thor.frequency,
                lr_per_step[0],
                lr_per_step[-1],
                damping[0],
                damping[-1],
            )
        else:
            logger.info(
                "THOR's recipe without the preconditioner (thor.precondition false: gradients straight to Momentum) "
                "training of %s, batch %d, lr %.4g -> %.4g",
                network.name,
                thor.batch_size,
                lr_per_step[0],
                lr_per_step[-1],
            )
        if thor.implementation == "mindspore_builtin":
            from trainlib.optim.thor.mindspore_thor import create_thor_optimizer

            optimizer = create_thor_optimizer(net, lr_per_step, damping, thor)
            return MindsporeThorStep(net, loss_fn, optimizer, lr_per_step, damping, thor)
        return trainlib_thor_step(net, loss_fn, thor, lr_per_step, damping, rank_size=context.distributed.worker_num)

    def evaluate(self, step: TrainStep, dataset) -> dict[str, float]:
        if isinstance(step, TrainlibThorStep):  # the wrapped layers capture nothing outside a THOR step
            return evaluate(step.network, dataset)
        # nn.thor converted the network and amp cast it: evaluate a plain float32 copy of its weights
        network, class_index = self.context.network, self.context.class_index
        plain = classifier.network_from_checkpoint(network, class_index, Checkpoint(step.capture()), "the THOR network")
        return evaluate(plain, dataset)


def train_thor(
    context: TrainingContext,
    start: Checkpoint,
    thor: ThorParams,
    *,
    callbacks: Sequence[Callback] = (),
) -> TrainingResult:
    """THOR training from ``start``'s weights for ``thor.epochs`` epochs (resuming this training's newest
    checkpoint in ``thor.checkpoint.dir``, if any). ``callbacks`` run on every rank (e.g.
    ``tracking.EpochMetrics``). Returns the final full checkpoint, every epoch's row and the end figures."""
    classifier.configure(context.runtime)
    # nn.thor's own options do not change this project's THOR
    run_id = classifier.training_fingerprint(
        context, thor, start, exclude={"mindspore_builtin"} if thor.implementation == "trainlib" else ()
    )
    return classifier.train_classifier(
        context,
        thor,
        ThorStepFactory(context, thor),
        name="thor" if thor.precondition else "thor_first_order",
        start=start,
        fingerprint=run_id,
        epochs=thor.epochs,
        callbacks=[ThorFigures(), *callbacks],
    )
