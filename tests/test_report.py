"""The ``report`` pipeline and its library: recipes compared from real MLflow runs."""

from __future__ import annotations

import math

import mlflow
import pandas as pd
import pytest
from PIL import Image
from report_store import EXPERIMENT, recipe_runs, tracking_uri
from test_config import CONF, load_params
from test_config_validation import changed
from test_pipeline_e2e import kedro, make_project

from pipelines.config_validation import ParameterError, base_schema, parameter_sources, validate_parameters
from pipelines.reporting.compare import NoRunsError, compare, figures, time_to_target

TARGET = 0.5
PREFIXES = {
    "baseline": ("", "baseline"),
    "thor": ("thor_", "thor"),
    "adasum": ("", "adasum"),
}  # per-epoch prefix, evaluation prefix
PLOTS = ("top1_vs_epoch", "top1_vs_time", "loss", "explained_variance")


def logged(client: mlflow.MlflowClient, run_id: str, metric: str) -> dict[int, float]:
    return {m.step: m.value for m in sorted(client.get_metric_history(run_id, metric), key=lambda m: m.timestamp)}


def full_run(project, pipeline: str):
    """The newest run of ``pipeline`` that trained (the partial thor rerun only evaluated)."""
    prefix = PREFIXES[pipeline][0]
    return next(run for run in recipe_runs(project, pipeline) if f"{prefix}loss" in run.data.metrics)


def expected_row(project, recipe: str, target: float) -> dict:
    """The table row computed here from the run's logged metrics, independently of the library."""
    client = mlflow.MlflowClient(tracking_uri(project))
    run = full_run(project, recipe)
    prefix, final = PREFIXES[recipe]
    run_id = run.info.run_id
    seconds, rates, top1 = (logged(client, run_id, prefix + m) for m in ("epoch_time_s", "images_per_s", "top1"))
    epochs = sorted(step for step in seconds if step >= 1)
    total, reached = 0.0, (math.nan, math.nan)
    for epoch in epochs:
        total += seconds[epoch]
        if math.isnan(reached[0]) and top1.get(epoch, -1) >= target:
            reached = (epoch, total)
    return {
        "run_id": run_id,
        "top1": logged(client, run_id, f"{final}_top1")[0],
        "top5": logged(client, run_id, f"{final}_top5")[0],
        "epochs": max(epochs),
        "train_time_s": total,
        "wall_time_s": (run.info.end_time - run.info.start_time) / 1000,
        "images_per_s": sum(rates[e] * seconds[e] for e in epochs) / total,
        "epoch_to_target": reached[0],
        "time_to_target_s": reached[1],
    }


@pytest.fixture(scope="module")
def report_run(recipe_store):
    result = kedro(recipe_store, "run", "--pipelines=report", f"--params=report.target_top1={TARGET}")
    assert result.returncode == 0, result.stdout[-5000:] + result.stderr[-5000:]
    return recipe_store, result


def test_table_equals_the_runs_logged_metrics(report_run):
    project, result = report_run
    table = pd.read_csv(project / "data/08_reporting/report/comparison.csv").set_index("recipe")
    assert list(table.index) == ["baseline", "dim_reduce", "thor", "adasum"]
    for recipe in ("baseline", "thor", "adasum"):
        expected = expected_row(project, recipe, TARGET)
        assert (table.loc[recipe, "run_id"], table.loc[recipe, "run_status"]) == (expected.pop("run_id"), "FINISHED")
        for column, value in expected.items():
            assert table.loc[recipe, column] == pytest.approx(value, rel=1e-9, nan_ok=True), (recipe, column)
        assert not table.loc[recipe, "resumed"] and table.loc[recipe, "env"] == "local"
    # the final evaluation, as the evaluation node wrote it
    thor_eval = pd.read_json(project / "data/08_reporting/thor_eval.json", typ="series")
    assert table.loc["thor", "top1"] == pytest.approx(thor_eval["top1"])
    assert table.loc["dim_reduce", "run_status"] == "missing" and math.isnan(table.loc["dim_reduce", "top1"])
    output = result.stdout + result.stderr
    assert "no finished run of dim_reduce" in output and "no finished run of adasum" not in output
    partial = recipe_runs(project, "thor")[0]  # the newest thor run, only an evaluation
    assert "thor_loss" not in partial.data.metrics and partial.info.run_id in output  # named as skipped


def test_histories_hold_each_epoch(report_run):
    project, _ = report_run
    client = mlflow.MlflowClient(tracking_uri(project))
    histories = pd.read_csv(project / "data/08_reporting/report/histories.csv")
    for recipe, (prefix, _) in PREFIXES.items():
        rows = histories[histories["recipe"] == recipe]
        run_id = full_run(project, recipe).info.run_id
        assert list(rows["epoch"]) == [1, 2]
        loss = logged(client, run_id, prefix + "loss")
        assert list(rows["loss"]) == pytest.approx([loss[1], loss[2]])
        times = logged(client, run_id, prefix + "epoch_time_s")
        assert list(rows["train_time_s"]) == pytest.approx([times[1], times[1] + times[2]])


