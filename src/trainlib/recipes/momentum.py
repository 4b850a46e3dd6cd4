"""The Momentum recipe on the engine: baseline, adasum, dim_reduce stage 1 and its control.

Recipe (models repo official/cv/ResNet): Momentum with weight decay on convolution and dense weights
only, the configured per-step lr schedule (its ``peak`` scaled by ``worker_num / reference_devices``),
label smoothing and a fixed loss scale. Optional: mindspore.boost's LessBN, gradient freeze or gradient
accumulation in the step (``boost``), or Adasum of the ranks' weight deltas (``adasum``: own collectives,
or boost's Adasum through ``Model.train``). ``MomentumStepFactory`` builds the steps; ``train_momentum`` hands it
to the engine (``engine.loop.train``), which runs everything else (resume, epochs, evaluation, checkpoints); other
recipes follow the same shape.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence

from trainlib.boost.options import boost_enabled, build_train_step
from trainlib.distributed.launch import rank_context
from trainlib.engine.callbacks import Callback
from trainlib.engine.checkpoint import Checkpoint
from trainlib.engine.loop import TrainingResult
from trainlib.engine.model_bridge import ModelTrainStep
from trainlib.engine.step import TrainStep
from trainlib.models.loss import CrossEntropySmooth
from trainlib.optim.momentum import create_momentum
from trainlib.optim.schedules import per_step
from trainlib.params import AdasumParams, BaselineParams, BoostParams, MomentumTraining, RuntimeParams
from trainlib.recipes import classifier
from trainlib.recipes.context import TrainingContext

logger = logging.getLogger(__name__)


class MomentumStepFactory(classifier.ImageStepFactory):
    """The Momentum recipe's steps (``engine.step.StepFactory``): the network from the start weights, the section's
    per-step lr over ``schedule_epochs`` epochs, ``create_optimizer``'s optimizer (Momentum; a recipe of the same
    state overrides it: ``lars.LarsStepFactory``), label smoothing, the loss scale, and ``boost``'s or ``adasum``'s
    step."""

    def __init__(
        self,
        context: TrainingContext,
        training: MomentumTraining,
        *,
        schedule_epochs: int,
        boost: BoostParams | None = None,
        adasum: AdasumParams | None = None,
    ):
        self.context, self.training, self.schedule_epochs = context, training, schedule_epochs
        self.boost, self.adasum = boost, adasum
        self.classes = classifier.num_classes(context.network, context.class_index)  # a mismatch stops before any work

    def create_optimizer(self, net, lr_per_step):
        """The optimizer over ``net``'s parameters with ``lr_per_step``: Momentum with the section's weight decay."""
        training = self.training
        return create_momentum(net, lr_per_step, training.momentum, training.weight_decay, training.loss_scale)

    def make_step(self, start: Checkpoint, steps_per_epoch: int) -> TrainStep:
        context, training = self.context, self.training
        network, class_index = context.network, context.class_index
        net = classifier.network_from_checkpoint(network, class_index, start, "start checkpoint")
        lr_per_step = per_step(
            training.lr,
            epochs=self.schedule_epochs,
            steps_per_epoch=steps_per_epoch,
            devices=context.distributed.worker_num,
        )
        optimizer = self.create_optimizer(net, lr_per_step)
        loss_fn = CrossEntropySmooth(self.classes, training.label_smoothing)
        logger.info(
            "%s training of %s: %s schedule, lr max %.4g, loss scale %g",
            type(optimizer).__name__,
            network.name,
            training.lr.shape,
            lr_per_step.max(),
            training.loss_scale,
        )
        adasum = self.adasum
        if adasum is not None and adasum.implementation == "mindspore_builtin":
            from trainlib.optim.adasum.mindspore_adasum import builtin_adasum_model

            step = ModelTrainStep(
                lambda: builtin_adasum_model(net, loss_fn, optimizer, training.loss_scale),
                net,
                optimizer,
                lr_per_step,
                training.loss_scale,
            )
            step.title = "Momentum with Adasum (mindspore.boost)"
            return step
        step = MomentumStep(
            net, loss_fn, optimizer, lr_per_step, training.loss_scale, context.runtime, self.boost, adasum
        )
        step.title = type(optimizer).__name__  # the optimizer that steps (LARS's, or Momentum)
        return step


def train_momentum(
    context: TrainingContext,
    start: Checkpoint,
    training: MomentumTraining,
    *,
    name: str,
    epochs: int | None = None,
    schedule_epochs: int | None = None,
    continue_from_start: bool = False,
    boost: BoostParams | None = None,
    adasum: AdasumParams | None = None,
    callbacks: Sequence[Callback] = (),
    leader_callbacks: Sequence[Callback] = (),
    factory: type[MomentumStepFactory] = MomentumStepFactory,
) -> TrainingResult:
    """Momentum training from ``start`` up to epoch ``epochs`` (default ``training.epochs``) of a
    ``schedule_epochs``-epoch lr schedule (default: the training's own epochs).

    ``training``: the recipe's section (batch size, lr, momentum, weight decay, label smoothing, loss scale,
    eval interval, checkpoint folder). Without ``continue_from_start`` only ``start``'s weights are taken
    and training starts at epoch 0; with it, ``start``'s momentum, step and epoch are continued (the
    dim_reduce control). ``boost``: mindspore.boost's options in the step (None: off); ``adasum``: combine the
    ranks' weight deltas by Adasum (None: gradients averaged). ``callbacks`` run on every rank (e.g.
    ``tracking.EpochMetrics``, which logs only where a run is active); ``leader_callbacks`` only on each node's
    first worker (files). ``name`` names the training in its checkpoints' metadata (``training``). ``factory``:
    the steps' factory, ``MomentumStepFactory`` or one of another optimizer of the same state (``moments``,
    ``global_step``; LARS). Returns the final full checkpoint, every epoch's row and the end-of-training figures.
    """
    epochs = training.epochs if epochs is None else epochs
    schedule_epochs = epochs if schedule_epochs is None else schedule_epochs
    classifier.configure(context.runtime)
    run_id = classifier.training_fingerprint(
        context,
        training,
        epochs,
        schedule_epochs,
        continue_from_start,
        start,
        *([boost] if boost_enabled(boost) else []),  # all off: the fingerprint of a plain run
    )
    leader = list(leader_callbacks) if rank_context().is_node_leader else []
    return classifier.train_classifier(
        context,
        training,
        factory(context, training, schedule_epochs=schedule_epochs, boost=boost, adasum=adasum),
        name=name,
        start=start,
        fingerprint=run_id,
        epochs=epochs,
        schedule_epochs=schedule_epochs,
        continue_from_start=continue_from_start,
        callbacks=[*callbacks, *leader],
    )


def train_baseline(
    context: TrainingContext,
    start: Checkpoint,
    baseline: BaselineParams,
    *,
    boost: BoostParams,
    callbacks: Sequence[Callback] = (),
) -> TrainingResult:
    """The baseline recipe: ``baseline.epochs`` epochs of its whole schedule from ``start``'s weights, with
    mindspore.boost's ``boost`` options in the step."""
    return train_momentum(context, start, baseline, name="baseline", boost=boost, callbacks=callbacks)


