"""Tuning at equal effort (``study.tuning``): the study pipeline in this process with a tiny budget, its Optuna
study, its MLflow child runs (one per trial and per fresh-seed training), a failed trial that does not stop it,
the chosen values, for an image recipe and for thor_bert's two trainings; and the checks of its parameters before
any work."""

from __future__ import annotations

import json
import os
import socket
import warnings

import click
import mlflow
import optuna
import pytest
import sqlalchemy

from pipelines.tracking.links import runs_to_compare
from tests.support.runner import process_state_kept, run_pipeline, session_project, tiny_params, tracking_uri
from tests.support.trees import write_image_tree
from trainlib.study.tuning import objective

DIVERGING_LR = 1e30  # blows the weights up at the first step: the training raises NonFiniteLossError


BASELINE_SPACE = {"baseline": {"lr": {"peak": [0.01, 0.2], "warmup_epochs": None}, "weight_decay": None}}
# thor_bert's two trainings over every key of their default spaces, at the tiny BERT's scale (a few steps an epoch)
THOR_BERT_SPACES = {
    "thor_bert": {"lr": {"peak": [0.001, 0.05]}, "frequency": [2, 4]},
    "thor_bert_control": {"lr": {"warmup_steps": [0, 3]}},
}


def tuned(storage: str, recipes=("baseline",), spaces=BASELINE_SPACE, **tuning) -> dict:
    return {
        "study": {
            "recipes": list(recipes),
            "seeds": [0],
            "epochs": 1,
            "eval_every_steps": 2,
            "tuning": {"trials": 2, "seeds": [100], "storage": storage, "spaces": spaces, **tuning},
        }
    }


def dead_machines_trial(storage: str, store: str) -> tuple[str, str]:
    """A trial left RUNNING by a machine that died long ago (its last heartbeat in 2000), with its MLflow child run
    and study run RUNNING in ``store``; their ids."""
    client = mlflow.MlflowClient(tracking_uri=store)
    experiment = client.create_experiment("resnet-recipes")
    study_run = client.create_run(experiment).info.run_id
    child = client.create_run(experiment, tags={"mlflow.parentRunId": study_run}).info.run_id
    with warnings.catch_warnings():  # a machine's trial made by hand, outside Study.optimize, to be found dead
        warnings.simplefilter("ignore")
        rdb = optuna.storages.RDBStorage(storage, heartbeat_interval=60)
        trial = optuna.create_study(storage=rdb, study_name="study/baseline").ask()
    trial.suggest_float("lr.peak", 0.01, 0.2, log=True)
    trial.set_user_attr("host", "a-machine-that-died")
    trial.set_user_attr("run_ids", [child])
    rdb.record_heartbeat(trial._trial_id)
    with rdb.engine.begin() as connection:
        connection.execute(sqlalchemy.text("UPDATE trial_heartbeats SET heartbeat = '2000-01-01 00:00:00'"))
    return study_run, child