def test_plots_are_written_and_logged_to_mlflow(report_run):
    project, _ = report_run
    for name in PLOTS:
        with Image.open(project / f"data/08_reporting/report/{name}.png") as image:
            assert image.format == "PNG" and image.width > 400
    client = mlflow.MlflowClient(tracking_uri(project))
    run = recipe_runs(project, "report")[0]
    assert run.info.status == "FINISHED"
    artifacts = {a.path for a in client.list_artifacts(run.info.run_id, "report")}
    assert {f"report/{name}.png" for name in PLOTS} | {"report/comparison.csv", "report/histories.csv"} <= artifacts


def test_figures_have_labelled_axes_and_one_line_per_recipe(recipe_store):
    comparison = compare(tracking_uri(recipe_store), EXPERIMENT, ["baseline", "thor", "adasum"], TARGET)
    drawn = figures(comparison.histories, comparison.explained_variance, TARGET)
    assert set(drawn) == set(PLOTS)
    expected_x = {"top1_vs_epoch": "epoch", "top1_vs_time": "train_time_s", "loss": "epoch"}
    for name, x in expected_x.items():
        axes = drawn[name].axes[0]
        assert axes.get_xlabel() and axes.get_ylabel() and axes.get_title(), name
        recipe_lines = [line for line in axes.get_lines() if not line.get_label().startswith("_")]
        assert [line.get_label() for line in recipe_lines] == ["baseline", "thor", "adasum"], name
        assert [text.get_text() for text in axes.get_legend().get_texts()] == ["baseline", "thor", "adasum"], name
        for line in recipe_lines:
            rows = comparison.histories[comparison.histories["recipe"] == line.get_label()]
            assert list(line.get_xdata()) == pytest.approx(list(rows[x]))
    assert drawn["top1_vs_epoch"].axes[0].get_xlabel() == "epoch"
    assert "top-1" in drawn["top1_vs_epoch"].axes[0].get_ylabel()
    assert "loss" in drawn["loss"].axes[0].get_ylabel()
    top1 = comparison.histories.loc[comparison.histories["recipe"] == "thor", "top1"]
    thor_line = drawn["top1_vs_epoch"].axes[0].get_lines()[1]
    assert list(thor_line.get_ydata()) == pytest.approx(list(100 * top1))  # percent
    # no dim_reduce run: the explained-variance figure says so instead of drawing nothing
    variance_axes = drawn["explained_variance"].axes[0]
    assert [t.get_text() for t in variance_axes.texts] == ["no dim_reduce run"]


def test_pinned_run_ids(recipe_store):
    uri = tracking_uri(recipe_store)
    baseline, thor = full_run(recipe_store, "baseline"), full_run(recipe_store, "thor")
    pinned = compare(uri, EXPERIMENT, ["thor"], TARGET, {"thor": thor.info.run_id})
    assert pinned.table["run_id"].tolist() == [thor.info.run_id]
    partial = recipe_runs(recipe_store, "thor")[0]
    assert partial.info.run_id != thor.info.run_id
    with pytest.raises(ValueError, match=r"report.run_ids.thor: run \w+ lacks the metrics \['thor_loss'\]"):
        compare(uri, EXPERIMENT, ["thor"], TARGET, {"thor": partial.info.run_id})
    with pytest.raises(ValueError, match="report.run_ids.thor: run .* is tagged pipeline='baseline', not thor"):
        compare(uri, EXPERIMENT, ["thor"], TARGET, {"thor": baseline.info.run_id})
    with pytest.raises(ValueError, match="report.run_ids.thor: no MLflow run 'nosuchrun'"):
        compare(uri, EXPERIMENT, ["thor"], TARGET, {"thor": "nosuchrun"})


def hand_logged_dim_reduce_run(tmp_path) -> str:
    """A store with one dim_reduce run logged as the pipeline logs it, with known numbers."""
    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    client = mlflow.MlflowClient(uri)
    experiment = client.create_experiment(EXPERIMENT, artifact_location=(tmp_path / "mlruns").as_uri())
    run_id = client.create_run(experiment, tags={"pipeline": "dim_reduce"}).info.run_id
    metrics = {
        "stage1_loss": {1: 1.0, 2: 0.8},
        "stage1_top1": {2: 0.6, 0: 0.61},  # step 0: stage 1's final evaluation under the same name
        "stage1_epoch_time_s": {1: 10.0, 2: 20.0},
        "stage1_images_per_s": {1: 100.0, 2: 50.0},
        "stage2_loss": {3: 0.7},
        "stage2_epoch_time_s": {3: 30.0},
        "stage2_images_per_s": {3: 40.0},
        "stage2_top1": {0: 0.9},
        "stage2_top5": {0: 1.0},
    }
    for name, steps in metrics.items():
        for step, value in steps.items():
            client.log_metric(run_id, name, value, step=step)
    variance = pd.DataFrame(
        {
            "component": [1, 2],
            "explained_variance": [3.0, 1.0],
            "explained_variance_ratio": [0.6, 0.2],
            "cumulative_ratio": [0.6, 0.8],
        }
    )
    variance.to_csv(tmp_path / "pca_explained_variance.csv", index=False)
    client.log_artifact(run_id, str(tmp_path / "pca_explained_variance.csv"), "pca")
    client.set_terminated(run_id)
    return uri


