"""The migrate pipeline as real kedro runs: parity logged to MLflow; without torch only migrate needs it."""

from __future__ import annotations

import json
import subprocess
import sys

import numpy as np
import pytest

from tests.support.projects import kedro, make_project, runs
from tests.support.torch_weights import PARITY, random_torch_resnet, save_state_dict
from trainlib.engine.checkpoint import load_checkpoint
from trainlib.migrate.convert import (
    TORCH_INSTALL_HINT,
    load_state_dict,
)


@pytest.fixture(scope="module")
def resnet18(tmp_path_factory):
    """A random resnet18 with 10 classes: its state_dict file and arrays."""
    path = save_state_dict(random_torch_resnet("resnet18", 10), tmp_path_factory.mktemp("torch") / "resnet18.pth")
    return path, load_state_dict(path)


def test_without_torch_only_migrate_needs_it(tmp_path):
    script = f"""
import importlib.abc
import sys

# as if PyTorch were not installed (a None in sys.modules would break SciPy's own torch probe)
class NoTorch(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path, target=None):
        if name.split(".")[0] == "torch":
            raise ModuleNotFoundError("No module named 'torch'", name="torch")

sys.meta_path.insert(0, NoTorch())
from pipelines.pipeline_registry import register_pipelines
assert "migrate" in register_pipelines()
from trainlib.migrate.convert import load_state_dict
try:
    load_state_dict({str(tmp_path / "x.pth")!r})
except ImportError as error:
    print("ImportError:", error)
"""
    result = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=300, check=False)
    assert result.returncode == 0, result.stderr[-3000:]
    assert f"ImportError: {TORCH_INSTALL_HINT}" in result.stdout
    assert "pip install -e '.[migrate]'" in TORCH_INSTALL_HINT


def test_kedro_run_migrate_logs_parity_to_mlflow(tmp_path, resnet18):
    path, state_dict = resnet18
    params = {
        "runtime": {"mode": "pynative"},
        "migrate": {"state_dict": path, "architecture": "resnet18", "num_classes": 10, "parity": PARITY.model_dump()},
    }
    project = make_project(tmp_path / "project", params)
    result = kedro(project, "run", "--pipelines=migrate")
    assert result.returncode == 0, result.stdout[-5000:] + result.stderr[-5000:]
    converted = load_checkpoint(project / "data/06_models/migrate/migrated.ckpt")
    np.testing.assert_array_equal(converted.params["layers.7.bn2.moving_mean"], state_dict["layer4.1.bn2.running_mean"])
    report = json.loads((project / "data/08_reporting/migrate/parity.json").read_text())
    assert report["passed"] and report["state_dict"] == path
    client, found = runs(project)
    assert [r.info.status for r in found] == ["FINISHED"]
    # the nodes take typed parameters (MigrateParams); kedro-mlflow still logs them one key each, as in the YAML
    logged = found[0].data.params
    assert logged["migrate.parity.lr"] == "0.1" and logged["migrate.parity.step_noise_factor"] == "2.0"
    assert logged["migrate.architecture"] == "resnet18" and logged["runtime.mode"] == "pynative"
    assert "migrate" not in logged and "migrate.parity" not in logged
    metrics = found[0].data.metrics
    assert metrics["migrate_forward_max_abs_diff"] <= 1e-4
    assert metrics["migrate_step_weight_max_abs_diff"] <= 1e-4
    assert metrics["migrate_step_update_max_rel_diff"] <= 1e-3
    assert metrics["migrate_passed"] == 1.0
    assert metrics["migrate_step_near_kink_activations"] == report["single_step"]["near_kink_activations"]
    artifacts = {
        a.path for folder in ("reports", "checkpoints") for a in client.list_artifacts(found[0].info.run_id, folder)
    }
    assert {"reports/parity.json", "reports/parity_tensors.csv", "checkpoints/migrated.ckpt"} <= artifacts
