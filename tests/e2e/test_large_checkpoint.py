"""A checkpoint past protobuf's 2 GB: a training of a 2.15 GB network (``tests/support/large_checkpoint_job.py``, the
engine's ``train`` with its periodic checkpoints) is killed with SIGKILL once its first epoch's checkpoint is on
disk, and a rerun resumes from that checkpoint with the weights and step count the killed process had (MindSpore's
``.ckpt`` reader failed on a 3.66 GB checkpoint once: docs/results.md#checkpoints). The job's peak is about 9 GB."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from tests.support.large_checkpoint_job import EPOCHS, SIDE
from tests.support.processes import Watched
from trainlib.engine.checkpoint import is_safetensors, load_metadata

pytestmark = [pytest.mark.slow, pytest.mark.large_memory]

JOB = [sys.executable, str(Path(__file__).parents[1] / "support" / "large_checkpoint_job.py")]
PROTOBUF_LIMIT = 2**31 - 1  # bytes


def events(output: str) -> list[dict]:
    return [json.loads(line) for line in output.splitlines() if line.startswith("{")]


def test_a_training_past_2_gb_killed_after_its_checkpoint_resumes_from_it(tmp_path):
    assert SIDE * SIDE * 4 > PROTOBUF_LIMIT
    killed = Watched([*JOB, str(tmp_path), "--hold"], stderr=tmp_path / "killed.log")
    before_kill = json.loads(killed.wait_for('"epoch": 2'))  # printed after epoch 1's checkpoint was written
    killed.kill_group()
    assert killed.process.returncode == -9
    saved = tmp_path / "epochs" / "epoch_0001.ckpt"
    assert sorted(p.name for p in (tmp_path / "epochs").iterdir()) == ["epoch_0001.ckpt"]  # no temporary
    assert not (tmp_path / "final.ckpt").exists()
    assert saved.stat().st_size > PROTOBUF_LIMIT and is_safetensors(saved)
    assert load_metadata(saved)["epoch"] == 1
    assert before_kill["global_step"] == 1 and before_kill["weight_sum"] != 0.0  # one step trained

    rerun = subprocess.run([*JOB, str(tmp_path)], capture_output=True, text=True, timeout=900, check=False)
    assert rerun.returncode == 0, rerun.stderr[-3000:]
    assert f"Resuming from {saved} (epoch 1 of {EPOCHS})" in rerun.stderr
    started, finished = events(rerun.stdout)
    # the rerun starts epoch 2 with exactly the weights and step count the killed process had
    assert started["epoch"] == 2
    assert {k: started[k] for k in ("weight_sum", "weight_corner", "global_step")} == {
        k: before_kill[k] for k in ("weight_sum", "weight_corner", "global_step")
    }
    assert finished["epoch"] == EPOCHS and finished["global_step"] == 2
    assert finished["weight_sum"] != started["weight_sum"]  # and trained on
    assert load_metadata(tmp_path / "final.ckpt")["epoch"] == EPOCHS
    assert finished["peak_rss_gb"] < 12.0
