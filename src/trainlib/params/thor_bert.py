"""``conf/*/parameters_thor_bert.yml``: BERT pre-training on a text corpus, THOR against a first-order training."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Annotated, Literal

from pydantic import Field, model_validator

from trainlib.fast_dev_run import BATCH_PER_WORKER, EVAL_IMAGES, THOR_FREQUENCY, Plan, nested_training_budgets
from trainlib.params.base import CheckpointParams, LanguageRecipe, Section
from trainlib.params.errors import CrossKeyProblems
from trainlib.params.numbers import Fraction, NonNegativeFloat, NonNegativeInt, OpenFraction, PositiveFloat, PositiveInt
from trainlib.params.recipe_spec import SECOND_ORDER, RecipeSpec, ResultRow
from trainlib.params.schedules import Schedule
from trainlib.params.thor import ThorSettings


class BertCorpusParams(Section):
    """The text corpus: reST sources under ``root`` (default: the Python 3.11 documentation of Debian's
    ``python3.11-doc``), split by document into train and held-out before anything is fitted."""

    root: str
    held_out_fraction: OpenFraction
    split_seed: int
    max_documents: PositiveInt | None  # the first N documents by name (fast dev runs, tests); None: all


class BertTokenizerParams(Section):
    """A WordPiece vocabulary trained on the train documents (Hugging Face tokenizers)."""

    vocab_size: Annotated[int, Field(ge=16)]  # the 5 special tokens and some pieces
    min_frequency: PositiveInt
    lowercase: bool


class BertExampleParams(Section):
    """Pre-training examples as BERT's create_pretraining_data makes them (masked LM and next sentence)."""

    max_seq_length: Annotated[int, Field(ge=8)]
    max_predictions_per_seq: PositiveInt
    masked_lm_prob: OpenFraction
    short_seq_prob: Fraction
    dupe_factor: PositiveInt
    seed: int


class BertNetworkParams(Section):
    """The BERT encoder and its pre-training heads (the vocabulary size comes from the tokenizer)."""

    hidden_size: PositiveInt
    num_hidden_layers: PositiveInt
    num_attention_heads: PositiveInt
    intermediate_size: PositiveInt
    hidden_dropout_prob: Fraction
    attention_probs_dropout_prob: Fraction
    max_position_embeddings: PositiveInt
    type_vocab_size: PositiveInt
    initializer_range: PositiveFloat

    @model_validator(mode="after")
    def _heads_divide_hidden(self) -> BertNetworkParams:
        if self.hidden_size % self.num_attention_heads:
            CrossKeyProblems.raise_if_any(
                [
                    (
                        "thor_bert.network.num_attention_heads",
                        f"is {self.num_attention_heads}, which does not divide hidden_size {self.hidden_size}",
                    )
                ]
            )
        return self


class BertThorTraining(LanguageRecipe, ThorSettings):
    """THOR on BERT: every Dense layer preconditioned, then Momentum; weight decay except on LayerNorm and biases."""

    epochs: PositiveInt
    batch_size: PositiveInt  # per device
    lr: Schedule
    damping: Schedule
    split_indices: list[int]  # nn.thor's allreduce fusion groups of the A/G statistics (recorded)
    eval_interval: NonNegativeInt
    checkpoint: CheckpointParams
    eval_every_steps: NonNegativeInt

    @model_validator(mode="after")
    def _consistent(self) -> BertThorTraining:
        CrossKeyProblems.raise_if_any(self.option_problems("thor_bert.thor"))
        return self


class BertControlTraining(LanguageRecipe):
    """The first-order control of the THOR document's BERT script (Lamb or AdamWeightDecay, warm-up polynomial lr),
    weight decay except on LayerNorm and biases."""

    optimizer: Literal["adamweightdecay", "lamb"]
    epochs: PositiveInt
    batch_size: PositiveInt  # per device
    lr: Schedule
    weight_decay: NonNegativeFloat
    eps: PositiveFloat
    loss_scale: PositiveFloat
    eval_interval: NonNegativeInt
    checkpoint: CheckpointParams
    eval_every_steps: NonNegativeInt


class ThorBertParams(Section):
    """``thor_bert``: text corpus -> tokenizer -> pre-training examples -> BERT -> THOR and its first-order control
    -> masked-LM evaluation on held-out text."""

    corpus: BertCorpusParams
    tokenizer: BertTokenizerParams
    examples: BertExampleParams
    network: BertNetworkParams
    eval_batch_size: PositiveInt
    step_eval_examples: PositiveInt | None  # held-out examples of the evaluation every K steps; None: all
    target_mlm_accuracy: OpenFraction  # time and steps to this held-out masked-LM accuracy (report, study)
    thor: BertThorTraining
    control: BertControlTraining

    @model_validator(mode="after")
    def _consistent(self) -> ThorBertParams:
        problems = []
        examples, network = self.examples, self.network
        if examples.max_seq_length > network.max_position_embeddings:
            problems.append(
                (
                    "thor_bert.examples.max_seq_length",
                    f"is {examples.max_seq_length}, beyond network.max_position_embeddings "
                    f"{network.max_position_embeddings}",
                )
            )
        if examples.max_predictions_per_seq >= examples.max_seq_length:
            problems.append(
                (
                    "thor_bert.examples.max_predictions_per_seq",
                    f"is {examples.max_predictions_per_seq}, not below max_seq_length {examples.max_seq_length}",
                )
            )
        CrossKeyProblems.raise_if_any(problems)
        return self


# BERT pre-trained with THOR against its first-order control (AdamWeightDecay or Lamb), each tuned on its own
BERT_DOCUMENTS = 4  # corpus documents a rehearsal reads: examples for a few steps of the env's sequence length


def _rehearse(section: Mapping, plan: Plan) -> dict:
    """The env's BERT (network, sequence length, schedules' shape, THOR and control settings) on the first few
    documents for one epoch of a few steps; Lamb, which MindSpore runs on Ascend and GPU only, becomes the script's
    AdamWeightDecay."""
    values = {
        "corpus.max_documents": BERT_DOCUMENTS,
        "eval_batch_size": BATCH_PER_WORKER,
        "step_eval_examples": EVAL_IMAGES,
        "thor.frequency": THOR_FREQUENCY,
        **nested_training_budgets(section, plan),
    }
    if section["control"]["optimizer"] == "lamb":
        values["control.optimizer"] = "adamweightdecay"
    return values


def _runnable(parameters) -> list[tuple[str, str]]:
    """MindSpore's Lamb has its kernel on Ascend and GPU only."""
    if parameters.thor_bert.control.optimizer == "lamb" and parameters.runtime.device_target == "CPU":
        return [
            (
                "thor_bert.control.optimizer",
                "is lamb, whose kernel MindSpore has only on Ascend and GPU, but runtime.device_target is CPU; use "
                "adamweightdecay (the script's other first-order choice) on CPU",
            )
        ]
    return []


RECIPES = (
    RecipeSpec(
        "thor_bert",
        "thor_bert",
        ThorBertParams,
        (
            ResultRow(
                "thor_bert",
                "thor_bert.thor",
                ("thor_bert_control",),
                tunable=True,
                preconditioned=True,
                colour=SECOND_ORDER,
            ),
            ResultRow("thor_bert_control", "thor_bert.control", tunable=True),
        ),
        task="masked_lm",
        colour=SECOND_ORDER,
        rehearsal=_rehearse,
        cross_section_problems=_runnable,
    ),
)
