"""BERT pre-training examples (masked LM and next sentence), a port of Google BERT's ``create_pretraining_data.py``.

The algorithm, the order of its random draws included, is the original's (the one MindSpore's models-repo BERT
reads): documents shuffled; per document and per ``dupe_factor`` pass, sentences gathered into chunks of about
``max_seq_length - 3`` tokens (shorter with probability ``short_seq_prob``), cut at a random sentence into segment
A and segment B, B replaced half of the time by a run of sentences of another document (the unused sentences are
read again), the pair trimmed from random ends to fit, ``[CLS] A [SEP] B [SEP]``, then ``masked_lm_prob`` of the
tokens (at most ``max_predictions_per_seq``, never [CLS] or [SEP]) chosen for prediction: 80 % become [MASK],
10 % stay, 10 % become a token drawn from the whole vocabulary, as in the original. Whole WordPiece tokens are
masked (no whole-word masking). All examples are shuffled at the end.
"""

from __future__ import annotations

import random
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
from tokenizers import Tokenizer

from trainlib.text.corpus import Document
from trainlib.text.tokenizer import CLS_ID, MASK_ID, PAD_ID, SEP_ID, check_special_tokens

COLUMNS = (
    "input_ids",
    "input_mask",
    "token_type_ids",
    "next_sentence_labels",
    "masked_lm_positions",
    "masked_lm_ids",
    "masked_lm_weights",
)
# [CLS] A [SEP] B [SEP]: three tokens that are no segment token, and at least one token in each segment.
_SPECIAL_PER_EXAMPLE = 3
_MIN_SEQ_LENGTH = _SPECIAL_PER_EXAMPLE + 2


@dataclass
class _Instance:
    """One example before padding: token ids with masks applied, segment ids, the masked positions (ascending)
    and their original ids, and whether B is a random segment."""

    tokens: list[int]
    segment_ids: list[int]
    masked_positions: list[int]
    masked_ids: list[int]
    is_random_next: bool


def _truncate_seq_pair(tokens_a: list[int], tokens_b: list[int], max_num_tokens: int, rng: random.Random) -> None:
    """Trim the longer segment, from its front or its back at random, until the pair holds ``max_num_tokens``."""
    while len(tokens_a) + len(tokens_b) > max_num_tokens:
        trunc_tokens = tokens_a if len(tokens_a) > len(tokens_b) else tokens_b
        # Random ends, as in the original: less bias than always cutting the end.
        if rng.random() < 0.5:
            del trunc_tokens[0]
        else:
            trunc_tokens.pop()


def _mask_tokens(
    tokens: list[int], masked_lm_prob: float, max_predictions_per_seq: int, vocab_size: int, rng: random.Random
) -> tuple[list[int], list[int], list[int]]:
    """The tokens with their chosen positions masked, the positions (ascending) and the original ids there."""
    candidates = [index for index, token in enumerate(tokens) if token not in (CLS_ID, SEP_ID)]
    rng.shuffle(candidates)
    # As the original: the share counts [CLS] and [SEP], and at least one token is predicted.
    num_to_predict = min(max_predictions_per_seq, max(1, int(round(len(tokens) * masked_lm_prob))))
    output = list(tokens)
    chosen = sorted(candidates[:num_to_predict])
    for index in candidates[:num_to_predict]:
        if rng.random() < 0.8:
            output[index] = MASK_ID
        elif rng.random() < 0.5:
            output[index] = tokens[index]
        else:
            output[index] = rng.randint(0, vocab_size - 1)
    return output, chosen, [tokens[index] for index in chosen]


