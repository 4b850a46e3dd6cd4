"""PCA of a weight trajectory streamed from disk, for DLDR / P-BFGS dimension reduction.

``mindspore.boost``'s dim_reduce takes ``pca_mat_path``: a ``k x n`` float32 ``.npy`` whose rows are
the top-k principal directions of the centred trajectory ``X_c = X - mean`` (rows of ``X`` = the N saved
checkpoints, flattened to n trainable weights). n is in the tens of millions and N in the tens, so the
principal directions come from the N x N Gram matrix ``G = X_c X_c^T`` (eigenpairs ``lambda_i, u_i``)
rather than from an SVD of ``X_c``: ``P = diag(lambda_k)^-1/2 U_k^T X_c``. This is the same P as
scikit-learn's ``PCA(svd_solver="full").components_``, including its sign convention.

Precision: checkpoints are float32 and are kept as loaded; each chunk of columns is cast to float64 and centred
there, for the Gram matrix and again for the projection. ``G`` is thus the Gram matrix of exactly the values
``P`` is projected from, which keeps the rows of ``P`` orthonormal to float32 precision, and the small
components accurate, even when their variance is 1e-8 of the first one's.

Two modes, chosen with ``in_memory``:

- ``in_memory=True`` (default): every checkpoint is loaded once, the next one read on a thread while the last
  is copied in, into one float32 trajectory (N x n: 1.0x the trajectory's float32 size) in its own mapping.
  ``P`` is then written over the trajectory's first k rows, chunk by chunk behind the chunks it is projected
  from, and the other rows' pages go back to the OS: the peak stays near 1.0x plus the float64 mean (2/N x) and
  two loaded checkpoints (2/N x), whatever k is, and ``P`` needs no memory of its own (first touches of fresh
  pages can cost as much as the arithmetic: ``benchmarks/pca_trajectory.py``).
- ``in_memory=False``: for trajectories that do not fit. Pass 1 computes the mean (N loads); then the Gram
  matrix and the projection each gather column ranges of ``block_bytes`` from every checkpoint
  (N loads per range, about ``N * n * 4 / block_bytes`` ranges each). Memory is ``P`` (k x n float32), one
  block, the float64 mean (2/N x) and one loaded checkpoint. Loads that return a memory map
  (``np.load(path, mmap_mode="r")``) read only the slice needed, so all passes together read the trajectory
  about three times; loads that decode a whole file (``.ckpt``) cost a full read per range, so prefer a large
  ``block_bytes`` there, or convert the checkpoints to ``.npy`` first.
"""

from __future__ import annotations

import mmap
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

from trainlib.engine.checkpoint import CheckpointError, load_checkpoint

if TYPE_CHECKING:
    import pandas as pd

Loader = Callable[[int], np.ndarray]

# Columns per float64 work chunk: small enough for N x chunk float64 to stay in cache between the cast, the
# centring and the BLAS call; large enough for BLAS to run at speed.
DEFAULT_CHUNK_SIZE = 1 << 14
STREAMING_BLOCK_BYTES = 1 << 30
# Eigenvalues of G below this fraction of the largest are rounding noise: the trajectory does not span them.
RANK_RTOL = 1e-10
# Rows of P whose Gram matrix is further than this from the identity indicate a numerical failure.
ORTHONORMALITY_TOL = 1e-3


