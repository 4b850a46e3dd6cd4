"""THOR's preconditioning as it was before the compute methods became cells of their own (commit 7169f73,
``optim/thor/preconditioner.py``'s ``_Precondition``): two parallel loops branching on the option flags. Frozen here,
reading the buffers of today's ``ThorPreconditioner``, so that ``test_compute_methods`` can compare today's compiled
graph and weights with it in the same process (float32 THOR differs between CPUs, so no pinned hash would hold)."""

from __future__ import annotations

import mindspore as ms
from mindspore import nn, ops

from trainlib.distributed.collectives import MeanOverRanks
from trainlib.optim.thor.curvature import scalar_parameter
from trainlib.optim.thor.eigen import EigenMethod
from trainlib.optim.thor.linalg import (
    apply_eigen,
    apply_left,
    apply_right,
    damped_inverse,
    eigen_basis,
    eigen_scale,
    factored_pi,
)
from trainlib.optim.thor.preconditioner import ThorPreconditioner


class LegacyPrecondition(nn.Cell):
    """The former ``_Precondition(preconditioner, second_order)``, its code unchanged but for where it finds the
    buffers (an option that is off gets empty tuples and unused scalars, as the former preconditioner allocated)."""

    def __init__(self, preconditioner: ThorPreconditioner, second_order: bool):
        super().__init__(auto_prefix=False)
        method, graft, clip = preconditioner.method, preconditioner.graft, preconditioner.clip
        eigen = isinstance(method, EigenMethod)
        none = ms.ParameterTuple([])
        self.second_order = second_order
        self.a_inv = none if eigen else method.a_inv
        self.g_inv = none if eigen else method.g_inv
        self.a_stats = preconditioner.a_stats
        self.g_stats = preconditioner.g_stats
        self.positions = preconditioner.positions
        self.layer_of_param = preconditioner.layer_of_param
        self.param_of_layer = preconditioner.param_of_layer
        self.n_layers = len(preconditioner.param_of_layer)
        self.block_size = preconditioner.block_size
        self.inverse_method = preconditioner.inverse_method
        self.mean_over_ranks = MeanOverRanks(preconditioner.rank_size)
        self.factored = preconditioner.damping_method == "factored"
        self.eigen = eigen
        self.a_vectors = method.a_vectors if eigen else none
        self.g_vectors = method.g_vectors if eigen else none
        self.eigen_scales = method.eigen_scales if eigen else none
        self.kl_clip = preconditioner.kl_clip
        self.step_lr = clip.step_lr if clip is not None else scalar_parameter("legacy_step_lr")
        self.adam_graft = preconditioner.adam_graft
        self.graft_m = graft.graft_m if graft is not None else none
        self.graft_v = graft.graft_v if graft is not None else none
        self.graft_step = graft.graft_step if graft is not None else scalar_parameter("legacy_graft_step")
        self.graft_scales = graft.graft_scales if graft is not None else none
        self.clip_factor = clip.clip_factor if clip is not None else scalar_parameter("legacy_clip_factor")

    def _statistics(self, i, grad):
        a = self.mean_over_ranks(ops.depend(self.a_stats[i], grad))
        g = self.mean_over_ranks(ops.depend(self.g_stats[i], grad))
        positions = ops.depend(self.positions[i], grad)
        return a, g, positions

    def _refresh(self, i, grad, damping):
        a, g, positions = self._statistics(i, grad)
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

    def _refresh_eigen(self, i, grad, damping):
        a, g, positions = self._statistics(i, grad)
        a_values, a_vectors = eigen_basis(a)
        g_values, g_vectors = eigen_basis(g)
        pi = factored_pi(a, g) if self.factored else None
        scale = eigen_scale(a_values, g_values, damping, positions, pi)
        ops.assign(self.a_vectors[i], a_vectors)
        ops.assign(self.g_vectors[i], g_vectors)
        ops.assign(self.eigen_scales[i], scale)
        return a_vectors, g_vectors, scale

    def construct(self, grads, damping):
        if self.eigen or self.kl_clip is not None or self.adam_graft is not None:
            return self._with_options(grads, damping)
        fresh_a = ()
        fresh_g = ()
        if self.second_order:
            for i in range(self.n_layers):
                a_inv, g_inv = self._refresh(i, grads[self.param_of_layer[i]], damping)
                fresh_a += (a_inv,)
                fresh_g += (g_inv,)
        directions = ()
        for j, grad in enumerate(grads):
            layer = self.layer_of_param[j]
            direction = grad
            if layer >= 0:
                if self.second_order:
                    a_inv = fresh_a[layer]
                    g_inv = fresh_g[layer]
                else:
                    a_inv = self.a_inv[layer]
                    g_inv = self.g_inv[layer]
                shape = grad.shape
                matrix = ops.reshape(grad, (shape[0], -1))
                direction = ops.reshape(apply_left(g_inv, apply_right(matrix, a_inv)), shape)
            directions += (direction,)
        return directions

    def _with_options(self, grads, damping):
        fresh = ()
        if self.second_order:
            for i in range(self.n_layers):
                grad = grads[self.param_of_layer[i]]
                fresh += (self._refresh_eigen(i, grad, damping) if self.eigen else self._refresh(i, grad, damping),)
        if self.adam_graft is not None:
            beta1, beta2, eps = self.adam_graft
            graft_step = self.graft_step + 1.0
            ops.assign(self.graft_step, graft_step)
            first_correction = 1.0 - ops.pow(beta1, graft_step)
            second_correction = 1.0 - ops.pow(beta2, graft_step)
        directions = ()
        agreement = 0.0
        for j, grad in enumerate(grads):
            layer = self.layer_of_param[j]
            direction = grad
            if layer >= 0:
                shape = grad.shape
                matrix = ops.reshape(grad, (shape[0], -1))
                if self.eigen:
                    if self.second_order:
                        a_vectors, g_vectors, scale = fresh[layer]
                    else:
                        a_vectors, g_vectors, scale = (
                            self.a_vectors[layer],
                            self.g_vectors[layer],
                            self.eigen_scales[layer],
                        )
                    direction = apply_eigen(matrix, a_vectors, g_vectors, scale)
                else:
                    a_inv, g_inv = fresh[layer] if self.second_order else (self.a_inv[layer], self.g_inv[layer])
                    direction = apply_left(g_inv, apply_right(matrix, a_inv))
                direction = ops.reshape(direction, shape)
                if self.adam_graft is not None:
                    m = beta1 * self.graft_m[layer] + (1.0 - beta1) * grad
                    v = beta2 * self.graft_v[layer] + (1.0 - beta2) * grad * grad
                    ops.assign(self.graft_m[layer], m)
                    ops.assign(self.graft_v[layer], v)
                    adam = (m / first_correction) / (ops.sqrt(v / second_correction) + eps)
                    norm = ops.sqrt(ops.reduce_sum(direction * direction))
                    ratio = ops.sqrt(ops.reduce_sum(adam * adam)) / norm
                    graft_scale = ops.where(norm > 0, ratio, ops.zeros_like(ratio))
                    ops.assign(self.graft_scales[layer], graft_scale)
                    direction = direction * graft_scale
                if self.kl_clip is not None:
                    agreement = agreement + ops.reduce_sum(direction * grad)
            directions += (direction,)
        if self.kl_clip is None:
            return directions
        nu = ops.minimum(ops.sqrt(self.kl_clip / ops.abs(self.step_lr * self.step_lr * agreement)), 1.0)
        ops.assign(self.clip_factor, nu)
        clipped = ()
        for j, direction in enumerate(directions):
            clipped += (direction * nu if self.layer_of_param[j] >= 0 else direction,)
        return clipped
