"""The ``study`` pipeline: statistics against closed forms, and a tiny real study (2 recipes x 2 seeds) that is
killed after its first finished run and rerun: the rerun does not repeat that run, the CI columns follow from
the per-run values logged in MLflow, time to target is the first crossing in the logged step series, and the report
after it reads the study's runs."""

from __future__ import annotations

import math
from pathlib import Path

import mlflow
import numpy as np
import pandas as pd
import pytest
from scipy import stats

from tests.support.csv_files import CSV_REL, assert_readable_csv_files
from tests.support.processes import Watched
from tests.support.projects import DIM_REDUCE_PARAMS, TINY_PARAMS, kedro, make_project
from tests.support.servers import free_port
from tests.support.trees import write_image_tree

TARGET = 0.34  # just above chance with 3 classes
STUDY = {
    "recipes": ["baseline", "thor"],
    "seeds": [0, 1],
    "epochs": 2,
    "eval_every_steps": 2,
    "dir": "data/07_model_output/study",
}


# ------------------------------------------------------------------------------------------------
# statistics


# ------------------------------------------------------------------------------------------------
# a tiny real study, killed and rerun


def kill_after_first_result(project: Path) -> None:
    """``kedro run --pipelines=study``, SIGKILLed (whole process group) as its second run starts: its first run's
    result file is written by then."""
    run = Watched.kedro_run(project, "--pipelines=study")
    run.wait_for("study: training")
    run.wait_for("study: training")
    run.kill_group()


@pytest.fixture(scope="module")
def study(tmp_path_factory):
    root = tmp_path_factory.mktemp("study")
    tree = write_image_tree(root / "tree", classes=("cat", "dog", "fox"), per_class={"train": 8, "val": 3})
    params = {
        **TINY_PARAMS,
        "data": {**TINY_PARAMS["data"], "root": str(tree), "step_eval_images": 6},
        "thor": {"batch_size": 4, "frequency": 4},
        "study": STUDY,
        "target": {"top1": TARGET},
    }
    project = make_project(root / "project", params)
    results = project / STUDY["dir"] / "runs"
    kill_after_first_result(project)
    finished = {path.name: (path.stat().st_mtime_ns, path.read_text()) for path in results.glob("*.json")}
    rerun = kedro(project, "run", "--pipelines=study")
    assert rerun.returncode == 0, rerun.stdout[-5000:] + rerun.stderr[-5000:]
    client = mlflow.MlflowClient(tracking_uri=f"sqlite:///{project / 'mlflow.db'}")
    return project, finished, rerun, client


@pytest.mark.slow
def test_a_killed_study_resumes_without_rerunning_a_finished_run(study):
    project, finished, rerun, client = study
    results = project / STUDY["dir"] / "runs"
    assert finished and len(list(results.glob("*.json"))) == 4
    for name, (mtime, text) in finished.items():  # untouched by the rerun
        assert results.joinpath(name).stat().st_mtime_ns == mtime and results.joinpath(name).read_text() == text
    assert not list(results.glob("*.tmp"))
    experiment = client.get_experiment_by_name("resnet-recipes")
    parents = client.search_runs(
        [experiment.experiment_id], "tags.pipeline = 'study'", order_by=["attributes.start_time DESC"]
    )
    children = client.search_runs([experiment.experiment_id], f"tags.mlflow.parentRunId = '{parents[0].info.run_id}'")

    def result_file(child) -> str:
        return f"{child.data.tags['study_key']}.{child.data.tags['result']}.json"

    trained_again = {result_file(child) for child in children if "reused" not in child.data.tags}
    assert not trained_again & set(finished)  # the finished runs were read, not trained again
    assert len(trained_again) == 4 - len(finished)
    # and each has its child run of the rerun's study run, linking the killed run's training
    reused = [child for child in children if "reused" in child.data.tags]
    assert {result_file(child) for child in reused} == set(finished)
    assert all(client.get_run(child.data.tags["reused_from"]).info.status == "FINISHED" for child in reused)
    assert "finished earlier" in rerun.stdout + rerun.stderr


