"""No module of ``src/`` reaches into Kedro's or Optuna's private names (issue 51: their public APIs only): an
attribute ``_name`` read off something imported from them, a ``_name`` imported from them, or a ``_name`` method
overridden in a subclass of one of their classes. Their plugins' two adapters, each saying in its docstring why no
public way exists, are the only places allowed. Read from the source alone: a private attribute of a value handed in
(``trial._trial_id`` on a trial parameter) is not seen."""

from __future__ import annotations

import ast
from pathlib import Path

PROJECT = Path(__file__).resolve().parents[1]
WATCHED = ("kedro", "optuna", "kedro_viz", "kedro_mlflow")
ADAPTERS = {
    # kedro-viz has no setting for the page it serves and builds: the page script is injected where it is written
    "src/pipelines/cli.py": {"BaseDeployer._write_heap_injected_index"},
    # kedro-mlflow 2.0 has no public way to change how its hook sends a node's parameters
    "src/pipelines/hooks/node_params.py": {"ExperimentMlflowHook._log_param"},
}


def _is_private(name: str) -> bool:
    return name.startswith("_") and not name.startswith("__")


def _watched_imports(tree: ast.Module) -> tuple[dict[str, str], set[str]]:
    """The local names ``tree`` imports from a watched package (-> the module), and the private names it imports."""
    imported, uses = {}, set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                if alias.name.split(".")[0] in WATCHED:
                    imported[(alias.asname or alias.name).split(".")[0]] = alias.name
        elif isinstance(node, ast.ImportFrom) and (node.module or "").split(".")[0] in WATCHED:
            if any(_is_private(part) for part in node.module.split(".")):
                uses.add(node.module)
            for alias in node.names:
                if _is_private(alias.name):
                    uses.add(f"{node.module}.{alias.name}")
                imported[alias.asname or alias.name] = node.module
    return imported, uses


def _derived_classes(trees: list[ast.Module]) -> set[str]:
    """The project's classes (by name) that subclass a watched package's class, directly or through each other."""
    classes = []  # (class, the names its module imports from a watched package)
    for tree in trees:
        imported = set(_watched_imports(tree)[0])
        classes += [(node, imported) for node in ast.walk(tree) if isinstance(node, ast.ClassDef)]
    derived: set[str] = set()
    while True:
        found = {
            node.name
            for node, imported in classes
            if any(ast.unparse(base).split(".")[0] in imported | derived for base in node.bases)
        }
        if found <= derived:
            return derived
        derived |= found


def private_uses(source: str, derived: set[str] = frozenset()) -> set[str]:
    """Each private name of a watched package that ``source`` reads, imports or overrides (in a subclass, or one of
    the project's ``derived`` ones), as ``owner._name``."""
    tree = ast.parse(source)
    imported, uses = _watched_imports(tree)
    for node in ast.walk(tree):
        if isinstance(node, ast.Attribute) and _is_private(node.attr):
            root = node.value
            while isinstance(root, ast.Attribute):
                root = root.value
            if isinstance(root, ast.Name) and root.id in imported:
                uses.add(f"{ast.unparse(node.value)}.{node.attr}")
        elif isinstance(node, ast.ClassDef):
            bases = [ast.unparse(b) for b in node.bases if ast.unparse(b).split(".")[0] in imported.keys() | derived]
            overridden = [item.name for item in node.body if isinstance(item, ast.FunctionDef)]
            uses |= {f"{base}.{name}" for base in bases for name in overridden if _is_private(name)}
    return uses


def test_no_module_uses_a_private_name_of_kedro_or_optuna():
    sources = {str(path.relative_to(PROJECT)): path.read_text() for path in sorted((PROJECT / "src").rglob("*.py"))}
    derived = _derived_classes([ast.parse(source) for source in sources.values()])
    found = {path: uses for path, source in sources.items() if (uses := private_uses(source, derived))}
    assert found == ADAPTERS


def test_the_check_finds_each_kind_of_private_use():
    source = (
        "import optuna\nfrom kedro.io import MemoryDataset\nfrom kedro.framework._private import thing\n"
        "from optuna.trial import _state\nimport numpy as np\n"
        "class Kept(MemoryDataset):\n    def _release(self):\n        pass\n    def load(self):\n        pass\n"
        "def f():\n    return optuna.storages._heartbeat, np._core\n"
    )
    assert private_uses(source) == {
        "kedro.framework._private",
        "optuna.trial._state",
        "MemoryDataset._release",
        "optuna.storages._heartbeat",
    }


def test_the_check_follows_the_projects_subclasses_across_modules():
    base = "from kedro.io import MemoryDataset\nclass Kept(MemoryDataset):\n    pass\n"
    child = "from elsewhere import Kept\nclass Kept2(Kept):\n    def _release(self):\n        pass\n"
    derived = _derived_classes([ast.parse(base), ast.parse(child)])
    assert derived == {"Kept", "Kept2"}
    assert private_uses(child, derived) == {"Kept._release"}
