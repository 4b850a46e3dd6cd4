"""THOR's trace rule saves work: a layer it skips computes no inverse that step.

With a trace rule, a second-order step computes the damped traces first and inverts only the layers whose
trace changed by more than ``skip`` (``ThorPreconditioner.refresh_by_trace_rule``); the others' inverse
buffers stay as they were and the counters (``inverses_computed``, ``trace_skips``, ``refreshed_layers``)
record which layers were computed.
"""

from __future__ import annotations

import numpy as np

from tests.support.thor import NAMES, TinyNet, batch, make_thor, params_of, run


def inverse_buffers(thor) -> dict[str, np.ndarray]:
    pre = thor.preconditioner
    return {p.name: p.asnumpy().copy() for p in (*pre.method.a_inv, *pre.method.g_inv)}


def test_a_skipped_layer_computes_no_inverse_while_another_is_refreshed():
    net = TinyNet()
    x, y = batch(0)
    # lr 0: the weights, hence the statistics and their traces, stay exactly the same from step to step
    thor = make_thor(net, steps=3, lr=0.0, frequency=1, trace_rule=(0.1, 0.0))
    pre = thor.preconditioner
    run(thor, x, y)
    assert pre.refreshed_layers == ["conv.weight", "fc.weight"]  # every layer is computed at its first step
    assert (pre.inverses_computed, pre.trace_skips) == (2, 0)
    before = inverse_buffers(thor)

    # fc's reference trace at half its value: a change of 100 % > skip refreshes fc; conv is unchanged
    fc = pre.layer_names.index("fc.weight")
    pre.trace_ref[fc].set_data(pre.trace_ref[fc] / 2)
    run(thor, x, y)
    assert pre.refreshed_layers == ["fc.weight"]
    assert (pre.inverses_computed, pre.trace_skips) == (3, 1)
    after = inverse_buffers(thor)
    for name in ("thor_a_inv.conv.weight", "thor_g_inv.conv.weight"):
        np.testing.assert_array_equal(after[name], before[name])
    # the refreshed layer's inverses are those of the same (unchanged) statistics
    for name in ("thor_a_inv.fc.weight", "thor_g_inv.fc.weight"):
        np.testing.assert_allclose(after[name], before[name], rtol=1e-6)

    run(thor, x, y)  # nothing changed: neither layer computes an inverse
    assert pre.refreshed_layers == []
    assert (pre.inverses_computed, pre.trace_skips, pre.second_order_steps) == (3, 3, 3)


def test_a_rule_that_never_skips_trains_exactly_as_without_the_rule():
    # skip 0: every layer refreshes at every second-order step, through the trace rule's three-part step;
    # the weights must be those of the fused step without a trace rule
    weights, computed = {}, {}
    for rule in (None, (0.0, 0.0)):
        net = TinyNet(seed=3)
        thor = make_thor(net, steps=4, frequency=2, trace_rule=rule)
        for step in range(4):
            run(thor, *batch(step, scale=1.0 + step))
        weights[rule], computed[rule] = params_of(net), thor.preconditioner.inverses_computed
    assert computed[None] == computed[(0.0, 0.0)] == 2 * 2  # two layers at each of two second-order steps
    for name in NAMES:
        np.testing.assert_allclose(weights[(0.0, 0.0)][name], weights[None][name], rtol=1e-6, atol=1e-7, err_msg=name)
