"""Data-parallel training under msrun: 2 CPU workers, one MLflow run, failures and interruptions.

The baseline's, adasum's and dim_reduce's trainings on two workers (identical replicas, one MLflow run per ``kedro
run``, one child run per training, no worker left) are checked in ascend's rehearsal of the three
(``tests/e2e/test_fast_dev_run.py``): ResNet-50 on 2 msrun workers, the same launch."""

from __future__ import annotations

import os
import signal
from pathlib import Path

import pytest

from tests.support.config import distributed_params
from tests.support.processes import Watched, assert_no_worker_left, running
from tests.support.projects import TINY_PARAMS, kedro, make_project, runs
from tests.support.servers import free_port
from tests.support.trees import write_image_tree
from trainlib.distributed.launch import DistributedTrainingError, launch
from trainlib.engine.checkpoint import load_checkpoint

pytestmark = pytest.mark.slow


def two_workers() -> dict:
    return {"worker_num": 2, "local_worker_num": 2, "master_port": free_port()}


def tiny_project(root: Path, params: dict, per_class: dict) -> Path:
    tree = write_image_tree(root / "tree", classes=("cat", "dog", "fox"), per_class=per_class)
    return make_project(
        root / "project",
        {**TINY_PARAMS, **params, "data": {**TINY_PARAMS["data"], "root": str(tree)}, "distributed": two_workers()},
    )


def test_a_rank_that_raises_fails_the_launch_with_its_traceback(tmp_path, monkeypatch):
    monkeypatch.syspath_prepend(str(Path(__file__).parent))
    monkeypatch.setenv("PYTHONPATH", str(Path(__file__).parent))
    from failing_job import fail_on_rank_1

    distributed = distributed_params(**two_workers(), cluster_timeout_s=120, log_dir=str(tmp_path / "logs"))
    with pytest.raises(DistributedTrainingError, match="rank 1 of the msrun job failed") as failure:
        launch(fail_on_rank_1, {"distributed": distributed, "runtime": None}, distributed, "CPU")
    assert str(failure.value).rstrip().endswith("ValueError: bad shard on rank 1")
    (job,) = (tmp_path / "logs").iterdir()
    pids = [int(p.read_text()) for p in job.glob("rank_*.pid")]
    assert len(pids) == 2 and not [p for p in pids if running(p)]


def wait_for_training(project: Path, run: Watched, epochs: int) -> dict[int, int]:
    """Rank -> pid once rank 0 (whose log node 0 shows) reports its first steps; every rank wrote its pid before."""
    run.wait_for(f"epoch 1/{epochs} step")
    (job,) = (project / "logs/msrun").iterdir()
    return {int(p.stem.split("_")[1]): int(p.read_text()) for p in job.glob("rank_*.pid")}


LONG = {"baseline": {**TINY_PARAMS["baseline"], "epochs": 40, "eval_interval": 0}}


def test_a_killed_rank_fails_the_node_with_its_error_and_stops_the_others(tmp_path):
    project = tiny_project(tmp_path, LONG, {"train": 40, "val": 3})
    run = Watched.kedro_run(project, "--pipelines=baseline")
    pids = wait_for_training(project, run, epochs=40)
    os.kill(pids[1], signal.SIGKILL)
    assert run.finish(timeout=120) != 0
    output = run.output
    assert "DistributedTrainingError" in output and "rank 1 of the msrun job was killed" in output, output[-5000:]
    assert_no_worker_left(project)
    _, found = runs(project)
    assert [r.info.status for r in found] == ["FAILED"]


def test_ctrl_c_stops_every_worker(tmp_path):
    project = tiny_project(tmp_path, LONG, {"train": 40, "val": 3})
    run = Watched.kedro_run(project, "--pipelines=baseline")
    wait_for_training(project, run, epochs=40)
    run.process.send_signal(signal.SIGINT)  # to kedro alone, as a terminal's Ctrl-C reaches only the foreground run
    assert run.finish(timeout=120) != 0
    assert_no_worker_left(project)
    _, found = runs(project)
    assert [r.info.status for r in found] == ["KILLED"]


def test_adasum_refuses_a_rank_count_that_is_not_a_power_of_two(tmp_path):
    project = tiny_project(tmp_path, {}, {"train": 8, "val": 3})
    result = kedro(
        project, "run", "--pipelines=adasum", "--params=distributed.worker_num=3,distributed.local_worker_num=3"
    )
    output = result.stdout + result.stderr
    assert result.returncode != 0
    assert "distributed.worker_num is 3; Adasum combines ranks recursively in pairs" in output
    assert not (project / "logs").exists(), "no worker may start"


def test_thor_on_two_workers_averages_statistics_and_keeps_replicas_identical(tmp_path):
    thor = {"thor": {"epochs": 2, "batch_size": 4, "frequency": 2, "eval_interval": 0}}
    project = tiny_project(tmp_path, thor, {"train": 8, "val": 3})
    result = kedro(project, "run", "--pipelines=thor")
    output = result.stdout + result.stderr
    assert result.returncode == 0, output[-6000:]
    _, found = runs(project)
    assert len(found) == 1
    metrics = found[0].data.metrics
    assert metrics["distributed/replica_max_abs_diff"] == 0.0
    assert "final/top1" in metrics
    assert_no_worker_left(project)


def test_kill_9_of_kedro_stops_the_workers_and_the_rerun_resumes(tmp_path):
    baseline = {**TINY_PARAMS["baseline"], "epochs": 4, "eval_interval": 0}
    project = tiny_project(tmp_path, {"baseline": baseline}, {"train": 40, "val": 3})
    run = Watched.kedro_run(project, "--pipelines=baseline")
    run.wait_for("epoch 3/4 step")  # after epoch 2's checkpoint
    run.process.kill()  # kedro alone: its workers must end with it
    run.finish()
    assert_no_worker_left(project)

    rerun = kedro(project, "run", "--pipelines=baseline")
    output = rerun.stdout + rerun.stderr
    assert rerun.returncode == 0, output[-6000:]
    assert "Resuming from" in output and "(epoch 2 of 4)" in output
    assert "epoch 1/4 step" not in output
    assert load_checkpoint(project / "data/06_models/baseline/final.ckpt").metadata["epoch"] == 4


def test_builtin_adasum_is_refused_off_ascend_before_any_work(tmp_path):
    project = make_project(tmp_path / "project", {"adasum": {"implementation": "mindspore_builtin"}})
    result = kedro(project, "run", "--pipelines=adasum", timeout=120)
    output = result.stdout + result.stderr
    assert result.returncode != 0
    assert (
        "adasum.implementation is mindspore_builtin (mindspore.boost's Adasum), which MindSpore runs on Ascend with 16 "
        "devices" in output
    )
    assert not (project / "data").exists()
