"""Label-smoothing cross entropy of the ResNet recipes."""

from __future__ import annotations

import mindspore as ms
from mindspore import nn, ops


class CrossEntropySmooth(nn.Cell):
    """Softmax cross entropy against smoothed one-hot labels.

    The true class gets ``1 - smooth_factor``, every other class ``smooth_factor / (C - 1)``;
    with ``smooth_factor = 0`` this is plain cross entropy. Labels are class indices (int32).
    """

    def __init__(self, num_classes: int, smooth_factor: float = 0.0):
        super().__init__()
        if not 0.0 <= smooth_factor < 1.0:
            raise ValueError(f"label smoothing factor must be in [0, 1), got {smooth_factor}")
        self.on_value = ms.Tensor(1.0 - smooth_factor, ms.float32)
        self.off_value = ms.Tensor(smooth_factor / (num_classes - 1), ms.float32)
        self.ce = nn.SoftmaxCrossEntropyWithLogits(sparse=False, reduction="mean")

    def construct(self, logits, labels):
        one_hot = ops.one_hot(labels, ops.shape(logits)[1], self.on_value, self.off_value)
        return self.ce(logits, one_hot)
