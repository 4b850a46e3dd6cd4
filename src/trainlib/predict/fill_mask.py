"""A fill-mask model's example input: a pre-training example's first segment as text with its ``[MASK]`` tokens (the
model itself: ``mindir_serving.fill_mask``)."""

from __future__ import annotations

import numpy as np

from mindir_serving.tokens import MASK_ID, SEP_ID


def masked_text(input_ids: np.ndarray, tokenizer) -> str:
    """The first segment of a pre-training example (``[CLS] A [SEP] …``) as text with its ``[MASK]`` tokens (the
    middle token masked when it has none): an example input of a fill-mask model."""
    ids = [int(i) for i in input_ids[1:]]
    segment = ids[: ids.index(SEP_ID)] if SEP_ID in ids else ids
    if MASK_ID not in segment:
        segment[len(segment) // 2] = MASK_ID
    words: list[str] = []
    for token in (tokenizer.id_to_token(i) for i in segment):
        if token.startswith("##") and words:
            words[-1] += token.removeprefix("##")
        else:
            words.append(token)
    return " ".join(words)
