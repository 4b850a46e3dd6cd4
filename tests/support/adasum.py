"""Adasum's formula in float64 numpy, the reference the tests compare ``optim.adasum``'s cells with."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from trainlib.optim.adasum.combine import check_rank_size


def adasum_pair(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """``(1 - a.b/(2|a|^2)) a + (1 - a.b/(2|b|^2)) b`` in float64, with a ratio of 0 for a zero vector."""
    a64, b64 = np.asarray(a, np.float64), np.asarray(b, np.float64)
    if a64.shape != b64.shape:
        raise ValueError(f"Adasum needs vectors of one shape, got {a64.shape} and {b64.shape}")
    dot, aa, bb = float(np.vdot(a64, b64)), float(np.vdot(a64, a64)), float(np.vdot(b64, b64))
    ratio_a = dot / (2.0 * aa) if aa > 0 else 0.0
    ratio_b = dot / (2.0 * bb) if bb > 0 else 0.0
    return (1.0 - ratio_a) * a64 + (1.0 - ratio_b) * b64


def adasum_reference(vectors: Sequence[np.ndarray]) -> np.ndarray:
    """Adasum of 2^k same-shape arrays (one tensor of each rank), combined recursively in pairs.

    Order: (0, 1), (2, 3), ... first, then the pairs' results in pairs, as MindSpore and Horovod do.
    Computed in float64. For a network, apply it to each parameter tensor separately.
    """
    check_rank_size(len(vectors))
    level = [np.asarray(v, np.float64) for v in vectors]
    while len(level) > 1:
        level = [adasum_pair(level[i], level[i + 1]) for i in range(0, len(level), 2)]
    return level[0]
