"""Learning-rate schedules against closed forms written independently here (RECIPES.md, "Schedules")."""

from __future__ import annotations

import math

import numpy as np
import pytest

from pipelines.optim.schedules import (
    LR_SCHEDULES,
    bert_polynomial_decay,
    bert_warmup_polynomial_lr,
    momentum_lr,
    scaled_lr_max,
)

LR_INIT, LR_MAX, LR_END = 0.01, 0.8, 0.002
EPOCHS, STEPS_PER_EPOCH, WARMUP_EPOCHS = 10, 7, 2
T = EPOCHS * STEPS_PER_EPOCH  # 70 steps
W = WARMUP_EPOCHS * STEPS_PER_EPOCH  # 14 warmup steps
MILESTONES = (3, 6, 8)
GAMMA = 0.1


def expected_lr(schedule: str, i: int, warmup: int = W, total: int = T) -> float:
    """Step ``i``'s learning rate, straight from the recipe formulas."""
    if i < warmup:
        return LR_INIT + (LR_MAX - LR_INIT) * i / warmup
    if schedule == "linear":
        return LR_MAX - (LR_MAX - LR_END) * (i - warmup) / (total - warmup)
    if schedule == "cosine":
        return LR_MAX * (
            (total - i) / (total - warmup) * 0.5 * (1 + math.cos(math.pi * 2 * 0.47 * i / (total - warmup))) + 1e-5
        )
    if schedule == "poly":
        return LR_MAX * (1 - (i - warmup) / (total - warmup)) ** 2
    if schedule == "steps":
        epoch = i // STEPS_PER_EPOCH  # 0-based epoch the step belongs to
        return LR_MAX * GAMMA ** sum(epoch >= m for m in MILESTONES)
    if schedule == "constant":
        return LR_MAX
    raise AssertionError(schedule)


def lrs(schedule: str, warmup_epochs: float = WARMUP_EPOCHS) -> np.ndarray:
    return momentum_lr(schedule, LR_INIT, LR_MAX, LR_END, warmup_epochs, EPOCHS, STEPS_PER_EPOCH, MILESTONES, GAMMA)


