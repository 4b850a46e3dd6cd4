"""The batched MindSpore dataset over BERT pre-training examples (``trainlib.text.examples``)."""

from __future__ import annotations

import numpy as np

from trainlib.text.examples import COLUMNS


def create_text_dataset(
    examples: dict[str, np.ndarray],
    *,
    batch_size: int,
    training: bool,
    rank: int,
    rank_size: int,
    seed: int,
    batch_key: str = "batch_size",
):
    """A MindSpore dataset of batches of ``batch_size`` examples, columns in ``COLUMNS`` order, this rank's
    shard of the rows when ``rank_size`` > 1 (MindSpore's distributed sampler: every ``rank_size``-th row from
    ``rank``; when the rows do not divide evenly, shards are topped up with rows from the start so that every
    rank reads as many).

    Training: rows shuffled by MindSpore's dataset seed (set to ``seed`` here; the engine sets it again before
    each epoch's iterator, so each epoch has its own order, the same in every run), the last partial batch
    dropped. Evaluation: rows in order, every row kept. Raises ``ValueError`` when a rank's rows make no full
    batch (naming ``batch_key``, the parameter that set ``batch_size``) or a column is missing.
    """
    import mindspore.dataset as ds

    missing = [name for name in COLUMNS if name not in examples]
    if missing:
        raise ValueError(f"the examples lack columns {missing}: expected {list(COLUMNS)}")
    rows = len(examples[COLUMNS[0]])
    per_rank = rows // rank_size
    if per_rank < batch_size:
        raise ValueError(
            f"{batch_key} {batch_size} is larger than the {per_rank} examples each of {rank_size} rank(s) reads "
            f"({rows} in all): lower {batch_key}, or make more examples (more documents: "
            "thor_bert.corpus.max_documents null takes all; a larger thor_bert.examples.dupe_factor)"
        )
    ds.config.set_seed(seed)
    dataset = ds.NumpySlicesDataset(
        tuple(examples[name] for name in COLUMNS),
        column_names=list(COLUMNS),
        shuffle=training,
        num_shards=rank_size if rank_size > 1 else None,
        shard_id=rank if rank_size > 1 else None,
    )
    return dataset.batch(batch_size, drop_remainder=training)