@dataclass(frozen=True, eq=False)
class TrajectoryPCA:
    """Top-k principal directions of a weight trajectory (same definitions as ``sklearn.decomposition.PCA``).

    Attributes:
        components: (k, n) float32, orthonormal rows, ordered by decreasing variance; the entry of largest
            magnitude in each row is positive (scikit-learn's ``svd_flip(u_based_decision=False)``).
        mean: (n,) float32, the mean checkpoint (weight units).
        explained_variance: (k,) float64, variance along each component, eigenvalue / (N - 1)
            (squared weight units).
        explained_variance_ratio: (k,) float64, explained variance / total variance (trace(G) / (N - 1)).
        singular_values: (k,) float64, singular values of the centred trajectory, sqrt(eigenvalue).
        n_checkpoints: N, number of trajectory points the PCA was fitted on.
        orthonormality_error: max |P P^T - I| measured on the float32 ``components``.
    """

    components: np.ndarray
    mean: np.ndarray
    explained_variance: np.ndarray
    explained_variance_ratio: np.ndarray
    singular_values: np.ndarray
    n_checkpoints: int
    orthonormality_error: float

    @property
    def n_components(self) -> int:
        return self.components.shape[0]

    @property
    def n_features(self) -> int:
        return self.components.shape[1]

    def save_components(self, path: str | Path) -> Path:
        """Write ``components`` as a (k, n) float32 ``.npy`` (dim_reduce's ``pca_mat_path``); returns the path."""
        path = Path(path)
        path.parent.mkdir(parents=True, exist_ok=True)
        np.save(path, self.components)
        return path


def flatten_params(params: dict[str, np.ndarray], names: Sequence[str]) -> np.ndarray:
    """Concatenate ``params[name]`` for ``name`` in ``names`` (in that order), raveled, as one float32 vector.

    Raises ``KeyError`` listing the names that ``params`` lacks and ``ValueError`` if ``names`` is empty.
    """
    if not names:
        raise ValueError("names must list at least one parameter to flatten")
    missing = [name for name in names if name not in params]
    if missing:
        raise KeyError(f"parameters not found: {missing[:5]}{' ...' if len(missing) > 5 else ''}")
    return np.concatenate([np.asarray(params[name], dtype=np.float32).ravel() for name in names])


def fit_pca(
    load: Loader,
    n_checkpoints: int,
    *,
    n_components: int,
    labels: Sequence[str] | None = None,
    in_memory: bool = True,
    chunk_size: int = DEFAULT_CHUNK_SIZE,
    block_bytes: int | None = None,
) -> TrajectoryPCA:
    """PCA of the trajectory ``load(0), ..., load(n_checkpoints - 1)`` without holding a float64 copy of it.

    Args:
        load: ``load(i)`` returns checkpoint i as a flat vector of n weights (float32; other dtypes are cast).
            It may return a memory map; with ``in_memory=False`` only the slices needed are then read.
        n_checkpoints: N, number of trajectory points; must exceed ``n_components``.
        n_components: k, number of principal directions to keep.
        labels: names of the checkpoints for error messages (e.g. file paths); default "trajectory source i".
        in_memory: hold the float32 trajectory (about 1.05x its size at peak, including ``components``, which
            are written over it) and load each checkpoint once; ``False`` holds only ``components`` plus one block
            and loads each checkpoint ``1 + 2 * ceil(n / block_columns)`` times, ``block_columns`` being about
            ``block_bytes / (4 * N)`` (see the module docstring).
        chunk_size: columns (weights) per float64 work chunk: memory ``N * chunk_size * 8`` bytes.
        block_bytes: with ``in_memory=False``, bytes of float32 gathered per column block; default 1 GiB (one
            block per pass over the checkpoints). Unused in memory.

    Raises:
        ValueError: N <= k, a checkpoint that is not a flat vector, has a different length from the first or
            holds NaN/inf (naming it), or a trajectory that spans fewer than k dimensions.
    """
    if n_checkpoints <= n_components:
        raise ValueError(
            f"need more than n_components checkpoints: got {n_checkpoints} trajectory files "
            f"for n_components={n_components}"
        )
    if chunk_size < 1:
        raise ValueError(f"chunk_size must be at least 1, got {chunk_size}")
    if labels is not None and len(labels) != n_checkpoints:
        raise ValueError(f"got {len(labels)} labels for {n_checkpoints} checkpoints")
    source = _Source(load, n_checkpoints, labels)
    if in_memory:
        return _fit_in_memory(source, n_components, chunk_size)
    return _fit_streaming(source, n_components, chunk_size, block_bytes or STREAMING_BLOCK_BYTES)


