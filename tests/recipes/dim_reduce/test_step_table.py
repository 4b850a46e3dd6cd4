"""The per-step table codec of stage 2's checkpoints: the layout resumed trainings read, and its round trip."""

from __future__ import annotations

import numpy as np
import pytest

from trainlib.recipes.dim_reduce import step_table

ROWS = [
    {"epoch": 3, "step": 5, "loss": 1.25, "step_size": 0.55},
    {"epoch": 3, "step": 6, "loss": 1.0, "step_size": 0.0},
]
COLUMNS = ("epoch", "step", "loss", "step_size")


def test_each_column_is_one_float64_array_under_the_prefix():
    state = step_table.encode(ROWS, COLUMNS, "pbfgs.steps.")
    assert list(state) == [f"pbfgs.steps.{column}" for column in COLUMNS]
    assert all(values.dtype == np.float64 for values in state.values())
    np.testing.assert_array_equal(state["pbfgs.steps.step_size"], [0.55, 0.0])


def test_round_trip_gives_the_rows_back_with_integer_columns_as_ints():
    rows = step_table.decode(step_table.encode(ROWS, COLUMNS, "p."), COLUMNS, "p.", ("epoch", "step"))
    assert rows == ROWS
    assert all(isinstance(row["step"], int) and isinstance(row["loss"], float) for row in rows)
    assert step_table.decode(step_table.encode([], COLUMNS, "p."), COLUMNS, "p.", ()) == []


def test_a_missing_or_short_column_is_named():
    state = step_table.encode(ROWS, COLUMNS, "p.")
    with pytest.raises(KeyError, match="p.trials"):
        step_table.decode(state, (*COLUMNS, "trials"), "p.", ())
    state["p.loss"] = state["p.loss"][:1]
    with pytest.raises(ValueError, match="different lengths"):
        step_table.decode(state, COLUMNS, "p.", ())
