"""THOR resume: the full THOR state round-trips, and a ``kedro run --pipelines=thor`` killed with SIGKILL mid-epoch
continues from its last epoch checkpoint, ends where an uninterrupted run ends, and its history (table and MLflow
series) holds every epoch from 1."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

from tests.support.csv_files import CSV_REL
from tests.support.processes import kill_kedro_in_epoch
from tests.support.projects import TINY_PARAMS, kedro, make_project, runs
from tests.support.trees import write_image_tree
from trainlib.engine.checkpoint import OPTIMIZER_PREFIX, load_checkpoint
from trainlib.recipes.thor import THOR_SECOND_ORDER_STEPS

EPOCHS = 4
CHECKPOINTS = "data/06_models/thor/epochs"
FINAL = "data/06_models/thor/final.ckpt"


def resume_params(tree) -> dict:
    return {
        **TINY_PARAMS,
        "data": {**TINY_PARAMS["data"], "root": str(tree)},
        "thor": {
            "epochs": EPOCHS,
            "batch_size": 4,
            "frequency": 4,  # 9 steps per epoch: second-order steps fall at different places in each epoch
            "eval_interval": 1,  # val/top1 every epoch: its MLflow series must hold every epoch too
            "checkpoint": {"every_epochs": 1, "keep_last": 2},
        },
    }


@pytest.fixture(scope="module")
def tree(tmp_path_factory):
    root = tmp_path_factory.mktemp("thor_resume")
    return write_image_tree(root / "tree", classes=("a", "b", "c"), per_class={"train": 12, "val": 3}, size=16)


def test_killed_thor_run_resumes_and_matches_an_uninterrupted_one(tmp_path, tree):
    killed = make_project(tmp_path / "killed", resume_params(tree))
    kill_kedro_in_epoch(killed, "thor", 3, EPOCHS)
    assert not (killed / FINAL).exists()
    saved = sorted(p.name for p in (killed / CHECKPOINTS).glob("epoch_*.ckpt"))
    assert saved, "no epoch checkpoint before the kill"
    resumed_epoch = int(saved[-1][len("epoch_") : -len(".ckpt")])
    assert 2 <= resumed_epoch < EPOCHS

    rerun = kedro(killed, "run", "--pipelines=thor")
    assert rerun.returncode == 0, rerun.stdout[-3000:] + rerun.stderr[-3000:]
    output = (rerun.stdout + rerun.stderr).replace("\n", " ")
    assert "Resuming from" in output and f"(epoch {resumed_epoch} of {EPOCHS})" in output
    assert f"epochs {resumed_epoch + 1}-{EPOCHS}" in output
    assert f"epoch {resumed_epoch + 1}/{EPOCHS} step" in output and f"epoch 1/{EPOCHS} step" not in output

    straight = make_project(tmp_path / "straight", resume_params(tree))
    result = kedro(straight, "run", "--pipelines=thor")
    assert result.returncode == 0, result.stderr[-3000:]
    resumed, reference = load_checkpoint(killed / FINAL), load_checkpoint(straight / FINAL)
    assert resumed.params.keys() == reference.params.keys()
    # weights and BatchNorm statistics, and the optimizer: momenta, A/G, inverses, counters
    for name, value in reference.params.items():
        np.testing.assert_allclose(resumed.params[name], value, rtol=1e-3, atol=1e-4, err_msg=name)
    steps = reference.params[OPTIMIZER_PREFIX + "thor.steps"]
    assert int(steps) == EPOCHS * 9 and int(resumed.params[OPTIMIZER_PREFIX + "thor.steps"]) == int(steps)

    # the history covers every epoch, the ones before the interruption from the checkpoint
    history = pd.read_csv(killed / "data/08_reporting/thor_history.csv")
    straight_history = pd.read_csv(straight / "data/08_reporting/thor_history.csv")
    assert list(history["epoch"]) == list(range(1, EPOCHS + 1))
    assert list(history[THOR_SECOND_ORDER_STEPS]) == list(straight_history[THOR_SECOND_ORDER_STEPS])
    np.testing.assert_allclose(history["train/loss"], straight_history["train/loss"], rtol=1e-3)
    np.testing.assert_allclose(history["val/top1"], straight_history["val/top1"], atol=1e-6)

    client, found = runs(killed)
    assert sorted(r.info.status for r in found) == ["FINISHED", "KILLED"]
    finished = next(r for r in found if r.info.status == "FINISHED")
    assert finished.data.tags["resumed_from"].endswith(f"{CHECKPOINTS}/{saved[-1]}")
    # the resumed run's per-epoch series hold epochs 1..E, the earlier ones logged from the checkpoint's history
    # (compared at the CSV file's six significant digits)
    for key in ("train/loss", "val/top1", THOR_SECOND_ORDER_STEPS):
        series = sorted((m.step, m.value) for m in client.get_metric_history(finished.info.run_id, key))
        assert [epoch for epoch, _ in series] == list(range(1, EPOCHS + 1)), key
        np.testing.assert_allclose([value for _, value in series], history[key], rtol=CSV_REL, err_msg=key)
