"""BERT pre-training examples: layout of each row, the masking and its 80/10/10 split, next-sentence pairs."""

from __future__ import annotations

import numpy as np
import pytest

from trainlib.text.corpus import Document
from trainlib.text.examples import COLUMNS, create_pretraining_examples, most_frequent_token_accuracy
from trainlib.text.tokenizer import CLS_ID, MASK_ID, PAD_ID, SEP_ID, train_wordpiece

SETTINGS = {
    "max_seq_length": 64,
    "max_predictions_per_seq": 10,
    "masked_lm_prob": 0.15,
    "short_seq_prob": 0.1,
    "dupe_factor": 3,
}


@pytest.fixture(scope="module")
def examples(train_documents, tokenizer) -> dict[str, np.ndarray]:
    return create_pretraining_examples(train_documents, tokenizer, **SETTINGS, seed=0)


def originals(examples: dict[str, np.ndarray]) -> np.ndarray:
    """input_ids with each prediction's recorded original id put back."""
    ids = examples["input_ids"].copy()
    for row, (positions, weights, labels) in enumerate(
        zip(examples["masked_lm_positions"], examples["masked_lm_weights"], examples["masked_lm_ids"], strict=True)
    ):
        real = weights > 0
        ids[row, positions[real]] = labels[real]
    return ids


def test_columns_shapes_and_dtypes(examples):
    assert tuple(examples) == COLUMNS
    n = len(examples["next_sentence_labels"])
    assert n > 1000
    for name in ("input_ids", "input_mask", "token_type_ids"):
        assert examples[name].shape == (n, 64) and examples[name].dtype == np.int32
    for name in ("masked_lm_positions", "masked_lm_ids"):
        assert examples[name].shape == (n, 10) and examples[name].dtype == np.int32
    assert examples["masked_lm_weights"].shape == (n, 10) and examples["masked_lm_weights"].dtype == np.float32
    assert examples["next_sentence_labels"].shape == (n,) and examples["next_sentence_labels"].dtype == np.int32


def test_rows_are_cls_a_sep_b_sep_then_padding(examples):
    tokens = originals(examples)
    for row in range(len(tokens)):
        length = int(examples["input_mask"][row].sum())
        assert (examples["input_mask"][row, :length] == 1).all() and (examples["input_mask"][row, length:] == 0).all()
        assert (examples["input_ids"][row, length:] == PAD_ID).all()
        real = tokens[row, :length]
        assert real[0] == CLS_ID and real[-1] == SEP_ID and (real == CLS_ID).sum() == 1
        separators = np.flatnonzero(real == SEP_ID)
        assert len(separators) == 2 and 2 <= separators[0] <= length - 3  # one token at least in A and in B
        assert not np.isin(real, [PAD_ID, MASK_ID]).any()
        expected_types = np.r_[np.zeros(separators[0] + 1), np.ones(length - separators[0] - 1), np.zeros(64 - length)]
        assert (examples["token_type_ids"][row] == expected_types).all()


def test_predictions_sit_on_segment_tokens_and_record_the_originals(examples):
    tokens = originals(examples)
    lengths = examples["input_mask"].sum(axis=1)
    for row in range(len(tokens)):
        weights = examples["masked_lm_weights"][row]
        count = int(weights.sum())
        assert (weights[:count] == 1).all() and (weights[count:] == 0).all()
        assert count == min(10, max(1, round(lengths[row] * 0.15)))
        positions = examples["masked_lm_positions"][row]
        assert (np.diff(positions[:count]) > 0).all() and (positions[count:] == 0).all()
        assert (examples["masked_lm_ids"][row, count:] == 0).all()
        assert ((positions[:count] > 0) & (positions[:count] < lengths[row] - 1)).all()
        assert not np.isin(tokens[row, positions[:count]], [CLS_ID, SEP_ID, PAD_ID]).any()
        # Every token off the predicted positions is the original one.
        unmasked = np.ones(64, dtype=bool)
        unmasked[positions[:count]] = False
        assert (examples["input_ids"][row, unmasked] == tokens[row, unmasked]).all()


def test_eighty_ten_ten_masking(examples):
    real = examples["masked_lm_weights"] > 0
    shown = np.take_along_axis(examples["input_ids"], examples["masked_lm_positions"], axis=1)[real]
    original = examples["masked_lm_ids"][real]
    assert len(original) > 20_000
    masked, kept = np.mean(shown == MASK_ID), np.mean(shown == original)
    # A random replacement equals the original with probability ~1/vocab only.
    assert masked == pytest.approx(0.8, abs=0.015)
    assert kept == pytest.approx(0.1, abs=0.01)
    assert 1 - masked - kept == pytest.approx(0.1, abs=0.01)


