"""What both BERT trainings build the same way (the language counterpart of ``recipes.classifier``): the text
prepared in one call, the network and its initial weights, the held-out data and the evaluation of a checkpoint."""

from __future__ import annotations

import logging

import pandas as pd

from trainlib.engine.callbacks import Callback
from trainlib.engine.checkpoint import Checkpoint, check_compatible
from trainlib.engine.state import capture_state, restore_network
from trainlib.metrics import STEP_KEY, VAL_MLM_ACCURACY, VAL_STEP_MLM_ACCURACY
from trainlib.models.bert import BertConfig, create_bert, mlm_metrics
from trainlib.models.resnet import count_parameters
from trainlib.params import BertControlTraining, BertNetworkParams, DistributedParams, RuntimeParams, ThorBertParams
from trainlib.predict.export import ExportedModel, export_fill_mask
from trainlib.predict.fill_mask import masked_text
from trainlib.readable import counted
from trainlib.recipes.classifier import configure
from trainlib.recipes.context import LanguageModelContext
from trainlib.text.dataset import create_text_dataset
from trainlib.text.examples import MostFrequentToken
from trainlib.text.pretraining import fit_tokenizer, pretraining_examples, split_corpus
from trainlib.text.tokenizer import pieces, tokenizer_from_json

logger = logging.getLogger(__name__)

NETWORK_NAME = "bert"  # checkpoint metadata ``network``
# thor_bert's own figures (metrics.py: a recipe's keys under its prefix), in every epoch row and the summary
# held-out masked-LM accuracy of always predicting the most frequent masked token of the train examples
MOST_FREQUENT_TOKEN_ACCURACY = "thor_bert/most_frequent_token_accuracy"
COLLAPSED = "thor_bert/collapsed"  # 1 when the latest evaluation is at the most frequent token's accuracy, else 0
COLLAPSE_STEP = "thor_bert/collapse_step"  # the global step since which every evaluation has been there
# An evaluation within half a point of the most frequent token's accuracy (or below it) has fallen back to it: a
# network that predicts one token scores that accuracy or less, one that learned anything scores clearly more.
COLLAPSE_MARGIN = 0.005


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
        pieces(tokenizer),
        thor_bert.network,
        thor_bert.eval_batch_size,
        thor_bert.step_eval_examples,
        runtime,
        distributed,
    )


