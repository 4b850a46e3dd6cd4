"""MLflow logging that is a no-op outside an active run (library code never starts runs)."""

from __future__ import annotations

import math

import mlflow


def log_metrics(metrics: dict[str, float], step: int | None = None) -> None:
    """Log finite numeric ``metrics`` to the active MLflow run, if there is one."""
    if mlflow.active_run() is None:
        return
    finite = {k: float(v) for k, v in metrics.items() if isinstance(v, (int, float)) and math.isfinite(v)}
    if finite:
        mlflow.log_metrics(finite, step=step)


def set_tags(tags: dict[str, str]) -> None:
    if mlflow.active_run() is not None:
        mlflow.set_tags(tags)
