"""Seconds and bytes of the environment MLflow builds from a logged model's requirements, by ``--env-manager``:
``virtualenv`` (pyenv's Python, virtualenv, pip) against ``uv`` (uv's venv and installer; ``scripts/setup.sh`` puts
uv in ``.venv/bin``). A baseline on a tiny generated tree logs the model first; each manager then builds into a new
``MLFLOW_ENV_ROOT`` (nothing reused), ``--repeats`` times, alternating. The package caches (pip's, uv's) are this
machine's as they are: say whether they were warm when quoting the figures.

    PATH=.venv/bin:$PATH .venv/bin/python benchmarks/model_env.py --repeats 1
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

PROJECT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(PROJECT))
from tests.support.projects import run_on_tiny_tree, runs  # noqa: E402
from tests.support.servers import prepare_model_env  # noqa: E402


def size_bytes(folder: Path) -> int:
    return int(subprocess.run(["du", "-sb", str(folder)], capture_output=True, text=True, check=True).stdout.split()[0])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=1)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as scratch:
        project, _ = run_on_tiny_tree(Path(scratch), "baseline", {"train": 8, "val": 3})
        _, found = runs(project)
        model = f"runs:/{found[0].info.run_id}/model"
        tracking = f"sqlite:///{project / 'mlflow.db'}"
        figures: dict[str, list[tuple[float, int]]] = {"virtualenv": [], "uv": []}
        for _ in range(args.repeats):
            for manager, measured in figures.items():
                root = Path(scratch) / f"envs-{manager}-{len(measured)}"
                start = time.perf_counter()
                prepare_model_env(model, tracking, project, manager, MLFLOW_ENV_ROOT=str(root))
                measured.append((time.perf_counter() - start, size_bytes(root)))
    for manager, measured in figures.items():
        seconds = statistics.median(s for s, _ in measured)
        size = statistics.median(b for _, b in measured)
        print(f"{manager}: median {seconds:.1f} s, {size / 1e9:.2f} GB (of {len(measured)})")
    ratio = statistics.median(s for s, _ in figures["uv"]) / statistics.median(s for s, _ in figures["virtualenv"])
    print(f"uv / virtualenv build time: {ratio:.2f}")


if __name__ == "__main__":
    main()
