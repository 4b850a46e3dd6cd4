"""``thor.statistics_dtype: float64`` (issue 44): THOR's weights after 3 steps are the same bits whatever oneDNN's
thread split; with float32 they are not (so the comparison can fail).

oneDNN's float32 GEMM splits a long sum between min(MindSpore's kernel threads, bytes / L2 cache per core) threads
(docs/troubleshooting.md#thor-cpu), and MindSpore's kernel threads are the cores it sees. Each training runs in a
process of its own that sees 2 cores (this machine's count) or 4 (``tests/support/fake_nprocs.c``, preloaded), as
machines with those core counts do: the stem's A statistic (65,536 x 27 float32 rows, 7 MiB) then splits over 2 or 4
threads where the L2 cache per core is below 3.5 MiB (here 2 MiB). The first-order control shows that the split
changes nothing else in the training.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

PROJECT = Path(__file__).resolve().parents[2]
SHIM = PROJECT / "tests" / "support" / "fake_nprocs.c"
CORES = (2, 4)


@pytest.fixture(scope="module")
def fake_nprocs(tmp_path_factory) -> Path:
    """The shim, compiled (a C compiler: skipped without one, failed under CI)."""
    compiler = shutil.which("cc") or shutil.which("gcc")
    if compiler is None:
        if os.environ.get("CI", "").lower() in ("1", "true", "yes"):
            pytest.fail("no C compiler (cc, gcc) to build tests/support/fake_nprocs.c")
        pytest.skip("no C compiler (cc, gcc) to build tests/support/fake_nprocs.c")
    library = tmp_path_factory.mktemp("shim") / "libfake_nprocs.so"
    subprocess.run([compiler, "-shared", "-fPIC", "-O2", "-o", str(library), str(SHIM), "-ldl"], check=True)
    return library


def trained_weights(tmp_path: Path, library: Path, runs: dict[str, tuple[int, list[str]]]) -> dict[str, dict]:
    """Each run ``name: (cores, job arguments)`` as a process of ``tests.support.thor_bits_job``, two at a time; the
    weights each wrote."""
    environment = {**os.environ, "LD_PRELOAD": str(library), "ONEDNN_MAX_CPU_ISA": "AVX2"}
    names = list(runs)
    for pair in (names[i : i + 2] for i in range(0, len(names), 2)):
        processes = {
            name: subprocess.Popen(
                [sys.executable, "-m", "tests.support.thor_bits_job", str(tmp_path / f"{name}.npz"), *runs[name][1]],
                cwd=PROJECT,
                env={**environment, "FAKE_NPROCS": str(runs[name][0])},
                stdout=subprocess.DEVNULL,
                stderr=subprocess.PIPE,
                text=True,
            )
            for name in pair
        }
        for name, process in processes.items():
            _, errors = process.communicate(timeout=900)
            assert process.returncode == 0, f"{name}: {errors[-3000:]}"
    return {name: dict(np.load(tmp_path / f"{name}.npz")) for name in names}


def differing(first: dict, second: dict) -> list[str]:
    assert first.keys() == second.keys()
    return [name for name in first if not np.array_equal(first[name], second[name])]


def test_float64_statistics_give_the_same_weights_whatever_the_thread_split(tmp_path, fake_nprocs):
    runs = {
        f"{dtype}{suffix}-{cores}": (cores, [dtype, *arguments])
        for dtype, suffix, arguments in (
            ("float64", "", []),
            ("float32", "", []),
            ("float32", "-first-order", ["--first-order"]),
        )
        for cores in CORES
    }
    weights = trained_weights(tmp_path, fake_nprocs, runs)
    two, four = CORES
    # the split changes the float32 statistics, and through them THOR's weights; nothing else of the training
    assert differing(weights[f"float32-{two}"], weights[f"float32-{four}"]), "the thread split changed no bit here"
    assert differing(weights[f"float32-first-order-{two}"], weights[f"float32-first-order-{four}"]) == []
    assert differing(weights[f"float64-{two}"], weights[f"float64-{four}"]) == []
