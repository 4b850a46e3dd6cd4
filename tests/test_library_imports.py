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


def modules_of(package: str) -> list[str]:
    """``pipelines.<package>`` and every module below it (a single module: itself)."""
    module = __import__(f"pipelines.{package}", fromlist=["__name__"])
    if not hasattr(module, "__path__"):
        return [module.__name__]
    return [module.__name__, *(info.name for info in pkgutil.walk_packages(module.__path__, f"{module.__name__}."))]


def test_the_list_covers_every_library_package():
    top_level = {info.name for info in pkgutil.iter_modules(pipelines.__path__)}
    pipeline_folders = {"data", "baseline", "thor", "dim_reduce", "adasum", "report", "migrate", "study", "datasets"}
    kedro_side = {"hooks", "settings", "pipeline_registry", "tracking", "shared", "cli", "__main__"}
    assert top_level - pipeline_folders - kedro_side == set(LIBRARY_PACKAGES) | set(LIBRARY_MODULES)


@pytest.mark.parametrize("package", [*LIBRARY_PACKAGES, *LIBRARY_MODULES])
def test_importing_the_library_loads_neither_kedro_nor_mlflow(package):
    # in a fresh interpreter, each module in turn; the first one that brings in a forbidden package is named
    code = f"""
import importlib, json, sys
for name in {modules_of(package)!r}:
    importlib.import_module(name)
    loaded = sorted({{m.split(".")[0] for m in sys.modules}} & set({FORBIDDEN!r}))
    if loaded:
        print(json.dumps([name, loaded]))
        break
else:
    print(json.dumps(None))
"""
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300, check=False)
    assert result.returncode == 0, result.stderr[-3000:]
    assert json.loads(result.stdout.strip().splitlines()[-1]) is None, f"importing it loads {result.stdout.strip()}"
