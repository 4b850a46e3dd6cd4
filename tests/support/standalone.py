"""A logged MLflow model as a user elsewhere meets it: its REST reply parsed by a strict JSON parser
(``strict_json``), and the model loaded and run in a Python that has its requirements but not this project: this
environment's interpreter started with ``-S`` (no site module, so no ``.pth`` file, and the project's editable
install is one), in an empty working directory, with only the environment's site-packages folder on ``sys.path``
and no ``PYTHONPATH``. What a teammate's machine with ``pip install -r requirements.txt`` gives."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import sysconfig
from pathlib import Path

# Run by the bare interpreter: refuses to start if the project is importable, then loads the model folder and
# predicts its input example; prints the predictions as JSON (pandas' split orientation) on its last line.
SCRIPT = """
import importlib.util, sys
sys.path.append({site_packages!r})
leaked = [name for name in ("pipelines", "trainlib") if importlib.util.find_spec(name) is not None]
assert not leaked, f"the project is importable: {{leaked}}"
import mlflow
model = mlflow.pyfunc.load_model({model!r})
example = model.input_example
print(model.predict(example).to_json(orient="split"))
"""


def predict_without_the_project(model_folder: Path, cwd: Path) -> dict:
    """The predictions of the model folder ``model_folder`` (a downloaded MLflow model) for its own input example,
    loaded in a Python without this project (see the module docstring), run in ``cwd``; a failure raises
    ``AssertionError`` with the process's output. The answer is parsed from JSON: ``columns``, ``index``, ``data``."""
    cwd.mkdir(parents=True, exist_ok=True)
    script = SCRIPT.format(site_packages=sysconfig.get_paths()["purelib"], model=str(model_folder))
    environment = {name: value for name, value in os.environ.items() if name != "PYTHONPATH"}
    result = subprocess.run(
        [sys.executable, "-S", "-c", script], cwd=cwd, env=environment, capture_output=True, text=True, check=False
    )
    assert result.returncode == 0, result.stderr[-4000:]
    return json.loads(result.stdout.splitlines()[-1])


def refuse_constant(name: str):
    """``json.loads``'s hook for ``NaN``, ``Infinity`` and ``-Infinity``, which JSON has not."""
    raise ValueError(f"{name} is not JSON")


def strict_json(text: str):
    """``text`` parsed as JSON; ``ValueError`` for a ``NaN`` or ``Infinity`` in it, as a strict parser would."""
    return json.loads(text, parse_constant=refuse_constant)
