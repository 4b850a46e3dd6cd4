"""mindspore.boost's LessBN, gradient freeze and gradient accumulation in our training step, against references."""

from __future__ import annotations

import copy

import numpy as np
import pytest

from pipelines.hooks.config_files import parameter_sources
from tests.support.config import CONF, load_config
from trainlib.boost.options import build_train_step, grad_centralization_enabled, validate_boost
from trainlib.optim.momentum import create_momentum
from trainlib.params import BoostParams, ParameterError, validate_parameters

OFF = load_config()["boost"]
LOSS_SCALE = 8.0


def boost(**changes) -> BoostParams:
    """The ``boost`` section of conf/base with ``changes``, as the nodes receive it."""
    return BoostParams(**{**OFF, **changes})


def dense_net(seed: int = 1):
    import mindspore as ms
    from mindspore import nn

    class Net(nn.Cell):
        def __init__(self):
            super().__init__()
            self.fc1 = nn.Dense(4, 6)
            self.fc2 = nn.Dense(6, 5)
            self.fc3 = nn.Dense(5, 3)
            self.relu = nn.ReLU()

        def construct(self, x):
            return self.fc3(self.relu(self.fc2(self.relu(self.fc1(x)))))

    ms.set_seed(seed)
    return Net()


def with_loss(net):
    from mindspore import nn

    return nn.WithLossCell(net, nn.SoftmaxCrossEntropyWithLogits(sparse=True, reduction="mean"))


def step_for(net, lr: np.ndarray, options: dict | None, weight_decay: float = 0.0, device_target: str = "CPU"):
    optimizer = create_momentum(net, lr, 0.9, weight_decay, LOSS_SCALE)
    step = build_train_step(with_loss(net), optimizer, LOSS_SCALE, options, device_target)
    step.set_train(True)
    return step, optimizer


def weights(net) -> dict[str, np.ndarray]:
    return {p.name: p.asnumpy().copy() for p in net.trainable_params()}


def batches(count: int, size: int = 4, seed: int = 0):
    import mindspore as ms

    rng = np.random.default_rng(seed)
    images = rng.normal(size=(count, size, 4)).astype(np.float32)
    labels = rng.integers(0, 3, size=(count, size)).astype(np.int32)
    return [(ms.Tensor(x), ms.Tensor(y)) for x, y in zip(images, labels, strict=True)]


def global_step(optimizer) -> int:
    return int(optimizer.global_step.asnumpy().reshape(-1)[0])


@pytest.mark.parametrize("options", [None, boost()])
def test_all_off_is_a_plain_train_one_step_cell_bit_for_bit(options):
    from mindspore import nn

    lr = np.linspace(0.1, 0.05, 4).astype(np.float32)
    net, reference = dense_net(), dense_net()
    step, _ = step_for(net, lr, options, weight_decay=1e-2)
    plain = nn.TrainOneStepCell(with_loss(reference), create_momentum(reference, lr, 0.9, 1e-2, LOSS_SCALE), LOSS_SCALE)
    plain.set_train(True)
    assert type(step) is nn.TrainOneStepCell
    for images, labels in batches(4):
        assert step(images, labels).asnumpy() == plain(images, labels).asnumpy()
    for name, value in weights(reference).items():
        np.testing.assert_array_equal(weights(net)[name], value)


def test_accumulation_updates_every_n_batches_with_the_mean_gradient():
    n, updates = 3, 2
    lr = np.linspace(0.1, 0.01, n * updates).astype(np.float32)
    net = dense_net()
    names = list(weights(net))
    step, optimizer = step_for(net, lr, boost(grad_accumulation_steps=n))
    data = batches(n * updates)
    history = [weights(net)]
    for batch, (images, labels) in enumerate(data):
        step(images, labels)
        history.append(weights(net))
        assert global_step(optimizer) == batch + 1  # the lr schedule still counts batches
    assert list(history[-1]) == names  # boost's cells must not rename the parameters
    for batch in range(n * updates):
        changed = any(not np.array_equal(history[batch][k], history[batch + 1][k]) for k in names)
        assert changed == ((batch + 1) % n == 0)
    # the mean gradient of N batches of a BatchNorm-free net is the gradient of their concatenation:
    # plain Momentum on the concatenated batches, with the lr of each window's last batch
    reference = dense_net()
    plain, _ = step_for(reference, lr[n - 1 :: n], None)
    for update in range(updates):
        window = data[update * n : (update + 1) * n]
        plain(
            type(window[0][0])(np.concatenate([x.asnumpy() for x, _ in window])),
            type(window[0][1])(np.concatenate([y.asnumpy() for _, y in window])),
        )
        for name, value in weights(reference).items():
            np.testing.assert_allclose(history[(update + 1) * n][name], value, rtol=1e-5, atol=1e-7)


