"""Every error class with advice exists in the project or Kedro."""

from __future__ import annotations

import ast

from tests.support.projects import PROJECT


def test_each_error_class_with_advice_exists():
    """Every class name of the advice table is an error class of this project (or Kedro's DatasetError)."""
    from kedro.io import DatasetError

    from pipelines.failures import ADVICE

    defined = {
        node.name
        for path in (PROJECT / "src").rglob("*.py")
        for node in ast.walk(ast.parse(path.read_text()))
        if isinstance(node, ast.ClassDef)
    }
    assert set(ADVICE) - {DatasetError.__name__} <= defined
