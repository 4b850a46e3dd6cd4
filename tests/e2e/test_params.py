"""A parameter typo stops a real kedro run before MindSpore loads."""

from __future__ import annotations

import subprocess
import sys


def test_kedro_run_with_a_typo_stops_before_mindspore_loads(tmp_path):
    from tests.support.projects import make_project

    project = make_project(tmp_path / "project", {})
    # -X importtime: Python logs every module the process imports, on stderr
    command = [sys.executable, "-X", "importtime", "-m", "kedro", "run", "--pipelines=baseline"]
    result = subprocess.run(
        [*command, "--params=baseline.epoch=3"], check=False, cwd=project, capture_output=True, text=True, timeout=120
    )
    assert result.returncode == 1
    assert "baseline.epoch is not a known parameter; did you mean baseline.epochs? (--params)" in result.stderr
    imported = {line.rsplit("|", 1)[-1].strip() for line in result.stderr.splitlines() if line.startswith("import")}
    assert {"kedro", "trainlib.params", "pipelines.hooks"} <= imported
    assert not {name for name in imported if name.split(".")[0] == "mindspore"}
