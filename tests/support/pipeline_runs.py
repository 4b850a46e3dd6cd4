"""What the in-process pipeline runs of tests/pipelines/test_runs.py read back: the MLflow runs a run logged, the
machine it ran on, and the study's rows against a single run's."""

from __future__ import annotations

from pathlib import Path

import mlflow
import pandas as pd


def client(uri: str) -> mlflow.MlflowClient:
    return mlflow.MlflowClient(tracking_uri=uri)


def runs_of(uri: str, pipeline: str) -> list:
    return client(uri).search_runs(
        [client(uri).get_experiment_by_name("resnet-recipes").experiment_id], f"tags.pipeline = '{pipeline}'"
    )


def only_run(uri: str, pipeline: str):
    (run,) = runs_of(uri, pipeline)
    return run


def children(uri: str, run) -> dict[str, object]:
    found = client(uri).search_runs([run.info.experiment_id], f"tags.mlflow.parentRunId = '{run.info.run_id}'")
    return {child.data.tags.get("training", child.info.run_name): child for child in found}


# The recipes' runs but the baseline's stop before exporting their models: the export node is the template's, whose
# model the baseline's test checks (seconds of compiling and MLflow logging per model in this tier)
def up_to(*nodes: str) -> dict:
    """``KedroSession.run``'s filter for the nodes up to ``nodes``."""
    return {"to_nodes": list(nodes)}


def cpu_model() -> str:
    """The first ``model name`` of /proc/cpuinfo, read here apart from the code under test."""
    return next(
        line.split(":", 1)[1].strip()
        for line in Path("/proc/cpuinfo").read_text().splitlines()
        if line.startswith("model name")
    )


def widest_isa() -> str:
    flags = next(line for line in Path("/proc/cpuinfo").read_text().splitlines() if line.startswith("flags")).split()
    return "avx512f" if "avx512f" in flags else "avx2" if "avx2" in flags else "avx" if "avx" in flags else "none"


def assert_the_study_trained_it(study: dict, row: str, history: pd.DataFrame, steps: pd.DataFrame) -> None:
    """The study's result row ``row`` has the final accuracy and the step curve of ``history`` and ``steps`` (a
    ``kedro run``'s), exactly."""
    final = study["study.runs"].set_index("result").loc[row]
    assert (final["final_top1"], final["final_top5"]) == tuple(history[["val/top1", "val/top5"]].iloc[-1]), row
    curve = study["study.curves"].query("result == @row")
    assert list(curve["step"]) == list(steps["step"]), row
    assert list(curve["top1"]) == list(steps["val/step_top1"]), row
