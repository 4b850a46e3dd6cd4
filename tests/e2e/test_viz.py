"""kedro-viz on the registered pipelines: each node's own file and code; the run commands it offers work when
pasted."""

from __future__ import annotations

import json
import shlex
import shutil
from pathlib import Path

import pytest

from tests.support.projects import kedro, kedro_runs, runs


def viz_panel(project: Path, pipeline: str, full_name: str) -> dict:
    """The panel kedro-viz shows for the node or dataset ``full_name`` of ``pipeline``."""
    graph = json.loads((project / "build/api/pipelines" / pipeline).read_text())
    (found,) = [n for n in graph["nodes"] if n.get("full_name", n["name"]) == full_name]
    return json.loads((project / "build/api/nodes" / found["id"]).read_text())


@pytest.mark.parametrize(
    ("pipeline", "node", "source", "function"),
    [
        ("baseline", "baseline.train", "training/nodes.py", "train"),
        ("baseline", "baseline.evaluate", "training/nodes.py", "evaluate"),
        ("thor", "thor.train", "training/nodes.py", "train"),
        ("dim_reduce", "dim_reduce.stage2.train_stage2", "dim_reduce/nodes.py", "train_stage2"),
        ("dim_reduce", "dim_reduce.control.evaluate", "training/nodes.py", "evaluate"),
        ("dim_reduce", "dim_reduce.stage1.build_network", "training/nodes.py", "build_network"),
    ],
)
def test_viz_shows_each_node_its_own_file_and_code(viz_site, pipeline, node, source, function):
    panel = viz_panel(viz_site, pipeline, node)
    assert panel["filepath"].endswith(f"src/pipelines/{source}")
    assert panel["code"].startswith(f"def {function}(")


def pasted(project: Path, command: str):
    """``command`` as kedro-viz shows it (``kedro run --to-nodes='…'``), run in ``project`` as a shell would."""
    argv = shlex.split(command)
    assert argv[:2] == ["kedro", "run"], command
    return kedro(project, *argv[1:])


def test_viz_run_commands_work_when_pasted(viz_site, tmp_path):
    # pasted in a new copy of the project, so the shared site's project stays untouched
    project = shutil.copytree(viz_site, tmp_path / "project", ignore=shutil.ignore_patterns("build"))
    # a node and a dataset of dim_reduce, which __default__ does not hold; their commands name no pipeline
    node_command = viz_panel(viz_site, "dim_reduce", "dim_reduce.stage1.build_network")["run_command"]
    assert node_command == "kedro run --to-nodes='dim_reduce.stage1.build_network'"
    result = pasted(project, node_command)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    initial = project / "data/06_models/dim_reduce/initial.ckpt"
    assert initial.is_file() and not (project / "data/06_models/dim_reduce/stage1.ckpt").exists()
    initial.unlink()

    dataset_command = viz_panel(viz_site, "dim_reduce", "dim_reduce.stage1.initial_weights")["run_command"]
    assert dataset_command == "kedro run --to-outputs=dim_reduce.stage1.initial_weights"
    result = pasted(project, dataset_command)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    assert initial.is_file()
    _, found = runs(project)
    # each command is one dim_reduce run (its stage 1 child run opens with the context build_network reads)
    assert [run.data.tags["pipeline"] for run in kedro_runs(found)] == ["dim_reduce", "dim_reduce"]
