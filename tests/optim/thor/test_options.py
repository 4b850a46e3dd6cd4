"""THOR's options (issue 29) against float64 numpy closed forms, alone and combined: ``factored`` damping, the
``eigen`` method, ``kl_clip`` and the Adam graft; their state through a checkpoint; the recipe's keys reach them.

The closed forms (``NumpyThorOptions``) are those of docs/recipes.md, section "THOR's options", per preconditioned
layer, then weight decay and momentum as in ``test_preconditioner.NumpyThor``.
"""

from __future__ import annotations

import math

import mindspore as ms
import numpy as np
import pytest
from mindspore import nn
from pydantic import ValidationError

from tests.optim.thor.test_preconditioner import damped_inverse, numpy_forward_backward
from tests.support.thor import NAMES, TinyNet, batch, make_thor, params_of, run
from trainlib.engine.checkpoint import Checkpoint, load_checkpoint, save_checkpoint
from trainlib.optim.thor.linalg import eigen_basis, factored_pi
from trainlib.recipes.thor import TrainlibThorStep

GRAFT = (0.9, 0.99, 1e-8)


def numpy_pi(a: np.ndarray, g: np.ndarray) -> float:
    mean_a, mean_g = np.trace(a) / len(a), np.trace(g) / len(g)
    return math.sqrt(mean_a / mean_g) if mean_a > 0 and mean_g > 0 else 1.0


def factored_inverses(a, g, damping, positions):
    """``P^-1/2 (A + pi s I)^-1``, ``P^-1/2 (G + s / pi I)^-1``: the mindspore form with the shifts scaled."""
    pi = numpy_pi(a, g)
    shift = math.sqrt(damping / positions)
    a_inv = np.linalg.inv(a + pi * shift * np.eye(len(a))) / math.sqrt(positions)
    g_inv = np.linalg.inv(g + shift / pi * np.eye(len(g))) / math.sqrt(positions)
    return a_inv, g_inv


def eigen_reference(a, g, damping, positions, factored):
    """(QA, QG, 1 / damped eigenvalue products) in float64."""
    e_a, q_a = np.linalg.eigh(a)
    e_g, q_g = np.linalg.eigh(g)
    e_a, e_g = np.maximum(e_a, 0), np.maximum(e_g, 0)
    if factored:
        pi = numpy_pi(a, g)
        root_p, root_damping = math.sqrt(positions), math.sqrt(damping)
        denominator = np.outer(root_p * e_g + root_damping / pi, root_p * e_a + pi * root_damping)
    else:
        denominator = positions * np.outer(e_g, e_a) + damping
    return q_a, q_g, 1.0 / denominator


