"""By how much the recipes differ: single runs against the baseline and stage 2 against its control, with their
budgets; the study's means and intervals where it compared the same pair; a readable rounded table."""

from __future__ import annotations

import math

import mlflow
import pandas as pd
import pytest

from pipelines.report.differences import (
    combined,
    newest_study,
    readable,
    single_run_differences,
    study_differences,
)
from pipelines.tracking.reader import MlflowRunReader

FINALS = {
    "baseline": {"top1": 0.80, "top5": 0.99, "epochs": 2},
    "thor": {"top1": 0.83, "top5": 0.995, "epochs": 2},
    "stage2": {"top1": 0.81, "top5": 0.99, "epochs": 4},
    "control": {"top1": 0.79, "top5": 0.98, "epochs": 4},
}


def test_single_runs_give_each_recipe_against_the_baseline_and_stage2_against_its_control():
    table = single_run_differences(FINALS).set_index(["comparison", "measure"])
    assert set(table.index.get_level_values(0)) == {"thor vs baseline", "stage2 vs baseline", "stage2 vs control"}
    assert table.at[("thor vs baseline", "final_top1_difference"), "mean"] == pytest.approx(0.03)
    assert table.at[("stage2 vs control", "final_top1_difference"), "mean"] == pytest.approx(0.02)
    assert table.at[("thor vs baseline", "final_top1_difference"), "budget"] == "2 vs 2 epochs"
    assert table.at[("stage2 vs baseline", "final_top1_difference"), "budget"] == "4 vs 2 epochs (unequal)"
    assert (table["source"] == "single runs").all() and table["ci_low"].map(math.isnan).all()


def test_the_studys_intervals_replace_the_single_runs_of_the_pairs_it_compared():
    paired = pd.DataFrame(
        {
            "comparison": ["thor vs baseline", "thor vs baseline"],
            "measure": ["final_top1_difference", "time_to_target_ratio"],
            "mean": [0.0057, 0.74],
            "ci_low": [-0.0223, 0.52],
            "ci_high": [0.0337, 0.96],
            "n": [3, 3],
        }
    )
    table = combined(single_run_differences(FINALS), study_differences(paired, seeds=3, epochs=2))
    thor = table[table["comparison"] == "thor vs baseline"]
    assert list(thor["source"].unique()) == ["study, 3 seeds"] and list(thor["budget"].unique()) == ["2 epochs each"]
    assert set(table[table["source"] == "single runs"]["comparison"]) == {"stage2 vs baseline", "stage2 vs control"}
    text = readable(table)
    assert "| thor vs baseline | final_top1_difference | +0.57 pt [-2.23, +3.37] | 3 | 2 epochs each |" in text
    assert "| thor vs baseline | time_to_target_ratio | 0.74 [0.52, 0.96] | 3 |" in text
    assert "| stage2 vs control | final_top1_difference | +2.00 pt | 1 | 4 vs 4 epochs | single runs |" in text


def test_the_newest_finished_study_of_the_experiment_is_read_back(tmp_path):
    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    client = mlflow.MlflowClient(uri)
    experiment = client.create_experiment("recipes", artifact_location=(tmp_path / "mlruns").as_uri())
    reader = MlflowRunReader(uri, "recipes")
    assert newest_study(reader) is None
    paired = pd.DataFrame(
        {"comparison": ["thor vs baseline"], "measure": ["final_top1_difference"], "mean": [0.01]}
        | {"ci_low": [-0.02], "ci_high": [0.04], "n": [3]}
    )
    (tmp_path / "study").mkdir()
    paired.to_csv(tmp_path / "study/paired.csv", index=False)
    for status, epochs in (("FINISHED", "2"), ("FAILED", "9")):  # the failed one is newer and is not read
        run = client.create_run(experiment, tags={"pipeline": "study"})
        client.log_param(run.info.run_id, "study.epochs", epochs)
        client.log_artifact(run.info.run_id, str(tmp_path / "study/paired.csv"), "study")
        client.set_terminated(run.info.run_id, status)
    study = newest_study(reader)
    assert list(study["source"]) == ["study, 3 seeds"] and list(study["budget"]) == ["2 epochs each"]
    assert study["mean"].tolist() == [0.01]
