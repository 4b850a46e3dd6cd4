"""Fault injection: a P-BFGS stage-2 training killed with SIGKILL mid-epoch resumes from its last
epoch checkpoint (weights, P-BFGS state, step table, history) and ends where an uninterrupted one ends,
with every epoch and step in its tables and in its MLflow child run."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import mlflow
import numpy as np
import pandas as pd

from tests.support.processes import Watched
from tests.support.stage2_job import EPOCHS, STAGE1_EPOCH, tracking_uri
from tests.support.trees import write_image_tree
from trainlib.engine.checkpoint import load_checkpoint

JOB = [sys.executable, str(Path(__file__).parents[1] / "support" / "stage2_job.py")]
STOP = STAGE1_EPOCH + EPOCHS


def run_job(work: Path, tree: Path, implementation: str = "trainlib") -> subprocess.CompletedProcess:
    return subprocess.run(
        [*JOB, str(work), str(tree), implementation], capture_output=True, text=True, timeout=600, check=False
    )


def kill_after_first_epoch(work: Path, tree: Path, implementation: str) -> Path:
    """Start the job, SIGKILL it (whole process group) mid-epoch after its first epoch checkpoint; the newest
    checkpoint left."""
    job = Watched([*JOB, str(work), str(tree), implementation])
    job.wait_for(f"epoch {STAGE1_EPOCH + 2}/{STOP} step")  # stage 2's second epoch: its first is checkpointed
    job.kill_group()
    assert not (work / "stage2.ckpt").exists()
    saved = sorted(p.name for p in (work / "epochs").glob("epoch_*.ckpt"))
    resumed_epoch = int(saved[-1][len("epoch_") : -len(".ckpt")])
    assert STAGE1_EPOCH < resumed_epoch < STOP
    return work / "epochs" / saved[-1]


def stage2_child_run(work: Path):
    """The newest MLflow child run ``stage2`` of the job's store, and its client."""
    client = mlflow.MlflowClient(tracking_uri=tracking_uri(work))
    children = client.search_runs(["0"], "tags.training = 'stage2'", order_by=["attributes.start_time DESC"])
    return client, children[0]


def assert_every_epoch_logged(work: Path, resumed_from: Path, keys: tuple[str, ...]) -> None:
    """The rerun's child run holds ``keys`` at every epoch, the ones before the kill included."""
    client, child = stage2_child_run(work)
    assert child.info.status == "FINISHED" and child.data.tags["resumed_from"] == str(resumed_from)
    history = pd.read_csv(work / "stage2_history.csv")
    for key in keys:
        logged = sorted(client.get_metric_history(child.info.run_id, key), key=lambda m: m.step)
        assert [m.step for m in logged] == list(range(STAGE1_EPOCH + 1, STOP + 1)), key
        # MLflow holds each value to seven significant digits (tracking.writer.METRIC_DIGITS)
        np.testing.assert_allclose([m.value for m in logged], history[key], rtol=1e-6, err_msg=key)
    assert [m.step for m in client.get_metric_history(child.info.run_id, "val/top1")] == [STOP]


