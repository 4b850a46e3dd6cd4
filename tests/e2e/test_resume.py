"""Fault injection: a training run killed with SIGKILL mid-epoch resumes from its last checkpoint, and the
resumed run's MLflow series and history table hold every epoch from 1, the killed part included. Checkpoint
housekeeping: finished trainings leave no periodic checkpoints, and a ``--nodes`` rerun of a finished stage
moves nothing aside."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

from pipelines.dim_reduce.pipeline import create_pipeline
from tests.support.csv_files import CSV_REL
from tests.support.processes import kill_kedro_in_epoch
from tests.support.projects import (
    DIM_REDUCE_PARAMS,
    RESUMABLE_EPOCHS,
    TINY_PARAMS,
    kedro,
    make_project,
    resumable_params,
    runs,
)
from tests.support.trees import write_image_tree
from trainlib.engine.checkpoint import load_checkpoint

CHECKPOINTS = "data/06_models/baseline/epochs"


@pytest.fixture(scope="module")
def tree(tmp_path_factory):
    root = tmp_path_factory.mktemp("resume")
    return write_image_tree(root / "tree", classes=("a", "b", "c"), per_class={"train": 40, "val": 4}, size=16)


def test_killed_run_resumes_and_matches_an_uninterrupted_one(tmp_path, tree):
    killed = make_project(tmp_path / "killed", resumable_params(tree))
    kill_kedro_in_epoch(killed, "baseline", 3, RESUMABLE_EPOCHS)
    assert not (killed / "data/06_models/baseline/final.ckpt").exists()
    # a kill during a save may leave a temporary (ours or MindSpore's): never a checkpoint, and the rerun removes it
    saved = sorted(p.name for p in (killed / CHECKPOINTS).glob("epoch_*.ckpt"))

    rerun = kedro(killed, "run", "--pipelines=baseline")
    assert rerun.returncode == 0, rerun.stdout[-3000:] + rerun.stderr[-3000:]
    assert (
        list((killed / CHECKPOINTS).iterdir()) == []
    )  # the epoch checkpoints went with the final one, temporaries too
    output = rerun.stdout + rerun.stderr
    resumed_epoch = int(saved[-1][len("epoch_") : -len(".ckpt")])
    assert f"Resuming from {killed / CHECKPOINTS / saved[-1]}" in output.replace("\n", "") or "Resuming from" in output
    assert f"(epoch {resumed_epoch} of {RESUMABLE_EPOCHS})" in output
    assert f"epoch {resumed_epoch + 1}/{RESUMABLE_EPOCHS} step" in output and "epoch 1/6 step" not in output

    straight = make_project(tmp_path / "straight", resumable_params(tree))
    result = kedro(straight, "run", "--pipelines=baseline")
    assert result.returncode == 0, result.stderr[-3000:]
    resumed = load_checkpoint(killed / "data/06_models/baseline/final.ckpt").network_params()
    reference = load_checkpoint(straight / "data/06_models/baseline/final.ckpt").network_params()
    assert resumed.keys() == reference.keys()
    for name, value in reference.items():
        np.testing.assert_allclose(resumed[name], value, rtol=1e-3, atol=1e-4, err_msg=name)

    client, found = runs(killed)
    statuses = sorted(r.info.status for r in found)
    assert statuses == ["FINISHED", "KILLED"]  # the killed attempt no longer shows RUNNING
    finished = next(r for r in found if r.info.status == "FINISHED")
    first = next(r for r in found if r.info.status == "KILLED")
    assert finished.data.tags["resumed_from"].endswith(saved[-1])

    # the resumed run holds every epoch from 1: the killed attempt's epochs are logged again from the
    # checkpoint's history, with their values and wall-clock times, then the epochs trained after the resume
    def series(run, key: str) -> dict[int, tuple[float, int]]:
        return {m.step: (m.value, m.timestamp) for m in client.get_metric_history(run.info.run_id, key)}

    epochs = list(range(1, RESUMABLE_EPOCHS + 1))
    for key in ("val/top1", "train/loss", "train/epoch_time_s", "train/lr"):
        resumed_series, killed_series = series(finished, key), series(first, key)
        assert sorted(resumed_series) == epochs, key
        assert set(range(1, resumed_epoch + 1)) <= set(killed_series), key
        for epoch in range(1, resumed_epoch + 1):
            assert resumed_series[epoch] == killed_series[epoch], (key, epoch)
    times = series(finished, "train/epoch_time_s")
    assert [times[e][1] for e in epochs] == sorted(times[e][1] for e in epochs)  # logged at the epochs' own time
    history = pd.read_csv(killed / "data/08_reporting/baseline_history.csv")
    assert list(history["epoch"]) == epochs
    values = [series(finished, "val/top1")[e][0] for e in epochs]
    np.testing.assert_allclose(history["val/top1"], values, rtol=CSV_REL)  # the CSV file's six digits
    # training time (what the report sums) covers the killed and the resumed parts
    killed_time = sum(series(first, "train/epoch_time_s")[e][0] for e in range(1, resumed_epoch + 1))
    assert history["train/epoch_time_s"].sum() == pytest.approx(sum(times[e][0] for e in epochs), rel=CSV_REL)
    assert history["train/epoch_time_s"][:resumed_epoch].sum() == pytest.approx(killed_time, rel=CSV_REL)
    assert (history["train/epoch_time_s"] > 0).all()


def training_node(pipeline, function: str) -> str:
    """The name the pipeline gives the node of ``function`` (node names carry the pipeline's namespaces)."""
    (name,) = [n.name for n in pipeline.nodes if n.func.__name__ == function]
    return name


def test_finished_trainings_leave_no_epoch_checkpoints_and_a_nodes_rerun_moves_nothing_aside(tmp_path):
    tree = write_image_tree(tmp_path / "tree", classes=("cat", "dog", "fox"), per_class={"train": 4, "val": 2})
    params = {**TINY_PARAMS, **DIM_REDUCE_PARAMS, "data": {**TINY_PARAMS["data"], "root": str(tree)}}
    project = make_project(tmp_path / "project", params)
    full = kedro(project, "run", "--pipelines=dim_reduce")
    assert full.returncode == 0, full.stdout[-3000:] + full.stderr[-3000:]
    models = project / "data/06_models/dim_reduce"
    for training in ("stage1", "stage2", "control"):
        assert load_checkpoint(models / f"{training}.ckpt").metadata["checkpoint_dir"].endswith(f"{training}_epochs")
        assert not list((models / f"{training}_epochs").iterdir()), training  # no epoch_*.ckpt, no stale-*
    output = full.stdout + full.stderr
    assert "removed its periodic checkpoints from data/06_models/dim_reduce/stage2_epochs (1 files)" in output
    # one start line per training with its true lr, one compile line per compiled graph: stage 1, the control
    # and stage 2 each compile a training graph and, after their last epoch, an evaluation graph; so do the
    # three evaluation nodes
    assert "Momentum: epochs 1-2 of a 3-epoch schedule, 3 steps/epoch, batch 4 per rank, lr 0.05 at" in output
    assert "Momentum: epochs 3-3 of a 3-epoch schedule" in output
    assert "P-BFGS: epochs 3-3 of a 3-epoch schedule, 3 steps/epoch, batch 4 per rank, lr: the step size" in output
    assert output.count("Compiling the training graph…") == 2  # stage 1 and the control
    assert output.count("Compiling the training graph (P-BFGS: gradient, line search, update)…") == 1
    assert output.count("Compiling the evaluation graph…") == 6

    # docs/pipelines.md's rerun of the finished stage 2 with another alpha: nothing of the finished run is "stale"
    before = load_checkpoint(models / "stage2.ckpt").metadata["fingerprint"]
    stage2 = training_node(create_pipeline(), "train_stage2")
    alpha = "--params=dim_reduce.stage2.alpha=0.01"
    rerun = kedro(project, "run", "--pipelines=dim_reduce", f"--nodes={stage2}", alpha)
    assert rerun.returncode == 0, rerun.stdout[-3000:] + rerun.stderr[-3000:]
    output = rerun.stdout + rerun.stderr
    assert "another configuration" not in output and "Resuming" not in output
    assert not list(models.glob("*_epochs/stale-*"))
    assert not list((models / "stage2_epochs").iterdir())
    assert load_checkpoint(models / "stage2.ckpt").metadata["fingerprint"] != before  # trained anew with alpha 0.01
