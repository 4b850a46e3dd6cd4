"""What both BERT trainings build the same way (the language counterpart of ``recipes.classifier``): the text
prepared in one call, the network and its initial weights, the held-out data and the evaluation of a checkpoint."""

from __future__ import annotations

import logging

import pandas as pd

from pipelines.engine.checkpoint import Checkpoint, check_compatible
from pipelines.engine.state import capture_state, restore_network
from pipelines.models.bert import BertConfig, create_bert, mlm_metrics
from pipelines.models.resnet import count_parameters
from pipelines.params import BertNetworkParams, DistributedParams, RuntimeParams, ThorBertParams
from pipelines.predict.export import ExportedModel, export_fill_mask
from pipelines.predict.fill_mask import masked_text
from pipelines.recipes.classifier import configure
from pipelines.recipes.context import LanguageModelContext
from pipelines.text.dataset import create_text_dataset
from pipelines.text.pretraining import fit_tokenizer, pretraining_examples, split_corpus
from pipelines.text.tokenizer import tokenizer_from_json

logger = logging.getLogger(__name__)

NETWORK_NAME = "bert"  # checkpoint metadata ``network``


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
        examples,
        batch_size=context.eval_batch_size,
        training=False,
        rank=0,
        rank_size=1,
        seed=context.runtime.seed,
        batch_key="thor_bert.eval_batch_size",
    )


def evaluate_bert(context: LanguageModelContext, checkpoint: Checkpoint) -> dict:
    """Masked-LM accuracy and loss, next-sentence accuracy of ``checkpoint`` on every held-out example, as a
    report; the log names it by the training that wrote it (its metadata ``training``)."""
    label = f"thor_bert {checkpoint.metadata.get('training', 'checkpoint')}"
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


def export_bert(
    checkpoint: Checkpoint, held_out_examples: dict, tokenizer: str, network: BertNetworkParams, runtime: RuntimeParams
) -> ExportedModel:
    """``checkpoint``'s BERT with its pre-training heads as MindIR filling masks (``predict.export``): the
    tokenizer's JSON and the examples' sequence length and masked positions beside it, the first held-out example's
    first segment as its example input."""
    configure(runtime)
    vocabulary = tokenizer_from_json(tokenizer)
    label = str(checkpoint.metadata.get("training", "checkpoint"))
    net = bert_from_checkpoint(network, vocabulary.get_vocab_size(), checkpoint, f"of thor_bert {label}")
    input_ids, positions = held_out_examples["input_ids"], held_out_examples["masked_lm_positions"]
    return export_fill_mask(
        net,
        tokenizer=tokenizer,
        max_seq_length=input_ids.shape[1],
        max_predictions=positions.shape[1],
        network=NETWORK_NAME,
        training=label,
        example_text=masked_text(input_ids[0], vocabulary),
    )


def compare_trainings(thor_report: dict, baseline_report: dict, thor, baseline) -> pd.DataFrame:
    """One row per training of ``thor`` and ``baseline`` (their sections): held-out masked-LM accuracy and loss,
    next-sentence accuracy, epochs, and the difference to the baseline; the log gives both accuracies."""
    reports = {"thor": thor_report, "baseline": baseline_report}
    budgets = {"thor": thor.epochs, "baseline": baseline.epochs}
    table = pd.DataFrame(
        [
            {"training": name, "epochs": budgets[name]}
            | {key: report[key] for key in ("mlm_accuracy", "mlm_loss", "nsp_accuracy", "examples")}
            for name, report in reports.items()
        ]
    )
    table["mlm_accuracy_minus_baseline"] = table["mlm_accuracy"] - baseline_report["mlm_accuracy"]
    logger.info(
        "thor_bert: held-out masked-LM accuracy THOR %.2f%% (%d epochs), %s baseline %.2f%% (%d epochs); "
        "THOR - baseline %+.2f points, on %d held-out examples",
        100 * thor_report["mlm_accuracy"],
        budgets["thor"],
        baseline.optimizer,
        100 * baseline_report["mlm_accuracy"],
        budgets["baseline"],
        100 * (thor_report["mlm_accuracy"] - baseline_report["mlm_accuracy"]),
        thor_report["examples"],
    )
    return table
