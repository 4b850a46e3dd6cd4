"""The number types of the parameter models, each a pydantic ``Field`` range on ``int`` or ``float``."""

from __future__ import annotations

from typing import Annotated

from pydantic import Field

PositiveInt = Annotated[int, Field(gt=0)]
NonNegativeInt = Annotated[int, Field(ge=0)]
PositiveFloat = Annotated[float, Field(gt=0)]
NonNegativeFloat = Annotated[float, Field(ge=0)]
Fraction = Annotated[float, Field(ge=0, lt=1)]  # [0, 1): momentum, label smoothing, shares of steps
OpenFraction = Annotated[float, Field(gt=0, lt=1)]  # (0, 1)
