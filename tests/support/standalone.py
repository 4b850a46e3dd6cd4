"""A logged MLflow model as a user elsewhere meets it, following docs/use-a-model.md: its REST reply parsed by a
strict JSON parser (``strict_json``), and the page's own Python (``page_snippet``) run in a Python that has the
model's requirements but not this project (``run_without_the_project``): this environment's interpreter started
with ``-S`` (no site module, so no ``.pth`` file, and the project's editable install is one), in a working directory
of its own, with only the environment's site-packages folder on ``sys.path`` and no ``PYTHONPATH``. What a
teammate's machine with ``pip install -r requirements.txt`` gives."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import sysconfig
from pathlib import Path

PAGE = Path(__file__).resolve().parents[2] / "docs" / "use-a-model.md"
PYTHON_BLOCK = re.compile(r"^```python\n(.*?)^```", re.MULTILINE | re.DOTALL)
# Put before the code the bare interpreter runs: the environment's packages without their .pth files, and a check
# that the project is not importable.
PRELUDE = """
import importlib.util, sys
sys.path.append({site_packages!r})
leaked = [name for name in ("pipelines", "trainlib") if importlib.util.find_spec(name) is not None]
assert not leaked, f"the project is importable: {{leaked}}"
"""


def page_snippet(marker: str) -> str:
    """The Python block of docs/use-a-model.md that holds ``marker``."""
    (block,) = [block for block in PYTHON_BLOCK.findall(PAGE.read_text()) if marker in block]
    return block


def run_without_the_project(code: str, cwd: Path) -> str:
    """What ``code`` prints, run in ``cwd`` by a Python without this project (see the module docstring); a failure
    raises ``AssertionError`` with the process's output."""
    script = PRELUDE.format(site_packages=sysconfig.get_paths()["purelib"]) + code
    environment = {name: value for name, value in os.environ.items() if name != "PYTHONPATH"}
    result = subprocess.run(
        [sys.executable, "-S", "-c", script], cwd=cwd, env=environment, capture_output=True, text=True, check=False
    )
    assert result.returncode == 0, result.stderr[-4000:]
    return result.stdout


def refuse_constant(name: str):
    """``json.loads``'s hook for ``NaN``, ``Infinity`` and ``-Infinity``, which JSON has not."""
    raise ValueError(f"{name} is not JSON")


def strict_json(text: str):
    """``text`` parsed as JSON; ``ValueError`` for a ``NaN`` or ``Infinity`` in it, as a strict parser would."""
    return json.loads(text, parse_constant=refuse_constant)
