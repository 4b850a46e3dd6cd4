"""Per-step schedules of every recipe: learning rates and THOR's damping (``../shared/RECIPES.md`` formulas).

``per_step`` turns a configured schedule (``trainlib.params.Schedule``: its ``shape`` chooses the formula) into a
float32 numpy array with one value per training step, which is what MindSpore optimizers take as a dynamic
learning rate and what THOR reads its damping from. One function per family of shapes below it.
"""

from __future__ import annotations

import math
from typing import get_args

import numpy as np

from trainlib.params import SCHEDULE_SHAPES, WarmupShape

WARMUP_SHAPES = get_args(WarmupShape)
SHAPES = SCHEDULE_SHAPES


def per_step(schedule, *, epochs: int, steps_per_epoch: int, devices: int = 1) -> np.ndarray:
    """The values of ``schedule`` (a ``trainlib.params.Schedule``) for each of ``epochs * steps_per_epoch``
    steps; ``devices``: the devices trained on, which a warm-up schedule's ``peak`` scales with."""
    shape = schedule.shape
    if shape in WARMUP_SHAPES:
        return warmup_schedule(
            shape,
            schedule.start,
            scaled_peak(schedule.peak, devices, schedule.reference_devices),
            schedule.end,
            schedule.warmup_epochs,
            epochs,
            steps_per_epoch,
            tuple(schedule.milestones),
            schedule.gamma,
        )
    if shape == "thor":
        return thor_schedule(
            schedule.peak, schedule.power, schedule.end_epoch, epochs, steps_per_epoch, schedule.halve_epoch
        )
    if shape == "exponential":
        return exponential_schedule(schedule.peak, schedule.rate, schedule.decay_epochs, epochs, steps_per_epoch)
    if shape == "polynomial":
        steps = epochs * steps_per_epoch
        return polynomial_schedule(
            peak=schedule.peak,
            end=schedule.end,
            power=schedule.power,
            warmup_steps=schedule.warmup_steps,
            total_steps=schedule.total_steps or steps,  # the decay counts from step 0, warm-up included
            steps=steps,
        )
    if shape == "mlperf_polynomial":
        return mlperf_polynomial_schedule(
            schedule.peak, schedule.end, schedule.power, schedule.warmup_epochs, epochs, steps_per_epoch
        )
    raise ValueError(f"unknown schedule shape {shape!r}; choose one of {SHAPES}")


def _warmup(step: int, warmup_steps: int, start: float, peak: float) -> float:
    return start + (peak - start) * step / warmup_steps


def warmup_schedule(
    shape: str,
    start: float,
    peak: float,
    end: float,
    warmup_epochs: float,
    total_epochs: int,
    steps_per_epoch: int,
    milestones: tuple[int, ...] = (30, 60, 80),
    gamma: float = 0.1,
) -> np.ndarray:
    """The Momentum recipes' schedules for each of ``total_epochs * steps_per_epoch`` steps: a linear warm-up from
    ``start`` to ``peak``, then

    linear: ``peak - (peak-end)(i-W)/(T-W)``;
    cosine: ``peak [(T-i)/(T-W) * 0.5 (1 + cos(2 pi 0.47 i/(T-W))) + 1e-5]``;
    quadratic (the models repo's ``poly``): ``peak (1-(i-W)/(T-W))^2``;
    steps: ``peak * gamma^(number of milestones epochs passed)``;
    constant: ``peak``.
    """
    if shape not in WARMUP_SHAPES:
        raise ValueError(f"unknown warm-up schedule {shape!r}; choose one of {WARMUP_SHAPES}")
    total = total_epochs * steps_per_epoch
    warmup = int(round(warmup_epochs * steps_per_epoch))
    lrs = np.empty(total, dtype=np.float64)
    for i in range(total):
        if i < warmup:
            lrs[i] = _warmup(i, warmup, start, peak)
            continue
        progress = (i - warmup) / max(total - warmup, 1)
        if shape == "linear":
            lrs[i] = peak - (peak - end) * progress
        elif shape == "cosine":
            decayed = (total - i) / (total - warmup) * 0.5 * (1 + math.cos(math.pi * 2 * 0.47 * i / (total - warmup)))
            lrs[i] = peak * (decayed + 1e-5)
        elif shape == "quadratic":
            lrs[i] = peak * (1.0 - progress) ** 2
        elif shape == "steps":
            passed = sum(1 for m in milestones if i >= m * steps_per_epoch)
            lrs[i] = peak * gamma**passed
        else:
            lrs[i] = peak
    return lrs.astype(np.float32)


