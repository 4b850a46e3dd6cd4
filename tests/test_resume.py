"""Fault injection: a training run killed with SIGKILL mid-epoch resumes from its last checkpoint, and the
resumed run's MLflow series and history table hold every epoch from 1, the killed part included."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest
from helpers import kill_kedro_mid_epoch, write_image_tree
from test_pipeline_e2e import TINY_PARAMS, kedro, make_project, runs

from pipelines.engine.checkpoint import load_checkpoint

EPOCHS = 6
CHECKPOINTS = "data/06_models/baseline/epochs"


def resume_params(tree) -> dict:
    return {
        **TINY_PARAMS,
        "data": {**TINY_PARAMS["data"], "root": str(tree)},
        "baseline": {
            **TINY_PARAMS["baseline"],
            "epochs": EPOCHS,
            "eval_interval": 1,
            "checkpoint": {"every_epochs": 1, "keep_last": 2},
        },
    }


@pytest.fixture(scope="module")
def tree(tmp_path_factory):
    root = tmp_path_factory.mktemp("resume")
    return write_image_tree(root / "tree", classes=("a", "b", "c"), per_class={"train": 40, "val": 4}, size=16)


def test_killed_run_resumes_and_matches_an_uninterrupted_one(tmp_path, tree):
    killed = make_project(tmp_path / "killed", resume_params(tree))
    kill_kedro_mid_epoch(killed, "baseline", killed / CHECKPOINTS / "epoch_0002.ckpt", into_next_epoch_s=0.3)
    assert not (killed / "data/06_models/baseline/final.ckpt").exists()
    saved = sorted(p.name for p in (killed / CHECKPOINTS).iterdir())
    assert all(not name.startswith(".") for name in saved), saved  # no half-written temporary file counts

    rerun = kedro(killed, "run", "--pipelines=baseline")
    assert rerun.returncode == 0, rerun.stdout[-3000:] + rerun.stderr[-3000:]
    output = rerun.stdout + rerun.stderr
    resumed_epoch = int(saved[-1][len("epoch_") : -len(".ckpt")])
    assert f"Resuming from {killed / CHECKPOINTS / saved[-1]}" in output.replace("\n", "") or "Resuming from" in output
    assert f"(epoch {resumed_epoch} of {EPOCHS})" in output
    assert f"epoch {resumed_epoch + 1}/{EPOCHS} step" in output and "epoch 1/6 step" not in output

    straight = make_project(tmp_path / "straight", resume_params(tree))
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

    epochs = list(range(1, EPOCHS + 1))
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
    np.testing.assert_allclose(history["val/top1"], [series(finished, "val/top1")[e][0] for e in epochs])
    # training time (what the report sums) covers the killed and the resumed parts
    killed_time = sum(series(first, "train/epoch_time_s")[e][0] for e in range(1, resumed_epoch + 1))
    assert history["train/epoch_time_s"].sum() == pytest.approx(sum(times[e][0] for e in epochs))
    assert history["train/epoch_time_s"][:resumed_epoch].sum() == pytest.approx(killed_time)
    assert (history["train/epoch_time_s"] > 0).all()
