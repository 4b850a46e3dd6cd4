"""Group params of the Momentum recipe: weight decay on conv/dense weights only."""

from __future__ import annotations

import numpy as np
import pytest

from trainlib.models.resnet import create_resnet
from trainlib.optim.momentum import create_momentum, decay_groups


@pytest.fixture
def net():
    return create_resnet("resnet_narrow", 10)


def names(params) -> set[str]:
    return {p.name for p in params}


def expected_split(net) -> tuple[set[str], set[str]]:
    """Decayed / exempt parameter names derived from the layer types, not from the names."""
    from mindspore import nn

    decayed, exempt = set(), set()
    for _, cell in net.cells_and_names():
        if isinstance(cell, nn.Conv2d | nn.Dense):
            decayed.add(cell.weight.name)
            if cell.bias is not None:
                exempt.add(cell.bias.name)
        elif isinstance(cell, nn.BatchNorm2d):
            exempt |= {cell.gamma.name, cell.beta.name}
    return decayed, exempt


def test_decay_groups_split_by_layer_type(net):
    decayed_group, exempt_group, order = decay_groups(net, 1e-4)
    decayed, exempt = expected_split(net)
    assert names(decayed_group["params"]) == decayed
    assert names(exempt_group["params"]) == exempt
    assert decayed_group["weight_decay"] == 1e-4
    assert exempt_group["weight_decay"] == 0.0
    # spot checks by name
    assert "fc.weight" in decayed and "stem.0.weight" in decayed and "layers.1.down_sample.0.weight" in decayed
    assert {"fc.bias", "stem.1.gamma", "stem.1.beta", "layers.3.bn2.gamma"} <= exempt
    assert all(name.endswith(".weight") for name in decayed)
    assert all(name.endswith((".gamma", ".beta", ".bias")) for name in exempt)
    # the network's full parameter order is passed on
    assert [p.name for p in order["order_params"]] == [p.name for p in net.trainable_params()]


def test_decay_groups_cover_every_trainable_param_once(net):
    decayed_group, exempt_group, _ = decay_groups(net, 5e-4)
    trainable = net.trainable_params()
    assert len(decayed_group["params"]) + len(exempt_group["params"]) == len(trainable)
    assert names(decayed_group["params"]).isdisjoint(names(exempt_group["params"]))
    assert names(decayed_group["params"]) | names(exempt_group["params"]) == names(trainable)
    # BatchNorm moving statistics are not trainable and appear in neither group
    assert not any("moving_" in name for name in names(decayed_group["params"]) | names(exempt_group["params"]))
    counts = (len(decayed_group["params"]), len(exempt_group["params"]))
    # resnet_narrow: 1 stem + 8 block + 3 down-sample convs + fc = 13 weights; 12 BNs x 2 + fc bias = 25
    assert counts == (13, 25)


def test_momentum_optimizer_decays_only_the_decayed_group(net):
    loss_scale = 1024.0
    optimizer = create_momentum(net, np.full(4, 0.1, np.float32), 0.9, 1e-4, loss_scale)
    decayed, exempt = expected_split(net)
    flags = dict(zip([p.name for p in optimizer.parameters], optimizer.decay_flags, strict=True))
    assert {name for name, flag in flags.items() if flag} == decayed
    assert {name for name, flag in flags.items() if not flag} == exempt
    # MindSpore stores the decay pre-multiplied by the loss scale (gradients arrive scaled by it)
    per_param = dict(zip([p.name for p in optimizer.parameters], optimizer.weight_decay, strict=True))
    for name in decayed:
        assert float(per_param[name].asnumpy()) == pytest.approx(1e-4 * loss_scale)
    for name in exempt:
        assert float(per_param[name].asnumpy()) == 0.0


def test_one_step_with_zero_gradient_shrinks_only_decayed_weights(mindspore_cpu, net):
    """With a zero gradient, one Momentum step is w <- w - lr * wd * w for the decayed group, a no-op otherwise."""
    ms = mindspore_cpu
    from mindspore import nn

    class ZeroGradientLoss(nn.Cell):
        def __init__(self, network):
            super().__init__(auto_prefix=False)  # keep the parameter names, as nn.WithLossCell does
            self.network = network

        def construct(self, images, labels):
            return self.network(images).sum() * 0.0

    lr, weight_decay, loss_scale = 0.5, 0.1, 8.0
    optimizer = create_momentum(net, np.full(3, lr, np.float32), 0.9, weight_decay, loss_scale)
    step = nn.TrainOneStepCell(ZeroGradientLoss(net), optimizer, sens=loss_scale)
    step.set_train(True)
    before = {p.name: p.asnumpy().copy() for p in net.trainable_params()}
    images = ms.Tensor(np.random.default_rng(0).standard_normal((2, 3, 8, 8)).astype(np.float32))
    loss = step(images, ms.Tensor(np.zeros(2, np.int32)))
    assert float(loss.asnumpy()) == 0.0
    after = {p.name: p.asnumpy() for p in net.trainable_params()}

    decayed, exempt = expected_split(net)
    for name in decayed:
        np.testing.assert_allclose(after[name], before[name] * (1 - lr * weight_decay), rtol=1e-5, err_msg=name)
    for name in exempt:
        np.testing.assert_array_equal(after[name], before[name], err_msg=name)
    # exempt group really holds non-zero values that weight decay would have moved
    assert np.all(before["stem.1.gamma"] == 1.0)
