"""Random torchvision-layout ResNet weights for the migrate tests (needs the ``migrate`` extra: PyTorch)."""

from __future__ import annotations

import torch

from trainlib.migrate.torch_resnet import TorchResNet
from trainlib.params import MigrationParity

IMAGE_SIZE = 64  # at 32 px the last stage is 1 x 1: training-mode BatchNorm over 4 values is ill-conditioned

# the parity the migrate tests hold a random resnet18 to, in process and through `kedro run`
PARITY = MigrationParity(
    image_size=IMAGE_SIZE,
    batch_size=4,
    # With seed 0 one ReLU input of the random resnet18 lies 1.2e-8 from zero: the loss has a kink there
    # (one-sided finite differences: PyTorch takes the right derivative, MindSpore the left, 8 % apart for
    # layers.0.bn1.beta), so no float32 implementation can be held to 1e-3 on that batch.
    seed=1,
    lr=0.1,
    forward_tolerance=1e-4,
    step_weight_tolerance=1e-4,
    step_update_tolerance=1e-3,
    step_noise_factor=2.0,
)


def random_torch_resnet(name: str, num_classes: int, seed: int = 0) -> torch.nn.Module:
    """A torchvision-layout ResNet with random weights, BatchNorm affine terms and running statistics.

    The statistics are those of two random batches (then jittered), not torch's defaults 0 and 1,
    so a mix-up of mean, variance or layers changes the logits; being close to the real activation
    statistics, they keep the logits of a deep network O(1) in inference mode, where an absolute
    float32 bound of 1e-4 means something.
    """
    torch.manual_seed(seed)
    model = TorchResNet(name, num_classes)
    generator = torch.Generator().manual_seed(seed)
    norms = [m for m in model.modules() if isinstance(m, torch.nn.BatchNorm2d)]
    with torch.no_grad():
        for norm in norms:
            norm.weight.uniform_(0.5, 1.5, generator=generator)
            norm.bias.normal_(0.0, 0.1, generator=generator)
            norm.momentum = None  # cumulative average: the statistics of the calibration batches
            norm.reset_running_stats()
        model.train()
        for _ in range(2):
            model(torch.randn(4, 3, IMAGE_SIZE, IMAGE_SIZE, generator=generator))
        for norm in norms:
            norm.momentum = 0.1
            norm.running_mean.add_(torch.randn(norm.running_mean.shape, generator=generator) * 0.05)
            norm.running_var.mul_(torch.empty(norm.running_var.shape).uniform_(0.8, 1.25, generator=generator))
    return model.eval()


def save_state_dict(model: torch.nn.Module, path) -> str:
    torch.save(model.state_dict(), path)
    return str(path)
