"""THOR: K-FAC style second-order training as a gradient preconditioner before the baseline's Momentum.

The shape is kfac-pytorch's: forward, backward, ``ThorPreconditioner`` rewrites the gradients of the
supported layers, then an ordinary optimizer (``create_thor_step``: the baseline's ``create_momentum``,
with its weight-decay groups) applies weight decay and momentum. ``ThorStep`` is that step as one
callable ``(images, labels) -> loss``, compiled as a cell that calls ``optimizer(precondition(grads))``.
So momentum, weight decay and their checkpointed state are the baseline's; the preconditioner adds its
statistics, inverses and counters (``ThorPreconditioner.state``).

``mindspore.nn.thor`` needs Ascend/GPU-only kernels (ThorIm2Col, CholeskyTrsm, UpdateThorGradient);
this preconditioner uses only ``ops.unfold``, ``ops.cholesky``, ``ops.cholesky_solve``, ``InsertGradientOf``
and matmuls, so it runs in GRAPH mode on CPU and GPU; on Ascend, where MindSpore 2.10 documents no
``ops.cholesky``, the inverses default to ``ops.MatrixInverse`` (only CPU was available to test this module).

Per ``nn.Conv2d`` (group 1) and ``nn.Dense`` (without activation) of the network, with ``N`` the
batch size, ``P`` the output positions per example (``H_out * W_out`` for a conv, 1 for a dense
layer) and ``lambda`` the damping of the step:

* ``A = E[a a^T]`` over the layer input: for a conv, ``a`` are the im2col patches (``ops.unfold`` on
  the input padded as the conv pads it, honouring stride and dilation), each ``C_in*kh*kw`` long and
  ordered like ``weight.reshape(C_out, -1)``; averaged over the ``N * P`` rows.
* ``G = E[g g^T]`` over the gradient w.r.t. the layer OUTPUT, ``C_out`` square, averaged over the
  ``N * P`` rows, where ``g = N * dout / loss_scale`` and ``dout`` is the gradient of the loss-scaled
  batch-mean loss. ``N * dL_mean/dout`` is the per-example gradient, so ``G`` is the Fisher factor:
  this is RECIPES' ``G * (batch / loss_scale)^2`` convention, applied when the statistic is taken.
* Damped inverses (``s = sqrt(lambda / P)``): ``A^-1 = P^-1/2 (A + s I)^-1``, ``G^-1 = P^-1/2 (G + s I)^-1``,
  by Cholesky (``ops.cholesky`` + ``ops.cholesky_solve`` against the identity; ``MatrixInverse`` on
  Ascend, see ``block_inverse``), of the full matrices or, with ``block_size``, of each
  ``block_size`` square diagonal block separately (the last block padded with the identity).
  RECIPES' "conv: damping normalised by the patch count" is read as MindSpore's own THOR does it:
  the Ascend optimizer multiplies the damping by ``batch_size / a_normalizer`` with
  ``a_normalizer = N * H_out * W_out`` im2col rows, the GPU one divides it by ``H_out * W_out``;
  both give ``lambda / P``, and both multiply each conv inverse by ``P^-1/2``. So the layer's
  Fisher is ``P * A (x) G`` (K-FAC for convolutions, spatially independent gradients) with each
  factor damped by ``sqrt(lambda)``: the update is
  ``(sqrt(P) G + sqrt(lambda) I)^-1 grad (sqrt(P) A + sqrt(lambda) I)^-1``. For a dense layer
  ``P = 1``: plainly ``(G + sqrt(lambda) I)^-1 grad (A + sqrt(lambda) I)^-1``.
* Update direction ``d = G^-1 grad A^-1`` with ``grad`` reshaped to ``C_out x (C_in*kh*kw)``;
  BatchNorm parameters, biases and unsupported layers use the plain gradient. Then the optimizer:
  for the baseline's Momentum, weight decay is added (after preconditioning; not on names containing
  beta/gamma/bias, ``optim.momentum.decay_groups``), then ``m = momentum * m + d``, ``w = w - lr * m``.

How the statistics are captured: THOR replaces each supported layer in the network by a
transparent ``_Capture`` cell (the layer's parameters and names are unchanged). While its
``capture`` flag is on, it computes ``A`` from its input in the forward pass and wraps its output in
``ops.InsertGradientOf`` whose hook computes ``G`` from the output gradient during the backward pass;
both are written to non-trainable parameters of the wrapper (``thor_stats.<weight name>.A/G/P``;
they therefore appear in ``net.get_parameters()``; ``is_statistic`` tells them apart from the
weights, so checkpoints store them with the optimizer state), which the preconditioner reads after the
gradients exist (``ops.depend`` orders them). An alternative, differentiating w.r.t. zero "probe"
tensors added to each layer output, would need the output shapes (batch included) fixed up front
and still a side channel for ``A``; the hook keeps the network's call signature. The flag is a
Python attribute, read when a graph is compiled: THOR compiles two step cells, the "second-order"
one with capture on (statistics, inverses and update in one graph) and the "reuse" one with capture
off (the forward/backward of plain training plus two matmuls per layer with the stored inverses),
each followed by the same optimizer.
``frequency`` picks the variant per step; neither ever retraces. With the flag off the wrapper is
the bare layer, so evaluation graphs compiled on the same network carry no statistics.

Trace rule (THOR paper, optional ``trace_rule=(skip, stop)``): at a second-order step a layer's
``t = tr(A + sI) * tr(G + sI)`` (the trace of the damped Kronecker factor product, before the
``P^-1/2`` scaling) is compared with ``t_ref``, its value when the layer's inverses were last
recomputed: relative change ``|t - t_ref| / t_ref`` above ``skip`` recomputes (and sets
``t_ref = t``); at most ``skip`` keeps the old inverses for this step; below ``stop`` keeps them for
good (the layer is never refreshed again). Every layer is computed at its first second-order step.
Comparing with the last refresh rather than the previous check lets slow drift trigger a refresh.
The rule saves the work it skips: with a trace rule a second-order step runs in three parts, the
forward/backward with statistics capture (returning the gradients and every layer's ``t``), the
decision per layer on the host, one compiled damped inversion per refreshed layer only, then the
reuse step's preconditioning with the stored inverses and the optimizer. (One fused graph cannot skip
work: MindSpore computes both branches of an ``ops.where``.) ``trace_skips`` counts (layer,
second-order step) pairs that kept old inverses, ``inverses_computed`` the (layer, step) pairs whose
A and G inverses were computed; without a trace rule every layer is computed at every second-order
step, in the one fused graph.

Loss scale: the loss is multiplied by ``loss_scale`` before differentiation (like
``TrainOneStepCell(sens=loss_scale)``); gradients are divided by it before the preconditioner and ``G``
is unscaled as above, so the optimizer gets loss scale 1 and updates do not depend on it (exactly, for
powers of two).

Data parallel (``rank_size > 1``, after ``init()`` under msrun): gradients, the loss and the A/G
statistics are averaged across ranks with ``ops.AllReduce`` before use, so all ranks hold the same
inverses and apply the same update. (Not exercised by the tests: that needs msrun.)

Everything is float32; the network must not be cast to float16 (amp O2/O3).
"""