def test_tuned_study_records_every_trial_and_trains_the_best_on_fresh_seeds(tmp_path):
    tree = write_image_tree(tmp_path / "tree", classes=("cat", "dog", "fox"), per_class={"train": 8, "val": 3})
    project = session_project(tmp_path / "project")
    storage = f"sqlite:///{tmp_path / 'tuning.db'}"
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    dead_study_run, dead_child = dead_machines_trial(storage, tracking_uri(project))
    # the next trial's values diverge: it fails, and the study goes on
    optuna.load_study(storage=storage, study_name="study/baseline").enqueue_trial({"lr.peak": DIVERGING_LR})
    with pytest.warns(UserWarning, match="out of range"):
        outputs = run_pipeline("study", tiny_params(tree, tuned(storage)), project)

    trials = optuna.load_study(study_name="study/baseline", storage=storage).trials
    states = [trial.state.name for trial in trials]
    # the dead machine's trial failed, not counted; the budget of 2 with the divergence counted, and the dead
    # trial's values retried
    assert states == ["FAIL", "FAIL", "COMPLETE"]
    assert "error" not in trials[0].user_attrs and trials[1].user_attrs["error"] == "NonFiniteLossError"
    best = trials[2]
    assert best.system_attrs["failed_trial"] == 0 and best.params == trials[0].params
    assert best.user_attrs["host"] == socket.gethostname()

    client = mlflow.MlflowClient(tracking_uri=tracking_uri(project))
    assert [client.get_run(run).info.status for run in (dead_study_run, dead_child)] == ["FAILED", "FAILED"]
    assert client.get_run(dead_child).data.tags["trial_error"] == "stale"
    experiment = client.get_experiment_by_name("resnet-recipes").experiment_id
    (study_run,) = client.search_runs([experiment], "tags.pipeline = 'study'")
    children = client.search_runs(
        [study_run.info.experiment_id], f"tags.mlflow.parentRunId = '{study_run.info.run_id}'"
    )
    by_trial = {child.data.tags["trial"]: child for child in children if "trial" in child.data.tags}
    fresh = [child for child in children if "trial" not in child.data.tags]
    assert sorted(by_trial) == ["1", "2"]  # one child run per trial this process ran
    assert [(child.data.tags["seed"], child.data.tags["recipe"]) for child in fresh] == [("0", "baseline")]
    for number, child in by_trial.items():
        trial = trials[int(number)]
        assert child.data.tags["trial_state"] == trial.state.name
        assert child.data.tags["seed"] == "100"  # the tuning seed, never the study's
        assert float(child.data.params["tuning.lr.peak"]) == trial.params["lr.peak"]
        assert child.info.run_name == f"seed100 baseline/trial{number}"
    assert by_trial["1"].data.tags["trial_error"] == "NonFiniteLossError"
    assert by_trial["1"].info.status == "FAILED"
    assert {child.info.status for child in children} - {"FAILED"} == {"FINISHED"}  # none left RUNNING
    assert "final/top1" in by_trial["2"].data.metrics and "val/step_top1" in by_trial["2"].data.metrics
    # the fresh seed trains the best trial's values
    assert float(fresh[0].data.params["baseline.lr.peak"]) == best.params["lr.peak"]

    choices = outputs["study.tuning_choices"]
    assert choices[["result", "key", "documented", "chosen"]].values.tolist() == [
        ["baseline", "lr.peak", 0.05, best.params["lr.peak"]]
    ]
    assert choices.loc[0, ["trials", "complete", "fail", "best_trial"]].tolist() == [2, 1, 2, 2]
    assert list(outputs["study.runs"]["seed"]) == [0]  # the paired tables: fresh seeds only
    assert set(outputs["study.tuning_history_plots"]) == {"baseline.png"}
    assert outputs["study.tuning_importance_plots"] == {}  # one completed trial: no importances (the log says so)
    # the closing link draws the fresh-seed trainings, not the trials
    with process_state_kept(project):
        mlflow.set_tracking_uri(tracking_uri(project))
        assert runs_to_compare(study_run.info.run_id) == [fresh[0].info.run_id]

    # one more trial, of the best's values: its training is read back from the result file, and like every trial
    # it has its child run (tagged reused, linking the run that trained it); so has the fresh seed, read back too
    optuna.load_study(storage=storage, study_name="study/baseline").enqueue_trial({"lr.peak": best.params["lr.peak"]})
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        again = run_pipeline("study", tiny_params(tree, tuned(storage, trials=3)), project)
    trials = optuna.load_study(study_name="study/baseline", storage=storage).trials
    assert [trial.state.name for trial in trials] == ["FAIL", "FAIL", "COMPLETE", "COMPLETE"]
    # two completed trials of one score: no importances to draw, and no Optuna warning saying they would be equal
    assert trials[2].value == trials[3].value and again["study.tuning_importance_plots"] == {}
    assert not [w.message for w in caught if f"{os.sep}optuna{os.sep}" in w.filename]
    every = client.search_runs([experiment], "tags.trial != ''")
    assert sorted(int(child.data.tags["trial"]) for child in every) == [1, 2, 3]  # a child run per trial it ran
    found = client.search_runs([experiment], "tags.reused = 'true'")
    reused = {child.data.tags.get("trial", "fresh"): child for child in found}
    assert set(reused) == {"3", "fresh"}
    assert reused["3"].data.tags["reused_from"] == by_trial["2"].info.run_id
    assert reused["3"].data.metrics["final/top1"] == by_trial["2"].data.metrics["final/top1"]
    assert trials[3].user_attrs["run_ids"] == [reused["3"].info.run_id]
    assert reused["fresh"].data.tags["reused_from"] == fresh[0].info.run_id


