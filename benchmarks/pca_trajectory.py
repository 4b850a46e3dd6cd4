"""Trajectory PCA for DLDR at ResNet-50 size: seconds and peak memory, beside scikit-learn where it fits.

Writes a synthetic trajectory of ``--checkpoints`` float32 ``.npy`` files of ``--n`` weights each (default 60 x
25,557,032, ResNet-50's parameter count: about 6.1 GB) to a temporary folder, then runs each method in a fresh
spawned process that reads those files and reports its own peak resident memory (VmHWM; see ``peak_rss``):

- ours, ``in_memory=True`` with ``np.load`` (each file read once);
- ours, ``in_memory=False`` with ``np.load(mmap_mode="r")`` (three passes reading slices);
- scikit-learn ``PCA(svd_solver="full")`` on the float32 (N, n) matrix, at full size only if its estimated
  footprint fits in the memory available, and always beside ours on the first ``--reduced-n`` weights.

Peak memory is reported raw and above a baseline: a process of the same kind that imports the same modules
and builds the same loaders but runs no PCA. "extra / traj" divides that excess by the trajectory's float32
size N * n * 4 (goal for ours in memory: <= 1.5; time goal: <= 60 s). Timings include reading the files,
which are in the page cache (just written). The last column compares each result with a reference run
(the largest principal angle between the two k-dimensional subspaces, and the largest relative difference
of the explained variances). The temporary folder is removed at the end, also on error.

    .venv/bin/python benchmarks/pca_trajectory.py              # full size, about 4 minutes
    .venv/bin/python benchmarks/pca_trajectory.py --n 2000000  # quick look
"""

from __future__ import annotations

import argparse
import multiprocessing
import os
import shutil
import tempfile
import time
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

import numpy as np

RESNET50_PARAMETERS = 25_557_032
GiB = 1 << 30
MiB = 1 << 20
# scikit-learn's full solver holds X, its centred copy, LAPACK's Fortran copy of it, Vt (N x n each) and
# workspace: measured 5.0x the float32 trajectory above the baseline at n = 2.5M.
SKLEARN_TRAJECTORY_COPIES = 5.0
# Share of MemAvailable a run may plan to use: other processes on the machine may grow meanwhile.
MEMORY_SAFETY = 0.7


def mem_available() -> int:
    """Bytes the kernel reports as available (free plus reclaimable page cache)."""
    with open("/proc/meminfo") as meminfo:
        for line in meminfo:
            if line.startswith("MemAvailable:"):
                return int(line.split()[1]) * 1024
    raise RuntimeError("no MemAvailable in /proc/meminfo")


def write_trajectory(folder: Path, count: int, n: int, seed: int, chunk: int = 1 << 20) -> list[Path]:
    """``count`` float32 .npy files of ``n`` weights: a decaying random walk plus a smooth low-rank drift.

    Generated column chunk by column chunk from per-chunk seeds (deterministic, memory ``count * chunk``), so no
    process ever holds the whole trajectory.
    """
    paths = [folder / f"ckpt{i:03d}.npy" for i in range(count)]
    files = [np.lib.format.open_memmap(p, mode="w+", dtype=np.float32, shape=(n,)) for p in paths]
    steps_t = np.arange(1, count + 1, dtype=np.float64)
    rank = 6
    # Drift along a few directions, saturating at different speeds (like a learning curve), and a walk whose
    # step shrinks with the learning rate.
    drift = np.stack([0.02 / (j + 1) * (1 - np.exp(-steps_t / (3.0 * (j + 1)))) for j in range(rank)], axis=1)
    step_scale = (2e-3 * 0.97 ** np.arange(count))[:, None].astype(np.float32)
    drift = drift.astype(np.float32)
    for index, a in enumerate(range(0, n, chunk)):
        b = min(a + chunk, n)
        rng = np.random.default_rng([seed, index])
        start = 0.05 * rng.standard_normal(b - a, dtype=np.float32)
        directions = rng.standard_normal((rank, b - a), dtype=np.float32)
        walk = rng.standard_normal((count, b - a), dtype=np.float32)
        walk *= step_scale
        np.cumsum(walk, axis=0, out=walk)
        walk += drift @ directions
        walk += start
        for i, file in enumerate(files):
            file[a:b] = walk[i]
    for file in files:
        file.flush()
    del files
    return paths


def run_child(task: dict) -> dict:
    """One measurement in a fresh spawned process (its ru_maxrss is its own peak)."""
    with ProcessPoolExecutor(max_workers=1, mp_context=multiprocessing.get_context("spawn")) as pool:
        return pool.submit(child, task).result()


def peak_rss() -> int:
    """This process's own peak resident set (VmHWM), in bytes.

    Not ``ru_maxrss``: Linux keeps that across ``execve``, so a spawned child starts with its parent's peak (the
    parent forks, copying its memory map's high-water mark, then execs). VmHWM belongs to the new memory map.
    """
    with open("/proc/self/status") as status:
        for line in status:
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) * 1024
    raise RuntimeError("no VmHWM in /proc/self/status")


