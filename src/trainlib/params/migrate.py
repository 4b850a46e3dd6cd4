"""``conf/base/parameters_migrate.yml``: PyTorch weights into MindSpore, and the parity check of the result."""

from __future__ import annotations

from typing import Annotated

from pydantic import Field

from trainlib.params.base import Section
from trainlib.params.choices import TorchvisionArchitecture
from trainlib.params.numbers import PositiveFloat, PositiveInt


class MigrationParity(Section):
    """One seeded batch of standard-normal images; tolerances are absolute (relative for updates)."""

    image_size: PositiveInt
    batch_size: Annotated[int, Field(ge=2)]  # training-mode BatchNorm needs two values per channel
    seed: int
    lr: PositiveFloat
    forward_tolerance: PositiveFloat
    step_weight_tolerance: PositiveFloat
    step_update_tolerance: PositiveFloat
    step_noise_factor: PositiveFloat


class MigrateParams(Section):
    state_dict: str
    architecture: TorchvisionArchitecture
    num_classes: PositiveInt
    parity: MigrationParity
