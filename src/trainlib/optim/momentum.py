"""Optimizer factories of the recipes, and which parameters take weight decay."""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
from mindspore import nn

NO_DECAY_MARKERS = ("beta", "gamma", "bias")


def decays_unless_norm_or_bias(name: str) -> bool:
    """The ResNet recipes' rule: weight decay except on names holding ``beta``, ``gamma`` or ``bias`` (BatchNorm
    and biases)."""
    return not any(marker in name for marker in NO_DECAY_MARKERS)


def decays_unless_layernorm_or_bias(name: str) -> bool:
    """BERT's decay filter (the THOR document's example, ``lambda x: 'layernorm' not in x.name.lower() and 'bias'
    not in x.name.lower()``): weight decay except on LayerNorm parameters and biases."""
    lowered = name.lower()
    return "layernorm" not in lowered and "bias" not in lowered


def decay_groups(
    net: nn.Cell, weight_decay: float, decays: Callable[[str], bool] = decays_unless_norm_or_bias
) -> list[dict]:
    """Group params: ``weight_decay`` on the trainable parameters whose name ``decays`` accepts, none on the others
    (by default the recipe rule: none on BatchNorm and biases)."""
    decayed, exempt = [], []
    for param in net.trainable_params():
        (decayed if decays(param.name) else exempt).append(param)
    return [
        {"params": decayed, "weight_decay": weight_decay},
        {"params": exempt, "weight_decay": 0.0},
        {"order_params": net.trainable_params()},
    ]


def create_momentum(
    net: nn.Cell,
    lr_per_step: np.ndarray,
    momentum: float,
    weight_decay: float,
    loss_scale: float,
    decays: Callable[[str], bool] = decays_unless_norm_or_bias,
) -> nn.Momentum:
    """Momentum with the recipe's group params (``decay_groups``); gradients arrive multiplied by ``loss_scale``."""
    return nn.Momentum(
        decay_groups(net, weight_decay, decays),
        learning_rate=lr_per_step,
        momentum=momentum,
        loss_scale=loss_scale,
    )