class NumpyThorOptions:
    """THOR on TinyNet in float64 with the options: preconditioning, graft, clip, weight decay, momentum."""

    def __init__(self, params, lr, damping, *, frequency, damping_method, compute_method, kl_clip, adam_graft):
        self.params = {k: v.astype(np.float64) for k, v in params.items()}
        self.moments = {k: np.zeros_like(v) for k, v in self.params.items()}
        self.lr, self.damping, self.frequency = lr, damping, frequency
        self.momentum, self.weight_decay = 0.9, 0.05
        self.factored, self.eigen = damping_method == "factored", compute_method == "eigen"
        self.kl_clip, self.adam_graft = kl_clip, adam_graft
        self.adam = {name: (np.zeros_like(self.params[name]),) * 2 for name in ("conv.weight", "fc.weight")}
        self.curvature: dict[str, tuple[np.ndarray, ...]] = {}
        self.steps = 0
        self.clip_factor = None
        self.graft_scales: dict[str, float] = {}

    def step(self, x, y) -> float:
        loss, grads, stats = numpy_forward_backward(self.params, x, y)
        damping, lr = self.damping[self.steps], self.lr[self.steps]
        if self.steps % self.frequency == 0:
            for name, (a, g, p) in stats.items():
                if self.eigen:
                    self.curvature[name] = eigen_reference(a, g, damping, p, self.factored)
                elif self.factored:
                    self.curvature[name] = factored_inverses(a, g, damping, p)
                else:
                    self.curvature[name] = (damped_inverse(a, damping, p), damped_inverse(g, damping, p))
        directions = dict(grads)
        for name in self.curvature:
            matrix = grads[name].reshape(len(grads[name]), -1)
            if self.eigen:
                q_a, q_g, scale = self.curvature[name]
                d = q_g @ ((q_g.T @ matrix @ q_a) * scale) @ q_a.T
            else:
                a_inv, g_inv = self.curvature[name]
                d = g_inv @ matrix @ a_inv
            directions[name] = d.reshape(grads[name].shape)
        if self.adam_graft is not None:
            beta1, beta2, eps = self.adam_graft
            t = self.steps + 1
            for name in self.curvature:
                m, v = self.adam[name]
                m = beta1 * m + (1 - beta1) * grads[name]
                v = beta2 * v + (1 - beta2) * grads[name] ** 2
                self.adam[name] = (m, v)
                update = (m / (1 - beta1**t)) / (np.sqrt(v / (1 - beta2**t)) + eps)
                scale = np.linalg.norm(update) / np.linalg.norm(directions[name])
                self.graft_scales[name] = scale
                directions[name] = directions[name] * scale
        if self.kl_clip is not None:
            agreement = sum(np.sum(grads[name] * directions[name]) for name in self.curvature)
            self.clip_factor = min(1.0, math.sqrt(self.kl_clip / abs(lr**2 * agreement)))
            for name in self.curvature:
                directions[name] = directions[name] * self.clip_factor
        for name in NAMES:
            d = directions[name]
            if "bias" not in name:
                d = d + self.weight_decay * self.params[name]
            self.moments[name] = self.momentum * self.moments[name] + d
            self.params[name] = self.params[name] - lr * self.moments[name]
        self.steps += 1
        return loss


OFF = {"damping_method": "fixed", "compute_method": "inverse", "kl_clip": None, "adam_graft": None}
CASES = {
    "factored": {"damping_method": "factored"},
    "eigen": {"compute_method": "eigen"},
    "kl_clip-binding": {"kl_clip": 1e-5},
    "kl_clip-loose": {"kl_clip": 1e3},  # nu would be above 1: min(1, .) keeps the direction
    "adam_graft": {"adam_graft": GRAFT},
    "all": {"damping_method": "factored", "compute_method": "eigen", "kl_clip": 1e-5, "adam_graft": GRAFT},
}


