"""The images to classify and how well a model did on the labelled ones.

``list_images`` takes a folder (every image below it; an image in a folder named after one of the model's classes is
labelled with that class) or a manifest CSV of the data pipeline (the rows of one split, labelled)."""

from __future__ import annotations

import re
from collections.abc import Callable, Sequence
from pathlib import Path

import numpy as np
import pandas as pd

from trainlib.data.verify import IMAGE_EXTENSIONS

IMAGE_COLUMNS = ["path", "class_name"]  # class_name: the true class where known, else empty


class ImageSourceError(ValueError):
    """An image source that is missing, empty or a manifest without the split asked for."""


def list_images(source: str | Path, *, split: str, classes: Sequence[str]) -> pd.DataFrame:
    """``IMAGE_COLUMNS`` of every image ``source`` names, in a stable order (see the module docstring)."""
    source = Path(source)
    if source.suffix == ".csv" and source.is_file():
        manifest = pd.read_csv(source)
        rows = manifest[manifest["split"] == split]
        if rows.empty:
            raise ImageSourceError(
                f"the manifest {source} has no '{split}' rows: set predict.split to one of "
                f"{sorted(manifest['split'].unique())}"
            )
        return rows[IMAGE_COLUMNS].reset_index(drop=True)
    if not source.is_dir():
        raise ImageSourceError(f"predict.images {source} is neither a folder nor a manifest CSV")
    paths = sorted(p for p in source.rglob("*") if p.is_file() and p.suffix.lower() in IMAGE_EXTENSIONS)
    if not paths:
        raise ImageSourceError(f"predict.images {source} holds no image ({', '.join(IMAGE_EXTENSIONS)})")
    known = set(classes)
    labels = [p.parent.name if p.parent.name in known else "" for p in paths]
    return pd.DataFrame({"path": [str(p) for p in paths], "class_name": labels})


def accuracy(predictions: pd.DataFrame) -> dict[str, float]:
    """Top-1 and top-k (fractions; k the number of classes predicted per image, ``class_1`` … ``class_k``) over the
    classified images whose true class is known, and their count under ``images``; empty when none is."""
    scored = predictions[(predictions["class_name"].fillna("") != "") & (predictions["error"] == "")]
    if scored.empty:
        return {}
    ranks = [column for column in predictions.columns if re.fullmatch(r"class_\d+", column)]
    hits = scored[ranks].to_numpy() == scored["class_name"].to_numpy()[:, None]
    return {
        "top1": float(np.mean(hits[:, 0])),
        f"top{len(ranks)}": float(np.mean(hits.any(axis=1))),
        "images": len(scored),
    }


def classify(images: pd.DataFrame, predict: Callable[[list[bytes]], pd.DataFrame]) -> pd.DataFrame:
    """``images`` (``IMAGE_COLUMNS``) with the model's columns beside each row: ``predict`` gets the files'
    contents (``trainlib.predict.classifier``'s columns back, ``error`` empty where an image was classified).
    A file that cannot be read gets its reason under ``error`` and is not sent."""
    contents: list[bytes] = []
    unreadable: dict[int, str] = {}
    for position, path in enumerate(images["path"]):
        try:
            contents.append(Path(path).read_bytes())
        except OSError as error:
            unreadable[position] = f"cannot read the file: {error.strerror or error}"
            contents.append(b"")
    predicted = predict(contents).reset_index(drop=True)
    for position, reason in unreadable.items():
        predicted.loc[position, "error"] = reason
    return pd.concat([images.reset_index(drop=True), predicted], axis=1)


def bad_images(predictions: pd.DataFrame) -> pd.DataFrame:
    """The rows of ``predictions`` that got no classes or a decoder's warning: ``path``, ``error``, ``warning`` (a
    model logged before the ``warning`` column gives none)."""
    warnings = predictions["warning"].fillna("") if "warning" in predictions else pd.Series("", predictions.index)
    flagged = predictions.assign(warning=warnings)
    return flagged.loc[(flagged["error"] != "") | (warnings != ""), ["path", "error", "warning"]].reset_index(drop=True)
