"""A run's node parameters reach MLflow in one batch per node (``pipelines.hooks.node_params``), the same params
as kedro-mlflow's own hook logs one request at a time: the data pipeline run twice in this process, once with the
project's settings and once with kedro-mlflow's plugin hook in their place, each counting the requests its real
SQLite store receives."""

from __future__ import annotations

from collections import Counter

import mlflow
import pytest
from kedro.framework.project import settings
from mlflow.store.tracking.sqlalchemy_store import SqlAlchemyStore

from pipelines.data.pipeline import create_pipeline
from pipelines.hooks import NodeParamsMlflowHook
from tests.support.runner import run_pipeline, session_project, tiny_params, tracking_uri
from tests.support.trees import write_image_tree


@pytest.fixture
def store_requests(monkeypatch) -> Counter:
    """Counts of the params-carrying requests every SQLite store receives meanwhile (the real store's methods,
    wrapped): ``log_param``, and ``log_batch`` with params."""
    counts: Counter = Counter()
    log_param, log_batch = SqlAlchemyStore.log_param, SqlAlchemyStore.log_batch

    def counted_log_param(self, run_id, param):
        counts["log_param"] += 1
        return log_param(self, run_id, param)

    def counted_log_batch(self, run_id, metrics, params, tags):
        if params:
            counts["log_batch"] += 1
        return log_batch(self, run_id, metrics, params, tags)

    monkeypatch.setattr(SqlAlchemyStore, "log_param", counted_log_param)
    monkeypatch.setattr(SqlAlchemyStore, "log_batch", counted_log_batch)
    return counts


def data_run_params(root, tree) -> dict[str, str]:
    project = session_project(root)
    run_pipeline("data", tiny_params(tree), project)
    (run,) = mlflow.MlflowClient(tracking_uri(project)).search_runs(
        [mlflow.MlflowClient(tracking_uri(project)).get_experiment_by_name("resnet-recipes").experiment_id]
    )
    return run.data.params


def test_node_params_are_kedro_mlflows_in_one_request_per_node(tmp_path, monkeypatch, store_requests):
    tree = write_image_tree(tmp_path / "tree", classes=("cat", "dog"), per_class={"train": 4, "val": 2})
    batched = data_run_params(tmp_path / "batched", tree)
    batched_requests = Counter(store_requests)
    store_requests.clear()

    # kedro-mlflow's plugin hook, as registered before: one request per parameter
    monkeypatch.setattr(settings, "HOOKS", tuple(h for h in settings.HOOKS if not isinstance(h, NodeParamsMlflowHook)))
    monkeypatch.setattr(settings, "DISABLE_HOOKS_FOR_PLUGINS", ())
    one_by_one = data_run_params(tmp_path / "one_by_one", tree)

    assert batched == one_by_one
    assert len(batched) > 10 and batched["data.image_size"] == "16"
    # the data pipeline's one node reads params:data: it logs every key
    nodes = [node for node in create_pipeline().nodes if "params:data" in node.inputs]
    assert len(nodes) == 1
    assert store_requests["log_param"] == len(nodes) * len(batched)  # kedro-mlflow's: one request per key
    assert batched_requests == {"log_batch": len(nodes)}  # no log_param: the plugin's hook is not registered too
