"""P-BFGS: quasi-Newton training in the PCA subspace of a weight trajectory (DLDR, stage 2).

With ``w`` the flattened trainable weights and ``P`` the k x n PCA matrix, each step:

1. ``g`` = gradient / loss_scale (averaged over ranks), ``gk = P g``;
2. BFGS inverse update of ``B`` (k x k) with ``y = gk - gk_prev`` and the last accepted step
   ``s``, only when ``y.s > 1e-20``; ``dk = -B gk``, ``dn = P^T dk``;
3. Armijo line search on the same batch over ``rho^0, rho^1, ...``: accept the first with
   ``L(w + rho dn) < L(w) + sigma rho gk.dk``; if none is accepted the step is 0 and ``B``,
   ``gk_prev`` roll back;
4. residual momentum outside the subspace: ``m = gamma m + (g - P^T gk)``,
   ``w = w + rho dn - alpha m``.

Unlike ``mindspore.boost.DimReduce``: the residual term uses the unscaled gradient (any loss
scale gives the same update), the rank average of the loss is a true division, and the
line-search forward passes leave BatchNorm's moving statistics untouched. The gradient,
projections, trial passes and updates run as compiled MindSpore cells on any backend; in data
parallel the gradient and losses are averaged with AllReduce, so every rank computes the same
k-dimensional quantities and applies the same update. The k x k BFGS algebra runs on the host.
"""

from __future__ import annotations

from dataclasses import dataclass

import mindspore as ms
import numpy as np
from mindspore import nn, ops

from trainlib.distributed.collectives import MeanOverRanks

CURVATURE_EPSILON = 1e-20
STATE_PREFIX = "pbfgs."


@dataclass(frozen=True, kw_only=True)
class PBFGSConfig:
    """P-BFGS's constants (``dim_reduce.stage2`` in conf/ and trainlib.params)."""

    rho: float  # line-search step shrink factor; trials use rho^0, rho^1, ...
    max_trials: int
    sigma: float  # Armijo sufficient-decrease constant
    gamma: float  # residual momentum decay
    alpha: float  # residual momentum step
    loss_scale: float


@dataclass
class StepResult:
    loss: float
    step_size: float  # accepted rho, 0.0 when no trial was accepted
    trials: int
    overflow: bool = False  # the scaled gradients were not finite; the weights were left unchanged


class _ScaledLossAndGrads(nn.Cell):
    """Loss and unscaled gradients of the trainable weights, averaged over ranks."""

    def __init__(self, net_with_loss: nn.Cell, weights, loss_scale: float, rank_size: int):
        super().__init__(auto_prefix=False)
        self.net_with_loss = net_with_loss
        self.weights = weights
        self.loss_scale = ms.Tensor(loss_scale, ms.float32)
        self.mean_over_ranks = MeanOverRanks(rank_size)
        self.value_and_grad = ms.value_and_grad(self._scaled_loss, None, self.weights)

    def _scaled_loss(self, images, labels):
        return self.net_with_loss(images, labels) * self.loss_scale

    def construct(self, images, labels):
        scaled_loss, scaled_grads = self.value_and_grad(images, labels)
        loss = self.mean_over_ranks(scaled_loss / self.loss_scale)
        grads = ()
        for grad in scaled_grads:
            grads += (self.mean_over_ranks(grad / self.loss_scale),)
        return loss, grads


class _TrialLoss(nn.Cell):
    """Training-mode loss at the current weights, averaged over ranks."""

    def __init__(self, net_with_loss: nn.Cell, rank_size: int):
        super().__init__(auto_prefix=False)
        self.net_with_loss = net_with_loss
        self.mean_over_ranks = MeanOverRanks(rank_size)

    def construct(self, images, labels):
        return self.mean_over_ranks(self.net_with_loss(images, labels))


class _Projection(nn.Cell):
    """``P v`` (k x 1) for ``v`` given as a tuple of per-parameter tensors."""

    def __init__(self, blocks: list[ms.Tensor]):
        super().__init__(auto_prefix=False)
        self.blocks = blocks

    def construct(self, tensors):
        total = None
        for block, tensor in zip(self.blocks, tensors):
            part = ops.matmul(block, ops.reshape(tensor, (-1, 1)))
            total = part if total is None else total + part
        return total


