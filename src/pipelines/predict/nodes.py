"""Nodes of the ``predict`` pipeline (the library: ``trainlib.predict``; the model: ``pipelines.tracking.models``)."""

from __future__ import annotations

import logging

import pandas as pd

from pipelines import tracking
from pipelines.tracking.models import load_model, model_classes, predictor
from trainlib.params import PredictParams
from trainlib.predict.images import accuracy, bad_images, classify, list_images

logger = logging.getLogger(__name__)

SHOWN_BAD_IMAGES = 5  # named in the log; bad_images.csv lists them all


def predict_images(predict: PredictParams) -> tuple[pd.DataFrame, pd.DataFrame]:
    """The top ``predict.top_k`` classes (at most the model's) of every image ``predict.images`` names, by the model
    ``predict.model``, and the images it could not classify or classified despite a decoder's warning. Where the
    images' classes are known, top-1/top-k go to the run as ``predict/top1``, ``predict/top<k>``;
    ``predict/images`` and ``predict/bad_images`` always."""
    model = load_model(predict.model)
    images = list_images(predict.images, split=predict.split, classes=model_classes(model))
    predictions = classify(images, predictor(model, top_k=predict.top_k))
    flagged = bad_images(predictions)
    bad = flagged[flagged["error"] != ""]
    if len(bad):
        named = ", ".join(f"{row.path} ({row.error})" for row in bad.head(SHOWN_BAD_IMAGES).itertuples())
        logger.warning("%d of %d images could not be classified: %s", len(bad), len(predictions), named)
    warned = flagged[flagged["error"] == ""]
    if len(warned):
        named = ", ".join(f"{row.path} ({row.warning})" for row in warned.head(SHOWN_BAD_IMAGES).itertuples())
        logger.warning(
            "%d of %d images were classified despite the decoder's warning: %s", len(warned), len(predictions), named
        )
    scores = accuracy(predictions)
    if scores:
        logger.info(
            "%s: %s on %d labelled images",
            predict.model,
            ", ".join(
                f"{key.replace('top', 'top-')} {100 * value:.2f}%" for key, value in scores.items() if key != "images"
            ),
            scores["images"],
        )
    summary = {"images": len(predictions), "bad_images": len(bad), **{k: v for k, v in scores.items() if k != "images"}}
    tracking.log_metrics({f"predict/{key}": value for key, value in summary.items()})
    return predictions, flagged
