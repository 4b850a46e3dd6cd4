"""The report pipeline as real kedro runs over the shared recipe store: its table equals the runs' logged
metrics, histories, plots logged to MLflow, pinned run ids; without runs it fails naming the cause."""

from __future__ import annotations

import math

import mlflow
import pandas as pd
import pytest
from PIL import Image

from pipelines.tracking.reader import MlflowRunReader
from tests.support.csv_files import CSV_REL
from tests.support.projects import kedro, make_project
from tests.support.stores import EXPERIMENT, recipe_runs, tracking_uri, trainings
from trainlib.metrics import EPOCH_KEYS
from trainlib.report.compare import compare
from trainlib.report.figures import figures

TARGET = 0.5


RECIPE_NAMES = ["baseline", "dim_reduce", "thor", "adasum"]


PLOTS = ("top1_vs_epoch", "top1_vs_time", "loss", "explained_variance")


def logged(client: mlflow.MlflowClient, run_id: str, metric: str) -> dict[int, float]:
    return {m.step: m.value for m in sorted(client.get_metric_history(run_id, metric), key=lambda m: m.timestamp)}


def reader(uri: str) -> MlflowRunReader:
    return MlflowRunReader(uri, EXPERIMENT)


def test_report_pipeline_without_runs_fails_naming_the_cause(tmp_path):
    project = make_project(tmp_path / "project", {})
    result = kedro(project, "run", "--pipelines=report", timeout=300)
    assert result.returncode != 0
    assert "no finished run of any recipe (baseline, dim_reduce, thor, adasum)" in result.stdout + result.stderr


def trained_run(project, pipeline: str):
    """The newest run of ``pipeline`` that trained (the partial reruns of the store did not)."""
    client = mlflow.MlflowClient(tracking_uri(project))
    for run in recipe_runs(project, pipeline):
        held = trainings(client, run) if pipeline == "dim_reduce" else {pipeline: run}
        expected = {"stage1", "stage2", "control"} if pipeline == "dim_reduce" else {pipeline}
        if set(held) == expected and all("train/loss" in child.data.metrics for child in held.values()):
            return run
    raise AssertionError(f"no trained {pipeline} run in the store")


def curve_runs(project, recipe: str) -> list:
    """The runs holding the recipe's curve, in training order: dim_reduce's stage1 and stage2 children."""
    run = trained_run(project, recipe)
    if recipe != "dim_reduce":
        return [run]
    children = trainings(mlflow.MlflowClient(tracking_uri(project)), run)
    return [children["stage1"], children["stage2"]]


def expected_row(project, recipe: str, target: float) -> dict:
    """The table row computed here from the runs' logged metrics, independently of the library."""
    client = mlflow.MlflowClient(tracking_uri(project))
    run = trained_run(project, recipe)
    total, epoch_count, weighted, reached = 0.0, 0, 0.0, (math.nan, math.nan)
    first_images = None
    for part in curve_runs(project, recipe):
        seconds, rates, top1 = (
            logged(client, part.info.run_id, key) for key in ("train/epoch_time_s", "train/images_per_s", "val/top1")
        )
        if top1 == {} or max(seconds) not in top1:  # evaluated only at the end: the final evaluation counts
            top1[max(seconds)] = logged(client, part.info.run_id, "final/top1")[0]
        for epoch in sorted(step for step in seconds if step >= 1):
            total += seconds[epoch]
            weighted += rates[epoch] * seconds[epoch]
            epoch_count += 1
            first_images = first_images or round(rates[epoch] * seconds[epoch])
            if math.isnan(reached[0]) and top1.get(epoch, -1) >= target:
                reached = (epoch_count, total)
    final_run = curve_runs(project, recipe)[-1]
    return {
        "run_id": run.info.run_id,
        "top1": logged(client, final_run.info.run_id, "final/top1")[0],
        "top5": logged(client, final_run.info.run_id, "final/top5")[0],
        "epochs": epoch_count,
        "train_time_s": total,
        "wall_time_s": (run.info.end_time - run.info.start_time) / 1000,
        "images_per_s": weighted / total,
        "epoch_to_target": reached[0],
        "time_to_target_s": reached[1],
        "epoch_images": first_images,  # full batches of the split: 24 images in batches of 4, all of them
        "train_images": int(run.data.tags["train_images"]),  # the split, as the run's tag says
        "image_size": int(run.data.params["data.image_size"]),
        "seed": int(run.data.params["runtime.seed"]),
    }


@pytest.fixture(scope="module")
def report_run(recipe_store):
    result = kedro(recipe_store, "run", "--pipelines=report", f"--params=target.top1={TARGET}")
    assert result.returncode == 0, result.stdout[-5000:] + result.stderr[-5000:]
    return recipe_store, result


