"""The LARS cell against a numpy closed form written independently here (MLPerf's ResNet-50 LARS, the module
docstring of ``trainlib.optim.lars``): trust ratio, exclusions, weight decay, momentum with the lr inside, over a few
steps of a changing lr; a zero norm; the excluded parameters' plain momentum; a loss-scaled train step."""

from __future__ import annotations

import numpy as np
import pytest
from pydantic import ValidationError

from trainlib.optim.lars import LARS, create_lars
from trainlib.params import LarsSettings

MOMENTUM, WEIGHT_DECAY, ETA = 0.9, 5e-2, 0.02  # large decay and eta so that both visibly change the ratio
LRS = np.array([0.5, 1.5, 1.0, 0.25], np.float32)  # a changing lr: the lr sits inside the momentum buffer


def settings(*, epsilon: float = 0.0, loss_scale: float = 1.0) -> LarsSettings:
    """The ``lars`` section's optimizer keys at this file's values."""
    return LarsSettings(
        momentum=MOMENTUM, weight_decay=WEIGHT_DECAY, trust_coefficient=ETA, epsilon=epsilon, loss_scale=loss_scale
    )


def reference_step(weights, grads, moments, lr, adapted, *, eta=ETA, weight_decay=WEIGHT_DECAY, epsilon=0.0):
    """One LARS step in float64 numpy; returns the new weights and moments (dicts by name)."""
    new_weights, new_moments = {}, {}
    for name, w in weights.items():
        g = grads[name]
        if adapted[name]:
            w_norm, g_norm = np.linalg.norm(w), np.linalg.norm(g)
            trust = eta * w_norm / (g_norm + weight_decay * w_norm + epsilon) if w_norm > 0 and g_norm > 0 else 1.0
            update = lr * trust * (g + weight_decay * w)
        else:
            update = lr * g
        new_moments[name] = MOMENTUM * moments[name] + update
        new_weights[name] = w - new_moments[name]
    return new_weights, new_moments


@pytest.fixture
def tiny(mindspore_cpu):
    """A cell with a weight, a bias and a BatchNorm (gamma, beta), named as the project's networks name them."""
    from mindspore import nn

    class Tiny(nn.Cell):
        def __init__(self):
            super().__init__()
            self.dense = nn.Dense(4, 3)
            self.bn = nn.BatchNorm1d(3)

        def construct(self, x):
            return self.bn(self.dense(x))

    net = Tiny()
    rng = np.random.default_rng(0)
    for param in net.trainable_params():  # non-trivial values everywhere: gamma 1 / beta 0 would hide an exclusion
        param.set_data(mindspore_cpu.Tensor(rng.standard_normal(param.shape).astype(np.float32)))
    return net


def values(net) -> dict[str, np.ndarray]:
    return {p.name: p.asnumpy().astype(np.float64) for p in net.trainable_params()}


def run_steps(net, optimizer, grads_per_step):
    import mindspore as ms

    for grads in grads_per_step:
        optimizer(tuple(ms.Tensor(grads[p.name].astype(np.float32)) for p in net.trainable_params()))


def reference_steps(start, grads_per_step, adapted, **options):
    weights, moments = start, {name: np.zeros_like(w) for name, w in start.items()}
    for lr, grads in zip(LRS[: len(grads_per_step)], grads_per_step, strict=True):
        weights, moments = reference_step(weights, grads, moments, float(lr), adapted, **options)
    return weights, moments


def random_grads(net, steps, seed=1):
    rng = np.random.default_rng(seed)
    return [{p.name: rng.standard_normal(p.shape) for p in net.trainable_params()} for _ in range(steps)]


def test_excludes_batchnorm_and_bias_by_name(tiny):
    optimizer = create_lars(tiny, LRS, settings())
    flags = dict(zip([p.name for p in optimizer._parameters], optimizer.adapt_flags, strict=True))
    assert flags == {"dense.weight": True, "dense.bias": False, "bn.gamma": False, "bn.beta": False}


def test_steps_match_the_closed_form(tiny):
    start = values(tiny)
    grads = random_grads(tiny, len(LRS))
    optimizer = create_lars(tiny, LRS, settings())
    run_steps(tiny, optimizer, grads)

    adapted = {name: name == "dense.weight" for name in start}
    expected, expected_moments = reference_steps(start, grads, adapted)
    after = values(tiny)
    for name in start:
        np.testing.assert_allclose(after[name], expected[name], rtol=1e-5, atol=1e-6, err_msg=name)
    moments = {m.name.removeprefix("moments."): m.asnumpy() for m in optimizer.moments}
    for name in start:
        np.testing.assert_allclose(moments[name], expected_moments[name], rtol=1e-5, atol=1e-6, err_msg=name)
    assert int(optimizer.global_step.asnumpy()[0]) == len(LRS)
    # the trust ratio mattered: plain momentum with decay would have moved the weight elsewhere
    plain, _ = reference_steps(start, grads, dict.fromkeys(start, False))
    assert not np.allclose(after["dense.weight"], plain["dense.weight"], rtol=1e-3)


