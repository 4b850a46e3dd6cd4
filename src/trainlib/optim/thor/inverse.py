"""``compute_method: inverse`` (THOR's, and kfac-pytorch's ``KFACInverseLayer``): per layer the damped inverses of A
and G, full or as diagonal blocks, and the direction ``G^-1 grad A^-1``. The damping: the package docstring and, for
``damping_method``, see docs/recipes.md, section "THOR's options"; ``linalg.damped_inverse`` computes it."""

from __future__ import annotations

import mindspore as ms
import numpy as np
from mindspore import nn, ops

from trainlib.distributed.collectives import MeanOverRanks
from trainlib.optim.thor.capture import CapturedLayer
from trainlib.optim.thor.curvature import Curvature
from trainlib.optim.thor.linalg import apply_left, apply_right, blocking, blocks_to_dense, damped_inverse, factored_pi


class _LayerInverses(nn.Cell):
    """One layer's damped inverses ``(A^-1, G^-1)`` of its rank-mean statistics: the trace rule's per-layer refresh,
    compiled once per pair of statistic shapes. ``factored``: the shifts scaled by pi and 1/pi."""

    def __init__(self, block_size: int | None, method: str, rank_size: int, factored: bool):
        super().__init__(auto_prefix=False)
        self.block_size = block_size
        self.method = method
        self.factored = factored
        self.mean_over_ranks = MeanOverRanks(rank_size)

    def construct(self, a, g, damping, positions):
        a = self.mean_over_ranks(a)
        g = self.mean_over_ranks(g)
        if self.factored:
            pi = factored_pi(a, g)
            return (
                damped_inverse(a, damping, positions, self.block_size, self.method, pi),
                damped_inverse(g, damping, positions, self.block_size, self.method, 1.0 / pi),
            )
        return (
            damped_inverse(a, damping, positions, self.block_size, self.method),
            damped_inverse(g, damping, positions, self.block_size, self.method),
        )


class InverseMethod(Curvature):
    """The damped inverses of every layer's A and G (``thor_a_inv.<layer>``, ``thor_g_inv.<layer>``, each
    ``(blocks, b, b)``: ``linalg.block_inverse``), inverted by ``inverse_method`` over diagonal blocks of
    ``block_size`` (None: the full factors)."""

    def __init__(
        self,
        wrappers: list[CapturedLayer],
        layer_names: list[str],
        rank_size: int,
        factored: bool,
        *,
        block_size: int | None,
        inverse_method: str,
    ):
        super().__init__(wrappers, layer_names, rank_size, factored)
        self.block_size = block_size
        self.inverse_method = inverse_method
        self.dims = [(w.in_dim, w.out_dim) for w in wrappers]
        pairs = list(zip(self.dims, layer_names, strict=True))
        self.a_inv = ms.ParameterTuple([self._inverse_buffer(a, f"thor_a_inv.{name}") for (a, _), name in pairs])
        self.g_inv = ms.ParameterTuple([self._inverse_buffer(g, f"thor_g_inv.{name}") for (_, g), name in pairs])
        self.layer_inverses = _LayerInverses(block_size, inverse_method, rank_size, factored)

    def _inverse_buffer(self, n: int, name: str) -> ms.Parameter:
        blocks, size = blocking(n, self.block_size)
        return ms.Parameter(ms.Tensor(np.zeros((blocks, size, size), np.float32)), name=name, requires_grad=False)

    def refresh(self, i, grad, damping):
        """Damped inverses of layer ``i`` from this step's statistics, stored; returns (A^-1, G^-1) blocks."""
        a, g, positions = self.statistics(i, grad)
        if self.factored:
            pi = factored_pi(a, g)
            a_inv = damped_inverse(a, damping, positions, self.block_size, self.inverse_method, pi)
            g_inv = damped_inverse(g, damping, positions, self.block_size, self.inverse_method, 1.0 / pi)
        else:
            a_inv = damped_inverse(a, damping, positions, self.block_size, self.inverse_method)
            g_inv = damped_inverse(g, damping, positions, self.block_size, self.inverse_method)
        ops.assign(self.a_inv[i], a_inv)
        ops.assign(self.g_inv[i], g_inv)
        return a_inv, g_inv

    def apply(self, curvature, matrix):
        """``G^-1 matrix A^-1`` for ``curvature`` (A^-1, G^-1) and a ``C_out x n`` gradient matrix."""
        a_inv, g_inv = curvature
        return apply_left(g_inv, apply_right(matrix, a_inv))

    def apply_stored(self, i, matrix):
        """``apply`` with layer ``i``'s inverses of the last refresh."""
        return apply_left(self.g_inv[i], apply_right(matrix, self.a_inv[i]))

    def refresh_layer(self, i: int, damping: ms.Tensor) -> None:
        """Outside a step (the trace rule): layer ``i``'s inverses from its captured statistics, stored."""
        a_inv, g_inv = self.layer_inverses(self.a_stats[i], self.g_stats[i], damping, self.positions[i])
        self.a_inv[i].set_data(a_inv)
        self.g_inv[i].set_data(g_inv)

    def state_params(self) -> list[ms.Parameter]:
        return [*self.a_inv, *self.g_inv]

    def dense_inverses(self) -> dict[str, tuple[np.ndarray, np.ndarray]]:
        """Per layer: the stored A and G inverses as dense numpy matrices."""
        return {
            name: (blocks_to_dense(a.asnumpy(), a_dim), blocks_to_dense(g.asnumpy(), g_dim))
            for name, (a_dim, g_dim), a, g in zip(self.layer_names, self.dims, self.a_inv, self.g_inv, strict=True)
        }
