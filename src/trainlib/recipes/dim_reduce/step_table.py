"""A stage-2 training's per-step table in its checkpoints' optimizer state: one float64 array per column.

Stage 2 (P-BFGS or boost's DimReduce) reports a row per step; the rows travel in each epoch checkpoint under
``<prefix><column>``, so a resumed training has every earlier step to report again.
"""

from __future__ import annotations

from collections.abc import Collection, Mapping, Sequence

import numpy as np


def encode(rows: Sequence[Mapping[str, float]], columns: Sequence[str], prefix: str) -> dict[str, np.ndarray]:
    """``{prefix + column: that column of every row, as float64}`` for each of ``columns``."""
    return {prefix + column: np.array([row[column] for row in rows], np.float64) for column in columns}


def decode(
    state: Mapping[str, np.ndarray], columns: Sequence[str], prefix: str, integer_columns: Collection[str]
) -> list[dict[str, float]]:
    """The rows ``encode`` stored in ``state`` under ``prefix``: ``integer_columns`` as ints, the others as floats.

    Raises ``KeyError`` with the first missing key (``prefix + column``) and ``ValueError`` when the columns differ
    in length.
    """
    arrays = {column: state[prefix + column] for column in columns}
    lengths = {column: len(values) for column, values in arrays.items()}
    if len(set(lengths.values())) > 1:
        raise ValueError(f"the step table under {prefix} has columns of different lengths: {lengths}")
    count = lengths[columns[0]]
    return [
        {column: int(values[i]) if column in integer_columns else float(values[i]) for column, values in arrays.items()}
        for i in range(count)
    ]
