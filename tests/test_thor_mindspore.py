"""``thor.implementation: mindspore``: what can be checked on CPU.

MindSpore's ``nn.thor`` trains only on Ascend/GPU (its kernels are missing on CPU), so these tests build the
optimizer and ``ModelThor`` for the project's network as the pipeline does, check the state round trip that
resuming relies on, drive ``EpochCallbacks`` with a real ``Model.train`` (Momentum, on CPU), and check that the
parameters refuse the option on CPU with a message that says what to do.
"""

from __future__ import annotations

import copy

import mindspore as ms
import mindspore.dataset as ds
import numpy as np
import pytest
from mindspore import nn
from test_config import CONF, load_params

from pipelines.config_validation import ParameterError, base_schema, parameter_sources, validate_parameters
from pipelines.engine.checkpoint import OPTIMIZER_PREFIX, check_compatible
from pipelines.models.loss import CrossEntropySmooth
from pipelines.engine.model_bridge import EpochCallbacks
from pipelines.models.resnet import create_resnet
from pipelines.optim.thor.mindspore_thor import (
    capture_thor_state,
    create_thor_model,
    is_statistic,
    restore_thor_state,
)
from pipelines.engine.loop import Callback, NonFiniteLossError, PeriodicCheckpoint, capture_state

CLASSES = 3
STEPS = 6


def thor_for(net, frequency: int = 3):
    lr = np.linspace(0.1, 0.01, STEPS).astype(np.float32)
    damping = np.linspace(0.03, 0.02, STEPS).astype(np.float32)
    return create_thor_model(
        net,
        CrossEntropySmooth(CLASSES, 0.1),
        lr,
        damping,
        momentum=0.9,
        weight_decay=5e-4,
        loss_scale=128,
        batch_size=4,
        frequency=frequency,
        split_indices=[],
        amp_level="O2",
        keep_batchnorm_fp32=False,
    )


def plain_net():
    return create_resnet("resnet_narrow", CLASSES, zero_init_last_bn_gamma=True)


def test_nn_thor_and_model_thor_are_built_for_our_network_without_changing_its_weights():
    from mindspore.train.train_thor.model_thor import ModelThor

    net = plain_net()
    before = {p.name: p.asnumpy().copy() for p in net.get_parameters()}
    model, optimizer = thor_for(net, frequency=5)
    assert isinstance(model, ModelThor)
    assert optimizer.get_frequency() == 5
    after = {p.name: p.asnumpy() for p in net.get_parameters() if not is_statistic(p.name)}
    assert after.keys() == before.keys()
    for name, value in before.items():
        np.testing.assert_array_equal(after[name], value, err_msg=name)
    layers = [n for n in before if n.endswith(".weight") and "bn" not in n]  # every Conv2d and the Dense
    converted = {
        p.name.rsplit(".", 1)[0] for p in net.get_parameters() if p.name.endswith((".matrix_a_cov", ".matrix_a"))
    }
    assert converted == {n.rsplit(".", 1)[0] for n in layers}
    decays = dict(zip((p.name for p in optimizer.parameters), optimizer.decay_flags, strict=True))
    assert decays["layers.0.conv1.weight"] and decays["fc.weight"]
    assert not decays["fc.bias"] and not decays["stem.1.gamma"] and not decays["stem.1.beta"]


def test_state_fits_the_plain_network_and_round_trips_into_a_fresh_optimizer():
    net = plain_net()
    _, optimizer = thor_for(net)
    rng = np.random.default_rng(0)
    for param in [*net.get_parameters(), *optimizer.get_parameters()]:
        if is_statistic(param.name) or param.name.startswith(("moments.", "matrix_a_inv", "matrix_g_inv")):
            param.set_data(ms.Tensor(rng.standard_normal(param.shape).astype(np.float32)))
    optimizer.global_step.set_data(ms.Tensor(np.array([4], np.int32)))
    saved = capture_thor_state(net, optimizer, {"epoch": 2})

    fresh = plain_net()
    check_compatible({p.name: tuple(p.shape) for p in fresh.get_parameters()}, saved, "the THOR state")
    state = saved.optimizer_state()
    assert any(name.startswith("moments.") for name in state) and "global_step" in state
    assert any(name.startswith("matrix_a_inv_") for name in state)
    assert any(name.endswith(".matrix_g_cov") for name in state)

    _, fresh_optimizer = thor_for(fresh)
    restore_thor_state(fresh, fresh_optimizer, saved)
    restored = capture_thor_state(fresh, fresh_optimizer, {})
    for name, value in saved.optimizer_state().items():
        np.testing.assert_array_equal(restored.optimizer_state()[name], value, err_msg=name)

    incomplete = copy.deepcopy(saved)
    del incomplete.params[OPTIMIZER_PREFIX + "global_step"]
    with pytest.raises(ValueError, match="checkpoint lacks THOR state.*global_step"):
        restore_thor_state(fresh, fresh_optimizer, incomplete)


# ------------------------------------------------------------------------------------------------
# EpochCallbacks under a real Model.train (Momentum: nn.thor cannot train on CPU)


