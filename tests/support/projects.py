"""Temporary copies of this Kedro project for the slow tier's real ``kedro run`` processes: the project's
configuration with overrides in ``conf/local``, the command, and the MLflow runs it left."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import mlflow
import yaml

from tests.support.trees import write_image_tree

PROJECT = Path(__file__).resolve().parents[2]


EPOCHS = 2  # of the tiny baseline runs

TINY_PARAMS = {
    "data": {
        "source": "folder",
        "max_per_class": {"train": None, "val": None},
        "image_size": 16,
        "crop_scale": [0.5, 1.0],
        "eval_batch_size": 8,
        "num_workers": 1,
    },
    "baseline": {
        "epochs": EPOCHS,
        "batch_size": 4,
        "lr": {"peak": 0.05, "warmup_epochs": 0},
        "checkpoint": {"every_epochs": 1, "keep_last": 1},
    },
}


RESUMABLE_EPOCHS = 6  # of the baseline runs killed or cut off mid-training


def resumable_params(tree) -> dict:
    """``TINY_PARAMS`` on ``tree`` for ``RESUMABLE_EPOCHS`` epochs, evaluated and checkpointed each epoch: a run cut
    off mid-training leaves an epoch to resume from."""
    return {
        **TINY_PARAMS,
        "data": {**TINY_PARAMS["data"], "root": str(tree)},
        "baseline": {
            **TINY_PARAMS["baseline"],
            "epochs": RESUMABLE_EPOCHS,
            "eval_interval": 1,
            "checkpoint": {"every_epochs": 1, "keep_last": 2},
        },
    }


def make_project(root: Path, params: dict) -> Path:
    """A copy of this project's configuration in ``root``, with ``params`` as conf/local overrides."""
    root.mkdir(parents=True, exist_ok=True)
    shutil.copy(PROJECT / "pyproject.toml", root)
    shutil.copy(PROJECT / ".telemetry", root)
    (root / "src").mkdir()  # the package itself is imported from the installed project
    shutil.copytree(PROJECT / "conf", root / "conf", ignore=shutil.ignore_patterns("local"))
    (root / "conf" / "local").mkdir()
    (root / "conf" / "local" / "parameters.yml").write_text(yaml.safe_dump(params))
    return root


def kedro(project: Path, *args: str, timeout: int = 600) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "kedro", *args],
        check=False,
        cwd=project,
        capture_output=True,
        text=True,
        timeout=timeout,
        env={**os.environ, "COLUMNS": "200"},
    )


def runs(project: Path) -> list:
    client = mlflow.MlflowClient(tracking_uri=f"sqlite:///{project / 'mlflow.db'}")
    experiment = client.get_experiment_by_name("resnet-recipes")
    return client, client.search_runs([experiment.experiment_id]) if experiment else []


def run_on_tiny_tree(root: Path, pipeline: str, per_class: dict, params: dict | None = None):
    """``kedro run --pipelines=<pipeline>`` in a new project under ``root`` on a generated 3-class tree."""
    tree = write_image_tree(root / "tree", classes=("cat", "dog", "fox"), per_class=per_class)
    params = {**TINY_PARAMS, **(params or {}), "data": {**TINY_PARAMS["data"], "root": str(tree)}}
    project = make_project(root / "project", params)
    result = kedro(project, "run", f"--pipelines={pipeline}")
    assert result.returncode == 0, result.stdout[-5000:] + result.stderr[-5000:]
    return project, result


DIM_REDUCE_PARAMS = {
    "dim_reduce": {
        "stage1": {
            "epochs": 2,
            "schedule_epochs": 3,
            "batch_size": 4,
            "lr": {"peak": 0.05, "warmup_epochs": 0},
            "eval_interval": 0,
            "trajectory": {"start_epoch": 1, "every_steps": 1},
        },
        "collect": {"n_files": 5},
        "pca": {"n_components": 4},
        "stage2": {"batch_size": 4},
    },
}


def kedro_runs(found: list) -> list:
    """The runs of ``kedro run`` itself, newest first (dim_reduce's trainings are child runs of them)."""
    return [run for run in found if "mlflow.parentRunId" not in run.data.tags]


def child_runs_by_training(client, run) -> dict:
    children = client.search_runs([run.info.experiment_id], f"tags.mlflow.parentRunId = '{run.info.run_id}'")
    return {child.data.tags["training"]: child for child in children}