def fit_trajectory_pca(
    paths: Sequence[str | Path],
    names: Sequence[str],
    *,
    n_components: int,
    in_memory: bool = True,
    chunk_size: int = DEFAULT_CHUNK_SIZE,
    block_bytes: int | None = None,
) -> TrajectoryPCA:
    """PCA of the trajectory saved as ``.ckpt`` files, over the parameters ``names`` flattened in that order.

    Each file is read with ``load_checkpoint`` (a missing, truncated or corrupt file raises ``CheckpointError``
    naming it; so does a file that lacks one of ``names``). With ``in_memory=False`` every file is decoded
    again for each column block; see ``fit_pca`` for the other arguments.
    """
    paths = [Path(p) for p in paths]

    def load(i: int) -> np.ndarray:
        checkpoint = load_checkpoint(paths[i])
        try:
            return flatten_params(checkpoint.params, names)
        except KeyError as error:
            raise CheckpointError(f"checkpoint {paths[i]} lacks trajectory parameters: {error.args[0]}") from None

    return fit_pca(
        load,
        len(paths),
        n_components=n_components,
        labels=[str(p) for p in paths],
        in_memory=in_memory,
        chunk_size=chunk_size,
        block_bytes=block_bytes,
    )


def explained_variance_table(result: TrajectoryPCA) -> pd.DataFrame:
    """One row per component: component (1..k), explained_variance, explained_variance_ratio, cumulative_ratio."""
    import pandas as pd

    ratio = np.asarray(result.explained_variance_ratio, dtype=np.float64)
    return pd.DataFrame(
        {
            "component": np.arange(1, ratio.size + 1),
            "explained_variance": np.asarray(result.explained_variance, dtype=np.float64),
            "explained_variance_ratio": ratio,
            "cumulative_ratio": np.cumsum(ratio),
        }
    )


class _Source:
    """The loader with validation: each vector flat, float32, of the first one's length, and finite."""

    def __init__(self, load: Loader, count: int, labels: Sequence[str] | None) -> None:
        self.load = load
        self.count = count
        self.labels = labels

    def label(self, i: int) -> str:
        return self.labels[i] if self.labels is not None else f"trajectory source {i}"

    def get(self, i: int, n: int | None, *, check_finite: bool) -> np.ndarray:
        vector = np.asarray(self.load(i), dtype=np.float32)
        if vector.ndim != 1 or vector.size == 0:
            raise ValueError(f"{self.label(i)} must be a non-empty flat vector, got shape {vector.shape}")
        if n is not None and vector.size != n:
            raise ValueError(
                f"{self.label(i)} has {vector.size} values but {self.label(0)} has {n}: "
                "every checkpoint must flatten to the same length"
            )
        if check_finite and not np.isfinite(vector).all():
            bad = vector.size - int(np.count_nonzero(np.isfinite(vector)))
            raise ValueError(f"{self.label(i)} holds {bad} non-finite values (NaN or inf)")
        return vector


def _spans(length: int, step: int) -> list[tuple[int, int]]:
    return [(a, min(a + step, length)) for a in range(0, length, step)]


def _block_width(n_checkpoints: int, chunk_size: int, block_bytes: int) -> int:
    """Columns per block: a whole number of chunks, at least one."""
    columns = block_bytes // (4 * n_checkpoints)
    return max(chunk_size, columns - columns % chunk_size)


def _centred(block: np.ndarray, c: int, d: int, mean: np.ndarray, work: np.ndarray) -> np.ndarray:
    """Columns ``c:d`` of a float32 (N, width) block minus ``mean[c:d]``, in float64 (a view of ``work``)."""
    chunk = work[:, : d - c]
    chunk[...] = block[:, c:d]
    chunk -= mean[c:d]
    return chunk


def _add_gram(gram: np.ndarray, block: np.ndarray, mean: np.ndarray, work: np.ndarray, chunk_size: int) -> None:
    """``gram += (block - mean) @ (block - mean).T`` in float64, chunk by chunk."""
    for c, d in _spans(block.shape[1], chunk_size):
        chunk = _centred(block, c, d, mean, work)
        gram += chunk @ chunk.T  # numpy turns A @ A.T into a symmetric rank-k update (syrk)


