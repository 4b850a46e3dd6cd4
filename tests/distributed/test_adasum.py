"""Adasum on real msrun ranks: known vectors combined by the formula, the reference recursion on four ranks,
a two-rank training."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from tests.support.adasum import adasum_reference
from tests.support.servers import free_port

WORKER = Path(__file__).parent / "adasum_worker.py"


MSRUN_TIMEOUT_S = 600


def formula(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    dot = float(a @ b)
    return (1 - dot / (2 * float(a @ a))) * a + (1 - dot / (2 * float(b @ b))) * b


def run_msrun(workers: int, args: list[str], tmp_path: Path) -> None:
    """Launch ``adasum_worker.py`` on ``workers`` CPU ranks; fail with the worker logs if it fails."""
    logs = tmp_path / "msrun_logs"
    env = dict(os.environ, PATH=f"{Path(sys.executable).parent}{os.pathsep}{os.environ.get('PATH', '')}")
    command = [
        "msrun",
        f"--worker_num={workers}",
        f"--local_worker_num={workers}",
        f"--master_port={free_port()}",
        "--join=True",
        f"--log_dir={logs}",
        "python",
        str(WORKER),
        *args,
    ]
    try:
        result = subprocess.run(
            command, env=env, cwd=tmp_path, capture_output=True, text=True, timeout=MSRUN_TIMEOUT_S, check=False
        )
        failure = f"msrun exited with {result.returncode}" if result.returncode else None
    except subprocess.TimeoutExpired:
        failure = f"msrun did not finish within {MSRUN_TIMEOUT_S} s"
    if failure:
        tails = "\n".join(
            f"--- {log.name} ---\n" + "\n".join(log.read_text(errors="replace").splitlines()[-40:])
            for log in sorted(logs.glob("*.log"))
        )
        pytest.fail(f"{failure}: {' '.join(command)}\n{tails}")


def combine_under_msrun(arrays: dict[str, np.ndarray], workers: int, tmp_path: Path, *extra: str) -> list[dict]:
    inputs, out = tmp_path / "inputs.npz", tmp_path / "out"
    out.mkdir()
    np.savez(inputs, **arrays)
    run_msrun(workers, ["vectors", str(inputs), str(out), *extra], tmp_path)
    return [{key: np.load(out / f"rank{rank}_{key}.npy") for key in arrays} for rank in range(workers)]


@pytest.mark.slow
@pytest.mark.parametrize("exchange", ["allgather", "allreduce"])
def test_two_ranks_combine_known_vectors_by_the_formula(tmp_path, exchange):
    a, b = np.array([1.0, 2.0, 3.0], np.float32), np.array([3.0, -1.0, 0.5], np.float32)
    arrays = {
        "known": np.stack([a, b]),
        "matrix": np.random.default_rng(1).normal(size=(2, 5, 3)).astype(np.float32),
        "zero_first": np.array([[0.0, 0.0], [1.0, 2.0]], np.float32),
    }
    results = combine_under_msrun(arrays, 2, tmp_path, exchange)
    np.testing.assert_allclose(results[0]["known"], formula(a.astype(np.float64), b.astype(np.float64)), rtol=2e-6)
    flat = arrays["matrix"].reshape(2, -1).astype(np.float64)
    np.testing.assert_allclose(results[0]["matrix"].ravel(), formula(flat[0], flat[1]), rtol=1e-5, atol=1e-6)
    np.testing.assert_array_equal(results[0]["zero_first"], [1.0, 2.0])
    for key in arrays:
        np.testing.assert_array_equal(results[0][key], results[1][key])


@pytest.mark.slow
def test_four_ranks_follow_the_reference_recursion(tmp_path):
    # 7 + 9 + 1 elements: the fused buffer is padded to 20, and a one-element tensor is its own segment.
    rng = np.random.default_rng(2)
    arrays = {
        "a": rng.normal(size=(4, 7)).astype(np.float32),
        "b": rng.normal(size=(4, 3, 3)).astype(np.float32),
        "c": rng.normal(size=(4, 1)).astype(np.float32),
    }
    results = combine_under_msrun(arrays, 4, tmp_path)
    for key, stacked in arrays.items():
        expected = adasum_reference(list(stacked))
        np.testing.assert_allclose(results[0][key], expected, rtol=1e-5, atol=1e-6)
        for rank in range(1, 4):
            np.testing.assert_array_equal(results[rank][key], results[0][key])


def load_arrays(path: Path) -> list[np.ndarray]:
    with np.load(path) as arrays:
        return [arrays[f"arr_{i}"] for i in range(len(arrays.files))]


@pytest.mark.slow
def test_two_rank_training_keeps_ranks_identical_and_applies_adasum_to_deltas(tmp_path):
    out = tmp_path / "out"
    out.mkdir()
    run_msrun(2, ["train", str(out)], tmp_path)
    before, after, delta, stats = (
        [load_arrays(out / f"rank{rank}_{name}.npz") for rank in range(2)]
        for name in ("before", "after", "delta", "stats")
    )
    for name, per_rank in (("weights before", before), ("weights after", after), ("BN statistics", stats)):
        for x, y in zip(per_rank[0], per_rank[1], strict=True):
            np.testing.assert_array_equal(x, y, err_msg=f"{name} differ between the ranks")
    # Different batches gave different local deltas; the step applied their per-tensor Adasum.
    assert any(not np.allclose(x, y) for x, y in zip(delta[0], delta[1], strict=True))
    for w0, d0, d1, w1 in zip(before[0], delta[0], delta[1], after[0], strict=True):
        np.testing.assert_allclose(w1, w0 + adasum_reference([d0, d1]), rtol=1e-4, atol=2e-6)
    mean_step = [
        np.abs(w1 - (w0 + (d0 + d1) / 2)).max() for w0, d0, d1, w1 in zip(before[0], *delta, after[0], strict=True)
    ]
    assert max(mean_step) > 1e-3, "the step averaged the deltas instead of applying Adasum"
