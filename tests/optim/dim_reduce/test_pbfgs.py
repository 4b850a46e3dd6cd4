"""P-BFGS stage 2 against a numpy computation of the same formulas, and its invariances."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import mindspore as ms
import numpy as np
import pandas as pd
import pytest

from tests.support.pbfgs import IN, OUT, RECIPE, batches, dense_net, orthonormal_rows
from trainlib.engine.checkpoint import Checkpoint
from trainlib.models.loss import CrossEntropySmooth
from trainlib.models.resnet import create_resnet
from trainlib.optim.dim_reduce.pbfgs import PBFGS, PBFGSConfig, bfgs_inverse_update
from trainlib.recipes.dim_reduce.stage2 import STEP_COLUMNS, PBFGSFigures, PBFGSStep


def numpy_loss_and_grad(w: np.ndarray, x: np.ndarray, y: np.ndarray) -> tuple[float, np.ndarray]:
    """Softmax cross entropy of a Dense layer with flattened weights ``w = [W.ravel(), b]``."""
    weight, bias = w[: OUT * IN].reshape(OUT, IN), w[OUT * IN :]
    logits = x.astype(np.float64) @ weight.T + bias
    logits -= logits.max(axis=1, keepdims=True)
    probs = np.exp(logits) / np.exp(logits).sum(axis=1, keepdims=True)
    loss = -np.mean(np.log(probs[np.arange(len(y)), y]))
    delta = probs.copy()
    delta[np.arange(len(y)), y] -= 1
    delta /= len(y)
    return float(loss), np.concatenate([(delta.T @ x).ravel(), delta.sum(axis=0)])


class NumpyPBFGS:
    """The formulas of ``../shared/RECIPES.md`` (Dimension reduce), in float64 numpy."""

    def __init__(self, w: np.ndarray, pca: np.ndarray, config: PBFGSConfig):
        self.w, self.p, self.c = w.astype(np.float64), pca.astype(np.float64), config
        k = pca.shape[0]
        self.b = np.eye(k)
        self.s = np.zeros((k, 1))
        self.gk_prev = None
        self.m = np.zeros_like(self.w)

    def step(self, x, y) -> tuple[float, float, int]:
        c = self.c
        loss, g = numpy_loss_and_grad(self.w, x, y)
        gk = self.p @ g[:, None]
        saved = (self.b.copy(), self.gk_prev)
        if self.gk_prev is not None:
            change = gk - self.gk_prev
            curvature = (change.T @ self.s).item()
            if curvature > 1e-20:
                r = 1.0 / curvature
                left = np.eye(len(gk)) - r * self.s @ change.T
                self.b = left @ self.b @ left.T + r * self.s @ self.s.T
        self.gk_prev = gk
        dk = -self.b @ gk
        dn = (self.p.T @ dk).ravel()
        accepted, trials = 0.0, 0
        for i in range(c.max_trials):
            rho = c.rho**i
            trials += 1
            trial_loss, _ = numpy_loss_and_grad(self.w + rho * dn, x, y)
            if trial_loss < loss + c.sigma * rho * (gk.T @ dk).item():
                accepted = rho
                self.s = rho * dk
                break
        if accepted == 0.0:
            self.b, self.gk_prev = saved
        self.m = c.gamma * self.m + (g - (self.p.T @ gk).ravel())
        self.w = self.w + accepted * dn - c.alpha * self.m
        return loss, accepted, trials


def flat_weights(net) -> np.ndarray:
    return np.concatenate([p.asnumpy().ravel() for p in net.trainable_params()])


@pytest.mark.parametrize(
    "config",
    [
        RECIPE,
        PBFGSConfig(rho=0.5, max_trials=3, sigma=0.9, gamma=0.5, alpha=0.05, loss_scale=1024.0),
    ],
    ids=["recipe", "strict-armijo"],
)
def test_steps_match_numpy_formulas(config):
    net = dense_net()
    pca = orthonormal_rows(4, OUT * IN + OUT, seed=3)
    reference = NumpyPBFGS(flat_weights(net), pca, config)
    trainer = PBFGS(net, CrossEntropySmooth(OUT, 0.0), pca, config, rank_size=1)
    outcomes = []
    for x, y in batches(6):
        expected_loss, expected_rho, expected_trials = reference.step(x, y)
        result = trainer.step(ms.Tensor(x), ms.Tensor(y))
        assert result.loss == pytest.approx(expected_loss, rel=1e-5)
        assert (result.step_size, result.trials) == (pytest.approx(expected_rho), expected_trials)
        np.testing.assert_allclose(flat_weights(net), reference.w, rtol=1e-4, atol=1e-6)
        np.testing.assert_allclose(trainer.inverse_hessian, reference.b, rtol=1e-3, atol=1e-5)
        outcomes.append(result.step_size)
    # the BFGS update, the backtracking and (with the strict constant) a rejected step are all exercised
    assert np.abs(reference.b - np.eye(4)).max() > 1e-3
    if config.sigma > 0.5:
        assert 0.0 in outcomes or any(0 < s < 1 for s in outcomes)


def test_bfgs_update_satisfies_the_secant_equation():
    rng = np.random.default_rng(0)
    step, change = rng.standard_normal((5, 1)).astype(np.float32), rng.standard_normal((5, 1)).astype(np.float32)
    if (change.T @ step).item() <= 0:
        change = -change
    updated = bfgs_inverse_update(np.eye(5, dtype=np.float32), step, change)
    np.testing.assert_allclose(updated @ change, step, rtol=1e-4, atol=1e-5)
    np.testing.assert_allclose(updated, updated.T, atol=1e-6)
    # no update without positive curvature
    assert np.array_equal(bfgs_inverse_update(np.eye(5, dtype=np.float32), step, -change), np.eye(5))


def small_resnet(seed: int):
    ms.set_seed(seed)
    return create_resnet("resnet_narrow", 4)


def resnet_batch(seed: int = 5):
    rng = np.random.default_rng(seed)
    return (
        ms.Tensor(rng.standard_normal((4, 3, 16, 16)).astype(np.float32)),
        ms.Tensor(rng.integers(0, 4, 4).astype(np.int32)),
    )


def test_update_does_not_depend_on_the_loss_scale():
    weights = {}
    pca = orthonormal_rows(4, OUT * IN + OUT, seed=2)
    for loss_scale in (1.0, 1024.0):
        net = dense_net()
        trainer = PBFGS(net, CrossEntropySmooth(OUT, 0.1), pca, replace(RECIPE, loss_scale=loss_scale), rank_size=1)
        for x, y in batches(3):
            trainer.step(ms.Tensor(x), ms.Tensor(y))
        weights[loss_scale] = flat_weights(net)
        assert np.abs(weights[loss_scale] - flat_weights(dense_net())).max() > 1e-4
    # loss scales are powers of two: scaling and unscaling are exact in float32
    np.testing.assert_allclose(weights[1.0], weights[1024.0], rtol=1e-6, atol=1e-7)


def test_line_search_leaves_batchnorm_statistics_alone():
    x, y = resnet_batch()
    net = small_resnet(seed=7)
    n = sum(int(np.prod(p.shape)) for p in net.trainable_params())
    pca = orthonormal_rows(5, n, 4)
    trainer = PBFGS(net, CrossEntropySmooth(4, 0.1), pca, replace(RECIPE, max_trials=3, sigma=0.99), rank_size=1)
    result = trainer.step(x, y)
    assert result.trials >= 1  # each trial is a training-mode forward pass after the gradient's
    after_step = {p.name: p.asnumpy() for p in net.get_parameters() if "moving" in p.name}

    once = small_resnet(seed=7)
    one_forward = PBFGS(once, CrossEntropySmooth(4, 0.1), pca, RECIPE, rank_size=1)
    one_forward._loss_and_grads(x, y)  # the gradient's forward pass alone
    expected = {p.name: p.asnumpy() for p in once.get_parameters() if "moving" in p.name}
    assert after_step.keys() == expected.keys() and after_step
    for name, value in expected.items():
        np.testing.assert_allclose(after_step[name], value, rtol=1e-6, atol=1e-7, err_msg=name)
    initial = {p.name: p.asnumpy() for p in small_resnet(seed=7).get_parameters() if "moving" in p.name}
    assert any(not np.allclose(initial[k], v) for k, v in expected.items())


def test_wrong_pca_shape_is_rejected():
    with pytest.raises(ValueError, match="n_components x n"):
        PBFGS(dense_net(), CrossEntropySmooth(OUT, 0.0), np.zeros((3, 5), np.float32), RECIPE, rank_size=1)


BOOST_SCRIPT = """
import sys
import numpy as np
import pipelines
import mindspore as ms
import mindspore.dataset as ds
from mindspore import nn
from trainlib.optim.dim_reduce.mindspore_dim_reduce import builtin_dim_reduce_config, builtin_dim_reduce_model
from trainlib.engine.checkpoint import Checkpoint
from trainlib.models.loss import CrossEntropySmooth
from trainlib.engine.runtime import configure_mindspore

