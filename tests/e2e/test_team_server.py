"""A team's tracking server: the projects log to ``mlflow server`` over HTTP (SQLite backend, proxied artifacts)
instead of a local store. The session's recipe store is such a server (``tests.support.stores``); its runs,
child runs and artifacts arrive there, the report reads them back from it, and the closing links name it."""

from __future__ import annotations

import mlflow

from tests.support.stores import REPORT_OUTPUT, complete_run, store_report, tracking_uri, trainings


def test_runs_child_runs_and_artifacts_arrive_on_the_server(recipe_store):
    server = tracking_uri(recipe_store)
    assert server.startswith("http://127.0.0.1:")
    client = mlflow.MlflowClient(server)
    baseline = complete_run(recipe_store, "baseline")
    assert {"train/loss", "val/top1", "final/top1"} <= set(baseline.data.metrics)
    assert {artifact.path for artifact in client.list_artifacts(baseline.info.run_id)} >= {"checkpoints", "reports"}
    children = trainings(client, complete_run(recipe_store, "dim_reduce"))
    assert set(children) == {"stage1", "stage2", "control"}
    for name, child in children.items():
        assert "final/top1" in child.data.metrics, name
        assert client.list_artifacts(child.info.run_id), f"{name} has no artifact on the server"
    # nothing stayed local: the artifacts went through the server into its artifact store
    assert not (recipe_store / "mlflow.db").exists() and not (recipe_store / "mlruns").exists()
    assert any((recipe_store.parent / "artifacts").rglob("*.ckpt"))


def test_the_report_reads_the_runs_back_from_the_server_and_the_links_name_it(recipe_store):
    server = tracking_uri(recipe_store)
    client = mlflow.MlflowClient(server)
    report = store_report(recipe_store)
    compared = set(report.data.tags["compared_runs"].split(","))
    dim_reduce = complete_run(recipe_store, "dim_reduce")
    assert complete_run(recipe_store, "baseline").info.run_id in compared
    assert {child.info.run_id for child in trainings(client, dim_reduce).values()} <= compared
    assert {artifact.path for artifact in client.list_artifacts(report.info.run_id)} >= {"report"}
    output = (recipe_store / REPORT_OUTPUT).read_text()
    runs = f"{server}/#/experiments/{report.info.experiment_id}/runs?viewStateShareKey="
    assert f"MLflow: compare the runs at {runs}" in output
    assert f"MLflow: the runs table is {runs}" in output
    assert "127.0.0.1:5000" not in output and "start `mlflow ui" not in output
