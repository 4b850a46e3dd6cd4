"""notebooks/compare_recipes.ipynb runs top to bottom against a real MLflow store."""

from __future__ import annotations

from pathlib import Path

import nbformat

NOTEBOOK = Path(__file__).resolve().parents[1] / "notebooks" / "compare_recipes.ipynb"


def test_shipped_notebook_has_no_outputs():
    notebook = nbformat.read(NOTEBOOK, as_version=4)
    nbformat.validate(notebook)
    assert all(not cell.get("outputs") and cell.get("execution_count") is None for cell in notebook.cells)
