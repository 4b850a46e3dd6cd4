"""The library (everything but the pipeline folders, hooks, settings, datasets, tracking and shared) loads
neither Kedro nor MLflow: it runs in notebooks, benchmarks and msrun workers without them."""

from __future__ import annotations

import json
import pkgutil
import subprocess
import sys

import pytest

import pipelines

LIBRARY_PACKAGES = (
    "models",
    "images",
    "engine",
    "optim",
    "boost",
    "distributed",
    "porting",
    "reporting",
    "recipes",
)
LIBRARY_MODULES = ("params",)
FORBIDDEN = ("kedro", "mlflow")


def library_modules() -> list[str]:
    """Every module of the library packages (subpackages included) and the library's single modules."""
    names = [f"pipelines.{name}" for name in LIBRARY_MODULES]
    for package in LIBRARY_PACKAGES:
        module = __import__(f"pipelines.{package}", fromlist=["__path__"])
        names.append(module.__name__)
        names += [info.name for info in pkgutil.walk_packages(module.__path__, f"{module.__name__}.")]
    return sorted(names)


def test_the_list_covers_every_library_package():
    top_level = {info.name for info in pkgutil.iter_modules(pipelines.__path__)}
    pipeline_folders = {"data", "baseline", "thor", "dim_reduce", "adasum", "report", "migrate", "datasets"}
    kedro_side = {"hooks", "settings", "pipeline_registry", "tracking", "shared", "__main__", "config_validation"}
    assert top_level - pipeline_folders - kedro_side == set(LIBRARY_PACKAGES) | set(LIBRARY_MODULES)


@pytest.mark.parametrize("module", library_modules())
def test_importing_a_library_module_loads_neither_kedro_nor_mlflow(module):
    code = (
        "import json, sys\n"
        f"import {module}\n"
        f"print(json.dumps(sorted({{name.split('.')[0] for name in sys.modules}} & set({FORBIDDEN!r}))))"
    )
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300, check=False)
    assert result.returncode == 0, result.stderr[-3000:]
    assert json.loads(result.stdout.strip().splitlines()[-1]) == [], f"{module} loads {result.stdout.strip()}"
