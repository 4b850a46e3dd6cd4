"""``conf/base/parameters_predict.yml``: a registered model's predictions on a folder of images."""

from __future__ import annotations

from typing import Annotated

from pydantic import Field

from trainlib.params.base import Section
from trainlib.params.numbers import PositiveInt


class PredictParams(Section):
    model: Annotated[str, Field(min_length=1)]  # models:/<name>@<alias> | models:/<name>/<version> | runs:/… | a run id
    images: Annotated[str, Field(min_length=1)]  # a folder of images, or a manifest CSV (its `split` rows)
    split: str
    top_k: PositiveInt