def test_freeze_trains_the_chosen_group_with_its_own_momentum_from_the_resumed_step():
    import mindspore as ms

    lr = np.linspace(0.1, 0.02, 10).astype(np.float32)
    start = 2  # as if resumed: the schedule continues at the optimizer's step
    net = dense_net()
    optimizer = create_momentum(net, lr, 0.9, 0.0, LOSS_SCALE)
    optimizer.global_step.set_data(ms.Tensor(np.full(optimizer.global_step.shape, start, np.int32)))
    loss = with_loss(net)
    step = build_train_step(
        loss, optimizer, LOSS_SCALE, boost(grad_freeze=True, freeze_param_groups=2, freeze_type=0, freeze_p=0.5), "CPU"
    )
    step.set_train(True)
    groups = [[p.name for p in opt.parameters] for opt in step.optimizer.opts]
    assert groups == [list(weights(net)), ["fc3.weight", "fc3.bias"]]  # group 1 freezes fc1 and fc2
    strategy = step.train_strategy.asnumpy()
    grad = ms.value_and_grad(loss, None, weights=net.trainable_params())
    momenta = [dict.fromkeys(weights(net), 0.0) for _ in groups]
    current = weights(net)
    for i, (images, labels) in enumerate(batches(len(lr) - start)):
        gradients = dict(zip(current, (g.asnumpy() for g in grad(images, labels)[1]), strict=True))
        group = int(strategy[i])
        expected = dict(current)
        for name in groups[group]:
            momenta[group][name] = 0.9 * momenta[group][name] + gradients[name]
            expected[name] = current[name] - lr[start + i] * momenta[group][name]
        step(images, labels)
        current = weights(net)
        for name, value in expected.items():
            np.testing.assert_allclose(current[name], value, rtol=1e-5, atol=1e-7, err_msg=f"step {i} {name}")
        assert global_step(optimizer) == start + i + 1
    assert set(strategy[: len(lr) - start]) == {0, 1}


def test_too_many_freeze_groups_are_refused():
    with pytest.raises(ValueError, match="boost.freeze_param_groups is 5"):
        step_for(dense_net(), np.full(4, 0.1, np.float32), boost(grad_freeze=True, freeze_param_groups=5))


def tiny_resnet(seed: int = 3):
    import mindspore as ms

    from trainlib.models.resnet import ResNet, ResNetLayout

    ms.set_seed(seed)
    return ResNet(ResNetLayout("basic", (2,), base_width=4, small_input_stem=True), 3)


def test_less_bn_trains_the_network_without_the_batchnorms_it_deletes():
    import mindspore as ms
    from mindspore import nn

    rng = np.random.default_rng(0)
    images = ms.Tensor(rng.normal(size=(4, 3, 8, 8)).astype(np.float32))
    labels = ms.Tensor(np.array([0, 1, 2, 0], np.int32))
    lr = np.full(3, 0.1, np.float32)
    net = tiny_resnet()
    before = {p.name: p.asnumpy().copy() for p in net.get_parameters()}
    step, _ = step_for(net, lr, boost(less_bn=True))
    losses = [float(step(images, labels).asnumpy()) for _ in range(3)]
    # measured: MindSpore's less_bn pass deletes the first BatchNorm of each basic block
    reference = tiny_resnet()
    for block in reference.layers:
        block.bn1 = nn.Identity()
    plain, _ = step_for(reference, lr, None)
    np.testing.assert_allclose(losses, [float(plain(images, labels).asnumpy()) for _ in range(3)], rtol=1e-5)
    after = {p.name: p.asnumpy() for p in net.get_parameters()}
    assert list(after) == list(before)
    unchanged = sorted(name for name in before if np.array_equal(before[name], after[name]))
    deleted = ("gamma", "beta", "moving_mean", "moving_variance")
    assert unchanged == sorted(f"layers.{i}.bn1.{p}" for i in range(2) for p in deleted)
    for name, value in weights(reference).items():
        np.testing.assert_allclose(after[name], value, rtol=1e-4, atol=1e-6)


