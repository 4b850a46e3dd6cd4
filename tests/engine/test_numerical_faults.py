"""Numerical faults stop training with the epoch and step named; gradients that overflow because the
fixed loss scale is too large are reported as a loss-scale problem, with the remedy."""

from __future__ import annotations

import mindspore as ms
import numpy as np
import pytest
from mindspore import nn

from tests.support.training import GivenSteps
from trainlib.engine.epochs import LossScaleOverflowError, NonFiniteLossError, TrainingSpec
from trainlib.engine.loop import train
from trainlib.engine.step import TrainStep
from trainlib.models.loss import CrossEntropySmooth
from trainlib.optim.dim_reduce.pbfgs import PBFGS
from trainlib.optim.momentum import create_momentum
from trainlib.recipes.context import TrainingContext

IN, OUT, BATCH, STEPS = 8, 3, 4, 5
# Inputs of magnitude ~1000 give gradients of ~100, which this scale pushes past float32's 3.4e38;
# with loss scale 1 the same training runs (see the control test).
TOO_LARGE_SCALE = 1e37


def dataset():
    import mindspore.dataset as ds

    rng = np.random.default_rng(0)
    images = (rng.standard_normal((BATCH * STEPS, IN)) * 1000).astype(np.float32)
    labels = rng.integers(0, OUT, BATCH * STEPS).astype(np.int32)
    return ds.NumpySlicesDataset({"image": images, "label": labels}, shuffle=False).batch(BATCH)


def dense_training(loss_scale: float) -> TrainStep:
    """A Dense layer under Momentum with a fixed ``loss_scale``, as the engine trains it."""
    ms.set_seed(0)
    net = nn.Dense(IN, OUT)
    lr = np.full(STEPS, 1e-6, np.float32)
    optimizer = create_momentum(net, lr, 0.9, 0.0, loss_scale)
    cell = nn.TrainOneStepCell(nn.WithLossCell(net, CrossEntropySmooth(OUT, 0.0)), optimizer, sens=loss_scale)
    cell.set_train(True)
    return TrainStep(cell, net, optimizer, lr)


def train_one_epoch(step: TrainStep) -> list[dict]:
    spec = TrainingSpec(epochs=1, batch_size=BATCH, examples_per_step=BATCH)
    return train(spec, dataset(), GivenSteps(lambda start, steps_per_epoch: step)).history


def test_the_training_runs_with_loss_scale_1():
    history = train_one_epoch(dense_training(1.0))
    assert np.isfinite(history[0]["train/loss"])


def test_overflow_in_a_plain_step_is_reported_with_the_loss_scale():
    step = dense_training(TOO_LARGE_SCALE)
    assert step.loss_scale == TOO_LARGE_SCALE  # read from the cell's sens
    with pytest.raises(NonFiniteLossError) as error:
        train_one_epoch(step)
    message = str(error.value)
    assert f"at epoch 1, step 2/{STEPS}" in message  # the first update wrote Inf into the weights
    assert "the last good checkpoint is kept" in message
    assert "or the loss scale (1e+37) if the scaled gradients overflow" in message


def test_pbfgs_skips_an_overflowing_step_and_says_so():
    from dataclasses import replace

    from tests.support.pbfgs import RECIPE

    ms.set_seed(0)
    net = nn.Dense(IN, OUT)
    n = IN * OUT + OUT
    pca = np.linalg.qr(np.random.default_rng(1).standard_normal((n, 2)))[0].T.astype(np.float32)
    trainer = PBFGS(net, CrossEntropySmooth(OUT, 0.0), pca, replace(RECIPE, loss_scale=TOO_LARGE_SCALE), rank_size=1)
    before = {p.name: p.asnumpy().copy() for p in net.trainable_params()}
    images, labels = next(dataset().create_tuple_iterator(num_epochs=1))
    result = trainer.step(images, labels)
    assert result.overflow and result.step_size == 0.0
    for param in net.trainable_params():
        np.testing.assert_array_equal(param.asnumpy(), before[param.name])
    np.testing.assert_array_equal(trainer.inverse_hessian, np.eye(2, dtype=np.float32))
    # the same step at the recipe's loss scale moves the weights: tests/optim/dim_reduce/test_pbfgs.py's formulas


def test_stage2_with_too_large_a_loss_scale_stops_as_a_loss_scale_error(tmp_path):
    from tests.support.config import load_config
    from tests.support.trees import write_image_tree
    from trainlib.data.folder import scan_image_tree
    from trainlib.engine.state import capture_state
    from trainlib.params import DataParams, DimReduceParams, DistributedParams, NetworkParams, RuntimeParams
    from trainlib.recipes.classifier import create_network
    from trainlib.recipes.dim_reduce import train_stage2

    tree = write_image_tree(tmp_path / "tree", classes=("a", "b", "c"), per_class={"train": 6, "val": 2})
    scanned = scan_image_tree(tree, {"train": "train", "val": "val"})
    params = load_config()
    params["network"]["name"] = "resnet_narrow"
    params["data"].update({"image_size": 12, "num_workers": 1})
    stage2 = params["dim_reduce"]["stage2"]
    # the scaled loss (about 1.1 x 3.3e38) overflows float32, and with it the scaled gradients
    stage2.update({"batch_size": BATCH, "loss_scale": 3.3e38})
    stage2["checkpoint"]["dir"] = str(tmp_path / "epochs")
    network = NetworkParams(**params["network"])
    net = create_network(network, scanned.class_index)
    start = capture_state(net, None, {"network": "resnet_narrow", "epoch": 1})
    n = sum(int(np.prod(p.shape)) for p in net.trainable_params())
    pca = np.linalg.qr(np.random.default_rng(0).standard_normal((n, 3)))[0].T.astype(np.float32)
    context = TrainingContext(
        scanned.manifest,
        scanned.class_index,
        network,
        DataParams(**params["data"]),
        RuntimeParams(**params["runtime"]),
        DistributedParams(**params["distributed"]),
    )
    with pytest.raises(LossScaleOverflowError) as error:
        train_stage2(context, start, pca, DimReduceParams(**params["dim_reduce"]).stage2)
    message = str(error.value)
    assert "scaled by the fixed loss scale 3.3e+38 overflowed at epoch 2, step 1/" in message
    assert "dim_reduce.stage2.loss_scale" in message
    assert not list((tmp_path / "epochs").glob("*.ckpt"))
