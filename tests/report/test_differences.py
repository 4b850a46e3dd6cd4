"""By how much the recipes differ, one source per statement: the study's paired differences (means and intervals)
where it compared the pair, else single runs at equal budget; single runs of unequal budget left out with the
reason; a verdict sentence first; accuracy differences in points, rounded as printed, everywhere."""

from __future__ import annotations

import logging
import math

import mlflow
import pandas as pd
import pytest

from pipelines.tracking.reader import MlflowRunReader
from tests.support.report_files import assert_honest_figures
from tests.support.report_store import STUDIED_FINALS, log_recipe_run, log_study_walk
from tests.support.stores import EXPERIMENT
from trainlib.readable import float_text
from trainlib.report.compare import compare
from trainlib.report.differences import (
    by_how_much,
    combined,
    in_points,
    newest_study,
    readable,
    single_run_differences,
    study_differences,
    verdict,
)
from trainlib.report.figures import compared_histories, figures
from trainlib.study.statistics import paired_differences

FINALS = {
    "baseline": {"top1": 0.80, "top5": 0.99, "epochs": 2},
    "thor": {"top1": 0.83, "top5": 0.995, "epochs": 2},
    "stage2": {"top1": 0.81, "top5": 0.99, "epochs": 4},
    "control": {"top1": 0.79, "top5": 0.98, "epochs": 4},
}
TARGET = 0.75


def test_single_runs_at_equal_budget_are_compared_in_points_and_the_others_left_out():
    settings = {name: {"data.max_per_class.train": "1500"} for name in FINALS}
    settings["thor"] = {"data.max_per_class.train": "60"}
    table, left_out = single_run_differences(FINALS, settings=settings)
    table = table.set_index(["comparison", "measure"])
    assert set(table.index.get_level_values(0)) == {"stage2 vs control"}  # same run, same budget
    assert table.at[("stage2 vs control", "final_top1_difference"), "mean"] == 2.0  # points, no float noise
    assert table.at[("stage2 vs control", "final_top1_difference"), "unit"] == "pt"
    assert table.at[("stage2 vs control", "final_top1_difference"), "budget"] == "4 epochs each"
    assert (table["source"] == "single runs at equal budget").all() and table["ci_low"].map(math.isnan).all()
    assert dict(zip(left_out["comparison"], left_out["reason"], strict=True)) == {
        "thor vs baseline": "unequal budget: data.max_per_class.train 60 vs 1500",
        "stage2 vs baseline": "unequal budget: epochs 4 vs 2",
    }


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
    single, _ = single_run_differences(FINALS)
    table = combined(single, study_differences(paired, seeds=3, epochs=2))
    thor = table[table["comparison"] == "thor vs baseline"]
    assert list(thor["source"].unique()) == ["study, 3 seeds"] and list(thor["budget"].unique()) == ["2 epochs each"]
    assert thor["mean"].tolist() == [0.57, 0.74] and thor["unit"].tolist() == ["pt", "ratio"]
    text = readable(table, target_top1=TARGET)
    assert text.startswith("Inconclusive: thor - baseline is +0.57 pt final top-1, but the 95 % CI [-2.23, +3.37] pt ")
    assert "## From the study, 3 seeds\n" in text and "## From the single runs at equal budget" in text
    assert "| thor vs baseline | final_top1_difference | +0.57 pt [-2.23, +3.37] | 3 | 2 epochs each |" in text
    assert "| thor vs baseline | time_to_target_ratio | 0.74 [0.52, 0.96] | 3 |" in text
    assert "| stage2 vs control | final_top1_difference | +2.00 pt | 1 | 4 epochs each |" in text


@pytest.mark.parametrize(
    ("mean", "low", "high", "n", "sentence"),
    [
        (0.185, 0.1726, 0.1974, 3, "thor beat baseline by +18.50 pt final top-1 (95 % CI [+17.26, +19.74] pt; "),
        (-0.03, -0.05, -0.01, 3, "baseline beat thor by +3.00 pt final top-1 (95 % CI [-5.00, -1.00] pt for thor "),
        (0.01, -0.02, 0.04, 3, "Inconclusive: thor - baseline is +1.00 pt final top-1, but the 95 % CI [-2.00, "),
    ],
    ids=["thor-won", "baseline-won", "spans-zero"],
)
def test_the_verdict_says_who_won_by_how_much_or_inconclusive(mean, low, high, n, sentence):
    paired = pd.DataFrame(
        {"comparison": ["thor vs baseline"], "measure": ["final_top1_difference"], "mean": [mean]}
        | {"ci_low": [low], "ci_high": [high], "n": [n]}
    )
    assert verdict(study_differences(paired, seeds=n, epochs=2)).startswith(sentence)