# first warmup step, mid warmup, last warmup step, first post-warmup step, middle, last
CHECKED_STEPS = (0, W // 2, W - 1, W, (W + T) // 2, T - 1)


def test_all_recipe_schedules_are_registered():
    assert set(LR_SCHEDULES) == {"linear", "cosine", "poly", "steps", "constant"}


@pytest.mark.parametrize("schedule", ["linear", "cosine", "poly", "steps", "constant"])
def test_schedule_matches_closed_form(schedule):
    values = lrs(schedule)
    assert values.shape == (T,)
    assert values.dtype == np.float32
    for i in CHECKED_STEPS:
        assert values[i] == pytest.approx(expected_lr(schedule, i), rel=1e-6, abs=1e-9), f"step {i}"
    # every step, not only the sampled ones
    full = np.array([expected_lr(schedule, i) for i in range(T)], dtype=np.float64)
    np.testing.assert_allclose(values, full, rtol=1e-6, atol=1e-9)


@pytest.mark.parametrize("schedule", ["linear", "cosine", "poly", "steps", "constant"])
def test_warmup_is_linear_from_lr_init_to_lr_max(schedule):
    values = lrs(schedule)
    assert values[0] == pytest.approx(LR_INIT)
    np.testing.assert_allclose(np.diff(values[:W]), (LR_MAX - LR_INIT) / W, rtol=1e-4)
    # warmup ends where the decay starts: lr_max at the first post-warmup step (cosine: close to it)
    if schedule != "cosine":
        assert values[W] == pytest.approx(LR_MAX)


def test_decaying_schedules_are_monotone_after_warmup():
    for schedule in ("linear", "poly", "steps"):
        assert np.all(np.diff(lrs(schedule)[W:]) <= 0), schedule


def test_linear_reaches_lr_end_only_after_the_last_step():
    values = lrs("linear")
    # last step is one step short of lr_end: lr_max - (lr_max - lr_end) * (T-1-W)/(T-W)
    assert values[-1] > LR_END
    assert values[-1] == pytest.approx(LR_END + (LR_MAX - LR_END) / (T - W), rel=1e-5)


def test_steps_schedule_drops_at_each_milestone_epoch():
    values = lrs("steps")
    for k, milestone in enumerate(MILESTONES, start=1):
        first = milestone * STEPS_PER_EPOCH
        assert values[first - 1] == pytest.approx(LR_MAX * GAMMA ** (k - 1))
        assert values[first] == pytest.approx(LR_MAX * GAMMA**k)


@pytest.mark.parametrize("schedule", ["linear", "cosine", "poly", "steps", "constant"])
def test_no_warmup(schedule):
    values = lrs(schedule, warmup_epochs=0)
    assert values.shape == (T,)
    assert values.dtype == np.float32
    expected = np.array([expected_lr(schedule, i, warmup=0) for i in range(T)])
    np.testing.assert_allclose(values, expected, rtol=1e-6, atol=1e-9)
    if schedule != "cosine":
        assert values[0] == pytest.approx(LR_MAX)  # no ramp: the first step already runs at lr_max
    else:
        assert values[0] == pytest.approx(LR_MAX * (1 + 1e-5))


def test_fractional_warmup_epochs_round_to_whole_steps():
    # 0.5 epoch of 7 steps -> round(3.5) = 4 warmup steps (Python rounds half to even)
    values = lrs("constant", warmup_epochs=0.5)
    warmup = round(0.5 * STEPS_PER_EPOCH)
    np.testing.assert_allclose(values[:warmup], [LR_INIT + (LR_MAX - LR_INIT) * i / warmup for i in range(warmup)])
    np.testing.assert_allclose(values[warmup:], LR_MAX)


@pytest.mark.parametrize(("epochs", "steps"), [(1, 1), (3, 5), (90, 11)])
def test_length_is_epochs_times_steps(epochs, steps):
    values = momentum_lr("linear", 0.0, 0.1, 0.0, 1, epochs, steps)
    assert len(values) == epochs * steps
    assert values.dtype == np.float32


def test_unknown_schedule_is_rejected_with_the_choices():
    with pytest.raises(ValueError, match="unknown lr schedule 'exponential'") as error:
        momentum_lr("exponential", LR_INIT, LR_MAX, LR_END, WARMUP_EPOCHS, EPOCHS, STEPS_PER_EPOCH)
    assert "cosine" in str(error.value)


@pytest.mark.parametrize(
    ("lr_max", "devices", "reference", "expected"),
    [(0.8, 8, 8, 0.8), (0.8, 1, 8, 0.1), (0.8, 16, 8, 1.6), (0.1, 2, 4, 0.05)],
)
def test_scaled_lr_max_is_linear_in_device_count(lr_max, devices, reference, expected):
    assert scaled_lr_max(lr_max, devices, reference) == pytest.approx(expected)


def test_scaled_lr_max_default_reference_is_eight_devices():
    assert scaled_lr_max(0.8, 1) == pytest.approx(0.1)


def models_repo_poly_lr(lr_end: float, lr_max: float, total_steps: int, poly_power: float) -> list[float]:
    """The models repo's ``Bert_thor/src/utils.py::_get_poly_lr`` as ``get_bert_thor_lr/damping`` call it
    (global_step 0, lr_init 0, warmup_steps 0), transcribed."""
    values = []
    for i in range(total_steps):
        base = 1.0 - float(i) / float(total_steps)
        lr = float(lr_max - lr_end) * base**poly_power + lr_end
        values.append(max(lr, 0.0))
    return values


@pytest.mark.parametrize(
    ("value_max", "value_min", "power"),
    [(0.006464, 1e-6, 2.0), (0.007035, 1e-6, 4.0), (0.0034, 3.244e-5, 1.0)],  # THOR lr, THOR damping, helper defaults
)
def test_bert_polynomial_decay_matches_the_models_repo_array(value_max, value_min, power):
    values = bert_polynomial_decay(value_max=value_max, value_min=value_min, power=power, total_steps=100, steps=100)
    assert values.dtype == np.float32
    np.testing.assert_allclose(values, models_repo_poly_lr(value_min, value_max, 100, power), rtol=1e-6)


def test_bert_polynomial_decay_at_chosen_steps():
    # lr of pretrain_config_Ascend_Thor.yaml over 100 steps, 20 more past the end
    values = bert_polynomial_decay(value_max=0.006464, value_min=1e-6, power=2.0, total_steps=100, steps=120)
    assert values.shape == (120,)
    assert values[0] == pytest.approx(0.006464, rel=1e-6)  # i counts from 0: the first step is the max
    assert values[50] == pytest.approx(0.006463 * 0.5**2 + 1e-6, rel=1e-6)  # 0.00161675
    assert values[99] == pytest.approx(0.006463 * 0.01**2 + 1e-6, rel=1e-6)  # 1.6463e-6: one step short of min
    np.testing.assert_allclose(values[100:], 1e-6, rtol=1e-6)  # past total_steps: held at value_min
    # damping, power 4, and the helpers' default lr (power 1, 30,000 steps) halfway
    damping = bert_polynomial_decay(value_max=0.007035, value_min=1e-6, power=4.0, total_steps=100, steps=100)
    assert damping[50] == pytest.approx(0.007034 * 0.0625 + 1e-6, rel=1e-6)  # 0.000440625
    lr = bert_polynomial_decay(value_max=0.0034, value_min=3.244e-5, power=1.0, total_steps=30000, steps=30000)
    assert lr[15000] == pytest.approx(0.00336756 * 0.5 + 3.244e-5, rel=1e-6)  # 0.00171622


def test_bert_polynomial_decay_clips_at_zero():
    values = bert_polynomial_decay(value_max=1.0, value_min=-0.1, power=1.0, total_steps=10, steps=12)
    assert values[5] == pytest.approx(1.1 * 0.5 - 0.1)
    assert values[9] == pytest.approx(1.1 * 0.1 - 0.1)
    np.testing.assert_array_equal(values[10:], 0.0)


def test_bert_warmup_polynomial_lr_at_chosen_steps():
    # Lamb-like: power 2, end 0; 10 warm-up steps, decay over 40 (the global step, warm-up included)
    values = bert_warmup_polynomial_lr(lr_max=3e-4, lr_end=0.0, power=2.0, warmup_steps=10, decay_steps=40, steps=50)
    assert values.shape == (50,)
    assert values.dtype == np.float32
    assert values[0] == 0.0  # WarmUpLR at global_step 0
    assert values[5] == pytest.approx(1.5e-4, rel=1e-6)
    assert values[9] == pytest.approx(2.7e-4, rel=1e-6)  # last warm-up step, one step short of lr_max
    assert values[10] == pytest.approx(3e-4 * 0.75**2, rel=1e-6)  # 1.6875e-4: the decay already 10 steps in
    assert values[20] == pytest.approx(3e-4 * 0.5**2, rel=1e-6)  # 7.5e-5
    assert values[39] == pytest.approx(3e-4 / 40**2, rel=1e-6)  # 1.875e-7
    np.testing.assert_array_equal(values[40:], 0.0)  # PolynomialDecayLR caps the step at decay_steps


def test_bert_warmup_polynomial_lr_without_warmup_ends_at_lr_end():
    values = bert_warmup_polynomial_lr(lr_max=1e-3, lr_end=1e-5, power=1.0, warmup_steps=0, decay_steps=10, steps=13)
    assert values[0] == pytest.approx(1e-3, rel=1e-6)
    assert values[5] == pytest.approx(0.99e-3 * 0.5 + 1e-5, rel=1e-6)  # 5.05e-4
    np.testing.assert_allclose(values[10:], 1e-5, rtol=1e-6)


def test_bert_warmup_polynomial_lr_matches_mindspore_schedules():
    """BertLearningRate's two MindSpore cells, evaluated at each global step, against the array."""
    import mindspore as ms
    from mindspore import nn

    warmup = nn.WarmUpLR(3e-4, 10)
    decay = nn.PolynomialDecayLR(3e-4, 1e-6, 40, 2.0)
    expected = []
    for i in range(50):
        step = ms.Tensor(i, ms.int32)
        expected.append(float((warmup if i < 10 else decay)(step).asnumpy()))
    values = bert_warmup_polynomial_lr(lr_max=3e-4, lr_end=1e-6, power=2.0, warmup_steps=10, decay_steps=40, steps=50)
    np.testing.assert_allclose(values, expected, rtol=1e-5, atol=1e-12)