from __future__ import annotations

import mindspore as ms
import numpy as np
from mindspore import nn, ops

from pipelines.optim.momentum import create_momentum

STATE_PREFIX = "thor."  # the preconditioner's keys in the optimizer state
STATS_PREFIX = "thor_stats."  # the statistics buffers the wrapped layers add to the network
INVERSE_METHODS = ("cholesky", "matrix_inverse")
COUNTERS = ("steps", "second_order_steps", "reuse_steps", "trace_skips", "inverses_computed")


def is_statistic(name: str) -> bool:
    """Whether the network parameter ``name`` is a statistics buffer of a wrapped layer (optimizer state)."""
    return name.startswith(STATS_PREFIX)


# --------------------------------------------------------------------------------------------
# graph-safe linear algebra (static shapes; usable inside Cell.construct)


def _blocking(n: int, block_size: int | None) -> tuple[int, int]:
    """(number of blocks, block size) covering an ``n`` square matrix."""
    size = n if block_size is None or block_size >= n else block_size
    return (n + size - 1) // size, size


def block_inverse(matrix, block_size=None, method="cholesky"):
    """Inverses of the diagonal blocks of the SPD ``matrix`` (n x n), as an (nb, b, b) tensor.

    ``block_size=None`` (or >= n): one block, the full inverse. Otherwise blocks of ``block_size``,
    the last padded with the identity. ``method`` "cholesky": ``ops.cholesky``, then
    ``ops.cholesky_solve`` against the identity (batched ``cholesky_inverse`` returns wrong values on
    CPU in MindSpore 2.10, and is 2.5x slower unbatched); "matrix_inverse": ``ops.MatrixInverse``
    (LU), for backends without ``ops.cholesky`` (MindSpore 2.10 documents it for GPU and CPU only).
    """
    n = matrix.shape[0]
    nb, b = _blocking(n, block_size)
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


