"""THOR's statistics capture: each supported layer (``nn.Conv2d`` of group 1, ``nn.Dense`` without activation)
is replaced by a transparent ``CapturedLayer`` that, while its ``capture`` flag is on, records the layer input's
second moment A in the forward pass and the output gradient's G in the backward pass (``ops.InsertGradientOf``),
into non-trainable parameters ``thor_stats.<weight name>.A/G/P`` (``is_statistic``).

G's rows are scaled by the output gradient's leading dimension (``g = rows * dout``): the batch for a conv or a
Dense on examples, the token rows for BERT's Dense layers on ``(batch * seq, hidden)`` rows, so that each token row
counts as a loss term (K-FAC's "expand" reading of shared weights). MindSpore's ``nn.thor`` scales G by its
configured batch size instead (``batch_size_scale``), which on thor_bert's CPU default puts the encoder's G
(2,048 / 32)^2 = 4,096 times lower and the masked-LM transform's 100 times lower. We keep the rows:
``benchmarks/thor_bert_inverse.py`` measured G's largest eigenvalue at the start at 0.16 to 6 times the damping's
shift (``sqrt(damping)`` = 0.084) on the attention and feed-forward outputs, pooler, masked-LM transform and
classifier, and at 1e-7 (query, key) to 1e-2 (feed-forward input) times it on the others; nn.thor's scale would
put every layer but the pooler and the classifier two to eleven orders below the shift. That per-layer
spread is not a normalisation constant: ``damping_method: factored`` scales each layer's shift instead.

``statistics_dtype`` float64 takes the products ``rows^T rows / n`` in float64 and rounds them once to the float32
buffers. MindSpore's float32 ``MatMul`` on CPU is oneDNN's GEMM, which splits a long sum between threads by the L2
cache size it reads from CPUID, so float32 statistics differ in their last bits between CPUs; its float64 ``MatMul``
is a single-threaded Eigen kernel, whose bits no thread split changes (the same on every CPU measured, natively and
emulated: docs/troubleshooting.md#thor-cpu). The rest of THOR (inverses, preconditioning) then reads float32
statistics that do not depend on the cores or the L2 cache; the network's own operators still differ between CPU
families (AVX-512 or AVX2 only), so THOR's figures do too."""

from __future__ import annotations

import mindspore as ms
import numpy as np
from mindspore import nn, ops

STATS_PREFIX = "thor_stats."  # the statistics buffers the wrapped layers add to the network


def is_statistic(name: str) -> bool:
    """Whether the network parameter ``name`` is a statistics buffer of a wrapped layer (optimizer state)."""
    return name.startswith(STATS_PREFIX)


def _same_pads(size: int, kernel: int, stride: int, dilation: int) -> tuple[int, int]:
    out = (size + stride - 1) // stride
    total = max((out - 1) * stride + (kernel - 1) * dilation + 1 - size, 0)
    return total // 2, total - total // 2


class CapturedLayer(nn.Cell):
    """Transparent wrapper of a Conv2d / Dense layer that records A, G and P while ``capture`` is on."""

    def __init__(self, layer: nn.Cell, loss_scale: float, statistics_dtype: str = "float32"):
        super().__init__(auto_prefix=False)
        self.layer = layer
        self.is_conv = isinstance(layer, nn.Conv2d)
        self.capture = False
        self.inverse_loss_scale = 1.0 / loss_scale
        self.statistics_dtype = statistics_dtype
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
        """im2col rows (N * P, C_in * kh * kw) of the conv input, the same rows transposed, and P. Both are copied
        from ``unfold``'s (N, K, P) output, whose P runs are contiguous: transposing the rows themselves moves single
        floats, slower on CPU (resnet_narrow's gradients with the capture on: 0.93x the time) for the same values."""
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
        rows_t = ops.reshape(ops.transpose(cols, (1, 0, 2)), (self.in_dim, -1))
        return rows, rows_t, positions

    def _second_moment(self, rows, rows_t=None):
        """``rows^T rows / n`` of float32 ``rows`` as float32, the product in ``statistics_dtype``; ``rows_t``:
        ``rows^T`` if the caller has it (the product is then the same GEMM on the same operands)."""
        if rows_t is None:
            rows_t = ops.transpose(rows, (1, 0))
        if self.statistics_dtype == "float64":
            rows, rows_t = ops.cast(rows, ms.float64), ops.cast(rows_t, ms.float64)
            return ops.cast(ops.matmul(rows_t, rows) / rows.shape[0], ms.float32)
        return ops.matmul(rows_t, rows) / rows.shape[0]

    def _save_g(self, dout):
        batch = dout.shape[0]
        if self.is_conv:
            rows = ops.reshape(ops.transpose(dout, (0, 2, 3, 1)), (-1, self.out_dim))
        else:
            rows = ops.reshape(dout, (-1, self.out_dim))
        rows = ops.cast(rows, ms.float32) * (batch * self.inverse_loss_scale)
        return ops.depend(dout, ops.assign(self.g_stat, self._second_moment(rows)))

    def construct(self, x):
        if self.capture:
            inputs = ops.stop_gradient(ops.cast(x, ms.float32))
            if self.is_conv:
                rows, rows_t, positions = self._patches(inputs)
            else:
                rows, rows_t, positions = ops.reshape(inputs, (-1, self.in_dim)), None, 1
            x = ops.depend(x, ops.assign(self.a_stat, self._second_moment(rows, rows_t)))
            x = ops.depend(x, ops.assign(self.positions, ops.scalar_to_tensor(positions, ms.float32)))
            return self.hook(self.layer(x))
        return self.layer(x)


def supported(cell: nn.Cell) -> bool:
    if isinstance(cell, nn.Conv2d):
        return cell.group == 1 and cell.data_format == "NCHW"
    return type(cell) is nn.Dense and not cell.activation_flag


def wrap_layers(net: nn.Cell, loss_scale: float, statistics_dtype: str = "float32") -> list[CapturedLayer]:
    """Replace every supported Conv2d / Dense of ``net`` by a ``CapturedLayer`` wrapper (in place).

    Idempotent: wrappers already present are reused (with the new loss scale and statistics dtype). Returns the
    wrappers in traversal order.
    """
    found: list[CapturedLayer] = []

    def visit(cell: nn.Cell) -> None:
        changed = False
        for name, child in list(cell.name_cells().items()):
            if child is None:
                continue
            if isinstance(child, CapturedLayer):
                child.inverse_loss_scale = 1.0 / loss_scale
                child.statistics_dtype = statistics_dtype
                found.append(child)
            elif supported(child):
                wrapper = CapturedLayer(child, loss_scale, statistics_dtype)
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
