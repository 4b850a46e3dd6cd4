"""A training whose network holds more than 2 GB of float32 parameters, as its own process, so a test can kill it:
``python large_checkpoint_job.py WORK [--hold]``.

One ``nn.Dense(SIDE, SIDE)`` (23,200 x 23,200 float32: 2.15 GB, past protobuf's 2 GB) trained by the engine's
``train`` for ``EPOCHS`` epochs of one step each, on one fixed batch, with checkpoints every epoch in
``WORK/epochs``. The optimizer is plain gradient descent in place (``ApplyGradientDescent``): its only state is the
step count, so the process holds the weights, their gradient and captured copies (about 9 GB at its peak).
Prints JSON lines on stdout: ``{"event": "started", "epoch": e, ...}`` at the start of each epoch ``e`` (1-based)
with a digest of the weights then (a float64 sum and a few values) and the optimizer's step count, and at the end
``{"event": "finished", ...}`` with the final state's digest and the process's peak resident memory; the final
state is saved to ``WORK/final.ckpt`` (as the catalog saves it). With ``--hold`` it waits, after printing the
start of epoch 2 (so after the checkpoint of epoch 1 is on disk), for the test to kill it.
"""

from __future__ import annotations

# isort: off
import pipelines  # noqa: F401  (sets ONEDNN_MAX_CPU_ISA before MindSpore loads)

# isort: on
import json
import logging
import sys
import time
from pathlib import Path

import numpy as np

SIDE = 23_200
EPOCHS = 2
BATCH = 2
LR = 0.5


def digest(weight: np.ndarray, global_step) -> dict:
    return {
        "weight_sum": float(weight.sum(dtype=np.float64)),
        "weight_corner": [float(v) for v in weight[0, :4]],
        "global_step": int(np.asarray(global_step).reshape(-1)[0]),
    }


def peak_rss_gb() -> float:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) * 1024 / 1e9
    return float("nan")


def emit(event: str, **fields) -> None:
    print(json.dumps({"event": event, **fields}), flush=True)


def main(work: Path, hold: bool) -> None:
    import mindspore.dataset as ds
    from mindspore import nn, ops

    from trainlib.engine.callbacks import Callback
    from trainlib.engine.checkpoint import save_checkpoint
    from trainlib.engine.epochs import TrainingSpec
    from trainlib.engine.loop import Checkpointing, train
    from trainlib.engine.runtime import configure_mindspore
    from trainlib.engine.state import restore_state
    from trainlib.engine.step import TrainStep

    logging.basicConfig(level=logging.INFO, stream=sys.stderr, format="%(name)s: %(message)s")
    configure_mindspore("CPU", "graph", 0)

    descend = ops.MultitypeFuncGraph("descend")

    @descend.register("Function", "Tensor", "Tensor", "Tensor")
    def _(apply, lr, param, gradient):
        return apply(param, lr, gradient)

    class GradientDescent(nn.Optimizer):
        """``w -= lr * g`` in place; no state but the step count."""

        def __init__(self, params, learning_rate):
            super().__init__(learning_rate, params)
            self.apply = ops.ApplyGradientDescent()

        def construct(self, gradients):
            lr = self.get_lr()
            self.assignadd(self.global_step, self.global_step_increase_tensor)
            return self.hyper_map(ops.partial(descend, self.apply, lr), self._parameters, gradients)

    class Report(Callback):
        def bind(self, step):
            self.step = step

        def on_epoch_begin(self, epoch):
            net, optimizer = self.step.network, self.step.optimizer
            emit("started", epoch=epoch + 1, **digest(net.weight.asnumpy(), optimizer.global_step.asnumpy()))
            if hold and epoch == 1:  # epoch 1's checkpoint is written: wait to be killed
                time.sleep(3600)

    class Steps:  # the engine's StepFactory: a Dense layer under plain gradient descent, never evaluated
        def make_step(self, start, steps_per_epoch):
            net = nn.Dense(SIDE, SIDE, weight_init="zeros", bias_init="zeros")
            if start is not None:
                restore_state(net, start)
            optimizer = GradientDescent(net.trainable_params(), LR)
            cell = nn.TrainOneStepCell(nn.WithLossCell(net, nn.MSELoss()), optimizer)
            cell.set_train(True)
            return TrainStep(cell, net, optimizer, np.full(EPOCHS * steps_per_epoch, LR, np.float32))

        def evaluate(self, step, dataset):
            raise AssertionError("no validation data is given")

    rng = np.random.default_rng(0)
    inputs = rng.standard_normal((BATCH, SIDE)).astype(np.float32)
    targets = rng.standard_normal((BATCH, SIDE)).astype(np.float32)
    dataset = ds.NumpySlicesDataset((inputs, targets), ["x", "y"], shuffle=False).batch(BATCH)
    spec = TrainingSpec(epochs=EPOCHS, batch_size=BATCH, examples_per_step=BATCH, data_seed=0)
    result = train(
        spec,
        dataset,
        Steps(),
        fingerprint=f"large-dense-{SIDE}",
        checkpoints=Checkpointing(work / "epochs", every_epochs=1, keep_last=1),
        callbacks=[Report()],
    )
    final = result.checkpoint
    save_checkpoint(final, work / "final.ckpt")
    state = digest(final.params["weight"], final.params["optimizer.global_step"])
    emit("finished", epoch=final.metadata["epoch"], peak_rss_gb=peak_rss_gb(), **state)


if __name__ == "__main__":
    main(Path(sys.argv[1]), "--hold" in sys.argv[2:])
