"""``thor.implementation: mindspore_builtin``: what can be checked on CPU.

MindSpore's ``nn.thor`` trains only on Ascend/GPU (its kernels are missing on CPU), so these tests build the
optimizer and ``ModelThor`` for the project's network as the recipe does, check the state round trip that
resuming relies on, drive the engine's ``Model.train`` bridge (what ``implementation: mindspore_builtin`` trains
through) with a real ``Model.train`` (Momentum, on CPU) and THOR's per-epoch figures, and check that the
parameters refuse the option on CPU with a message that says what to do.
"""

from __future__ import annotations

import copy

import mindspore as ms
import mindspore.dataset as ds
import numpy as np
import pytest
from mindspore import nn

from pipelines.hooks.config_files import parameter_sources
from tests.support.config import CONF, load_config
from tests.support.training import GivenSteps
from trainlib.engine.callbacks import Callback
from trainlib.engine.checkpoint import OPTIMIZER_PREFIX, check_compatible
from trainlib.engine.epochs import NonFiniteLossError, TrainingSpec
from trainlib.engine.loop import Checkpointing, train
from trainlib.engine.model_bridge import ModelTrainStep
from trainlib.engine.state import capture_state, restore_network
from trainlib.metrics import TRAIN_LR, VAL_TOP1
from trainlib.models.loss import CrossEntropySmooth
from trainlib.models.resnet import create_resnet
from trainlib.optim.thor.mindspore_thor import (
    capture_thor_state,
    create_thor_model,
    create_thor_optimizer,
    is_statistic,
    restore_thor_state,
)
from trainlib.params import ParameterError, validate_parameters
from trainlib.recipes.thor import THOR_DAMPING, MindsporeThorStep, ThorFigures

CLASSES = 3
STEPS = 6


LR = np.linspace(0.1, 0.01, STEPS).astype(np.float32)
DAMPING = np.linspace(0.03, 0.02, STEPS).astype(np.float32)


def thor_section(frequency: int = 3):
    """gpu's THOR section (amp O2) at a batch of 4 with one allreduce group."""
    return validate_parameters(
        with_thor(load_config("gpu"), implementation="mindspore_builtin", batch_size=4, frequency=frequency),
        parameter_sources(CONF, "gpu", None),
    ).thor.model_copy(update={"split_indices": []})  # ResNet-50's split, [26, 53], is past this network's layers


def thor_for(net, frequency: int = 3):
    """The (ModelThor, nn.thor) pair, built as ``recipes.thor`` builds them."""
    thor = thor_section(frequency)
    optimizer = create_thor_optimizer(net, LR, DAMPING, thor)
    return create_thor_model(net, CrossEntropySmooth(CLASSES, 0.1), optimizer, thor), optimizer


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


def test_the_recipes_step_builds_model_thor_from_the_section():
    """``recipes.thor``'s step for ``implementation: mindspore_builtin``: the section's sink mode, and ``ModelThor``
    built when the engine prepares the step (training itself needs Ascend or GPU)."""
    from mindspore.train.train_thor.model_thor import ModelThor

    net, thor = plain_net(), thor_section()
    optimizer = create_thor_optimizer(net, LR, DAMPING, thor)
    step = MindsporeThorStep(net, CrossEntropySmooth(CLASSES, 0.1), optimizer, LR, DAMPING, thor)
    assert step.sink_mode is thor.mindspore_builtin.dataset_sink_mode
    step.prepare()
    assert isinstance(step.model, ModelThor)


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
# the engine's Model.train bridge under a real Model.train (Momentum: nn.thor cannot train on CPU)


class Steps(Callback):
    def __init__(self):
        self.calls: list[tuple[int, int]] = []
        self.ended = 0

    def on_step_end(self, epoch: int, step: int, loss: float) -> None:
        self.calls.append((epoch, step))

    def on_train_end(self) -> None:
        self.ended += 1


class MomentumModelStep(ModelTrainStep):
    """A ``Model.train`` step with the damping schedule and (no) preconditioner that ``ThorFigures`` reads."""

    preconditioner = None

    def __init__(self, net, optimizer, lr_per_step, damping):
        from mindspore.train import Model

        super().__init__(
            lambda: Model(net, CrossEntropySmooth(CLASSES, 0.1), optimizer),
            net,
            optimizer,
            lr_per_step,
            sink_mode=False,
        )
        self.damping = damping


