"""Outages named and bounded, in this process with real sockets: a tuning database and a tracking server that
nobody answers on (a free loopback port, closed). Each stops the run before its first node, in one line naming the
part (host, port, database; the server's URL without credentials), never its password, and leaves no MLflow run.
A database lost mid-run and back within its window: ``tests/e2e/test_team_tuning.py`` (a real PostgreSQL)."""

from __future__ import annotations

import time

import mlflow
import pytest
import yaml

from pipelines.cli import RunFailed
from pipelines.failures import Failure
from pipelines.tracking.outage import TrackingServerError, outage, retry_schedule, waits
from tests.study.test_tuning import tuned
from tests.support.runner import run_pipeline, session_project, tiny_params, tracking_uri
from tests.support.servers import free_port
from tests.support.trees import write_image_tree
from trainlib.study.tuning_storage import TuningStorageError, open_storage

PASSWORD = "Out4ge-secret"


def error_line(error: BaseException) -> str:
    """The ``Error:`` block ``kedro run`` prints for ``error`` (pipelines.cli), without its traceback note."""
    failure = Failure.of(outage(error) or error)
    return RunFailed(failure, [], verbose=True).format_message()


def no_runs(project) -> bool:
    client = mlflow.MlflowClient(tracking_uri=tracking_uri(project))
    return client.search_runs([e.experiment_id for e in client.search_experiments()]) == []


def test_an_unreachable_tuning_database_stops_the_run_before_any_node_in_one_line(tmp_path):
    tree = write_image_tree(tmp_path / "tree", classes=("cat", "dog"), per_class={"train": 2, "val": 1})
    project = session_project(tmp_path / "project")
    port = free_port()
    storage = f"postgresql://tuner:{PASSWORD}@127.0.0.1:{port}/team_tuning"

    started = time.monotonic()
    with pytest.raises(TuningStorageError) as raised:
        run_pipeline("study", tiny_params(tree, tuned(storage)), project)
    took = time.monotonic() - started

    line = error_line(raised.value)
    assert line.count("\n") == 0, line  # one line: the message, naming the class
    assert line.startswith("TuningStorageError: study.tuning.storage postgresql://tuner:***@")
    assert f"database 'team_tuning' on 127.0.0.1, port {port}" in line and "Connection refused" in line
    assert PASSWORD not in line
    assert took < 30  # the run's start and one refused connection, no retries (seconds on a quiet machine)
    assert no_runs(project)
    assert not (project / "data" / "01_raw").exists() and not list(project.glob("data/*/manifest*"))


def test_an_unreachable_tracking_server_is_one_line_naming_it_after_its_window(tmp_path, monkeypatch):
    for variable in ("MLFLOW_HTTP_REQUEST_MAX_RETRIES", "MLFLOW_HTTP_REQUEST_BACKOFF_FACTOR"):
        monkeypatch.delenv(variable, raising=False)  # the run sets them; put back as they were afterwards
    tree = write_image_tree(tmp_path / "tree", classes=("cat", "dog"), per_class={"train": 2, "val": 1})
    project = session_project(tmp_path / "project")
    port = free_port()
    server = f"http://alice:{PASSWORD}@127.0.0.1:{port}"
    (project / "conf" / "local" / "mlflow.yml").write_text(yaml.safe_dump({"server": {"mlflow_tracking_uri": server}}))
    window = 3

    started = time.monotonic()
    with pytest.raises(Exception) as raised:
        run_pipeline("data", tiny_params(tree, {"tracking": {"server_retry_window_s": window}}), project)
    took = time.monotonic() - started

    assert isinstance(outage(raised.value), TrackingServerError)
    line = error_line(raised.value)
    assert line.count("\n") == 0, line
    assert line.startswith(f"TrackingServerError: The MLflow server http://127.0.0.1:{port} did not answer: ")
    assert "connection refused" in line and "tracking.server_retry_window_s" in line
    assert PASSWORD not in line and "alice" not in line
    retries, factor = retry_schedule(window)
    assert f"after {retries} retries over {waits(retries, factor):.0f} s" in line
    assert window <= took < window + 30  # the server had its window, and no more than seconds beyond it
    assert no_runs(project)


@pytest.mark.parametrize("window", [0, 3, 30, 60, 240, 1080])
def test_mlflows_retries_cover_the_window_and_no_more_than_a_step_beyond(window):
    retries, factor = retry_schedule(window)
    assert retries <= 10 and 1 <= factor <= 120  # MLflow 3.17's limits
    assert window <= waits(retries, factor) <= max(window * 1.25, window + 2)
    assert waits(7, 2) == 244  # MLflow's default: 0 + 4 + 8 + ... + 120 (urllib3's longest wait) seconds


def test_a_storage_that_never_answered_is_retried_for_its_window_one_log_line_each(caplog):
    port = free_port()
    url = f"postgresql://tuner:{PASSWORD}@127.0.0.1:{port}/team_tuning"
    started = time.monotonic()
    with pytest.raises(TuningStorageError, match="cannot be opened"):
        open_storage(url, retry_window_s=3)
    assert 3 <= time.monotonic() - started < 20
    retries = [record.getMessage() for record in caplog.records if "does not answer" in record.getMessage()]
    assert [line.split(": retry ")[1].split(" ")[0] for line in retries] == ["1", "2"]  # waits of 1 s, then 2 s
    assert all(f"database 'team_tuning' on 127.0.0.1, port {port}" in line for line in retries)
    assert PASSWORD not in caplog.text