# --------------------------------------------------------------------------------------------
# statistics capture


def _same_pads(size: int, kernel: int, stride: int, dilation: int) -> tuple[int, int]:
    out = (size + stride - 1) // stride
    total = max((out - 1) * stride + (kernel - 1) * dilation + 1 - size, 0)
    return total // 2, total - total // 2


class _Capture(nn.Cell):
    """Transparent wrapper of a Conv2d / Dense layer that records A, G and P while ``capture`` is on."""

    def __init__(self, layer: nn.Cell, loss_scale: float):
        super().__init__(auto_prefix=False)
        self.layer = layer
        self.is_conv = isinstance(layer, nn.Conv2d)
        self.capture = False
        self.inverse_loss_scale = 1.0 / loss_scale
        out_dim = layer.out_channels
        if self.is_conv:
            kh, kw = layer.kernel_size
            self.kernel = (kh, kw)
            self.stride = tuple(layer.stride)
            self.dilation = tuple(layer.dilation)
            self.pad_mode = layer.pad_mode
            padding = layer.padding
            self.padding = (padding,) * 4 if isinstance(padding, int) else tuple(padding)  # top, bottom, left, right
            in_dim = layer.in_channels * kh * kw
        else:
            in_dim = layer.in_channels
        self.in_dim, self.out_dim = in_dim, out_dim
        name = layer.weight.name
        self.a_stat = ms.Parameter(
            ms.Tensor(np.zeros((in_dim, in_dim), np.float32)), name=f"{STATS_PREFIX}{name}.A", requires_grad=False
        )
        self.g_stat = ms.Parameter(
            ms.Tensor(np.zeros((out_dim, out_dim), np.float32)), name=f"{STATS_PREFIX}{name}.G", requires_grad=False
        )
        self.positions = ms.Parameter(
            ms.Tensor(np.ones((), np.float32)), name=f"{STATS_PREFIX}{name}.P", requires_grad=False
        )
        self.hook = ops.InsertGradientOf(self._save_g)

    @property
    def weight(self) -> ms.Parameter:
        """The wrapped layer's weight (so ``net.fc.weight`` keeps working after wrapping)."""
        return self.layer.weight

    @property
    def bias(self) -> ms.Parameter | None:
        return getattr(self.layer, "bias", None)

    def _patches(self, x):
        """im2col rows (N * P, C_in * kh * kw) of the conv input, and P."""
        kh, kw = self.kernel
        if self.pad_mode == "same":
            top, bottom = _same_pads(x.shape[2], kh, self.stride[0], self.dilation[0])
            left, right = _same_pads(x.shape[3], kw, self.stride[1], self.dilation[1])
        elif self.pad_mode == "pad":
            top, bottom, left, right = self.padding
        else:
            top, bottom, left, right = 0, 0, 0, 0
        if top + bottom + left + right > 0:
            x = ops.pad(x, (left, right, top, bottom))
        cols = ops.unfold(x, self.kernel, self.dilation, 0, self.stride)  # (N, K, P), K ordered C, kh, kw
        positions = cols.shape[2]
        rows = ops.reshape(ops.transpose(cols, (0, 2, 1)), (-1, self.in_dim))
        return rows, positions

    def _save_g(self, dout):
        batch = dout.shape[0]
        if self.is_conv:
            rows = ops.reshape(ops.transpose(dout, (0, 2, 3, 1)), (-1, self.out_dim))
        else:
            rows = ops.reshape(dout, (-1, self.out_dim))
        rows = ops.cast(rows, ms.float32) * (batch * self.inverse_loss_scale)
        stat = ops.matmul(ops.transpose(rows, (1, 0)), rows) / rows.shape[0]
        return ops.depend(dout, ops.assign(self.g_stat, stat))

    def construct(self, x):
        if self.capture:
            inputs = ops.stop_gradient(ops.cast(x, ms.float32))
            if self.is_conv:
                rows, positions = self._patches(inputs)
            else:
                rows, positions = ops.reshape(inputs, (-1, self.in_dim)), 1
            stat = ops.matmul(ops.transpose(rows, (1, 0)), rows) / rows.shape[0]
            x = ops.depend(x, ops.assign(self.a_stat, stat))
            x = ops.depend(x, ops.assign(self.positions, ops.scalar_to_tensor(positions, ms.float32)))
            return self.hook(self.layer(x))
        return self.layer(x)