work = sys.argv[1]
configure_mindspore("CPU", "graph", 0)
arrays = np.load(f"{work}/start.npz")
net = nn.Dense(arrays["x"].shape[1], arrays["weight"].shape[0])
net.weight.set_data(ms.Tensor(arrays["weight"]))
net.bias.set_data(ms.Tensor(arrays["bias"]))
data = ds.NumpySlicesDataset({"x": arrays["x"], "y": arrays["y"]}, shuffle=False).batch(len(arrays["y"]))
config = builtin_dim_reduce_config(
    f"{work}/pca.npy", n_components=int(sys.argv[2]), rho=0.55, gamma=0.9, alpha=0.001, sigma=0.4, device_number=1
)
builtin_dim_reduce_model(net, CrossEntropySmooth(arrays["weight"].shape[0], 0.0), config, loss_scale=None).train(
    1, data, dataset_sink_mode=False)
np.savez(f"{work}/after.npz", weight=net.weight.asnumpy(), bias=net.bias.asnumpy())
"""


def test_first_update_matches_mindspore_boost(tmp_path):
    import subprocess
    import sys

    net = dense_net()
    pca = orthonormal_rows(4, OUT * IN + OUT, seed=3)
    x, y = batches(1)[0]
    np.save(tmp_path / "pca.npy", pca)
    np.savez(tmp_path / "start.npz", weight=net.weight.asnumpy(), bias=net.bias.asnumpy(), x=x, y=y)
    result = subprocess.run(
        [sys.executable, "-c", BOOST_SCRIPT, str(tmp_path), "4"],
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    boost = np.load(tmp_path / "after.npz")

    PBFGS(net, CrossEntropySmooth(OUT, 0.0), pca, RECIPE, rank_size=1).step(ms.Tensor(x), ms.Tensor(y))
    moved = np.abs(net.weight.asnumpy() - np.load(tmp_path / "start.npz")["weight"]).max()
    assert moved > 1e-3
    np.testing.assert_allclose(net.weight.asnumpy(), boost["weight"], rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(net.bias.asnumpy(), boost["bias"], rtol=1e-5, atol=1e-6)


def engine_step(net, pca: np.ndarray, config: PBFGSConfig, start_epoch: int, steps_per_epoch: int = 2) -> PBFGSStep:
    """A stage-2 step continuing, as the engine continues it, from a stage-1 checkpoint of epoch ``start_epoch``."""
    step = PBFGSStep(PBFGS(net, CrossEntropySmooth(OUT, 0.0), pca, config, rank_size=1), steps_per_epoch)
    step.restore(Checkpoint({"weight": net.weight.asnumpy()}, {"epoch": start_epoch}))
    return step


def run_steps(step: PBFGSStep, data) -> None:
    for x, y in data:
        loss, overflow, loss_scale = step(ms.Tensor(x), ms.Tensor(y))
        assert not bool(overflow.asnumpy()) and float(loss_scale.asnumpy()) == step.loss_scale
        assert float(loss.asnumpy()) == pytest.approx(step.rows[-1]["loss"])


def test_engine_step_records_each_step_and_resumes_with_its_state():
    """Four steps straight, the state captured after two: a new step restored from it continues identically, and the
    capture is a snapshot (the two steps after it leave it as it was)."""
    config = replace(RECIPE, max_trials=3, sigma=0.9, loss_scale=1024.0)
    pca = orthonormal_rows(4, OUT * IN + OUT, seed=3)
    data = batches(4)
    straight = engine_step(dense_net(), pca, config, start_epoch=2)
    reference = NumpyPBFGS(flat_weights(straight.network), pca, config)
    run_steps(straight, data[:2])
    saved = Checkpoint(straight.capture(), {"epoch": 3})
    frozen = {name: value.copy() for name, value in saved.params.items()}
    run_steps(straight, data[2:])
    for name, value in frozen.items():
        np.testing.assert_array_equal(saved.params[name], value, err_msg=name)
    assert any(not np.array_equal(straight.capture()[name], value) for name, value in frozen.items())

    expected = [reference.step(x, y) for x, y in data]
    table = straight.table()
    assert list(table.columns) == list(STEP_COLUMNS)
    assert list(table["epoch"]) == [3, 3, 4, 4] and list(table["step"]) == [5, 6, 7, 8]  # counted from stage 1's start
    np.testing.assert_allclose(table["loss"], [e[0] for e in expected], rtol=1e-5)
    np.testing.assert_allclose(table["step_size"], [e[1] for e in expected])
    assert list(table["trials"]) == [e[2] for e in expected]
    assert straight.lr(7) == table["step_size"].iloc[-1]  # the true step size, not a schedule's lr

    assert {"optimizer.pbfgs.inverse_hessian", "optimizer.pbfgs.last_step", "optimizer.pbfgs.last_gk"} <= set(
        saved.params
    )
    assert set(saved.network_params()) == {"weight", "bias"}
    resumed_net = dense_net()
    for parameter in resumed_net.trainable_params():  # the network's weights come back as the engine loads them
        parameter.set_data(ms.Tensor(saved.params[parameter.name]))
    resumed = PBFGSStep(PBFGS(resumed_net, CrossEntropySmooth(OUT, 0.0), pca, config, rank_size=1), 2)
    resumed.restore(saved)
    run_steps(resumed, data[2:])
    pd.testing.assert_frame_equal(resumed.table(), table, rtol=1e-5)
    np.testing.assert_allclose(flat_weights(resumed_net), flat_weights(straight.network), rtol=1e-6, atol=1e-7)


def test_epoch_figures_and_step_rows_for_tracking():
    pca = orthonormal_rows(4, OUT * IN + OUT, seed=3)
    step = engine_step(dense_net(), pca, replace(RECIPE, rho=0.5, max_trials=3, sigma=0.9), start_epoch=0)
    logged = []
    figures = PBFGSFigures(on_steps=logged.extend)
    figures.bind(step)
    graphs = []
    for index, (x, y) in enumerate(batches(4)):
        graphs.append(step.next_graph())
        step(ms.Tensor(x), ms.Tensor(y))
        figures.on_step_end(index // 2, index % 2, step.rows[-1]["loss"])
    # one graph for every step, which the epoch loop announces once; the lr it reports is each step's step size
    assert set(graphs) == {(step.trainer, "the training graph (P-BFGS: gradient, line search, update)")}
    assert step.lr_summary(0, 2) == "lr: the step size each step's line search accepts, 0.5^k with k < 3"
    assert step.lr(3) == step.trainer.last_result.step_size  # what train/lr and the progress line show
    assert logged == step.rows
    second_epoch = step.table().iloc[2:]
    assert figures.epoch_metrics(1) == pytest.approx(
        {
            "pbfgs/accepted_fraction": (second_epoch["step_size"] > 0).mean(),
            "pbfgs/mean_step_size": second_epoch["step_size"].mean(),
            "pbfgs/mean_trials": second_epoch["trials"].mean(),
        }
    )
    replayed = []
    resumed = PBFGSFigures(on_steps=replayed.extend)
    resumed.bind(step)
    resumed.on_resume(Path("epoch_0002.ckpt"), [])
    assert replayed == step.rows  # a resumed run logs the steps before the checkpoint too


def test_engine_step_refuses_a_checkpoint_with_part_of_the_state():
    pca = orthonormal_rows(4, OUT * IN + OUT, seed=3)
    step = engine_step(dense_net(), pca, RECIPE, start_epoch=0)
    run_steps(step, batches(1))
    state = step.capture()
    del state["optimizer.pbfgs.inverse_hessian"]
    with pytest.raises(ValueError, match="lacks P-BFGS state optimizer.pbfgs.inverse_hessian"):
        engine_step(dense_net(), pca, RECIPE, start_epoch=0).restore(Checkpoint(state, {"epoch": 1}))