@pytest.mark.parametrize("case", list(CASES))
def test_options_match_the_float64_closed_form(case):
    options = {**OFF, **CASES[case]}
    net = TinyNet()
    lrs, dampings = np.array([0.2, 0.1, 0.1], np.float32), np.array([0.03, 0.02, 0.02], np.float32)
    reference = NumpyThorOptions(params_of(net), lrs, dampings, frequency=2, **options)
    today = NumpyThorOptions(params_of(net), lrs, dampings, frequency=2, **OFF)
    thor = make_thor(net, lr=lrs, damping=dampings, frequency=2, momentum=0.9, weight_decay=0.05, **options)
    preconditioner = thor.preconditioner
    for step in range(3):  # second-order, reuse, second-order
        x, y = batch(step)
        before = dict(reference.params)
        assert run(thor, x, y) == pytest.approx(reference.step(x, y), rel=1e-5)
        today.step(x, y)
        for name, value in params_of(net).items():
            # float32's THOR direction holds to ~1e-4 of its size (the graft makes these steps large)
            moved = np.abs(reference.params[name] - before[name]).max()
            np.testing.assert_allclose(
                value, reference.params[name], rtol=2e-4, atol=1e-6 + 1e-4 * moved, err_msg=f"{name} @{step}"
            )
        if options["compute_method"] == "eigen":
            for name, (q_a, q_g, scale) in preconditioner.eigen().items():
                q_a_ref, q_g_ref, scale_ref = reference.curvature[name]
                np.testing.assert_allclose(scale, scale_ref, rtol=1e-3, err_msg=name)
                # the damped inverse Fisher on a probe matrix: unique however a repeated eigenvalue's basis is chosen
                probe = np.random.default_rng(7).standard_normal((len(q_g), len(q_a)))
                expected = q_g_ref @ ((q_g_ref.T @ probe @ q_a_ref) * scale_ref) @ q_a_ref.T
                got = q_g @ ((q_g.T @ probe @ q_a) * scale) @ q_a.T
                np.testing.assert_allclose(got, expected, rtol=1e-3, atol=1e-4 * np.abs(expected).max(), err_msg=name)
        else:
            for name, (a_inv, g_inv) in preconditioner.inverses().items():
                np.testing.assert_allclose(a_inv, reference.curvature[name][0], rtol=1e-3, atol=1e-5, err_msg=name)
                np.testing.assert_allclose(g_inv, reference.curvature[name][1], rtol=1e-3, atol=1e-5, err_msg=name)
        if options["kl_clip"] is not None:
            assert preconditioner.last_clip_factor == pytest.approx(reference.clip_factor, rel=1e-4), step
            assert (reference.clip_factor < 0.5) if options["kl_clip"] < 1 else (reference.clip_factor == 1.0)
        if options["adam_graft"] is not None:
            for name, scale in preconditioner.last_graft_scales.items():
                assert scale == pytest.approx(reference.graft_scales[name], rel=1e-4), (name, step)
    assert (preconditioner.second_order_steps, preconditioner.reuse_steps) == (2, 1)
    # the option changes the update (but kl_clip-loose, whose bound is never reached): not today's THOR checked twice
    change = max(np.abs(reference.params[name] - today.params[name]).max() for name in NAMES)
    assert change == 0.0 if case == "kl_clip-loose" else change > 1e-3


class _Linalg(nn.Cell):
    def construct(self, matrix, other):
        values, vectors = eigen_basis(matrix)
        return values, vectors, factored_pi(matrix, other)


def test_eigen_basis_clamps_negative_eigenvalues_and_pi_falls_back_to_one_on_a_zero_trace():
    rng = np.random.default_rng(0)
    q, _ = np.linalg.qr(rng.standard_normal((5, 5)))
    values = np.array([-0.5, -1e-3, 0.2, 1.0, 3.0])
    matrix = (q * values) @ q.T
    got_values, got_vectors, pi = (t.asnumpy() for t in _Linalg()(ms.Tensor(matrix, ms.float32), ms.Tensor(matrix)))
    np.testing.assert_allclose(got_values, np.maximum(values, 0), atol=1e-5)
    np.testing.assert_allclose(np.abs(got_vectors.T @ q).max(axis=0), 1, atol=1e-4)
    assert float(pi) == pytest.approx(1.0)  # equal traces per dimension
    scaled = _Linalg()(ms.Tensor(np.eye(4) * 9, ms.float32), ms.Tensor(np.eye(2), ms.float32))[2]
    assert float(scaled.asnumpy()) == pytest.approx(3.0)
    zero = _Linalg()(ms.Tensor(np.eye(4), ms.float32), ms.Tensor(np.zeros((2, 2)), ms.float32))[2]
    assert float(zero.asnumpy()) == 1.0  # G = 0 (the output gradient of a layer before a zero BatchNorm gamma)