def _instances_from_document(
    documents: list[list[list[int]]],
    document_index: int,
    *,
    max_seq_length: int,
    short_seq_prob: float,
    masked_lm_prob: float,
    max_predictions_per_seq: int,
    vocab_size: int,
    rng: random.Random,
) -> list[_Instance]:
    """The examples whose segment A comes from ``documents[document_index]`` (a list of sentences of token ids)."""
    document = documents[document_index]
    max_num_tokens = max_seq_length - _SPECIAL_PER_EXAMPLE
    # Mostly full sequences; sometimes shorter ones, so that pre-training matches short fine-tuning inputs.
    # As in the original, the draw is made once per document.
    target_seq_length = max_num_tokens
    if rng.random() < short_seq_prob:
        target_seq_length = rng.randint(2, max_num_tokens)
    instances = []
    current_chunk: list[list[int]] = []
    current_length = 0
    i = 0
    while i < len(document):
        segment = document[i]
        current_chunk.append(segment)
        current_length += len(segment)
        if i == len(document) - 1 or current_length >= target_seq_length:
            a_end = rng.randint(1, len(current_chunk) - 1) if len(current_chunk) >= 2 else 1
            tokens_a = [token for sentence in current_chunk[:a_end] for token in sentence]
            tokens_b: list[int] = []
            is_random_next = len(current_chunk) == 1 or rng.random() < 0.5
            if is_random_next:
                target_b_length = target_seq_length - len(tokens_a)
                # Ten tries at another document (a one-document corpus falls back on itself).
                for _ in range(10):
                    random_document_index = rng.randint(0, len(documents) - 1)
                    if random_document_index != document_index:
                        break
                random_document = documents[random_document_index]
                random_start = rng.randint(0, len(random_document) - 1)
                for sentence in random_document[random_start:]:
                    tokens_b.extend(sentence)
                    if len(tokens_b) >= target_b_length:
                        break
                # The sentences of the chunk after A were not used: read them again for the next chunk.
                i -= len(current_chunk) - a_end
            else:
                tokens_b = [token for sentence in current_chunk[a_end:] for token in sentence]
            _truncate_seq_pair(tokens_a, tokens_b, max_num_tokens, rng)
            tokens = [CLS_ID, *tokens_a, SEP_ID, *tokens_b, SEP_ID]
            segment_ids = [0] * (len(tokens_a) + 2) + [1] * (len(tokens_b) + 1)
            masked, positions, ids = _mask_tokens(tokens, masked_lm_prob, max_predictions_per_seq, vocab_size, rng)
            instances.append(_Instance(masked, segment_ids, positions, ids, is_random_next))
            current_chunk = []
            current_length = 0
        i += 1
    return instances


def _tokenized_documents(documents: list[Document], tokenizer: Tokenizer) -> list[list[list[int]]]:
    """Each document as its sentences' token ids (no special tokens); sentences without a token and documents
    without a sentence left out, as the original does."""
    sentences = [sentence for document in documents for sentence in document.sentences]
    encodings = iter(tokenizer.encode_batch(sentences, add_special_tokens=False))
    tokenized = []
    for document in documents:
        ids = [encoding.ids for encoding in (next(encodings) for _ in document.sentences)]
        ids = [sentence for sentence in ids if sentence]
        if ids:
            tokenized.append(ids)
    return tokenized


def _padded(instances: list[_Instance], max_seq_length: int, max_predictions_per_seq: int) -> dict[str, np.ndarray]:
    """The instances as ``COLUMNS`` arrays, zero-padded to ``max_seq_length`` and ``max_predictions_per_seq``."""
    n = len(instances)
    columns = {
        "input_ids": np.full((n, max_seq_length), PAD_ID, dtype=np.int32),
        "input_mask": np.zeros((n, max_seq_length), dtype=np.int32),
        "token_type_ids": np.zeros((n, max_seq_length), dtype=np.int32),
        "next_sentence_labels": np.zeros(n, dtype=np.int32),
        "masked_lm_positions": np.zeros((n, max_predictions_per_seq), dtype=np.int32),
        "masked_lm_ids": np.zeros((n, max_predictions_per_seq), dtype=np.int32),
        "masked_lm_weights": np.zeros((n, max_predictions_per_seq), dtype=np.float32),
    }
    for row, instance in enumerate(instances):
        length, predictions = len(instance.tokens), len(instance.masked_positions)
        columns["input_ids"][row, :length] = instance.tokens
        columns["input_mask"][row, :length] = 1
        columns["token_type_ids"][row, :length] = instance.segment_ids
        columns["next_sentence_labels"][row] = int(instance.is_random_next)
        columns["masked_lm_positions"][row, :predictions] = instance.masked_positions
        columns["masked_lm_ids"][row, :predictions] = instance.masked_ids
        columns["masked_lm_weights"][row, :predictions] = 1.0
    return {name: columns[name] for name in COLUMNS}