def test_dim_reduce_is_stitched_from_stage1_and_stage2(tmp_path):
    uri = hand_logged_dim_reduce_run(tmp_path)
    comparison = compare(uri, EXPERIMENT, ["dim_reduce", "baseline"], 0.85)
    history = comparison.histories
    assert list(history["phase"]) == ["stage1", "stage1", "stage2"]
    assert list(history["epoch"]) == [1, 2, 3]
    # stage 1's per-epoch top-1 only, then stage 2's final evaluation at its last epoch
    assert history["top1"].tolist() == pytest.approx([math.nan, 0.6, 0.9], nan_ok=True)
    assert list(history["train_time_s"]) == [10.0, 30.0, 60.0]
    row = comparison.table.set_index("recipe").loc["dim_reduce"]
    assert (row["top1"], row["top5"], row["epochs"], row["train_time_s"]) == (0.9, 1.0, 3, 60.0)
    assert row["images_per_s"] == pytest.approx((100 * 10 + 50 * 20 + 40 * 30) / 60)
    assert (row["epoch_to_target"], row["time_to_target_s"]) == (3, 60.0)
    assert comparison.table.set_index("recipe").loc["baseline", "run_status"] == "missing"
    assert comparison.explained_variance["cumulative_ratio"].tolist() == [0.6, 0.8]
    axes = figures(history, comparison.explained_variance, 0.85)["explained_variance"].axes[0]
    assert len(axes.patches) == 2 and list(axes.get_lines()[0].get_ydata()) == [0.6, 0.8]
    assert axes.get_xlabel() == "principal component" and axes.get_ylabel() == "explained variance ratio"


def test_time_to_target_is_the_first_epoch_reaching_it():
    history = pd.DataFrame({"epoch": [1, 2, 3], "top1": [0.5, math.nan, 0.8], "train_time_s": [10.0, 25.0, 45.0]})
    assert time_to_target(history, 0.5) == (1.0, 10.0)
    assert time_to_target(history, 0.7) == (3.0, 45.0)
    assert all(math.isnan(v) for v in time_to_target(history, 0.9))


def test_no_runs_at_all_is_an_error(tmp_path):
    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    with pytest.raises(NoRunsError, match="no MLflow experiment 'resnet-recipes'"):
        compare(uri, EXPERIMENT, ["baseline"], TARGET)
    client = mlflow.MlflowClient(uri)
    experiment = client.create_experiment(EXPERIMENT, artifact_location=(tmp_path / "mlruns").as_uri())
    client.set_terminated(client.create_run(experiment, tags={"pipeline": "data"}).info.run_id)
    with pytest.raises(NoRunsError, match=r"no finished run of any recipe \(baseline, thor\)"):
        compare(uri, EXPERIMENT, ["baseline", "thor"], TARGET)
    with pytest.raises(ValueError, match="report.recipes names unknown recipes \\['resnet'\\]"):
        compare(uri, EXPERIMENT, ["resnet"], TARGET)


def test_report_pipeline_without_runs_fails_naming_the_cause(tmp_path):
    project = make_project(tmp_path / "project", {})
    result = kedro(project, "run", "--pipelines=report", timeout=300)
    assert result.returncode != 0
    assert "no finished run of any recipe (baseline, dim_reduce, thor, adasum)" in result.stdout + result.stderr


@pytest.mark.parametrize(
    ("key", "value", "message"),
    [
        ("report.target_top1", 84, "report.target_top1 is 84 but must be in (0, 1]"),
        ("report.recipes", ["baseline", "resnet"], "report.recipes is ['baseline', 'resnet']; name one or more of"),
        ("report.recipes", [], "report.recipes is []; name one or more of"),
        ("report.run_ids.thor", 3, "report.run_ids.thor must be null or a string, got 3"),
        ("report.run_ids.lars", "abc", "report.run_ids.lars is not a known parameter"),
    ],
)
def test_bad_report_parameters_are_named(key, value, message):
    params = load_params("local")
    with pytest.raises(ParameterError) as error:
        validate_parameters(changed(params, key, value), base_schema(CONF), parameter_sources(CONF, "local", None))
    assert message in str(error.value)


def test_pinned_run_id_is_a_valid_parameter():
    validate_parameters(changed(load_params("local"), "report.run_ids.thor", "3999108af481"), base_schema(CONF), {})
