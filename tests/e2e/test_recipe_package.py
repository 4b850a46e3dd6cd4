"""A team's own recipe from a package of its own (issue 51 item 3): ``pip`` installs ``tests/example_recipe`` into a
folder of its own, and ``kedro run`` in a copy of this project finds it through the entry-point group
``resnet_recipes.recipes``: a tuned study trains it beside the baseline at equal effort, and the report compares
the two. Its configuration is the project's ``conf/local`` file; no file of this project is edited."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import mlflow
import optuna
import pandas as pd
import pytest
import yaml

from tests.support.projects import TINY_PARAMS, make_project
from tests.support.trees import write_image_tree

pytestmark = pytest.mark.slow

EXAMPLE = Path(__file__).parents[1] / "example_recipe"
TINY = {"epochs": 1, "batch_size": 4, "lr": {"peak": 0.05, "warmup_epochs": 0}}


def installed(target: Path) -> Path:
    """The example package installed by pip into ``target`` (not into this environment: the other tests' projects
    have no ``nesterov`` section)."""
    command = [sys.executable, "-m", "pip", "install", "--no-deps", "--no-build-isolation", "--target", str(target)]
    result = subprocess.run([*command, str(EXAMPLE)], capture_output=True, text=True, check=False)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    return target


def kedro_run(project: Path, site: Path, *args: str) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(site), os.environ.get("PYTHONPATH", "")])}
    return subprocess.run(
        [sys.executable, "-m", "kedro", "run", *args],
        cwd=project,
        capture_output=True,
        text=True,
        check=False,
        timeout=900,
        env=env,
    )


def test_a_recipe_from_its_own_package_is_tuned_studied_and_reported_beside_the_baseline(tmp_path):
    site = installed(tmp_path / "site")
    tree = write_image_tree(tmp_path / "tree", classes=("cat", "dog", "fox"), per_class={"train": 8, "val": 3})
    storage = f"sqlite:///{tmp_path / 'tuning.db'}"
    study = {
        "recipes": ["baseline", "nesterov"],
        "seeds": [0],
        "epochs": 1,
        "eval_every_steps": 2,
        "tuning": {
            "trials": 1,
            "seeds": [100],
            "storage": storage,
            "spaces": {"nesterov": {"lr": {"peak": [0.02, 0.1]}}},
        },
    }
    params = {
        **TINY_PARAMS,
        "data": {**TINY_PARAMS["data"], "root": str(tree), "step_eval_images": 6},
        "study": study,
        "target": {"top1": 0.34},
        "report": {"recipes": ["baseline", "nesterov"]},
    }
    project = make_project(tmp_path / "project", params)
    # the team's file, as the package's README would have them copy it, with a tiny budget on top
    section = yaml.safe_load((EXAMPLE / "parameters_nesterov.yml").read_text())
    section["nesterov"] |= {**TINY, "lr": section["nesterov"]["lr"] | TINY["lr"]}
    (project / "conf/local/parameters_nesterov.yml").write_text(yaml.safe_dump(section))

    result = kedro_run(project, site, "--pipelines=study")
    assert result.returncode == 0, result.stdout[-5000:] + result.stderr[-5000:]
    runs = pd.read_csv(project / "data/08_reporting/study/runs.csv")
    assert sorted(runs["result"]) == ["baseline", "nesterov"] and set(runs["seed"]) == {0}
    paired = pd.read_csv(project / "data/08_reporting/study/paired.csv")
    assert "nesterov vs baseline" in set(paired["comparison"])
    # tuned at equal effort: one trial each, in Optuna studies of their own
    for recipe in ("baseline", "nesterov"):
        trials = optuna.load_study(study_name=f"study/{recipe}", storage=storage).trials
        assert [trial.state.name for trial in trials] == ["COMPLETE"], recipe
    client = mlflow.MlflowClient(tracking_uri=f"sqlite:///{project / 'mlflow.db'}")
    experiment = client.get_experiment_by_name("resnet-recipes").experiment_id
    trained = client.search_runs([experiment], "tags.recipe = 'nesterov' and tags.seed = '0'")
    assert len(trained) == 1 and "final/top1" in trained[0].data.metrics
    assert trained[0].data.params["nesterov.epochs"] == "1"  # the study's budget on its section

    result = kedro_run(project, site, "--pipelines=report")
    assert result.returncode == 0, result.stdout[-5000:] + result.stderr[-5000:]
    table = pd.read_csv(project / "data/08_reporting/report/comparison.csv").set_index("recipe")
    assert list(table.index) == ["baseline", "nesterov"]
    assert table.at["nesterov", "top1"] == pytest.approx(trained[0].data.metrics["final/top1"], abs=1e-6)
