"""The schedules (learning rates, THOR's damping) against closed forms written independently here (RECIPES.md,
"Schedules"), and ``per_step`` against the configured shapes."""

from __future__ import annotations

import math

import numpy as np
import pytest

from trainlib.optim.schedules import (
    SHAPES,
    WARMUP_SHAPES,
    exponential_schedule,
    mlperf_polynomial_schedule,
    per_step,
    polynomial_schedule,
    scaled_peak,
    thor_schedule,
    warmup_schedule,
)
from trainlib.params import Schedule

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
    if schedule == "quadratic":
        return LR_MAX * (1 - (i - warmup) / (total - warmup)) ** 2
    if schedule == "steps":
        epoch = i // STEPS_PER_EPOCH  # 0-based epoch the step belongs to
        return LR_MAX * GAMMA ** sum(epoch >= m for m in MILESTONES)
    if schedule == "constant":
        return LR_MAX
    raise AssertionError(schedule)


def lrs(schedule: str, warmup_epochs: float = WARMUP_EPOCHS) -> np.ndarray:
    return warmup_schedule(schedule, LR_INIT, LR_MAX, LR_END, warmup_epochs, EPOCHS, STEPS_PER_EPOCH, MILESTONES, GAMMA)


# first warmup step, mid warmup, last warmup step, first post-warmup step, middle, last
CHECKED_STEPS = (0, W // 2, W - 1, W, (W + T) // 2, T - 1)


def test_all_recipe_schedules_are_registered():
    assert set(WARMUP_SHAPES) == {"linear", "cosine", "quadratic", "steps", "constant"}
    assert set(SHAPES) == {*WARMUP_SHAPES, "thor", "exponential", "polynomial", "mlperf_polynomial"}


@pytest.mark.parametrize("schedule", ["linear", "cosine", "quadratic", "steps", "constant"])
def test_schedule_matches_closed_form(schedule):
    values = lrs(schedule)
    assert values.shape == (T,)
    assert values.dtype == np.float32
    for i in CHECKED_STEPS:
        assert values[i] == pytest.approx(expected_lr(schedule, i), rel=1e-6, abs=1e-9), f"step {i}"
    # every step, not only the sampled ones
    full = np.array([expected_lr(schedule, i) for i in range(T)], dtype=np.float64)
    np.testing.assert_allclose(values, full, rtol=1e-6, atol=1e-9)


@pytest.mark.parametrize("schedule", ["linear", "cosine", "quadratic", "steps", "constant"])
def test_warmup_is_linear_from_start_to_peak(schedule):
    values = lrs(schedule)
    assert values[0] == pytest.approx(LR_INIT)
    np.testing.assert_allclose(np.diff(values[:W]), (LR_MAX - LR_INIT) / W, rtol=1e-4)
    # warmup ends where the decay starts: lr_max at the first post-warmup step (cosine: close to it)
    if schedule != "cosine":
        assert values[W] == pytest.approx(LR_MAX)


def test_decaying_schedules_are_monotone_after_warmup():
    for schedule in ("linear", "quadratic", "steps"):
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


@pytest.mark.parametrize("schedule", ["linear", "cosine", "quadratic", "steps", "constant"])
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
    values = warmup_schedule("linear", 0.0, 0.1, 0.0, 1, epochs, steps)
    assert len(values) == epochs * steps
    assert values.dtype == np.float32


def test_unknown_schedule_is_rejected_with_the_choices():
    with pytest.raises(ValueError, match="unknown warm-up schedule 'exponential'") as error:
        warmup_schedule("exponential", LR_INIT, LR_MAX, LR_END, WARMUP_EPOCHS, EPOCHS, STEPS_PER_EPOCH)
    assert "cosine" in str(error.value)


@pytest.mark.parametrize(
    ("peak", "devices", "reference", "expected"),
    [(0.8, 8, 8, 0.8), (0.8, 1, 8, 0.1), (0.8, 16, 8, 1.6), (0.1, 2, 4, 0.05)],
)
def test_scaled_peak_is_linear_in_device_count(peak, devices, reference, expected):
    assert scaled_peak(peak, devices, reference) == pytest.approx(expected)


def test_scaled_peak_default_reference_is_eight_devices():
    assert scaled_peak(0.8, 1) == pytest.approx(0.1)


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
def test_polynomial_without_warmup_matches_the_models_repo_array(value_max, value_min, power):
    values = polynomial_schedule(peak=value_max, end=value_min, warmup_steps=0, power=power, total_steps=100, steps=100)
    assert values.dtype == np.float32
    np.testing.assert_allclose(values, models_repo_poly_lr(value_min, value_max, 100, power), rtol=1e-6)


def test_polynomial_without_warmup_at_chosen_steps():
    # lr of pretrain_config_Ascend_Thor.yaml over 100 steps, 20 more past the end
    values = polynomial_schedule(peak=0.006464, end=1e-6, warmup_steps=0, power=2.0, total_steps=100, steps=120)
    assert values.shape == (120,)
    assert values[0] == pytest.approx(0.006464, rel=1e-6)  # i counts from 0: the first step is the max
    assert values[50] == pytest.approx(0.006463 * 0.5**2 + 1e-6, rel=1e-6)  # 0.00161675
    assert values[99] == pytest.approx(0.006463 * 0.01**2 + 1e-6, rel=1e-6)  # 1.6463e-6: one step short of min
    np.testing.assert_allclose(values[100:], 1e-6, rtol=1e-6)  # past total_steps: held at value_min
    # damping, power 4, and the helpers' default lr (power 1, 30,000 steps) halfway
    damping = polynomial_schedule(peak=0.007035, end=1e-6, warmup_steps=0, power=4.0, total_steps=100, steps=100)
    assert damping[50] == pytest.approx(0.007034 * 0.0625 + 1e-6, rel=1e-6)  # 0.000440625
    lr = polynomial_schedule(peak=0.0034, end=3.244e-5, warmup_steps=0, power=1.0, total_steps=30000, steps=30000)
    assert lr[15000] == pytest.approx(0.00336756 * 0.5 + 3.244e-5, rel=1e-6)  # 0.00171622


def test_polynomial_without_warmup_clips_at_zero():
    values = polynomial_schedule(peak=1.0, end=-0.1, warmup_steps=0, power=1.0, total_steps=10, steps=12)
    assert values[5] == pytest.approx(1.1 * 0.5 - 0.1)
    assert values[9] == pytest.approx(1.1 * 0.1 - 0.1)
    np.testing.assert_array_equal(values[10:], 0.0)


def test_polynomial_with_warmup_at_chosen_steps():
    # Lamb-like: power 2, end 0; 10 warm-up steps, decay over 40 (the global step, warm-up included)
    values = polynomial_schedule(peak=3e-4, end=0.0, power=2.0, warmup_steps=10, total_steps=40, steps=50)
    assert values.shape == (50,)
    assert values.dtype == np.float32
    assert values[0] == 0.0  # WarmUpLR at global_step 0
    assert values[5] == pytest.approx(1.5e-4, rel=1e-6)
    assert values[9] == pytest.approx(2.7e-4, rel=1e-6)  # last warm-up step, one step short of lr_max
    assert values[10] == pytest.approx(3e-4 * 0.75**2, rel=1e-6)  # 1.6875e-4: the decay already 10 steps in
    assert values[20] == pytest.approx(3e-4 * 0.5**2, rel=1e-6)  # 7.5e-5
    assert values[39] == pytest.approx(3e-4 / 40**2, rel=1e-6)  # 1.875e-7
    np.testing.assert_array_equal(values[40:], 0.0)  # PolynomialDecayLR caps the step at decay_steps


def test_polynomial_with_warmup_without_warmup_ends_at_lr_end():
    values = polynomial_schedule(peak=1e-3, end=1e-5, power=1.0, warmup_steps=0, total_steps=10, steps=13)
    assert values[0] == pytest.approx(1e-3, rel=1e-6)
    assert values[5] == pytest.approx(0.99e-3 * 0.5 + 1e-5, rel=1e-6)  # 5.05e-4
    np.testing.assert_allclose(values[10:], 1e-5, rtol=1e-6)


def test_polynomial_with_warmup_matches_mindspore_schedules():
    """BertLearningRate's two MindSpore cells, evaluated at each global step, against the array."""
    import mindspore as ms
    from mindspore import nn

    warmup = nn.WarmUpLR(3e-4, 10)
    decay = nn.PolynomialDecayLR(3e-4, 1e-6, 40, 2.0)
    expected = []
    for i in range(50):
        step = ms.Tensor(i, ms.int32)
        expected.append(float((warmup if i < 10 else decay)(step).asnumpy()))
    values = polynomial_schedule(peak=3e-4, end=1e-6, power=2.0, warmup_steps=10, total_steps=40, steps=50)
    np.testing.assert_allclose(values, expected, rtol=1e-5, atol=1e-12)


def schedule(**keys):
    """A configured ``Schedule`` (``params.Schedule``), as a section's ``lr`` or ``damping`` validates to."""
    from pydantic import TypeAdapter

    return TypeAdapter(Schedule).validate_python(keys, strict=True)


def test_per_step_scales_a_warmup_peak_by_the_devices_and_reads_every_key():
    configured = schedule(
        shape="steps", start=LR_INIT, peak=0.1, end=LR_END, warmup_epochs=WARMUP_EPOCHS, reference_devices=1,
        milestones=list(MILESTONES), gamma=GAMMA,
    )  # fmt: skip
    values = per_step(configured, epochs=EPOCHS, steps_per_epoch=STEPS_PER_EPOCH, devices=8)
    np.testing.assert_array_equal(values, lrs("steps"))  # 0.1 for one device is 0.8 for eight


def test_per_step_of_thor_and_exponential_shapes():
    lr = schedule(shape="thor", peak=0.05803, power=4.0839, end_epoch=53, halve_epoch=39)
    damping = schedule(shape="exponential", peak=0.03, rate=0.50036, decay_epochs=10)
    np.testing.assert_array_equal(
        per_step(lr, epochs=45, steps_per_epoch=4), thor_schedule(0.05803, 4.0839, 53, 45, 4, 39)
    )
    values = per_step(damping, epochs=45, steps_per_epoch=4)
    e = np.arange(1, 45 * 4 + 1) / 4
    np.testing.assert_allclose(values, 0.03 * 0.50036 ** (e / 10), rtol=1e-6)
    np.testing.assert_array_equal(values, exponential_schedule(0.03, 0.50036, 10, 45, 4))


@pytest.mark.parametrize("warmup_steps", [0, 10])
def test_per_step_of_a_polynomial_without_total_steps_decays_over_every_step_of_the_training(warmup_steps):
    configured = schedule(
        shape="polynomial", peak=1e-3, end=0.0, power=1.0, warmup_steps=warmup_steps, total_steps=None
    )
    values = per_step(configured, epochs=3, steps_per_epoch=20)
    assert len(values) == 60
    # the decay counts from step 0 over all 60 steps (warm-up included): the last step still has an lr
    # (total - warm-up left the last warmup_steps steps at lr 0)
    for i in (warmup_steps, 30, 59):
        assert values[i] == pytest.approx(1e-3 * (1 - i / 60), rel=1e-6)
    assert values[-1] > 0


def mlperf_lr(i: int, peak: float, end: float, warmup: int, total: int) -> float:
    """MLPerf's ``PolynomialDecayWithWarmup`` at step ``i``: the warm-up while ``i <= warmup``, then Keras'
    ``PolynomialDecay`` (power 2) of ``i - warmup`` over ``total - warmup + 1`` decay steps."""
    if i <= warmup:
        return peak * i / warmup
    decay_steps = total - warmup + 1
    return (peak - end) * (1 - min(i - warmup, decay_steps) / decay_steps) ** 2 + end


def test_mlperf_polynomial_matches_the_reference_formula():
    """MLPerf's batch-4096 values (peak 10, 5 warm-up epochs, end 1e-4) on 42 epochs of 4 steps."""
    values = mlperf_polynomial_schedule(10.0, 1e-4, 2.0, 5, 42, 4)
    assert values.shape == (168,) and values.dtype == np.float32
    expected = [mlperf_lr(i, 10.0, 1e-4, 20, 168) for i in range(168)]
    np.testing.assert_allclose(values, expected, rtol=1e-6)
    assert values[0] == 0.0 and values[10] == pytest.approx(5.0) and values[20] == pytest.approx(10.0)
    assert values[21] == pytest.approx((10 - 1e-4) * (148 / 149) ** 2 + 1e-4, rel=1e-6)  # the decay's first step
    assert values[-1] == pytest.approx((10 - 1e-4) * (2 / 149) ** 2 + 1e-4, rel=1e-6)  # near end, never below it


def test_mlperf_polynomial_without_warmup_starts_at_peak_and_per_step_reads_it():
    configured = schedule(shape="mlperf_polynomial", peak=2.0, end=0.01, power=2.0, warmup_epochs=0.0)
    values = per_step(configured, epochs=3, steps_per_epoch=5)
    np.testing.assert_array_equal(values, mlperf_polynomial_schedule(2.0, 0.01, 2.0, 0.0, 3, 5))
    assert values[0] == pytest.approx(2.0) and np.isfinite(values).all()
    np.testing.assert_allclose(values, [mlperf_lr(i, 2.0, 0.01, 0, 15) if i else 2.0 for i in range(15)], rtol=1e-6)