def test_one_run_each_is_inconclusive_and_nothing_to_compare_says_so():
    single, _ = single_run_differences({"baseline": FINALS["baseline"], "thor": FINALS["thor"]})
    assert verdict(single) == (
        "Inconclusive: thor - baseline is +3.00 pt final top-1 from one run each (single runs at equal budget, "
        "2 epochs each), with no interval; run the study for one."
    )
    assert verdict(single.iloc[0:0]).startswith("No verdict: no study in the experiment and no pair of single runs")


def test_a_budget_of_one_epoch_is_singular():
    paired = pd.DataFrame(
        {"comparison": ["thor vs baseline"], "measure": ["final_top1_difference"], "mean": [0.01]}
        | {"ci_low": [-0.02], "ci_high": [0.04], "n": [2]}
    )
    assert list(study_differences(paired, seeds=2, epochs=1)["budget"]) == ["1 epoch each"]
    finals = {name: {"top1": 0.5, "top5": 0.9, "epochs": 1.0} for name in ("baseline", "thor")}
    single, _ = single_run_differences(finals)
    assert set(single["budget"]) == {"1 epoch each"}


def test_fewer_than_three_seeds_give_the_seeds_needed_not_an_interval_of_everything():
    """The issue's 2-seed study: +2 pt, seeds 20 pt apart, whose t-interval (one degree of freedom) is cut to
    [-100, +100] pt. The report gives the study's estimate of the seeds that would decide instead, in the CSV (no
    interval, the estimate in its column) and in the summary; a 1-seed study says it has no spread."""
    runs = pd.DataFrame(
        {"result": ["baseline"] * 2 + ["thor"] * 2, "seed": [0, 1] * 2, "final_top1": [0.75, 0.74, 0.87, 0.66]}
        | {"final_top5": [0.99] * 4, "time_to_target_s": [math.nan] * 4, "epochs_to_target": [math.nan] * 4}
    )
    paired = in_points(paired_differences(runs))  # paired.csv, as the study writes it
    study = paired.set_index("measure").loc["final_top1_difference"]
    assert (study["ci_low"], study["ci_high"]) == (-100.0, 100.0) and study["seeds_to_decide"] > 3
    table = study_differences(paired, seeds=2, epochs=2)
    top1 = table.set_index("measure").loc["final_top1_difference"]
    assert math.isnan(top1["ci_low"]) and math.isnan(top1["ci_high"]) and top1["n"] == 2
    assert top1["seeds_to_decide"] == study["seeds_to_decide"]
    needed = f"about {study['seeds_to_decide']:.0f} seeds would decide at this spread"
    summary = readable(table, target_top1=TARGET)
    assert summary.splitlines()[0] == (
        f"Inconclusive: thor - baseline is +2.00 pt final top-1 from 2 seeds, too few for a 95 % interval; {needed} "
        "(study, 2 seeds, 2 epochs each)."
    )
    assert f"| final_top1_difference | +2.00 pt (from 2 seeds, too few for a 95 % interval; {needed}) | 2 |" in summary
    assert "100.00" not in summary and "nan" not in summary
    one_seed = study_differences(in_points(paired_differences(runs[runs["seed"] == 0])), seeds=1, epochs=2)
    assert verdict(one_seed).startswith(
        "Inconclusive: thor - baseline is +12.00 pt final top-1 from 1 seed, too few for a 95 % interval (one has no "
        "spread); run at least 3 (study, 1 seed, 2 epochs each)."
    )


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
    paired.to_csv(tmp_path / "study/paired.csv", index=False)  # a study of before the points: fractions, no unit
    for status, epochs in (("FINISHED", "2"), ("FAILED", "9")):  # the failed one is newer and is not read
        run = client.create_run(experiment, tags={"pipeline": "study"})
        client.log_param(run.info.run_id, "study.epochs", epochs)
        client.log_artifact(run.info.run_id, str(tmp_path / "study/paired.csv"), "study")
        client.set_terminated(run.info.run_id, status)
    study = newest_study(reader)
    assert list(study["source"]) == ["study, 3 seeds"] and list(study["budget"]) == ["2 epochs each"]
    assert study["mean"].tolist() == [1.0] and study["unit"].tolist() == ["pt"]


# -- a study and single runs of unequal budget in one real MLflow store ---------------------------------------------