@pytest.mark.slow  # six BERT trainings (a minute): the slow tier
def test_thor_bert_tunes_each_training_at_equal_effort_and_trains_both_bests_on_fresh_seeds(tmp_path):
    """thor_bert's THOR and AdamWeightDecay trainings: ``trials`` trials each, each trial training its own row alone
    from its own space over its own section, on the masked-LM target; then both bests on the fresh seed."""
    tree = write_image_tree(tmp_path / "tree", classes=("cat", "dog"), per_class={"train": 2, "val": 1})
    project = session_project(tmp_path / "project")
    storage = f"sqlite:///{tmp_path / 'tuning.db'}"
    # the baseline's first trial diverges (AdamWeightDecay: its graph compiles in a third of THOR's time): it fails
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    optuna.create_study(storage=storage, study_name="study/thor_bert_control").enqueue_trial({"lr.peak": DIVERGING_LR})
    # a target no trial reaches: each trial's value is then its steps + 1 + (1 - final masked-LM accuracy)
    params = tuned(storage, recipes=["thor_bert"], spaces=THOR_BERT_SPACES) | {
        "thor_bert": {"target_mlm_accuracy": 0.99}
    }
    with pytest.warns(UserWarning, match="out of range"):
        outputs = run_pipeline("study", tiny_params(tree, params), project)

    trials = {
        training: optuna.load_study(study_name=f"study/{training}", storage=storage).trials
        for training in ("thor_bert", "thor_bert_control")
    }
    assert [t.state.name for t in trials["thor_bert"]] == ["COMPLETE", "COMPLETE"]
    assert [t.state.name for t in trials["thor_bert_control"]] == ["FAIL", "COMPLETE"]  # the failure counted
    assert trials["thor_bert_control"][0].user_attrs["error"] == "NonFiniteLossError"
    assert set(trials["thor_bert"][1].params) == {"lr.peak", "weight_decay", "damping.peak", "frequency"}
    assert set(trials["thor_bert_control"][0].params) == {"lr.peak", "lr.warmup_steps", "weight_decay"}

    client = mlflow.MlflowClient(tracking_uri=tracking_uri(project))
    (study_run,) = client.search_runs(
        [client.get_experiment_by_name("resnet-recipes").experiment_id], "tags.pipeline = 'study'"
    )
    children = client.search_runs(
        [study_run.info.experiment_id], f"tags.mlflow.parentRunId = '{study_run.info.run_id}'"
    )
    fresh = {child.data.tags["result"]: child for child in children if "trial" not in child.data.tags}
    for training, training_trials in trials.items():
        runs = {
            int(child.data.tags["trial"]): child
            for child in children
            if child.data.tags.get("tuning_study") == f"study/{training}"
        }
        assert sorted(runs) == [0, 1]  # one child run per trial, each training only its own row
        assert {run.data.tags["result"] for run in runs.values()} == {training}
        for number, run in runs.items():
            trial = training_trials[number]
            assert run.data.tags["seed"] == "100" and run.data.tags["trial_state"] == trial.state.name
            if trial.state.name == "COMPLETE":  # the masked-LM objective, missed: steps + 1 + (1 - final)
                final = run.data.metrics["final/mlm_accuracy"]
                # the trial's own steps: each seed's pipeline makes its own examples, as kedro run does on that seed
                key = run.data.tags["study_key"]
                (result,) = (project / "data/07_model_output/study/runs").glob(f"{key}.{training}.json")
                trained = json.loads(result.read_text())["steps_per_epoch"]
                assert trial.value == pytest.approx(trained + 2 - final)
        # the fresh seed trains the best trial's values in the training's own section
        best = min((t for t in training_trials if t.state.name == "COMPLETE"), key=lambda t: t.value)
        section = "thor_bert.thor" if training == "thor_bert" else "thor_bert.control"
        for key, value in best.params.items():
            assert float(fresh[training].data.params[f"{section}.{key}"]) == value
    assert [(run.data.tags["seed"], result) for result, run in sorted(fresh.items())] == [
        ("0", "thor_bert"),
        ("0", "thor_bert_control"),
    ]
    assert len(children) == 6  # 2 + 2 trials, 2 fresh-seed trainings

    choices = outputs["study.tuning_choices"]
    assert choices[["result", "key", "documented"]].values.tolist() == [
        ["thor_bert", "lr.peak", 0.006464],
        ["thor_bert", "weight_decay", 1e-5],
        ["thor_bert", "damping.peak", 0.007035],
        ["thor_bert", "frequency", 3],
        ["thor_bert_control", "lr.peak", 0.001],
        ["thor_bert_control", "lr.warmup_steps", 2],
        ["thor_bert_control", "weight_decay", 1e-5],
    ]
    assert choices.groupby("result")["trials"].max().to_dict() == {"thor_bert": 2, "thor_bert_control": 2}
    assert list(outputs["study.runs"]["result"]) == ["thor_bert", "thor_bert_control"]  # fresh seed only


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


