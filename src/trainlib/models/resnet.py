"""ResNet family in MindSpore, following the models-repo recipe (ResNet v1.5).

``create_resnet(name, num_classes, ...)`` is the single entry point; ``RESNET_LAYOUTS``
is the registry of names, so a recipe picks its network by configuration.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import get_args

import mindspore as ms
from mindspore import nn, ops
from mindspore.common import initializer as init

from trainlib.params import Initialiser, NetworkName

CONV_INITS = DENSE_INITS = get_args(Initialiser)


@dataclass(frozen=True)
class ResNetLayout:
    block: str  # "basic" or "bottleneck"
    blocks_per_stage: tuple[int, ...]
    base_width: int = 64
    small_input_stem: bool = False  # 3x3 stride-1 stem without max-pool, for 28-64 px images


# one layout per name of trainlib.params.NetworkName (tests/models/test_resnet.py checks none is missing)
RESNET_LAYOUTS: dict[NetworkName, ResNetLayout] = {
    "resnet18": ResNetLayout("basic", (2, 2, 2, 2)),
    "resnet34": ResNetLayout("basic", (3, 4, 6, 3)),
    "resnet50": ResNetLayout("bottleneck", (3, 4, 6, 3)),
    "resnet101": ResNetLayout("bottleneck", (3, 4, 23, 3)),
    "resnet_narrow": ResNetLayout("basic", (1, 1, 1, 1), base_width=16, small_input_stem=True),
}


def _weight_init(kind: str, shape: tuple[int, ...]) -> ms.Tensor:
    """Initial weights for a conv or dense layer of ``shape`` (out, in, ...)."""
    fan_in = math.prod(shape[1:])
    if kind == "he_normal":
        initializer = init.HeNormal(mode="fan_out", nonlinearity="relu")
    elif kind == "xavier_uniform":
        initializer = init.XavierUniform()
    elif kind == "truncated_normal":
        # Variance-scaling truncated normal as in the models repo: N(0, sigma) cut at +-2 sigma, where
        # sigma = sqrt(1/fan_in) / .8796 makes the truncated distribution's std sqrt(1/fan_in).
        # MindSpore's bounds a, b are absolute values, not multiples of sigma.
        sigma = math.sqrt(1.0 / fan_in) / 0.87962566103423978
        initializer = init.TruncatedNormal(sigma=sigma, a=-2 * sigma, b=2 * sigma)
    else:
        raise ValueError(f"unknown initialiser {kind!r}; choose one of {CONV_INITS}")
    return init.initializer(initializer, shape, ms.float32)


def _conv(in_ch: int, out_ch: int, kernel: int, stride: int, conv_init: str) -> nn.Conv2d:
    weight = _weight_init(conv_init, (out_ch, in_ch, kernel, kernel))
    return nn.Conv2d(
        in_ch,
        out_ch,
        kernel,
        stride=stride,
        pad_mode="pad",
        padding=kernel // 2,
        has_bias=False,
        weight_init=weight,
    )


def _bn(channels: int, zero_gamma: bool = False) -> nn.BatchNorm2d:
    return nn.BatchNorm2d(channels, momentum=0.9, gamma_init="zeros" if zero_gamma else "ones")


def _down_sample(in_ch: int, out_ch: int, stride: int, conv_init: str) -> nn.SequentialCell | None:
    """The shortcut's 1x1 convolution and BatchNorm where a block changes the shape; None (identity) elsewhere."""
    if stride == 1 and in_ch == out_ch:
        return None
    return nn.SequentialCell([_conv(in_ch, out_ch, 1, stride, conv_init), _bn(out_ch)])


class BasicBlock(nn.Cell):
    expansion = 1

    def __init__(self, in_ch: int, width: int, stride: int, conv_init: str, zero_last_gamma: bool):
        super().__init__()
        out_ch = width * self.expansion
        self.conv1 = _conv(in_ch, width, 3, stride, conv_init)
        self.bn1 = _bn(width)
        self.conv2 = _conv(width, out_ch, 3, 1, conv_init)
        self.bn2 = _bn(out_ch, zero_last_gamma)
        self.relu = nn.ReLU()
        self.down_sample = _down_sample(in_ch, out_ch, stride, conv_init)

    def construct(self, x):
        identity = x if self.down_sample is None else self.down_sample(x)
        out = self.relu(self.bn1(self.conv1(x)))
        out = self.bn2(self.conv2(out))
        return self.relu(out + identity)