class Steps(Callback):
    def __init__(self):
        self.calls: list[tuple[int, int]] = []
        self.ended = 0

    def on_step_end(self, epoch: int, step: int, loss: float) -> None:
        self.calls.append((epoch, step))

    def on_train_end(self) -> None:
        self.ended += 1


def momentum_model(poison: bool = False):
    from mindspore.train import Model

    ms.set_seed(0)
    net = create_resnet("resnet_narrow", CLASSES)
    if poison:
        net.fc.weight.set_data(ms.Tensor(np.full(net.fc.weight.shape, np.nan, np.float32)))
    optimizer = nn.Momentum(net.trainable_params(), 0.01, 0.9)
    return net, optimizer, Model(net, CrossEntropySmooth(CLASSES, 0.1), optimizer)


def tiny_dataset(batches: int = 3):
    rng = np.random.default_rng(0)
    images = rng.standard_normal((4 * batches, 3, 8, 8)).astype(np.float32)
    labels = rng.integers(0, CLASSES, 4 * batches).astype(np.int32)
    return ds.NumpySlicesDataset({"image": images, "label": labels}, shuffle=False).batch(4)


def test_epoch_callbacks_record_rows_run_our_callbacks_and_write_checkpoints(tmp_path):
    net, optimizer, model = momentum_model()
    dataset = tiny_dataset()
    lr = np.arange(1, 13, dtype=np.float32)  # 4 epochs x 3 steps
    steps = Steps()
    evaluations = []
    driver = EpochCallbacks(
        [steps, PeriodicCheckpoint(lambda e: capture_state(net, optimizer, {"epoch": e}), tmp_path, 1, 2)],
        total_epochs=4,
        start_epoch=1,
        steps_per_epoch=3,
        lr_per_step=lr,
        images_per_step=4,
        evaluate=lambda: evaluations.append(1) or {"top1": 0.5, "top5": 1.0},
        eval_interval=2,
        extra_metrics=lambda step: {"damping": float(step)},
    )
    model.train(4, dataset, callbacks=[driver], dataset_sink_mode=False, initial_epoch=1)
    driver.close()  # what the node does after train: a no-op once train ended

    assert [row["epoch"] for row in driver.rows] == [2.0, 3.0, 4.0]
    assert [row["lr"] for row in driver.rows] == [6.0, 9.0, 12.0]  # the epoch's last step
    assert [row["damping"] for row in driver.rows] == [5.0, 8.0, 11.0]
    assert ["top1" in row for row in driver.rows] == [True, False, True]  # every 2nd epoch and the last
    assert all(np.isfinite(row["loss"]) and row["images_per_s"] > 0 for row in driver.rows)
    assert steps.calls == [(e, s) for e in (1, 2, 3) for s in range(3)]
    assert steps.ended == 1
    assert sorted(p.name for p in tmp_path.iterdir()) == ["epoch_0003.ckpt", "epoch_0004.ckpt"]


def test_epoch_callbacks_stop_on_a_non_finite_loss():
    _, _, model = momentum_model(poison=True)
    steps = Steps()
    driver = EpochCallbacks([steps], 2, 0, 3, np.ones(6, np.float32), 4)
    with pytest.raises(NonFiniteLossError, match="at epoch 1, step 1/3"):
        try:
            model.train(2, tiny_dataset(), callbacks=[driver], dataset_sink_mode=False)
        finally:
            driver.close()
    assert steps.calls == [] and steps.ended == 1


# ------------------------------------------------------------------------------------------------
# parameters


@pytest.fixture(scope="module")
def base() -> dict:
    return base_schema(CONF)


def with_thor(params: dict, **changes) -> dict:
    params = copy.deepcopy(params)
    for key, value in changes.items():
        section = params["thor"]
        *parents, leaf = key.split("__")
        for parent in parents:
            section = section[parent]
        section[leaf] = value
    return params


def test_mindspore_thor_on_cpu_is_refused_saying_what_to_do(base):
    params = with_thor(load_params("local"), implementation="mindspore")
    sources = parameter_sources(CONF, "local", {"thor": {"implementation": "mindspore"}})
    with pytest.raises(ParameterError) as error:
        validate_parameters(params, base, sources)
    message = str(error.value)
    assert "thor.implementation is mindspore" in message and "(--params)" in message
    assert "runtime.device_target is CPU" in message
    assert "use thor.implementation: own" in message and "--env=gpu" in message


@pytest.mark.parametrize("env", ["gpu", "ascend"])
def test_mindspore_thor_is_accepted_on_ascend_and_gpu(base, env):
    params = with_thor(load_params(env), implementation="mindspore")
    validate_parameters(params, base, parameter_sources(CONF, env, None))
    assert params["thor"]["mindspore"]["split_indices"] == [26, 53]  # the tutorial's ResNet-50 fusion split


def test_unknown_amp_level_is_named(base):
    params = with_thor(load_params("gpu"), implementation="mindspore", mindspore__amp_level="O4")
    with pytest.raises(ParameterError, match="thor.mindspore.amp_level is 'O4'; choose one of O0, O1, O2, O3"):
        validate_parameters(params, base, parameter_sources(CONF, "gpu", None))
