"""THOR against numpy closed forms of its statistics, inverses and update, and its step logic.

The numpy side is written from the formulas (``../shared/RECIPES.md``, THOR section, and the
``trainlib.optim.thor.preconditioner`` docstring conventions): im2col, A = E[a a^T], G = E[g g^T] with per-example
output gradients, damped inverses ``P^-1/2 (X + sqrt(lambda/P) I)^-1``, ``d = G^-1 grad A^-1``,
then weight decay, then momentum (the baseline's Momentum optimizer after the preconditioner).
"""

from __future__ import annotations

import math

import mindspore as ms
import numpy as np
import pytest
from mindspore import nn

from tests.support.thor import C_OUT, NAMES, POSITIONS, TinyNet, batch, make_thor, params_of, run, thor_settings
from trainlib.engine.checkpoint import Checkpoint, load_checkpoint, save_checkpoint
from trainlib.models.loss import CrossEntropySmooth
from trainlib.optim.schedules import exponential_schedule, thor_schedule
from trainlib.optim.thor.capture import CapturedLayer
from trainlib.optim.thor.linalg import apply_left, apply_right, block_inverse, blocks_to_dense
from trainlib.optim.thor.step import ThorDivergenceError, ThorInverseError, create_thor_step
from trainlib.recipes.thor import TrainlibThorStep

# ------------------------------------------------------------------------------------------------
# numpy closed forms


def im2col(x: np.ndarray, kernel, stride, pads, dilation=(1, 1)) -> np.ndarray:
    """Patches (N, C*kh*kw, H_out*W_out), channel-major like ``weight.reshape(C_out, -1)``.

    ``pads`` is (top, bottom, left, right).
    """
    (kh, kw), (sh, sw), (dh, dw) = kernel, stride, dilation
    top, bottom, left, right = pads
    xp = np.pad(x, ((0, 0), (0, 0), (top, bottom), (left, right)))
    ho = (xp.shape[2] - dh * (kh - 1) - 1) // sh + 1
    wo = (xp.shape[3] - dw * (kw - 1) - 1) // sw + 1
    cols = np.empty((x.shape[0], x.shape[1], kh, kw, ho, wo), x.dtype)
    for i in range(kh):
        for j in range(kw):
            cols[:, :, i, j] = xp[
                :, :, i * dh : i * dh + sh * (ho - 1) + 1 : sh, j * dw : j * dw + sw * (wo - 1) + 1 : sw
            ]
    return cols.reshape(x.shape[0], -1, ho * wo)


def kfac_factors(inputs: np.ndarray, output_grads: np.ndarray, batch: int) -> tuple[np.ndarray, np.ndarray]:
    """A = E[a a^T], G = E[g g^T] over rows (inputs (R, K), output_grads (R, C_out) of the MEAN loss).

    ``g = batch * output_grad`` is the per-example gradient (the Fisher convention).
    """
    a = inputs.T @ inputs / len(inputs)
    g = batch * output_grads
    return a, g.T @ g / len(g)


def damped_inverse(matrix: np.ndarray, damping: float, positions: int, block_size: int | None = None) -> np.ndarray:
    """``P^-1/2 (X + sqrt(damping/P) I)^-1``, of the full matrix or of its diagonal blocks."""
    n = len(matrix)
    damped = matrix + math.sqrt(damping / positions) * np.eye(n)
    size = n if block_size is None else block_size
    inverse = np.zeros_like(damped)
    for start in range(0, n, size):
        block = slice(start, min(start + size, n))
        inverse[block, block] = np.linalg.inv(damped[block, block])
    return inverse / math.sqrt(positions)


def thor_direction(grad: np.ndarray, a_inv: np.ndarray, g_inv: np.ndarray) -> np.ndarray:
    """The per-layer closed form ``G'^-1 grad A'^-1`` with grad as C_out x (C_in*kh*kw)."""
    return (g_inv @ grad.reshape(len(grad), -1) @ a_inv).reshape(grad.shape)