def train_adasum(
    context: TrainingContext,
    start: Checkpoint,
    adasum: AdasumParams,
    *,
    callbacks: Sequence[Callback] = (),
) -> TrainingResult:
    """The adasum recipe: ``adasum.epochs`` epochs of Momentum from ``start``'s weights, the ranks' weight deltas
    combined by Adasum (``adasum.combine_by_adasum``), or their gradients averaged (plain data parallelism, the
    study's reference on the same ranks)."""
    name, combined_by = ("adasum", adasum) if adasum.combine_by_adasum else ("allreduce", None)
    return train_momentum(context, start, adasum, name=name, adasum=combined_by, callbacks=callbacks)


class MomentumStep(TrainStep):
    """The per-batch Momentum step: plain, with boost's options, or with Adasum across the ranks.

    The cell is built in ``prepare``, after the optimizer state is restored: gradient freeze takes the
    rest of the lr schedule from the optimizer's step count.
    """

    title = "Momentum"

    def __init__(
        self,
        net,
        loss_fn,
        optimizer,
        lr_per_step,
        loss_scale: float,
        runtime: RuntimeParams,
        boost: BoostParams | None,
        adasum: AdasumParams | None,
    ):
        super().__init__(None, net, optimizer, lr_per_step, loss_scale)
        self.loss_fn = loss_fn
        self.device_target = runtime.device_target
        self.boost = boost
        self.adasum = adasum

    def prepare(self) -> None:
        from mindspore import nn

        with_loss = nn.WithLossCell(self.network, self.loss_fn)
        if self.adasum is None:
            cell = build_train_step(with_loss, self.optimizer, self.loss_scale, self.boost, self.device_target)
        else:
            from trainlib.optim.adasum.step import AdasumTrainStep  # loads the collectives: only when training

            ranks = rank_context()
            logger.info("Adasum of the weight deltas across %d ranks (exchange %s)", ranks.size, self.adasum.exchange)
            cell = AdasumTrainStep(
                with_loss,
                self.optimizer,
                sens=self.loss_scale,
                rank=ranks.rank,
                rank_size=ranks.size,
                exchange=None if self.adasum.exchange == "auto" else self.adasum.exchange,
                average_statistics=self.adasum.average_batchnorm_statistics,
            )
        cell.set_train(True)
        self.run = cell
