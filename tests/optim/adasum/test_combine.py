"""Adasum: the numpy reference against the formula, and the MindSpore collectives under real msrun."""

from __future__ import annotations

import numpy as np
import pytest
from mindspore import nn

from tests.support.adasum import adasum_pair, adasum_reference
from trainlib.models.resnet import create_resnet
from trainlib.optim.adasum.combine import Adasum, check_rank_size
from trainlib.optim.adasum.step import AdasumTrainStep


def formula(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    dot = float(a @ b)
    return (1 - dot / (2 * float(a @ a))) * a + (1 - dot / (2 * float(b @ b))) * b


def test_pair_matches_formula_and_limits():
    a, b = np.array([1.0, 2.0, 3.0]), np.array([3.0, -1.0, 0.5])
    np.testing.assert_allclose(adasum_reference([a, b]), formula(a, b), rtol=1e-12)
    # Parallel deltas are averaged, orthogonal ones summed.
    np.testing.assert_allclose(adasum_pair(a, a), a, rtol=1e-12)
    np.testing.assert_allclose(adasum_pair(2 * a, a), 1.5 * a, rtol=1e-12)
    np.testing.assert_allclose(adasum_pair(np.array([1.0, 0.0]), np.array([0.0, 2.0])), [1.0, 2.0])


def test_zero_vector_contributes_nothing():
    b = np.array([0.5, -2.0])
    np.testing.assert_array_equal(adasum_pair(np.zeros(2), b), b)
    np.testing.assert_array_equal(adasum_pair(b, np.zeros(2)), b)
    np.testing.assert_array_equal(adasum_pair(np.zeros(2), np.zeros(2)), np.zeros(2))


def test_reference_recursion_pairs_neighbours_first():
    vectors = list(np.random.default_rng(0).normal(size=(4, 6)))
    expected = adasum_pair(adasum_pair(vectors[0], vectors[1]), adasum_pair(vectors[2], vectors[3]))
    np.testing.assert_allclose(adasum_reference(vectors), expected, rtol=1e-12)
    other_order = adasum_pair(adasum_pair(vectors[0], vectors[2]), adasum_pair(vectors[1], vectors[3]))
    assert not np.allclose(adasum_reference(vectors), other_order)
    np.testing.assert_array_equal(adasum_reference(vectors[:1]), vectors[0])


@pytest.mark.parametrize("count", [0, 3, 6, 12])
def test_rank_count_not_a_power_of_two_is_refused(count):
    with pytest.raises(ValueError, match=f"got {count}" if count else "positive"):
        check_rank_size(count)


def test_train_step_refuses_three_ranks_before_any_communication():
    net = create_resnet("resnet_narrow", 3)
    optimizer = nn.Momentum(net.trainable_params(), 0.1, 0.9)
    with_loss = nn.WithLossCell(net, nn.SoftmaxCrossEntropyWithLogits(sparse=True, reduction="mean"))
    with pytest.raises(ValueError, match=r"power-of-two number of ranks .*got 3 ranks"):
        AdasumTrainStep(with_loss, optimizer, rank_size=3, rank=0)
    with pytest.raises(ValueError, match="got 3 ranks"):
        Adasum([(2, 2)], rank=0, rank_size=3)