def numpy_forward_backward(params: dict[str, np.ndarray], x: np.ndarray, y: np.ndarray):
    """Loss, gradients and per-layer (A, G, P) of TinyNet (conv s2 p1 -> relu -> flatten -> dense)."""
    w1, w2, b2 = (params[k].astype(np.float64) for k in NAMES)
    n = len(x)
    cols = im2col(x.astype(np.float64), (3, 3), (2, 2), (1, 1, 1, 1))  # (N, K, P)
    z = np.einsum("ok,nkp->nop", w1.reshape(C_OUT, -1), cols)
    h = np.maximum(z, 0).reshape(n, -1)
    logits = h @ w2.T + b2
    logits -= logits.max(axis=1, keepdims=True)
    probs = np.exp(logits) / np.exp(logits).sum(axis=1, keepdims=True)
    loss = -np.mean(np.log(probs[np.arange(n), y]))
    d_logits = probs.copy()
    d_logits[np.arange(n), y] -= 1
    d_logits /= n
    dz = (d_logits @ w2).reshape(z.shape) * (z > 0)
    grads = {
        "conv.weight": np.einsum("nop,nkp->ok", dz, cols).reshape(w1.shape),
        "fc.weight": d_logits.T @ h,
        "fc.bias": d_logits.sum(axis=0),
    }
    conv_rows = cols.transpose(0, 2, 1).reshape(-1, cols.shape[1])
    stats = {
        "conv.weight": (*kfac_factors(conv_rows, dz.transpose(0, 2, 1).reshape(-1, C_OUT), n), POSITIONS),
        "fc.weight": (*kfac_factors(h, d_logits, n), 1),
    }
    return float(loss), grads, stats


class NumpyThor:
    """THOR on TinyNet in float64: weight decay after preconditioning, then momentum."""

    def __init__(self, params, lr, damping, momentum, weight_decay, frequency, block_size=None):
        self.params = {k: v.astype(np.float64) for k, v in params.items()}
        self.moments = {k: np.zeros_like(v) for k, v in self.params.items()}
        self.lr, self.damping, self.momentum, self.weight_decay = lr, damping, momentum, weight_decay
        self.frequency, self.block_size = frequency, block_size
        self.inverses: dict[str, tuple[np.ndarray, np.ndarray]] = {}
        self.steps = 0

    def step(self, x, y) -> float:
        loss, grads, stats = numpy_forward_backward(self.params, x, y)
        damping = self.damping[self.steps]
        if self.steps % self.frequency == 0:
            self.inverses = {
                name: (
                    damped_inverse(a, damping, p, self.block_size),
                    damped_inverse(g, damping, p, self.block_size),
                )
                for name, (a, g, p) in stats.items()
            }
        for name in NAMES:
            d = grads[name]
            if name in self.inverses:
                a_inv, g_inv = self.inverses[name]
                d = thor_direction(d, a_inv, g_inv)
            if "bias" not in name:
                d = d + self.weight_decay * self.params[name]
            self.moments[name] = self.momentum * self.moments[name] + d
            self.params[name] = self.params[name] - self.lr[self.steps] * self.moments[name]
        self.steps += 1
        return loss


# ------------------------------------------------------------------------------------------------
# MindSpore side


# ------------------------------------------------------------------------------------------------
# tests