def _supported(cell: nn.Cell) -> bool:
    if isinstance(cell, nn.Conv2d):
        return cell.group == 1 and cell.data_format == "NCHW"
    return type(cell) is nn.Dense and not cell.activation_flag


def wrap_layers(net: nn.Cell, loss_scale: float) -> list[_Capture]:
    """Replace every supported Conv2d / Dense of ``net`` by a ``_Capture`` wrapper (in place).

    Idempotent: wrappers already present are reused (with the new loss scale). Returns the
    wrappers in traversal order.
    """
    found: list[_Capture] = []

    def visit(cell: nn.Cell) -> None:
        changed = False
        for name, child in list(cell.name_cells().items()):
            if child is None:
                continue
            if isinstance(child, _Capture):
                child.inverse_loss_scale = 1.0 / loss_scale
                found.append(child)
            elif _supported(child):
                wrapper = _Capture(child, loss_scale)
                cell.insert_child_to_cell(name, wrapper)
                found.append(wrapper)
                changed = True
            else:
                visit(child)
        if changed and isinstance(cell, nn.SequentialCell):
            cell.cell_list = list(cell.cells())  # SequentialCell.construct iterates this list

    visit(net)
    return found


def set_capture(wrappers, on: bool) -> None:
    """Turn the statistics capture of ``wrappers`` on or off (read when a cell compiles)."""
    for wrapper in wrappers:
        wrapper.capture = on


# --------------------------------------------------------------------------------------------
# the preconditioner


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
        self.rank_size = preconditioner.rank_size
        self.all_reduce = ops.AllReduce() if preconditioner.rank_size > 1 else None

    def _mean_over_ranks(self, value):
        if self.rank_size > 1:
            return self.all_reduce(value) / self.rank_size
        return value

    def _statistics(self, i, grad):
        """A, G (rank means) and P of layer ``i``, read once ``grad`` exists (so after the capture)."""
        a = self._mean_over_ranks(ops.depend(self.a_stats[i], grad))
        g = self._mean_over_ranks(ops.depend(self.g_stats[i], grad))
        positions = ops.depend(self.positions[i], grad)
        return a, g, positions

    def _refresh(self, i, grad, damping):
        """Damped inverses of layer ``i`` from this step's statistics, stored; returns (A^-1 blocks, G^-1 blocks)."""
        a, g, positions = self._statistics(i, grad)
        a_inv = damped_inverse(a, damping, positions, self.block_size, self.inverse_method)
        g_inv = damped_inverse(g, damping, positions, self.block_size, self.inverse_method)
        ops.assign(self.a_inv[i], a_inv)
        ops.assign(self.g_inv[i], g_inv)
        return a_inv, g_inv

    def construct(self, grads, damping):
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