class _BackProjection(nn.Cell):
    """``P^T x`` for ``x`` (k x 1), as a tuple of tensors in the parameters' shapes."""

    def __init__(self, blocks: list[ms.Tensor], shapes: list[tuple[int, ...]]):
        super().__init__(auto_prefix=False)
        self.blocks = blocks
        self.shapes = shapes

    def construct(self, vector):
        row = ops.reshape(vector, (1, -1))
        out = ()
        for block, shape in zip(self.blocks, self.shapes):
            out += (ops.reshape(ops.matmul(row, block), shape),)
        return out


class _Copy(nn.Cell):
    """``targets = sources`` for two parameter tuples."""

    def __init__(self, targets, sources):
        super().__init__(auto_prefix=False)
        self.targets = targets
        self.sources = sources

    def construct(self):
        for target, source in zip(self.targets, self.sources):
            ops.assign(target, source)
        return True


class _SetTrialWeights(nn.Cell):
    """``w = w_start + rho * dn``."""

    def __init__(self, weights, start):
        super().__init__(auto_prefix=False)
        self.weights = weights
        self.start = start

    def construct(self, direction, rho):
        for weight, base, step in zip(self.weights, self.start, direction):
            ops.assign(weight, base + rho * step)
        return True


class _FinalUpdate(nn.Cell):
    """``m = gamma m + (g - P^T gk)``; ``w = w_start + rho dn - alpha m``."""

    def __init__(self, weights, start, momenta, gamma: float, alpha: float):
        super().__init__(auto_prefix=False)
        self.weights = weights
        self.start = start
        self.momenta = momenta
        self.gamma = gamma
        self.alpha = alpha

    def construct(self, grads, grads_in_subspace, direction, rho):
        for weight, base, momentum, grad, grad_k, step in zip(
            self.weights, self.start, self.momenta, grads, grads_in_subspace, direction
        ):
            new_momentum = self.gamma * momentum + (grad - grad_k)
            ops.assign(momentum, new_momentum)
            ops.assign(weight, base + rho * step - self.alpha * new_momentum)
        return True


