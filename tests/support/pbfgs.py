"""A dense network, an orthonormal projection and batches for the P-BFGS tests, with the recipe's constants."""

from __future__ import annotations

import mindspore as ms
import numpy as np
from mindspore import nn

from trainlib.optim.dim_reduce.pbfgs import PBFGSConfig

IN, OUT, BATCH = 6, 3, 8
# the recipe's constants (conf/base/parameters_dim_reduce.yml) with loss scale 1; tests replace what they vary
RECIPE = PBFGSConfig(rho=0.55, max_trials=2, sigma=0.4, gamma=0.9, alpha=0.001, loss_scale=1.0)


def orthonormal_rows(k: int, n: int, seed: int) -> np.ndarray:
    q, _ = np.linalg.qr(np.random.default_rng(seed).standard_normal((n, k)))
    return q.T.astype(np.float32)


def dense_net(seed: int = 0) -> nn.Dense:
    rng = np.random.default_rng(seed)
    net = nn.Dense(IN, OUT)
    net.weight.set_data(ms.Tensor(rng.standard_normal((OUT, IN)).astype(np.float32)))
    net.bias.set_data(ms.Tensor(rng.standard_normal(OUT).astype(np.float32) * 0.1))
    return net


def batches(n: int, seed: int = 1) -> list[tuple[np.ndarray, np.ndarray]]:
    rng = np.random.default_rng(seed)
    return [
        (rng.standard_normal((BATCH, IN)).astype(np.float32), rng.integers(0, OUT, BATCH).astype(np.int32))
        for _ in range(n)
    ]