def damped_inverse(stat, damping, positions, block_size, method):
    """``P^-1/2 (X + sqrt(damping / P) I)^-1`` of a statistic ``X`` (A or G), as ``block_inverse`` blocks."""
    shift = ops.sqrt(damping / positions)
    damped = stat + shift * ops.eye(stat.shape[0], stat.shape[0], ms.float32)
    return block_inverse(damped, block_size, method) * ops.rsqrt(positions)


class _LayerInverse(nn.Cell):
    """One layer's damped inverse (``damped_inverse``) of its rank-mean statistic: the trace rule's per-layer
    refresh, compiled once per statistic shape."""

    def __init__(self, block_size: int | None, method: str, rank_size: int):
        super().__init__(auto_prefix=False)
        self.block_size = block_size
        self.method = method
        self.rank_size = rank_size
        self.all_reduce = ops.AllReduce() if rank_size > 1 else None

    def construct(self, stat, damping, positions):
        if self.rank_size > 1:
            stat = self.all_reduce(stat) / self.rank_size
        return damped_inverse(stat, damping, positions, self.block_size, self.method)


class _DampedTraces(nn.Cell):
    """Per layer ``t = tr(A + sI) tr(G + sI)`` of this step's rank-mean statistics (the trace rule's measure)."""

    def __init__(self, preconditioner: ThorPreconditioner):
        super().__init__(auto_prefix=False)
        self.a_stats = preconditioner.a_stats
        self.g_stats = preconditioner.g_stats
        self.positions = preconditioner.positions
        self.param_of_layer = preconditioner.param_of_layer
        self.n_layers = len(preconditioner.param_of_layer)
        self.rank_size = preconditioner.rank_size
        self.all_reduce = ops.AllReduce() if preconditioner.rank_size > 1 else None

    def _mean_over_ranks(self, value):
        if self.rank_size > 1:
            return self.all_reduce(value) / self.rank_size
        return value

    def construct(self, grads, damping):
        traces = ()
        for i in range(self.n_layers):
            grad = grads[self.param_of_layer[i]]  # the statistics are read once the gradients exist
            a = ops.depend(self.a_stats[i], grad)
            g = ops.depend(self.g_stats[i], grad)
            shift = ops.sqrt(damping / ops.depend(self.positions[i], grad))
            trace_a = self._mean_over_ranks(ops.trace(a)) + a.shape[0] * shift  # tr of the rank mean
            trace_g = self._mean_over_ranks(ops.trace(g)) + g.shape[0] * shift
            traces += (trace_a * trace_g,)
        return ops.stack(traces)


