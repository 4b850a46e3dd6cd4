"""The layers hold (import-linter's contracts in pyproject.toml: the Kedro project ``pipelines`` -- pipeline folders,
node glue, tracking -- above the training library ``trainlib`` -- recipes, engine, optimizers, distributed, models,
images -- which loads neither Kedro, MLflow nor the project), every top-level module is placed in a layer, and no
module of either package imports itself through a cycle, imports under ``TYPE_CHECKING`` included: a type-only import
still makes one module's reader read the other first."""

from __future__ import annotations

import ast
import pkgutil
import shutil
import subprocess
import sys
import tomllib
from pathlib import Path

import grimp

import mindir_serving
import pipelines
import trainlib

PROJECT = Path(__file__).resolve().parents[1]
PACKAGES = ("pipelines", "trainlib", "mindir_serving")
LINT_IMPORTS = Path(sys.executable).parent / "lint-imports"


def contracts() -> list[dict]:
    return tomllib.loads((PROJECT / "pyproject.toml").read_text())["tool"]["importlinter"]["contracts"]


def lint_imports(source_root: Path) -> subprocess.CompletedProcess:
    """``lint-imports`` with the project's configuration over the package found in ``source_root``."""
    return subprocess.run(
        [str(LINT_IMPORTS), "--no-cache", "--config", str(PROJECT / "pyproject.toml")],
        cwd=PROJECT,
        env={"PATH": str(LINT_IMPORTS.parent), "PYTHONPATH": str(source_root)},
        capture_output=True,
        text=True,
        check=False,
    )


def test_the_layer_contracts_hold():
    result = lint_imports(PROJECT / "src")
    assert result.returncode == 0, result.stdout[-4000:]
    assert "0 broken" in result.stdout


def test_every_top_level_module_has_a_layer():
    (layers,) = [c["layers"] for c in contracts() if c["type"] == "layers"]
    names = (name for layer in layers for name in layer.replace(":", "|").split("|"))
    placed = {".".join(name.strip().split(".")[:2]) for name in names}
    top_level = {
        f"{package.__name__}.{info.name}"
        for package in (pipelines, trainlib, mindir_serving)
        for info in pkgutil.iter_modules(package.__path__)
    }
    unplaced = {module for module in top_level - placed if module.split(".")[0] not in placed}  # or its whole package
    assert unplaced == set(), "modules without a layer in pyproject.toml [tool.importlinter]"


def test_the_contracts_catch_the_library_loading_mlflow(tmp_path):
    """A copy of the package in which the engine imports MLflow breaks the library contract, naming the import."""
    for package in PACKAGES:
        shutil.copytree(PROJECT / "src" / package, tmp_path / package)
    leak = tmp_path / "trainlib" / "engine" / "leak.py"
    leak.write_text("import mlflow\n")
    result = lint_imports(tmp_path)
    assert result.returncode != 0
    assert "trainlib.engine.leak -> mlflow" in result.stdout


def strongly_connected(graph: grimp.ImportGraph) -> list[list[str]]:
    """The import cycles of ``graph``: its strongly connected components of more than one module (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    cycles: list[list[str]] = []

    def visit(module: str) -> None:
        index[module] = low[module] = len(index)
        stack.append(module)
        on_stack.add(module)
        for imported in graph.find_modules_directly_imported_by(module):
            if imported not in index:
                visit(imported)
                low[module] = min(low[module], low[imported])
            elif imported in on_stack:
                low[module] = min(low[module], index[imported])
        if low[module] == index[module]:
            component = []
            while True:
                member = stack.pop()
                on_stack.discard(member)
                component.append(member)
                if member == module:
                    break
            if len(component) > 1:
                cycles.append(sorted(component))

    for module in sorted(graph.modules):
        if module not in index:
            visit(module)
    return cycles


def test_no_module_imports_itself_through_a_cycle():
    graph = grimp.build_graph(*PACKAGES, exclude_type_checking_imports=False)
    assert strongly_connected(graph) == []


def test_the_cycle_check_counts_type_checking_imports(tmp_path):
    """A cycle closed only by an import under ``TYPE_CHECKING`` is a cycle."""
    package = tmp_path / "typecycle"
    package.mkdir()
    (package / "__init__.py").write_text("")
    (package / "a.py").write_text("from typecycle import b\n")
    (package / "b.py").write_text("from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from typecycle import a\n")
    sys.path.insert(0, str(tmp_path))
    try:
        graph = grimp.build_graph("typecycle", exclude_type_checking_imports=False, cache_dir=None)
    finally:
        sys.path.remove(str(tmp_path))
    assert strongly_connected(graph) == [["typecycle.a", "typecycle.b"]]


def test_the_cycle_check_finds_a_cycle():
    graph = grimp.ImportGraph()
    for module in ("a", "a.b", "a.c", "a.d"):
        graph.add_module(module)
    graph.add_import(importer="a.b", imported="a.c")
    graph.add_import(importer="a.c", imported="a.b")
    graph.add_import(importer="a.d", imported="a.b")
    assert strongly_connected(graph) == [["a.b", "a.c"]]


def project_import_renames(source: str) -> list[str]:
    """``from pipelines… import name as other`` and ``import trainlib… as other`` in one module's source: a
    project function or module read under a second name."""
    renames = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.ImportFrom) and (node.module or "").split(".")[0] in PACKAGES:
            renames += [f"{node.module}.{a.name} as {a.asname}" for a in node.names if a.asname not in (None, a.name)]
        elif isinstance(node, ast.Import):
            project = [a for a in node.names if a.name.split(".")[0] in PACKAGES]
            renames += [f"{a.name} as {a.asname}" for a in project if a.asname]
    return renames


def test_no_import_renames_a_project_name():
    renamed = {
        str(path.relative_to(PROJECT)): renames
        for path in sorted((PROJECT / "src").rglob("*.py"))
        if (renames := project_import_renames(path.read_text()))
    }
    assert renamed == {}


def test_the_rename_check_finds_a_rename():
    source = "from trainlib.recipes import dim_reduce as recipe\nimport pipelines.tracking as t\nimport numpy as np\n"
    assert project_import_renames(source) == ["trainlib.recipes.dim_reduce as recipe", "pipelines.tracking as t"]