def momentum_step_factory(poison: bool = False):
    """``make_step`` for ``engine.loop.train``: a Momentum ``Model`` over a narrow ResNet (weights from ``start``)."""

    def make_step(start, steps_per_epoch: int) -> MomentumModelStep:
        ms.set_seed(0)
        net = create_resnet("resnet_narrow", CLASSES)
        if start is not None:
            restore_network(net, start)
        if poison:
            net.fc.weight.set_data(ms.Tensor(np.full(net.fc.weight.shape, np.nan, np.float32)))
        lr = np.arange(1, 13, dtype=np.float32) * 1e-3  # 4 epochs x 3 steps
        optimizer = nn.Momentum(net.trainable_params(), ms.Tensor(lr), 0.9)
        return MomentumModelStep(net, optimizer, lr, np.arange(12, dtype=np.float32))

    return make_step


def tiny_dataset(batches: int = 3):
    rng = np.random.default_rng(0)
    images = rng.standard_normal((4 * batches, 3, 8, 8)).astype(np.float32)
    labels = rng.integers(0, CLASSES, 4 * batches).astype(np.int32)
    return ds.NumpySlicesDataset({"image": images, "label": labels}, shuffle=False).batch(4)


def test_model_train_bridge_records_rows_runs_our_callbacks_and_writes_checkpoints(tmp_path):
    make_step = momentum_step_factory()
    first = make_step(None, 3)
    start = capture_state(first.network, first.optimizer, {"epoch": 1})  # continue after epoch 1
    steps = Steps()
    evaluations = []
    result = train(
        TrainingSpec(epochs=4, batch_size=4, examples_per_step=4, eval_interval=2),
        tiny_dataset(),
        GivenSteps(make_step, scores=lambda step, data: evaluations.append(1) or {"top1": 0.5, "top5": 1.0}),
        start=start,
        checkpoints=Checkpointing(tmp_path, every_epochs=1, keep_last=2),
        validation="val",  # the scores ignore it
        callbacks=[steps, ThorFigures()],
        continue_from_start=True,
    )
    rows = result.history
    assert [row["epoch"] for row in rows] == [2, 3, 4]
    assert [row[TRAIN_LR] for row in rows] == pytest.approx([6e-3, 9e-3, 12e-3])  # the epoch's last step
    assert [row[THOR_DAMPING] for row in rows] == [5.0, 8.0, 11.0]
    assert [VAL_TOP1 in row for row in rows] == [True, False, True]  # every 2nd epoch and the last
    assert all(np.isfinite(row["train/loss"]) and row["train/images_per_s"] > 0 for row in rows)
    assert steps.calls == [(e, s) for e in (1, 2, 3) for s in range(3)]
    assert steps.ended == 1
    assert sorted(p.name for p in tmp_path.iterdir()) == ["epoch_0003.ckpt", "epoch_0004.ckpt"]


def test_model_train_bridge_stops_on_a_non_finite_loss():
    steps = Steps()
    with pytest.raises(NonFiniteLossError, match="at epoch 1, step 1/3"):
        train(
            TrainingSpec(epochs=2, batch_size=4, examples_per_step=4),
            tiny_dataset(),
            GivenSteps(momentum_step_factory(True)),
            callbacks=[steps],
        )
    assert steps.calls == [] and steps.ended == 1


# ------------------------------------------------------------------------------------------------
# parameters


def with_thor(params: dict, **changes) -> dict:
    params = copy.deepcopy(params)
    for key, value in changes.items():
        section = params["thor"]
        *parents, leaf = key.split("__")
        for parent in parents:
            section = section[parent]
        section[leaf] = value
    return params


def test_mindspore_thor_on_cpu_is_refused_saying_what_to_do():
    params = with_thor(load_config("local"), implementation="mindspore_builtin")
    sources = parameter_sources(CONF, "local", {"thor": {"implementation": "mindspore_builtin"}})
    with pytest.raises(ParameterError) as error:
        validate_parameters(params, sources)
    message = str(error.value)
    assert "thor.implementation is mindspore" in message and "(--params)" in message
    assert "runtime.device_target is CPU" in message
    assert "use thor.implementation: trainlib" in message and "--env=gpu" in message


@pytest.mark.parametrize("env", ["gpu", "ascend"])
def test_mindspore_thor_is_accepted_on_ascend_and_gpu(env):
    params = with_thor(load_config(env), implementation="mindspore_builtin")
    thor = validate_parameters(params, parameter_sources(CONF, env, None)).thor
    assert thor.split_indices == [26, 53]  # the tutorial's ResNet-50 fusion split


def test_unknown_amp_level_is_named():
    params = with_thor(load_config("gpu"), implementation="mindspore_builtin", mindspore_builtin__amp_level="O4")
    with pytest.raises(ParameterError, match="thor.mindspore_builtin.amp_level is 'O4'; choose one of O0, O1, O2, O3"):
        validate_parameters(params, parameter_sources(CONF, "gpu", None))