class CollapseWatch(Callback):
    """Whether a training has fallen back to the most frequent token's accuracy (``most_frequent``), and since which
    global step.

    Each held-out evaluation (the epoch's through ``on_evaluation``, the one every K steps on the first examples
    through ``on_step_evaluation``, against that token's accuracy on those examples) is collapsed when its masked-LM
    accuracy is at most that accuracy + ``COLLAPSE_MARGIN``; the training is collapsed when its latest evaluation
    is, since the first step of that unbroken run. Adds ``MOST_FREQUENT_TOKEN_ACCURACY``, and on evaluated epochs
    ``COLLAPSED`` (and ``COLLAPSE_STEP``), to each epoch's row; ``summary()`` gives them for the training's end,
    and a collapsed training says so in the log (``label`` names it)."""

    def __init__(self, most_frequent: MostFrequentToken, label: str):
        self.most_frequent = most_frequent
        self.label = label
        self.steps_per_epoch = 0
        self.observations: list[tuple[int, bool]] = []  # (global step, collapsed), in the order seen
        self.resumed_rows: list = []
        self.latest: float | None = None  # this epoch's evaluation, until its row is made

    def _observe(self, step: int, accuracy: float, floor: float) -> None:
        self.observations.append((int(step), not accuracy > floor + COLLAPSE_MARGIN))  # NaN: collapsed

    def collapse_step(self) -> int | None:
        """The first step of the unbroken run of collapsed evaluations up to the latest one; None if it is not."""
        since = None
        for step, collapsed in sorted(self.observations, key=lambda item: item[0]):
            since = (since if since is not None else step) if collapsed else None
        return since

    def on_evaluation(self, epoch: int, figures) -> None:
        self.latest = float(figures["mlm_accuracy"])  # noted for the epoch's row (epoch_metrics)

    def on_resume(self, source, history) -> None:
        self.resumed_rows = [row for row in history if VAL_MLM_ACCURACY in row]

    def on_train_begin(self, total_epochs: int, steps_per_epoch: int, start_epoch: int) -> None:
        self.steps_per_epoch = steps_per_epoch
        for row in self.resumed_rows:
            self._observe(int(row["epoch"]) * steps_per_epoch, row[VAL_MLM_ACCURACY], self.most_frequent.accuracy)

    def on_step_evaluation(self, row) -> None:
        self._observe(row[STEP_KEY], row[VAL_STEP_MLM_ACCURACY], self.most_frequent.subset_accuracy)

    def epoch_metrics(self, epoch: int) -> dict[str, float]:
        figures = {MOST_FREQUENT_TOKEN_ACCURACY: self.most_frequent.accuracy}
        if self.latest is not None:
            self._observe((epoch + 1) * self.steps_per_epoch, self.latest, self.most_frequent.accuracy)
            self.latest = None
            figures |= self.summary()
        return figures

    def summary(self) -> dict[str, float]:
        since = self.collapse_step()
        figures = {MOST_FREQUENT_TOKEN_ACCURACY: self.most_frequent.accuracy, COLLAPSED: float(since is not None)}
        return figures | ({COLLAPSE_STEP: float(since)} if since is not None else {})

    def on_train_end(self) -> None:
        since = self.collapse_step()
        if since is not None:
            logger.warning(
                "%s collapsed: its held-out masked-LM accuracy has been at most %.1f points above always predicting "
                "the most frequent token %s, %.2f%%, since step %d",
                self.label,
                100 * COLLAPSE_MARGIN,
                self.most_frequent.label,
                100 * self.most_frequent.accuracy,
                since,
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


def control_optimizer(control: BertControlTraining) -> type:
    """The MindSpore optimizer class ``control.optimizer`` names (``adamweightdecay``: ``nn.AdamWeightDecay``,
    ``lamb``: ``nn.Lamb``): what the control trains with, and its name in the comparison."""
    from mindspore import nn

    return {optimizer.__name__.lower(): optimizer for optimizer in (nn.AdamWeightDecay, nn.Lamb)}[control.optimizer]


def compare_trainings(
    thor_report: dict,
    control_report: dict,
    thor,
    control: BertControlTraining,
    most_frequent: MostFrequentToken,
    seed: int,
) -> pd.DataFrame:
    """One row per training of ``thor`` and ``control`` (their sections), named by optimizer (``THOR``, the
    control's ``AdamWeightDecay`` or ``Lamb``), then the most frequent token's: held-out masked-LM accuracy and
    loss, next-sentence accuracy, epochs, the seed, the difference to the control, and whether the training
    collapsed (its final accuracy at the most frequent token's). The log's closing line gives all three accuracies
    and says that one run of each has no interval: the study trains them over seeds for one."""
    reports = {"thor": thor_report, "control": control_report}
    optimizers = {"thor": "THOR", "control": control_optimizer(control).__name__}
    budgets = {"thor": thor.epochs, "control": control.epochs}
    collapsed = [
        name
        for name, report in reports.items()
        if not report["mlm_accuracy"] > most_frequent.accuracy + COLLAPSE_MARGIN
    ]
    table = pd.DataFrame(
        [
            {"training": name, "optimizer": optimizers[name], "epochs": budgets[name], "seed": seed}
            | {key: report[key] for key in ("mlm_accuracy", "mlm_loss", "nsp_accuracy", "examples")}
            | {"collapsed": name in collapsed}
            for name, report in reports.items()
        ]
        + [
            {
                "training": f"most frequent token {most_frequent.label}",
                "mlm_accuracy": most_frequent.accuracy,
                "examples": thor_report["examples"],
            }
        ]
    )
    table["mlm_accuracy_minus_control"] = table["mlm_accuracy"] - control_report["mlm_accuracy"]
    logger.info(
        "thor_bert: held-out masked-LM accuracy THOR %.2f%% (%s), %s (control) %.2f%% (%s), most frequent token %s "
        "%.2f%%; THOR - %s %+.2f points on %d held-out examples%s. One run each (seed %d): no interval; the study "
        'trains both over seeds for one (kedro run --pipelines=study --params="study.recipes=[thor_bert]", '
        "docs/study.md)",
        100 * thor_report["mlm_accuracy"],
        counted(budgets["thor"], "epoch"),
        optimizers["control"],
        100 * control_report["mlm_accuracy"],
        counted(budgets["control"], "epoch"),
        most_frequent.label,
        100 * most_frequent.accuracy,
        optimizers["control"],
        100 * (thor_report["mlm_accuracy"] - control_report["mlm_accuracy"]),
        thor_report["examples"],
        f"; collapsed to the most frequent token's accuracy: {', '.join(optimizers[name] for name in collapsed)}"
        if collapsed
        else "",
        seed,
    )
    return table
