"""Optimizer factories of the recipes."""

from __future__ import annotations

import numpy as np
from mindspore import nn

NO_DECAY_MARKERS = ("beta", "gamma", "bias")


def decay_groups(net: nn.Cell, weight_decay: float) -> list[dict]:
    """Group params: weight decay on conv/dense weights only, none on BatchNorm and biases.

    A parameter is exempt when its name contains ``beta``, ``gamma`` or ``bias`` (recipe rule).
    """
    decayed, exempt = [], []
    for param in net.trainable_params():
        (exempt if any(marker in param.name for marker in NO_DECAY_MARKERS) else decayed).append(param)
    return [
        {"params": decayed, "weight_decay": weight_decay},
        {"params": exempt, "weight_decay": 0.0},
        {"order_params": net.trainable_params()},
    ]


def create_momentum(
    net: nn.Cell, lr_per_step: np.ndarray, momentum: float, weight_decay: float, loss_scale: float
) -> nn.Momentum:
    """Momentum with the recipe's group params; gradients arrive multiplied by ``loss_scale``."""
    return nn.Momentum(
        decay_groups(net, weight_decay),
        learning_rate=lr_per_step,
        momentum=momentum,
        loss_scale=loss_scale,
    )
