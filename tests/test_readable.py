"""Numbers and counts as people read them (``trainlib.readable``): the one place every CSV file's floats are
written, and ``1 epoch``, not ``1 epochs``."""

from __future__ import annotations

import math

import pandas as pd
import pytest

from trainlib.readable import counted, float_text, readable_frame, write_csv


@pytest.mark.parametrize(
    ("value", "text"),
    [
        (0.22333333333333333, "0.223333"),  # the float noise the issue found in the report's CSVs
        (625.8682556999393, "625.868"),
        (5.0, "5"),
        (0.0001, "0.0001"),
        (0.000123456789, "1.23457e-04"),  # %g's nine decimals, in scientific notation instead
        (123456789.0, "1.23457e+08"),
        (-0.015, "-0.015"),
    ],
)
def test_floats_keep_six_significant_digits_and_at_most_eight_decimals(value, text):
    assert float_text(value) == text
    assert float(text) == pytest.approx(value, rel=1e-5)


def test_a_written_table_holds_readable_floats_in_every_column(tmp_path):
    frame = pd.DataFrame(
        {
            "recipe": ["thor", "baseline"],
            "top1": [0.22333333333333333, math.nan],
            "mixed": [625.8682556999393, "—"],  # an object column: to_csv's float_format does not reach it
            "n": [2, 3],
        }
    )
    write_csv(frame, tmp_path / "table.csv")
    assert (tmp_path / "table.csv").read_text().splitlines() == [
        "recipe,top1,mixed,n",
        "thor,0.223333,625.868,2",
        "baseline,,—,3",
    ]
    assert frame.at[0, "mixed"] == 625.8682556999393  # the caller's frame is left as it was
    assert readable_frame(frame[["top1", "n"]]).equals(frame[["top1", "n"]])  # no mixed column: nothing to do


@pytest.mark.parametrize(("count", "text"), [(0, "0 epochs"), (1, "1 epoch"), (2, "2 epochs")])
def test_a_count_of_one_is_singular(count, text):
    assert counted(count, "epoch") == text
