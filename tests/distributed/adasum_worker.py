"""Worker launched by ``msrun`` from tests/test_adasum.py; writes its results as .npy under OUT_DIR.

Usage: ``python adasum_worker.py vectors INPUT.npz OUT_DIR [EXCHANGE]`` combines, per key of the
npz (arrays shaped ``(ranks, ...)``), this rank's row with ``Adasum`` and saves
``rank<r>_<key>.npy``. ``python adasum_worker.py train OUT_DIR`` trains resnet_narrow for a few
steps with ``AdasumTrainStep`` on rank-specific random batches and saves, for the last step, the
weights before it, this rank's own Momentum delta and the weights and BatchNorm statistics after it.
"""

from __future__ import annotations

import sys
from pathlib import Path

# isort: off
import pipelines  # noqa: F401  (sets ONEDNN_MAX_CPU_ISA before MindSpore loads)

# isort: on
import mindspore as ms
import numpy as np
from mindspore import Tensor, nn, ops
from mindspore.communication import get_group_size, get_rank, init

from trainlib.engine.runtime import configure_mindspore
from trainlib.models.resnet import create_resnet
from trainlib.optim.adasum.combine import Adasum
from trainlib.optim.adasum.step import AdasumTrainStep, batchnorm_statistics

LR, MOMENTUM, LOSS_SCALE, STEPS = 0.05, 0.9, 1024.0, 3


def combine_vectors(inputs: Path, out: Path, exchange: str | None) -> None:
    rank, size = get_rank(), get_group_size()
    arrays = dict(np.load(inputs))
    keys = sorted(arrays)
    cell = Adasum([arrays[k].shape[1:] for k in keys], rank, size, exchange)
    combined = cell(tuple(Tensor(arrays[k][rank]) for k in keys))
    for key, value in zip(keys, combined, strict=True):
        np.save(out / f"rank{rank}_{key}.npy", value.asnumpy())


def train(out: Path) -> None:
    rank = get_rank()
    net = create_resnet("resnet_narrow", 3)
    loss_fn = nn.SoftmaxCrossEntropyWithLogits(sparse=True, reduction="mean")
    with_loss = nn.WithLossCell(net, loss_fn)
    optimizer = nn.Momentum(net.trainable_params(), LR, MOMENTUM, loss_scale=LOSS_SCALE)
    step = AdasumTrainStep(with_loss, optimizer, sens=LOSS_SCALE)
    step.set_train(True)
    grad = ops.GradOperation(get_by_list=True)(with_loss, optimizer.parameters)
    data = np.random.default_rng(100 + rank)
    weights = optimizer.parameters
    for i in range(STEPS):
        images = Tensor(data.normal(size=(4, 3, 8, 8)).astype(np.float32))
        labels = Tensor(data.integers(0, 3, size=4).astype(np.int32))
        if i == STEPS - 1:
            # This rank's own Momentum step from the same weights: v = m v + g, w -= lr v.
            before = [w.asnumpy().copy() for w in weights]
            grads = [g.asnumpy() for g in grad(images, labels)]
            moments = [m.asnumpy() for m in optimizer.moments]
            delta = [-LR * (MOMENTUM * m + g) for m, g in zip(moments, grads, strict=True)]
            np.savez(out / f"rank{rank}_before.npz", *before)
            np.savez(out / f"rank{rank}_delta.npz", *delta)
        loss = step(images, labels)
        if not np.isfinite(loss.asnumpy()):
            raise FloatingPointError(f"rank {rank}: loss {loss} at step {i}")
    np.savez(out / f"rank{rank}_after.npz", *[w.asnumpy() for w in weights])
    np.savez(out / f"rank{rank}_stats.npz", *[s.asnumpy() for s in batchnorm_statistics(net)])


def main(argv: list[str]) -> None:
    configure_mindspore("CPU", "graph", 0)
    init()
    if argv[0] == "vectors":
        combine_vectors(Path(argv[1]), Path(argv[2]), argv[3] if len(argv) > 3 else None)
    elif argv[0] == "train":
        train(Path(argv[1]))
    else:
        raise SystemExit(f"unknown mode {argv[0]!r}; use 'vectors' or 'train'")
    ms.runtime.synchronize()


if __name__ == "__main__":
    main(sys.argv[1:])
