"""torchvision's ResNet in PyTorch, without torchvision: same modules, same ``state_dict`` keys and shapes.

The migration's parity checks run a PyTorch model side by side with ours, and torchvision has no
CPU build here, so this module rebuilds ``torchvision.models.resnet{18,34,50,101}`` (v1.5: the
bottleneck's stride sits on its 3x3 convolution): ``conv1``, ``bn1``, ``layer1.0.conv1`` …
``layer4.2.bn3``, ``downsample.0``/``downsample.1``, ``fc``. PyTorch is an optional dependency
(``pip install -e '.[migrate]'``); importing this module without it raises ``ImportError`` saying so.
"""

from __future__ import annotations

from trainlib.migrate.layouts import TORCH_INSTALL_HINT, TORCHVISION_ARCHITECTURES
from trainlib.models.resnet import RESNET_LAYOUTS

try:
    import torch
    from torch import nn
except ImportError as error:
    raise ImportError(TORCH_INSTALL_HINT) from error


def _conv3x3(in_ch: int, out_ch: int, stride: int = 1) -> nn.Conv2d:
    return nn.Conv2d(in_ch, out_ch, kernel_size=3, stride=stride, padding=1, bias=False)


def _conv1x1(in_ch: int, out_ch: int, stride: int = 1) -> nn.Conv2d:
    return nn.Conv2d(in_ch, out_ch, kernel_size=1, stride=stride, bias=False)


class BasicBlock(nn.Module):
    expansion = 1

    def __init__(self, in_ch: int, width: int, stride: int, downsample: nn.Module | None):
        super().__init__()
        self.conv1 = _conv3x3(in_ch, width, stride)
        self.bn1 = nn.BatchNorm2d(width)
        self.relu = nn.ReLU(inplace=True)
        self.conv2 = _conv3x3(width, width)
        self.bn2 = nn.BatchNorm2d(width)
        self.downsample = downsample

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        identity = x if self.downsample is None else self.downsample(x)
        out = self.relu(self.bn1(self.conv1(x)))
        out = self.bn2(self.conv2(out))
        return self.relu(out + identity)


class Bottleneck(nn.Module):
    expansion = 4

    def __init__(self, in_ch: int, width: int, stride: int, downsample: nn.Module | None):
        super().__init__()
        self.conv1 = _conv1x1(in_ch, width)
        self.bn1 = nn.BatchNorm2d(width)
        self.conv2 = _conv3x3(width, width, stride)
        self.bn2 = nn.BatchNorm2d(width)
        self.conv3 = _conv1x1(width, width * self.expansion)
        self.bn3 = nn.BatchNorm2d(width * self.expansion)
        self.relu = nn.ReLU(inplace=True)
        self.downsample = downsample

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        identity = x if self.downsample is None else self.downsample(x)
        out = self.relu(self.bn1(self.conv1(x)))
        out = self.relu(self.bn2(self.conv2(out)))
        out = self.bn3(self.conv3(out))
        return self.relu(out + identity)


class TorchResNet(nn.Module):
    """``torchvision.models.ResNet`` for the registered layout ``name`` (``TORCHVISION_ARCHITECTURES``)."""

    def __init__(self, name: str, num_classes: int = 1000):
        super().__init__()
        if name not in TORCHVISION_ARCHITECTURES:
            raise ValueError(f"no torchvision ResNet named {name!r}; choose one of {TORCHVISION_ARCHITECTURES}")
        layout = RESNET_LAYOUTS[name]
        block = Bottleneck if layout.block == "bottleneck" else BasicBlock
        self.conv1 = nn.Conv2d(3, 64, kernel_size=7, stride=2, padding=3, bias=False)
        self.bn1 = nn.BatchNorm2d(64)
        self.relu = nn.ReLU(inplace=True)
        self.maxpool = nn.MaxPool2d(kernel_size=3, stride=2, padding=1)
        in_ch = 64
        for stage, n_blocks in enumerate(layout.blocks_per_stage):
            width = 64 * 2**stage
            stride = 1 if stage == 0 else 2
            out_ch = width * block.expansion
            downsample = None
            if stride != 1 or in_ch != out_ch:
                downsample = nn.Sequential(_conv1x1(in_ch, out_ch, stride), nn.BatchNorm2d(out_ch))
            blocks = [block(in_ch, width, stride, downsample)]
            blocks += [block(out_ch, width, 1, None) for _ in range(1, n_blocks)]
            self.add_module(f"layer{stage + 1}", nn.Sequential(*blocks))
            in_ch = out_ch
        self.avgpool = nn.AdaptiveAvgPool2d((1, 1))
        self.fc = nn.Linear(in_ch, num_classes)
        for module in self.modules():
            if isinstance(module, nn.Conv2d):
                nn.init.kaiming_normal_(module.weight, mode="fan_out", nonlinearity="relu")

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.maxpool(self.relu(self.bn1(self.conv1(x))))
        x = self.layer4(self.layer3(self.layer2(self.layer1(x))))
        return self.fc(torch.flatten(self.avgpool(x), 1))