def scaled_peak(peak: float, device_num: int, reference_devices: int = 8) -> float:
    """Linear scaling of a warm-up schedule's peak with the device count (recipe: ``device_num / 8``)."""
    return peak * device_num / reference_devices


def thor_schedule(
    peak: float,
    power: float,
    end_epoch: float,
    total_epochs: int,
    steps_per_epoch: int,
    halve_epoch: int = 39,
) -> np.ndarray:
    """THOR's ResNet learning rate per step: ``peak (1 - e/end_epoch)^power``, ``e = (i+1)/steps_per_epoch``.

    Halved once ``e >= halve_epoch`` (39) and halved again once ``e >= halve_epoch + 1``. The base
    is clamped at 0 past ``end_epoch`` (the models repo ends its schedule there).
    """
    epochs = np.arange(1, total_epochs * steps_per_epoch + 1, dtype=np.float64) / steps_per_epoch
    lrs = peak * np.maximum(1.0 - epochs / end_epoch, 0.0) ** power
    lrs = np.where(epochs >= halve_epoch, lrs * 0.5, lrs)
    lrs = np.where(epochs >= halve_epoch + 1, lrs * 0.5, lrs)
    return lrs.astype(np.float32)


def exponential_schedule(
    peak: float, rate: float, decay_epochs: float, total_epochs: int, steps_per_epoch: int
) -> np.ndarray:
    """``peak * rate^(e/decay_epochs)`` per step, ``e = (i+1)/steps_per_epoch`` (THOR's ResNet damping: the
    models repo's ``decay_epochs`` is 10)."""
    epochs = np.arange(1, total_epochs * steps_per_epoch + 1, dtype=np.float64) / steps_per_epoch
    return (peak * rate ** (epochs / decay_epochs)).astype(np.float32)


def polynomial_schedule(
    *, peak: float, end: float, power: float, warmup_steps: int, total_steps: int, steps: int
) -> np.ndarray:
    """The models repo's BERT schedules per step (``i`` = the optimizer's global_step, from 0): the first-order
    baseline's lr (``BertLearningRate``) and THOR's lr and damping (``get_bert_thor_lr``,
    ``get_bert_thor_damping``: ``_get_poly_lr`` without warm-up).

    While ``i < warmup_steps`` MindSpore's ``WarmUpLR``, ``peak * i / warmup_steps``; from then on its
    ``PolynomialDecayLR`` over the global step itself (not ``i - warmup_steps``):
    ``(peak - end) (1 - min(i, total_steps)/total_steps)^power + end``, which holds ``end`` from ``total_steps`` on
    (the models repo's THOR array ends at ``total_steps`` instead). ``warmup_steps`` 0 means no warm-up. Values
    below 0 are clipped to 0, as ``_get_poly_lr`` does.
    """
    i = np.arange(steps, dtype=np.float64)
    decayed = (peak - end) * (1.0 - np.minimum(i, total_steps) / total_steps) ** power + end
    if warmup_steps > 0:
        decayed = np.where(i < warmup_steps, peak * i / warmup_steps, decayed)
    return np.maximum(decayed, 0.0).astype(np.float32)


def mlperf_polynomial_schedule(
    peak: float, end: float, power: float, warmup_epochs: float, total_epochs: int, steps_per_epoch: int
) -> np.ndarray:
    """MLPerf ResNet-50's LARS learning rate per step ``i`` (the optimizer's global step, from 0), as
    ``PolynomialDecayWithWarmup`` in ``mlcommons/training`` ``image_classification/tensorflow2/lars_util.py`` computes
    it: ``peak i / W`` while ``i <= W`` (``W`` the warm-up's steps), then Keras' ``PolynomialDecay`` over the steps
    since the warm-up, ``(peak - end)(1 - min(i - W, D)/D)^power + end`` with ``D = T - W + 1``.

    Unlike ``polynomial_schedule`` (BERT's, counted from step 0) the decay starts where the warm-up ends, and unlike
    the warm-up shape ``quadratic`` it ends at ``end``, not 0. ``warmup_epochs`` 0: the decay from step 0 (the
    reference would divide by 0 there).
    """
    total = total_epochs * steps_per_epoch
    warmup = int(round(warmup_epochs * steps_per_epoch))
    decay_steps = total - warmup + 1
    i = np.arange(total, dtype=np.float64)
    decayed = (peak - end) * (1.0 - np.minimum(i - warmup, decay_steps) / decay_steps) ** power + end
    if warmup > 0:
        decayed = np.where(i <= warmup, peak * i / warmup, decayed)
    return decayed.astype(np.float32)