def test_killed_stage2_resumes_and_matches_an_uninterrupted_one(tmp_path):
    tree = write_image_tree(tmp_path / "tree", classes=("a", "b", "c"), per_class={"train": 40, "val": 2}, size=16)
    killed = tmp_path / "killed"
    resumed_from = kill_after_first_epoch(killed, tree, "trainlib")
    resumed_epoch = int(resumed_from.stem.removeprefix("epoch_"))
    state_keys = {k for k in load_checkpoint(resumed_from).params if k.startswith("optimizer.pbfgs.")}
    assert {"optimizer.pbfgs.inverse_hessian", "optimizer.pbfgs.last_step", "optimizer.pbfgs.last_gk"} <= state_keys

    rerun = run_job(killed, tree)
    assert rerun.returncode == 0, rerun.stderr[-3000:]
    assert f"Resuming from {resumed_from} (epoch {resumed_epoch} of {STOP})" in rerun.stderr
    straight = run_job(tmp_path / "straight", tree)
    assert straight.returncode == 0, straight.stderr[-3000:]
    assert "Resuming from" not in straight.stderr

    resumed = load_checkpoint(killed / "stage2.ckpt")
    reference = load_checkpoint(tmp_path / "straight" / "stage2.ckpt")
    assert resumed.params.keys() == reference.params.keys()
    for name, value in reference.params.items():
        np.testing.assert_allclose(resumed.params[name], value, rtol=1e-3, atol=1e-4, err_msg=name)
    steps = pd.read_csv(killed / "stage2_steps.csv")
    reference_steps = pd.read_csv(tmp_path / "straight" / "stage2_steps.csv")
    epochs = list(range(STAGE1_EPOCH + 1, STOP + 1))
    assert list(steps["epoch"].unique()) == epochs  # the steps before the kill too
    pd.testing.assert_frame_equal(steps, reference_steps, rtol=1e-3)
    history = pd.read_csv(killed / "stage2_history.csv")
    assert list(history["epoch"]) == epochs  # the epochs before the kill too
    reference_history = pd.read_csv(tmp_path / "straight" / "stage2_history.csv")
    same = ["train/loss", "train/lr", "pbfgs/accepted_fraction", "pbfgs/mean_step_size", "pbfgs/mean_trials"]
    pd.testing.assert_frame_equal(history[same], reference_history[same], rtol=1e-3)
    assert (history["train/lr"] == steps.groupby("epoch")["step_size"].last().to_numpy()).all()

    # the rerun's MLflow child run "stage2" holds every epoch and step, the ones before the kill included
    assert_every_epoch_logged(
        killed, resumed_from, ("train/loss", "train/lr", "train/images_per_s", "pbfgs/mean_trials")
    )
    client, child = stage2_child_run(killed)
    step_sizes = client.get_metric_history(child.info.run_id, "pbfgs/step_size")
    assert sorted(m.step for m in step_sizes) == list(steps["step"])


def test_killed_builtin_stage2_resumes_with_its_state(tmp_path):
    tree = write_image_tree(tmp_path / "tree", classes=("a", "b", "c"), per_class={"train": 40, "val": 2}, size=16)
    killed = tmp_path / "killed"
    resumed_from = kill_after_first_epoch(killed, tree, "mindspore_builtin")
    resumed_epoch = int(resumed_from.stem.removeprefix("epoch_"))
    saved = load_checkpoint(resumed_from)
    assert {"optimizer.boost.bk", "optimizer.boost.sk", "optimizer.boost.gk_last"} <= set(saved.params)
    assert not np.array_equal(saved.params["optimizer.boost.bk"], np.eye(len(saved.params["optimizer.boost.bk"])))

    rerun = run_job(killed, tree, "mindspore_builtin")
    assert rerun.returncode == 0, rerun.stderr[-3000:]
    assert f"Resuming from {resumed_from} (epoch {resumed_epoch} of {STOP})" in rerun.stderr
    assert "Restored mindspore.boost's DimReduce state" in rerun.stderr
    steps = pd.read_csv(killed / "stage2_steps.csv")
    assert list(steps.columns) == ["epoch", "step", "loss"]
    steps_per_epoch = len(steps) // EPOCHS
    first = STAGE1_EPOCH * steps_per_epoch + 1
    assert list(steps["step"]) == list(range(first, first + len(steps)))  # the steps before the kill too
    history = pd.read_csv(killed / "stage2_history.csv")
    assert list(history["epoch"]) == list(range(STAGE1_EPOCH + 1, STOP + 1))
    np.testing.assert_allclose(history["train/loss"], steps.groupby("epoch")["loss"].mean(), rtol=1e-6)
    assert_every_epoch_logged(killed, resumed_from, ("train/loss", "train/images_per_s", "train/epoch_time_s"))
