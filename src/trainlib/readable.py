"""Numbers and counts as people read them, in one place: every CSV file the project writes has its floats
written by ``float_text`` (at most ``SIGNIFICANT_DIGITS`` significant digits): the catalog's
``pipelines.catalog.CSVDataset`` and the benchmarks' ``write_csv``, and a count of things reads ``counted(1, "epoch")``:
``1 epoch``, ``2 epochs``."""

from __future__ import annotations

import math

import numpy as np
import pandas as pd

SIGNIFICANT_DIGITS = 6
# %g writes 0.000123456 in full: nine decimals; past this many, the number is written in scientific notation
MAX_DECIMALS = 8


def float_text(value: float) -> str:
    """``value`` with at most ``SIGNIFICANT_DIGITS`` significant digits and ``MAX_DECIMALS`` decimals:
    ``0.22333333333333333`` -> ``0.223333``, ``625.8682556999393`` -> ``625.868``, ``0.000123456789`` ->
    ``1.23457e-04``."""
    text = f"{value:.{SIGNIFICANT_DIGITS}g}"
    if "e" not in text and len(text.partition(".")[2]) > MAX_DECIMALS:
        text = f"{value:.{SIGNIFICANT_DIGITS - 1}e}"
    return text


def _cell(value):
    if isinstance(value, float | np.floating) and math.isfinite(value):
        return float_text(float(value))
    return value


def readable_frame(frame: pd.DataFrame) -> pd.DataFrame:
    """``frame`` with the floats of its mixed (object) columns as ``float_text``: ``to_csv``'s ``float_format``
    formats the float columns only."""
    mixed = [column for column in frame.columns if frame[column].dtype == object]
    if not mixed:
        return frame
    frame = frame.copy()
    for column in mixed:
        frame[column] = frame[column].map(_cell)
    return frame


def write_csv(frame: pd.DataFrame, path, **to_csv) -> None:
    """``frame`` as a CSV file at ``path`` (no index), its numbers as ``float_text`` writes them."""
    readable_frame(frame).to_csv(path, **{"index": False, **to_csv, "float_format": float_text})


def counted(count: int, noun: str) -> str:
    """``1 epoch``, ``2 epochs``, ``0 epochs``: ``noun`` is singular, with a regular plural."""
    return f"{count} {noun}" if count == 1 else f"{count} {noun}s"
