"""A default ``kedro run`` is quiet: no warning from this project's code or configuration, none of the
third-party ones it used to print on every start, no parameter loads at INFO, and its output captured (as in CI)
holds each log record on one line. Its MLflow run is named and tagged so that the runs table tells runs apart
(pipeline, changed ``--params``, partial runs; environment, whole command, data and image size, model, seed,
runner)."""

from __future__ import annotations

import re

import pytest

from tests.support.projects import TINY_PARAMS, kedro, make_project, runs
from tests.support.trees import write_image_tree

# a logged warning (rich's level column, or the logging format) or a Python warning (UserWarning: …)
WARNING_LINE = re.compile(r"\bWARNING\b|\w+Warning: ")
NAMED_NOISE = (
    "register_new_resolver",  # OmegaConf's deprecation, raised by Kedro and kedro-mlflow
    "Add type hints to the `predict` method",  # MLflow, on kedro-mlflow's import
    "Loading data from params:",
    "No typed parameter requirements found",
    "Using synchronous mode",
    "Creating initial MLflow database tables",
    "Workflow tracking is disabled",  # kedro-viz, on partial runs
    "as logging configuration",  # Kedro's "Using 'conf/logging.yml' as logging configuration…", on every command
)
# a log record as the logging configuration's `console` handler writes it, one line each; and rich's time column,
# which starts a record laid out in columns (cut over several lines when longer than the width)
PLAIN_RECORD = re.compile(r"^\d{4}-\d\d-\d\d \d\d:\d\d:\d\d,\d{3} - [\w.]+ - [A-Z]+ - ")
RICH_RECORD = re.compile(r"^\[\d\d/\d\d/\d\d \d\d:\d\d:\d\d\]")


@pytest.fixture(scope="module")
def quiet_project(tmp_path_factory):
    """A tiny project after a default ``kedro run`` and a partial rerun with a changed parameter."""
    root = tmp_path_factory.mktemp("quiet")
    tree = write_image_tree(root / "tree", classes=("cat", "dog", "fox"), per_class={"train": 4, "val": 2})
    project = make_project(root / "project", {**TINY_PARAMS, "data": {**TINY_PARAMS["data"], "root": str(tree)}})
    default = kedro(project, "run")
    assert default.returncode == 0, default.stdout[-5000:] + default.stderr[-5000:]
    partial_args = ("--pipelines=baseline", "--nodes=baseline.evaluate", "--params=data.eval_batch_size=4")
    partial = kedro(project, "run", *partial_args)
    assert partial.returncode == 0, partial.stdout[-5000:] + partial.stderr[-5000:]
    return project, {"default": default, "partial": partial}


@pytest.mark.parametrize("which", ["default", "partial"])
def test_a_run_prints_no_warning(quiet_project, which):
    _, results = quiet_project
    output = results[which].stdout + results[which].stderr
    assert [line for line in output.splitlines() if WARNING_LINE.search(line)] == []
    for noise in NAMED_NOISE:
        assert noise not in output, noise
    assert "closed because of an error" not in output


@pytest.mark.parametrize("which", ["default", "partial"])
def test_captured_output_keeps_each_log_record_on_one_line(quiet_project, which):
    _, results = quiet_project
    lines = (results[which].stdout + results[which].stderr).splitlines()
    assert [line for line in lines if RICH_RECORD.match(line)] == []
    records = [line for line in lines if PLAIN_RECORD.match(line)]
    assert any(" - kedro.runner.sequential_runner - INFO - " in line for line in records), lines[:20]


def test_runs_are_named_and_tagged(quiet_project):
    project, results = quiet_project
    _, (partial, default) = runs(project)  # newest first
    assert default.info.run_name == default.data.tags["pipeline"] == "baseline"  # __default__ by its real name
    # eval_batch_size is also thor_bert's key, so the short key is data.eval_batch_size: over the name's limit
    assert partial.info.run_name == "baseline data.eval_batch_size… (partial)"
    assert "- `data.eval_batch_size` = `4`" in partial.data.tags["mlflow.note.content"]
    assert default.data.tags["kedro_command"] == "kedro run"
    command = "kedro run --pipelines=baseline --nodes=baseline.evaluate --params=data.eval_batch_size=4"
    assert partial.data.tags["kedro_command"] == command
    for run in (default, partial):
        tags = run.data.tags
        assert tags["env"] == "local"  # conf/local holds the tiny parameters
        assert tags["runner"] == "SequentialRunner"
        assert (tags["network"], tags["image_size"], tags["seed"]) == ("resnet_narrow", "16", "42")
        assert (tags["train_images"], tags["val_images"], tags["classes"]) == ("12", "6", "3")
    # the link each run prints opens the MLflow UI on the experiment's runs table, as a shared view
    url = f"http://127.0.0.1:5000/#/experiments/{default.info.experiment_id}/runs?viewStateShareKey="
    assert f"MLflow: the runs table is {url}" in results["default"].stdout
