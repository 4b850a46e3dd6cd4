"""Label-smoothing cross entropy against a numpy computation."""

from __future__ import annotations

import numpy as np
import pytest

from trainlib.models.loss import CrossEntropySmooth


def numpy_smoothed_ce(logits: np.ndarray, labels: np.ndarray, smooth: float) -> float:
    """Mean over the batch of -sum_c q_c log softmax(z)_c, q = 1-s on the label, s/(C-1) elsewhere."""
    logits = logits.astype(np.float64)
    n, c = logits.shape
    shifted = logits - logits.max(axis=1, keepdims=True)
    log_softmax = shifted - np.log(np.exp(shifted).sum(axis=1, keepdims=True))
    target = np.full((n, c), smooth / (c - 1))
    target[np.arange(n), labels] = 1.0 - smooth
    return float(-(target * log_softmax).sum(axis=1).mean())


@pytest.fixture
def batch():
    rng = np.random.default_rng(3)
    logits = (rng.standard_normal((6, 5)) * 3).astype(np.float32)
    labels = np.array([0, 4, 2, 2, 1, 3], dtype=np.int32)
    return logits, labels


def loss_value(ms, num_classes: int, smooth: float, logits: np.ndarray, labels: np.ndarray) -> float:
    cell = CrossEntropySmooth(num_classes, smooth)
    return float(cell(ms.Tensor(logits), ms.Tensor(labels)).asnumpy())


@pytest.mark.parametrize("smooth", [0.0, 0.1, 0.3, 0.9])
def test_matches_numpy_smoothed_cross_entropy(mindspore_cpu, batch, smooth):
    logits, labels = batch
    assert loss_value(mindspore_cpu, 5, smooth, logits, labels) == pytest.approx(
        numpy_smoothed_ce(logits, labels, smooth), rel=1e-5
    )


def test_zero_smoothing_is_plain_cross_entropy(mindspore_cpu, batch):
    logits, labels = batch
    shifted = logits.astype(np.float64) - logits.max(axis=1, keepdims=True)
    log_softmax = shifted - np.log(np.exp(shifted).sum(axis=1, keepdims=True))
    plain = -log_softmax[np.arange(len(labels)), labels].mean()
    assert loss_value(mindspore_cpu, 5, 0.0, logits, labels) == pytest.approx(plain, rel=1e-5)


def test_smoothing_changes_the_loss(mindspore_cpu, batch):
    logits, labels = batch
    assert loss_value(mindspore_cpu, 5, 0.1, logits, labels) != pytest.approx(
        loss_value(mindspore_cpu, 5, 0.0, logits, labels), rel=1e-3
    )


def test_smoothed_minimum_is_at_the_smoothed_target(mindspore_cpu):
    """With s = 0.1 and 3 classes the loss is lowest where softmax = (0.9, 0.05, 0.05), not at a one-hot."""
    target = np.array([0.9, 0.05, 0.05])
    best = np.log(target).astype(np.float32)[None, :]
    sharper = (np.log(target) * 3).astype(np.float32)[None, :]
    labels = np.array([0], dtype=np.int32)
    at_target = loss_value(mindspore_cpu, 3, 0.1, best, labels)
    assert at_target == pytest.approx(-(target * np.log(target)).sum(), rel=1e-5)  # the entropy of q
    assert loss_value(mindspore_cpu, 3, 0.1, sharper, labels) > at_target


@pytest.mark.parametrize("smooth", [-0.1, 1.0, 1.5])
def test_invalid_smoothing_factor_is_rejected(smooth):
    with pytest.raises(ValueError, match=r"label smoothing factor must be in \[0, 1\)"):
        CrossEntropySmooth(10, smooth)
