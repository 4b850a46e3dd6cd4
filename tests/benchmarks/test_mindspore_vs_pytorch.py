"""benchmarks/mindspore_vs_pytorch.py compares like with like: the PyTorch network is ours, layer for layer."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch", reason="the migrate extra (PyTorch) is not installed")

from benchmarks.mindspore_vs_pytorch import apply_settings, torch_network  # noqa: E402
from trainlib.models.resnet import count_parameters, create_resnet  # noqa: E402


@pytest.mark.parametrize("name", ["resnet_narrow", "resnet18"])
def test_the_torch_network_has_our_trainable_parameters(name):
    ours = create_resnet(name, 10)
    theirs = torch_network(name, 10)
    assert sum(p.numel() for p in theirs.parameters()) == count_parameters(ours)
    # the same layers in the same order: the shapes of the convolutions and the dense layer, one by one
    our_shapes = [tuple(p.shape) for p in ours.trainable_params() if len(p.shape) > 1]
    their_shapes = [tuple(p.shape) for p in theirs.parameters() if p.ndim > 1]
    assert sorted(our_shapes) == sorted(their_shapes)
    assert theirs(torch.zeros(2, 3, 32, 32)).shape == (2, 10)


def test_an_unknown_setting_is_refused():
    with pytest.raises(ValueError, match="unknown setting 'no_such'"):
        apply_settings({"no_such": "1"})


def test_the_mindspore_pass_trains_through_the_projects_loop(mindspore_cpu):
    """The benchmark's MindSpore side runs the engine's loop (a step factory, as every recipe hands it): one
    warm-up and one timed pass of two batches, the weights moved by both."""
    import mindspore.dataset as ds
    import numpy as np

    from benchmarks.mindspore_vs_pytorch import MindSporeTrainer, alternate

    rng = np.random.default_rng(0)
    images = rng.standard_normal((16, 3, 32, 32), dtype=np.float32)
    labels = rng.integers(0, 10, 16).astype(np.int32)
    data = ds.NumpySlicesDataset({"image": images, "label": labels}, shuffle=False).batch(8)
    trainer = MindSporeTrainer("resnet_narrow", 10, data, passes=2)
    before = trainer.net.trainable_params()[0].asnumpy().copy()
    rates = alternate({"mindspore": trainer}, len(images), repeats=1)
    assert len(rates["mindspore"]) == 1 and rates["mindspore"][0] > 0
    assert not np.array_equal(trainer.net.trainable_params()[0].asnumpy(), before)
