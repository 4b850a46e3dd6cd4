"""A parameter typo, or a parameter renamed since, stops a real kedro run before MindSpore loads."""

from __future__ import annotations

import subprocess
import sys

import pytest


@pytest.mark.parametrize(
    ("params", "message"),
    [
        ("baseline.epoch=3", "baseline.epoch is not a known parameter; did you mean baseline.epochs? (--params)"),
        ("thor.damping_method=mindspore", "--params: thor.damping_method: 'mindspore' was renamed 'fixed'"),
        ("model.name=resnet18", "--params: model.name was renamed network.name"),
    ],
)
def test_kedro_run_with_a_bad_parameter_stops_before_mindspore_loads(tmp_path, params, message):
    from tests.support.projects import make_project

    project = make_project(tmp_path / "project", {})
    # -X importtime: Python logs every module the process imports, on stderr
    command = [sys.executable, "-X", "importtime", "-m", "kedro", "run", "--pipelines=baseline"]
    result = subprocess.run(
        [*command, f"--params={params}"], check=False, cwd=project, capture_output=True, text=True, timeout=120
    )
    assert result.returncode == 1
    assert message in result.stderr
    imported = {line.rsplit("|", 1)[-1].strip() for line in result.stderr.splitlines() if line.startswith("import")}
    assert {"kedro", "trainlib.params", "pipelines.hooks"} <= imported
    assert not {name for name in imported if name.split(".")[0] == "mindspore"}