def test_table_equals_the_runs_logged_metrics(report_run):
    project, result = report_run
    table = pd.read_csv(project / "data/08_reporting/report/comparison.csv").set_index("recipe")
    assert list(table.index) == [*RECIPE_NAMES[:2], "dim_reduce/control", *RECIPE_NAMES[2:]]
    client = mlflow.MlflowClient(tracking_uri(project))
    control = trainings(client, trained_run(project, "dim_reduce"))["control"]
    assert table.loc["dim_reduce/control", "run_id"] == control.info.run_id
    assert table.loc["dim_reduce/control", "top1"] == pytest.approx(
        logged(client, control.info.run_id, "final/top1")[0], rel=CSV_REL
    )
    for recipe in RECIPE_NAMES:
        expected = expected_row(project, recipe, TARGET)
        assert (table.loc[recipe, "run_id"], table.loc[recipe, "run_status"]) == (expected.pop("run_id"), "FINISHED")
        for column, value in expected.items():
            assert table.loc[recipe, column] == pytest.approx(value, rel=CSV_REL, nan_ok=True), (recipe, column)
        assert not table.loc[recipe, "resumed"] and table.loc[recipe, "env"] == "local"
        assert table.loc[recipe, "network"] == "resnet_narrow"
    # every recipe trained on the same data and model: nothing differs, nothing is warned about
    assert table["differs"].isna().all()
    output = result.stdout + result.stderr
    assert "differ in data or network" not in output
    # the final evaluation, as the evaluation node wrote it
    thor_eval = pd.read_json(project / "data/08_reporting/thor_eval.json", typ="series")
    assert table.loc["thor", "top1"] == pytest.approx(thor_eval["top1"], rel=CSV_REL)
    # the newest thor and dim_reduce runs only evaluated / only ran stage 2: named as skipped
    for pipeline in ("thor", "dim_reduce"):
        partial = recipe_runs(project, pipeline)[0]
        assert partial.info.run_id != trained_run(project, pipeline).info.run_id
        assert f"skipping {pipeline} run {partial.info.run_id}" in output


def test_differences_say_by_how_much_each_recipe_beats_the_baseline(report_run):
    """Each recipe's final accuracy minus the baseline's, stage 2's minus its control's, from the logged finals;
    the summary puts them in points with the budgets they trained."""
    project, result = report_run
    table = pd.read_csv(project / "data/08_reporting/report/comparison.csv").set_index("recipe")
    differences = pd.read_csv(project / "data/08_reporting/report/differences.csv")
    top1 = differences[differences["measure"] == "final_top1_difference"].set_index("comparison")
    for recipe in ("thor", "adasum"):
        expected = 100 * (table.loc[recipe, "top1"] - table.loc["baseline", "top1"])
        assert top1.loc[f"{recipe} vs baseline", "mean"] == pytest.approx(expected, abs=0.005), recipe
    client = mlflow.MlflowClient(tracking_uri(project))
    children = trainings(client, trained_run(project, "dim_reduce"))
    stage2, control = (logged(client, children[name].info.run_id, "final/top1")[0] for name in ("stage2", "control"))
    assert top1.loc["stage2 vs control", "mean"] == pytest.approx(100 * (stage2 - control), abs=0.005)
    assert set(top1["source"]) == {"single runs at equal budget"}  # the store has no study; 2 epochs each
    assert set(differences["unit"]) == {"pt"}  # points, rounded as printed
    assert all(value == round(value, 2) for value in differences["mean"])
    summary = (project / "data/08_reporting/report/summary.md").read_text()
    thor = top1.loc["thor vs baseline", "mean"]
    assert f"| thor vs baseline | final_top1_difference | {thor:+.2f} pt" in summary


def test_histories_hold_each_epoch(report_run):
    project, _ = report_run
    client = mlflow.MlflowClient(tracking_uri(project))
    histories = pd.read_csv(project / "data/08_reporting/report/histories.csv")
    assert set(EPOCH_KEYS) <= set(histories.columns)
    for recipe in ("baseline", "thor", "adasum"):
        rows = histories[histories["recipe"] == recipe]
        run_id = trained_run(project, recipe).info.run_id
        assert list(rows["epoch"]) == [1, 2] and set(rows["run_id"]) == {run_id}
        for key in ("train/loss", "train/lr", "train/images_per_s"):
            values = logged(client, run_id, key)
            assert list(rows[key]) == pytest.approx([values[1], values[2]], rel=CSV_REL), (recipe, key)
        times = logged(client, run_id, "train/epoch_time_s")
        assert list(rows["train_time_s"]) == pytest.approx([times[1], times[1] + times[2]], rel=CSV_REL)
    # dim_reduce: stage 1's epochs, then stage 2's and the control's after them, each from its child run
    rows = histories[histories["recipe"] == "dim_reduce"]
    children = trainings(client, trained_run(project, "dim_reduce"))
    stage1_epochs = len(logged(client, children["stage1"].info.run_id, "train/loss"))
    for training in ("stage1", "stage2", "control"):
        part = rows[rows["training"] == training]
        loss = logged(client, children[training].info.run_id, "train/loss")
        assert list(part["train/loss"]) == pytest.approx([loss[step] for step in sorted(loss)], rel=CSV_REL), training
        first = 1 if training == "stage1" else stage1_epochs + 1
        assert list(part["epoch"]) == list(range(first, first + len(loss))), training


