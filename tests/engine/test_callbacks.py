"""The engine's callbacks and announcements: the dispatcher's order, the periodic checkpoint writer, the history
table, and the "Compiling …" lines (one per compiled object; THOR's two graphs)."""

from __future__ import annotations

import numpy as np

from tests.support.training import GivenSteps, compile_lines
from trainlib.engine.callbacks import Callback, CallbackList, PeriodicCheckpoint
from trainlib.engine.checkpoint import Checkpoint
from trainlib.engine.epochs import TrainingSpec
from trainlib.engine.loop import train
from trainlib.engine.progress import announce_compile
from trainlib.metrics import EPOCH_KEYS, TIMESTAMP_KEY, history_table


def test_history_table_has_epoch_then_the_metric_keys():
    rows = [
        {"epoch": 1, "train/loss": 2.0, "train/lr": 0.1, "train/images_per_s": 9.0, "train/epoch_time_s": 1.0,
         "train/compile_s": 3.0, TIMESTAMP_KEY: 100.0},
        {"epoch": 2, "train/loss": 1.0, "train/lr": 0.05, "train/images_per_s": 9.0, "train/epoch_time_s": 1.0,
         "train/compile_s": 0.0, "val/top1": 0.5, "val/top5": 1.0, TIMESTAMP_KEY: 101.0},
    ]  # fmt: skip
    table = history_table(rows)
    assert list(table.columns) == ["epoch", *EPOCH_KEYS]
    assert list(table["epoch"]) == [1, 2] and np.isnan(table["val/top1"][0])
    assert list(history_table([]).columns) == ["epoch", *EPOCH_KEYS]


def test_periodic_checkpoint_every_n_epochs_with_prefix(tmp_path):
    saved = []

    def capture(epoch: int) -> Checkpoint:
        saved.append(epoch)
        return Checkpoint({"w": np.zeros(1, np.float32)}, {"epoch": epoch})

    saver = PeriodicCheckpoint(capture, tmp_path, every_epochs=2, keep_last=3, prefix="stage1")
    (tmp_path / "other_0001.ckpt").write_bytes(b"not ours")  # another prefix is left alone
    for epoch in range(9):
        saver.on_epoch_end(epoch, {})
    assert saved == [2, 4, 6, 8]
    assert sorted(p.name for p in tmp_path.iterdir()) == [
        "other_0001.ckpt",
        "stage1_0004.ckpt",
        "stage1_0006.ckpt",
        "stage1_0008.ckpt",
    ]


def test_thor_announces_its_two_compiled_steps_once_each(caplog):
    """The epoch loop announces each graph the step names (``next_graph``) before its first call, and times the steps
    that compiled apart; THOR's second-order and reusing steps are two graphs."""
    import mindspore.dataset as ds

    from tests.support.thor import TinyNet, batch, make_thor
    from trainlib.recipes.thor import TrainlibThorStep

    step = TrainlibThorStep(make_thor(TinyNet(), steps=5, frequency=2))
    images, labels = zip(*(batch(index) for index in range(5)), strict=True)  # second-order 1, 3, 5; reusing 2, 4
    dataset = ds.NumpySlicesDataset((np.concatenate(images), np.concatenate(labels)), shuffle=False)
    dataset = dataset.batch(len(labels[0]))
    spec = TrainingSpec(epochs=1, batch_size=len(labels[0]), examples_per_step=len(labels[0]))
    with caplog.at_level("INFO", logger="trainlib.engine"):
        result = train(spec, dataset, GivenSteps(lambda start, steps_per_epoch: step))
    assert compile_lines(caplog) == [
        "Compiling the training graph (THOR, second-order step)…",
        "Compiling the training graph (THOR, step reusing the inverses)…",
    ]
    assert result.history[0]["train/compile_s"] > 0
    assert step.title == "THOR"


def test_callbacks_are_called_in_their_order_through_one_dispatcher():
    calls = []

    class Named(Callback):
        def __init__(self, name, figures):
            self.name, self.figures = name, figures

        def on_epoch_begin(self, epoch):
            calls.append((self.name, epoch))

        def epoch_metrics(self, epoch):
            return self.figures

    callbacks = CallbackList([Named("a", {"x": 1.0, "y": 1.0}), Named("b", {"y": 2.0})])
    callbacks.on_epoch_begin(3)
    assert calls == [("a", 3), ("b", 3)]
    assert callbacks.epoch_metrics(3) == {"x": 1.0, "y": 2.0}  # the later callback's figure wins


def test_a_compile_is_announced_once_per_object_compiled(mindspore_cpu, caplog):
    """The mark lives with what is compiled: the same cell is announced once whoever asks, a new one again."""
    from mindspore import nn

    first, second = nn.Dense(1, 1), nn.Dense(1, 1)
    with caplog.at_level("INFO", logger="trainlib.engine"):
        announced = [announce_compile(first), announce_compile(first), announce_compile(second)]
    assert announced == [True, False, True]
    assert compile_lines(caplog) == ["Compiling the training graph…"] * 2