@pytest.mark.parametrize(
    ("frequency", "block_size", "loss_scale", "method"),
    [(1, None, 128.0, "cholesky"), (2, 16, 1.0, "cholesky"), (1, 5, 128.0, "matrix_inverse")],
    ids=["fresh-inverses-full", "reused-inverses-blocks", "matrix-inverse-blocks"],
)
def test_steps_match_the_numpy_closed_form(frequency, block_size, loss_scale, method):
    net = TinyNet()
    lrs, dampings = np.array([0.2, 0.1], np.float32), np.array([0.03, 0.02], np.float32)
    config = {"momentum": 0.9, "weight_decay": 0.05}
    reference = NumpyThor(params_of(net), lrs, dampings, frequency=frequency, block_size=block_size, **config)
    thor = make_thor(
        net,
        lr=lrs,
        damping=dampings,
        frequency=frequency,
        block_size=block_size,
        loss_scale=loss_scale,
        inverse_method=method,
        **config,
    )
    for step in range(2):
        x, y = batch(step)
        initial = params_of(net)
        loss = run(thor, x, y)
        assert loss == pytest.approx(reference.step(x, y), rel=1e-5)
        if step == 0:
            # the statistics of the first batch: dense layer and strided, padded conv
            _, _, stats = numpy_forward_backward(initial, x, y)
            for name, (a, g) in thor.preconditioner.statistics().items():
                np.testing.assert_allclose(a, stats[name][0], rtol=1e-5, atol=1e-6, err_msg=name)
                np.testing.assert_allclose(g, stats[name][1], rtol=1e-4, atol=1e-7, err_msg=name)
        for name, value in params_of(net).items():
            np.testing.assert_allclose(value, reference.params[name], rtol=2e-4, atol=1e-6, err_msg=f"{name} @{step}")
        for name, (a_inv, g_inv) in thor.preconditioner.inverses().items():
            np.testing.assert_allclose(a_inv, reference.inverses[name][0], rtol=1e-3, atol=1e-5, err_msg=name)
            np.testing.assert_allclose(g_inv, reference.inverses[name][1], rtol=1e-3, atol=1e-5, err_msg=name)
    assert (thor.preconditioner.second_order_steps, thor.preconditioner.reuse_steps) == (
        (2, 0) if frequency == 1 else (1, 1)
    )
    # the update is not a plain momentum step, and momentum made the second step differ from its direction
    momenta = {p.name.removeprefix("moments."): p.asnumpy().copy() for p in thor.optimizer.moments}
    np.testing.assert_allclose(momenta["conv.weight"], reference.moments["conv.weight"], rtol=2e-4, atol=1e-6)


class _CaptureOnly(nn.Cell):
    def __init__(self, conv):
        super().__init__()
        self.wrapper = CapturedLayer(conv, 1.0)
        self.wrapper.capture = True

    def construct(self, x):
        return self.wrapper(x)


@pytest.mark.parametrize(
    ("size", "conv_kwargs", "pads"),
    [
        ((8, 8), {"kernel_size": 3, "stride": 2, "pad_mode": "same"}, (0, 1, 0, 1)),
        ((9, 7), {"kernel_size": (3, 2), "stride": (2, 1), "pad_mode": "pad", "padding": (1, 0, 2, 1)}, (1, 0, 2, 1)),
        ((9, 9), {"kernel_size": 3, "stride": 1, "pad_mode": "valid", "dilation": 2}, (0, 0, 0, 0)),
    ],
    ids=["same-asymmetric", "rect-kernel-tuple-padding", "valid-dilated"],
)
def test_conv_input_factor_follows_the_convolution(size, conv_kwargs, pads):
    conv = nn.Conv2d(2, 3, has_bias=False, **conv_kwargs)
    x = np.random.default_rng(3).standard_normal((2, 2, *size)).astype(np.float32)
    cell = _CaptureOnly(conv)
    out = cell(ms.Tensor(x)).asnumpy()
    cols = im2col(x, conv.kernel_size, conv.stride, pads, conv.dilation)
    # the patches are the ones the convolution uses: W @ cols is its output
    np.testing.assert_allclose(
        np.einsum("ok,nkp->nop", conv.weight.asnumpy().reshape(3, -1), cols).reshape(out.shape), out, atol=1e-5
    )
    rows = cols.transpose(0, 2, 1).reshape(-1, cols.shape[1])
    np.testing.assert_allclose(cell.wrapper.a_stat.asnumpy(), rows.T @ rows / len(rows), rtol=1e-5, atol=1e-6)
    assert float(cell.wrapper.positions.asnumpy()) == out.shape[2] * out.shape[3]


class _Blocks(nn.Cell):
    def __init__(self, block_size, method="cholesky"):
        super().__init__()
        self.block_size = block_size
        self.method = method

    def construct(self, matrix, left, right):
        blocks = block_inverse(matrix, self.block_size, self.method)
        return blocks, apply_left(blocks, left), apply_right(right, blocks)


def spd(n: int, seed: int) -> np.ndarray:
    m = np.random.default_rng(seed).standard_normal((n, n))
    return (m @ m.T / n + np.eye(n)).astype(np.float32)