class ThorPreconditioner:
    """THOR's gradient preconditioner (kfac-pytorch's shape): the statistics, inverses and counters of ``net``.

    Wraps every supported layer of ``net`` (in place, see ``wrap_layers``) so that the A/G statistics are captured,
    and holds two compiled cells that turn the gradients of ``net.trainable_params()`` (in that order, unscaled) into
    THOR directions: ``second_order_cell`` (refresh the damped inverses from this step's statistics, then apply them)
    and ``reuse_cell`` (apply the stored ones). ``ThorStep`` picks one per step with ``second_order_now`` and calls
    ``capture`` / ``count_step`` around it. Step ``k`` (counted from 0, continued by ``load_state``) is second-order
    when ``k % frequency == 0`` (or no inverses exist yet); its damping is ``damping_per_step[k]`` (the last value past
    the end). ``block_size`` None inverts the full A and G, an int their diagonal blocks (Ascend: 128).
    ``trace_rule`` ``(skip, stop)``, e.g. ``(0.01, 0.001)``, enables the paper's trace rule. ``loss_scale``: the factor
    the differentiated loss carries, removed from G when it is taken. ``inverse_method`` (``block_inverse``): None
    picks "cholesky", or "matrix_inverse" on Ascend. Counters: ``steps``, ``second_order_steps``, ``reuse_steps``,
    ``trace_skips``, ``inverses_computed`` ((layer, step) pairs whose inverses were computed; ``refreshed_layers``
    names those of the last second-order step).
    """

    def __init__(
        self,
        net: nn.Cell,
        damping_per_step: np.ndarray,
        *,
        loss_scale: float = 1.0,
        frequency: int = 834,
        block_size: int | None = None,
        trace_rule: tuple[float, float] | None = None,
        rank_size: int = 1,
        inverse_method: str | None = None,
    ):
        if frequency < 1:
            raise ValueError(f"frequency must be >= 1, got {frequency}")
        if loss_scale <= 0:
            raise ValueError(f"loss_scale must be > 0, got {loss_scale}")
        if block_size is not None and block_size < 1:
            raise ValueError(f"block_size must be None or >= 1, got {block_size}")
        if trace_rule is not None and not 0 <= trace_rule[1] <= trace_rule[0]:
            raise ValueError(f"trace_rule must be (skip, stop) with 0 <= stop <= skip, got {trace_rule}")
        self.damping_per_step = np.asarray(damping_per_step, np.float32).ravel()
        if not len(self.damping_per_step):
            raise ValueError("damping_per_step needs at least one value")
        if inverse_method is None:
            inverse_method = "matrix_inverse" if ms.get_context("device_target") == "Ascend" else "cholesky"
        if inverse_method not in INVERSE_METHODS:
            raise ValueError(f"unknown inverse_method {inverse_method!r}; choose one of {INVERSE_METHODS}")
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
        self.a_inv = ms.ParameterTuple([self._inverse_param(w.in_dim, f"thor_a_inv.{n}") for w, n in pairs])
        self.g_inv = ms.ParameterTuple([self._inverse_param(w.out_dim, f"thor_g_inv.{n}") for w, n in pairs])
        self.trace_ref = ms.ParameterTuple([self._scalar_param(f"thor_trace_ref.{n}") for n in self.layer_names])
        self.stopped = ms.ParameterTuple([self._scalar_param(f"thor_stopped.{n}") for n in self.layer_names])

        self.second_order_cell = _Precondition(self, second_order=True)
        self.reuse_cell = _Precondition(self, second_order=False)
        self.traces_cell = _DampedTraces(self)
        self.layer_inverse = _LayerInverse(block_size, inverse_method, rank_size)
        self.steps = 0
        self.second_order_steps = 0
        self.reuse_steps = 0
        self.trace_skips = 0
        self.inverses_computed = 0
        self.refreshed_layers: list[str] = []  # the layers whose inverses the last second-order step computed
        self._have_inverses = False

    def _inverse_param(self, n: int, name: str) -> ms.Parameter:
        nb, b = _blocking(n, self.block_size)
        return ms.Parameter(ms.Tensor(np.zeros((nb, b, b), np.float32)), name=name, requires_grad=False)

    @staticmethod
    def _scalar_param(name: str) -> ms.Parameter:
        return ms.Parameter(ms.Tensor(0.0, ms.float32), name=name, requires_grad=False)

    @property
    def damping(self) -> float:
        """The damping of the next step (of the last step taken, once the schedule is over)."""
        return float(self.damping_per_step[min(self.steps, len(self.damping_per_step) - 1)])

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

    def inverses(self) -> dict[str, tuple[np.ndarray, np.ndarray]]:
        """Per layer (weight name): the stored A and G inverses as dense numpy matrices."""
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
        ]

    def state(self) -> dict[str, np.ndarray]:
        """The preconditioner's buffers (numpy, names under ``thor.``): last statistics, inverses, trace rule,
        counters. ``steps`` is the position in ``damping_per_step`` and in the ``frequency`` cycle, so a
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


# --------------------------------------------------------------------------------------------
# the training step: forward, backward, precondition, optimizer


class _Gradients(nn.Cell):
    """Scaled loss and gradients, unscaled (and averaged over ranks): ``(images, labels) -> (loss, grads)``."""

    def __init__(self, net_with_loss: nn.Cell, weights, loss_scale, ranks):
        super().__init__(auto_prefix=False)
        self.net_with_loss = net_with_loss
        self.loss_scale = float(loss_scale)
        self.rank_size = ranks
        self.all_reduce = ops.AllReduce() if ranks > 1 else None
        self.value_and_grad = ms.value_and_grad(self._scaled_loss, None, weights)

    def _scaled_loss(self, images, labels):
        return self.net_with_loss(images, labels) * self.loss_scale

    def _mean_over_ranks(self, value):
        if self.rank_size > 1:
            return self.all_reduce(value) / self.rank_size
        return value

    def construct(self, images, labels):
        scaled_loss, scaled_grads = self.value_and_grad(images, labels)
        loss = self._mean_over_ranks(scaled_loss / self.loss_scale)
        grads = ()
        for grad in scaled_grads:
            grads += (self._mean_over_ranks(grad / self.loss_scale),)
        return loss, grads


class _PreconditionedStep(nn.Cell):
    """One compiled step: gradients (``_Gradients``), precondition, optimizer."""

    def __init__(self, gradients: _Gradients, precondition: _Precondition, optimizer: nn.Optimizer):
        super().__init__(auto_prefix=False)
        self.gradients = gradients
        self.precondition = precondition
        self.optimizer = optimizer

    def construct(self, images, labels, damping):
        loss, grads = self.gradients(images, labels)
        return ops.depend(loss, self.optimizer(self.precondition(grads, damping)))


class _CapturingGradients(nn.Cell):
    """The trace rule's first part of a second-order step: gradients with the statistics captured, and each
    layer's damped trace (``_DampedTraces``)."""

    def __init__(self, gradients: _Gradients, traces: _DampedTraces):
        super().__init__(auto_prefix=False)
        self.gradients = gradients
        self.traces = traces

    def construct(self, images, labels, damping):
        loss, grads = self.gradients(images, labels)
        return loss, grads, self.traces(grads, damping)


