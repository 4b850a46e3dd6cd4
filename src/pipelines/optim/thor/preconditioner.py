"""THOR: K-FAC style second-order training built from generally available MindSpore ops.

``mindspore.nn.thor`` needs Ascend/GPU-only kernels (ThorIm2Col, CholeskyTrsm, UpdateThorGradient);
this trainer uses only ``ops.unfold``, ``ops.cholesky``, ``ops.cholesky_solve``, ``InsertGradientOf``,
``ApplyMomentum`` and matmuls, so it runs in GRAPH mode on CPU and GPU; on Ascend, where MindSpore
2.10 documents no ``ops.cholesky``, the inverses default to ``ops.MatrixInverse`` (only CPU was
available to test this module).

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
  BatchNorm parameters, biases and unsupported layers use the plain gradient. Then weight decay is
  added (after preconditioning; not on names containing beta/gamma/bias, the ``optim`` rule), then
  momentum: ``m = momentum * m + d``, ``w = w - lr * m`` (``ApplyMomentum``).

How the statistics are captured: THOR replaces each supported layer in the network by a
transparent ``_Capture`` cell (the layer's parameters and names are unchanged). While its
``capture`` flag is on, it computes ``A`` from its input in the forward pass and wraps its output in
``ops.InsertGradientOf`` whose hook computes ``G`` from the output gradient during the backward pass;
both are written to non-trainable parameters of the wrapper (``thor_stats.<weight name>.A/G/P``;
they therefore appear in ``net.get_parameters()`` and in network checkpoints, and are ignored when
such a checkpoint is loaded into an unwrapped network), which the optimizer reads after the
gradients exist (``ops.depend`` orders them). An alternative, differentiating w.r.t. zero "probe"
tensors added to each layer output, would need the output shapes (batch included) fixed up front
and still a side channel for ``A``; the hook keeps the network's call signature. The flag is a
Python attribute, read when a graph is compiled: THOR compiles two step cells, the "second-order"
one with capture on (statistics, inverses and update in one graph) and the "reuse" one with capture
off (the forward/backward of plain training plus two matmuls per layer with the stored inverses).
``frequency`` picks the variant per step; neither ever retraces. With the flag off the wrapper is
the bare layer, so evaluation graphs compiled on the same network carry no statistics.

Trace rule (THOR paper, optional ``trace_rule=(skip, stop)``): at a second-order step a layer's
``t = tr(A + sI) * tr(G + sI)`` (the trace of the damped Kronecker factor product, before the
``P^-1/2`` scaling) is compared with ``t_ref``, its value when the layer's inverses were last
recomputed: relative change ``|t - t_ref| / t_ref`` above ``skip`` recomputes (and sets
``t_ref = t``); at most ``skip`` keeps the old inverses for this step; below ``stop`` keeps them for
good (the layer is never refreshed again). Every layer is computed at its first second-order step.
Comparing with the last refresh rather than the previous check lets slow drift trigger a refresh.
The rule is applied in the compiled graph with ``ops.where`` (every inverse is still computed and
discarded when skipped: the rule changes what is used, not the cost). ``trace_skips`` counts
(layer, second-order step) pairs that kept old inverses.

Loss scale: the loss is multiplied by ``loss_scale`` before differentiation (like
``TrainOneStepCell(sens=loss_scale)``); gradients are divided by it and ``G`` is unscaled as above,
so updates do not depend on it (exactly, for powers of two).

Data parallel (``rank_size > 1``, after ``init()`` under msrun): gradients, the loss and the A/G
statistics are averaged across ranks with ``ops.AllReduce`` before use, so all ranks hold the same
inverses and apply the same update. (Not exercised by the tests: that needs msrun.)

Everything is float32; the network must not be cast to float16 (amp O2/O3).
"""

from __future__ import annotations

import mindspore as ms
import numpy as np
from mindspore import nn, ops

from pipelines.optim.momentum import NO_DECAY_MARKERS

STATE_PREFIX = "thor."
STATS_PREFIX = "thor_stats."
INVERSE_METHODS = ("cholesky", "matrix_inverse")


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
    for wrapper in wrappers:
        wrapper.capture = on