class Bottleneck(nn.Cell):
    """v1.5 bottleneck: the stride sits on the 3x3 convolution, not the first 1x1."""

    expansion = 4

    def __init__(self, in_ch: int, width: int, stride: int, conv_init: str, zero_last_gamma: bool):
        super().__init__()
        out_ch = width * self.expansion
        self.conv1 = _conv(in_ch, width, 1, 1, conv_init)
        self.bn1 = _bn(width)
        self.conv2 = _conv(width, width, 3, stride, conv_init)
        self.bn2 = _bn(width)
        self.conv3 = _conv(width, out_ch, 1, 1, conv_init)
        self.bn3 = _bn(out_ch, zero_last_gamma)
        self.relu = nn.ReLU()
        self.down_sample = _down_sample(in_ch, out_ch, stride, conv_init)

    def construct(self, x):
        identity = x if self.down_sample is None else self.down_sample(x)
        out = self.relu(self.bn1(self.conv1(x)))
        out = self.relu(self.bn2(self.conv2(out)))
        out = self.bn3(self.conv3(out))
        return self.relu(out + identity)


class ResNet(nn.Cell):
    def __init__(
        self,
        layout: ResNetLayout,
        num_classes: int,
        in_channels: int = 3,
        conv_init: str = "he_normal",
        dense_init: str = "truncated_normal",
        zero_init_last_bn_gamma: bool = False,
    ):
        super().__init__()
        block_cls = Bottleneck if layout.block == "bottleneck" else BasicBlock
        width = layout.base_width
        if layout.small_input_stem:
            self.stem = nn.SequentialCell([_conv(in_channels, width, 3, 1, conv_init), _bn(width), nn.ReLU()])
        else:
            self.stem = nn.SequentialCell(
                [
                    _conv(in_channels, width, 7, 2, conv_init),
                    _bn(width),
                    nn.ReLU(),
                    # Symmetric padding as in torchvision; "same" pads only bottom/right on even sizes, which
                    # shifts every pooling window and keeps PyTorch-trained weights from reproducing their logits.
                    nn.MaxPool2d(kernel_size=3, stride=2, pad_mode="pad", padding=1),
                ]
            )
        stages = []
        in_ch = width
        for stage_index, n_blocks in enumerate(layout.blocks_per_stage):
            stage_width = layout.base_width * 2**stage_index
            for block_index in range(n_blocks):
                stride = 2 if stage_index > 0 and block_index == 0 else 1
                stages.append(block_cls(in_ch, stage_width, stride, conv_init, zero_init_last_bn_gamma))
                in_ch = stage_width * block_cls.expansion
        self.layers = nn.SequentialCell(stages)
        self.mean = ops.ReduceMean(keep_dims=False)
        self.flatten = nn.Flatten()
        bound = 1.0 / math.sqrt(in_ch)
        self.fc = nn.Dense(
            in_ch,
            num_classes,
            weight_init=_weight_init(dense_init, (num_classes, in_ch)),
            bias_init=init.initializer(init.Uniform(bound), (num_classes,), ms.float32),
        )

    def construct(self, x):
        x = self.layers(self.stem(x))
        x = self.mean(x, (2, 3))
        return self.fc(x)


def create_resnet(
    name: str,
    num_classes: int,
    in_channels: int = 3,
    conv_init: str = "he_normal",
    dense_init: str = "truncated_normal",
    zero_init_last_bn_gamma: bool = False,
) -> ResNet:
    """Build a registered ResNet (``RESNET_LAYOUTS``) with the recipe's initialisation options."""
    if name not in RESNET_LAYOUTS:
        raise ValueError(f"unknown network {name!r}; choose one of {sorted(RESNET_LAYOUTS)}")
    for kind, value, allowed in (("conv_init", conv_init, CONV_INITS), ("dense_init", dense_init, DENSE_INITS)):
        if value not in allowed:
            raise ValueError(f"unknown {kind} {value!r}; choose one of {allowed}")
    return ResNet(RESNET_LAYOUTS[name], num_classes, in_channels, conv_init, dense_init, zero_init_last_bn_gamma)


def count_parameters(net: nn.Cell) -> int:
    """Number of trainable scalars (BatchNorm moving statistics excluded)."""
    return sum(math.prod(p.shape) for p in net.trainable_params())
