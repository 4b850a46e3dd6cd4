"""Where to see a run in the MLflow UI: the runs table, and the chart comparing the runs it trained or read.

A run's closing links (``pipelines.hooks``) open the tracking server itself when the store is one, else ``mlflow
ui`` over the local store. The report pipeline tags its run with the runs it compared (``record_compared_runs``),
so its chart draws them.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from urllib.parse import quote

import mlflow

from pipelines.metrics import VAL_TOP1
from pipelines.tracking.runs import child_runs
from pipelines.tracking.writer import set_tags

# A run's tag listing, comma-separated, the runs it compared (the report's), for the closing comparison link
COMPARED_RUNS_TAG = "compared_runs"
WORKFLOW = "workflowType=machine_learning"  # MLflow 3's UI otherwise shows its GenAI pages


def current_tracking_uri() -> str:
    return mlflow.get_tracking_uri()


def base_is_server(tracking_uri: str) -> bool:
    """Whether ``tracking_uri`` is a tracking server (whose own address serves the UI)."""
    return tracking_uri.startswith(("http://", "https://"))


def ui_base_url(tracking_uri: str, host: str, port: str | int) -> str:
    """Where the MLflow UI of ``tracking_uri`` is: the tracking server itself when it is one (``http(s)://``),
    else ``mlflow ui`` over the local store at ``host``:``port`` (``mlflow.yml``'s ``ui``)."""
    if base_is_server(tracking_uri):
        return tracking_uri.rstrip("/")
    return f"http://{host}:{port}"


def experiment_of(run_id: str) -> str:
    return mlflow.MlflowClient().get_run(run_id).info.experiment_id


def runs_page_url(base: str, experiment_id: str) -> str:
    """The MLflow UI's runs table of experiment ``experiment_id``, in model-training mode."""
    return f"{base}/#/experiments/{experiment_id}/runs?{WORKFLOW}"


def comparison_url(base: str, experiment_id: str, run_ids: Sequence[str], metric: str = VAL_TOP1) -> str:
    """The MLflow UI's chart of ``metric`` with one line per run of ``run_ids``, all drawn, in model-training mode.

    MLflow 3.17's runs page keeps which runs its charts draw, and their order, in the browser (local storage);
    only its search facets come from the URL. Its metric page takes the runs and the metric from the URL, so this
    link opens on exactly the runs to compare, whatever the browser saw before.
    """
    query = "&".join(
        [
            f"runs={quote(json.dumps(list(run_ids)), safe='[],')}",
            f"metric={quote(json.dumps(metric))}",
            f"experiments={quote(json.dumps([experiment_id]), safe='[]')}",
            f"plot_metric_keys={quote(json.dumps([metric]))}",
            "plot_layout={}",
            "x_axis=step",
            "y_axis_scale=linear",
            "line_smoothness=1",
            "show_point=true",
            "deselected_curves=[]",
            "last_linear_y_axis_range=[]",
            WORKFLOW,
        ]
    )
    return f"{base}/#/metric?{query}"


def record_compared_runs(run_ids: Sequence[str]) -> None:
    """Tag the active run with ``run_ids`` and their child runs (dim_reduce's trainings): what it compared."""
    compared = [
        child.info.run_id
        for run_id in run_ids
        for child in (mlflow.MlflowClient().get_run(run_id), *child_runs(run_id))
    ]
    set_tags({COMPARED_RUNS_TAG: ",".join(dict.fromkeys(compared))})  # once each: a child may be named too


def runs_to_compare(run_id: str, metric: str = VAL_TOP1) -> list[str]:
    """The runs a ``kedro run``'s comparison link draws: its own run and its child runs that logged ``metric`` (a
    training pipeline's, the study's trainings), and the runs its ``compared_runs`` tag names (the report's)."""
    client = mlflow.MlflowClient()
    run = client.get_run(run_id)
    candidates = [run, *child_runs(run_id)]
    named = run.data.tags.get(COMPARED_RUNS_TAG, "")
    candidates += [client.get_run(other) for other in named.split(",") if other]
    return list(dict.fromkeys(candidate.info.run_id for candidate in candidates if metric in candidate.data.metrics))