# --------------------------------------------------------------------------------------------
# the two compiled step variants


class _ThorStep(nn.Cell):
    """One training step; ``second_order`` (static) adds statistics, inverses and the trace rule."""

    def __init__(self, trainer: THOR, second_order: bool):
        super().__init__(auto_prefix=False)
        self.second_order = second_order
        self.net_with_loss = trainer.net_with_loss
        self.weights = trainer.weights
        self.momenta = trainer.momenta
        self.a_inv = trainer.a_inv
        self.g_inv = trainer.g_inv
        self.a_stats = trainer.a_stats
        self.g_stats = trainer.g_stats
        self.positions = trainer.positions
        self.layer_of_param = trainer.layer_of_param
        self.param_of_layer = trainer.param_of_layer
        self.decay = trainer.decay_flags
        self.n_layers = len(trainer.param_of_layer)
        self.n_params = len(trainer.weights)
        self.block_size = trainer.block_size
        self.inverse_method = trainer.inverse_method
        self.weight_decay = float(trainer.weight_decay)
        self.momentum = float(trainer.momentum)
        self.loss_scale = float(trainer.loss_scale)
        self.rank_size = trainer.rank_size
        self.all_reduce = ops.AllReduce() if trainer.rank_size > 1 else None
        self.use_trace = trainer.trace_rule is not None
        if self.use_trace:
            self.skip_threshold, self.stop_threshold = (float(t) for t in trainer.trace_rule)
            self.trace_ref = trainer.trace_ref
            self.stopped = trainer.stopped
        self.apply_momentum = ops.ApplyMomentum()
        self.value_and_grad = ms.value_and_grad(self._scaled_loss, None, self.weights)

    def _scaled_loss(self, images, labels):
        return self.net_with_loss(images, labels) * self.loss_scale

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

    def construct(self, images, labels, lr, damping):
        scaled_loss, scaled_grads = self.value_and_grad(images, labels)
        loss = self._mean_over_ranks(scaled_loss / self.loss_scale)
        grads = ()
        for grad in scaled_grads:
            grads += (self._mean_over_ranks(grad / self.loss_scale),)

        fresh_a = ()
        fresh_g = ()
        skipped = ops.zeros((), ms.float32)
        if self.second_order:
            for i in range(self.n_layers):
                a, g, positions = self._statistics(i, grads[self.param_of_layer[i]])
                shift = ops.sqrt(damping / positions)
                scale = ops.rsqrt(positions)
                a_damped = a + shift * ops.eye(a.shape[0], a.shape[0], ms.float32)
                g_damped = g + shift * ops.eye(g.shape[0], g.shape[0], ms.float32)
                a_inv = block_inverse(a_damped, self.block_size, self.inverse_method) * scale
                g_inv = block_inverse(g_damped, self.block_size, self.inverse_method) * scale
                if self.use_trace:
                    trace = (ops.trace(a) + a.shape[0] * shift) * (ops.trace(g) + g.shape[0] * shift)
                    ref = self.trace_ref[i]
                    active = self.stopped[i] < 0.5
                    first = ref <= 0.0
                    change = ops.abs(trace - ref) / ops.maximum(ref, 1e-30)
                    update = ops.logical_or(first, ops.logical_and(active, change > self.skip_threshold))
                    stop = ops.logical_and(
                        ops.logical_not(first), ops.logical_and(active, change < self.stop_threshold)
                    )
                    a_inv = ops.where(update, a_inv, self.a_inv[i])
                    g_inv = ops.where(update, g_inv, self.g_inv[i])
                    ops.assign(self.trace_ref[i], ops.where(update, trace, ref))
                    ops.assign(self.stopped[i], ops.where(stop, ops.ones((), ms.float32), self.stopped[i]))
                    skipped = skipped + 1.0 - ops.cast(update, ms.float32)
                ops.assign(self.a_inv[i], a_inv)
                ops.assign(self.g_inv[i], g_inv)
                fresh_a += (a_inv,)
                fresh_g += (g_inv,)

        updates = ()
        for j in range(self.n_params):
            grad = grads[j]
            layer = self.layer_of_param[j]
            if layer >= 0:
                if self.second_order:
                    a_inv = fresh_a[layer]
                    g_inv = fresh_g[layer]
                else:
                    a_inv = self.a_inv[layer]
                    g_inv = self.g_inv[layer]
                shape = grad.shape
                matrix = ops.reshape(grad, (shape[0], -1))
                grad = ops.reshape(apply_left(g_inv, apply_right(matrix, a_inv)), shape)
            if self.decay[j]:
                grad = grad + self.weight_decay * self.weights[j]
            updates += (self.apply_momentum(self.weights[j], self.momenta[j], lr, grad, self.momentum),)
        return ops.depend(loss, updates), skipped


