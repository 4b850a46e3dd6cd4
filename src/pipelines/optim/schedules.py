"""Per-step learning-rate schedules of the ResNet recipes (``../shared/RECIPES.md`` formulas).

Every schedule returns a float32 numpy array with one value per training step, which is what
MindSpore optimizers take as a dynamic learning rate.
"""

from __future__ import annotations

import math

import numpy as np

LR_SCHEDULES = ("linear", "cosine", "poly", "steps", "constant")


def _warmup(step: int, warmup_steps: int, lr_init: float, lr_max: float) -> float:
    return lr_init + (lr_max - lr_init) * step / warmup_steps


def momentum_lr(
    schedule: str,
    lr_init: float,
    lr_max: float,
    lr_end: float,
    warmup_epochs: float,
    total_epochs: int,
    steps_per_epoch: int,
    milestones: tuple[int, ...] = (30, 60, 80),
    step_gamma: float = 0.1,
) -> np.ndarray:
    """Learning rate for each of ``total_epochs * steps_per_epoch`` steps.

    linear: warmup then ``lr_max - (lr_max-lr_end)(i-W)/(T-W)``;
    cosine: ``lr_max [(T-i)/(T-W) * 0.5 (1 + cos(2 pi 0.47 i/(T-W))) + 1e-5]``;
    poly: ``lr_max (1-(i-W)/(T-W))^2``;
    steps: ``lr_max * step_gamma^(number of milestones epochs passed)``.
    """
    if schedule not in LR_SCHEDULES:
        raise ValueError(f"unknown lr schedule {schedule!r}; choose one of {LR_SCHEDULES}")
    total = total_epochs * steps_per_epoch
    warmup = int(round(warmup_epochs * steps_per_epoch))
    lrs = np.empty(total, dtype=np.float64)
    for i in range(total):
        if i < warmup:
            lrs[i] = _warmup(i, warmup, lr_init, lr_max)
            continue
        progress = (i - warmup) / max(total - warmup, 1)
        if schedule == "linear":
            lrs[i] = lr_max - (lr_max - lr_end) * progress
        elif schedule == "cosine":
            decayed = (total - i) / (total - warmup) * 0.5 * (1 + math.cos(math.pi * 2 * 0.47 * i / (total - warmup)))
            lrs[i] = lr_max * (decayed + 1e-5)
        elif schedule == "poly":
            lrs[i] = lr_max * (1.0 - progress) ** 2
        elif schedule == "steps":
            passed = sum(1 for m in milestones if i >= m * steps_per_epoch)
            lrs[i] = lr_max * step_gamma**passed
        else:
            lrs[i] = lr_max
    return lrs.astype(np.float32)


def scaled_lr_max(lr_max: float, device_num: int, reference_devices: int = 8) -> float:
    """Linear scaling of the recipe's lr_max with the device count (recipe: ``device_num / 8``)."""
    return lr_max * device_num / reference_devices


def thor_lr(
    lr_init: float,
    lr_decay: float,
    lr_end_epoch: float,
    total_epochs: int,
    steps_per_epoch: int,
    decay_epoch: int = 39,
) -> np.ndarray:
    """THOR learning rate per step: ``lr_init (1 - e/lr_end_epoch)^lr_decay``, ``e = (i+1)/steps_per_epoch``.

    Halved once ``e >= decay_epoch`` (39) and halved again once ``e >= decay_epoch + 1``. The base
    is clamped at 0 past ``lr_end_epoch`` (the models repo ends its schedule there).
    """
    epochs = np.arange(1, total_epochs * steps_per_epoch + 1, dtype=np.float64) / steps_per_epoch
    lrs = lr_init * np.maximum(1.0 - epochs / lr_end_epoch, 0.0) ** lr_decay
    lrs = np.where(epochs >= decay_epoch, lrs * 0.5, lrs)
    lrs = np.where(epochs >= decay_epoch + 1, lrs * 0.5, lrs)
    return lrs.astype(np.float32)


def thor_damping(damping_init: float, damping_decay: float, total_epochs: int, steps_per_epoch: int) -> np.ndarray:
    """THOR damping per step: ``damping_init * damping_decay^(e/10)``, ``e = (i+1)/steps_per_epoch``."""
    epochs = np.arange(1, total_epochs * steps_per_epoch + 1, dtype=np.float64) / steps_per_epoch
    return (damping_init * damping_decay ** (epochs / 10.0)).astype(np.float32)


def bert_polynomial_decay(
    *, value_max: float, value_min: float, power: float, total_steps: int, steps: int
) -> np.ndarray:
    """BERT-THOR's lr or damping per step: ``(value_max - value_min) (1 - i/total_steps)^power + value_min``.

    The models repo's ``official/nlp/Bert_thor/src/utils.py`` (``get_bert_thor_lr``, ``get_bert_thor_damping``,
    both ``_get_poly_lr`` with no warm-up): ``i`` counts from 0, so step 0 is ``value_max`` and the last of its
    ``total_steps`` values is ``(value_max - value_min) (1/total_steps)^power + value_min``; values below 0 are
    clipped to 0. Its array ends at ``total_steps``; here steps from ``total_steps`` on hold ``value_min`` (``i`` is
    capped at ``total_steps``, as in MindSpore's ``PolynomialDecayLR``) instead of leaving the array.
    """
    i = np.minimum(np.arange(steps, dtype=np.float64), total_steps)
    values = (value_max - value_min) * (1.0 - i / total_steps) ** power + value_min
    return np.maximum(values, 0.0).astype(np.float32)


def bert_warmup_polynomial_lr(
    *, lr_max: float, lr_end: float, power: float, warmup_steps: int, decay_steps: int, steps: int
) -> np.ndarray:
    """Lamb / AdamWeightDecay learning rate of the models repo's BERT, per step (``i`` = the optimizer's
    global_step, from 0).

    ``BertLearningRate`` (``official/nlp/Bert/src/utils.py``, the same class in ``Bert_thor/src/utils.py``):
    while ``i < warmup_steps`` MindSpore's ``WarmUpLR``, ``lr_max * i / warmup_steps``; from then on its
    ``PolynomialDecayLR`` over the global step itself (not ``i - warmup_steps``):
    ``(lr_max - lr_end) (1 - min(i, decay_steps)/decay_steps)^power + lr_end``, which holds ``lr_end`` from
    ``decay_steps`` on. ``warmup_steps`` 0 means no warm-up. The models repo passes the training steps as
    ``decay_steps``.
    """
    i = np.arange(steps, dtype=np.float64)
    decayed = (lr_max - lr_end) * (1.0 - np.minimum(i, decay_steps) / decay_steps) ** power + lr_end
    if warmup_steps > 0:
        decayed = np.where(i < warmup_steps, lr_max * i / warmup_steps, decayed)
    return decayed.astype(np.float32)