class PBFGS:
    """Stage-2 trainer: ``step(images, labels)`` performs one P-BFGS update of ``net``'s weights.

    ``pca`` is the k x n float32 projection whose columns follow ``net.trainable_params()``
    order, flattened row-major (the layout ``mindspore.boost`` expects as ``pca_mat_path``).
    """

    def __init__(self, net: nn.Cell, loss_fn: nn.Cell, pca: np.ndarray, config: PBFGSConfig, *, rank_size: int):
        self.config = config
        self.net = net
        self.weights = ms.ParameterTuple(net.trainable_params())
        shapes = [tuple(p.shape) for p in self.weights]
        sizes = [int(np.prod(s)) for s in shapes]
        if pca.ndim != 2 or pca.shape[1] != sum(sizes):
            raise ValueError(
                f"PCA matrix has shape {pca.shape}, but the network has {sum(sizes)} trainable values; "
                "it must be n_components x n for this network"
            )
        self.n_components = pca.shape[0]
        offsets = np.cumsum([0, *sizes])
        blocks = [
            ms.Tensor(np.ascontiguousarray(pca[:, a:b]), ms.float32)
            for a, b in zip(offsets[:-1], offsets[1:], strict=True)
        ]
        net_with_loss = nn.WithLossCell(net, loss_fn)
        self._loss_and_grads = _ScaledLossAndGrads(net_with_loss, self.weights, config.loss_scale, rank_size)
        self._trial_loss = _TrialLoss(net_with_loss, rank_size)
        self._project = _Projection(blocks)
        self._back_project = _BackProjection(blocks, shapes)
        start = self.weights.clone(prefix="pbfgs_start", init="zeros")
        self.momenta = self.weights.clone(prefix="pbfgs_momentum", init="zeros")
        bn_stats = ms.ParameterTuple([p for p in net.get_parameters() if not p.requires_grad])
        bn_saved = bn_stats.clone(prefix="pbfgs_bn", init="zeros")
        self._save_start = _Copy(start, self.weights)
        self._save_bn = _Copy(bn_saved, bn_stats)
        self._restore_bn = _Copy(bn_stats, bn_saved)
        self._set_trial = _SetTrialWeights(self.weights, start)
        self._final_update = _FinalUpdate(self.weights, start, self.momenta, config.gamma, config.alpha)
        k = self.n_components
        self.inverse_hessian = np.eye(k, dtype=np.float32)
        self.last_step = np.zeros((k, 1), np.float32)
        self.last_gk: np.ndarray | None = None
        self.last_result: StepResult | None = None
        net.set_train(True)

    def step(self, images, labels) -> StepResult:
        """One update on this batch; with non-finite (overflowed) gradients nothing changes and ``overflow`` is set."""
        config = self.config
        loss_tensor, grads = self._loss_and_grads(images, labels)
        loss = float(loss_tensor.asnumpy())
        self._save_start()
        self._save_bn()
        # tuples passed to a graph cell are compile-time constants unless marked mutable
        grads = ms.mutable(grads)
        gk = self._project(grads).asnumpy().astype(np.float32)
        if not np.isfinite(gk).all():  # any Inf/NaN gradient reaches every component of P g
            self.last_result = StepResult(loss, 0.0, 0, overflow=True)
            return self.last_result

        previous = (self.inverse_hessian.copy(), self.last_gk)
        if self.last_gk is not None:
            self.inverse_hessian = bfgs_inverse_update(self.inverse_hessian, self.last_step, gk - self.last_gk)
        self.last_gk = gk
        dk = -self.inverse_hessian @ gk
        direction = ms.mutable(self._back_project(ms.Tensor(dk)))
        decrease = (gk.T @ dk).item()

        accepted, trials = 0.0, 0
        for trial in range(config.max_trials):
            rho = config.rho**trial
            trials += 1
            self._set_trial(direction, ms.Tensor(rho, ms.float32))
            trial_loss = float(self._trial_loss(images, labels).asnumpy())
            self._restore_bn()
            if trial_loss < loss + config.sigma * rho * decrease:
                accepted = rho
                self.last_step = (rho * dk).astype(np.float32)
                break
        if accepted == 0.0:
            self.inverse_hessian, self.last_gk = previous

        in_subspace = ms.mutable(self._back_project(ms.Tensor(gk)))
        self._final_update(grads, in_subspace, direction, ms.Tensor(accepted, ms.float32))
        self.last_result = StepResult(loss, accepted, trials)
        return self.last_result

    def state(self) -> dict[str, np.ndarray]:
        """Optimizer state for a checkpoint: B, the last accepted step, the last gk, the momenta."""
        state = {
            STATE_PREFIX + "inverse_hessian": self.inverse_hessian.copy(),
            STATE_PREFIX + "last_step": self.last_step.copy(),
        }
        if self.last_gk is not None:
            state[STATE_PREFIX + "last_gk"] = self.last_gk.copy()
        # asnumpy() shares memory with the parameter on CPU: copy so later steps do not change the state
        state.update({STATE_PREFIX + p.name: p.asnumpy().copy() for p in self.momenta})
        return state

    def load_state(self, state: dict[str, np.ndarray]) -> None:
        self.inverse_hessian = state[STATE_PREFIX + "inverse_hessian"].astype(np.float32)
        self.last_step = state[STATE_PREFIX + "last_step"].astype(np.float32)
        self.last_gk = state.get(STATE_PREFIX + "last_gk")
        for momentum in self.momenta:
            momentum.set_data(ms.Tensor(state[STATE_PREFIX + momentum.name]))


def bfgs_inverse_update(inverse_hessian: np.ndarray, step: np.ndarray, change: np.ndarray) -> np.ndarray:
    """BFGS update of the inverse Hessian: ``(I - r s y^T) B (I - r y s^T) + r s s^T``, ``r = 1 / y.s``.

    Returns ``inverse_hessian`` unchanged when the curvature ``y.s`` is not above 1e-20.
    """
    curvature = (change.T @ step).item()
    if curvature <= CURVATURE_EPSILON:
        return inverse_hessian
    r = 1.0 / curvature
    left = np.eye(len(step), dtype=np.float32) - r * step @ change.T
    return (left @ inverse_hessian @ left.T + r * step @ step.T).astype(np.float32)
