"""``kedro models register``: a run's logged model becomes a version of its recipe's registered model without
training again, from its logged-model URI (``models:/m-…``), so MLflow warns nothing (``runs:/<id>/model`` warns
that the run has no artifacts there); in-process, on a project's SQLite store, with models logged as MLflow logs
any pyfunc (a second each: the command reads the logged model, never the network)."""

from __future__ import annotations

import logging
import os
import warnings

import mlflow
import pytest
from click.testing import CliRunner

import pipelines  # noqa: F401  (the CPU defaults before MindSpore loads)
from pipelines.cli import THIRD_PARTY_WARNINGS, cli
from tests.support.runner import process_state_kept, session_project, tracking_uri

EXPERIMENT = "resnet-recipes"  # conf/base/mlflow.yml's


class Echo(mlflow.pyfunc.PythonModel):
    def predict(self, context, model_input: list[str], params=None) -> list[str]:
        return model_input


def logged_run(tags: dict[str, str], *, status: str = "FINISHED", model: bool = True, **child) -> str:
    """A run tagged ``tags`` that logged the model ``model`` (or, with ``child``, whose child run of
    ``child["training"]`` logged it), ended ``status``; its id."""
    with mlflow.start_run(tags=tags) as run:
        if child:
            with mlflow.start_run(nested=True, tags=child):
                mlflow.pyfunc.log_model(name="model", python_model=Echo(), pip_requirements=[])
        elif model:
            mlflow.pyfunc.log_model(name="model", python_model=Echo(), pip_requirements=[])
    mlflow.MlflowClient().set_terminated(run.info.run_id, status)
    return run.info.run_id


class Records(logging.Handler):
    """MLflow's log records (its logger does not propagate to pytest's)."""

    def __init__(self) -> None:
        super().__init__(logging.WARNING)
        self.messages: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.messages.append(record.getMessage())


@pytest.fixture
def project(tmp_path):
    root = session_project(tmp_path / "project")
    with process_state_kept(root):
        os.environ["MLFLOW_TRACKING_URI"] = tracking_uri(root)
        mlflow.set_tracking_uri(tracking_uri(root))
        mlflow.set_experiment(EXPERIMENT)
        yield root


def register(*args: str, ok: bool = True) -> tuple[str, list[str], list[str]]:
    """``kedro models register <args>``: its output, MLflow's warning records and Python's warnings; it succeeds
    when ``ok``, else it fails with one Error line."""
    records = Records()
    logging.getLogger("mlflow").addHandler(records)
    try:
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            for category, message, module in THIRD_PARTY_WARNINGS:  # what every kedro command ignores (quiet_start)
                warnings.filterwarnings("ignore", message=message, category=category, module=module)
            result = CliRunner().invoke(cli, ["models", "register", *args])
    finally:
        logging.getLogger("mlflow").removeHandler(records)
    assert (result.exit_code == 0) == ok, result.output
    return result.output, records.messages, [str(warning.message) for warning in caught]


def test_an_existing_runs_model_is_registered_from_its_logged_model_uri_without_a_warning(project):
    older = logged_run({"pipeline": "baseline"})
    newest = logged_run({"pipeline": "data+baseline"})
    logged_run({"pipeline": "baseline"}, status="FAILED")  # newer, not finished
    logged_run({"pipeline": "baseline", "fast_dev_run": "2 batches"})  # a rehearsal, not a result
    logged_run({"pipeline": "baseline"}, model=False)  # finished, no model (its data nodes only)
    thor = logged_run({"pipeline": "thor"})
    client = mlflow.MlflowClient()

    output, records, caught = register("baseline", "--alias", "champion")
    (model,) = client.search_logged_models(
        experiment_ids=[client.get_run(newest).info.experiment_id], filter_string=f"source_run_id = '{newest}'"
    )
    (version,) = client.search_model_versions("name = 'baseline'")
    assert (version.source, version.run_id, str(version.version)) == (model.model_uri, newest, "1")
    assert model.model_uri.startswith("models:/m-") and model.model_uri in output
    assert str(client.get_model_version_by_alias("baseline", "champion").version) == "1"
    assert (records, caught) == ([], []), "registering a logged model warned"
    assert "baseline version 1" in output and "models:/baseline@champion is version 1" in output

    # a run named by its id; the same model again is the same version, not a new one
    assert "as baseline version 2" in register("baseline", "--run-id", older)[0]
    assert "already registered" in register("baseline", "--run-id", older)[0]
    assert [v.run_id for v in client.search_model_versions("name = 'baseline'", order_by=["version_number"])] == [
        newest,
        older,
    ]
    output, _, _ = register("baseline", "--run-id", thor, ok=False)
    assert f"RegistryError: run {thor} is a run of pipeline 'thor', not of baseline" in output

    # the check above sees the warning it guards against: MLflow's own way from the run's URI warns
    records = Records()
    logging.getLogger("mlflow").addHandler(records)
    try:
        mlflow.register_model(f"runs:/{thor}/model", "thor")
    finally:
        logging.getLogger("mlflow").removeHandler(records)
    assert any("has no artifacts at artifact path 'model'" in message for message in records.messages)


def test_a_training_of_several_is_registered_from_its_child_run(project):
    parent = logged_run({"pipeline": "dim_reduce"}, training="stage2")
    output, records, _ = register("dim_reduce.stage2")
    (version,) = mlflow.MlflowClient().search_model_versions("name = 'dim_reduce.stage2'")
    child = mlflow.MlflowClient().get_run(version.run_id)
    assert child.data.tags["mlflow.parentRunId"] == parent and version.source.startswith("models:/m-")
    assert records == [] and "dim_reduce.stage2 version 1" in output
    output, _, _ = register("dim_reduce.control", ok=False)
    assert "no finished run of pipeline dim_reduce" in output and "of its control training" in output