@pytest.mark.slow
def test_ci_columns_follow_from_the_logged_per_run_values(study):
    project, _, _, client = study
    runs = pd.read_csv(project / "data/08_reporting/study/runs.csv")
    summary = pd.read_csv(project / "data/08_reporting/study/summary.csv").set_index("result")
    assert sorted(zip(runs["result"], runs["seed"], strict=True)) == [(r, s) for r in STUDY["recipes"] for s in (0, 1)]
    for result, group in runs.groupby("result"):
        logged = []
        for run_id in group["mlflow_run_id"]:
            child = client.get_run(run_id)
            assert child.data.tags["result"] == result
            logged.append(child.data.metrics["final/top1"])
        mean = np.mean(logged)
        half = stats.t.ppf(0.975, len(logged) - 1) * np.std(logged, ddof=1) / math.sqrt(len(logged))
        row = summary.loc[result]
        assert row["final_top1"] == pytest.approx(mean, rel=CSV_REL)
        # an accuracy's interval is cut to [0, 1] (tests/report/test_study.py)
        assert row["final_top1_ci_low"] == pytest.approx(max(mean - half, 0.0), rel=CSV_REL, abs=1e-9, nan_ok=True)
        assert row["final_top1_ci_high"] == pytest.approx(min(mean + half, 1.0), rel=CSV_REL, nan_ok=True)
        assert row["final_top1_n"] == 2


@pytest.mark.slow
def test_time_to_target_is_the_first_crossing_of_the_logged_step_series(study):
    project, _, _, client = study
    runs = pd.read_csv(project / "data/08_reporting/study/runs.csv")
    reached = 0
    for _, run in runs.iterrows():
        top1 = {m.step: m.value for m in client.get_metric_history(run["mlflow_run_id"], "val/step_top1")}
        elapsed = {m.step: m.value for m in client.get_metric_history(run["mlflow_run_id"], "train/elapsed_s")}
        evaluation_s = client.get_metric_history(run["mlflow_run_id"], "eval/time_s")
        steps = sorted(top1)
        assert steps == list(range(2, 2 * len(steps) + 1, 2))  # every eval_every_steps, across both epochs
        assert len(evaluation_s) == len(steps) and all(m.value > 0 for m in evaluation_s)
        assert all(elapsed[a] < elapsed[b] for a, b in zip(steps, steps[1:], strict=False))
        crossing = next((step for step in steps if top1[step] >= TARGET), None)
        if crossing is None:
            assert math.isnan(run["time_to_target_s"]) and math.isnan(run["epochs_to_target"])
            continue
        reached += 1
        assert run["time_to_target_s"] == pytest.approx(elapsed[crossing], rel=CSV_REL)
        assert run["epochs_to_target"] == pytest.approx(crossing / run["steps_per_epoch"], rel=CSV_REL)
    assert reached >= 1
    assert (project / "data/08_reporting/study/top1_vs_time.png").stat().st_size > 0


@pytest.mark.slow
def test_the_report_after_the_study_reads_its_runs_and_charts_them(study):
    """The issue's walk: a small study of baseline and thor, then ``kedro run --pipelines=report``: the table, the
    summary and the closing link are the study's trainings (the killed run's first one included), no compared recipe
    is missing, and no CSV file under data/ holds float noise."""
    project, _, _, client = study
    result = kedro(project, "run", "--pipelines=report", "--params=report.recipes=[baseline,thor]")
    assert result.returncode == 0, result.stdout[-5000:] + result.stderr[-5000:]
    table = pd.read_csv(project / "data/08_reporting/report/comparison.csv").set_index("recipe")
    assert list(table["source"]) == ["study, 2 seeds"] * 2 and "missing" not in set(table["run_status"])
    summary = (project / "data/08_reporting/report/summary.md").read_text()
    assert "study, 2 seeds, 2 epochs each" in summary.splitlines()[0]
    trained = pd.read_csv(project / "data/08_reporting/study/runs.csv")["mlflow_run_id"]
    experiment = client.get_experiment_by_name("resnet-recipes").experiment_id
    (report,) = client.search_runs([experiment], "tags.pipeline = 'report'")
    assert sorted(report.data.tags["compared_runs"].split(",")) == sorted(trained)
    assert "MLflow: compare the runs at http://127.0.0.1:5000/#/experiments/" in result.stdout
    assert_readable_csv_files(project / "data")


# ------------------------------------------------------------------------------------------------
# dim_reduce in a study: stage 2 against its control, from one stage 1 per seed


def run_tiny_study(
    root: Path, recipe: str, params: dict, seeds: tuple[int, ...] = (0, 1)
) -> tuple[Path, mlflow.MlflowClient]:
    """``kedro run --pipelines=study`` of ``recipe`` over ``seeds`` on a tiny tree, with ``params`` on top."""
    tree = write_image_tree(root / "tree", classes=("cat", "dog", "fox"), per_class={"train": 8, "val": 3})
    params = {
        **TINY_PARAMS,
        **params,
        "data": {**TINY_PARAMS["data"], "root": str(tree), "step_eval_images": 6},
        "study": STUDY | {"recipes": [recipe], "seeds": list(seeds)},
        "target": {"top1": TARGET},
    }
    project = make_project(root / "project", params)
    result = kedro(project, "run", "--pipelines=study")
    assert result.returncode == 0, result.stdout[-5000:] + result.stderr[-5000:]
    return project, mlflow.MlflowClient(tracking_uri=f"sqlite:///{project / 'mlflow.db'}")