@pytest.mark.parametrize("method", ["cholesky", "matrix_inverse"])
def test_block_diagonal_inverse(method):
    n, size = 10, 4  # blocks 4, 4 and a padded 2
    block_diag = np.zeros((n, n), np.float32)
    for start, seed in zip((0, 4, 8), (1, 2, 3), strict=True):
        stop = min(start + size, n)
        block_diag[start:stop, start:stop] = spd(stop - start, seed)
    rng = np.random.default_rng(4)
    left, right = rng.standard_normal((n, 3)).astype(np.float32), rng.standard_normal((5, n)).astype(np.float32)
    blocks, lhs, rhs = (
        t.asnumpy() for t in _Blocks(size, method)(ms.Tensor(block_diag), ms.Tensor(left), ms.Tensor(right))
    )
    assert blocks.shape == (3, size, size)
    expected = np.linalg.inv(block_diag.astype(np.float64))
    np.testing.assert_allclose(blocks_to_dense(blocks, n), expected, rtol=1e-4, atol=1e-6)
    np.testing.assert_allclose(lhs, expected @ left, rtol=1e-4, atol=1e-5)
    np.testing.assert_allclose(rhs, right @ expected, rtol=1e-4, atol=1e-5)

    full = spd(n, 5)  # not block-diagonal: the blocks' inverses are not the inverse
    blocked, _, _ = _Blocks(size, method)(ms.Tensor(full), ms.Tensor(left), ms.Tensor(right))
    whole, _, _ = _Blocks(None, method)(ms.Tensor(full), ms.Tensor(left), ms.Tensor(right))
    np.testing.assert_allclose(whole.asnumpy()[0], np.linalg.inv(full.astype(np.float64)), rtol=1e-4, atol=1e-6)
    assert np.abs(blocks_to_dense(blocked.asnumpy(), n) - np.linalg.inv(full)).max() > 1e-2


def test_frequency_reuses_inverses():
    net = TinyNet()
    thor = make_thor(net, steps=7, frequency=3, damping=np.linspace(0.05, 0.02, 7))
    stored = []
    for step in range(7):
        run(thor, *batch(step))
        stored.append(thor.preconditioner.inverses())
    assert (thor.preconditioner.second_order_steps, thor.preconditioner.reuse_steps, thor.preconditioner.steps) == (
        3,
        4,
        7,
    )
    for step in range(7):
        source = step - step % 3  # the second-order step whose inverses are in use
        for name, (a_inv, g_inv) in stored[step].items():
            np.testing.assert_array_equal(a_inv, stored[source][name][0])
            np.testing.assert_array_equal(g_inv, stored[source][name][1])
    for name in stored[0]:
        assert np.abs(stored[3][name][0] - stored[2][name][0]).max() > 1e-6
        assert np.abs(stored[6][name][1] - stored[5][name][1]).max() > 1e-6


def test_update_does_not_depend_on_the_loss_scale():
    weights = {}
    for loss_scale in (1.0, 128.0):
        net = TinyNet(seed=2)
        thor = make_thor(net, frequency=2, loss_scale=loss_scale)
        for step in range(2):
            run(thor, *batch(step))
        weights[loss_scale] = params_of(net)
    moved = np.abs(weights[1.0]["conv.weight"] - params_of(TinyNet(seed=2))["conv.weight"]).max()
    assert moved > 1e-3
    for name in NAMES:  # loss scales are powers of two: scaling and unscaling are exact in float32
        np.testing.assert_allclose(weights[1.0][name], weights[128.0][name], rtol=1e-6, atol=1e-8, err_msg=name)


def test_trace_rule_skips_and_stops_on_unchanged_statistics():
    net = TinyNet()
    x, y = batch(0)
    # lr 0: the weights, hence the statistics, stay exactly the same
    thor = make_thor(net, steps=5, lr=0.0, frequency=1, trace_rule=(0.01, 0.001))
    run(thor, x, y)
    first = thor.preconditioner.inverses()
    for _ in range(3):
        run(thor, x, y)
    assert thor.preconditioner.trace_skips == 2 * 3  # both layers, at each of the three later second-order steps
    assert sorted(thor.preconditioner.stopped_layers) == ["conv.weight", "fc.weight"]
    for name, (a_inv, g_inv) in thor.preconditioner.inverses().items():
        np.testing.assert_array_equal(a_inv, first[name][0])
        np.testing.assert_array_equal(g_inv, first[name][1])
    # a stopped layer is never refreshed again, however much its statistics change
    run(thor, x * 3, y)
    assert thor.preconditioner.trace_skips == 2 * 4
    np.testing.assert_array_equal(thor.preconditioner.inverses()["fc.weight"][0], first["fc.weight"][0])


