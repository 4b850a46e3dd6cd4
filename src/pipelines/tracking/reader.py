"""Reading an MLflow experiment as plain data, for ``trainlib.report.compare`` and the notebooks."""

from __future__ import annotations

import tempfile
from collections.abc import Sequence

import mlflow
import pandas as pd
from mlflow.entities import Run
from mlflow.exceptions import MlflowException


class MlflowRunReader:
    """Read access to one MLflow experiment as plain data, for ``trainlib.report`` (``report.runs.RunReader``):
    runs as ``RunRecord`` dicts, metric histories and CSV artifacts as DataFrames."""

    def __init__(self, tracking_uri: str, experiment_name: str):
        self.tracking_uri = tracking_uri
        self.experiment_name = experiment_name
        self._client = mlflow.MlflowClient(tracking_uri=tracking_uri)
        experiment = self._client.get_experiment_by_name(experiment_name)
        self._experiment_id = experiment.experiment_id if experiment is not None else None
        self.experiment_exists = experiment is not None

    @classmethod
    def of_active_run(cls) -> MlflowRunReader:
        """The store and experiment of the active run (what kedro-mlflow set up from ``mlflow.yml``)."""
        active = mlflow.active_run()
        if active is None:
            raise RuntimeError(
                "the report pipeline reads the MLflow experiment of its own run, but no run is active: "
                "is tracking disabled for it in conf/base/mlflow.yml (tracking.disable_tracking.pipelines)?"
            )
        return cls(mlflow.get_tracking_uri(), mlflow.get_experiment(active.info.experiment_id).name)

    @staticmethod
    def _record(run: Run) -> dict:
        return {
            "run_id": run.info.run_id,
            "run_name": run.info.run_name,
            "status": run.info.status,
            "start_time_ms": run.info.start_time,
            "end_time_ms": run.info.end_time,
            "tags": dict(run.data.tags),
            "params": dict(run.data.params),
            "metric_keys": sorted(run.data.metrics),
        }

    def search(self, filter_string: str) -> list[dict]:
        """The experiment's runs matching ``filter_string`` (MLflow search syntax), newest first."""
        if self._experiment_id is None:
            return []
        records, token = [], None
        while True:
            page = self._client.search_runs(
                [self._experiment_id], filter_string, order_by=["attributes.start_time DESC"], page_token=token
            )
            records += [self._record(run) for run in page]
            token = page.token
            if not token:
                return records

    def get(self, run_id: str) -> dict | None:
        """The run ``run_id``, or ``None`` when the store has none."""
        try:
            return self._record(self._client.get_run(run_id))
        except MlflowException:
            return None

    def metric_history(self, run_id: str, keys: Sequence[str]) -> pd.DataFrame:
        """Every logged value of ``keys``: columns ``key``, ``step``, ``value``, ``timestamp`` (ms)."""
        rows = [
            (key, m.step, m.value, m.timestamp) for key in keys for m in self._client.get_metric_history(run_id, key)
        ]
        return pd.DataFrame(rows, columns=["key", "step", "value", "timestamp"]).astype(
            {"key": "object", "step": "int64", "value": "float64", "timestamp": "int64"}
        )

    def artifact_csv(self, run_id: str, path: str) -> pd.DataFrame | None:
        """The run's CSV artifact at ``path``, or ``None`` when it has none."""
        with tempfile.TemporaryDirectory() as folder:
            try:
                return pd.read_csv(self._client.download_artifacts(run_id, path, folder))
            except (MlflowException, OSError):
                return None
