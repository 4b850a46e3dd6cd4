"""Fault injection: a P-BFGS stage-2 training killed with SIGKILL mid-epoch resumes from its last
epoch checkpoint (weights, P-BFGS state, step table) and ends where an uninterrupted one ends."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pandas as pd
from helpers import write_image_tree
from stage2_job import EPOCHS, STAGE1_EPOCH

from pipelines.engine.checkpoint import load_checkpoint

JOB = [sys.executable, str(Path(__file__).with_name("stage2_job.py"))]


def run_job(work: Path, tree: Path) -> subprocess.CompletedProcess:
    return subprocess.run([*JOB, str(work), str(tree)], capture_output=True, text=True, timeout=600, check=False)


def test_killed_stage2_resumes_and_matches_an_uninterrupted_one(tmp_path):
    tree = write_image_tree(tmp_path / "tree", classes=("a", "b", "c"), per_class={"train": 40, "val": 2}, size=16)
    killed = tmp_path / "killed"
    first_checkpoint = killed / "epochs" / f"epoch_{STAGE1_EPOCH + 1:04d}.ckpt"
    process = subprocess.Popen(
        [*JOB, str(killed), str(tree)], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True
    )
    deadline = time.time() + 300
    while not first_checkpoint.exists():
        assert process.poll() is None, "stage 2 ended before it could be interrupted"
        assert time.time() < deadline, "no stage-2 epoch checkpoint within 5 minutes"
        time.sleep(0.05)
    time.sleep(0.3)  # into the next epoch
    assert process.poll() is None, "stage 2 ended before it could be interrupted"
    os.killpg(process.pid, signal.SIGKILL)
    process.wait()
    assert not (killed / "stage2.ckpt").exists()
    saved = sorted(p.name for p in (killed / "epochs").iterdir())
    assert all(not name.startswith(".") for name in saved), saved  # no half-written temporary file counts
    resumed_epoch = int(saved[-1][len("epoch_") : -len(".ckpt")])
    stop = STAGE1_EPOCH + EPOCHS
    assert STAGE1_EPOCH < resumed_epoch < stop
    state_keys = {k for k in load_checkpoint(killed / "epochs" / saved[-1]).params if k.startswith("optimizer.pbfgs.")}
    assert {"optimizer.pbfgs.inverse_hessian", "optimizer.pbfgs.last_step", "optimizer.pbfgs.last_gk"} <= state_keys

    rerun = run_job(killed, tree)
    assert rerun.returncode == 0, rerun.stderr[-3000:]
    assert f"Resuming from {killed / 'epochs' / saved[-1]} (epoch {resumed_epoch} of {stop})" in rerun.stderr
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
    assert list(steps["epoch"].unique()) == list(range(STAGE1_EPOCH + 1, stop + 1))  # the steps before the kill too
    pd.testing.assert_frame_equal(steps, reference_steps, rtol=1e-3)
