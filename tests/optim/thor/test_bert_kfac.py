"""One THOR second-order step on a tiny BERT against a float64 K-FAC step on the same Dense layers.

The reference is independent of MindSpore's autodiff: ``tests.support.bert_kfac`` is a numpy float64 forward and
backward of the pre-training network written from the model's definition, which records every Dense layer's input
rows ``a`` and output gradient ``dout`` (of the batch-mean loss). From them, in float64 (package docstring of
``trainlib.optim.thor``, dense layers: P = 1): ``A = a^T a / R``, ``g = R * dout``, ``G = g^T g / R`` over the
layer's ``R`` rows (batch * seq for the encoder, batch * predictions for the masked-LM transform, batch for the pooler
and NSP), inverses ``(X + sqrt(damping) I)^-1``, direction ``G^-1 grad A^-1`` for Dense weights and the plain
gradient for everything else (biases, LayerNorm, embeddings, the MLM output bias), then weight decay where BERT's
rule decays, momentum ``m = d`` (first step) and ``w - lr * m``.
"""

from __future__ import annotations

import math

import mindspore as ms
import numpy as np
import pytest

from tests.support.bert_kfac import dense_names, forward_backward
from trainlib.models.bert import BertConfig, BertNetworkWithLoss, create_bert
from trainlib.optim.gradients import UnscaledGradients
from trainlib.optim.momentum import decays_unless_layernorm_or_bias
from trainlib.optim.thor.step import create_thor_step
from trainlib.params import ThorSettings
from trainlib.text.examples import COLUMNS

CONFIG = BertConfig(
    vocab_size=40,
    hidden_size=8,
    num_hidden_layers=1,
    num_attention_heads=2,
    intermediate_size=16,
    hidden_dropout_prob=0.0,
    attention_probs_dropout_prob=0.0,
    max_position_embeddings=16,
    type_vocab_size=2,
    initializer_range=0.02,  # replaced by set_weights
)
BATCH, SEQ, PREDICTIONS = 4, 8, 3
LR, DAMPING, MOMENTUM, WEIGHT_DECAY, LOSS_SCALE = 0.1, 0.03, 0.9, 1e-3, 8.0
SETTINGS = ThorSettings(
    momentum=MOMENTUM,
    weight_decay=WEIGHT_DECAY,
    loss_scale=LOSS_SCALE,
    frequency=2,  # the first step is second-order
    block_size=None,
)
DENSE = dense_names(CONFIG.num_hidden_layers)
# tolerances: float32 MindSpore against the float64 reference, relative to each array's largest magnitude
GRAD_TOL = 1e-4
STAT_TOL = 2e-5
UPDATE_TOL = 1e-4


