"""A loaded classifier: encoded images (PNG, JPEG, BMP as bytes) in, each image's top classes and their
probabilities out. Each image is decoded, resized and cropped by the evaluation's own operations
(``images.eval_image_ops``), so a model predicts on the pixels its evaluation scored, behind the checks of
``decoding``: no image can end the process."""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path

import numpy as np
import pandas as pd

from mindir_serving.decoding import ImageDecoder
from mindir_serving.files import DESCRIPTION_FILE, MINDIR_FILE
from mindir_serving.images import UnreadableImageError

ERROR_COLUMN = "error"  # empty for an image that was classified; otherwise why it could not be
WARNING_COLUMN = "warning"  # what the decoder said of an image it still read (libjpeg's "Corrupt JPEG data: …")
PROBABILITY_DIGITS = 6  # decimals of a probability: float32 softmax carries about seven


def prediction_columns(top_k: int) -> list[str]:
    """``class_1`` … ``class_k``, ``probability_1`` … ``probability_k``, ``error``, ``warning``: a prediction's
    columns."""
    ranks = range(1, top_k + 1)
    return [*(f"class_{k}" for k in ranks), *(f"probability_{k}" for k in ranks), ERROR_COLUMN, WARNING_COLUMN]


def softmax(logits: np.ndarray) -> np.ndarray:
    shifted = np.exp(logits - logits.max(axis=1, keepdims=True))
    return shifted / shifted.sum(axis=1, keepdims=True)


def padded(batch: np.ndarray, size: int) -> np.ndarray:
    """``batch`` with zero rows appended up to ``size`` rows."""
    missing = size - len(batch)
    return np.concatenate([batch, np.zeros((missing, *batch.shape[1:]), batch.dtype)]) if missing > 0 else batch


def answer_table(rows: list[dict], columns: list[str]) -> pd.DataFrame:
    """``rows`` as a table whose missing values are None, never NaN: MLflow's REST reply writes a NaN as a bare
    ``NaN``, which is not JSON, and a None as ``null``."""
    table = pd.DataFrame(rows, columns=columns, dtype=object)
    return table.where(table.notna(), None)


class MindirClassifier:
    """The MindIR network of a model folder (``trainlib.predict.export``) with its description."""

    def __init__(self, mindir_path: str | Path, description: dict):
        import mindspore as ms
        from mindspore import nn

        self.description = description
        self.classes: list[str] = description["classes"]
        self.batch_size: int = description["batch_size"]
        self._network = nn.GraphCell(ms.load(str(mindir_path)))
        self._decoder = ImageDecoder(description["image_size"], description["eval_resize_ratio"])

    @classmethod
    def from_folder(cls, folder: str | Path) -> MindirClassifier:
        folder = Path(folder)
        return cls(folder / MINDIR_FILE, json.loads((folder / DESCRIPTION_FILE).read_text()))

    def pixels(self, image: bytes) -> np.ndarray:
        """One encoded image as the network's input, ``(3, size, size)`` float32; an image that cannot be read
        raises ``UnreadableImageError`` saying why."""
        decoded = self._decoder.decode(image)
        if decoded.pixels is None:
            raise UnreadableImageError(decoded.error)
        return decoded.pixels

    def logits(self, pixels: np.ndarray) -> np.ndarray:
        """The network's outputs for a batch ``(n, 3, size, size)``."""
        import mindspore as ms

        return self._network(ms.Tensor(pixels)).asnumpy()

    def predict(self, images: Sequence[bytes], *, top_k: int) -> pd.DataFrame:
        """One row per image (``prediction_columns``): its ``top_k`` classes, most probable first. An image that
        cannot be read gets None for its classes and probabilities and its reason under ``error``; the others are
        still classified. The network reads the images in batches of its exported size, the last padded with zero
        images. ``warning``: what the decoder said of an image it read, else empty."""
        top_k = min(top_k, len(self.classes))
        rows: list[dict] = [{} for _ in images]
        decoded: list[tuple[int, np.ndarray]] = []
        warnings: dict[int, str] = {}
        for position, image in enumerate(images):
            result = self._decoder.decode(image)
            if result.pixels is None:
                rows[position] = {ERROR_COLUMN: result.error, WARNING_COLUMN: result.warning}
            else:
                decoded.append((position, result.pixels))
                warnings[position] = result.warning
        for start in range(0, len(decoded), self.batch_size):
            batch = decoded[start : start + self.batch_size]
            logits = self.logits(padded(np.stack([pixels for _, pixels in batch]), self.batch_size))[: len(batch)]
            # ranked by the logits, as the evaluation ranks them (probabilities can round to ties)
            ranked = np.argsort(-logits, axis=1)[:, :top_k]
            probabilities = softmax(logits)
            for (position, _), order, row in zip(batch, ranked, probabilities, strict=True):
                rows[position] = {
                    **{f"class_{k + 1}": self.classes[index] for k, index in enumerate(order)},
                    **{
                        f"probability_{k + 1}": round(float(row[index]), PROBABILITY_DIGITS)
                        for k, index in enumerate(order)
                    },
                    ERROR_COLUMN: "",
                    WARNING_COLUMN: warnings[position],
                }
        return answer_table(rows, prediction_columns(top_k))
