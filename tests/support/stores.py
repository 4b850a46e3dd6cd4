"""A project whose MLflow store holds real runs of the training pipelines, on a team's kind of tracking server.

The store is an ``mlflow server`` (SQLite backend, proxied artifacts) that the project's ``conf/local/mlflow.yml``
points at, as a team points its projects at theirs. Filled once per session (``recipe_store`` in conftest.py) and
shared by the slow tier's team-server, metric-schema, report, notebook and browser tests: a baseline run, a
dim_reduce run (its stage1, stage2 and control as child runs), a thor run, an adasum run (one worker), two newer
partial reruns the report must pass over (thor's evaluation node alone, dim_reduce's stage 2 alone), and a
report run.
"""

from __future__ import annotations

from pathlib import Path

import mlflow
import yaml

from tests.support.config import load_config
from tests.support.projects import DIM_REDUCE_PARAMS, TINY_PARAMS, kedro, make_project
from tests.support.trees import write_image_tree

EXPERIMENT = "resnet-recipes"  # conf/base/mlflow.yml
THOR_PARAMS = {"epochs": 2, "batch_size": 4, "frequency": 4, "eval_interval": 1}
ADASUM_PARAMS = {"epochs": 2, "batch_size": 4, "lr": {"peak": 0.05, "warmup_epochs": 0}}
COMMANDS = (
    ("--pipelines=baseline",),
    ("--pipelines=dim_reduce",),
    ("--pipelines=thor",),
    ("--pipelines=adasum",),
    ("--pipelines=thor", "--nodes=thor.evaluate"),  # FINISHED, but without the training's metrics
    ("--pipelines=dim_reduce", "--nodes=dim_reduce.stage2.train_stage2"),  # FINISHED, but without stage 1
)


REPORT_OUTPUT = "report_output.txt"  # what the report's kedro run printed (its closing links among it)


def fill_store(root: Path, server: str) -> Path:
    """Run the four recipes (and two partial reruns), then the report, in one new project under ``root`` that
    logs to the tracking server at ``server``."""
    tree = write_image_tree(root / "tree", classes=("cat", "dog", "fox"), per_class={"train": 8, "val": 3})
    params = {
        **TINY_PARAMS,
        **DIM_REDUCE_PARAMS,
        "data": {**TINY_PARAMS["data"], "root": str(tree)},
        "thor": THOR_PARAMS,
        "adasum": ADASUM_PARAMS,
    }
    project = make_project(root / "project", params)
    host, port = server.removeprefix("http://").split(":")
    (project / "conf/local/mlflow.yml").write_text(
        yaml.safe_dump({"server": {"mlflow_tracking_uri": server}, "ui": {"host": host, "port": port}})
    )
    for args in COMMANDS:
        result = kedro(project, "run", *args)
        assert result.returncode == 0, result.stdout[-5000:] + result.stderr[-5000:]
    report = kedro(project, "run", "--pipelines=report")
    assert report.returncode == 0, report.stdout[-5000:] + report.stderr[-5000:]
    (project / REPORT_OUTPUT).write_text(report.stdout + report.stderr)
    return project


def tracking_uri(project: Path) -> str:
    """The tracking URI the project logs to (``conf/local/mlflow.yml``, else its local SQLite store)."""
    if (project / "conf/local/mlflow.yml").is_file():
        return load_config("local", "mlflow", conf_source=project / "conf")["server"]["mlflow_tracking_uri"]
    return f"sqlite:///{project / 'mlflow.db'}"


def recipe_runs(project: Path, pipeline: str) -> list[mlflow.entities.Run]:
    """The runs tagged ``pipeline``, newest first."""
    client = mlflow.MlflowClient(tracking_uri(project))
    experiment = client.get_experiment_by_name(EXPERIMENT)
    return client.search_runs(
        [experiment.experiment_id], f"tags.pipeline = '{pipeline}'", order_by=["attributes.start_time DESC"]
    )


def trainings(client: mlflow.MlflowClient, run: mlflow.entities.Run) -> dict[str, mlflow.entities.Run]:
    """The child runs of ``run`` (dim_reduce's stage1, stage2, control) by their ``training`` tag."""
    children = client.search_runs([run.info.experiment_id], f"tags.mlflow.parentRunId = '{run.info.run_id}'")
    return {child.data.tags["training"]: child for child in children}


def store_report(project: Path) -> mlflow.entities.Run:
    """The report run ``fill_store`` made (its output is ``REPORT_OUTPUT``); later tests may add their own."""
    return recipe_runs(project, "report")[-1]


def complete_run(project: Path, pipeline: str) -> mlflow.entities.Run:
    """The run of the whole ``pipeline`` (not a partial rerun of some of its nodes), newest first."""
    (run, *_) = [run for run in recipe_runs(project, pipeline) if not run.info.run_name.endswith("(partial)")]
    return run