def make_columns(seed: int) -> dict[str, np.ndarray]:
    """Valid ids; rows of 5..8 real tokens (padding in most rows); masked positions among the real tokens; one
    prediction of weight 0; token types 0 then 1 within the real tokens."""
    rng = np.random.default_rng(seed)
    lengths = np.array([SEQ, 6, 5, 7])
    input_mask = (np.arange(SEQ)[None, :] < lengths[:, None]).astype(np.int32)
    positions = np.stack([rng.choice(n, PREDICTIONS, replace=False) for n in lengths]).astype(np.int32)
    weights = np.ones((BATCH, PREDICTIONS), np.float32)
    weights[2, -1] = 0.0
    return {
        "input_ids": rng.integers(0, CONFIG.vocab_size, (BATCH, SEQ)).astype(np.int32) * input_mask,
        "input_mask": input_mask,
        "token_type_ids": (np.arange(SEQ)[None, :] >= lengths[:, None] // 2).astype(np.int32) * input_mask,
        "next_sentence_labels": np.array([[0], [1], [1], [0]], np.int32),
        "masked_lm_positions": positions,
        "masked_lm_ids": rng.integers(1, CONFIG.vocab_size, (BATCH, PREDICTIONS)).astype(np.int32),
        "masked_lm_weights": weights,
    }


def set_weights(net, seed: int) -> None:
    """Weights of a size that makes every factor matter against the damping: O(1) activations and output
    gradients, non-trivial biases and LayerNorm affine parameters."""
    rng = np.random.default_rng(seed)
    for param in net.trainable_params():
        shape, name = param.shape, param.name
        if name.endswith("gamma"):
            value = 1.0 + 0.2 * rng.standard_normal(shape)
        elif name.endswith(("beta", "bias")):
            value = 0.2 * rng.standard_normal(shape)
        elif name.endswith("embedding_table"):
            value = 0.7 * rng.standard_normal(shape)
        else:  # Dense weights (out, in)
            value = rng.standard_normal(shape) * 1.2 / math.sqrt(shape[1])
        param.set_data(ms.Tensor(value.astype(np.float32)))


def params_of(net) -> dict[str, np.ndarray]:
    # asnumpy() can share memory with the parameter on CPU: copy before the in-place update
    return {p.name: p.asnumpy().copy() for p in net.trainable_params()}


def assert_close(actual, expected, tol: float, what: str, floor: float = 0.0) -> float:
    """``|actual - expected| <= tol * max(max|expected|, floor)`` elementwise; returns that error / scale.

    ``floor`` is for references that are zero in exact arithmetic (the key bias: softmax ignores a shift shared by a
    query's scores), where float32 leaves rounding noise."""
    actual, expected = np.asarray(actual, np.float64), np.asarray(expected, np.float64)
    assert actual.shape == expected.shape, what
    scale = max(float(np.abs(expected).max()), floor)
    assert scale > 0, f"{what}: the reference is zero"
    error = float(np.abs(actual - expected).max()) / scale
    assert error <= tol, f"{what}: max error {error:.3g} of max |reference| {scale:.3g} (tolerance {tol})"
    return error


def damped_inverse(matrix: np.ndarray, damping: float) -> np.ndarray:
    """``(X + sqrt(damping) I)^-1``: THOR's damped inverse of a dense layer's factor (P = 1)."""
    return np.linalg.inv(matrix + math.sqrt(damping) * np.eye(len(matrix)))


def kfac_reference(params, columns):
    """The float64 loss, gradients, per-layer (A, G), per-layer (A^-1, G^-1) and the THOR step's updates."""
    loss, grads, layers_io = forward_backward(params, columns, CONFIG.num_attention_heads, CONFIG.num_hidden_layers)
    stats, inverses = {}, {}
    for name, (a, dout) in layers_io.items():
        rows = len(dout)
        g = rows * dout  # per-row gradient (of the loss-scaled loss, unscaled): THOR's Fisher convention
        stats[name] = (a.T @ a / rows, g.T @ g / rows)
        inverses[name] = tuple(damped_inverse(x, DAMPING) for x in stats[name])
    updates = {}
    for name, grad in grads.items():
        direction = grad
        if name in inverses:
            a_inv, g_inv = inverses[name]
            direction = g_inv @ grad @ a_inv
        if decays_unless_layernorm_or_bias(name):
            direction = direction + WEIGHT_DECAY * params[name].astype(np.float64)
        updates[name] = -LR * direction  # momentum starts at 0: m = d
    return loss, grads, stats, inverses, updates


@pytest.fixture(scope="module")
def step():
    """Everything one THOR step on the tiny BERT produced, with the float64 reference of it."""
    ms.set_seed(0)
    net = create_bert(CONFIG)
    set_weights(net, seed=1)
    columns = make_columns(seed=2)
    batch = [ms.Tensor(columns[c]) for c in COLUMNS]
    loss_net = BertNetworkWithLoss(net)
    initial = params_of(net)
    # MindSpore's own float32 gradients at the initial weights, to validate the numpy reference
    ms_loss, ms_grads = UnscaledGradients(loss_net, net.trainable_params(), 1.0, 1)(*batch)
    ms_grads = {p.name: g.asnumpy().copy() for p, g in zip(net.trainable_params(), ms_grads, strict=True)}
    thor = create_thor_step(
        net,
        loss_net,
        np.full(4, LR, np.float32),
        np.full(4, DAMPING, np.float32),
        SETTINGS,
        rank_size=1,
        decays=decays_unless_layernorm_or_bias,
    )
    thor_loss = float(thor(*batch).asnumpy())
    assert (thor.preconditioner.second_order_steps, thor.preconditioner.reuse_steps) == (1, 0)
    after = params_of(net)
    loss, grads, stats, inverses, updates = kfac_reference(initial, columns)
    return {
        "initial": initial,
        "after": after,
        "ms_loss": float(ms_loss.asnumpy()),
        "ms_grads": ms_grads,
        "thor_loss": thor_loss,
        "preconditioner": thor.preconditioner,
        "loss": loss,
        "grads": grads,
        "stats": stats,
        "inverses": inverses,
        "updates": updates,
    }


def floor_of(arrays) -> float:
    """A scale for (near-)zero references: 1e-3 of the largest magnitude over all parameters."""
    return 1e-3 * max(float(np.abs(a).max()) for a in arrays)


def test_the_numpy_reference_is_mindspores_loss_and_gradients(step):
    assert step["ms_loss"] == pytest.approx(step["loss"], rel=1e-5)
    assert step["thor_loss"] == pytest.approx(step["loss"], rel=1e-5)
    assert set(step["ms_grads"]) == set(step["grads"])
    floor = floor_of(step["grads"].values())
    for name, grad in step["grads"].items():
        assert_close(step["ms_grads"][name], grad, GRAD_TOL, f"gradient of {name}", floor)


def test_every_dense_layer_is_captured(step):
    assert len(DENSE) == 6 * CONFIG.num_hidden_layers + 3
    preconditioner = step["preconditioner"]
    assert preconditioner.layer_names == DENSE
    assert list(preconditioner.statistics()) == DENSE
    assert list(preconditioner.inverses()) == DENSE


def test_factors_and_damped_inverses_match_the_float64_reference(step):
    statistics, inverses = step["preconditioner"].statistics(), step["preconditioner"].inverses()
    for name in DENSE:
        a, g = step["stats"][name]
        # the factors are not negligible against the damping: G and A shape the direction of every layer
        assert np.trace(g) / len(g) > 0.05 * math.sqrt(DAMPING), name
        assert np.trace(a) / len(a) > 0.05 * math.sqrt(DAMPING), name
        assert_close(statistics[name][0], a, STAT_TOL, f"A of {name}")
        assert_close(statistics[name][1], g, STAT_TOL, f"G of {name}")
        assert_close(inverses[name][0], step["inverses"][name][0], STAT_TOL, f"A^-1 of {name}")
        assert_close(inverses[name][1], step["inverses"][name][1], STAT_TOL, f"G^-1 of {name}")


def test_every_update_matches_the_float64_kfac_step(step):
    assert set(step["after"]) == set(step["updates"])
    floor = floor_of(step["updates"].values())
    for name, expected in step["updates"].items():
        assert_close(step["after"][name] - step["initial"][name], expected, UPDATE_TOL, f"update of {name}", floor)


def test_only_the_dense_weights_are_preconditioned(step):
    """Embeddings, LayerNorm, biases and the MLM output bias take the plain (decayed) gradient; each Dense weight's
    update is far from it."""
    initial, after, grads = step["initial"], step["after"], step["grads"]
    first_order = [name for name in initial if name not in DENSE]
    assert {n for n in first_order if n.endswith("embedding_table")} == {
        f"bert.{kind}_embedding.embedding_table" for kind in ("word", "position", "token_type")
    }
    assert sum("layernorm" in n for n in first_order) == 2 * (2 * CONFIG.num_hidden_layers + 2)
    floor = floor_of(step["updates"].values())
    for name in first_order:
        plain = grads[name] + (WEIGHT_DECAY * initial[name] if decays_unless_layernorm_or_bias(name) else 0.0)
        assert_close(after[name] - initial[name], -LR * plain, UPDATE_TOL, f"first-order update of {name}", floor)
    for name in DENSE:
        plain = grads[name] + WEIGHT_DECAY * initial[name]
        update = after[name] - initial[name]
        difference = np.abs(update + LR * plain).max() / np.abs(update).max()
        assert difference > 0.1, f"{name}: THOR's update is (nearly) the plain gradient's"
