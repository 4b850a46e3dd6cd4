"""THOR beyond convolutions: BERT pre-training (masked LM and next sentence) with THOR against the first-order
baseline of the THOR document's BERT script (models repo ``official/nlp/Bert_thor``), on the one engine.

Data: a corpus of real text (``text.corpus``: by default the Python 3.11 documentation of Debian's
``python3.11-doc``), split into train and held-out documents before anything is fitted; a WordPiece tokenizer
trained on the train documents (``text.tokenizer``); pre-training examples as BERT's create_pretraining_data
makes them (``text.examples``).

Trainings, each through ``engine.loop.train`` (resume, checkpoints, per-epoch rows, evaluation, callbacks):

* ``train_bert_thor``: this project's THOR preconditioner over every ``nn.Dense`` of the network (attention
  query/key/value/output projections, feed-forward, pooler, masked-LM transform, next-sentence classifier), then
  Momentum; the embeddings (word, position, token type; the word table is tied to the masked-LM decoder) and
  LayerNorm take the plain gradient (docs/thor-bert.md); polynomial lr and damping without warm-up
  (``get_bert_thor_lr``, ``get_bert_thor_damping``); weight decay except on LayerNorm and biases (the script's
  ``decay_filter``).
* ``train_bert_baseline``: AdamWeightDecay or Lamb with the warm-up polynomial lr (``BertLearningRate``), the same
  decay filter.

Each epoch's row has the shared training keys (``train/loss``, ``train/lr``, ``train/sequences_per_s`` in place of
images/s, times) and the held-out ``val/mlm_accuracy``, ``val/mlm_loss``, ``val/nsp_accuracy``; THOR's rows add
``thor/…`` as the image recipe's do. The network is saved under the names of ``BertPreTraining`` (the statistics
THOR adds are optimizer state), so a checkpoint loads into a plain network for evaluation.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace

import numpy as np

from pipelines.distributed.launch import rank_context
from pipelines.engine.callbacks import Callback
from pipelines.engine.checkpoint import Checkpoint, check_compatible
from pipelines.engine.epochs import TrainingSpec
from pipelines.engine.loop import Checkpointing, TrainingResult, train
from pipelines.engine.resume import fingerprint
from pipelines.engine.state import capture_state, restore_network
from pipelines.engine.step import TrainStep
from pipelines.metrics import LANGUAGE_EVALUATION, LANGUAGE_STEP_EVALUATION, TRAIN_SEQUENCES_PER_S
from pipelines.models.bert import BertConfig, BertNetworkWithLoss, BertPreTraining, create_bert, mlm_metrics
from pipelines.models.resnet import count_parameters
from pipelines.optim.gradients import FirstOrderStep, UnscaledGradients
from pipelines.optim.momentum import decay_groups, decays_unless_layernorm_or_bias
from pipelines.optim.schedules import per_step
from pipelines.optim.thor.step import create_thor_step
from pipelines.params import (
    BertBaselineTraining,
    BertCorpusParams,
    BertExampleParams,
    BertNetworkParams,
    BertThorTraining,
    BertTokenizerParams,
    DistributedParams,
    RuntimeParams,
    ThorBertParams,
)
from pipelines.recipes.classifier import configure
from pipelines.recipes.thor import OwnThorStep, ThorFigures
from pipelines.text.corpus import Document, fit_sentence_splitter, into_sentences, read_sources, split_documents
from pipelines.text.dataset import create_text_dataset
from pipelines.text.examples import create_pretraining_examples
from pipelines.text.tokenizer import train_wordpiece

logger = logging.getLogger(__name__)

NETWORK_NAME = "bert"  # checkpoint metadata ``network``


@dataclass(frozen=True)
class LanguageModelContext:
    """What every BERT training reads besides its own section: the train and held-out examples (column name ->
    array, ``text.examples.COLUMNS``), the vocabulary size, the network section, runtime and distributed. Frozen; a
    training on another seed makes its own copy (``with_seed``)."""

    train_examples: dict[str, np.ndarray]
    held_out_examples: dict[str, np.ndarray]
    vocab_size: int
    network: BertNetworkParams
    eval_batch_size: int
    step_eval_examples: int | None
    runtime: RuntimeParams
    distributed: DistributedParams

    def with_seed(self, seed: int) -> LanguageModelContext:
        """The same training with ``runtime.seed`` ``seed`` (initial weights, data order)."""
        return replace(self, runtime=self.runtime.model_copy(update={"seed": seed}))


def split_corpus(corpus: BertCorpusParams) -> tuple[list[Document], list[Document]]:
    """The corpus's documents (the first ``max_documents`` by name), split into train and held-out documents before
    anything is fitted, then cut into sentences by Punkt trained on the train documents."""
    sources = read_sources(corpus.root, limit=corpus.max_documents)
    train_sources, held_out_sources = split_documents(
        sources, held_out_fraction=corpus.held_out_fraction, seed=corpus.split_seed
    )
    splitter = fit_sentence_splitter(train_sources)
    train_documents, held_out = into_sentences(train_sources, splitter), into_sentences(held_out_sources, splitter)
    logger.info(
        "Corpus %s: %d documents, %d train (%d sentences), %d held out (%d sentences)",
        corpus.root,
        len(sources),
        len(train_documents),
        sum(len(d.sentences) for d in train_documents),
        len(held_out),
        sum(len(d.sentences) for d in held_out),
    )
    return train_documents, held_out


def fit_tokenizer(train_documents: Sequence[Document], tokenizer: BertTokenizerParams):
    """A WordPiece tokenizer trained on the train documents only."""
    return train_wordpiece(
        train_documents,
        vocab_size=tokenizer.vocab_size,
        min_frequency=tokenizer.min_frequency,
        lowercase=tokenizer.lowercase,
    )


def pretraining_examples(documents: Sequence[Document], tokenizer, examples: BertExampleParams) -> dict:
    """Masked-LM and next-sentence examples of ``documents`` (create_pretraining_data's rules)."""
    return create_pretraining_examples(
        documents,
        tokenizer,
        max_seq_length=examples.max_seq_length,
        max_predictions_per_seq=examples.max_predictions_per_seq,
        masked_lm_prob=examples.masked_lm_prob,
        short_seq_prob=examples.short_seq_prob,
        dupe_factor=examples.dupe_factor,
        seed=examples.seed,
    )


def prepare_language_model(
    thor_bert: ThorBertParams, runtime: RuntimeParams, distributed: DistributedParams
) -> LanguageModelContext:
    """Corpus split, tokenizer and examples in one call, as the ``thor_bert`` pipeline's first nodes make them (the
    study prepares them so when it has thor_bert)."""
    train_documents, held_out = split_corpus(thor_bert.corpus)
    tokenizer = fit_tokenizer(train_documents, thor_bert.tokenizer)
    return LanguageModelContext(
        pretraining_examples(train_documents, tokenizer, thor_bert.examples),
        pretraining_examples(held_out, tokenizer, thor_bert.examples),
        tokenizer.get_vocab_size(),
        thor_bert.network,
        thor_bert.eval_batch_size,
        thor_bert.step_eval_examples,
        runtime,
        distributed,
    )


def bert_config(network: BertNetworkParams, vocab_size: int) -> BertConfig:
    """The network section as ``models.bert.BertConfig`` with the tokenizer's vocabulary size."""
    return BertConfig(vocab_size=vocab_size, **network.model_dump())


def build_bert(network: BertNetworkParams, vocab_size: int, runtime: RuntimeParams) -> Checkpoint:
    """Initial weights of the configured BERT, seeded by ``runtime.seed``."""
    configure(runtime)
    net = create_bert(bert_config(network, vocab_size))
    logger.info("Built BERT: %d trainable parameters, vocabulary %d", count_parameters(net), vocab_size)
    return capture_state(net, None, {"network": NETWORK_NAME, "epoch": 0})


def bert_from_checkpoint(network: BertNetworkParams, vocab_size: int, checkpoint: Checkpoint, source: str):
    """The configured BERT with ``checkpoint``'s weights; a mismatch names ``source``."""
    net = create_bert(bert_config(network, vocab_size))
    check_compatible({p.name: tuple(p.shape) for p in net.get_parameters()}, checkpoint, source)
    restore_network(net, checkpoint)
    return net


def held_out_dataset(context: LanguageModelContext, size: int | None = None):
    """The held-out examples (the first ``size``; None: all), batched by ``eval_batch_size``."""
    examples = context.held_out_examples
    if size is not None:
        examples = {name: column[:size] for name, column in examples.items()}
    return create_text_dataset(
        examples, batch_size=context.eval_batch_size, training=False, rank=0, rank_size=1, seed=context.runtime.seed
    )


def evaluate_bert(context: LanguageModelContext, checkpoint: Checkpoint, label: str) -> dict:
    """Masked-LM accuracy and loss, next-sentence accuracy of ``checkpoint`` on every held-out example, as a
    report; ``label`` names it in the log."""
    configure(context.runtime)
    net = bert_from_checkpoint(context.network, context.vocab_size, checkpoint, f"of {label}")
    figures = mlm_metrics(net, held_out_dataset(context))
    logger.info(
        "%s: held-out masked-LM accuracy %.2f%%, loss %.3f, next-sentence accuracy %.2f%% on %d examples",
        label,
        100 * figures["mlm_accuracy"],
        figures["mlm_loss"],
        100 * figures["nsp_accuracy"],
        figures["examples"],
    )
    return {"network": NETWORK_NAME, "epoch": int(checkpoint.metadata.get("epoch", 0)), **figures}


def _train(
    context: LanguageModelContext,
    start: Checkpoint,
    section: BertThorTraining | BertBaselineTraining,
    make_step: Callable[[BertPreTraining, int], TrainStep],
    *,
    callbacks: Sequence[Callback],
) -> TrainingResult:
    """What both BERT trainings share: data, network from ``start``, evaluation, checkpoints, through the engine."""
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
    )

    def build(start: Checkpoint, steps_per_epoch: int) -> TrainStep:
        net = bert_from_checkpoint(context.network, context.vocab_size, start, "start checkpoint")
        return make_step(net, steps_per_epoch)

    return train(
        spec,
        dataset,
        build,
        start=start,
        fingerprint=run_id,
        checkpoints=Checkpointing.of(section.checkpoint),
        evaluate=lambda step: mlm_metrics(step.network, held_out),
        callbacks=callbacks,
        metadata={"network": NETWORK_NAME},
        evaluate_steps=(lambda step: mlm_metrics(step.network, step_subset)) if step_subset is not None else None,
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

    def make_step(net: BertPreTraining, steps_per_epoch: int) -> TrainStep:
        lr_per_step = per_step(thor.lr, epochs=thor.epochs, steps_per_epoch=steps_per_epoch)
        damping = per_step(thor.damping, epochs=thor.epochs, steps_per_epoch=steps_per_epoch)
        logger.info(
            "THOR on BERT: frequency %d, lr %.4g -> %.4g, damping %.4g -> %.4g over %d steps",
            thor.frequency,
            lr_per_step[0],
            lr_per_step[-1],
            damping[0],
            damping[-1],
            len(lr_per_step),
        )
        step = create_thor_step(
            net,
            BertNetworkWithLoss(net),
            lr_per_step,
            damping,
            momentum=thor.momentum,
            weight_decay=thor.weight_decay,
            loss_scale=thor.loss_scale,
            frequency=thor.frequency,
            block_size=thor.block_size,
            trace_rule=None,
            rank_size=context.distributed.worker_num,
            inverse_method=None,  # Cholesky, or MatrixInverse on Ascend (linalg.block_inverse)
            precondition=True,
            decays=decays_unless_layernorm_or_bias,
        )
        return OwnThorStep(step)

    return _train(context, start, thor, make_step, callbacks=[ThorFigures(), *callbacks])


def train_bert_baseline(
    context: LanguageModelContext,
    start: Checkpoint,
    baseline: BertBaselineTraining,
    *,
    callbacks: Sequence[Callback] = (),
) -> TrainingResult:
    """The first-order baseline (AdamWeightDecay or Lamb, warm-up polynomial lr) from ``start`` for
    ``baseline.epochs`` epochs, resuming this training's newest checkpoint in ``baseline.checkpoint.dir``."""
    from mindspore import Tensor, nn

    def make_step(net: BertPreTraining, steps_per_epoch: int) -> TrainStep:
        lr_per_step = per_step(baseline.lr, epochs=baseline.epochs, steps_per_epoch=steps_per_epoch)
        groups = decay_groups(net, baseline.weight_decay, decays_unless_layernorm_or_bias)
        optimizer_class = {"adamweightdecay": nn.AdamWeightDecay, "lamb": nn.Lamb}[baseline.optimizer]
        optimizer = optimizer_class(groups, learning_rate=Tensor(lr_per_step), eps=baseline.eps)
        gradients = UnscaledGradients(
            BertNetworkWithLoss(net), optimizer.parameters, baseline.loss_scale, context.distributed.worker_num
        )
        net.set_train(True)
        step = TrainStep(FirstOrderStep(gradients, optimizer), net, optimizer, lr_per_step, baseline.loss_scale)
        step.recipe = f"BERT first-order baseline ({optimizer_class.__name__})"
        return step

    return _train(context, start, baseline, make_step, callbacks=callbacks)
