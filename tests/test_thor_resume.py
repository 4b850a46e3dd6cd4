"""THOR resume: the full THOR state round-trips, and a ``kedro run --pipelines=thor`` killed with SIGKILL mid-epoch
continues from its last epoch checkpoint and ends where an uninterrupted run ends."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest
from helpers import kill_kedro_mid_epoch, write_image_tree
from test_pipeline_e2e import TINY_PARAMS, kedro, make_project, runs
from test_thor import TinyNet, batch, make_thor, run

from pipelines.engine.checkpoint import OPTIMIZER_PREFIX, load_checkpoint

EPOCHS = 4
CHECKPOINTS = "data/06_models/thor/epochs"
FINAL = "data/06_models/thor/final.ckpt"


def test_state_holds_statistics_inverses_momenta_and_the_step():
    net = TinyNet()
    thor = make_thor(net, frequency=2)
    for step in range(3):
        run(thor, *batch(step))
    state = thor.state()
    for layer in ("conv.weight", "fc.weight"):
        a, g = thor.statistics()[layer]
        np.testing.assert_array_equal(state[f"thor.thor_stats.{layer}.A"], a)
        np.testing.assert_array_equal(state[f"thor.thor_stats.{layer}.G"], g)
        assert f"thor.thor_a_inv.{layer}" in state and f"thor.thor_g_inv.{layer}" in state
    assert {"thor.thor_momentum.conv.weight", "thor.thor_momentum.fc.bias"} <= set(state)
    assert int(state["thor.steps"]) == 3 and int(state["thor.second_order_steps"]) == 2

    other = make_thor(TinyNet(seed=5), frequency=2)
    other.load_state(state)
    assert other.steps == 3 and other.second_order_steps == 2 and other.reuse_steps == 1
    for layer, (a, g) in thor.statistics().items():
        np.testing.assert_array_equal(other.statistics()[layer][0], a)
        np.testing.assert_array_equal(other.statistics()[layer][1], g)
    del state["thor.thor_stats.fc.weight.G"]
    with pytest.raises(ValueError, match=r"THOR state lacks \['thor.thor_stats.fc.weight.G'\]"):
        other.load_state(state)


def resume_params(tree) -> dict:
    return {
        **TINY_PARAMS,
        "data": {**TINY_PARAMS["data"], "root": str(tree)},
        "thor": {
            "epochs": EPOCHS,
            "batch_size": 4,
            "frequency": 4,  # 9 steps per epoch: second-order steps fall at different places in each epoch
            "eval_interval": 0,
            "checkpoint": {"every_epochs": 1, "keep_last": 2},
        },
    }


@pytest.fixture(scope="module")
def tree(tmp_path_factory):
    root = tmp_path_factory.mktemp("thor_resume")
    return write_image_tree(root / "tree", classes=("a", "b", "c"), per_class={"train": 12, "val": 3}, size=16)


def test_killed_thor_run_resumes_and_matches_an_uninterrupted_one(tmp_path, tree):
    killed = make_project(tmp_path / "killed", resume_params(tree))
    kill_kedro_mid_epoch(killed, "thor", killed / CHECKPOINTS / "epoch_0002.ckpt", into_next_epoch_s=0.2)
    assert not (killed / FINAL).exists()
    saved = sorted(p.name for p in (killed / CHECKPOINTS).iterdir())
    assert saved and all(not name.startswith(".") for name in saved), saved
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
    assert list(history["second_order_steps"]) == list(straight_history["second_order_steps"])
    np.testing.assert_allclose(history["loss"], straight_history["loss"], rtol=1e-3)

    _, found = runs(killed)
    assert sorted(r.info.status for r in found) == ["FINISHED", "KILLED"]
    finished = next(r for r in found if r.info.status == "FINISHED")
    assert finished.data.tags["thor_resumed_from"].endswith(f"{CHECKPOINTS}/{saved[-1]}")
