"""The schedules of every training, learning rates and THOR's damping alike (``<recipe>.lr``, ``thor.damping``)."""

from __future__ import annotations

from typing import Annotated, Literal, get_args

from pydantic import Field

from trainlib.params.base import Section
from trainlib.params.choices import WarmupShape
from trainlib.params.numbers import NonNegativeFloat, NonNegativeInt, PositiveFloat, PositiveInt


class WarmupSchedule(Section):
    """The Momentum recipes' schedules (models repo official/cv/ResNet), per step ``i`` of ``T`` with ``W``
    warm-up steps: ``start + (peak - start) i / W`` during the warm-up, then by ``shape``: linear
    ``peak - (peak - end)(i - W)/(T - W)``; cosine ``peak [(T - i)/(T - W) 0.5 (1 + cos(2 pi 0.47 i/(T - W)))
    + 1e-5]``; quadratic (the models repo's ``poly``) ``peak (1 - (i - W)/(T - W))^2``; steps ``peak gamma^k``
    after the k-th of ``milestones`` (epochs); constant ``peak``. ``peak`` is the value for ``reference_devices``
    devices and scales linearly with the devices trained on."""

    shape: WarmupShape
    start: NonNegativeFloat
    peak: PositiveFloat
    end: NonNegativeFloat  # linear only
    warmup_epochs: NonNegativeFloat
    reference_devices: PositiveInt
    milestones: list[int]  # epochs; steps only
    gamma: float  # steps only


class ThorEpochSchedule(Section):
    """THOR's ResNet learning rate (models repo ``get_thor_lr``): ``peak (1 - e/end_epoch)^power``, halved once
    ``e >= halve_epoch`` and again once ``e >= halve_epoch + 1``, ``e`` the epochs done after the step."""

    shape: Literal["thor"]
    peak: PositiveFloat
    power: float
    end_epoch: PositiveInt
    halve_epoch: int


class ExponentialSchedule(Section):
    """``peak rate^(e/decay_epochs)``, ``e`` the epochs done after the step (THOR's ResNet damping, models repo
    ``get_thor_damping``: ``decay_epochs`` 10)."""

    shape: Literal["exponential"]
    peak: PositiveFloat
    rate: PositiveFloat
    decay_epochs: PositiveFloat


class PolynomialSchedule(Section):
    """The models repo's BERT schedules (``BertLearningRate``, ``get_bert_thor_lr``, ``get_bert_thor_damping``):
    ``peak i / warmup_steps`` during the warm-up, then ``(peak - end)(1 - min(i, total_steps)/total_steps)^power +
    end`` with ``i`` counted from step 0; ``total_steps`` null: the training's steps (all of them, the warm-up's
    included, so the lr reaches ``end`` only after the last step, as the models repo passes the total steps)."""

    shape: Literal["polynomial"]
    peak: PositiveFloat
    end: NonNegativeFloat
    power: PositiveFloat
    warmup_steps: NonNegativeInt
    total_steps: PositiveInt | None


class MlperfPolynomialSchedule(Section):
    """MLPerf ResNet-50's LARS schedule (``mlcommons/training`` ``image_classification/tensorflow2/lars_util.py``,
    ``PolynomialDecayWithWarmup``), per step ``i`` of ``T`` with ``W = warmup_epochs`` epochs of steps:
    ``peak i / W`` while ``i <= W``, then ``(peak - end)(1 - min(i - W, D)/D)^power + end`` with ``D = T - W + 1``,
    the decay counted from the warm-up's end (MLPerf: ``power`` 2, ``end`` 0.0001). ``peak`` is the value for the
    configured global batch: MLPerf picks it per batch size and scales it with no device count."""

    shape: Literal["mlperf_polynomial"]
    peak: PositiveFloat
    end: NonNegativeFloat
    power: PositiveFloat
    warmup_epochs: NonNegativeFloat


# Every schedule of the project, the learning rates and THOR's damping alike: ``shape`` chooses the formula
# (``trainlib.optim.schedules.per_step`` computes it), the same keys mean the same thing in every shape (``peak``
# the value the decay starts from, ``end`` the last, ``power`` the exponent).
Schedule = Annotated[
    WarmupSchedule | ThorEpochSchedule | ExponentialSchedule | PolynomialSchedule | MlperfPolynomialSchedule,
    Field(discriminator="shape"),
]
# every shape, in the order of the union (trainlib.optim.schedules.SHAPES)
SCHEDULE_SHAPES: tuple[str, ...] = tuple(
    shape for member in get_args(get_args(Schedule)[0]) for shape in get_args(member.model_fields["shape"].annotation)
)