class _PreconditionedUpdate(nn.Cell):
    """The trace rule's last part: the stored inverses applied to given gradients, then the optimizer."""

    def __init__(self, precondition: _Precondition, optimizer: nn.Optimizer):
        super().__init__(auto_prefix=False)
        self.precondition = precondition
        self.optimizer = optimizer

    def construct(self, grads, damping):
        return self.optimizer(self.precondition(grads, damping))


class ThorStep:
    """THOR training step ``(images, labels) -> loss``: gradients, ``preconditioner``, then ``optimizer``.

    The optimizer is an ordinary MindSpore optimizer over ``net.trainable_params()`` (in that order) that receives
    unscaled gradients (``loss_scale`` 1): ``create_thor_step`` passes the baseline's Momentum, so momentum, weight
    decay (after preconditioning) and their state are the baseline's. The loss is multiplied by ``loss_scale``
    before differentiation (like ``TrainOneStepCell(sens=loss_scale)``); gradients are divided by it before the
    preconditioner and G is unscaled as it is taken, so updates do not depend on it (exactly, for powers of two).
    The returned loss is unscaled (and averaged over ranks). ``lr_per_step``: the optimizer's schedule, one value
    per step; the optimizer indexes it by its global step, so a step past its end is refused.
    """

    def __init__(
        self,
        net: nn.Cell,
        loss_fn: nn.Cell,
        preconditioner: ThorPreconditioner,
        optimizer: nn.Optimizer,
        lr_per_step: np.ndarray,
        loss_scale: float,
    ):
        if [id(p) for p in optimizer.parameters] != [id(p) for p in net.trainable_params()]:
            raise ValueError("the optimizer must update net.trainable_params() in their order (group order_params)")
        self.net = net
        self.preconditioner = preconditioner
        self.optimizer = optimizer
        self.lr_per_step = np.asarray(lr_per_step, np.float32).ravel()
        self.loss_scale = float(loss_scale)
        gradients = _Gradients(
            nn.WithLossCell(net, loss_fn), optimizer.parameters, loss_scale, preconditioner.rank_size
        )
        self._second_order = _PreconditionedStep(gradients, preconditioner.second_order_cell, optimizer)
        self._reuse = _PreconditionedStep(gradients, preconditioner.reuse_cell, optimizer)
        if preconditioner.trace_rule is not None:
            self._capturing = _CapturingGradients(gradients, preconditioner.traces_cell)
            self._update = _PreconditionedUpdate(preconditioner.reuse_cell, optimizer)
        net.set_train(True)

    def __call__(self, images, labels) -> ms.Tensor:
        """One training step; returns the (unscaled, rank-averaged) loss."""
        preconditioner = self.preconditioner
        if preconditioner.steps >= len(self.lr_per_step):
            raise ValueError(
                f"THOR step {preconditioner.steps + 1} is past the end of its lr schedule "
                f"({len(self.lr_per_step)} steps); build the schedule for every step of the training"
            )
        second_order = preconditioner.second_order_now()
        damping = ms.Tensor(preconditioner.damping, ms.float32)
        if second_order and preconditioner.trace_rule is not None:
            return self._trace_rule_step(images, labels, damping)
        preconditioner.capture(second_order)
        try:
            loss = (self._second_order if second_order else self._reuse)(images, labels, damping)
        finally:
            preconditioner.capture(False)
        preconditioner.count_step(second_order)
        return loss

    def _trace_rule_step(self, images, labels, damping: ms.Tensor) -> ms.Tensor:
        """A second-order step under the trace rule: statistics and traces, the refreshed layers' inverses only,
        then the update with the stored inverses (see the module docstring)."""
        preconditioner = self.preconditioner
        preconditioner.capture(True)
        try:
            loss, grads, traces = self._capturing(images, labels, damping)
        finally:
            preconditioner.capture(False)
        preconditioner.refresh_by_trace_rule(traces.asnumpy(), damping)
        self._update(ms.mutable(grads), damping)  # mutable: a tuple of new tensors must not recompile the cell
        preconditioner.count_step(True)
        return loss