class _Projector:
    """Writes ``components[:, a:b] = weights @ X_c[:, a:b]`` block by block and tracks what the checks need."""

    def __init__(self, weights: np.ndarray, components: np.ndarray, chunk_size: int) -> None:
        k, n_checkpoints = weights.shape
        self.weights = weights
        self.chunk_size = chunk_size
        self.components = components
        self.work = np.empty((n_checkpoints, chunk_size), dtype=np.float64)
        self.out = np.empty((k, chunk_size), dtype=np.float64)
        self.row_gram = np.zeros((k, k), dtype=np.float64)
        self.best_abs = np.full(k, -1.0, dtype=np.float32)
        self.best_sign = np.ones(k, dtype=np.float32)

    def project(self, block: np.ndarray, mean: np.ndarray, start: int) -> None:
        """Columns ``start : start + width`` of the components, from a float32 (N, width) block and its mean."""
        rows = np.arange(self.weights.shape[0])
        for c, d in _spans(block.shape[1], self.chunk_size):
            chunk = _centred(block, c, d, mean, self.work)
            out = self.out[:, : d - c]
            np.matmul(self.weights, chunk, out=out)
            target = self.components[:, start + c : start + d]
            target[...] = out
            # Checked on the float32 values actually returned; float32 products suffice for a 1e-3 tolerance.
            self.row_gram += target @ target.T
            # First occurrence of the largest |entry| in each row, as np.argmax over the whole row would pick.
            where = np.abs(target).argmax(axis=1)
            values = target[rows, where]
            better = np.abs(values) > self.best_abs
            self.best_abs[better] = np.abs(values[better])
            self.best_sign[better] = np.where(values[better] < 0, -1.0, 1.0)

    def finish(self) -> tuple[np.ndarray, float]:
        for row in np.flatnonzero(self.best_sign < 0):
            np.negative(self.components[row], out=self.components[row])
        # Flipping rows flips the signs of row_gram entries, not their magnitude: the error is unchanged.
        error = float(np.abs(self.row_gram - np.eye(self.row_gram.shape[0])).max())
        if not error <= ORTHONORMALITY_TOL:
            raise RuntimeError(f"PCA components are not orthonormal: max |P P^T - I| = {error:.3g}")
        return self.components, error


def _eigen(gram: np.ndarray, n_components: int, n_features: int) -> tuple[np.ndarray, np.ndarray, float]:
    """Top-k eigenpairs of the Gram matrix (decreasing), and its trace; raise if the trajectory spans < k dims."""
    values, vectors = np.linalg.eigh(gram)
    values, vectors = values[::-1], vectors[:, ::-1]
    top = max(float(values[0]), 0.0)
    rank = int(np.count_nonzero(values > RANK_RTOL * top)) if top > 0 else 0
    if rank < n_components or n_features < n_components:
        raise ValueError(
            f"the trajectory spans only {min(rank, n_features)} dimensions (eigenvalues above {RANK_RTOL:g} x the "
            f"largest), fewer than n_components={n_components}: are checkpoints repeated or identical?"
        )
    return values[:n_components].copy(), np.ascontiguousarray(vectors[:, :n_components]), float(np.trace(gram))


def _result(
    eigenvalues: np.ndarray,
    total: float,
    components: np.ndarray,
    mean: np.ndarray,
    n_checkpoints: int,
    error: float,
) -> TrajectoryPCA:
    return TrajectoryPCA(
        components=components,
        mean=mean.astype(np.float32),
        explained_variance=eigenvalues / (n_checkpoints - 1),
        explained_variance_ratio=eigenvalues / total,
        singular_values=np.sqrt(eigenvalues),
        n_checkpoints=n_checkpoints,
        orthonormality_error=error,
    )


