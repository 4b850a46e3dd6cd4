"""The files the report pipeline writes after the issue's walk (a default run, then a 2-seed study of baseline and
thor), as a reader opens them: ``kedro run --pipelines=report`` in this process, through the catalog and the
project's hooks, over runs logged by hand as the pipelines log them (no training: seconds)."""

from __future__ import annotations

import csv
import re

import mlflow
import pandas as pd
import pytest

from pipelines.tracking.links import closing_links
from tests.support.report_files import assert_honest_figures, assert_no_header_only_csv
from tests.support.report_store import STUDIED_FINALS, log_study_walk
from tests.support.runner import process_state_kept, run_pipeline, session_project, tracking_uri
from tests.support.views import linked_view

PARAMS = {"report": {"recipes": ["baseline", "thor"]}, "target": {"top1": 0.75}}


@pytest.fixture(scope="module")
def walked(tmp_path_factory):
    """The report's run over the walk: the project, what the run saved, its files' folder, the study's run, the
    study's trainings and the default run."""
    root = tmp_path_factory.mktemp("walk")
    project = session_project(root / "project")
    default, study, trainings = log_study_walk(tracking_uri(project), root)
    outputs = run_pipeline("report", PARAMS, project)
    return project, outputs, project / "data/08_reporting/report", study, trainings, default


def as_written(path) -> dict[str, dict[str, str]]:
    """A CSV file's cells as text, by its first column's value and the header's names."""
    with path.open(newline="") as handle:
        rows = list(csv.DictReader(handle))
    return {next(iter(row.values())): row for row in rows}


def test_the_report_after_a_two_seed_study_says_what_it_cannot_tell_and_writes_no_empty_file(walked):
    project, outputs, written, study, trainings, default = walked
    # 2 seeds: the seeds it would take, not an interval that spans everything
    summary = (written / "summary.md").read_text()
    assert summary.startswith(
        "Inconclusive: thor - baseline is +21.00 pt final top-1 from 2 seeds, too few for a 95 % interval; run at "
        "least 3 (study, 2 seeds, 1 epoch each)."
    )
    assert "100.00" not in summary and "nan" not in summary
    differences = pd.read_csv(written / "differences.csv").set_index("measure")
    assert differences.loc["final_top1_difference", ["ci_low", "ci_high"]].isna().all()
    # no dim_reduce run: no explained-variance table or figure, and no file that is a header alone
    assert not list(written.rglob("explained_variance*"))
    assert_no_header_only_csv(written)
    assert_honest_figures({name: outputs[f"report.{name}_plot"] for name in ("loss", "top1_vs_epoch")})


def test_one_number_reads_the_same_in_every_file_and_the_images_an_epoch_saw_are_named(walked):
    project, outputs, written, study, trainings, default = walked
    table = as_written(written / "comparison.csv")
    studied = as_written(project.parent / "study/summary.csv")  # the study's, as it logged it
    for recipe in ("baseline", "thor"):
        # digit for digit: the study's 0.348666, not a second mean of the unrounded metrics (0.348667)
        assert table[recipe]["top1"] == studied[recipe]["final_top1"], recipe
        exact = sum(value for (name, _), value in STUDIED_FINALS.items() if name == recipe) / 2
        assert table[recipe]["top1"] != f"{exact:.6g}", recipe  # the case rounds both ways
        # the split's 1,050 images beside the 1,000 an epoch trained on, on either seed (not 75/s x 15 s)
        assert (table[recipe]["train_images"], table[recipe]["epoch_images"]) == ("1050", "1000"), recipe


def test_the_reports_runs_table_link_lists_the_runs_it_compared_alone(walked):
    project, outputs, written, study, trainings, default = walked
    uri = tracking_uri(project)
    client = mlflow.MlflowClient(uri)
    experiment = client.get_experiment_by_name("resnet-recipes").experiment_id
    (report,) = client.search_runs([experiment], "tags.pipeline = 'report'")
    with process_state_kept(project):
        mlflow.set_tracking_uri(uri)
        _, table = closing_links("http://127.0.0.1:5000", report.info.run_id)
    listed = re.findall(r"'(\w+)'", linked_view(uri, table)["searchFilter"])
    assert sorted(listed) == sorted(trainings.values()) and default not in listed and study not in listed
