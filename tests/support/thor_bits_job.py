"""A 3-step THOR training as a process of its own, for the test that THOR's weights with float64 statistics are the
same bits whatever oneDNN's thread split (``tests/e2e/test_thor_statistics_dtype.py``): MindSpore sizes its thread
pools once, when it loads, so each split needs its own process.

    python -m tests.support.thor_bits_job OUT.npz STATISTICS_DTYPE [--first-order] [--compute-method eigen]

resnet_narrow (the default study's network) on 32 x 32 images of a fixed random batch of 64 (the default study's
statistics: the stem's A is 65,536 im2col rows of 27), THOR's settings of the default recipe with frequency 2
(second-order, reuse, second-order step); writes every trainable weight to OUT.npz. ``--first-order``: THOR's recipe
without the preconditioner (``thor.precondition: false``), the control that shows what the split does to the
network's own operators."""

from __future__ import annotations

import argparse

import mindspore as ms
import numpy as np
from mindspore import nn

from trainlib.models.loss import CrossEntropySmooth
from trainlib.models.resnet import create_resnet
from trainlib.optim.thor.step import create_thor_step
from trainlib.params import ThorSettings

STEPS = 3
BATCH, SIZE, CLASSES = 64, 32, 10


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("out")
    parser.add_argument("statistics_dtype")
    parser.add_argument("--first-order", action="store_true")
    parser.add_argument("--compute-method", default="inverse")
    args = parser.parse_args()
    ms.set_context(mode=ms.GRAPH_MODE, device_target="CPU")
    ms.set_seed(0)
    net = create_resnet("resnet_narrow", CLASSES, zero_init_last_bn_gamma=True)
    step = create_thor_step(
        net,
        nn.WithLossCell(net, CrossEntropySmooth(CLASSES, 0.1)),
        np.full(STEPS, 0.1, np.float32),
        np.full(STEPS, 0.03, np.float32),
        ThorSettings(
            momentum=0.9,
            weight_decay=5e-4,
            loss_scale=128.0,
            frequency=2,
            block_size=None,
            statistics_dtype=args.statistics_dtype,
            compute_method=args.compute_method,
        ),
        rank_size=1,
        precondition=not args.first_order,
    )
    rng = np.random.default_rng(0)
    images = ms.Tensor(np.maximum(rng.standard_normal((BATCH, 3, SIZE, SIZE)), -1.0).astype(np.float32))
    labels = ms.Tensor(rng.integers(0, CLASSES, BATCH).astype(np.int32))
    for _ in range(STEPS):
        step(images, labels).asnumpy()
    np.savez(args.out, **{p.name: p.asnumpy() for p in net.trainable_params()})


if __name__ == "__main__":
    main()
