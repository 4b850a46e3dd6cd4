"""Graph-safe linear algebra of THOR (static shapes; usable inside ``Cell.construct``): damped inverses of the
diagonal blocks of a symmetric positive definite matrix, and products with a block-diagonal matrix."""

from __future__ import annotations

import mindspore as ms
import numpy as np
from mindspore import ops
from mindspore.ops.operations.linalg_ops import Eigh

INVERSE_METHODS = ("cholesky", "matrix_inverse")


def blocking(n: int, block_size: int | None) -> tuple[int, int]:
    """(number of blocks, block size) covering an ``n`` square matrix."""
    size = n if block_size is None or block_size >= n else block_size
    return (n + size - 1) // size, size


def block_inverse(matrix, block_size: int | None, method: str):
    """Inverses of the diagonal blocks of the SPD ``matrix`` (n x n), as an (nb, b, b) tensor.

    ``block_size`` None (or >= n): one block, the full inverse. Otherwise blocks of ``block_size``,
    the last padded with the identity. ``method`` "cholesky": ``ops.cholesky``, then
    ``ops.cholesky_solve`` against the identity (batched ``cholesky_inverse`` returns wrong values on
    CPU in MindSpore 2.10, and is 2.5x slower unbatched); "matrix_inverse": ``ops.MatrixInverse``
    (LU), for backends without ``ops.cholesky`` (MindSpore 2.10 documents it for GPU and CPU only).
    """
    n = matrix.shape[0]
    nb, b = blocking(n, block_size)
    pad = nb * b - n
    if pad > 0:
        matrix = ops.pad(matrix, (0, pad, 0, pad)) + ops.pad(ops.eye(pad, pad, ms.float32), (n, 0, n, 0))
    if nb == 1:
        blocks = ops.expand_dims(matrix, 0)
    else:
        grid = ops.reshape(ops.transpose(ops.reshape(matrix, (nb, b, nb, b)), (0, 2, 1, 3)), (nb * nb, b, b))
        blocks = ops.gather(grid, ops.arange(0, nb * nb, nb + 1), 0)
    if method == "matrix_inverse":
        return ops.MatrixInverse()(blocks)
    eye = ops.broadcast_to(ops.eye(b, b, ms.float32), (nb, b, b))
    return ops.cholesky_solve(eye, ops.cholesky(blocks))


def apply_right(matrix, blocks):
    """``matrix @ blockdiag(blocks)`` for ``matrix`` (r, n) and symmetric ``blocks`` (nb, b, b)."""
    nb, b = blocks.shape[0], blocks.shape[1]
    if nb == 1:  # reshape, not blocks[0]: indexing copies slowly on CPU
        return ops.matmul(matrix, ops.reshape(blocks, (b, b)))
    r, n = matrix.shape
    pad = nb * b - n
    if pad > 0:
        matrix = ops.pad(matrix, (0, pad))
    split = ops.transpose(ops.reshape(matrix, (r, nb, b)), (1, 0, 2))
    product = ops.reshape(ops.transpose(ops.bmm(split, blocks), (1, 0, 2)), (r, nb * b))
    return product[:, :n] if pad > 0 else product


def apply_left(blocks, matrix):
    """``blockdiag(blocks) @ matrix`` for ``blocks`` (nb, b, b) and ``matrix`` (n, c)."""
    nb, b = blocks.shape[0], blocks.shape[1]
    if nb == 1:
        return ops.matmul(ops.reshape(blocks, (b, b)), matrix)
    n, c = matrix.shape
    pad = nb * b - n
    if pad > 0:
        matrix = ops.pad(matrix, (0, 0, 0, pad))
    product = ops.reshape(ops.bmm(blocks, ops.reshape(matrix, (nb, b, c))), (nb * b, c))
    return product[:n] if pad > 0 else product


def blocks_to_dense(blocks: np.ndarray, n: int) -> np.ndarray:
    """The n x n block-diagonal matrix of (nb, b, b) ``blocks`` (numpy; padding dropped)."""
    nb, b, _ = blocks.shape
    dense = np.zeros((nb * b, nb * b), blocks.dtype)
    for i in range(nb):
        dense[i * b : (i + 1) * b, i * b : (i + 1) * b] = blocks[i]
    return dense[:n, :n]


def damped_inverse(stat, damping, positions, block_size, method, shift_scale=None):
    """``P^-1/2 (X + sqrt(damping / P) I)^-1`` of a statistic ``X`` (A or G), as ``block_inverse`` blocks;
    ``shift_scale`` (``factored`` damping: pi for A, 1/pi for G) multiplies the shift ``sqrt(damping / P)``."""
    shift = ops.sqrt(damping / positions)
    if shift_scale is not None:
        shift = shift * shift_scale
    damped = stat + shift * ops.eye(stat.shape[0], stat.shape[0], ms.float32)
    return block_inverse(damped, block_size, method) * ops.rsqrt(positions)


def factored_pi(a, g):
    """Martens & Grosse's (2015, sec. 6.3) ``pi = sqrt((tr A / dim A) / (tr G / dim G))``; 1 when either trace is
    not positive (a layer whose output gradient is zero, e.g. before a BatchNorm whose gamma starts at 0: its update
    is zero whatever the split, and an infinite pi would make G's shift 0)."""
    mean_a = ops.trace(a) / a.shape[0]
    mean_g = ops.trace(g) / g.shape[0]
    valid = ops.logical_and(mean_a > 0, mean_g > 0)
    one = ops.ones_like(mean_a)
    return ops.sqrt(ops.where(valid, mean_a / ops.where(valid, mean_g, one), one))


def eigen_basis(stat):
    """(eigenvalues clamped at 0, eigenvectors as columns) of the symmetric statistic ``stat``, in float32, by the
    ``Eigh`` primitive that ``mindspore.scipy.linalg.eigh`` calls (CPU and GPU; eigh itself refuses a Parameter)."""
    values, vectors = Eigh(compute_eigenvectors=True, lower=True)(stat)
    return ops.relu(values), vectors


def eigen_scale(a_values, g_values, damping, positions, pi=None):
    """``1 / (damped eigenvalues)`` of the layer's Fisher ``P A (x) G`` on the eigenbases of G (rows) and A
    (columns): ``P dG dA^T + damping`` (kfac-pytorch's eigen method, the ``fixed`` damping on the products), or
    with ``pi`` (``factored``) ``(sqrt(P) dG + sqrt(damping) / pi) (sqrt(P) dA + pi sqrt(damping))^T``."""
    g_column = ops.expand_dims(g_values, 1)
    a_row = ops.expand_dims(a_values, 0)
    if pi is None:
        return 1.0 / (positions * g_column * a_row + damping)
    root_p, root_damping = ops.sqrt(positions), ops.sqrt(damping)
    return 1.0 / ((root_p * g_column + root_damping / pi) * (root_p * a_row + pi * root_damping))


def apply_eigen(matrix, a_vectors, g_vectors, scale):
    """``QG ((QG^T matrix QA) * scale) QA^T``: ``matrix`` (C_out, n) preconditioned in the factors' eigenbases."""
    rotated = ops.matmul(ops.matmul(g_vectors.T, matrix), a_vectors)
    return ops.matmul(ops.matmul(g_vectors, rotated * scale), a_vectors.T)