# --------------------------------------------------------------------------------------------
# the trainer


class THOR:
    """Second-order trainer: ``step(images, labels) -> loss`` updates ``net`` in place.

    ``lr_per_step`` / ``damping_per_step`` hold one value per step (the last is reused past the
    end). Step ``k`` (counted from 0, continued by ``load_state``) is a second-order step when
    ``k % frequency == 0``, otherwise a reuse step. ``block_size`` None inverts the full A and G,
    an int their diagonal blocks (Ascend: 128). ``trace_rule`` ``(skip, stop)``, e.g.
    ``(0.01, 0.001)``, enables the paper's trace rule. Counters: ``second_order_steps``,
    ``reuse_steps``, ``trace_skips``. ``loss_scale`` multiplies the loss before differentiation.
    ``inverse_method`` (``block_inverse``): None picks "cholesky", or "matrix_inverse" on Ascend.
    """

    def __init__(
        self,
        net: nn.Cell,
        loss_fn: nn.Cell,
        lr_per_step: np.ndarray,
        damping_per_step: np.ndarray,
        momentum: float = 0.9,
        weight_decay: float = 5e-4,
        loss_scale: float = 128.0,
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
        self.lr_per_step = np.asarray(lr_per_step, np.float32).ravel()
        self.damping_per_step = np.asarray(damping_per_step, np.float32).ravel()
        if not len(self.lr_per_step) or not len(self.damping_per_step):
            raise ValueError("lr_per_step and damping_per_step need at least one value")
        self.net = net
        self.momentum = momentum
        self.weight_decay = weight_decay
        self.loss_scale = float(loss_scale)
        self.frequency = frequency
        self.block_size = block_size
        self.trace_rule = None if trace_rule is None else (float(trace_rule[0]), float(trace_rule[1]))
        self.rank_size = rank_size
        if inverse_method is None:
            inverse_method = "matrix_inverse" if ms.get_context("device_target") == "Ascend" else "cholesky"
        if inverse_method not in INVERSE_METHODS:
            raise ValueError(f"unknown inverse_method {inverse_method!r}; choose one of {INVERSE_METHODS}")
        self.inverse_method = inverse_method

        self.wrappers = wrap_layers(net, self.loss_scale)
        if not self.wrappers:
            raise ValueError("the network has no Conv2d (group 1) or Dense (no activation) layer for THOR")
        self.weights = ms.ParameterTuple(net.trainable_params())
        index_of = {id(p): j for j, p in enumerate(self.weights)}
        self.param_of_layer = tuple(index_of[id(w.layer.weight)] for w in self.wrappers)
        layer_of = dict.fromkeys(range(len(self.weights)), -1)
        for i, j in enumerate(self.param_of_layer):
            layer_of[j] = i
        self.layer_of_param = tuple(layer_of[j] for j in range(len(self.weights)))
        self.decay_flags = tuple(not any(m in p.name for m in NO_DECAY_MARKERS) for p in self.weights)
        self.layer_names = [w.layer.weight.name for w in self.wrappers]

        self.momenta = self.weights.clone(prefix="thor_momentum", init="zeros")
        self.a_stats = ms.ParameterTuple([w.a_stat for w in self.wrappers])
        self.g_stats = ms.ParameterTuple([w.g_stat for w in self.wrappers])
        self.positions = ms.ParameterTuple([w.positions for w in self.wrappers])
        self.a_inv = ms.ParameterTuple(
            [
                self._inverse_param(w.in_dim, f"thor_a_inv.{n}")
                for w, n in zip(self.wrappers, self.layer_names, strict=True)
            ]
        )
        self.g_inv = ms.ParameterTuple(
            [
                self._inverse_param(w.out_dim, f"thor_g_inv.{n}")
                for w, n in zip(self.wrappers, self.layer_names, strict=True)
            ]
        )
        self.trace_ref = ms.ParameterTuple(
            [
                ms.Parameter(ms.Tensor(0.0, ms.float32), name=f"thor_trace_ref.{n}", requires_grad=False)
                for n in self.layer_names
            ]
        )
        self.stopped = ms.ParameterTuple(
            [
                ms.Parameter(ms.Tensor(0.0, ms.float32), name=f"thor_stopped.{n}", requires_grad=False)
                for n in self.layer_names
            ]
        )

        self.net_with_loss = nn.WithLossCell(net, loss_fn)
        self._second_order_step = _ThorStep(self, second_order=True)
        self._reuse_step = _ThorStep(self, second_order=False)
        self.steps = 0
        self.second_order_steps = 0
        self.reuse_steps = 0
        self.trace_skips = 0
        self._have_inverses = False
        net.set_train(True)

    def _inverse_param(self, n: int, name: str) -> ms.Parameter:
        nb, b = _blocking(n, self.block_size)
        return ms.Parameter(ms.Tensor(np.zeros((nb, b, b), np.float32)), name=name, requires_grad=False)

    def _value(self, values: np.ndarray) -> ms.Tensor:
        return ms.Tensor(values[min(self.steps, len(values) - 1)], ms.float32)

    def step(self, images, labels) -> ms.Tensor:
        """One training step; returns the (unscaled, rank-averaged) loss."""
        lr, damping = self._value(self.lr_per_step), self._value(self.damping_per_step)
        if self.steps % self.frequency == 0 or not self._have_inverses:
            set_capture(self.wrappers, True)
            try:
                loss, skipped = self._second_order_step(images, labels, lr, damping)
            finally:
                set_capture(self.wrappers, False)
            self.second_order_steps += 1
            self._have_inverses = True
            if self.trace_rule is not None:
                self.trace_skips += int(round(float(skipped.asnumpy())))
        else:
            set_capture(self.wrappers, False)
            loss, _ = self._reuse_step(images, labels, lr, damping)
            self.reuse_steps += 1
        self.steps += 1
        return loss

    __call__ = step

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

    def _state_params(self):
        return [
            *self.momenta,
            *self.a_stats,
            *self.g_stats,
            *self.positions,
            *self.a_inv,
            *self.g_inv,
            *self.trace_ref,
            *self.stopped,
        ]

    def state(self) -> dict[str, np.ndarray]:
        """Optimizer state for a checkpoint (numpy): momenta, last statistics, inverses, trace rule, counters.

        The step counter is the position in ``lr_per_step`` / ``damping_per_step`` and in the
        ``frequency`` cycle, so a trainer given this state by ``load_state`` continues the run.
        """
        # asnumpy() can share memory with the parameter on CPU: copy, so later steps do not change it
        state = {STATE_PREFIX + p.name: p.asnumpy().copy() for p in self._state_params()}
        for counter in ("steps", "second_order_steps", "reuse_steps", "trace_skips"):
            state[STATE_PREFIX + counter] = np.array(getattr(self, counter), np.int64)
        state[STATE_PREFIX + "have_inverses"] = np.array(int(self._have_inverses), np.int64)
        return state

    def load_state(self, state: dict[str, np.ndarray]) -> None:
        """Restore what ``state()`` returned (e.g. after a checkpoint round trip); the next step continues."""
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

        for counter in ("steps", "second_order_steps", "reuse_steps", "trace_skips"):
            setattr(self, counter, scalar(counter, 0))
        self._have_inverses = bool(scalar("have_inverses", 1))