def _fit_in_memory(source: _Source, n_components: int, chunk_size: int) -> TrajectoryPCA:
    count = source.count
    first = source.get(0, None, check_finite=True)
    n = first.size
    storage, trajectory = _anonymous_matrix(count, n)
    trajectory[0] = first
    del first
    with ThreadPoolExecutor(max_workers=1) as reader:
        # One load ahead: the next file is read (and checked) while this one is copied in.
        pending = reader.submit(source.get, 1, n, check_finite=True) if count > 1 else None
        for i in range(1, count):
            vector = pending.result()
            pending = reader.submit(source.get, i + 1, n, check_finite=True) if i + 1 < count else None
            trajectory[i] = vector
            del vector

    mean = np.empty(n, dtype=np.float64)
    gram = np.zeros((count, count), dtype=np.float64)
    work = np.empty((count, chunk_size), dtype=np.float64)
    for c, d in _spans(n, chunk_size):
        chunk = work[:, : d - c]
        chunk[...] = trajectory[:, c:d]
        # Sums rows in order, like the streaming mode's running sum, so both modes get the same mean.
        column_mean = np.add.reduce(chunk, axis=0)
        column_mean /= count
        mean[c:d] = column_mean
        chunk -= column_mean
        gram += chunk @ chunk.T

    eigenvalues, vectors, total = _eigen(gram, n_components, n)
    # P overwrites the trajectory's first k rows: each chunk of columns is copied to float64 before its
    # components are written, and later chunks lie in other columns, so nothing is read after it is overwritten.
    projector = _Projector((vectors / np.sqrt(eigenvalues)).T.copy(), trajectory[:n_components], chunk_size)
    projector.project(trajectory, mean, 0)
    components, error = projector.finish()
    _release_from(storage, components.nbytes)
    return _result(eigenvalues, total, components, mean, count, error)


def _anonymous_matrix(rows: int, columns: int) -> tuple[mmap.mmap, np.ndarray]:
    """A (rows, columns) float32 matrix in its own anonymous mapping, and that mapping (see ``_release_from``).

    Transparent huge pages, where the kernel offers them on request, make the first touch of gigabytes several
    times faster than 4 KiB pages (numpy asks for them on its own large arrays in the same way).
    """
    storage = mmap.mmap(-1, rows * columns * 4)
    if hasattr(mmap, "MADV_HUGEPAGE"):
        storage.madvise(mmap.MADV_HUGEPAGE)
    return storage, np.frombuffer(storage, dtype=np.float32).reshape(rows, columns)


def _release_from(storage: mmap.mmap, keep: int) -> None:
    """Give the pages of ``storage`` after its first ``keep`` bytes back to the OS (they read as zeros after)."""
    start = -(-keep // mmap.PAGESIZE) * mmap.PAGESIZE
    if start < len(storage):
        storage.madvise(mmap.MADV_DONTNEED, start, len(storage) - start)


def _fit_streaming(source: _Source, n_components: int, chunk_size: int, block_bytes: int) -> TrajectoryPCA:
    count = source.count
    total_sum: np.ndarray | None = None
    n: int | None = None
    for i in range(count):
        vector = source.get(i, n, check_finite=True)
        if total_sum is None:
            n = vector.size
            total_sum = np.zeros(n, dtype=np.float64)
        total_sum += vector
        del vector
    mean = total_sum
    mean /= count

    width = _block_width(count, chunk_size, block_bytes)
    spans = _spans(n, width)
    block_store = np.empty((count, min(width, n)), dtype=np.float32)

    def gather(a: int, b: int) -> np.ndarray:
        block = block_store[:, : b - a]
        for i in range(count):
            # Finiteness was checked in the mean pass; here only the slice is read (cheap for memory maps).
            vector = source.get(i, n, check_finite=False)
            block[i] = vector[a:b]
            del vector
        return block

    gram = np.zeros((count, count), dtype=np.float64)
    work = np.empty((count, chunk_size), dtype=np.float64)
    for a, b in spans:
        _add_gram(gram, gather(a, b), mean[a:b], work, chunk_size)
    del work

    eigenvalues, vectors, total = _eigen(gram, n_components, n)
    projector = _Projector(
        (vectors / np.sqrt(eigenvalues)).T.copy(), np.empty((n_components, n), np.float32), chunk_size
    )
    for a, b in spans:
        projector.project(gather(a, b), mean[a:b], a)
    components, error = projector.finish()
    return _result(eigenvalues, total, components, mean, count, error)
