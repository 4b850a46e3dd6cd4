"""``compute_method: eigen`` (kfac-pytorch's ``KFACEigenLayer``): per layer the eigenbases of A and G and the
reciprocal damped eigenvalues of its Fisher; the maths: docs/recipes.md, section "THOR's options"
(``compute_method``). Full factors only (no blocks, no trace rule), and ``Eigh`` runs on CPU and GPU, not Ascend."""

from __future__ import annotations

import mindspore as ms
import numpy as np
from mindspore import ops

from trainlib.optim.thor.capture import CapturedLayer
from trainlib.optim.thor.curvature import Curvature, zero_buffers
from trainlib.optim.thor.linalg import apply_eigen, eigen_basis, eigen_scale, factored_pi


class EigenMethod(Curvature):
    """Every layer's A and G eigenbases (``thor_a_eigvec.<layer>``, ``thor_g_eigvec.<layer>``) and the reciprocal
    damped eigenvalue products (``thor_eigen_scale.<layer>``, ``C_out x n``)."""

    def __init__(self, wrappers: list[CapturedLayer], layer_names: list[str], rank_size: int, factored: bool):
        super().__init__(wrappers, layer_names, rank_size, factored)
        self.a_vectors = zero_buffers("thor_a_eigvec", [(w.in_dim, w.in_dim) for w in wrappers], layer_names)
        self.g_vectors = zero_buffers("thor_g_eigvec", [(w.out_dim, w.out_dim) for w in wrappers], layer_names)
        self.eigen_scales = zero_buffers("thor_eigen_scale", [(w.out_dim, w.in_dim) for w in wrappers], layer_names)

    def refresh(self, i, grad, damping):
        """Layer ``i``'s eigenbases and reciprocal damped eigenvalues from this step's statistics, stored."""
        a, g, positions = self.statistics(i, grad)
        a_values, a_vectors = eigen_basis(a)
        g_values, g_vectors = eigen_basis(g)
        pi = factored_pi(a, g) if self.factored else None
        scale = eigen_scale(a_values, g_values, damping, positions, pi)
        ops.assign(self.a_vectors[i], a_vectors)
        ops.assign(self.g_vectors[i], g_vectors)
        ops.assign(self.eigen_scales[i], scale)
        return a_vectors, g_vectors, scale

    def apply(self, curvature, matrix):
        """The damped inverse Fisher of ``curvature`` (QA, QG, 1/D) applied to a ``C_out x n`` gradient matrix."""
        a_vectors, g_vectors, scale = curvature
        return apply_eigen(matrix, a_vectors, g_vectors, scale)

    def apply_stored(self, i, matrix):
        """``apply`` with layer ``i``'s eigenbases and scale of the last refresh."""
        return apply_eigen(matrix, self.a_vectors[i], self.g_vectors[i], self.eigen_scales[i])

    def state_params(self) -> list[ms.Parameter]:
        return [*self.a_vectors, *self.g_vectors, *self.eigen_scales]

    def eigenbases(self) -> dict[str, tuple[np.ndarray, np.ndarray, np.ndarray]]:
        """Per layer: the stored A and G eigenbases and reciprocal damped eigenvalues (numpy copies)."""
        return {
            name: (a.asnumpy().copy(), g.asnumpy().copy(), scale.asnumpy().copy())
            for name, a, g, scale in zip(
                self.layer_names, self.a_vectors, self.g_vectors, self.eigen_scales, strict=True
            )
        }
