"""``ThorPreconditioner``: the statistics, damped inverses and counters of THOR, and the compiled cells that turn a
step's gradients into THOR directions (every layer refreshed, the stored inverses reused, or per layer by the
trace rule). The maths, the capture and the trace rule are described in the package docstring."""

from __future__ import annotations

import mindspore as ms
import numpy as np
from mindspore import nn, ops

from trainlib.distributed.collectives import MeanOverRanks
from trainlib.optim.thor.capture import set_capture, wrap_layers
from trainlib.optim.thor.linalg import (
    COMPUTE_METHODS,
    DAMPING_METHODS,
    INVERSE_METHODS,
    apply_eigen,
    apply_left,
    apply_right,
    blocking,
    blocks_to_dense,
    damped_inverse,
    eigen_basis,
    eigen_scale,
    factored_pi,
)

STATE_PREFIX = "thor."  # the preconditioner's keys in the optimizer state
COUNTERS = ("steps", "second_order_steps", "reuse_steps", "trace_skips", "inverses_computed")


class _Precondition(nn.Cell):
    """``grads -> THOR directions``; ``second_order`` (static) first refreshes every layer's inverses from this
    step's statistics (the fused step without a trace rule)."""

    def __init__(self, preconditioner: ThorPreconditioner, second_order: bool):
        super().__init__(auto_prefix=False)
        self.second_order = second_order
        self.a_inv = preconditioner.a_inv
        self.g_inv = preconditioner.g_inv
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
        self.eigen = preconditioner.compute_method == "eigen"
        self.a_vectors = preconditioner.a_vectors
        self.g_vectors = preconditioner.g_vectors
        self.eigen_scales = preconditioner.eigen_scales
        self.kl_clip = preconditioner.kl_clip
        self.step_lr = preconditioner.step_lr
        self.adam_graft = preconditioner.adam_graft
        self.graft_m = preconditioner.graft_m
        self.graft_v = preconditioner.graft_v
        self.graft_step = preconditioner.graft_step
        self.graft_scales = preconditioner.graft_scales
        self.clip_factor = preconditioner.clip_factor

    def _statistics(self, i, grad):
        """A, G (rank means) and P of layer ``i``, read once ``grad`` exists (so after the capture)."""
        a = self.mean_over_ranks(ops.depend(self.a_stats[i], grad))
        g = self.mean_over_ranks(ops.depend(self.g_stats[i], grad))
        positions = ops.depend(self.positions[i], grad)
        return a, g, positions

    def _refresh(self, i, grad, damping):
        """Damped inverses of layer ``i`` from this step's statistics, stored; returns (A^-1 blocks, G^-1 blocks)."""
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
        """Eigenbases of layer ``i``'s A and G and the reciprocal damped eigenvalues of its Fisher, stored."""
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
        """``construct`` with the options (``ThorPreconditioner``): the eigen method's directions, then the Adam
        graft per layer, then the kl_clip factor on every preconditioned direction."""
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
        agreement = 0.0  # sum over the preconditioned layers of g . d, for kl_clip
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
        # kfac-pytorch: nu = min(1, sqrt(kl_clip / |lr^2 sum g . d|)) on every preconditioned direction
        nu = ops.minimum(ops.sqrt(self.kl_clip / ops.abs(self.step_lr * self.step_lr * agreement)), 1.0)
        ops.assign(self.clip_factor, nu)
        clipped = ()
        for j, direction in enumerate(directions):
            clipped += (direction * nu if self.layer_of_param[j] >= 0 else direction,)
        return clipped


class _LayerInverse(nn.Cell):
    """One layer's damped inverse (``damped_inverse``) of its rank-mean statistic: the trace rule's per-layer
    refresh, compiled once per statistic shape."""

    def __init__(self, block_size: int | None, method: str, rank_size: int):
        super().__init__(auto_prefix=False)
        self.block_size = block_size
        self.method = method
        self.mean_over_ranks = MeanOverRanks(rank_size)

    def construct(self, stat, damping, positions):
        return damped_inverse(self.mean_over_ranks(stat), damping, positions, self.block_size, self.method)


class _FactoredLayerInverses(nn.Cell):
    """``_LayerInverse`` of ``factored`` damping: both of a layer's inverses, whose shifts share pi."""

    def __init__(self, block_size: int | None, method: str, rank_size: int):
        super().__init__(auto_prefix=False)
        self.block_size = block_size
        self.method = method
        self.mean_over_ranks = MeanOverRanks(rank_size)

    def construct(self, a, g, damping, positions):
        a = self.mean_over_ranks(a)
        g = self.mean_over_ranks(g)
        pi = factored_pi(a, g)
        return (
            damped_inverse(a, damping, positions, self.block_size, self.method, pi),
            damped_inverse(g, damping, positions, self.block_size, self.method, 1.0 / pi),
        )