def create_pretraining_examples(
    documents: list[Document],
    tokenizer: Tokenizer,
    *,
    max_seq_length: int,
    max_predictions_per_seq: int,
    masked_lm_prob: float,
    short_seq_prob: float,
    dupe_factor: int,
    seed: int,
) -> dict[str, np.ndarray]:
    """BERT's pre-training examples of ``documents``, one row per example, the same for the same ``seed``.

    Columns (``COLUMNS`` order): ``input_ids``, ``input_mask`` (1 on tokens, 0 on padding), ``token_type_ids``
    (0 for [CLS] A [SEP], 1 for B [SEP]), each (n, max_seq_length); ``next_sentence_labels`` (n,): 0 when B
    follows A, 1 when B is random; ``masked_lm_positions``, ``masked_lm_ids`` (the original ids there) and
    ``masked_lm_weights`` (1.0 per prediction, 0.0 on padding), each (n, max_predictions_per_seq). int32 but
    the weights (float32). ``dupe_factor``: passes over the documents, each with fresh segments and masks.
    """
    if max_seq_length < _MIN_SEQ_LENGTH:
        raise ValueError(
            f"max_seq_length must be at least {_MIN_SEQ_LENGTH} ([CLS] A [SEP] B [SEP]), got {max_seq_length}"
        )
    if max_predictions_per_seq < 1:
        raise ValueError(f"max_predictions_per_seq must be at least 1, got {max_predictions_per_seq}")
    check_special_tokens(tokenizer)
    rng = random.Random(seed)
    tokenized = _tokenized_documents(documents, tokenizer)
    if not tokenized:
        raise ValueError(f"the {len(documents)} document(s) give no token: no pre-training example can be made")
    rng.shuffle(tokenized)
    instances = []
    for _ in range(dupe_factor):
        for document_index in range(len(tokenized)):
            instances.extend(
                _instances_from_document(
                    tokenized,
                    document_index,
                    max_seq_length=max_seq_length,
                    short_seq_prob=short_seq_prob,
                    masked_lm_prob=masked_lm_prob,
                    max_predictions_per_seq=max_predictions_per_seq,
                    vocab_size=tokenizer.get_vocab_size(),
                    rng=rng,
                )
            )
    rng.shuffle(instances)
    return _padded(instances, max_seq_length, max_predictions_per_seq)


@dataclass(frozen=True)
class MostFrequentToken:
    """Always predicting the train examples' most frequent masked token (``token``, id ``token_id``): its masked-LM
    accuracy on the held-out examples (``accuracy``), and on the first ``subset`` of them (``subset_accuracy``), the
    floor a masked-LM accuracy is read against."""

    token_id: int
    token: str
    accuracy: float
    subset_accuracy: float

    @property
    def label(self) -> str:
        """How a log names the token: ``'the' (id 1844)``, its text first, its id to find it in the examples."""
        return f"{self.token!r} (id {self.token_id})"


def _hits(examples: dict[str, np.ndarray], token_id: int) -> float:
    weights = examples["masked_lm_weights"].astype(np.float64)
    return float((weights * (examples["masked_lm_ids"] == token_id)).sum() / max(weights.sum(), 1.0))


def most_frequent_token_accuracy(
    train: dict[str, np.ndarray],
    held_out: dict[str, np.ndarray],
    vocabulary: Sequence[str],
    *,
    subset: int | None = None,
) -> MostFrequentToken:
    """The held-out masked-LM accuracy of always predicting the most frequent masked token of ``train`` (ties: the
    smaller id; its text from ``vocabulary``, the tokenizer's pieces by id), weighted as ``models.bert.mlm_metrics``
    weighs predictions; ``subset``: also on the first ``subset`` held-out examples (the step evaluation's; None:
    all)."""
    ids = train["masked_lm_ids"][train["masked_lm_weights"] > 0]
    token_id = int(np.bincount(ids.ravel()).argmax())
    first = held_out if subset is None else {name: column[:subset] for name, column in held_out.items()}
    return MostFrequentToken(token_id, vocabulary[token_id], _hits(held_out, token_id), _hits(first, token_id))
