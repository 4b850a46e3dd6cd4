"""Nodes of the ``thor_bert`` pipeline: the corpus, tokenizer and examples (``trainlib.text``), BERT's initial
weights, the language training template (``train``, ``evaluate``, ``export_model``) under ``thor_bert.thor`` and
``thor_bert.control`` (``trainlib.recipes.thor_bert``), each training in its own MLflow child run (nodes tagged
``training_run``), and their comparison in the ``kedro run``'s run."""

from __future__ import annotations

import logging

import numpy as np
import pandas as pd

from pipelines import tracking
from pipelines.training.nodes import training_outputs
from trainlib.distributed.launch import on_every_rank
from trainlib.engine.checkpoint import Checkpoint
from trainlib.params import (
    BertCorpusParams,
    BertExampleParams,
    BertNetworkParams,
    BertTokenizerParams,
    DistributedParams,
    LanguageRecipe,
    PositiveInt,
    RuntimeParams,
)
from trainlib.predict.export import ExportedModel
from trainlib.recipes.context import LanguageModelContext
from trainlib.recipes.language_model import (
    MOST_FREQUENT_TOKEN_ACCURACY,
    build_bert,
    compare_trainings,
    evaluate_bert,
    export_bert,
)
from trainlib.recipes.thor_bert import train_bert
from trainlib.text import pretraining
from trainlib.text.corpus import documents_from_table, documents_table
from trainlib.text.examples import most_frequent_token_accuracy
from trainlib.text.tokenizer import pieces, tokenizer_from_json, tokenizer_to_json

logger = logging.getLogger(__name__)

THOR_MINUS_CONTROL_MLM = "thor_bert/thor_minus_control_mlm_accuracy"


def split_corpus(corpus: BertCorpusParams) -> tuple[pd.DataFrame, pd.DataFrame]:
    """The corpus's sentences, one row per sentence (``document``, ``sentence``), train and held-out documents
    apart."""
    train_documents, held_out = pretraining.split_corpus(corpus)
    tracking.log_metrics(
        {"thor_bert/train_documents": len(train_documents), "thor_bert/held_out_documents": len(held_out)}
    )
    return documents_table(train_documents), documents_table(held_out)


def fit_tokenizer(train_documents: pd.DataFrame, tokenizer: BertTokenizerParams) -> str:
    """A WordPiece tokenizer of the train documents, as its JSON (Hugging Face tokenizers' format)."""
    fitted = pretraining.fit_tokenizer(documents_from_table(train_documents), tokenizer)
    tracking.log_metrics({"thor_bert/vocab_size": fitted.get_vocab_size()})
    return tokenizer_to_json(fitted)


def create_examples(
    train_documents: pd.DataFrame, held_out_documents: pd.DataFrame, tokenizer: str, examples: BertExampleParams
) -> tuple[dict[str, np.ndarray], dict[str, np.ndarray]]:
    """Masked-LM and next-sentence examples of the train and of the held-out documents."""
    fitted = tokenizer_from_json(tokenizer)
    train = pretraining.pretraining_examples(documents_from_table(train_documents), fitted, examples)
    held_out = pretraining.pretraining_examples(documents_from_table(held_out_documents), fitted, examples)
    counts = {
        "thor_bert/train_examples": len(train["input_ids"]),
        "thor_bert/held_out_examples": len(held_out["input_ids"]),
    }
    tracking.log_metrics(counts)
    logger.info("thor_bert: %d train and %d held-out examples", *counts.values())
    return train, held_out


def build_network(network: BertNetworkParams, tokenizer: str, runtime: RuntimeParams) -> Checkpoint:
    """Initial BERT weights (seeded by ``runtime.seed``), the vocabulary size the tokenizer's."""
    return build_bert(network, tokenizer_from_json(tokenizer).get_vocab_size(), runtime)


