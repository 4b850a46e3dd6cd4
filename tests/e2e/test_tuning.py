"""Tuning spread over processes (``study.tuning.storage``): two ``kedro run --pipelines=study`` processes, as two
machines would run them (each its own project, data and MLflow store), started together on one Optuna storage,
split one budget: both processes' trials are in one Optuna study, exactly ``trials`` of them, and no trial ran
twice (distinct numbers, one MLflow child run each, across both stores)."""

from __future__ import annotations

from collections import Counter

import mlflow
import optuna
import pytest

from tests.support.processes import Watched
from tests.support.projects import TINY_PARAMS, make_project
from tests.support.trees import write_image_tree

TRIALS = 4


@pytest.mark.slow
def test_two_processes_split_one_budget_in_one_optuna_study(tmp_path):
    tree = write_image_tree(tmp_path / "tree", classes=("cat", "dog", "fox"), per_class={"train": 8, "val": 3})
    storage = f"sqlite:///{tmp_path / 'tuning.db'}"
    params = {
        **TINY_PARAMS,
        "data": {**TINY_PARAMS["data"], "root": str(tree), "step_eval_images": 6},
        "study": {
            "recipes": ["baseline"],
            "seeds": [0],
            "epochs": 1,
            "eval_every_steps": 2,
            "tuning": {
                "trials": TRIALS,
                "seeds": [100],
                "storage": storage,
                "sampler": "qmc",
                "spaces": {"baseline": {"lr": {"peak": [0.01, 0.1]}}},  # none diverges on the tiny tree
            },
        },
    }
    projects = [make_project(tmp_path / f"machine{index}", params) for index in (0, 1)]
    processes = [Watched.kedro_run(project, "--pipelines=study") for project in projects]
    for process in processes:
        assert process.finish(timeout=900) == 0, process.output[-5000:]

    trials = optuna.load_study(study_name="study/baseline", storage=storage).trials
    assert len(trials) == TRIALS and {trial.state.name for trial in trials} == {"COMPLETE"}
    assert len({trial.user_attrs["pid"] for trial in trials}) == 2  # both processes ran trials of the one study
    runs = Counter()
    for project in projects:
        client = mlflow.MlflowClient(tracking_uri=f"sqlite:///{project / 'mlflow.db'}")
        experiment = client.get_experiment_by_name("resnet-recipes").experiment_id
        for run in client.search_runs([experiment]):
            if "trial" not in run.data.tags:
                continue  # the study's run, its fresh-seed training
            runs[int(run.data.tags["trial"])] += 1
            assert run.data.tags["trial_state"] == "COMPLETE" and run.info.status == "FINISHED"
    assert runs == Counter(range(TRIALS))  # every trial once, in one process's store
