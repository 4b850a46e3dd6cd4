"""THOR beyond convolutions: BERT pre-training (masked LM and next sentence) with THOR against the first-order
control of the THOR document's BERT script (models repo ``official/nlp/Bert_thor``), on the one engine.

Data (``text.pretraining``): a corpus of real text (``text.corpus``: by default the Python 3.11 documentation of
Debian's ``python3.11-doc``), split into train and held-out documents before anything is fitted; a WordPiece
tokenizer trained on the train documents (``text.tokenizer``); pre-training examples as BERT's
create_pretraining_data makes them (``text.examples``). The network and its evaluation: ``recipes.language_model``.

Trainings, each through ``engine.loop.train`` (resume, checkpoints, per-epoch rows, evaluation, callbacks):

* ``train_bert_thor``: this project's THOR preconditioner over every ``nn.Dense`` of the network (attention
  query/key/value/output projections, feed-forward, pooler, masked-LM transform, next-sentence classifier), then
  Momentum; the embeddings (word, position, token type; the word table is tied to the masked-LM decoder) and
  LayerNorm take the plain gradient (docs/thor-bert.md); polynomial lr and damping without warm-up
  (``get_bert_thor_lr``, ``get_bert_thor_damping``); weight decay except on LayerNorm and biases (the script's
  ``decay_filter``).
* ``train_bert_control``: AdamWeightDecay or Lamb with the warm-up polynomial lr (``BertLearningRate``), the same
  decay filter.

``train_bert`` trains either by its section (the thor_bert pipeline's template, the study).

Each epoch's row has the shared training keys (``train/loss``, ``train/lr``, ``train/sequences_per_s`` in place of
images/s, times) and the held-out ``val/mlm_accuracy``, ``val/mlm_loss``, ``val/nsp_accuracy``; THOR's rows add
``thor/…`` as the image recipe's do. The network is saved under the names of ``BertPreTraining`` (the statistics
THOR adds are optimizer state), so a checkpoint loads into a plain network for evaluation.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence

from trainlib.distributed.launch import rank_context
from trainlib.engine.callbacks import Callback
from trainlib.engine.checkpoint import Checkpoint
from trainlib.engine.epochs import TrainingSpec
from trainlib.engine.loop import Checkpointing, TrainingResult, train
from trainlib.engine.resume import fingerprint
from trainlib.engine.step import TrainStep
from trainlib.metrics import LANGUAGE_EVALUATION, LANGUAGE_STEP_EVALUATION, TRAIN_SEQUENCES_PER_S
from trainlib.models.bert import BertNetworkWithLoss, BertPreTraining, mlm_metrics
from trainlib.optim.gradients import FirstOrderStep, UnscaledGradients
from trainlib.optim.momentum import decay_groups, decays_unless_layernorm_or_bias
from trainlib.optim.schedules import per_step
from trainlib.optim.thor.step import ThorStep, create_thor_step
from trainlib.params import BertControlTraining, BertThorTraining
from trainlib.recipes.classifier import configure
from trainlib.recipes.context import LanguageModelContext
from trainlib.recipes.language_model import (
    NETWORK_NAME,
    CollapseWatch,
    bert_from_checkpoint,
    control_optimizer,
    held_out_dataset,
)
from trainlib.recipes.thor import ThorFigures, TrainlibThorStep, thor_schedules
from trainlib.text.dataset import create_text_dataset
from trainlib.text.examples import most_frequent_token_accuracy

logger = logging.getLogger(__name__)


class BertStepFactory:
    """A BERT training's steps (``engine.step.StepFactory``): the network from the start weights, then the
    training's own optimizer step (``step_for``: THOR's, or the control's); evaluated by the held-out masked-LM and
    next-sentence figures."""

    def __init__(self, context: LanguageModelContext):
        self.context = context

    def step_for(self, net: BertPreTraining, steps_per_epoch: int) -> TrainStep:
        raise NotImplementedError

    def make_step(self, start: Checkpoint, steps_per_epoch: int) -> TrainStep:
        context = self.context
        net = bert_from_checkpoint(context.network, context.vocab_size, start, "start checkpoint")
        return self.step_for(net, steps_per_epoch)

    def evaluate(self, step: TrainStep, dataset) -> dict[str, float]:
        return mlm_metrics(step.network, dataset)


class BertThorStepFactory(BertStepFactory):
    """THOR on BERT: every Dense layer preconditioned, then Momentum (``thor_step_of``)."""

    def __init__(self, context: LanguageModelContext, thor: BertThorTraining):
        super().__init__(context)
        self.thor = thor

    def step_for(self, net: BertPreTraining, steps_per_epoch: int) -> TrainStep:
        rank_size = self.context.distributed.worker_num
        return TrainlibThorStep(thor_step_of(self.thor, net, steps_per_epoch, rank_size=rank_size))


class BertControlStepFactory(BertStepFactory):
    """The first-order control: AdamWeightDecay or Lamb with the warm-up polynomial lr, LayerNorm and biases not
    decayed."""

    def __init__(self, context: LanguageModelContext, control: BertControlTraining):
        super().__init__(context)
        self.control = control

    def step_for(self, net: BertPreTraining, steps_per_epoch: int) -> TrainStep:
        from mindspore import Tensor

        control = self.control
        lr_per_step = per_step(control.lr, epochs=control.epochs, steps_per_epoch=steps_per_epoch)
        groups = decay_groups(net, control.weight_decay, decays_unless_layernorm_or_bias)
        optimizer_class = control_optimizer(control)
        optimizer = optimizer_class(groups, learning_rate=Tensor(lr_per_step), eps=control.eps)
        gradients = UnscaledGradients(
            BertNetworkWithLoss(net), optimizer.parameters, control.loss_scale, self.context.distributed.worker_num
        )
        net.set_train(True)
        step = TrainStep(FirstOrderStep(gradients, optimizer), net, optimizer, lr_per_step, control.loss_scale)
        step.title = f"BERT first-order control ({optimizer_class.__name__})"
        return step


def _train(
    context: LanguageModelContext,
    start: Checkpoint,
    section: BertThorTraining | BertControlTraining,
    factory: BertStepFactory,
    *,
    name: str,
    callbacks: Sequence[Callback],
) -> TrainingResult:
    """What both BERT trainings share: data, evaluation, checkpoints, through the engine with ``factory``'s steps;
    ``name`` names the training in its checkpoints' metadata (``training``). Every held-out evaluation is also
    read against the most frequent token's accuracy (``CollapseWatch``: the rows' and the summary's
    ``thor_bert/collapsed``)."""
    configure(context.runtime)
    ranks = rank_context()
    excluded = {"checkpoint", "eval_interval", "eval_every_steps"}
    run_id = fingerprint(
        NETWORK_NAME,
        context.network,
        context.vocab_size,
        context.train_examples["input_ids"],
        section.model_dump(exclude=excluded),
        context.runtime.seed,
        context.distributed.worker_num,
        start,
    )
    step_subset = held_out_dataset(context, context.step_eval_examples) if section.eval_every_steps else None
    held_out = held_out_dataset(context)
    spec = TrainingSpec(
        epochs=section.epochs,
        batch_size=section.batch_size,
        examples_per_step=section.batch_size * context.distributed.worker_num,
        eval_interval=section.eval_interval,
        data_seed=context.runtime.seed,
        eval_every_steps=section.eval_every_steps,
        throughput_key=TRAIN_SEQUENCES_PER_S,
        evaluation_keys=LANGUAGE_EVALUATION,
        step_evaluation_keys=LANGUAGE_STEP_EVALUATION,
    )
    dataset = create_text_dataset(
        context.train_examples,
        batch_size=section.batch_size,
        training=True,
        rank=ranks.rank,
        rank_size=ranks.size,
        seed=context.runtime.seed,
        batch_key=f"thor_bert.{name}.batch_size",
    )
    most_frequent = most_frequent_token_accuracy(
        context.train_examples, context.held_out_examples, context.vocabulary, subset=context.step_eval_examples
    )
    watch = CollapseWatch(most_frequent, f"thor_bert {name}")
    result = train(
        spec,
        dataset,
        factory,
        start=start,
        fingerprint=run_id,
        checkpoints=Checkpointing.of(section.checkpoint),
        validation=held_out,
        step_validation=step_subset,
        callbacks=[watch, *callbacks],
        metadata={"network": NETWORK_NAME, "training": name},
    )
    result.summary.update(watch.summary())
    return result


def thor_step_of(thor: BertThorTraining, net: BertPreTraining, steps_per_epoch: int, *, rank_size: int) -> ThorStep:
    """THOR's step for ``net`` (every Dense layer preconditioned, then Momentum) with ``thor``'s schedules over
    ``thor.epochs`` epochs of ``steps_per_epoch`` steps."""
    lr_per_step, damping = thor_schedules(thor, steps_per_epoch)
    logger.info(
        "THOR on BERT: frequency %d, lr %.4g -> %.4g, damping %.4g -> %.4g over %d steps",
        thor.frequency,
        lr_per_step[0],
        lr_per_step[-1],
        damping[0],
        damping[-1],
        len(lr_per_step),
    )
    return create_thor_step(
        net,
        BertNetworkWithLoss(net),
        lr_per_step,
        damping,
        thor,
        rank_size=rank_size,
        decays=decays_unless_layernorm_or_bias,
    )


def train_bert_thor(
    context: LanguageModelContext,
    start: Checkpoint,
    thor: BertThorTraining,
    *,
    callbacks: Sequence[Callback] = (),
) -> TrainingResult:
    """THOR (every Dense layer preconditioned, then Momentum) from ``start`` for ``thor.epochs`` epochs, resuming
    this training's newest checkpoint in ``thor.checkpoint.dir``."""
    factory = BertThorStepFactory(context, thor)
    return _train(context, start, thor, factory, name="thor", callbacks=[ThorFigures(), *callbacks])


def train_bert_control(
    context: LanguageModelContext,
    start: Checkpoint,
    control: BertControlTraining,
    *,
    callbacks: Sequence[Callback] = (),
) -> TrainingResult:
    """The first-order control (AdamWeightDecay or Lamb, warm-up polynomial lr) from ``start`` for
    ``control.epochs`` epochs, resuming this training's newest checkpoint in ``control.checkpoint.dir``."""
    factory = BertControlStepFactory(context, control)
    return _train(context, start, control, factory, name="control", callbacks=callbacks)


def train_bert(
    context: LanguageModelContext,
    start: Checkpoint,
    section: BertThorTraining | BertControlTraining,
    *,
    callbacks: Sequence[Callback] = (),
) -> TrainingResult:
    """``section``'s training from ``start``: THOR (``thor_bert.thor``) or the first-order control
    (``thor_bert.control``), chosen by the section's type."""
    if isinstance(section, BertThorTraining):
        return train_bert_thor(context, start, section, callbacks=callbacks)
    return train_bert_control(context, start, section, callbacks=callbacks)