class _DampedTraces(nn.Cell):
    """Per layer ``t = tr(A + sI) tr(G + sI)`` of this step's rank-mean statistics (the trace rule's measure)."""

    def __init__(self, preconditioner: ThorPreconditioner):
        super().__init__(auto_prefix=False)
        self.a_stats = preconditioner.a_stats
        self.g_stats = preconditioner.g_stats
        self.positions = preconditioner.positions
        self.param_of_layer = preconditioner.param_of_layer
        self.n_layers = len(preconditioner.param_of_layer)
        self.mean_over_ranks = MeanOverRanks(preconditioner.rank_size)

    def construct(self, grads, damping):
        traces = ()
        for i in range(self.n_layers):
            grad = grads[self.param_of_layer[i]]  # the statistics are read once the gradients exist
            a = ops.depend(self.a_stats[i], grad)
            g = ops.depend(self.g_stats[i], grad)
            sqrt_damping = ops.sqrt(damping / ops.depend(self.positions[i], grad))
            trace_a = self.mean_over_ranks(ops.trace(a)) + a.shape[0] * sqrt_damping  # tr of the rank mean
            trace_g = self.mean_over_ranks(ops.trace(g)) + g.shape[0] * sqrt_damping
            traces += (trace_a * trace_g,)
        return ops.stack(traces)


