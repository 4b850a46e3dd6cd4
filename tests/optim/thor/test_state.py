"""THOR's state in the engine's checkpoint: statistics, inverses, momenta and the step."""

from __future__ import annotations

import numpy as np
import pytest

from tests.support.thor import TinyNet, batch, make_thor, run
from trainlib.engine.checkpoint import OPTIMIZER_PREFIX, Checkpoint
from trainlib.recipes.thor import TrainlibThorStep


def test_state_holds_statistics_inverses_momenta_and_the_step():
    net = TinyNet()
    thor = make_thor(net, frequency=2)
    for step in range(3):
        run(thor, *batch(step))
    state = TrainlibThorStep(thor).capture()  # the engine's layout: network, then optimizer state under "optimizer."
    for layer in ("conv.weight", "fc.weight"):
        a, g = thor.preconditioner.statistics()[layer]
        np.testing.assert_array_equal(state[f"{OPTIMIZER_PREFIX}thor.thor_stats.{layer}.A"], a)
        np.testing.assert_array_equal(state[f"{OPTIMIZER_PREFIX}thor.thor_stats.{layer}.G"], g)
        assert (
            f"{OPTIMIZER_PREFIX}thor.thor_a_inv.{layer}" in state
            and f"{OPTIMIZER_PREFIX}thor.thor_g_inv.{layer}" in state
        )
    # momentum and its step are the baseline's optimizer state; the statistics buffers are not network weights
    assert {"optimizer.moments.conv.weight", "optimizer.moments.fc.bias", "optimizer.global_step"} <= set(state)
    assert not any(name.startswith("thor_stats.") for name in state)
    assert int(state["optimizer.thor.steps"]) == 3 and int(state["optimizer.thor.second_order_steps"]) == 2
    assert int(np.asarray(state["optimizer.global_step"]).reshape(-1)[0]) == 3

    other = TrainlibThorStep(make_thor(TinyNet(seed=5), frequency=2))
    other.restore(Checkpoint(state))
    restored = other.preconditioner
    assert restored.steps == 3 and restored.second_order_steps == 2 and restored.reuse_steps == 1
    for layer, (a, g) in thor.preconditioner.statistics().items():
        np.testing.assert_array_equal(restored.statistics()[layer][0], a)
        np.testing.assert_array_equal(restored.statistics()[layer][1], g)
    for moment, expected in zip(other.optimizer.moments, thor.optimizer.moments, strict=True):
        np.testing.assert_array_equal(moment.asnumpy(), expected.asnumpy(), err_msg=moment.name)
    del state["optimizer.thor.thor_stats.fc.weight.G"]
    with pytest.raises(ValueError, match=r"THOR state lacks \['thor.thor_stats.fc.weight.G'\]"):
        other.restore(Checkpoint(state))
