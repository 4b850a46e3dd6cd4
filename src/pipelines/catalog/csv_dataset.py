"""``CSVDataset``: kedro-datasets' pandas ``CSVDataset`` whose floats are written as people read them
(``trainlib.readable.float_text``: ``0.223333``, not ``0.22333333333333333``), the catalog's one CSV type."""

from __future__ import annotations

from typing import Any

import pandas as pd
from kedro_datasets.pandas import CSVDataset as PandasCSVDataset

from trainlib.readable import float_text, readable_frame


class CSVDataset(PandasCSVDataset):
    """A table as a CSV file, every float with at most six significant digits; otherwise kedro-datasets' own.

    Example catalog entry::

        report.table:
          type: pipelines.catalog.CSVDataset
          filepath: data/08_reporting/report/comparison.csv
    """

    def __init__(self, *, save_args: dict[str, Any] | None = None, **kwargs):
        super().__init__(save_args={**(save_args or {}), "float_format": float_text}, **kwargs)

    def save(self, data: pd.DataFrame) -> None:
        super().save(readable_frame(data))