def test_plots_are_written_and_logged_to_mlflow(report_run):
    project, _ = report_run
    for name in PLOTS:
        folder = "explained_variance/" if name == "explained_variance" else ""  # written only with a dim_reduce run
        with Image.open(project / f"data/08_reporting/report/{folder}{name}.png") as image:
            assert image.format == "PNG" and image.width > 400
    client = mlflow.MlflowClient(tracking_uri(project))
    run = recipe_runs(project, "report")[0]
    assert run.info.status == "FINISHED"
    artifacts = {a.path for a in client.list_artifacts(run.info.run_id, "report")}
    assert {f"report/{name}.png" for name in PLOTS} | {"report/comparison.csv", "report/histories.csv"} <= artifacts


def test_figures_have_labelled_axes_and_one_line_per_recipe(recipe_store):
    comparison = compare(reader(tracking_uri(recipe_store)), RECIPE_NAMES, TARGET)
    drawn = figures(comparison.histories, comparison.explained_variance, TARGET)
    assert set(drawn) == set(PLOTS)
    expected_x = {"top1_vs_epoch": "epoch", "top1_vs_time": "train_time_s", "loss": "epoch"}
    expected_y = {"top1_vs_epoch": "val/top1", "top1_vs_time": "val/top1", "loss": "train/loss"}
    labels = [*RECIPE_NAMES[:2], "dim_reduce control", *RECIPE_NAMES[2:]]
    for name, x in expected_x.items():
        axes = drawn[name].axes[0]
        assert axes.get_xlabel() and axes.get_ylabel() and axes.get_title(), name
        lines = [line for line in axes.get_lines() if not line.get_label().startswith("_")]
        assert [line.get_label() for line in lines] == labels, name
        assert [text.get_text() for text in axes.get_legend().get_texts()] == labels, name
        for line in lines:
            rows = comparison.histories[comparison.histories["recipe"] == line.get_label()]
            rows = rows[rows[expected_y[name]].notna()]
            if line.get_label() in RECIPE_NAMES and line.get_label() != "dim_reduce":
                assert list(line.get_xdata()) == pytest.approx(list(rows[x])), (name, line.get_label())
    assert drawn["top1_vs_epoch"].axes[0].get_xlabel() == "epoch"
    assert "top-1" in drawn["top1_vs_epoch"].axes[0].get_ylabel()
    assert "loss" in drawn["loss"].axes[0].get_ylabel()
    top1 = comparison.histories.loc[comparison.histories["recipe"] == "thor", "val/top1"]
    thor_line = next(line for line in drawn["top1_vs_epoch"].axes[0].get_lines() if line.get_label() == "thor")
    assert list(thor_line.get_ydata()) == pytest.approx(list(100 * top1.dropna()))  # percent
    # dim_reduce's PCA from its run's artifact
    variance_axes = drawn["explained_variance"].axes[0]
    assert len(variance_axes.patches) == len(comparison.explained_variance) > 0


def test_pinned_run_ids(recipe_store):
    uri = tracking_uri(recipe_store)
    baseline, thor = trained_run(recipe_store, "baseline"), trained_run(recipe_store, "thor")
    pinned = compare(reader(uri), ["thor"], TARGET, {"thor": thor.info.run_id})
    assert pinned.table["run_id"].tolist() == [thor.info.run_id]
    partial = recipe_runs(recipe_store, "thor")[0]
    assert partial.info.run_id != thor.info.run_id
    with pytest.raises(ValueError, match=r"report.run_ids.thor: run \w+ lacks the metrics \['train/loss'\]"):
        compare(reader(uri), ["thor"], TARGET, {"thor": partial.info.run_id})
    with pytest.raises(ValueError, match="report.run_ids.thor: run .* is tagged pipeline='baseline', not thor"):
        compare(reader(uri), ["thor"], TARGET, {"thor": baseline.info.run_id})
    with pytest.raises(ValueError, match="report.run_ids.thor: no MLflow run 'nosuchrun'"):
        compare(reader(uri), ["thor"], TARGET, {"thor": "nosuchrun"})
