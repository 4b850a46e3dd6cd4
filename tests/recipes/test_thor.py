"""The THOR recipe with ``thor.precondition: false``: THOR's recipe without its curvature.

Trained through the recipe and the engine, its weights equal, bit for bit, a plain Momentum training given THOR's
lr schedule, weight decay (and its parameter groups), loss scale, zero-initialised last BatchNorm gammas and data
order: only the preconditioning is gone. With the switch on, the same run differs (the curvature acts)."""

from __future__ import annotations

import mindspore.dataset as ds
import numpy as np
import pytest
from mindspore import nn

from tests.support.runner import tiny_parameters
from tests.support.trees import write_image_tree
from trainlib.data.folder import scan_image_tree
from trainlib.engine.resume import fingerprint
from trainlib.models.loss import CrossEntropySmooth
from trainlib.optim.momentum import create_momentum
from trainlib.recipes.classifier import build_network, network_from_checkpoint, train_data
from trainlib.recipes.context import TrainingContext
from trainlib.recipes.thor import thor_schedules, train_thor

CLASSES = ("cat", "dog", "fox")


@pytest.fixture(scope="module")
def setting(tmp_path_factory):
    root = tmp_path_factory.mktemp("thor_switch")
    tree = write_image_tree(root / "tree", classes=CLASSES, per_class={"train": 8, "val": 3})
    params = tiny_parameters(tree, {"thor": {"epochs": 2, "precondition": False, "eval_interval": 0}})
    manifest = scan_image_tree(tree, {"train": "train", "val": "val"}).manifest
    class_index = {name: label for label, name in enumerate(CLASSES)}
    return root, params, manifest, class_index


def train(root, params, manifest, class_index):
    """THOR's recipe trained in a folder of its own under ``root`` (its checkpoints land there)."""
    initial = build_network(
        params.network, class_index, params.runtime, zero_init_last_bn_gamma=params.thor.zero_init_last_bn_gamma
    )
    context = TrainingContext(manifest, class_index, params.network, params.data, params.runtime, params.distributed)
    folder = root / f"precondition_{params.thor.precondition}"
    folder.mkdir()  # a new folder: nothing to resume from
    with pytest.MonkeyPatch.context() as patch:
        patch.chdir(folder)
        result = train_thor(context, initial, params.thor)
    return initial, result


@pytest.fixture(scope="module")
def first_order(setting):
    """THOR's recipe with the switch off, trained once for the tests of this module."""
    return train(*setting)


def trainable(checkpoint, names) -> dict[str, np.ndarray]:
    return {name: checkpoint.params[name] for name in names}


def test_without_the_preconditioner_thor_is_momentum_on_thors_recipe(setting, first_order):
    _, params, manifest, class_index = setting
    thor = params.thor
    initial, result = first_order
    assert result.step.preconditioner is None
    counters = ("thor/second_order_steps", "thor/trace_skips", "thor/inverses_computed")
    assert [result.history[-1][key] for key in counters] == [0.0, 0.0, 0.0]
    assert {"thor/second_order_step_s", "thor/reuse_step_s"}.isdisjoint(result.history[-1])
    assert not any(name.startswith("optimizer.thor.") for name in result.checkpoint.params)

    # the reference: THOR's network, schedule, weight decay and loss scale in a plain Momentum step, same batches
    net = network_from_checkpoint(params.network, class_index, initial, "the initial weights")
    data = train_data(manifest, params.data, thor.batch_size, params.runtime.seed)
    lr_per_step, _ = thor_schedules(thor, data.get_dataset_size())
    optimizer = create_momentum(net, lr_per_step, thor.momentum, thor.weight_decay, thor.loss_scale)
    loss = CrossEntropySmooth(len(CLASSES), thor.label_smoothing)
    step = nn.TrainOneStepCell(nn.WithLossCell(net, loss), optimizer, sens=thor.loss_scale)
    step.set_train(True)
    for epoch in range(thor.epochs):
        ds.config.set_seed(params.runtime.seed + epoch)  # the engine's data order
        for images, labels in data.create_tuple_iterator(num_epochs=1):
            step(images, labels)
    names = [p.name for p in net.trainable_params()]
    reference = {p.name: p.asnumpy() for p in net.trainable_params()}
    trained = trainable(result.checkpoint, names)
    moved = max(float(np.abs(trained[n] - initial.params[n]).max()) for n in names)
    assert moved > 1e-3  # it trained
    for name in names:
        np.testing.assert_array_equal(trained[name], reference[name], err_msg=name)


def test_the_switch_changes_the_fingerprint(setting):
    """A study keeps thor and thor_first_order apart by their configuration; that the preconditioner then changes the
    training is the study pipeline's test (tests/pipelines/test_runs.py: both trainings, one with second-order
    steps, different losses)."""
    _, params, _, _ = setting
    second_order = params.thor.model_copy(update={"precondition": True})
    assert fingerprint(params.thor) != fingerprint(second_order)