@pytest.fixture
def study_and_unequal_runs(tmp_path):
    """The issue's store: baseline after 5 epochs on the full data, thor after 1 epoch on 60 images a class, adasum
    after 3 epochs, a newer thor rehearsal (fast_dev_run), and a study of thor against baseline over 3 seeds (the
    fewest that give an interval) whose paired.csv the study's own code wrote (in points), with no seed reaching the
    target."""
    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    client = mlflow.MlflowClient(uri)
    experiment = client.create_experiment(EXPERIMENT, artifact_location=(tmp_path / "mlruns").as_uri())
    full = {"data.max_per_class.train": "1500", "data.image_size": "32", "network.name": "resnet_narrow"}
    ids = {
        "baseline": log_recipe_run(client, experiment, "baseline", full, [0.5, 0.7, 0.8, 0.84, 0.85]),
        "thor": log_recipe_run(client, experiment, "thor", {**full, "data.max_per_class.train": "60"}, [0.21]),
        "adasum": log_recipe_run(client, experiment, "adasum", full, [0.5, 0.7, 0.8]),
    }
    ids["rehearsal"] = log_recipe_run(client, experiment, "thor", full, [0.9], fast_dev_run="a few batches")
    runs = pd.DataFrame(
        {
            "result": ["baseline"] * 3 + ["thor"] * 3,
            "seed": [0, 1, 2] * 2,
            "final_top1": [0.62, 0.64, 0.63, 0.80, 0.83, 0.815],
            "final_top5": [0.95, 0.96, 0.955, 0.97, 0.97, 0.97],
            "time_to_target_s": [math.nan] * 6,
            "epochs_to_target": [math.nan] * 6,
        }
    )
    paired = in_points(paired_differences(runs))  # what the study node writes to paired.csv
    (tmp_path / "study").mkdir()
    paired.to_csv(tmp_path / "study/paired.csv", index=False)
    study = client.create_run(experiment, tags={"pipeline": "study"}).info.run_id
    client.log_param(study, "study.epochs", "2")
    client.log_artifact(study, str(tmp_path / "study/paired.csv"), "study")
    client.set_terminated(study)
    return MlflowRunReader(uri, EXPERIMENT), pd.read_csv(tmp_path / "study/paired.csv"), ids


def test_a_study_and_single_runs_of_unequal_budget_tell_one_story(study_and_unequal_runs, caplog):
    reader, paired, ids = study_and_unequal_runs
    with caplog.at_level(logging.INFO, logger="trainlib.report"):
        comparison = compare(reader, ["baseline", "thor", "adasum"], TARGET)  # as the report node does
    differences, left_out = by_how_much(comparison.finals, reader, settings=comparison.settings)
    summary = readable(differences, left_out, target_top1=TARGET)

    # the verdict sentence is the paired table's thor vs baseline final top-1, as stored in paired.csv
    row = paired.set_index(["comparison", "measure"]).loc[("thor vs baseline", "final_top1_difference")]
    assert (row["mean"], row["ci_low"], row["ci_high"], row["n"]) == (18.5, 17.26, 19.74, 3)
    first = summary.splitlines()[0]
    assert first == (
        f"thor beat baseline by {row['mean']:+.2f} pt final top-1 (95 % CI [{row['ci_low']:+.2f}, "
        f"{row['ci_high']:+.2f}] pt; study, 3 seeds, 2 epochs each)."
    )

    # the unequal single runs are not compared: no single-run row, named in "Left out" with the reason, not drawn
    assert set(differences["source"]) == {"study, 3 seeds"}
    assert "## From the study, 3 seeds" in summary and "single runs at equal budget" not in summary
    assert "- adasum vs baseline (single runs): unequal budget: epochs 3 vs 5; not compared side by side." in summary
    assert (
        "- thor vs baseline (single runs): unequal budget: epochs 1 vs 5; data.max_per_class.train 60 vs 1500; the "
        "study compares this pair at equal budget instead; not compared side by side."
    ) in summary
    table = comparison.table.set_index("recipe")
    assert table.at["thor", "run_id"] == ids["thor"]  # the rehearsal is not a result, and the log says so
    assert f"skipping thor run {ids['rehearsal']}, a fast_dev_run rehearsal (not a result)" in caplog.text
    warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert "Report: adasum is not compared side by side: unequal budget to baseline's run: epochs 3 vs 5" in warnings
    assert table.at["thor", "left_out"] == (
        "unequal budget to baseline's run: epochs 1 vs 5; data.max_per_class.train 60 vs 1500"
    )
    assert table.at["adasum", "left_out"] == "unequal budget to baseline's run: epochs 3 vs 5"
    assert table.at["baseline", "left_out"] == ""
    assert set(compared_histories(comparison.histories, comparison.table)["recipe"]) == {"baseline"}

    # points throughout, rounded as printed: the CSV's values, the summary's cells, the rows no seed pair fills
    accuracy = differences[differences["measure"].str.endswith("top1_difference")]
    assert (accuracy["unit"] == "pt").all() and accuracy["mean"].tolist() == [18.5]
    for column in ("mean", "ci_low", "ci_high"):
        assert all(value == round(value, 2) for value in differences[column].dropna())
    assert "| thor vs baseline | final_top1_difference | +18.50 pt [+17.26, +19.74] | 3 | 2 epochs each |" in summary
    assert "| thor vs baseline | time_to_target_ratio | — | 0 |" in summary and "nan" not in summary
    assert "—: no seed on which both recipes reached the target top-1 of 75 % (target.top1)" in summary
    assert "0.185" not in summary and "0.18500000000000005" not in differences.to_csv()


