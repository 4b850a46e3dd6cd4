"""The slow tier's shared set-ups are built once only if pytest-xdist can group their tests on one worker.

pytest 9.2 ignores the node id that pytest-xdist 3.8 rewrites for ``--dist loadgroup``: every ``xdist_group`` is
then silently spread over the workers, and the recipe store (minutes of real runs) was built twice in CI. This
runs the installed pytest and xdist on two grouped tests in a process of their own (a few seconds).
"""

from __future__ import annotations

import subprocess
import sys

TESTS = """
import os
from pathlib import Path

import pytest


@pytest.mark.xdist_group("shared")
@pytest.mark.parametrize("index", range(4))
def test_grouped(index):
    Path(f"worker_{index}.txt").write_text(os.environ["PYTEST_XDIST_WORKER"])
"""


def test_loadgroup_keeps_a_group_on_one_worker(tmp_path):
    (tmp_path / "test_grouped.py").write_text(TESTS)
    result = subprocess.run(
        [sys.executable, "-m", "pytest", "-n", "2", "--dist", "loadgroup", "-p", "no:cacheprovider", "-q"],
        cwd=tmp_path,
        check=False,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    workers = {path.read_text() for path in tmp_path.glob("worker_*.txt")}
    assert len(workers) == 1, f"one group ran on {sorted(workers)}: use the pytest of requirements.lock"
