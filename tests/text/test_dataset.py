"""The batched MindSpore dataset over the examples: columns, batches, shards, seeded order."""

from __future__ import annotations

import mindspore.dataset as ds
import numpy as np
import pytest

from trainlib.text.dataset import create_text_dataset
from trainlib.text.examples import COLUMNS

ROWS, LENGTH, PREDICTIONS = 48, 8, 3


def fake_examples(rows: int = ROWS) -> dict[str, np.ndarray]:
    """Examples whose every value tells its row: row r holds r (and r + 0.5 in the weights)."""
    row = np.arange(rows, dtype=np.int32)
    examples = {name: np.repeat(row[:, None], LENGTH, axis=1) for name in ("input_ids", "input_mask", "token_type_ids")}
    examples["next_sentence_labels"] = row.copy()
    for name in ("masked_lm_positions", "masked_lm_ids"):
        examples[name] = np.repeat(row[:, None], PREDICTIONS, axis=1)
    examples["masked_lm_weights"] = np.repeat(row[:, None], PREDICTIONS, axis=1).astype(np.float32) + 0.5
    return {name: examples[name] for name in reversed(COLUMNS)}  # the dataset must not follow the dict's order


def rows_seen(dataset) -> list[int]:
    return [
        int(value)
        for batch in dataset.create_dict_iterator(num_epochs=1, output_numpy=True)
        for value in batch["next_sentence_labels"]
    ]


def test_batches_hold_the_columns_in_order_with_their_dtypes():
    dataset = create_text_dataset(fake_examples(), batch_size=5, training=True, rank=0, rank_size=1, seed=0)
    assert dataset.get_col_names() == list(COLUMNS)
    batches = list(dataset.create_tuple_iterator(num_epochs=1, output_numpy=True))
    assert len(batches) == ROWS // 5  # the last partial batch dropped
    for batch in batches:
        shapes = [column.shape for column in batch]
        assert shapes == [(5, LENGTH)] * 3 + [(5,)] + [(5, PREDICTIONS)] * 3
        assert [column.dtype for column in batch] == [np.int32] * 6 + [np.float32]
        rows = batch[COLUMNS.index("next_sentence_labels")]
        for name, column in zip(COLUMNS, batch, strict=True):  # each column's values are its own row's
            expected = rows + (0.5 if name == "masked_lm_weights" else 0)
            assert (column.reshape(5, -1) == expected[:, None]).all(), name


def test_evaluation_keeps_every_row_in_order():
    dataset = create_text_dataset(fake_examples(), batch_size=5, training=False, rank=0, rank_size=1, seed=0)
    assert rows_seen(dataset) == list(range(ROWS))


@pytest.mark.parametrize("training", [True, False])
def test_shards_are_disjoint_and_cover_the_rows(training):
    shards = [
        rows_seen(create_text_dataset(fake_examples(), batch_size=4, training=training, rank=r, rank_size=3, seed=0))
        for r in range(3)
    ]
    assert [len(shard) for shard in shards] == [ROWS // 3] * 3
    assert sorted(sum(shards, [])) == list(range(ROWS))


def test_training_order_follows_the_dataset_seed():
    dataset = create_text_dataset(fake_examples(), batch_size=4, training=True, rank=0, rank_size=1, seed=0)
    orders = []
    for seed in (7, 7, 8):
        ds.config.set_seed(seed)  # as the engine does before each epoch's iterator
        orders.append(rows_seen(dataset))
    assert orders[0] == orders[1] != orders[2]
    assert sorted(orders[2]) == list(range(ROWS)) and orders[2] != list(range(ROWS))


def test_too_few_examples_for_a_batch_are_refused():
    with pytest.raises(ValueError, match="batch_size 16 is larger than the 12 examples"):
        create_text_dataset(fake_examples(), batch_size=16, training=True, rank=0, rank_size=4, seed=0)
    # the error names the parameter to change, and the keys that make more examples
    key = "thor_bert.eval_batch_size"
    with pytest.raises(ValueError, match=rf"^{key} 128 is larger than the 9 examples .*: lower {key}, .*max_documents"):
        create_text_dataset(
            fake_examples(9), batch_size=128, training=False, rank=0, rank_size=1, seed=0, batch_key=key
        )
    examples = fake_examples()
    del examples["masked_lm_ids"]
    with pytest.raises(ValueError, match="masked_lm_ids"):
        create_text_dataset(examples, batch_size=4, training=True, rank=0, rank_size=1, seed=0)