@pytest.fixture
def study_with_trainings(tmp_path):
    """The issue's walk (``log_study_walk``), read back as the report reads it."""
    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    default, study, trainings = log_study_walk(uri, tmp_path)
    return MlflowRunReader(uri, EXPERIMENT), default, study, trainings


def test_the_table_figures_and_runs_of_a_studied_recipe_are_the_studys(study_with_trainings):
    reader, default, study, trainings = study_with_trainings
    comparison = compare(reader, ["baseline", "thor"], TARGET)
    differences, left_out = by_how_much(comparison.finals, reader, settings=comparison.settings)
    summary = readable(differences, left_out, target_top1=TARGET)
    # 2 seeds give no interval (MIN_SEEDS): 20 and 22 pt apart would already exclude zero, so 3 is what it takes
    assert summary.startswith(
        "Inconclusive: thor - baseline is +21.00 pt final top-1 from 2 seeds, too few for a 95 % interval; run at "
        "least 3 (study, 2 seeds, 1 epoch each)."
    )

    # thor is compared in the summary, so it is in the table, from the same study as the baseline: not `missing`
    table = comparison.table.set_index("recipe")
    assert list(table["source"]) == ["study, 2 seeds", "study, 2 seeds"]
    assert list(table["run_id"]) == [study, study] and list(table["run_status"]) == ["FINISHED", "FINISHED"]
    assert list(table["epochs"]) == [1, 1] and list(table["left_out"]) == ["", ""] and table["seed"].isna().all()
    # one number, one rounding: a studied recipe's top-1 is the study's own mean (summary.csv), not a second
    # computation from the unrounded metrics that reads 0.348667 where the study's file says 0.348666
    studied = reader.artifact_csv(study, "study/summary.csv").set_index("result")
    means = {r: sum(v for (name, _), v in STUDIED_FINALS.items() if name == r) / 2 for r in ("baseline", "thor")}
    for recipe in ("baseline", "thor"):
        assert float_text(table.at[recipe, "top1"]) == float_text(studied.at[recipe, "final_top1"])
        assert float_text(studied.at[recipe, "final_top1"]) != float_text(means[recipe])  # the case has teeth
    # an epoch's images: 1,000 of the split's 1,050 on either seed, not the mean rate x the mean time (75/s x 15 s)
    assert list(table["epoch_images"]) == [1000, 1000] and list(table["train_images"]) == [1050, 1050]
    # the figures draw both, from the seeds' mean; the link charts the four trainings, not the 5-epoch default run
    drawn = compared_histories(comparison.histories, comparison.table)
    assert drawn.groupby("recipe")["val/top1"].mean().to_dict() == pytest.approx(means)
    assert_honest_figures(figures(drawn, comparison.explained_variance, TARGET))  # one epoch: tick 1, not 0.945
    assert sorted(comparison.read_runs) == sorted(trainings.values()) and default not in comparison.read_runs

    # a pinned run comes first: the baseline's single run beside thor's study means is not a pair, and says so
    pinned = compare(reader, ["baseline", "thor"], TARGET, {"baseline": default}).table.set_index("recipe")
    assert list(pinned["source"]) == ["single run", "study, 2 seeds"] and pinned.at["baseline", "run_id"] == default
    assert pinned.at["thor", "left_out"] == (
        "from study, 2 seeds, baseline from single run: not a pair; pin thor's run (report.run_ids)"
    )


def test_a_study_logged_before_the_result_column_was_named_result_is_read(tmp_path):
    """A study logged before the rename names the result row ``recipe`` in its runs.csv and summary.csv: the report
    still finds its trainings through runs.csv and takes its means from summary.csv."""
    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    _, study, trainings = log_study_walk(uri, tmp_path, result_column="recipe")
    reader = MlflowRunReader(uri, EXPERIMENT)
    old = {name: reader.artifact_csv(study, f"study/{name}.csv") for name in ("runs", "summary")}
    assert all("recipe" in table and "result" not in table for table in old.values())  # the files are the old ones
    comparison = compare(reader, ["baseline", "thor"], TARGET)
    table = comparison.table.set_index("recipe")
    assert list(table["source"]) == ["study, 2 seeds"] * 2  # its trainings, found through the old runs.csv
    assert sorted(comparison.read_runs) == sorted(trainings.values())
    for recipe in ("baseline", "thor"):  # its own means, from the old summary.csv
        assert float_text(table.at[recipe, "top1"]) == float_text(
            old["summary"].set_index("recipe").at[recipe, "final_top1"]
        )
