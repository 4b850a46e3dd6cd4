"""Trajectory PCA against scikit-learn, its two memory modes, checkpoint files and clear errors."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest
from sklearn.decomposition import PCA

from trainlib.engine.checkpoint import Checkpoint, CheckpointError, save_checkpoint
from trainlib.optim.dim_reduce.pca import (
    TrajectoryPCA,
    explained_variance_table,
    fit_pca,
    fit_trajectory_pca,
    flatten_params,
)

N, n, K = 12, 500, 4


def trajectory(
    count: int = N,
    size: int = n,
    seed: int = 0,
    scales: tuple[float, ...] = (8.0, 5.0, 3.0, 2.0, 1.0),
    walk: float = 0.2,
    offset: float = 0.5,
) -> np.ndarray:
    """Float32 (count, size): low-rank drift with well separated scales, a small random walk and a non-zero mean."""
    rng = np.random.default_rng(seed)
    directions = rng.standard_normal((len(scales), size))
    drift = (rng.standard_normal((count, len(scales))) * np.asarray(scales)) @ directions
    steps = np.cumsum(walk * rng.standard_normal((count, size)), axis=0)
    return (offset + drift + steps).astype(np.float32)


def fit_rows(x: np.ndarray, k: int = K, **kwargs) -> TrajectoryPCA:
    return fit_pca(lambda i: x[i], x.shape[0], n_components=k, **kwargs)


def sklearn_pca(x: np.ndarray, k: int = K) -> PCA:
    # float64 input: the reference is then exact for the float32 values both methods see.
    return PCA(n_components=k, svd_solver="full").fit(x.astype(np.float64))


def max_principal_angle(a: np.ndarray, b: np.ndarray) -> float:
    """Largest principal angle (radians) between the row spaces of two matrices with orthonormal rows.

    From the sines (the part of ``a`` outside ``b``'s row space): arccos of cosines near 1 would turn float32
    rounding of 1e-9 into angles of 1e-5.
    """
    a, b = a.astype(np.float64), b.astype(np.float64)
    outside = a - (a @ b.T) @ b
    return float(np.arcsin(min(1.0, np.linalg.norm(outside, 2))))


@pytest.mark.parametrize("in_memory", [True, False], ids=["in_memory", "streaming"])
def test_matches_sklearn_pca(in_memory):
    x = trajectory()
    ours = fit_rows(x, in_memory=in_memory)
    ref = sklearn_pca(x)
    assert ours.components.shape == (K, n) and ours.components.dtype == np.float32
    assert ours.mean.shape == (n,) and ours.mean.dtype == np.float32
    assert max_principal_angle(ours.components, ref.components_) < 1e-5
    projection = ours.components.T.astype(np.float64) @ ours.components
    np.testing.assert_allclose(projection, ref.components_.T @ ref.components_, atol=1e-5)
    np.testing.assert_allclose(ours.explained_variance, ref.explained_variance_, rtol=1e-4)
    np.testing.assert_allclose(ours.explained_variance_ratio, ref.explained_variance_ratio_, rtol=1e-4)
    np.testing.assert_allclose(ours.singular_values, ref.singular_values_, rtol=1e-4)
    np.testing.assert_allclose(ours.mean, ref.mean_, rtol=0, atol=1e-5)
    # Same sign convention as scikit-learn, so even the individual rows agree.
    np.testing.assert_allclose(ours.components, ref.components_, atol=1e-5)


def test_rows_are_orthonormal_and_the_error_is_reported():
    ours = fit_rows(trajectory())
    gram = ours.components.astype(np.float64) @ ours.components.T.astype(np.float64)
    np.testing.assert_allclose(gram, np.eye(K), atol=1e-5)
    assert 0 <= ours.orthonormality_error < 1e-5
    assert ours.orthonormality_error == pytest.approx(np.abs(gram - np.eye(K)).max(), abs=1e-6)


def test_tiny_components_on_a_large_mean_stay_orthonormal_and_accurate():
    # Weights near 10 whose third direction moves 1e-4 as far as the first (variance ratio 1e-8): a float32
    # projection would lose orthonormality here (error ~ eps32 * N * 1e4), the float64 one does not.
    x = trajectory(scales=(1.0, 1e-2, 1e-4), walk=0.0, offset=10.0)
    ours = fit_rows(x, k=3)
    ref = sklearn_pca(x, k=3)
    assert ref.explained_variance_ratio_[2] < 1e-7
    assert ours.orthonormality_error < 1e-5
    assert max_principal_angle(ours.components, ref.components_) < 1e-4
    np.testing.assert_allclose(ours.explained_variance, ref.explained_variance_, rtol=1e-4)


def test_sign_convention_makes_the_largest_entry_of_each_row_positive():
    x = trajectory()
    ours = fit_rows(x)
    rows = np.arange(K)
    assert (ours.components[rows, np.abs(ours.components).argmax(axis=1)] > 0).all()
    # Negating the trajectory leaves the Gram matrix unchanged but flips X_c: only the convention keeps P.
    np.testing.assert_allclose(fit_rows(-x).components, ours.components, atol=1e-6)


@pytest.mark.parametrize(
    ("chunk_size", "block_bytes"),
    [(37, 4 * N * 100), (64, 4 * N * 128), (1000, None), (1, 4 * N * 7)],
    ids=["chunk37-3blocks", "chunk64-4blocks", "one-chunk", "chunk1"],
)
def test_streaming_equals_in_memory_for_chunks_that_do_not_divide_n(chunk_size, block_bytes):
    x = trajectory()
    reference = fit_rows(x)
    calls = {"in_memory": 0, "streaming": 0}

    def loader(mode):
        def load(i):
            calls[mode] += 1
            return x[i]

        return load

    kwargs = {"chunk_size": chunk_size, "block_bytes": block_bytes}
    in_memory = fit_pca(loader("in_memory"), N, n_components=K, in_memory=True, **kwargs)
    streaming = fit_pca(loader("streaming"), N, n_components=K, in_memory=False, **kwargs)
    for result in (in_memory, streaming):
        np.testing.assert_allclose(result.components, reference.components, atol=1e-6)
        np.testing.assert_allclose(result.mean, reference.mean, atol=1e-6)
        np.testing.assert_allclose(result.explained_variance, reference.explained_variance, rtol=1e-9)
        np.testing.assert_allclose(result.explained_variance_ratio, reference.explained_variance_ratio, rtol=1e-9)
    assert calls["in_memory"] == N  # each checkpoint read exactly once
    width = max(chunk_size, (block_bytes or 1 << 30) // (4 * N) // chunk_size * chunk_size)
    passes = -(-n // width)
    assert calls["streaming"] == N * (1 + 2 * passes)


def test_streaming_reads_slices_of_memory_maps(tmp_path):
    x = trajectory()
    paths = []
    for i, row in enumerate(x):
        paths.append(tmp_path / f"w{i}.npy")
        np.save(paths[-1], row)
    result = fit_pca(
        lambda i: np.load(paths[i], mmap_mode="r"), N, n_components=K, in_memory=False, block_bytes=4 * N * 128
    )
    np.testing.assert_allclose(result.components, fit_rows(x).components, atol=1e-6)


@pytest.mark.parametrize("count", [K, K - 1, 1])
def test_needs_more_checkpoints_than_components(count):
    x = trajectory(count=count)
    message = f"need more than n_components checkpoints: got {count} trajectory files for n_components={K}"
    with pytest.raises(ValueError, match=message):
        fit_rows(x)


@pytest.mark.parametrize("in_memory", [True, False], ids=["in_memory", "streaming"])
def test_mismatched_length_names_the_checkpoint(in_memory):
    x = trajectory()
    rows = [x[i] for i in range(N)]
    rows[7] = rows[7][:-1]
    labels = [f"run/epoch{i:02d}.ckpt" for i in range(N)]
    with pytest.raises(ValueError, match=r"run/epoch07\.ckpt has 499 values but run/epoch00\.ckpt has 500"):
        fit_pca(lambda i: rows[i], N, n_components=K, labels=labels, in_memory=in_memory)
    with pytest.raises(ValueError, match="trajectory source 7 has 499 values"):
        fit_pca(lambda i: rows[i], N, n_components=K, in_memory=in_memory)


def test_a_checkpoint_that_is_not_a_flat_vector_is_named():
    x = trajectory()
    with pytest.raises(ValueError, match="trajectory source 0 must be a non-empty flat vector"):
        fit_pca(lambda i: x[i].reshape(20, 25), N, n_components=K)


@pytest.mark.parametrize("bad", [np.nan, np.inf, -np.inf])
@pytest.mark.parametrize("in_memory", [True, False], ids=["in_memory", "streaming"])
def test_non_finite_values_name_the_checkpoint(bad, in_memory):
    x = trajectory()
    x[5, 123] = bad
    x[5, 7] = bad
    labels = [f"ckpt{i}.npy" for i in range(N)]
    with pytest.raises(ValueError, match=r"ckpt5\.npy holds 2 non-finite values"):
        fit_rows(x, labels=labels, in_memory=in_memory)


def test_a_trajectory_spanning_fewer_dimensions_than_requested_is_refused():
    x = trajectory()
    repeated = np.concatenate([x[:3], x[:3], x[:3], x[:3]])  # 12 checkpoints, only 3 distinct: rank 2
    with pytest.raises(ValueError, match="spans only 2 dimensions"):
        fit_rows(repeated)
    assert fit_rows(repeated, k=2).orthonormality_error < 1e-5


def test_flatten_params_concatenates_in_the_given_order_as_float32():
    params = {
        "b": np.arange(6, dtype=np.float64).reshape(2, 3),
        "a": np.array([10.0, 11.0], np.float16),
        "s": np.array(7.0, np.float32),
        "ignored": np.ones(3, np.float32),
    }
    flat = flatten_params(params, ["a", "b", "s"])
    assert flat.dtype == np.float32
    np.testing.assert_array_equal(flat, [10, 11, 0, 1, 2, 3, 4, 5, 7])
    with pytest.raises(KeyError, match="'missing'"):
        flatten_params(params, ["a", "missing"])
    with pytest.raises(ValueError, match="at least one"):
        flatten_params(params, [])


SHAPES = {"stem.weight": (4, 3, 3), "stem.bias": (4,), "fc.weight": (5, 12), "fc.bias": (5,)}
NAMES = ["stem.weight", "stem.bias", "fc.weight", "fc.bias"]


def write_trajectory(folder, count: int = 9) -> tuple[list, np.ndarray]:
    """``count`` .ckpt files with the parameters of SHAPES (plus optimizer state), and their flattened rows."""
    size = sum(int(np.prod(s)) for s in SHAPES.values())
    rows = trajectory(count=count, size=size, seed=3)
    paths = []
    for i, row in enumerate(rows):
        params, start = {}, 0
        for name in NAMES:
            stop = start + int(np.prod(SHAPES[name]))
            params[name] = row[start:stop].reshape(SHAPES[name])
            start = stop
        params["optimizer.moments.fc.bias"] = np.full(5, float(i), np.float32)
        paths.append(folder / f"epoch{i:02d}.ckpt")
        save_checkpoint(Checkpoint(params, {"epoch": i}), paths[-1])
    return paths, rows


@pytest.mark.parametrize("in_memory", [True, False], ids=["in_memory", "streaming"])
def test_fit_trajectory_pca_on_checkpoint_files_matches_the_arrays(tmp_path, in_memory):
    paths, rows = write_trajectory(tmp_path)
    from_files = fit_trajectory_pca(paths, NAMES, n_components=3, in_memory=in_memory, block_bytes=4 * len(paths) * 40)
    from_arrays = fit_rows(rows, k=3)
    np.testing.assert_array_equal(from_files.mean, from_arrays.mean)
    np.testing.assert_allclose(from_files.components, from_arrays.components, atol=1e-6)
    np.testing.assert_allclose(from_files.explained_variance, from_arrays.explained_variance, rtol=1e-9)
    assert from_files.n_checkpoints == len(paths)


def test_a_truncated_checkpoint_raises_checkpoint_error_naming_it(tmp_path):
    paths, _ = write_trajectory(tmp_path)
    data = paths[4].read_bytes()
    paths[4].write_bytes(data[: len(data) // 2])
    with pytest.raises(CheckpointError) as error:
        fit_trajectory_pca(paths, NAMES, n_components=3)
    assert str(paths[4]) in str(error.value)


def test_a_checkpoint_missing_a_parameter_raises_checkpoint_error_naming_it(tmp_path):
    paths, _ = write_trajectory(tmp_path)
    with pytest.raises(CheckpointError, match=r"epoch00\.ckpt lacks trajectory parameters: .*'layer9\.weight'"):
        fit_trajectory_pca(paths, [*NAMES, "layer9.weight"], n_components=3)


def test_too_few_checkpoint_files_fail_before_reading_any(tmp_path):
    paths = [tmp_path / f"never_written{i}.ckpt" for i in range(3)]
    with pytest.raises(ValueError, match="got 3 trajectory files for n_components=3"):
        fit_trajectory_pca(paths, NAMES, n_components=3)


def test_explained_variance_table_has_cumulative_ratios():
    result = fit_rows(trajectory())
    table = explained_variance_table(result)
    assert isinstance(table, pd.DataFrame)
    assert list(table.columns) == ["component", "explained_variance", "explained_variance_ratio", "cumulative_ratio"]
    assert table["component"].tolist() == [1, 2, 3, 4]
    np.testing.assert_allclose(table["explained_variance"], result.explained_variance)
    np.testing.assert_allclose(table["cumulative_ratio"], np.cumsum(result.explained_variance_ratio))
    assert table["cumulative_ratio"].is_monotonic_increasing
    assert 0.9 < table["cumulative_ratio"].iloc[-1] <= 1.0


def test_the_report_draws_the_table_of_a_fit():
    from trainlib.report.figures import explained_variance_figure

    table = explained_variance_table(fit_rows(trajectory()))
    axes = explained_variance_figure(table).axes[0]
    np.testing.assert_allclose([bar.get_height() for bar in axes.patches], table["explained_variance_ratio"])
    np.testing.assert_allclose(axes.lines[0].get_ydata(), table["cumulative_ratio"])


def test_save_components_writes_the_pca_matrix_for_dim_reduce(tmp_path):
    result = fit_rows(trajectory())
    path = result.save_components(tmp_path / "pca_mat.npy")
    loaded = np.load(path)
    assert loaded.dtype == np.float32 and loaded.shape == (K, n)
    np.testing.assert_array_equal(loaded, result.components)
