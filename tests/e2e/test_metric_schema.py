"""One metric schema for every recipe: baseline, thor and dim_reduce log the same per-epoch keys at steps
1..E (so the MLflow UI overlays their runs) and the final evaluation under ``final/…``, read back from the
shared recipe store that real ``kedro run``s filled (``tests.support.stores``)."""

from __future__ import annotations

from pathlib import Path

import mlflow
import pandas as pd

from tests.support.projects import DIM_REDUCE_PARAMS, TINY_PARAMS
from tests.support.stores import complete_run, tracking_uri
from trainlib.metrics import TRAINING_KEYS

EPOCHS = TINY_PARAMS["baseline"]["epochs"]


def schema_run(store: Path, pipeline: str):
    """The MLflow client of the shared recipe store and its complete run of ``pipeline``."""
    return mlflow.MlflowClient(tracking_uri(store)), complete_run(store, pipeline)


def steps(client, run, key: str) -> list[int]:
    return sorted(m.step for m in client.get_metric_history(run.info.run_id, key))


def assert_schema(client, run, epochs: list[int]) -> None:
    """Per-epoch keys at every epoch, val/top1 and val/top5 at the last, final/ keys logged once."""
    for key in TRAINING_KEYS:
        assert steps(client, run, key) == epochs, key
    for key in ("val/top1", "val/top5"):
        assert epochs[-1] in steps(client, run, key), key
        assert set(steps(client, run, key)) <= set(epochs), key
    for key in ("final/top1", "final/top5"):
        assert len(client.get_metric_history(run.info.run_id, key)) == 1, key
        assert 0.0 <= run.data.metrics[key] <= 1.0
    # nothing of the former per-recipe names ("loss", "thor_top1", "stage1_loss") remains
    assert all("/" in key for key in run.data.metrics), sorted(run.data.metrics)


def assert_compiled_in_the_first_epoch_only(history: pd.DataFrame) -> None:
    """The steps that compiled a graph are timed apart (``train/compile_s``): all in epoch 1, none later."""
    compile_s = history["train/compile_s"]
    assert compile_s.iloc[0] > 0 and (compile_s.iloc[1:] == 0).all()
    assert (history["train/epoch_time_s"] > 0).all()


def test_baseline_logs_the_schema(recipe_store):
    project = recipe_store
    client, run = schema_run(project, "baseline")
    assert_schema(client, run, list(range(1, EPOCHS + 1)))
    assert steps(client, run, "val/top1") == list(range(1, EPOCHS + 1))  # eval_interval 1
    history = pd.read_csv(project / "data/08_reporting/baseline_history.csv")
    assert list(history.columns) == ["epoch", *TRAINING_KEYS, "val/top1", "val/top5"]
    assert_compiled_in_the_first_epoch_only(history)


def test_thor_logs_the_same_schema_with_its_own_figures_under_thor(recipe_store):
    project = recipe_store
    client, run = schema_run(project, "thor")
    assert_schema(client, run, list(range(1, EPOCHS + 1)))
    assert steps(client, run, "val/top1") == list(range(1, EPOCHS + 1))
    assert steps(client, run, "thor/damping") == list(range(1, EPOCHS + 1))
    history = pd.read_csv(project / "data/08_reporting/thor_history.csv")
    assert list(history.columns[: len(TRAINING_KEYS) + 3]) == ["epoch", *TRAINING_KEYS, "val/top1", "val/top5"]
    assert all(c.startswith("thor/") for c in history.columns[len(TRAINING_KEYS) + 3 :])
    assert_compiled_in_the_first_epoch_only(history)  # its second-order and reuse graphs: steps 1 and 2


def test_the_baseline_and_thor_runs_overlay_on_the_same_keys(recipe_store):
    runs = {pipeline: complete_run(recipe_store, pipeline) for pipeline in ("baseline", "thor")}
    for key in ("val/top1", "train/loss", "final/top1"):
        assert all(key in run.data.metrics for run in runs.values()), key


def test_dim_reduce_logs_each_training_into_its_own_child_run(recipe_store):
    client, run = schema_run(recipe_store, "dim_reduce")
    children = client.search_runs(
        [run.info.experiment_id], f"tags.mlflow.parentRunId = '{run.info.run_id}'", order_by=["attributes.start_time"]
    )
    assert sorted(c.data.tags["training"] for c in children) == ["control", "stage1", "stage2"]
    stage1_epochs = DIM_REDUCE_PARAMS["dim_reduce"]["stage1"]["epochs"]
    for child in children:
        name = child.data.tags["training"]
        assert child.info.run_name == f"dim_reduce/{name}" and child.info.status == "FINISHED"
        assert steps(client, child, "val/top1"), f"{name} logged no val/top1"
        assert steps(client, child, "train/loss"), f"{name} logged no train/loss"
        for key in ("final/top1", "final/top5"):
            assert len(client.get_metric_history(child.info.run_id, key)) == 1, (name, key)
        if name == "stage1":
            assert steps(client, child, "train/loss") == list(range(1, stage1_epochs + 1))
        else:  # stage 2 and the control continue from the stage-1 checkpoint's epoch
            assert steps(client, child, "train/loss")[0] == stage1_epochs + 1, name