def test_a_step_past_the_lr_schedule_is_refused():
    # the optimizer indexes the schedule by its global step: past the end it would fail obscurely (Gather)
    thor = make_thor(TinyNet(), steps=1, frequency=1)
    run(thor, *batch(0))
    with pytest.raises(ValueError, match=r"THOR step 2 is past the end of its lr schedule \(1 steps\)"):
        run(thor, *batch(1))


def test_a_statistic_cholesky_cannot_invert_is_named_with_the_damping():
    thor = make_thor(TinyNet(), damping=0.0)  # A of an all-zero input is the zero matrix: not positive definite
    x, y = batch(0)
    with pytest.raises(ThorInverseError, match=r"THOR step 1: .* not positive definite .* \(damping 0\)"):
        run(thor, np.zeros_like(x), y)


def test_a_non_finite_statistic_is_reported_as_a_divergence_with_its_layer_not_as_an_inverse_error():
    thor = make_thor(TinyNet())  # damping 0.03: a finite statistic of this batch would invert
    x, y = batch(0)
    x[0, 0, 0, 0] = 1e30  # its square overflows float32 in the conv's A
    with pytest.raises(
        ThorDivergenceError,
        match=r"THOR step 1: the training diverged: layer conv.weight's statistic A holds (inf|nan)",
    ):
        run(thor, x, y)


def test_trace_rule_refreshes_on_changing_statistics():
    net = TinyNet()
    thor = make_thor(net, steps=6, lr=0.0, frequency=1, trace_rule=(0.5, 0.0))
    scales = (1.0, 1.0, 3.0, 3.0, 1.0, 1.0)
    stored = []
    for scale in scales:
        run(thor, *batch(0, scale))
        stored.append(thor.preconditioner.inverses())
    # unchanged statistics: skipped (not stopped, the stop threshold is 0); a 3x input: refreshed
    assert thor.preconditioner.trace_skips == 2 * 3
    assert thor.preconditioner.stopped_layers == []
    for step, refreshed in enumerate((True, False, True, False, True, False)):
        if step == 0:
            continue
        changed = np.abs(stored[step]["fc.weight"][0] - stored[step - 1]["fc.weight"][0]).max() > 1e-6
        assert changed == refreshed, step


def test_trace_rule_default_thresholds_do_not_skip_moving_statistics():
    net = TinyNet()
    thor = make_thor(net, steps=4, frequency=1, trace_rule=(0.01, 0.001))
    for step in range(4):
        run(thor, *batch(step, scale=1.0 + step))
    assert thor.preconditioner.trace_skips == 0 and thor.preconditioner.second_order_steps == 4


def test_state_round_trip_continues_identically(tmp_path):
    data = [batch(step) for step in range(4)]
    straight_net = TinyNet()
    straight = make_thor(straight_net, frequency=3)
    for x, y in data:
        run(straight, x, y)

    first_net = TinyNet()
    first = make_thor(first_net, frequency=3)
    for x, y in data[:2]:
        run(first, x, y)
    resumed_net = TinyNet(seed=9)
    resumed = make_thor(resumed_net, frequency=3)
    state = TrainlibThorStep(first).capture()
    assert all(isinstance(v, np.ndarray) for v in state.values())
    # through a checkpoint file in the engine's layout: the network's weights, then the optimizer's state
    # (Momentum's moments and step, the preconditioner's buffers and counters)
    save_checkpoint(Checkpoint(state), tmp_path / "thor.ckpt")
    saved = load_checkpoint(tmp_path / "thor.ckpt")
    for target in resumed_net.trainable_params():
        target.set_data(ms.Tensor(saved.network_params()[target.name]))
    TrainlibThorStep(resumed).restore(saved)
    for x, y in data[2:]:  # step 2 reuses the loaded inverses, step 3 recomputes them
        run(resumed, x, y)
    assert (resumed.preconditioner.second_order_steps, resumed.preconditioner.reuse_steps) == (2, 2)
    for name, value in params_of(resumed_net).items():
        np.testing.assert_allclose(value, params_of(straight_net)[name], rtol=1e-6, atol=1e-7, err_msg=name)