def child(task: dict) -> dict:
    # Every child imports the same modules, so the baseline child accounts for them.
    from sklearn.decomposition import PCA

    from trainlib.optim.dim_reduce.pca import fit_pca

    paths, n, k, method = [Path(p) for p in task["paths"]], task["n"], task["k"], task["method"]
    full = n == task["n_file"]

    def load_copy(i: int) -> np.ndarray:
        return np.load(paths[i]) if full else np.array(np.load(paths[i], mmap_mode="r")[:n])

    def load_map(i: int) -> np.ndarray:
        return np.load(paths[i], mmap_mode="r")[:n]

    report: dict = {"method": method}
    start = time.perf_counter()
    if method == "ours in memory":
        result = fit_pca(load_copy, len(paths), n_components=k, in_memory=True)
    elif method == "ours streaming":
        result = fit_pca(load_map, len(paths), n_components=k, in_memory=False)
    elif method == "sklearn":
        matrix = np.empty((len(paths), n), dtype=np.float32)
        for i in range(len(paths)):
            matrix[i] = load_map(i)
        report["load_seconds"] = time.perf_counter() - start
        result = PCA(n_components=k, svd_solver="full").fit(matrix)
        del matrix
    elif method != "baseline":
        raise ValueError(method)
    report["seconds"] = time.perf_counter() - start
    report["maxrss"] = peak_rss()
    if method.startswith("ours"):
        np.save(task["out"], result.components)
        report.update(
            explained_variance=result.explained_variance.tolist(),
            ratio=result.explained_variance_ratio.tolist(),
            orthonormality_error=result.orthonormality_error,
        )
    elif method == "sklearn":
        np.save(task["out"], result.components_)
        report.update(
            explained_variance=result.explained_variance_.astype(float).tolist(),
            ratio=result.explained_variance_ratio_.astype(float).tolist(),
        )
    return report


