"""Tuning at equal effort (``study.tuning``): the study pipeline in this process with a tiny budget, its Optuna
study, its MLflow child runs (one per trial and per fresh-seed training), a failed trial that does not stop it,
the chosen values; and the checks of its parameters before any work."""

from __future__ import annotations

import click
import mlflow
import optuna
import pytest

from pipelines.study.tuning import objective
from pipelines.tracking.links import runs_to_compare
from tests.support.runner import process_state_kept, run_pipeline, session_project, tiny_params, tracking_uri
from tests.support.trees import write_image_tree

DIVERGING_LR = 1e30  # blows the weights up at the first step: the training raises NonFiniteLossError


def tuned(storage: str, **tuning) -> dict:
    return {
        "study": {
            "recipes": ["baseline"],
            "seeds": [0],
            "epochs": 1,
            "eval_every_steps": 2,
            "tuning": {
                "trials": 2,
                "seeds": [100],
                "storage": storage,
                "spaces": {"baseline": {"lr": {"peak": [0.01, 0.2], "warmup_epochs": None}, "weight_decay": None}},
                **tuning,
            },
        }
    }


def test_tuned_study_records_every_trial_and_trains_the_best_on_fresh_seeds(tmp_path):
    tree = write_image_tree(tmp_path / "tree", classes=("cat", "dog", "fox"), per_class={"train": 8, "val": 3})
    project = session_project(tmp_path / "project")
    storage = f"sqlite:///{tmp_path / 'tuning.db'}"
    # the first trial's values diverge: it fails, and the study goes on
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    optuna.create_study(storage=storage, study_name="study/baseline").enqueue_trial({"lr.peak": DIVERGING_LR})
    with pytest.warns(UserWarning, match="out of range"):
        outputs = run_pipeline("study", tiny_params(tree, tuned(storage)), project)

    trials = optuna.load_study(study_name="study/baseline", storage=storage).trials
    states = [trial.state.name for trial in trials]
    assert states == ["FAIL", "COMPLETE"]  # the budget, the failure counted in it
    assert trials[0].user_attrs["error"] == "NonFiniteLossError"
    best = trials[1]

    client = mlflow.MlflowClient(tracking_uri=tracking_uri(project))
    experiment = client.get_experiment_by_name("resnet-recipes").experiment_id
    (study_run,) = client.search_runs([experiment], "tags.pipeline = 'study'")
    children = client.search_runs(
        [study_run.info.experiment_id], f"tags.mlflow.parentRunId = '{study_run.info.run_id}'"
    )
    by_trial = {child.data.tags["trial"]: child for child in children if "trial" in child.data.tags}
    fresh = [child for child in children if "trial" not in child.data.tags]
    assert sorted(by_trial) == ["0", "1"]  # one child run per trial
    assert [(child.data.tags["seed"], child.data.tags["recipe"]) for child in fresh] == [("0", "baseline")]
    for number, child in by_trial.items():
        trial = trials[int(number)]
        assert child.data.tags["trial_state"] == trial.state.name
        assert child.data.tags["seed"] == "100"  # the tuning seed, never the study's
        assert float(child.data.params["tuning.lr.peak"]) == trial.params["lr.peak"]
        assert child.info.run_name == f"seed100 baseline/trial{number}"
    assert by_trial["0"].data.tags["trial_error"] == "NonFiniteLossError"
    assert by_trial["0"].info.status == "FAILED"
    assert {child.info.status for child in children} - {"FAILED"} == {"FINISHED"}  # none left RUNNING
    assert "final/top1" in by_trial["1"].data.metrics and "val/step_top1" in by_trial["1"].data.metrics
    # the fresh seed trains the best trial's values
    assert float(fresh[0].data.params["baseline.lr.peak"]) == best.params["lr.peak"]

    choices = outputs["study.tuning_choices"]
    assert choices[["recipe", "key", "documented", "chosen"]].values.tolist() == [
        ["baseline", "lr.peak", 0.05, best.params["lr.peak"]]
    ]
    assert choices.loc[0, ["trials", "complete", "fail", "best_trial"]].tolist() == [2, 1, 1, 1]
    assert list(outputs["study.runs"]["seed"]) == [0]  # the paired tables: fresh seeds only
    assert set(outputs["study.tuning_history_plots"]) == {"baseline.png"}
    assert outputs["study.tuning_importance_plots"] == {}  # one completed trial: no importances (the log says so)
    # the closing link draws the fresh-seed trainings, not the trials
    with process_state_kept(project):
        mlflow.set_tracking_uri(tracking_uri(project))
        assert runs_to_compare(study_run.info.run_id) == [fresh[0].info.run_id]


def test_objective_ranks_every_trial_that_reached_the_target_first():
    def record(top1s, final):
        rows = [{"step": 2 * (i + 1), "val/step_top1": top1} for i, top1 in enumerate(top1s)]
        return {"step_history": rows, "steps_per_epoch": 6, "final_top1": final}

    reached_late = objective([record([0.1, 0.2, 0.9], 0.9)], target=0.5, epochs=1)
    missed_best = objective([record([0.1, 0.2, 0.4], 0.45)], target=0.5, epochs=1)
    missed_worse = objective([record([0.1, 0.2, 0.3], 0.3)], target=0.5, epochs=1)
    assert reached_late == 6 and reached_late < missed_best < missed_worse
    assert missed_best == pytest.approx(6 + 1 + 0.55)


def test_tuning_seeds_must_differ_from_the_study_seeds(tmp_path):
    """study.seeds from --params meets study.tuning.seeds of conf/base: the error (before any work; kedro run
    prints it as one line) names both keys and that file."""
    project = session_project(tmp_path / "project")
    with pytest.raises(click.ClickException) as error:
        run_pipeline("study", {"study": {"seeds": [0, 100]}}, project)
    assert "study.tuning.seeds and study.seeds share [100]" in str(error.value)
    assert "conf/base/parameters_study.yml" in str(error.value)


def test_a_tuned_recipe_needs_a_space_and_a_warmup_needs_a_schedule_with_one(tmp_path):
    project = session_project(tmp_path / "project")
    bad = {
        "study": {
            "recipes": ["thor", "dim_reduce"],
            "tuning": {"trials": 2, "spaces": {"thor": {"lr": {"warmup_epochs": [0.0, 1.0]}}}},
        }
    }
    with pytest.raises(click.ClickException) as error:
        run_pipeline("study", bad, project)
    message = str(error.value)
    assert "study.recipes has dim_reduce, which study.tuning does not tune" in message
    with pytest.raises(click.ClickException, match=r"study.tuning.spaces.thor.lr.warmup_epochs is set, but thor's lr"):
        run_pipeline(
            "study", {"study": {"tuning": {"spaces": {"thor": {"lr": {"warmup_epochs": [0.0, 1.0]}}}}}}, project
        )