def language_context(
    train_examples: dict[str, np.ndarray],
    held_out_examples: dict[str, np.ndarray],
    tokenizer: str,
    network: BertNetworkParams,
    eval_batch_size: int,
    step_eval_examples: PositiveInt | None,
    runtime: RuntimeParams,
    distributed: DistributedParams,
) -> LanguageModelContext:
    """What a training's nodes read besides their own section, in one value (``LanguageModelContext``): the
    examples, the tokenizer's pieces and the shared sections, as each node receives them from the catalog."""
    vocabulary = pieces(tokenizer_from_json(tokenizer))
    sections = (network, eval_batch_size, step_eval_examples, runtime, distributed)
    return LanguageModelContext(train_examples, held_out_examples, vocabulary, *sections)


def train(
    initial_weights: Checkpoint,
    train_examples: dict[str, np.ndarray],
    held_out_examples: dict[str, np.ndarray],
    tokenizer: str,
    network: BertNetworkParams,
    eval_batch_size: int,
    step_eval_examples: PositiveInt | None,
    runtime: RuntimeParams,
    distributed: DistributedParams,
    recipe: LanguageRecipe,
    target_mlm_accuracy: float,
) -> tuple[Checkpoint, pd.DataFrame, pd.DataFrame]:
    """The section's training from the initial weights: THOR (every Dense layer preconditioned, then Momentum) or
    the first-order control (AdamWeightDecay or Lamb); the final checkpoint and the per-epoch and step histories.
    A rerun resumes from ``<section>.checkpoint.dir``. The run gets when it first reached ``target_mlm_accuracy``
    (``target/epochs``, …)."""
    context = language_context(
        train_examples, held_out_examples, tokenizer, network, eval_batch_size, step_eval_examples, runtime, distributed
    )
    callbacks = [tracking.EpochMetrics(), tracking.TimeToTarget(target_mlm_accuracy, "mlm_accuracy")]
    return training_outputs(on_every_rank(train_bert, context, initial_weights, recipe, callbacks=callbacks))


def evaluate(
    checkpoint: Checkpoint,
    train_examples: dict[str, np.ndarray],
    held_out_examples: dict[str, np.ndarray],
    tokenizer: str,
    network: BertNetworkParams,
    eval_batch_size: int,
    step_eval_examples: PositiveInt | None,
    runtime: RuntimeParams,
    distributed: DistributedParams,
) -> dict:
    """Held-out masked-LM accuracy and loss of the training's checkpoint, in this process, logged as ``final/…``."""
    context = language_context(
        train_examples, held_out_examples, tokenizer, network, eval_batch_size, step_eval_examples, runtime, distributed
    )
    report = evaluate_bert(context, checkpoint)
    tracking.log_final(report)
    return report


def export_model(
    checkpoint: Checkpoint,
    held_out_examples: dict[str, np.ndarray],
    tokenizer: str,
    network: BertNetworkParams,
    runtime: RuntimeParams,
) -> ExportedModel:
    """The training's BERT as MindIR filling masks, into ``model``; ``ModelHooks`` log it to its child run."""
    return export_bert(checkpoint, held_out_examples, tokenizer, network, runtime)


def compare(
    thor_report: dict,
    control_report: dict,
    thor: LanguageRecipe,
    control: LanguageRecipe,
    train_examples: dict[str, np.ndarray],
    held_out_examples: dict[str, np.ndarray],
    tokenizer: str,
    runtime: RuntimeParams,
) -> pd.DataFrame:
    """One row per training, named by optimizer, and one for the most frequent token
    (``recipes.language_model.compare_trainings``; both trainings' seed ``runtime.seed``); THOR's gain over the
    control and the most frequent token's accuracy go to the run."""
    vocabulary = pieces(tokenizer_from_json(tokenizer))
    most_frequent = most_frequent_token_accuracy(train_examples, held_out_examples, vocabulary)
    table = compare_trainings(thor_report, control_report, thor, control, most_frequent, runtime.seed)
    tracking.log_metrics(
        {
            THOR_MINUS_CONTROL_MLM: float(table["mlm_accuracy_minus_control"].iloc[0]),
            MOST_FREQUENT_TOKEN_ACCURACY: most_frequent.accuracy,
        }
    )
    return table
