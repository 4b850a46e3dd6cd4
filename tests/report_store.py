"""A project whose MLflow store holds real runs of the training pipelines, for the report tests.

Filled once per session (``recipe_store`` in conftest.py) and shared by tests/test_report.py and
tests/test_notebook.py: a baseline run, a thor run, an adasum run (one worker), and a newer partial
thor rerun (only its evaluation node) that the report must pass over.
"""

from __future__ import annotations

from pathlib import Path

import mlflow
from helpers import write_image_tree
from test_pipeline_e2e import TINY_PARAMS, kedro, make_project

EXPERIMENT = "resnet-recipes"  # conf/base/mlflow.yml
THOR_PARAMS = {"epochs": 2, "batch_size": 4, "frequency": 4}
ADASUM_PARAMS = {"epochs": 2, "batch_size": 4, "lr": {"lr_max": 0.05, "warmup_epochs": 0}}
COMMANDS = (
    ("--pipelines=baseline",),
    ("--pipelines=thor",),
    ("--pipelines=adasum",),
    ("--pipelines=thor", "--nodes=evaluate_thor"),  # FINISHED, but without the training's metrics
)


def fill_store(root: Path) -> Path:
    """Run the baseline, thor and adasum pipelines (and a partial thor rerun) in one new project under ``root``."""
    tree = write_image_tree(root / "tree", classes=("cat", "dog", "fox"), per_class={"train": 8, "val": 3})
    params = {
        **TINY_PARAMS,
        "data": {**TINY_PARAMS["data"], "root": str(tree)},
        "thor": THOR_PARAMS,
        "adasum": ADASUM_PARAMS,
    }
    project = make_project(root / "project", params)
    for args in COMMANDS:
        result = kedro(project, "run", *args)
        assert result.returncode == 0, result.stdout[-5000:] + result.stderr[-5000:]
    return project


def tracking_uri(project: Path) -> str:
    return f"sqlite:///{project / 'mlflow.db'}"


def recipe_runs(project: Path, pipeline: str) -> list[mlflow.entities.Run]:
    """The runs tagged ``pipeline``, newest first."""
    client = mlflow.MlflowClient(tracking_uri(project))
    experiment = client.get_experiment_by_name(EXPERIMENT)
    return client.search_runs(
        [experiment.experiment_id], f"tags.pipeline = '{pipeline}'", order_by=["attributes.start_time DESC"]
    )
