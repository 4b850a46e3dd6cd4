"""The study's result files (``trainlib.study.runner``): a finished training is read back, not trained again, and a
file written before the result row was named ``result`` (its ``recipe`` key held the row) still reads."""

from __future__ import annotations

import json
from contextlib import contextmanager

import pandas as pd

from trainlib.metrics import STEP_KEY, TRAIN_ELAPSED_S, TRAIN_EPOCH_TIME_S, VAL_STEP_TOP1, VAL_TOP1, VAL_TOP5
from trainlib.params.recipe_spec import result_named
from trainlib.study.runner import StudyPlan, run_study
from trainlib.study.statistics import RUN_COLUMNS, runs_table, summarise

FINGERPRINT = "f00d"


class ReadBackOnly:
    """A ``RecipeTrainer`` whose trainings all finished earlier: training one is a failure of the test."""

    def configured(self, key: str) -> object:
        raise AssertionError(key)

    def configuration(self, recipe, seed, values) -> str:
        return FINGERPRINT

    def train(self, recipe, seed, key, results, values, tracking):
        raise AssertionError(f"{key} trained again")


class Recorded:
    """A ``StudyTracking`` that keeps each child run's name and tags."""

    def __init__(self):
        self.runs: list[tuple[str, dict[str, str]]] = []

    @contextmanager
    def run(self, name, tags, params):
        self.runs.append((name, dict(tags)))
        yield None

    def callbacks(self):
        return []

    def log_final(self, accuracy):
        pass

    def set_tags(self, tags):
        pass

    def fail_runs(self, run_ids, *, error):
        pass


def old_record(row: str, seed: int, key: str) -> dict:
    """A result file's record as the study wrote it before 2026-11-28: the result row under ``recipe``."""
    return {
        "recipe": row,
        "seed": seed,
        "key": key,
        "mlflow_run_id": f"run-{row}",
        "final_top1": 0.5,
        "final_top5": 0.9,
        "step_metric": VAL_STEP_TOP1,
        "steps_per_epoch": 10,
        "history": [{"epoch": 1, TRAIN_EPOCH_TIME_S: 3.0, VAL_TOP1: 0.5, VAL_TOP5: 0.9}],
        "step_history": [{STEP_KEY: 10, TRAIN_ELAPSED_S: 3.0, VAL_STEP_TOP1: 0.5}],
    }


def test_a_result_file_written_before_the_result_row_was_named_result_is_read(tmp_path):
    key = f"dim_reduce-seed0-{FINGERPRINT}"
    (tmp_path / "runs").mkdir()
    for row in ("stage2", "control"):
        (tmp_path / "runs" / f"{key}.{row}.json").write_text(json.dumps(old_record(row, 0, key)))
    tracking = Recorded()
    plan = StudyPlan(["dim_reduce"], [0], epochs=1, eval_every_steps=10, directory=tmp_path)

    records = run_study(ReadBackOnly(), plan, tracking)

    assert [record["result"] for record in records] == ["stage2", "control"]
    assert all("recipe" not in record for record in records)
    # each read back has its child run, tagged with its recipe and its result row
    assert [(tags["recipe"], tags["result"], tags["reused"]) for _, tags in tracking.runs] == [
        ("dim_reduce", "stage2", "true"),
        ("dim_reduce", "control", "true"),
    ]
    runs = runs_table(records, {VAL_STEP_TOP1: 0.4})
    assert list(runs.columns) == RUN_COLUMNS and list(runs["result"]) == ["stage2", "control"]
    assert list(summarise(runs)["result"]) == ["stage2", "control"]


def test_a_table_written_before_is_read_with_its_result_column_renamed():
    old = pd.DataFrame({"recipe": ["thor", "baseline"], "seed": [0, 0]})
    assert list(result_named(old).columns) == ["result", "seed"]
    assert list(old.columns) == ["recipe", "seed"]  # the table read is left as it is
    new = pd.DataFrame({"result": ["thor"], "seed": [0]})
    assert result_named(new) is new  # a file of now: nothing to rename
    assert result_named({"recipe": "stage2", "seed": 1}) == {"result": "stage2", "seed": 1}
