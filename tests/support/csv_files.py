"""Every CSV file a run wrote, its numbers as people read them (``trainlib.readable``)."""

from __future__ import annotations

import csv
import re
from pathlib import Path

# how close a float read back from a CSV file is to the value written: six significant digits (trainlib.readable)
CSV_REL = 1e-5
# a decimal number as written, its mantissa's digits apart from its exponent
NUMBER = re.compile(r"^[-+]?(?P<mantissa>\d+\.?\d*|\.\d+)(?:[eE][-+]?\d+)?$")


def significant_digits(text: str) -> int:
    """The significant digits of a number as written: ``0.223333`` 6, ``1.23457e-04`` 6, ``625.868`` 6, ``12`` 2."""
    mantissa = NUMBER.match(text)["mantissa"]
    digits = mantissa.replace(".", "").lstrip("0")
    return len(digits.rstrip("0")) if "." not in mantissa else len(digits)


def decimals(text: str) -> int:
    mantissa = NUMBER.match(text)["mantissa"]
    return len(mantissa.partition(".")[2]) if "e" not in text.lower() else 0


def assert_readable_csv_files(folder: Path, most: int = 6) -> None:
    """Every number in every CSV file under ``folder`` has at most ``most`` significant digits and 8 decimals; the
    integers (counts, steps, seeds) are exact and not counted."""
    files = sorted(folder.rglob("*.csv"))
    assert files, f"no CSV file under {folder}"
    noisy = []
    for path in files:
        with path.open(newline="") as handle:
            for row in csv.reader(handle):
                noisy += [
                    f"{path.relative_to(folder)}: {cell}"
                    for cell in row
                    if NUMBER.match(cell)
                    and any(c in cell for c in ".eE")
                    and (significant_digits(cell) > most or decimals(cell) > 8)
                ]
    assert not noisy, "numbers past 6 significant digits or 8 decimals:\n" + "\n".join(noisy[:20])
