"""Run the ``study`` pipeline as a user does (``kedro run --pipelines=study --params=...`` in a process of its
own) and read back its tables; shared by the benchmarks that compare recipes (``thor_vs_momentum.py``,
``dim_reduce_gain.py``, ``regime_search.py``), so none keeps a training loop of its own."""

from __future__ import annotations

import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import pandas as pd

from trainlib.params.recipe_spec import result_named
from trainlib.report.differences import POINTS, in_points

PROJECT = Path(__file__).resolve().parents[1]
STUDY_OUTPUT = PROJECT / "data/08_reporting/study"
TABLES = ("runs", "summary", "paired")


@dataclass(frozen=True)
class StudyOutcome:
    runs: pd.DataFrame  # one row per (result row, seed): column ``result``
    summary: pd.DataFrame  # per result: mean, 95 % CI, n of each measure
    paired: pd.DataFrame  # thor vs baseline, stage2 vs control: mean, 95 % CI, n
    wall_s: float  # the whole kedro run, data checks and evaluations included


def params_argument(overrides: dict[str, object]) -> str:
    """``--params`` text of dotted-key overrides; lists in brackets."""

    def text(value: object) -> str:
        return "[" + ",".join(map(str, value)) + "]" if isinstance(value, list | tuple) else str(value)

    return ",".join(f"{key}={text(value)}" for key, value in overrides.items())


def run_study(overrides: dict[str, object], env: str | None = None, extra_params: str = "") -> StudyOutcome:
    """``kedro run --pipelines=study`` with ``overrides``, then ``extra_params`` (``--params`` text, which wins)."""
    command = [str(Path(sys.executable).parent / "kedro"), "run", "--pipelines=study"]
    command += [f"--env={env}"] if env else []
    params = ",".join(filter(None, (params_argument(overrides), extra_params)))
    command += [f"--params={params}"] if params else []
    print("$ " + " ".join(command), flush=True)
    started = time.perf_counter()
    subprocess.run(command, cwd=PROJECT, check=True)
    wall_s = time.perf_counter() - started
    return StudyOutcome(*(read_table(STUDY_OUTPUT / f"{table}.csv") for table in TABLES), wall_s)


def read_table(path: Path) -> pd.DataFrame:
    """A study's table, its result row in the column ``result`` (one written before the rename named it ``recipe``)."""
    return result_named(pd.read_csv(path))


def interval(mean: float, low: float, high: float, points: bool) -> str:
    """``+1.23 pt [-0.40, +2.86]`` for a difference of fractions, ``0.84 [0.61, 1.07]`` for a ratio."""
    if points:
        return f"{100 * mean:+.2f} pt [{100 * low:+.2f}, {100 * high:+.2f}]"
    return f"{mean:.2f} [{low:.2f}, {high:.2f}]"


def print_outcome(outcome: StudyOutcome) -> None:
    print(f"\nstudy: {outcome.wall_s / 60:.1f} min")
    print(outcome.runs.drop(columns=["mlflow_run_id", "key"]).to_string(index=False, float_format="{:.4f}".format))
    # paired.csv gives accuracy differences in points (unit pt); in_points converts a table written before it did
    for _, row in in_points(outcome.paired).iterrows():
        points = row["unit"] == POINTS
        scale = 0.01 if points else 1.0
        cell = interval(scale * row["mean"], scale * row["ci_low"], scale * row["ci_high"], points)
        print(f"{row['comparison']}, {row['measure']}: {cell}, n = {row['n']} seeds (95 % t-interval)")
