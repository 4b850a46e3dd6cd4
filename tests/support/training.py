"""Small real trainings for the engine tests: a tree, its manifest, a network, a Momentum step."""

from __future__ import annotations

from pathlib import Path

import numpy as np

from trainlib.models.loss import CrossEntropySmooth
from trainlib.models.resnet import create_resnet
from trainlib.optim.momentum import create_momentum

CLASSES = 3  # classes of the engine tests' generated trees


def build(seed: int, lr_per_step: np.ndarray, loss_scale: float = 8.0):
    """resnet_narrow, Momentum with group params and a fixed loss scale, as the baseline pipeline wires them."""
    import mindspore as ms
    from mindspore import nn

    ms.set_seed(seed)
    net = create_resnet("resnet_narrow", CLASSES)
    optimizer = create_momentum(net, lr_per_step, 0.9, 1e-4, loss_scale)
    step = nn.TrainOneStepCell(nn.WithLossCell(net, CrossEntropySmooth(CLASSES, 0.1)), optimizer, sens=loss_scale)
    step.set_train(True)
    return net, optimizer, step


class GivenSteps:
    """A ``StepFactory`` for the engine's tests: steps from ``make(start, steps_per_epoch)``, evaluations by
    ``scores(step, dataset)`` (default: top-1/top-5 of the step's network on the dataset)."""

    def __init__(self, make, scores=None):
        self.make, self.scores = make, scores

    def make_step(self, start, steps_per_epoch: int):
        return self.make(start, steps_per_epoch)

    def evaluate(self, step, dataset) -> dict[str, float]:
        if self.scores is not None:
            return self.scores(step, dataset)
        from trainlib.engine.evaluation import evaluate

        return evaluate(step.network, dataset)


def write_epoch(folder, epoch: int, fingerprint: str) -> None:
    """A periodic checkpoint ``epoch_<NNNN>.ckpt`` of a training of ``fingerprint`` in ``folder``, holding one
    weight: what the resume and clean-up tests pick among."""
    from trainlib.engine.checkpoint import Checkpoint, save_checkpoint

    save_checkpoint(
        Checkpoint({"w": np.zeros(2, np.float32)}, {"epoch": epoch, "fingerprint": fingerprint}),
        Path(folder) / f"epoch_{epoch:04d}.ckpt",
    )


def compile_lines(caplog) -> list[str]:
    """The engine's "Compiling …" log lines a test captured, in order."""
    return [r.getMessage() for r in caplog.records if r.getMessage().startswith("Compiling ")]