def assert_paired(project: Path, row: str, reference: str, seeds: tuple[int, ...] = (0, 1)) -> pd.DataFrame:
    """The study's runs hold ``row`` and ``reference`` for ``seeds``, and ``paired.csv``'s final top-1 difference
    of ``row vs reference`` is the mean of the per-seed differences; returns the runs."""
    runs = pd.read_csv(project / "data/08_reporting/study/runs.csv")
    assert sorted(zip(runs["result"], runs["seed"], strict=True)) == sorted(
        (name, seed) for name in (row, reference) for seed in seeds
    )
    by_seed = runs.set_index(["result", "seed"])["final_top1"]
    paired = pd.read_csv(project / "data/08_reporting/study/paired.csv").set_index(["comparison", "measure"])
    difference = paired.loc[(f"{row} vs {reference}", "final_top1_difference")]
    assert difference["n"] == len(seeds) and difference["unit"] == "pt"  # points, rounded as printed
    expected = 100 * np.mean([by_seed[row, s] - by_seed[reference, s] for s in seeds])
    assert difference["mean"] == pytest.approx(expected, abs=0.006)  # rounded to 2 decimals, from 6-digit finals
    return runs


def child_run_steps(client: mlflow.MlflowClient, runs: pd.DataFrame, recipe: str) -> list[list[int]]:
    """Each run's MLflow child run is FINISHED, tagged with its recipe and result row, holds the final top-1 of
    ``runs``; returns each one's steps of ``val/step_top1``."""
    steps = []
    for _, run in runs.iterrows():
        child = client.get_run(run["mlflow_run_id"])
        assert child.info.status == "FINISHED"
        assert child.data.tags["result"] == run["result"] and child.data.tags["recipe"] == recipe
        assert child.data.metrics["final/top1"] == pytest.approx(run["final_top1"], rel=CSV_REL)
        steps.append(sorted(m.step for m in client.get_metric_history(run["mlflow_run_id"], "val/step_top1")))
    return steps


@pytest.fixture(scope="module")
def dim_reduce_study(tmp_path_factory):
    return run_tiny_study(tmp_path_factory.mktemp("dim_reduce_study"), "dim_reduce", DIM_REDUCE_PARAMS)


@pytest.mark.slow
def test_dim_reduce_study_pairs_stage2_with_its_control(dim_reduce_study):
    project, client = dim_reduce_study
    runs = assert_paired(project, "stage2", "control")
    for (_, run), steps in zip(runs.iterrows(), child_run_steps(client, runs, "dim_reduce"), strict=True):
        # stage 2 and the control are evaluated alike, every 2 steps, counting on from stage 1's steps
        stage1_steps = run["steps_per_epoch"] * DIM_REDUCE_PARAMS["dim_reduce"]["stage1"]["epochs"]
        assert steps and min(steps) > stage1_steps and all(s % 2 == 0 for s in steps)
    results = project / STUDY["dir"] / "runs"
    assert sorted(p.name.rsplit(".", 2)[1] for p in results.glob("*.json")) == ["control"] * 2 + ["stage2"] * 2


# ------------------------------------------------------------------------------------------------
# adasum in a study: Adasum against averaged gradients, each on two msrun ranks from the same start


ADASUM_SEEDS = (0,)


@pytest.fixture(scope="module")
def adasum_study(tmp_path_factory):
    params = {
        "distributed": {"master_port": free_port()},
        "adasum": {"batch_size": 4, "lr": {"peak": 0.05, "warmup_epochs": 0}},
    }
    # one seed: its four msrun jobs took 144 s with two; pairing over several seeds is the baseline study's to show
    return run_tiny_study(tmp_path_factory.mktemp("adasum_study"), "adasum", params, seeds=ADASUM_SEEDS)


@pytest.mark.slow
def test_adasum_study_pairs_adasum_with_allreduce_on_the_same_ranks(adasum_study):
    project, client = adasum_study
    runs = assert_paired(project, "adasum", "allreduce", seeds=ADASUM_SEEDS)
    # rank 0 of each msrun job logged into the study's child run
    for steps in child_run_steps(client, runs, "adasum"):
        assert steps and all(step % STUDY["eval_every_steps"] == 0 for step in steps)
    assert {client.get_run(run_id).data.tags["workers"] for run_id in runs["mlflow_run_id"]} == {"2"}
