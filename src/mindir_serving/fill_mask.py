"""A loaded BERT (``trainlib.predict.export.export_fill_mask``): texts with ``[MASK]`` in, the most probable token of
each mask out.

Each text becomes ``[CLS] tokens [SEP]`` by the training's own tokenizer, padded to the exported sequence length;
the masked positions go to the masked-LM head, as the pre-training examples give them."""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path

import numpy as np
import pandas as pd

from mindir_serving.classifier import ERROR_COLUMN, PROBABILITY_DIGITS, answer_table, padded, softmax
from mindir_serving.files import DESCRIPTION_FILE, MINDIR_FILE
from mindir_serving.tokens import CLS_ID, MASK_ID, PAD_ID, SEP_ID, tokenizer_from_json

MASK_TOKEN = "[MASK]"
FILL_MASK_COLUMNS = ["filled", "candidates", ERROR_COLUMN]  # candidates: per mask, JSON [[token, probability], …]


class MindirFillMask:
    """The MindIR BERT of a model folder with its description (tokenizer, sequence length, masked positions)."""

    def __init__(self, mindir_path: str | Path, description: dict):
        import mindspore as ms
        from mindspore import nn

        self.description = description
        self.tokenizer = tokenizer_from_json(description["tokenizer"])
        self.max_seq_length: int = description["max_seq_length"]
        self.max_predictions: int = description["max_predictions"]
        self._network = nn.GraphCell(ms.load(str(mindir_path)))

    @classmethod
    def from_folder(cls, folder: str | Path) -> MindirFillMask:
        folder = Path(folder)
        return cls(folder / MINDIR_FILE, json.loads((folder / DESCRIPTION_FILE).read_text()))

    def encode(self, text: str) -> tuple[np.ndarray, np.ndarray]:
        """The token ids of ``text`` (``[CLS] … [SEP]``, padded) and its masked positions (padded with 0); a text
        without a mask, with more masks than the model predicts, or longer than its sequences raises ``ValueError``."""
        ids = [CLS_ID, *self.tokenizer.encode(text, add_special_tokens=False).ids, SEP_ID]
        positions = [position for position, token in enumerate(ids) if token == MASK_ID]
        if not positions:
            raise ValueError(f"no {MASK_TOKEN} in the text")
        if len(positions) > self.max_predictions:
            raise ValueError(f"{len(positions)} masks: the model predicts at most {self.max_predictions} per text")
        if len(ids) > self.max_seq_length:
            raise ValueError(f"{len(ids)} tokens with [CLS] and [SEP]: the model reads at most {self.max_seq_length}")
        sequence = np.full(self.max_seq_length, PAD_ID, np.int32)
        sequence[: len(ids)] = ids
        masked = np.zeros(self.max_predictions, np.int32)
        masked[: len(positions)] = positions
        return sequence, masked

    def predict(self, texts: Sequence[str], *, top_k: int, batch_size: int) -> pd.DataFrame:
        """One row per text: ``filled`` (each mask replaced by its most probable token), ``candidates`` (per mask,
        its ``top_k`` tokens and probabilities as JSON) and ``error`` (why a text could not be read; the others are
        still filled)."""
        import mindspore as ms

        rows: list[dict] = [{} for _ in texts]
        encoded: list[tuple[int, np.ndarray, np.ndarray]] = []
        for position, text in enumerate(texts):
            try:
                encoded.append((position, *self.encode(text)))
            except ValueError as error:
                rows[position] = {ERROR_COLUMN: str(error)}
        for start in range(0, len(encoded), batch_size):
            batch = encoded[start : start + batch_size]
            # MindSpore compiles once per input shape: a few shapes (powers of two) serve every request
            rows_in = min(batch_size, 1 << max(len(batch) - 1, 0).bit_length())
            ids = padded(np.stack([ids for _, ids, _ in batch]), rows_in)
            positions = padded(np.stack([masked for _, _, masked in batch]), rows_in)
            inputs = [ms.Tensor(ids), ms.Tensor((ids != PAD_ID).astype(np.int32)), ms.Tensor(np.zeros_like(ids))]
            mlm_logits, _ = self._network(*inputs, ms.Tensor(positions))
            logits = mlm_logits.asnumpy().reshape(len(ids), self.max_predictions, -1)
            for (position, sequence, _), text_logits in zip(batch, logits, strict=False):
                rows[position] = self._filled(texts[position], text_logits[: int((sequence == MASK_ID).sum())], top_k)
        return answer_table(rows, FILL_MASK_COLUMNS)

    def _filled(self, text: str, logits: np.ndarray, top_k: int) -> dict:
        probabilities = softmax(logits)
        candidates, filled = [], text
        for mask_logits, mask_probabilities in zip(logits, probabilities, strict=True):
            ranked = np.argsort(-mask_logits)[:top_k]
            tokens = [self.tokenizer.id_to_token(int(index)) for index in ranked]
            candidates.append(
                [
                    [t, round(float(mask_probabilities[i]), PROBABILITY_DIGITS)]
                    for t, i in zip(tokens, ranked, strict=True)
                ]
            )
            filled = filled.replace(MASK_TOKEN, tokens[0].removeprefix("##"), 1)
        return {"filled": filled, "candidates": json.dumps(candidates), ERROR_COLUMN: ""}