def test_less_bn_grad_centralization_marks_boosts_weights_on_ascend():
    net = tiny_resnet()
    _, optimizer = step_for(net, np.full(2, 0.1, np.float32), boost(less_bn=True), device_target="Ascend")
    flagged = {p.name for p, on in zip(optimizer.parameters, optimizer.grad_centralization_flags, strict=True) if on}
    # boost's rule: every convolution and dense weight, no BatchNorm parameter, no bias
    assert flagged == {p.name for p in net.trainable_params() if p.name.endswith(".weight")}
    assert len(flagged) > 1


def test_grad_centralization_is_off_on_cpu_and_gpu_unless_asked():
    assert not grad_centralization_enabled(boost(less_bn=True), "CPU")
    assert not grad_centralization_enabled(boost(less_bn=True), "GPU")
    assert grad_centralization_enabled(boost(less_bn=True), "Ascend")
    assert not grad_centralization_enabled(boost(less_bn=True, grad_centralization="off"), "Ascend")
    (problem,) = validate_boost(boost(less_bn=True, grad_centralization="on"), "CPU")
    assert problem.startswith("boost.grad_centralization is on") and "no Centralization kernel on CPU" in problem


def test_freeze_with_accumulation_is_refused_naming_both_keys():
    # refused by the parameters themselves, so no step can be built with them
    with pytest.raises(ValueError, match="cannot be used together") as error:
        boost(grad_freeze=True, grad_accumulation_steps=4)
    problem = str(error.value)
    assert "boost.grad_freeze: false" in problem and "boost.grad_accumulation_steps: 1" in problem


def test_less_bn_needs_graph_mode():
    (problem,) = validate_boost(boost(less_bn=True), "CPU", mode="pynative")
    assert problem.startswith("boost.less_bn needs runtime.mode graph")
    assert validate_boost(boost(less_bn=True, grad_freeze=True), "CPU") == []


def test_less_bn_with_accumulation_is_refused():
    # measured, also through AutoBoost + BoostTrainOneStepCell: the deleted BatchNorms' gamma and beta
    # receive identical non-zero updates, while the other weights train as without those layers
    with pytest.raises(ValueError) as error:
        boost(less_bn=True, grad_accumulation_steps=2)
    problem = str(error.value)
    assert "boost.less_bn and boost.grad_accumulation_steps (2) cannot be used together" in problem
    assert "boost.less_bn: false or boost.grad_accumulation_steps: 1" in problem


@pytest.mark.parametrize(
    ("changes", "message"),
    [
        ({"grad_freeze": True, "grad_accumulation_steps": 2}, "boost.grad_freeze and boost.grad_accumulation_steps"),
        ({"less_bn": True, "grad_centralization": "on"}, "boost.grad_centralization is on, but MindSpore has no"),
        ({"less_bn": True, "grad_accumulation_steps": 2}, "boost.less_bn and boost.grad_accumulation_steps (2)"),
        ({"grad_centralization": "yes"}, "boost.grad_centralization is 'yes'; choose one of auto, on, off"),
        ({"grad_accumulation_steps": 0}, "boost.grad_accumulation_steps is 0 but must be > 0"),
        ({"freeze_param_groups": 1}, "boost.freeze_param_groups is 1 but must be >= 2"),
        ({"freeze_type": 2}, "boost.freeze_type is 2 but must be <= 1"),
    ],
)
def test_parameter_validation_names_the_boost_key_and_file(changes, message):
    params = copy.deepcopy(load_config("local"))
    params["boost"].update(changes)
    with pytest.raises(ParameterError) as error:
        validate_parameters(params, parameter_sources(CONF, "local", {"boost": changes}))
    line = next(line for line in str(error.value).splitlines() if message in line)
    assert line.endswith("(--params)")