def test_the_grace_period_must_outlast_the_heartbeat_interval(tmp_path):
    """A grace period no longer than the heartbeat interval would fail live trials between two heartbeats: the
    error (before any work) names the key and where it was set."""
    project = session_project(tmp_path / "project")
    with pytest.raises(click.ClickException) as error:
        run_pipeline("study", {"study": {"tuning": {"heartbeat_interval": 60, "grace_period": 60}}}, project)
    assert "study.tuning.grace_period is 60 s; give more than heartbeat_interval (60 s)" in str(error.value)
    assert str(error.value).endswith("(--params)")


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


def test_thor_bert_needs_a_space_for_each_training_and_each_key_in_its_own_section(tmp_path):
    """thor_bert's two trainings each need a space; the baseline's holds no THOR keys, and a warm-up in steps needs
    a schedule counting them (the BERT ones), a warm-up in epochs one counting those (the Momentum ones)."""
    project = session_project(tmp_path / "project")
    empty = {"lr": {"peak": None, "warmup_steps": None}, "weight_decay": None}
    with pytest.raises(click.ClickException) as error:
        run_pipeline(
            "study",
            {"study": {"recipes": ["thor_bert"], "tuning": {"trials": 2, "spaces": {"thor_bert_control": empty}}}},
            project,
        )
    assert "study.tuning.spaces.thor_bert_control is missing or empty" in str(error.value)
    assert str(error.value).endswith("(--params)")  # where it was set
    thor_keys = {"thor_bert_control": {"frequency": [2, 10]}}
    with pytest.raises(click.ClickException) as error:
        run_pipeline("study", {"study": {"tuning": {"spaces": thor_keys}}}, project)
    message = str(error.value)
    assert "study.tuning.spaces.thor_bert_control.frequency is set, but thor_bert_control has no preconditioner" in (
        message
    )
    warmups = {"thor_bert": {"lr": {"warmup_epochs": [0.0, 1.0]}}, "baseline": {"lr": {"warmup_steps": [0, 10]}}}
    with pytest.raises(click.ClickException) as error:
        run_pipeline("study", {"study": {"tuning": {"spaces": warmups}}}, project)
    message = str(error.value)
    assert "study.tuning.spaces.thor_bert.lr.warmup_epochs is set, but thor_bert's lr schedule (shape polynomial)" in (
        message
    )
    assert "study.tuning.spaces.baseline.lr.warmup_steps is set, but baseline's lr schedule (shape cosine)" in message