def test_option_state_round_trip_continues_identically(tmp_path):
    options = CASES["all"]
    data = [batch(step) for step in range(4)]
    straight_net = TinyNet()
    straight = make_thor(straight_net, frequency=3, **options)
    for x, y in data[:2]:
        run(straight, x, y)
    state = TrainlibThorStep(straight).capture()
    for x, y in data[2:]:
        run(straight, x, y)
    prefix = "optimizer.thor."
    assert f"{prefix}thor_a_eigvec.fc.weight" in state and f"{prefix}thor_eigen_scale.conv.weight" in state
    assert not any(key.startswith(f"{prefix}thor_a_inv.") for key in state)  # eigen stores no inverses
    # the graft's moments and step are optimizer state, not network weights
    assert {f"{prefix}thor_graft_m.conv.weight", f"{prefix}thor_graft_v.fc.weight"} <= set(state)
    assert float(np.asarray(state[f"{prefix}thor_graft_step"]).reshape(-1)[0]) == 2
    save_checkpoint(Checkpoint(state), tmp_path / "thor.ckpt")
    saved = load_checkpoint(tmp_path / "thor.ckpt")
    resumed_net = TinyNet(seed=9)
    resumed = make_thor(resumed_net, frequency=3, **options)
    for target in resumed_net.trainable_params():
        target.set_data(ms.Tensor(saved.network_params()[target.name]))
    TrainlibThorStep(resumed).restore(saved)
    for x, y in data[2:]:  # step 2 reuses the loaded eigenbases, step 3 recomputes them
        run(resumed, x, y)
    for name, value in params_of(resumed_net).items():
        np.testing.assert_allclose(value, params_of(straight_net)[name], rtol=1e-6, atol=1e-7, err_msg=name)


def test_the_defaults_add_no_state():
    state = TrainlibThorStep(make_thor(TinyNet(), frequency=2)).capture()
    assert not any("eigvec" in key or "graft" in key or "eigen_scale" in key for key in state)


@pytest.mark.parametrize("precondition", [True, False])
def test_a_misspelt_preconditioner_option_is_refused_with_or_without_the_preconditioner(precondition):
    """The settings are a section's model (``ThorSettings``): a misspelt key is refused before anything is built."""
    with pytest.raises(ValidationError, match="klclip"):
        make_thor(TinyNet(), precondition=precondition, klclip=0.001)


def test_factored_damping_under_the_trace_rule():
    """The trace rule's per-layer refresh (``inverse._LayerInverses``) gives the factored closed form."""
    net = TinyNet()
    x, y = batch(0)
    _, _, stats = numpy_forward_backward(params_of(net), x, y)
    thor = make_thor(net, damping=0.02, frequency=1, damping_method="factored", trace_rule=(0.01, 0.0))
    run(thor, x, y)
    for name, (a_inv, g_inv) in thor.preconditioner.inverses().items():
        a, g, positions = stats[name]
        a_ref, g_ref = factored_inverses(a, g, 0.02, positions)
        np.testing.assert_allclose(a_inv, a_ref, rtol=1e-3, atol=1e-5, err_msg=name)
        np.testing.assert_allclose(g_inv, g_ref, rtol=1e-3, atol=1e-5, err_msg=name)


def test_the_recipe_passes_each_option_to_the_library():
    """``recipes.thor.trainlib_thor_step`` builds THOR from the section itself (``ThorSettings``, which the
    thor_bert recipe's section is too); no step runs, nothing compiles."""
    import yaml

    from tests.support.config import CONF
    from trainlib.models.loss import CrossEntropySmooth
    from trainlib.params import ThorParams
    from trainlib.recipes.thor import trainlib_thor_step

    section = yaml.safe_load((CONF / "base" / "parameters_thor.yml").read_text())["thor"]
    assert {key: section[key] for key in OFF} == OFF  # the documented recipe: every option off
    options = {"damping_method": "factored", "compute_method": "eigen", "kl_clip": 0.001, "statistics_dtype": "float64"}
    graft = {"beta1": 0.8, "beta2": 0.99, "eps": 1e-6}
    thor = ThorParams.model_validate({**section, **options, "adam_graft": graft})
    step = trainlib_thor_step(TinyNet(), CrossEntropySmooth(4, 0.0), thor, np.ones(4), np.ones(4), rank_size=1)
    preconditioner = step.preconditioner
    assert (preconditioner.damping_method, preconditioner.compute_method) == ("factored", "eigen")
    assert preconditioner.kl_clip == 0.001 and preconditioner.adam_graft == (0.8, 0.99, 1e-6)
    assert {wrapper.statistics_dtype for wrapper in preconditioner.wrappers} == {"float64"}
