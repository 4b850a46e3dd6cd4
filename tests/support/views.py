"""The MLflow UI's shared views behind a ``kedro run``'s closing links (``pipelines.tracking.links``): a link names
its view by ``viewStateShareKey``, and the experiment's tag ``mlflow.sharedViewState.<key>`` holds it."""

from __future__ import annotations

import json
import re

import mlflow


def linked_view(tracking_uri: str, link: str) -> dict:
    """The shared view a printed link opens (its columns, order, filter and charts), read from its experiment."""
    experiment_id, key = re.search(r"#/experiments/(\w+)/runs\?viewStateShareKey=(\w+)", link).groups()
    experiment = mlflow.MlflowClient(tracking_uri).get_experiment(experiment_id)
    return json.loads(experiment.tags[f"mlflow.sharedViewState.{key}"])


def charted(view: dict) -> list[str]:
    """The metric of each chart of a view, in order."""
    return [chart["metricKey"] for chart in view.get("compareRunCharts", [])]
