"""The MLflow tracking server lost in the middle of a ``kedro run`` (issue 52 item 4): a real ``mlflow server``
stopped while the baseline trains is one ``Error:`` line naming the server (never the password) once its retry
window (``tracking.server_retry_window_s``) is spent; the server started again where it was, the same command
marks the run it left RUNNING KILLED and resumes the training from its last checkpoint."""

from __future__ import annotations

import time

import mlflow
import yaml

from tests.support.processes import Watched
from tests.support.projects import RESUMABLE_EPOCHS, make_project, resumable_params
from tests.support.servers import free_port, mlflow_server
from tests.support.trees import write_image_tree

WINDOW_S = 3
PASSWORD = "s3cret-tracking-pw"  # in the tracking URI: reaches no line the run prints


def outage_params(tree) -> dict:
    """The resume test's baseline (a checkpoint every epoch), with a short retry window for the tracking server."""
    return {**resumable_params(tree), "tracking": {"server_retry_window_s": WINDOW_S}}


def test_a_tracking_server_lost_mid_run_is_one_error_line_and_the_rerun_recovers(tmp_path):
    tree = write_image_tree(tmp_path / "tree", classes=("a", "b", "c"), per_class={"train": 40, "val": 4}, size=16)
    project = make_project(tmp_path / "project", outage_params(tree))
    port = free_port()
    uri = f"http://alice:{PASSWORD}@127.0.0.1:{port}"
    (project / "conf" / "local" / "mlflow.yml").write_text(yaml.safe_dump({"server": {"mlflow_tracking_uri": uri}}))
    store, artifacts = tmp_path / "server" / "mlflow.db", tmp_path / "server" / "artifacts"
    store.parent.mkdir()

    with mlflow_server(store, tmp_path / "server-1.log", artifacts, port=port):
        run = Watched.kedro_run(project, "--pipelines=baseline")
        run.wait_for(
            f"epoch 2/{RESUMABLE_EPOCHS} step"
        )  # epoch 1's checkpoint and metrics are on disk and on the server
    lost = time.monotonic()  # the server is stopped here (its process group ended)
    status = run.finish(timeout=600)
    took = time.monotonic() - lost

    output = run.output
    assert status != 0, output[-3000:]
    errors = [line for line in output.splitlines() if line.startswith("Error: ")]
    assert len(errors) == 1, output[-3000:]
    assert errors[0].startswith(f"Error: TrackingServerError: The MLflow server http://127.0.0.1:{port} did not answer")
    assert "tracking.server_retry_window_s" in errors[0] and "marked KILLED" in errors[0]
    assert PASSWORD not in output
    assert "Exception in thread" not in output  # no raw traceback from a background thread
    # the window, then the rest of the epoch under way and the end of the run: seconds, not MLflow's 244 s default
    assert took < 120, f"{took:.0f} s from the server's stop to the process's end"
    checkpoints = sorted((project / "data/06_models/baseline/epochs").glob("epoch_*.ckpt"))
    assert checkpoints, "no epoch checkpoint left to resume from"

    with mlflow_server(store, tmp_path / "server-2.log", artifacts, port=port) as url:
        rerun = Watched.kedro_run(project, "--pipelines=baseline")
        assert rerun.finish(timeout=600) == 0, rerun.output[-3000:]
        client = mlflow.MlflowClient(tracking_uri=url)
        experiment = client.get_experiment_by_name("resnet-recipes")
        found = client.search_runs([experiment.experiment_id], order_by=["attributes.start_time ASC"])
    assert "Resuming from" in rerun.output and f"epoch 1/{RESUMABLE_EPOCHS} step" not in rerun.output
    assert PASSWORD not in rerun.output
    kedro_runs = [r for r in found if "mlflow.parentRunId" not in r.data.tags]
    statuses = [(r.info.run_name, r.info.status) for r in found]
    assert [r.info.status for r in kedro_runs] == ["KILLED", "FINISHED"], statuses
    assert "RUNNING" not in {r.info.status for r in found}, statuses  # the lost run's child runs too
    assert "final/top1" in kedro_runs[-1].data.metrics
