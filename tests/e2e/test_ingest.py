"""Ingest in real kedro runs: a rerun reads nothing, a file broken after ingest is named or skipped."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.support.trees import write_image_tree


def truncate(path: Path, keep: float = 0.6) -> None:
    data = path.read_bytes()
    path.write_bytes(data[: int(len(data) * keep)])


def files_under(folder: Path) -> dict[str, tuple[int, int]]:
    return {str(p): (p.stat().st_size, p.stat().st_mtime_ns) for p in folder.rglob("*") if p.is_file()}


@pytest.mark.slow
def test_kedro_rerun_reads_nothing_and_a_file_broken_after_ingest_is_named_or_skipped(tmp_path):
    from tests.support.projects import TINY_PARAMS, make_project, runs

    tree = write_image_tree(tmp_path / "tree", classes=("cat", "dog"), per_class={"train": 8, "val": 2}, fmt="jpg")
    data = {**TINY_PARAMS["data"], "root": str(tree), "on_bad_file": "fail"}
    project = make_project(tmp_path / "project", {**TINY_PARAMS, "data": data})

    def run(*args: str) -> tuple[int, str]:
        # a console wide enough that rich does not wrap the error line
        command = [sys.executable, "-m", "kedro", "run", *args]
        env = {**os.environ, "COLUMNS": "1000"}
        result = subprocess.run(command, cwd=project, capture_output=True, text=True, timeout=600, env=env, check=False)
        return result.returncode, result.stdout + result.stderr

    code, log = run("--pipelines=data")
    assert code == 0, log[-3000:]
    assert "Ingest read 20 file(s) at level 'decode'" in log
    code, log = run("--pipelines=data")
    assert code == 0, log[-3000:]
    assert "Ingest read 0 file(s) at level 'decode'" in log

    victim = tree / "train" / "dog" / "dog_train_005.jpg"
    truncate(victim, keep=0.3)
    # The training nodes alone: a run's data nodes would ingest again and list the file in bad_files.
    training_only = ("--pipelines=baseline", "--from-nodes=baseline.build_network")

    def baseline_runs() -> list:
        client, found = runs(project)
        return client, [r for r in found if r.data.tags.get("pipeline") == "baseline"]

    # exclude: the run trains on the rest and every epoch's row counts the file left out
    code, log = run(*training_only, "--params=data.on_bad_file=exclude")
    assert code == 0, log[-3000:]
    client, (trained,) = baseline_runs()
    skipped = client.get_metric_history(trained.info.run_id, "data/skipped_files")
    epochs = range(1, TINY_PARAMS["baseline"]["epochs"] + 1)
    assert [(m.step, m.value) for m in skipped] == [(epoch, 1.0) for epoch in epochs]
    models = files_under(project / "data" / "06_models")

    # fail: the run stops before training with one line naming the file and the setting to change
    code, log = run("--pipelines=baseline", "--from-nodes=baseline.train")  # initial weights as they were
    assert code != 0
    named = [line for line in log.splitlines() if line.startswith("Error: ")]  # the command's Error: block
    assert named and "(ChangedImageError in node " in log, log[-3000:]
    assert str(victim) in named[-1] and "changed on disk after ingest" in named[-1]
    assert named[-1].rstrip().endswith("or set data.on_bad_file: exclude to skip it")
    _, found = baseline_runs()
    assert sorted(r.info.status for r in found) == ["FAILED", "FINISHED"]
    assert files_under(project / "data" / "06_models") == models  # every checkpoint kept as it was
