"""Two machines starting on a new MLflow server at the same moment (``pipelines.hooks.experiment``): the one whose
create of the experiment is refused because the other has just created it joins that experiment, and its run
goes on. Here the other machine's create comes between this process's look-up and its own."""

from __future__ import annotations

import logging

import mlflow
from mlflow import MlflowClient

from tests.support.pipeline_runs import only_run
from tests.support.runner import run_pipeline, session_project, tiny_params, tracking_uri
from tests.support.trees import write_image_tree

EXPERIMENT = "resnet-recipes"  # conf/base/mlflow.yml


def test_a_run_joins_the_experiment_another_process_created_meanwhile(tmp_path, monkeypatch, caplog):
    tree = write_image_tree(tmp_path / "tree", classes=("cat", "dog"), per_class={"train": 2, "val": 1})
    project = session_project(tmp_path / "project")
    look_up = MlflowClient.get_experiment_by_name
    created_by_the_other: list[str] = []

    def other_process_creates_it_meanwhile(client, name):
        found = look_up(client, name)
        if found is None and name == EXPERIMENT and not created_by_the_other:
            # the other machine's create lands after this look-up: this process's create is then refused
            created_by_the_other.append(MlflowClient(client.tracking_uri).create_experiment(name))
        return found

    monkeypatch.setattr(MlflowClient, "get_experiment_by_name", other_process_creates_it_meanwhile)
    with caplog.at_level(logging.INFO, logger="pipelines.hooks.experiment"):
        run_pipeline("data", tiny_params(tree), project)

    assert [record.getMessage() for record in caplog.records if record.name == "pipelines.hooks.experiment"] == [
        "Another process created the MLflow experiment meanwhile: this run joins it"
    ]
    run = only_run(tracking_uri(project), "data")
    assert run.info.status == "FINISHED"
    assert [run.info.experiment_id] == created_by_the_other  # in the other's experiment, the only one of its name
    assert (
        mlflow.MlflowClient(tracking_uri(project)).get_experiment_by_name(EXPERIMENT).experiment_id
        == run.info.experiment_id
    )