def create_thor_step(
    net: nn.Cell,
    loss_fn: nn.Cell,
    lr_per_step: np.ndarray,
    damping_per_step: np.ndarray,
    *,
    momentum: float = 0.9,
    weight_decay: float = 5e-4,
    loss_scale: float = 128.0,
    frequency: int = 834,
    block_size: int | None = None,
    trace_rule: tuple[float, float] | None = None,
    rank_size: int = 1,
    inverse_method: str | None = None,
) -> ThorStep:
    """THOR for ``net``: the preconditioner, then the baseline's Momentum (``create_momentum``: weight decay
    except on BatchNorm gamma/beta and biases, ``lr_per_step`` indexed by its global step) with loss scale 1, as the
    preconditioner already receives unscaled gradients. See ``ThorPreconditioner`` for the other arguments."""
    preconditioner = ThorPreconditioner(
        net,
        damping_per_step,
        loss_scale=loss_scale,
        frequency=frequency,
        block_size=block_size,
        trace_rule=trace_rule,
        rank_size=rank_size,
        inverse_method=inverse_method,
    )
    lr_per_step = np.asarray(lr_per_step, np.float32).ravel()
    optimizer = create_momentum(net, lr_per_step, momentum, weight_decay, 1.0)
    return ThorStep(net, loss_fn, preconditioner, optimizer, lr_per_step, loss_scale)