def test_excluded_parameters_take_plain_momentum_without_decay(tiny):
    """With zero gradients the excluded parameters stay where they are (no decay); the weight decays by
    ``lr * trust * wd * w`` with trust 1 (its gradient norm is 0)."""
    start = values(tiny)
    zero = [{name: np.zeros_like(w) for name, w in start.items()}] * 2
    optimizer = create_lars(tiny, LRS, settings())
    run_steps(tiny, optimizer, zero)
    after = values(tiny)
    for name in ("dense.bias", "bn.gamma", "bn.beta"):
        np.testing.assert_array_equal(after[name], start[name].astype(np.float32), err_msg=name)
    v1 = LRS[0] * WEIGHT_DECAY * start["dense.weight"]
    w1 = start["dense.weight"] - v1
    w2 = w1 - (MOMENTUM * v1 + LRS[1] * WEIGHT_DECAY * w1)
    np.testing.assert_allclose(after["dense.weight"], w2, rtol=1e-5)


def test_excluded_parameters_follow_momentum_of_the_raw_gradient(tiny):
    start = values(tiny)
    grads = random_grads(tiny, 3, seed=2)
    optimizer = create_lars(tiny, LRS[:3], settings())
    run_steps(tiny, optimizer, grads)
    after = values(tiny)
    for name in ("dense.bias", "bn.gamma", "bn.beta"):
        v, w = np.zeros_like(start[name]), start[name]
        for lr, g in zip(LRS[:3], grads, strict=True):
            v = MOMENTUM * v + lr * g[name]
            w = w - v
        np.testing.assert_allclose(after[name], w, rtol=1e-5, atol=1e-6, err_msg=name)


def test_zero_weight_norm_gives_trust_one_and_no_nan(tiny, mindspore_cpu):
    """A zero weight (||w|| = 0) takes the lr unscaled: trust 1, the decay term 0."""
    weight = next(p for p in tiny.trainable_params() if p.name == "dense.weight")
    weight.set_data(mindspore_cpu.Tensor(np.zeros(weight.shape, np.float32)))
    start = values(tiny)
    grads = random_grads(tiny, 1, seed=3)
    optimizer = create_lars(tiny, LRS[:1], settings())
    run_steps(tiny, optimizer, grads)
    after = values(tiny)
    assert all(np.isfinite(v).all() for v in after.values())
    np.testing.assert_allclose(after["dense.weight"], -LRS[0] * grads[0]["dense.weight"], rtol=1e-6)
    expected, _ = reference_steps(start, grads, {name: name == "dense.weight" for name in start})
    np.testing.assert_allclose(after["dense.weight"], expected["dense.weight"], rtol=1e-6)


def test_zero_gradient_and_zero_weight_move_nothing(tiny, mindspore_cpu):
    weight = next(p for p in tiny.trainable_params() if p.name == "dense.weight")
    weight.set_data(mindspore_cpu.Tensor(np.zeros(weight.shape, np.float32)))
    zero = [{p.name: np.zeros(p.shape) for p in tiny.trainable_params()}]
    optimizer = create_lars(tiny, LRS[:1], settings())
    run_steps(tiny, optimizer, zero)
    np.testing.assert_array_equal(weight.asnumpy(), 0.0)


def test_epsilon_and_a_custom_exclusion(tiny):
    """``epsilon`` enters the denominator; ``adapts`` chooses the adapted parameters (here the bias too)."""
    start = values(tiny)
    grads = random_grads(tiny, 2, seed=4)
    adapts = {"dense.weight", "dense.bias"}
    optimizer = LARS(tiny.trainable_params(), LRS[:2], settings(epsilon=0.5), adapts=adapts.__contains__)
    run_steps(tiny, optimizer, grads)
    expected, _ = reference_steps(start, grads, {name: name in adapts for name in start}, epsilon=0.5)
    after = values(tiny)
    for name in start:
        np.testing.assert_allclose(after[name], expected[name], rtol=1e-5, atol=1e-6, err_msg=name)


def test_loss_scaled_train_step_matches_the_closed_form(tiny, mindspore_cpu):
    """Through ``nn.TrainOneStepCell`` with a loss scale: the gradients are unscaled before the norms."""
    ms = mindspore_cpu
    from mindspore import nn

    loss_scale = 1024.0
    rng = np.random.default_rng(5)
    x = ms.Tensor(rng.standard_normal((8, 4)).astype(np.float32))

    class Loss(nn.Cell):
        def __init__(self, network):
            super().__init__(auto_prefix=False)  # keep the parameter names, as nn.WithLossCell does
            self.network = network

        def construct(self, x):
            return (self.network(x) ** 2).mean()

    with_loss = Loss(tiny)
    with_loss.set_train(True)  # BatchNorm on batch statistics, as in the train step (its moving ones do not matter)
    weights = tiny.trainable_params()
    grad_fn = ms.grad(with_loss, grad_position=None, weights=weights)
    start = values(tiny)
    grads = {p.name: g.asnumpy().astype(np.float64) for p, g in zip(weights, grad_fn(x), strict=True)}

    optimizer = create_lars(tiny, LRS[:1], settings(loss_scale=loss_scale))
    step = nn.TrainOneStepCell(with_loss, optimizer, sens=loss_scale)
    step(x)
    expected, _ = reference_steps(start, [grads], {name: name == "dense.weight" for name in start})
    after = values(tiny)
    for name in start:
        np.testing.assert_allclose(after[name], expected[name], rtol=1e-4, atol=1e-6, err_msg=name)


def test_rejects_group_params_and_negative_values(tiny):
    with pytest.raises(TypeError, match="list of Parameters"):
        LARS([{"params": tiny.trainable_params()}], 0.1, settings())
    with pytest.raises(ValidationError, match="trust_coefficient"):  # validated once, before LARS sees them
        LarsSettings(momentum=MOMENTUM, weight_decay=WEIGHT_DECAY, trust_coefficient=-1.0, epsilon=0.0, loss_scale=1.0)