class ThorPreconditioner:
    """THOR's gradient preconditioner (kfac-pytorch's shape): the statistics, inverses and counters of ``net``.

    Wraps every supported layer of ``net`` (in place, see ``wrap_layers``) so that the A/G statistics are captured,
    and holds two compiled cells that turn the gradients of ``net.trainable_params()`` (in that order, unscaled) into
    THOR directions: ``second_order_cell`` (refresh the damped inverses from this step's statistics, then apply them)
    and ``reuse_cell`` (apply the stored ones). ``ThorStep`` picks one per step with ``second_order_now`` and calls
    ``capture`` / ``count_step`` around it. Step ``k`` (counted from 0, continued by ``load_state``) is second-order
    when ``k % frequency == 0`` (or no inverses exist yet); its damping is ``damping[k]`` (the last value past
    the end). ``block_size`` None inverts the full A and G, an int their diagonal blocks (Ascend: 128).
    ``trace_rule`` ``(skip, stop)``, e.g. ``(0.01, 0.001)``, enables the paper's trace rule. ``loss_scale``: the factor
    the differentiated loss carries, removed from G when it is taken. ``inverse_method`` (``block_inverse``): None
    picks "cholesky", or "matrix_inverse" on Ascend. Counters: ``steps``, ``second_order_steps``, ``reuse_steps``,
    ``trace_skips``, ``inverses_computed`` ((layer, step) pairs whose inverses were computed; ``refreshed_layers``
    names those of the last second-order step).

    Options (each off by default: today's THOR, whose graph is then unchanged; the package docstring has the maths):
    ``damping_method`` "fixed" (``sqrt(damping/P)`` added to A and G) or "factored" (that shift times pi for A,
    divided by pi for G); ``compute_method`` "inverse" (damped factor inverses) or "eigen" (eigenbases of A and G,
    the damping on the eigenvalue products; full factors, no trace rule, CPU/GPU); ``kl_clip`` (a bound: every
    preconditioned direction scaled by ``min(1, sqrt(kl_clip / |lr^2 sum g.d|))``); ``adam_graft``
    ``(beta1, beta2, eps)`` (each preconditioned layer's direction rescaled to the norm of the Adam update of its
    gradient; the moments are state). ``last_clip_factor``, ``last_graft_scales`` and ``eigen()`` show them.
    """

    def __init__(
        self,
        net: nn.Cell,
        damping: np.ndarray,
        *,
        loss_scale: float,
        frequency: int,
        block_size: int | None,
        trace_rule: tuple[float, float] | None,
        rank_size: int,
        inverse_method: str | None,
        damping_method: str = "fixed",
        compute_method: str = "inverse",
        kl_clip: float | None = None,
        adam_graft: tuple[float, float, float] | None = None,
    ):
        self.damping = np.asarray(damping, np.float32).ravel()
        if not len(self.damping):
            raise ValueError("damping needs at least one value (one per step)")
        if inverse_method is None:
            inverse_method = "matrix_inverse" if ms.get_context("device_target") == "Ascend" else "cholesky"
        if inverse_method not in INVERSE_METHODS:
            raise ValueError(f"unknown inverse_method {inverse_method!r}; choose one of {INVERSE_METHODS}")
        if damping_method not in DAMPING_METHODS:
            raise ValueError(f"unknown damping_method {damping_method!r}; choose one of {DAMPING_METHODS}")
        if compute_method not in COMPUTE_METHODS:
            raise ValueError(f"unknown compute_method {compute_method!r}; choose one of {COMPUTE_METHODS}")
        if compute_method == "eigen" and (block_size is not None or trace_rule is not None):
            raise ValueError(
                "compute_method eigen decomposes the full factors at every second-order step: "
                "it takes block_size None and no trace_rule"
            )
        if compute_method == "eigen" and ms.get_context("device_target") == "Ascend":
            raise ValueError("compute_method eigen needs MindSpore's Eigh, which runs on CPU and GPU, not Ascend")
        self.damping_method = damping_method
        self.compute_method = compute_method
        self.kl_clip = None if kl_clip is None else float(kl_clip)
        self.adam_graft = None if adam_graft is None else tuple(float(x) for x in adam_graft)
        self.frequency = frequency
        self.block_size = block_size
        self.trace_rule = None if trace_rule is None else (float(trace_rule[0]), float(trace_rule[1]))
        self.rank_size = rank_size
        self.inverse_method = inverse_method

        self.wrappers = wrap_layers(net, float(loss_scale))
        if not self.wrappers:
            raise ValueError("the network has no Conv2d (group 1) or Dense (no activation) layer for THOR")
        weights = net.trainable_params()
        index_of = {id(p): j for j, p in enumerate(weights)}
        self.param_of_layer = tuple(index_of[id(w.layer.weight)] for w in self.wrappers)
        layer_of = dict.fromkeys(range(len(weights)), -1)
        for i, j in enumerate(self.param_of_layer):
            layer_of[j] = i
        self.layer_of_param = tuple(layer_of[j] for j in range(len(weights)))
        self.layer_names = [w.layer.weight.name for w in self.wrappers]

        self.a_stats = ms.ParameterTuple([w.a_stat for w in self.wrappers])
        self.g_stats = ms.ParameterTuple([w.g_stat for w in self.wrappers])
        self.positions = ms.ParameterTuple([w.positions for w in self.wrappers])
        pairs = list(zip(self.wrappers, self.layer_names, strict=True))
        eigen = compute_method == "eigen"
        # the eigen method stores eigenbases and reciprocal damped eigenvalues instead of the inverses
        self.a_inv = ms.ParameterTuple(
            [] if eigen else [self._inverse_param(w.in_dim, f"thor_a_inv.{n}") for w, n in pairs]
        )
        self.g_inv = ms.ParameterTuple(
            [] if eigen else [self._inverse_param(w.out_dim, f"thor_g_inv.{n}") for w, n in pairs]
        )
        square = [(w.in_dim, w.in_dim) for w in self.wrappers] if eigen else []
        self.a_vectors = self._buffers("thor_a_eigvec", square)
        self.g_vectors = self._buffers(
            "thor_g_eigvec", [(w.out_dim, w.out_dim) for w in self.wrappers] if eigen else []
        )
        self.eigen_scales = self._buffers(
            "thor_eigen_scale", [(w.out_dim, w.in_dim) for w in self.wrappers] if eigen else []
        )
        # Adam's moments of each preconditioned weight's gradient, for the graft (optimizer state, checkpointed)
        weight_shapes = [tuple(w.layer.weight.shape) for w in self.wrappers] if adam_graft is not None else []
        self.graft_m = self._buffers("thor_graft_m", weight_shapes)
        self.graft_v = self._buffers("thor_graft_v", weight_shapes)
        self.graft_step = self._scalar_param("thor_graft_step")
        self.step_lr = self._scalar_param("thor_step_lr")  # the step's lr, set by ThorStep for kl_clip (not state)
        # the last step's kl_clip factor and per-layer graft scales (figures, not state)
        self.clip_factor = self._scalar_param("thor_clip_factor")
        self.graft_scales = ms.ParameterTuple(
            [self._scalar_param(f"thor_graft_scale.{n}") for n in self.layer_names] if adam_graft is not None else []
        )
        self.trace_ref = ms.ParameterTuple([self._scalar_param(f"thor_trace_ref.{n}") for n in self.layer_names])
        self.stopped = ms.ParameterTuple([self._scalar_param(f"thor_stopped.{n}") for n in self.layer_names])

        self.second_order_cell = _Precondition(self, second_order=True)
        self.reuse_cell = _Precondition(self, second_order=False)
        self.traces_cell = _DampedTraces(self)
        self.layer_inverse = _LayerInverse(block_size, inverse_method, rank_size)
        self.factored_layer_inverses = _FactoredLayerInverses(block_size, inverse_method, rank_size)
        self.steps = 0
        self.second_order_steps = 0
        self.reuse_steps = 0
        self.trace_skips = 0
        self.inverses_computed = 0
        self.refreshed_layers: list[str] = []  # the layers whose inverses the last second-order step computed
        self._have_inverses = False

    def _inverse_param(self, n: int, name: str) -> ms.Parameter:
        nb, b = blocking(n, self.block_size)
        return ms.Parameter(ms.Tensor(np.zeros((nb, b, b), np.float32)), name=name, requires_grad=False)

    def _buffers(self, kind: str, shapes: list[tuple[int, ...]]) -> ms.ParameterTuple:
        """Zero float32 buffers ``<kind>.<layer>`` of the given shapes (none: an empty tuple)."""
        return ms.ParameterTuple(
            [
                ms.Parameter(ms.Tensor(np.zeros(shape, np.float32)), name=f"{kind}.{name}", requires_grad=False)
                for shape, name in zip(shapes, self.layer_names, strict=False)
            ]
        )

    @staticmethod
    def _scalar_param(name: str) -> ms.Parameter:
        return ms.Parameter(ms.Tensor(0.0, ms.float32), name=name, requires_grad=False)

    @property
    def current_damping(self) -> float:
        """The damping of the next step (of the last step taken, once the schedule is over)."""
        return float(self.damping[min(self.steps, len(self.damping) - 1)])

    def second_order_now(self) -> bool:
        """Whether the next step refreshes the statistics and inverses."""
        return self.steps % self.frequency == 0 or not self._have_inverses

    def capture(self, on: bool) -> None:
        """Statistics capture on (for a second-order step) or off; the flag is read when a cell compiles."""
        set_capture(self.wrappers, on)

    def count_step(self, second_order: bool) -> None:
        """Move the counters past a step (a fused second-order step computed every layer's inverses)."""
        if second_order:
            self.second_order_steps += 1
            self._have_inverses = True
            if self.trace_rule is None:
                self.inverses_computed += len(self.wrappers)
                self.refreshed_layers = list(self.layer_names)
        else:
            self.reuse_steps += 1
        self.steps += 1

    def refresh_by_trace_rule(self, traces: np.ndarray, damping: ms.Tensor) -> None:
        """The trace rule at a second-order step whose statistics are captured: per layer, compare ``traces``
        (``_DampedTraces``) with the trace at its last refresh; compute the inverses of the layers that changed
        by more than ``skip`` (and of layers never computed), keep the others' untouched, stop layers that changed
        by less than ``stop``. Updates ``trace_skips``, ``inverses_computed``, ``refreshed_layers``."""
        skip, stop = self.trace_rule
        refs = np.array([float(p.asnumpy()) for p in self.trace_ref], np.float32)
        stopped = np.array([float(p.asnumpy()) for p in self.stopped], np.float32) > 0.5
        first = refs <= 0.0
        change = np.abs(traces - refs) / np.maximum(refs, np.float32(1e-30))
        update = first | (~stopped & (change > skip))
        stopping = ~first & ~stopped & (change < stop)
        self.refreshed_layers = []
        for i in np.flatnonzero(update):
            wrapper = self.wrappers[i]
            positions = wrapper.positions
            if self.damping_method == "factored":
                a_inv, g_inv = self.factored_layer_inverses(wrapper.a_stat, wrapper.g_stat, damping, positions)
                self.a_inv[i].set_data(a_inv)
                self.g_inv[i].set_data(g_inv)
            else:
                self.a_inv[i].set_data(self.layer_inverse(wrapper.a_stat, damping, positions))
                self.g_inv[i].set_data(self.layer_inverse(wrapper.g_stat, damping, positions))
            self.trace_ref[i].set_data(ms.Tensor(traces[i], ms.float32))
            self.refreshed_layers.append(self.layer_names[i])
        for i in np.flatnonzero(stopping):
            self.stopped[i].set_data(ms.Tensor(1.0, ms.float32))
        self.inverses_computed += int(update.sum())
        self.trace_skips += int((~update).sum())

    @property
    def stopped_layers(self) -> list[str]:
        """Layers the trace rule stopped refreshing for good."""
        return [n for n, p in zip(self.layer_names, self.stopped, strict=True) if float(p.asnumpy()) > 0.5]

    @property
    def last_clip_factor(self) -> float:
        """kl_clip's factor ``nu`` of the last step (0 before the first step with ``kl_clip``)."""
        return float(self.clip_factor.asnumpy())

    @property
    def last_graft_scales(self) -> dict[str, float]:
        """Per layer, the last step's Adam-graft scale ``|adam update| / |THOR direction|`` (empty without it)."""
        return {n: float(p.asnumpy()) for n, p in zip(self.layer_names, self.graft_scales, strict=False)}

    def eigen(self) -> dict[str, tuple[np.ndarray, np.ndarray, np.ndarray]]:
        """Per layer, the eigen method's stored A and G eigenbases and reciprocal damped eigenvalues (or none)."""
        return {
            name: (a.asnumpy().copy(), g.asnumpy().copy(), scale.asnumpy().copy())
            for name, a, g, scale in zip(
                self.layer_names, self.a_vectors, self.g_vectors, self.eigen_scales, strict=False
            )
        }

    def inverses(self) -> dict[str, tuple[np.ndarray, np.ndarray]]:
        """Per layer (weight name): the stored A and G inverses as dense numpy matrices (the eigen method: none)."""
        if self.compute_method == "eigen":
            return {}
        return {
            name: (blocks_to_dense(a.asnumpy(), w.in_dim), blocks_to_dense(g.asnumpy(), w.out_dim))
            for name, w, a, g in zip(self.layer_names, self.wrappers, self.a_inv, self.g_inv, strict=True)
        }

    def statistics(self) -> dict[str, tuple[np.ndarray, np.ndarray]]:
        """Per layer (weight name): the A and G last captured on this rank."""
        return {
            name: (w.a_stat.asnumpy().copy(), w.g_stat.asnumpy().copy())
            for name, w in zip(self.layer_names, self.wrappers, strict=True)
        }

    def _state_params(self) -> list[ms.Parameter]:
        return [
            *self.a_stats,
            *self.g_stats,
            *self.positions,
            *self.a_inv,
            *self.g_inv,
            *self.trace_ref,
            *self.stopped,
            *self.a_vectors,
            *self.g_vectors,
            *self.eigen_scales,
            *self.graft_m,
            *self.graft_v,
            *([self.graft_step] if self.adam_graft is not None else []),
        ]

    def state(self) -> dict[str, np.ndarray]:
        """The preconditioner's buffers (numpy, names under ``thor.``): last statistics, inverses, trace rule,
        counters. ``steps`` is the position in ``damping`` and in the ``frequency`` cycle, so a
        preconditioner given this state by ``load_state`` continues the run."""
        # asnumpy() can share memory with the parameter on CPU: copy, so later steps do not change it
        state = {STATE_PREFIX + p.name: p.asnumpy().copy() for p in self._state_params()}
        for counter in COUNTERS:
            state[STATE_PREFIX + counter] = np.array(getattr(self, counter), np.int64)
        state[STATE_PREFIX + "have_inverses"] = np.array(int(self._have_inverses), np.int64)
        return state

    def load_state(self, state: dict[str, np.ndarray]) -> None:
        """Restore what ``state()`` returned (e.g. after a checkpoint round trip); the next step continues.

        Keys other than the preconditioner's (``thor.`` prefix) are ignored, so the whole optimizer state may be
        passed.
        """
        missing = [STATE_PREFIX + p.name for p in self._state_params() if STATE_PREFIX + p.name not in state]
        if missing:
            raise ValueError(f"THOR state lacks {missing[:5]}")
        for param in self._state_params():
            value = np.asarray(state[STATE_PREFIX + param.name], np.float32)
            if value.size == 1 and not param.shape:  # checkpoints may store 0-d arrays as shape (1,)
                value = value.reshape(())
            if value.shape != tuple(param.shape):
                raise ValueError(f"THOR state {param.name} has shape {value.shape}, expected {tuple(param.shape)}")
            param.set_data(ms.Tensor(value))

        def scalar(key: str, default: int) -> int:
            return int(np.asarray(state.get(STATE_PREFIX + key, default)).reshape(-1)[0])

        for counter in COUNTERS:
            setattr(self, counter, scalar(counter, 0))
        self._have_inverses = bool(scalar("have_inverses", 1))