def test_about_half_the_second_segments_are_random(examples):
    # Above one half: a chunk of one sentence always takes a random second segment, as in BERT.
    assert 0.48 <= examples["next_sentence_labels"].mean() <= 0.6


def test_next_segments_follow_and_random_ones_come_from_another_document():
    # Every sentence one word naming its document and place, so that each token tells where it came from.
    documents = [Document(name=f"d{d}", sentences=tuple(f"d{d}s{s}" for s in range(12))) for d in range(6)]
    tokenizer = train_wordpiece(documents, vocab_size=500, min_frequency=1, lowercase=True)
    origin = {tokenizer.token_to_id(f"d{d}s{s}"): (d, s) for d in range(6) for s in range(12)}
    assert None not in origin
    examples = create_pretraining_examples(
        documents,
        tokenizer,
        **{**SETTINGS, "max_seq_length": 9, "max_predictions_per_seq": 2, "dupe_factor": 10},
        seed=3,
    )
    tokens = originals(examples)
    for row, label in enumerate(examples["next_sentence_labels"]):
        real = tokens[row, : int(examples["input_mask"][row].sum())]
        separator = int(np.flatnonzero(real == SEP_ID)[0])
        a = [origin[t] for t in real[1:separator]]
        b = [origin[t] for t in real[separator + 1 : -1]]
        assert [s for _, s in a] == list(range(a[0][1], a[0][1] + len(a)))  # consecutive sentences
        assert len({d for d, _ in a}) == 1
        if label == 0:
            assert [s for _, s in a + b] == list(range(a[0][1], a[0][1] + len(a) + len(b)))
            assert {d for d, _ in b} == {a[0][0]}
        else:
            assert a[0][0] not in {d for d, _ in b}
    assert 0.35 < examples["next_sentence_labels"].mean() < 0.75


def test_same_seed_same_examples_other_seed_others(train_documents, tokenizer, examples):
    settings = {**SETTINGS, "dupe_factor": 1}
    first = create_pretraining_examples(train_documents[:5], tokenizer, **settings, seed=0)
    again = create_pretraining_examples(train_documents[:5], tokenizer, **settings, seed=0)
    other = create_pretraining_examples(train_documents[:5], tokenizer, **settings, seed=1)
    assert all(np.array_equal(first[name], again[name]) for name in COLUMNS)
    assert not np.array_equal(first["input_ids"], other["input_ids"])


def test_settings_that_cannot_make_an_example_are_refused(train_documents, tokenizer):
    with pytest.raises(ValueError, match="max_seq_length"):
        create_pretraining_examples(train_documents, tokenizer, **{**SETTINGS, "max_seq_length": 4}, seed=0)
    with pytest.raises(ValueError, match="no token"):
        create_pretraining_examples([], tokenizer, **SETTINGS, seed=0)


def test_most_frequent_token_accuracy_predicts_the_most_frequent_train_target_and_scores_it_on_held_out_predictions():
    def predictions(ids, weights):
        return {"masked_lm_ids": np.array(ids, np.int32), "masked_lm_weights": np.array(weights, np.float32)}

    # token 7 is the train targets' most frequent (the padding's 0s, weight 0, more frequent still, do not count)
    train = predictions([[7, 7, 9, 0, 0, 0], [7, 9, 5, 0, 0, 0]], [[1, 1, 1, 0, 0, 0], [1, 1, 1, 0, 0, 0]])
    held_out = predictions([[7, 9, 0], [5, 5, 7], [7, 7, 7]], [[1, 1, 0], [1, 1, 1], [1, 1, 0]])
    vocabulary = [f"piece{i}" for i in range(10)]
    vocabulary[7] = "the"
    most_frequent = most_frequent_token_accuracy(train, held_out, vocabulary, subset=2)
    assert (most_frequent.token_id, most_frequent.token, most_frequent.label) == (7, "the", "'the' (id 7)")
    assert most_frequent.accuracy == pytest.approx(4 / 7)  # of 7 weighted predictions, 4 are 7
    assert most_frequent.subset_accuracy == pytest.approx(2 / 5)  # the first two examples' 5 predictions
    assert most_frequent_token_accuracy(train, held_out, vocabulary).subset_accuracy == pytest.approx(4 / 7)
