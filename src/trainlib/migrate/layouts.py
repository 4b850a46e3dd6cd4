"""What the PyTorch side of a migration needs to know: which layouts torchvision has, and how to get torch."""

from typing import get_args

from trainlib.params import TorchvisionArchitecture

TORCH_INSTALL_HINT = (
    "PyTorch is needed to migrate PyTorch weights but is not installed; install the project's 'migrate' "
    "extra: .venv/bin/pip install -e '.[migrate]' (torch==2.13.0; bash scripts/setup.sh installs it too)"
)
# Our layouts with a torchvision counterpart: the 7x7 stem with max-pool and 64 base channels.
TORCHVISION_ARCHITECTURES = get_args(TorchvisionArchitecture)