def test_thor_lr_matches_the_formula():
    lr_init, decay, end, steps = 0.05803, 4.0839, 53, 4
    lrs = thor_schedule(lr_init, decay, end, 45, steps)
    assert lrs.shape == (45 * steps,) and lrs.dtype == np.float32
    for i in (0, 1, 7, 100, 150):
        e = (i + 1) / steps
        assert lrs[i] == pytest.approx(lr_init * (1 - e / end) ** decay, rel=1e-6)
    # halved once e >= 39, again once e >= 40
    base = lambda i: lr_init * (1 - (i + 1) / steps / end) ** decay  # noqa: E731
    last_plain, first_half = 39 * steps - 2, 39 * steps - 1  # e = 38.75, e = 39
    assert lrs[last_plain] == pytest.approx(base(last_plain), rel=1e-6)
    assert lrs[first_half] == pytest.approx(base(first_half) / 2, rel=1e-6)
    assert lrs[40 * steps - 2] == pytest.approx(base(40 * steps - 2) / 2, rel=1e-6)
    assert lrs[40 * steps - 1] == pytest.approx(base(40 * steps - 1) / 4, rel=1e-6)
    assert lrs[-1] == pytest.approx(base(45 * steps - 1) / 4, rel=1e-6)
    assert np.all(np.isfinite(thor_schedule(0.1, 4.0, 10, 12, 3)))  # past end_epoch the base is 0


def test_thor_damping_matches_the_formula():
    damping = exponential_schedule(0.03, 0.50036, 10, 70, 5)
    assert damping.shape == (350,) and damping.dtype == np.float32
    for i in (0, 4, 49, 200, 349):
        assert damping[i] == pytest.approx(0.03 * 0.50036 ** ((i + 1) / 5 / 10), rel=1e-6)
    assert damping[49] == pytest.approx(0.03 * 0.50036, rel=1e-6)  # e = 10


class SmallConvNet(nn.Cell):
    def __init__(self):
        super().__init__()
        self.features = nn.SequentialCell(
            [nn.Conv2d(3, 8, 3, pad_mode="pad", padding=1, has_bias=False), nn.BatchNorm2d(8), nn.ReLU()]
        )
        self.fc = nn.Dense(8, 3)

    def construct(self, x):
        return self.fc(self.features(x).mean(axis=(2, 3)))


def test_short_training_reduces_the_loss():
    from mindspore import dataset as ds

    from tests.support.training import GivenSteps
    from trainlib.engine.epochs import TrainingSpec
    from trainlib.engine.loop import train
    from trainlib.metrics import TRAIN_LOSS

    rng = np.random.default_rng(0)
    labels = rng.integers(0, 3, 96).astype(np.int32)
    colours = np.eye(3, dtype=np.float32)[labels][:, :, None, None]
    images = (colours + 0.5 * rng.standard_normal((96, 3, 8, 8))).astype(np.float32)
    data = ds.NumpySlicesDataset({"image": images, "label": labels}, shuffle=False).batch(16, drop_remainder=True)
    ms.set_seed(1)
    net = SmallConvNet()
    epochs, steps = 4, data.get_dataset_size()
    lrs = thor_schedule(0.1, 2.0, 6, epochs, steps)
    damping = exponential_schedule(0.03, 0.5, 10, epochs, steps)
    loss = nn.WithLossCell(net, CrossEntropySmooth(3, 0.1))
    thor = create_thor_step(net, loss, lrs, damping, thor_settings(frequency=5), rank_size=1)
    assert len(thor.preconditioner.wrappers) == 2  # the conv inside the SequentialCell and the dense layer
    factory = GivenSteps(lambda start, steps_per_epoch: TrainlibThorStep(thor))
    result = train(TrainingSpec(epochs, 16, 16), data, factory)
    assert result.history[-1][TRAIN_LOSS] < 0.6 * result.history[0][TRAIN_LOSS]
    assert thor.preconditioner.second_order_steps == math.ceil(epochs * steps / 5)
