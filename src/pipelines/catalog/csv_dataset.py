"""``CSVDataset``: kedro-datasets' pandas ``CSVDataset`` whose floats are written as people read them
(``trainlib.readable.float_text``: ``0.223333``, not ``0.22333333333333333``), the catalog's one CSV type; an entry
may ask for no file at all when a table has no rows (``write_empty: false``)."""

from __future__ import annotations

from typing import Any

import pandas as pd
from kedro_datasets.pandas import CSVDataset as PandasCSVDataset

from trainlib.readable import float_text, readable_frame


class CSVDataset(PandasCSVDataset):
    """A table as a CSV file, every float with at most six significant digits; otherwise kedro-datasets' own.

    ``write_empty: false``: a table without rows writes no file (and removes the one an earlier run wrote), so no
    header-only file stands for "nothing here"; loading it then gives an empty table. For a table that is empty for a
    reason (the report's explained variance without a dim_reduce run), not for one whose emptiness is a finding.

    Example catalog entry::

        report.table:
          type: pipelines.catalog.CSVDataset
          filepath: data/08_reporting/report/comparison.csv
    """

    def __init__(self, *, save_args: dict[str, Any] | None = None, write_empty: bool = True, **kwargs):
        super().__init__(save_args={**(save_args or {}), "float_format": float_text}, **kwargs)
        self._write_empty = write_empty

    def save(self, data: pd.DataFrame) -> None:
        if data.empty and not self._write_empty:
            path = self._get_save_path()
            if self._fs.exists(path):
                self._fs.rm(path)
            return
        super().save(readable_frame(data))

    def load(self) -> pd.DataFrame:
        if not self._write_empty and not self._fs.exists(self._get_load_path()):
            return pd.DataFrame()  # saved without rows: nothing was written
        return super().load()