def compare(path_a: Path, path_b: Path, chunk: int = 1 << 20) -> float:
    """Largest principal angle (radians) between the row spaces of two saved (k, n) matrices.

    Streams both from memory maps; sin^2 of the angles are the eigenvalues of R R^T for R = A - (A B^T) B,
    assembled from k x k float64 products so that nothing of size n is held.
    """
    a_map, b_map = np.load(path_a, mmap_mode="r"), np.load(path_b, mmap_mode="r")
    k = a_map.shape[0]
    aa, bb, ab = np.zeros((k, k)), np.zeros((k, k)), np.zeros((k, k))
    for start in range(0, a_map.shape[1], chunk):
        a = np.asarray(a_map[:, start : start + chunk], dtype=np.float64)
        b = np.asarray(b_map[:, start : start + chunk], dtype=np.float64)
        aa += a @ a.T
        bb += b @ b.T
        ab += a @ b.T
    residual = aa - ab @ ab.T - ab @ ab.T + ab @ bb @ ab.T
    sine_squared = max(float(np.linalg.eigvalsh((residual + residual.T) / 2).max()), 0.0)
    return float(np.arcsin(min(1.0, np.sqrt(sine_squared))))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--n", type=int, default=RESNET50_PARAMETERS, help="weights per checkpoint")
    parser.add_argument("--checkpoints", type=int, default=60)
    parser.add_argument("--components", type=int, default=32)
    parser.add_argument("--reduced-n", type=int, default=2_500_000, help="weights for the side-by-side run")
    parser.add_argument("--tmpdir", default=None, help="where to write the trajectory (default: system temp)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--skip-streaming", action="store_true")
    args = parser.parse_args()
    n, k = args.n, args.components

    tmp_parent = args.tmpdir or tempfile.gettempdir()
    free = shutil.disk_usage(tmp_parent).free
    count = args.checkpoints
    file_bytes = n * 4 + 128
    if count * file_bytes > 0.9 * free:
        fitting = int(0.9 * free // file_bytes)
        print(
            f"NOTE: {count} files of {file_bytes / MiB:.0f} MB need {count * file_bytes / GiB:.1f} GiB but "
            f"{tmp_parent} has {free / GiB:.1f} GiB free: using {fitting} checkpoints instead."
        )
        count = fitting
    if count <= k:
        raise SystemExit(f"not enough disk for more than {k} checkpoints in {tmp_parent}; free some or pass --tmpdir")

    folder = Path(tempfile.mkdtemp(prefix="pca_trajectory_", dir=tmp_parent))
    try:
        started = time.perf_counter()
        paths = write_trajectory(folder, count, n, args.seed)
        os.sync()  # let write-back finish before anything is timed
        print(
            f"wrote {count} x {n:,} float32 weights ({count * n * 4 / GiB:.2f} GiB) to {folder} "
            f"in {time.perf_counter() - started:.0f} s; {os.cpu_count()} CPUs, "
            f"MemAvailable {mem_available() / GiB:.1f} GiB"
        )
        rows = run_all(args, folder, paths, n, k)
    finally:
        shutil.rmtree(folder, ignore_errors=True)
    print_table(rows, count, k)


def run_all(args: argparse.Namespace, folder: Path, paths: list[Path], n: int, k: int) -> list[dict]:
    count = len(paths)
    common = {"paths": [str(p) for p in paths], "k": k, "n_file": n}
    baseline = run_child({**common, "method": "baseline", "n": n})["maxrss"]
    print(f"baseline process (imports, loaders, no PCA): {baseline / MiB:.0f} MB")
    rows: list[dict] = []

    def measure(method: str, size: int, label: str, reference: dict | None = None, note: str = "") -> dict:
        out = folder / f"components_{len(rows)}.npy"
        report = run_child({**common, "method": method, "n": size, "out": str(out)})
        report.update(label=label, n=size, out=out, extra=report["maxrss"] - baseline, traj=count * size * 4)
        if reference is not None:
            angle = compare(out, reference["out"])
            ev, ref_ev = np.asarray(report["explained_variance"]), np.asarray(reference["explained_variance"])
            report["vs"] = f"{angle:.1e} rad, {np.abs(ev / ref_ev - 1).max():.1e} vs {reference['label']}"
        report["note"] = note
        rows.append(report)
        print(f"  done: {label} at n={size:,} in {report['seconds']:.1f} s")
        return report

    trajectory = count * n * 4
    available = mem_available()
    full_ours = None
    if 1.2 * trajectory < MEMORY_SAFETY * available:
        full_ours = measure("ours in memory", n, "ours in_memory=True")
    else:
        print(f"SKIPPED ours in_memory=True at full size: needs ~{1.2 * trajectory / GiB:.1f} GiB")
    if not args.skip_streaming:
        measure("ours streaming", n, "ours in_memory=False (mmap)", full_ours)

    sklearn_need = SKLEARN_TRAJECTORY_COPIES * trajectory
    sklearn_full = sklearn_need < MEMORY_SAFETY * available
    if sklearn_full:
        measure("sklearn", n, "sklearn PCA full (float32)", full_ours)
    else:
        print(
            f"SKIPPED scikit-learn at full size: PCA(svd_solver='full') holds about {SKLEARN_TRAJECTORY_COPIES}x the "
            f"trajectory (X, centred copy, LAPACK copy, Vt, workspace) = ~{sklearn_need / GiB:.0f} GiB, more than "
            f"{MEMORY_SAFETY:.0%} of the {available / GiB:.1f} GiB available; comparing at n={args.reduced_n:,}."
        )
    if not sklearn_full and args.reduced_n < n:
        reduced = measure("ours in memory", args.reduced_n, "ours in_memory=True")
        sk = measure("sklearn", args.reduced_n, "sklearn PCA full (float32)", reduced)
        ratio = sk["seconds"] / reduced["seconds"]
        sk["note"] = f"sklearn / ours time: {ratio:.1f}x (of which loading the files: {sk['load_seconds']:.1f} s)"
    return rows


def print_table(rows: list[dict], count: int, k: int) -> None:
    header = (
        f"{'method':<28} {'n':>11} {'N':>3} {'k':>3} {'seconds':>8} {'peak MB':>8} {'extra MB':>8} "
        f"{'extra/traj':>10}  vs reference (max principal angle, max rel. diff of explained variance)"
    )
    print()
    print(header)
    print("-" * len(header))
    for row in rows:
        print(
            f"{row['label']:<28} {row['n']:>11,} {count:>3} {k:>3} {row['seconds']:>8.1f} "
            f"{row['maxrss'] / MiB:>8.0f} {row['extra'] / MiB:>8.0f} {row['extra'] / row['traj']:>10.3f}  "
            f"{row.get('vs', '-')}"
        )
        if row["note"]:
            print(f"{'':<28} {row['note']}")
    for row in rows:
        if row["label"].startswith("ours") and "orthonormality_error" in row:
            print(
                f"{row['label']} n={row['n']:,}: max |P P^T - I| = {row['orthonormality_error']:.1e}, "
                f"{k} components explain {sum(row['ratio']):.4f} of the variance"
            )
    goals = [r for r in rows if r["label"] == "ours in_memory=True" and r is rows[0]]
    for row in goals:
        print(
            f"goals at full size (ours in_memory=True): {row['seconds']:.1f} s <= 60 s: "
            f"{'met' if row['seconds'] <= 60 else 'MISSED'}; peak / trajectory {row['extra'] / row['traj']:.3f} "
            f"<= 1.5: {'met' if row['extra'] / row['traj'] <= 1.5 else 'MISSED'}"
        )


if __name__ == "__main__":
    main()
