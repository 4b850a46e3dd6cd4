"""The training engine: ``train``'s epochs, rows, evaluation, non-finite-loss check, periodic checkpoints,
resume, callbacks and compile announcements (the state and the choice of a resume checkpoint:
``test_state_and_resume``)."""

from __future__ import annotations

import math

import numpy as np
import pytest

from tests.support.training import CLASSES, GivenSteps, build, compile_lines, write_epoch
from trainlib.data.folder import create_dataset, scan_image_tree
from trainlib.engine.callbacks import Callback, PeriodicCheckpoint
from trainlib.engine.checkpoint import OPTIMIZER_PREFIX, Checkpoint, load_checkpoint, save_checkpoint
from trainlib.engine.epochs import NonFiniteLossError, TrainingSpec
from trainlib.engine.evaluation import evaluate
from trainlib.engine.loop import Checkpointing, train
from trainlib.engine.model_bridge import ModelTrainStep
from trainlib.engine.resume import fingerprint, remove_finished_checkpoints
from trainlib.engine.state import capture_state, history_of, restore_state
from trainlib.engine.step import TrainStep
from trainlib.metrics import TIMESTAMP_KEY
from trainlib.models.loss import CrossEntropySmooth
from trainlib.optim.schedules import warmup_schedule

BATCH, EPOCHS, IMAGE_SIZE = 4, 2, 12
STEPS_PER_EPOCH = (CLASSES * 6) // BATCH  # 18 train images -> 4 full batches


@pytest.fixture(scope="module")
def manifest(tmp_path_factory):
    from tests.support.trees import write_image_tree

    root = write_image_tree(tmp_path_factory.mktemp("tree"), classes=("a", "b", "c"), per_class={"train": 6, "val": 2})
    return scan_image_tree(root, {"train": "train", "val": "val"}).manifest


@pytest.fixture
def train_data(manifest):
    return create_dataset(manifest, "train", IMAGE_SIZE, BATCH, training=True, num_workers=1)


@pytest.fixture
def val_data(manifest):
    return create_dataset(manifest, "val", IMAGE_SIZE, BATCH, training=False, num_workers=1)


def lr_schedule() -> np.ndarray:
    return warmup_schedule("linear", 0.01, 0.1, 0.0, 1, EPOCHS, STEPS_PER_EPOCH)


class Recorder(Callback):
    def __init__(self):
        self.events = []
        self.step_losses: dict[int, list[float]] = {}

    def on_train_begin(self, total_epochs, steps_per_epoch, start_epoch):
        self.events.append(("train_begin", total_epochs, steps_per_epoch, start_epoch))

    def on_epoch_begin(self, epoch):
        self.events.append(("epoch_begin", epoch))

    def on_step_end(self, epoch, step, loss):
        self.step_losses.setdefault(epoch, []).append(loss)
        self.events.append(("step", epoch, step))

    def on_epoch_end(self, epoch, metrics):
        self.events.append(("epoch_end", epoch, dict(metrics)))

    def on_train_end(self):
        self.events.append(("train_end",))


def constant_step(value: float = 1.0, nan_at: tuple[int, int] | None = None, bad: float = math.nan):
    """A train step (any callable ``(images, labels) -> tensor``) with a scripted loss."""
    import mindspore as ms

    calls = {"n": 0}

    def step(images, labels):
        epoch, index = divmod(calls["n"], STEPS_PER_EPOCH)
        calls["n"] += 1
        loss = bad if nan_at == (epoch + 1, index + 1) else value
        return ms.Tensor(np.float32(loss))

    return step


def fit(
    step,
    dataset,
    epochs: int,
    lr_per_step: np.ndarray | None = None,
    callbacks=(),
    evaluate=None,
    eval_interval: int = 0,
    start_epoch: int = 0,
) -> list[dict]:
    """``train`` around a step built beforehand (a plain callable, or a ``TrainStep``); returns the rows."""
    from mindspore import nn

    # a scripted step trains nothing; a one-weight network stands in for what the final state holds
    ready = step if isinstance(step, TrainStep) else TrainStep(step, nn.Dense(1, 1), lr_per_step=lr_per_step)
    spec = TrainingSpec(epochs=epochs, batch_size=BATCH, examples_per_step=BATCH, eval_interval=eval_interval)
    result = train(
        spec,
        dataset,
        GivenSteps(lambda start, steps_per_epoch: ready, scores=lambda step, data: evaluate()),
        start=Checkpoint({}, {"epoch": start_epoch}),
        continue_from_start=start_epoch > 0,
        validation=None if evaluate is None else dataset,  # the scores ignore it
        callbacks=callbacks,
    )
    return result.history


def test_train_trains_and_reports_one_row_per_epoch(train_data, val_data):
    lr_per_step = lr_schedule()
    net, optimizer, cell = build(0, lr_per_step)
    before = {p.name: p.asnumpy().copy() for p in net.trainable_params()}
    recorder = Recorder()
    evaluations = []

    def evaluate_now():
        evaluations.append(evaluate(net, val_data))
        return evaluations[-1]

    step = TrainStep(cell, net, optimizer, lr_per_step)
    history = fit(step, train_data, EPOCHS, callbacks=[recorder], evaluate=evaluate_now)

    assert [row["epoch"] for row in history] == [1, 2]
    for epoch, row in enumerate(history):
        assert {"train/loss", "train/lr", "train/epoch_time_s", "train/images_per_s", TIMESTAMP_KEY} <= row.keys()
        assert math.isfinite(row["train/loss"]) and row["train/loss"] > 0
        assert row["train/lr"] == pytest.approx(float(lr_per_step[(epoch + 1) * STEPS_PER_EPOCH - 1]))
        assert row["train/epoch_time_s"] > 0
        assert row["train/images_per_s"] == pytest.approx(STEPS_PER_EPOCH * BATCH / row["train/epoch_time_s"])
        # the epoch loss is the mean of that epoch's step losses
        assert row["train/loss"] == pytest.approx(np.mean(recorder.step_losses[epoch]), rel=1e-6)
    assert history[0][TIMESTAMP_KEY] <= history[1][TIMESTAMP_KEY]
    # evaluation ran after the last epoch only (eval_interval 0)
    assert "val/top1" not in history[0]
    assert 0.0 <= history[1]["val/top1"] <= 1.0
    assert evaluations[0]["images"] == 6.0  # every val image
    assert history[1]["val/top5"] == 1.0  # 3 classes: the true class is always in the top 5

    # callbacks saw the whole run, in order
    assert recorder.events[0] == ("train_begin", EPOCHS, STEPS_PER_EPOCH, 0)
    assert recorder.events[-1] == ("train_end",)
    steps = [event[1:] for event in recorder.events if event[0] == "step"]
    assert steps == [(e, s) for e in range(EPOCHS) for s in range(STEPS_PER_EPOCH)]
    assert [event[2] for event in recorder.events if event[0] == "epoch_end"] == history

    # the weights moved
    after = {p.name: p.asnumpy() for p in net.trainable_params()}
    assert any(not np.array_equal(before[name], after[name]) for name in before)


def test_train_evaluates_every_eval_interval_and_after_the_last_epoch(train_data):
    calls = []

    def fake_eval():
        calls.append(1)
        return {"top1": 0.5, "top5": 1.0}

    history = fit(
        constant_step(),
        train_data,
        5,
        np.ones(5 * STEPS_PER_EPOCH, np.float32),
        evaluate=fake_eval,
        eval_interval=2,
    )
    assert ["val/top1" in row for row in history] == [False, True, False, True, True]
    assert len(calls) == 3


def test_train_continues_from_the_start_checkpoints_epoch(train_data):
    recorder = Recorder()
    history = fit(constant_step(2.0), train_data, 3, np.arange(12, dtype=np.float32), [recorder], start_epoch=1)
    assert [row["epoch"] for row in history] == [2, 3]
    assert [row["train/lr"] for row in history] == [7.0, 11.0]
    assert [row["train/loss"] for row in history] == [2.0, 2.0]
    assert recorder.events[0] == ("train_begin", 3, STEPS_PER_EPOCH, 1)


def test_callbacks_add_their_own_figures_to_the_row_before_anyone_sees_it(train_data):
    class Figures(Callback):
        def epoch_metrics(self, epoch):
            return {"thor/damping": 0.5 + epoch}

    recorder = Recorder()
    history = fit(constant_step(), train_data, 2, None, [recorder, Figures()])
    assert [row["thor/damping"] for row in history] == [0.5, 1.5]
    assert all("train/lr" not in row for row in history)  # a step without a schedule reports no lr
    assert [event[2]["thor/damping"] for event in recorder.events if event[0] == "epoch_end"] == [0.5, 1.5]


def test_start_after_stop_or_beyond_the_schedule_is_refused(train_data):
    with pytest.raises(ValueError, match=r"start 3 <= stop 2 <= schedule length 2"):
        fit(constant_step(), train_data, 2, start_epoch=3)
    spec = TrainingSpec(epochs=4, batch_size=BATCH, examples_per_step=BATCH, schedule_epochs=3)
    with pytest.raises(ValueError, match=r"start 0 <= stop 4 <= schedule length 3"):
        train(spec, train_data, GivenSteps(lambda start, steps: TrainStep(constant_step(), None)))


@pytest.mark.parametrize("bad", [math.nan, math.inf, -math.inf])
def test_non_finite_loss_stops_training_naming_epoch_and_step(tmp_path, train_data, bad):
    recorder = Recorder()
    saver = PeriodicCheckpoint(
        lambda epoch: Checkpoint({"w": np.full(2, epoch, np.float32)}, {"epoch": epoch}), tmp_path, keep_last=5
    )
    step = constant_step(nan_at=(2, 3), bad=bad)
    with pytest.raises(NonFiniteLossError) as error:
        fit(step, train_data, 3, np.ones(3 * STEPS_PER_EPOCH, np.float32), [recorder, saver])
    message = str(error.value)
    assert f"epoch 2, step 3/{STEPS_PER_EPOCH}" in message
    assert str(bad) in message
    assert isinstance(error.value, FloatingPointError)
    # the steps before the bad one ran, the rest did not; callbacks were closed
    assert len(recorder.step_losses[1]) == 2
    assert recorder.events[-1] == ("train_end",)
    # the last good checkpoint (end of epoch 1) is on disk
    assert sorted(p.name for p in tmp_path.iterdir()) == ["epoch_0001.ckpt"]
    assert load_checkpoint(tmp_path / "epoch_0001.ckpt").metadata == {"epoch": 1}


def test_non_finite_loss_of_a_real_network_is_caught(train_data):
    lr_per_step = np.full(EPOCHS * STEPS_PER_EPOCH, 1e30, np.float32)  # blows the weights up at once
    net, optimizer, cell = build(0, lr_per_step, loss_scale=1.0)
    with pytest.raises(NonFiniteLossError, match=r"at epoch 1, step \d+/4"):
        fit(TrainStep(cell, net, optimizer, lr_per_step), train_data, EPOCHS)


def test_periodic_checkpoint_keeps_only_the_newest(tmp_path, train_data):
    def capture(epoch: int) -> Checkpoint:
        return Checkpoint({"w": np.full(3, epoch, np.float32)}, {"epoch": epoch})

    saver = PeriodicCheckpoint(capture, tmp_path / "ckpt", every_epochs=1, keep_last=2)
    fit(constant_step(), train_data, 5, np.ones(5 * STEPS_PER_EPOCH, np.float32), [saver])
    assert sorted(p.name for p in (tmp_path / "ckpt").iterdir()) == ["epoch_0004.ckpt", "epoch_0005.ckpt"]
    newest = load_checkpoint(tmp_path / "ckpt" / "epoch_0005.ckpt")
    assert newest.metadata == {"epoch": 5}
    np.testing.assert_array_equal(newest.params["w"], 5.0)


class StopAt(Callback):
    """Stands for a kill: raises at the start of epoch ``epoch`` (0-based), after the checkpoints before it."""

    def __init__(self, epoch: int):
        self.epoch = epoch

    def on_epoch_begin(self, epoch):
        if epoch == self.epoch:
            raise KeyboardInterrupt


class Resumed(Callback):
    def __init__(self):
        self.resumed = []

    def on_resume(self, source, history):
        self.resumed.append((source, [row["epoch"] for row in history]))


def momentum_training(tmp_path, train_data, val_data, callbacks=(), epochs: int = 3):
    """A real resnet_narrow Momentum training through ``train``, with checkpoints in ``tmp_path``."""
    start = capture_state(build(0, lr_schedule())[0], None, {"epoch": 0})

    def make_step(start_checkpoint, steps_per_epoch):
        lr_per_step = warmup_schedule("linear", 0.01, 0.1, 0.0, 1, epochs, steps_per_epoch)
        net, optimizer, cell = build(1, lr_per_step)
        restore_state(net, start_checkpoint)
        return TrainStep(cell, net, optimizer, lr_per_step)

    spec = TrainingSpec(epochs=epochs, batch_size=BATCH, examples_per_step=BATCH, eval_interval=1, data_seed=7)
    return train(
        spec,
        train_data,
        GivenSteps(make_step),
        start=start,
        fingerprint=fingerprint("momentum", epochs, start),
        checkpoints=Checkpointing(tmp_path, every_epochs=1, keep_last=2),
        validation=val_data,
        callbacks=callbacks,
        metadata={"network": "resnet_narrow"},
    )


def test_an_interrupted_training_resumes_with_its_state_and_history(tmp_path, train_data, val_data):
    straight = momentum_training(tmp_path / "straight", train_data, val_data)
    with pytest.raises(KeyboardInterrupt):
        momentum_training(tmp_path / "killed", train_data, val_data, [StopAt(2)])
    assert sorted(p.name for p in (tmp_path / "killed").iterdir()) == ["epoch_0001.ckpt", "epoch_0002.ckpt"]
    saved = load_checkpoint(tmp_path / "killed" / "epoch_0002.ckpt")
    assert saved.metadata["network"] == "resnet_narrow" and saved.metadata["epoch"] == 2
    assert [row["epoch"] for row in history_of(saved)] == [1, 2]
    assert any(name.startswith(OPTIMIZER_PREFIX + "moments.") for name in saved.params)

    recorder, resumed = Recorder(), Resumed()
    result = momentum_training(tmp_path / "killed", train_data, val_data, [recorder, resumed])
    assert resumed.resumed == [(tmp_path / "killed" / "epoch_0002.ckpt", [1, 2])]
    assert recorder.events[0] == ("train_begin", 3, STEPS_PER_EPOCH, 2)  # only epoch 3 ran again
    # the history holds every epoch; the resumed epochs' figures equal the uninterrupted run's
    assert [row["epoch"] for row in result.history] == [1, 2, 3]
    for resumed_row, straight_row in zip(result.history, straight.history, strict=True):
        for key in ("train/loss", "train/lr", "val/top1", "val/top5"):
            assert resumed_row[key] == pytest.approx(straight_row[key], rel=1e-4, abs=1e-5), key
    assert result.checkpoint.metadata["epoch"] == 3
    assert [row["epoch"] for row in history_of(result.checkpoint)] == [1, 2, 3]
    for name, value in straight.checkpoint.params.items():
        np.testing.assert_allclose(result.checkpoint.params[name], value, rtol=1e-4, atol=1e-5, err_msg=name)


def test_a_released_training_frees_its_network_and_its_graphs(tmp_path, train_data, val_data):
    # MindSpore keeps a cell whose construct takes *args (TrainOneStepCell) once it ran in GRAPH mode, and its graphs:
    # a study's process grew by a network, an optimizer and their graphs each training
    import gc
    import weakref

    from mindspore.graph.api import _cell_graph_executor

    result = momentum_training(tmp_path, train_data, val_data, epochs=1)
    network, optimizer = weakref.ref(result.step.network), weakref.ref(result.step.optimizer)
    phases = set(result.step.run.compile_cache) | set(result.step.network.compile_cache)  # training, evaluation
    assert {phase.split(".")[0] for phase in phases} == {"train", "predict"}
    assert all(_cell_graph_executor.has_compiled(phase) for phase in phases)
    result.release()
    gc.collect()
    assert result.step is None and network() is None and optimizer() is None
    assert not any(_cell_graph_executor.has_compiled(phase) for phase in phases)
    assert result.history and result.checkpoint.params  # what the caller keeps of the training


def model_step(start_checkpoint, steps_per_epoch: int, epochs: int, poison: bool = False) -> ModelTrainStep:
    """The Momentum network of ``build`` trained by ``mindspore.Model.train`` (as MindSpore's THOR is)."""
    import mindspore as ms
    from mindspore.train import FixedLossScaleManager, Model

    lr_per_step = warmup_schedule("linear", 0.01, 0.1, 0.0, 1, epochs, steps_per_epoch)
    net, optimizer, _ = build(1, lr_per_step)
    restore_state(net, start_checkpoint)
    if poison:
        net.fc.weight.set_data(ms.Tensor(np.full(net.fc.weight.shape, np.nan, np.float32)))
    scaling = FixedLossScaleManager(8.0, drop_overflow_update=False)  # build's optimizer divides by 8

    def model():
        return Model(net, CrossEntropySmooth(CLASSES, 0.1), optimizer, loss_scale_manager=scaling)

    return ModelTrainStep(model, net, optimizer, lr_per_step, 8.0, sink_mode=False)


def test_model_train_steps_give_the_same_rows_callbacks_checkpoints_and_resume(tmp_path, manifest, val_data):
    start = capture_state(build(0, lr_schedule())[0], None, {"epoch": 0})
    spec = TrainingSpec(epochs=3, batch_size=BATCH, examples_per_step=BATCH, eval_interval=2, data_seed=7)

    def run(*callbacks):
        return train(
            spec,
            # Model.train refuses a dataset another Model trained on: a new one per training, as per kedro run
            create_dataset(manifest, "train", IMAGE_SIZE, BATCH, training=True, num_workers=1),
            GivenSteps(lambda start_checkpoint, steps_per_epoch: model_step(start_checkpoint, steps_per_epoch, 3)),
            start=start,
            fingerprint="model-train",
            checkpoints=Checkpointing(tmp_path, every_epochs=1, keep_last=2),
            validation=val_data,
            callbacks=callbacks,
        )

    recorder = Recorder()
    with pytest.raises(KeyboardInterrupt):
        run(recorder, StopAt(2))
    assert recorder.events[-1] == ("train_end",)  # ended once, although Model.train raised
    assert [e for e in recorder.events if e[0] == "train_end"] == [("train_end",)]
    assert [(e, s) for _, e, s in (ev for ev in recorder.events if ev[0] == "step")] == [
        (e, s) for e in range(2) for s in range(STEPS_PER_EPOCH)
    ]
    first_rows = [event[2] for event in recorder.events if event[0] == "epoch_end"]
    assert ["val/top1" in row for row in first_rows] == [False, True]  # every 2nd epoch
    lr_per_step = warmup_schedule("linear", 0.01, 0.1, 0.0, 1, 3, STEPS_PER_EPOCH)
    assert [row["train/lr"] for row in first_rows] == pytest.approx([lr_per_step[3], lr_per_step[7]])
    assert sorted(p.name for p in tmp_path.iterdir()) == ["epoch_0001.ckpt", "epoch_0002.ckpt"]
    saved = load_checkpoint(tmp_path / "epoch_0002.ckpt")
    assert int(saved.optimizer_state()["global_step"].reshape(-1)[0]) == 2 * STEPS_PER_EPOCH

    resumed, recorder = Resumed(), Recorder()
    result = run(recorder, resumed)
    assert resumed.resumed == [(tmp_path / "epoch_0002.ckpt", [1, 2])]
    assert recorder.events[0] == ("train_begin", 3, STEPS_PER_EPOCH, 2)
    assert [row["epoch"] for row in result.history] == [1, 2, 3]
    assert result.history[:2] == first_rows
    assert "val/top1" in result.history[2]  # the last epoch
    assert int(result.checkpoint.optimizer_state()["global_step"].reshape(-1)[0]) == 3 * STEPS_PER_EPOCH


def test_model_train_steps_stop_on_a_non_finite_loss(train_data):
    spec = TrainingSpec(epochs=2, batch_size=BATCH, examples_per_step=BATCH)
    recorder = Recorder()
    with pytest.raises(NonFiniteLossError, match=f"at epoch 1, step 1/{STEPS_PER_EPOCH}"):
        train(
            spec,
            train_data,
            GivenSteps(lambda start, steps_per_epoch: model_step(start, steps_per_epoch, 2, poison=True)),
            start=capture_state(build(0, lr_schedule())[0], None, {"epoch": 0}),
            callbacks=[recorder],
        )
    assert not recorder.step_losses and recorder.events[-1] == ("train_end",)


def test_a_finished_training_removes_its_periodic_checkpoints_once_its_final_state_is_saved(tmp_path, train_data):
    folder = tmp_path / "epochs"
    write_epoch(tmp_path / "other", 1, "other")  # another training's folder is left alone
    spec = TrainingSpec(epochs=3, batch_size=BATCH, examples_per_step=BATCH)
    result = train(
        spec,
        train_data,
        GivenSteps(lambda start, steps_per_epoch: TrainStep(constant_step(), nn_dense())),
        fingerprint="abc",
        checkpoints=Checkpointing(folder, every_epochs=1, keep_last=2),
    )
    assert result.checkpoint.metadata["checkpoint_dir"] == str(folder)
    assert sorted(p.name for p in folder.iterdir()) == ["epoch_0002.ckpt", "epoch_0003.ckpt"]  # until it is saved
    save_checkpoint(result.checkpoint, tmp_path / "final.ckpt")  # what the catalog does, before the hook runs
    write_epoch(folder, 9, "not-this-training")  # never happens in practice, but must survive
    assert remove_finished_checkpoints(result.checkpoint) == [folder / "epoch_0002.ckpt", folder / "epoch_0003.ckpt"]
    assert sorted(p.name for p in folder.iterdir()) == ["epoch_0009.ckpt"]
    assert load_checkpoint(tmp_path / "final.ckpt").metadata["epoch"] == 3  # the final checkpoint stays
    assert [p.name for p in (tmp_path / "other").iterdir()] == ["epoch_0001.ckpt"]
    # a checkpoint that names no folder (start weights, a migrated network) removes nothing
    assert remove_finished_checkpoints(Checkpoint({}, {"epoch": 3, "fingerprint": "abc"})) == []


def nn_dense():
    from mindspore import nn

    return nn.Dense(1, 1)


def test_one_compile_line_per_compiled_cell_and_a_start_line_with_the_true_lr(tmp_path, train_data, val_data, caplog):
    with caplog.at_level("INFO", logger="trainlib.engine"):
        momentum_training(tmp_path, train_data, val_data)  # 3 epochs, evaluated after each
    assert compile_lines(caplog) == ["Compiling the training graph…", "Compiling the evaluation graph…"]
    lr = warmup_schedule("linear", 0.01, 0.1, 0.0, 1, 3, STEPS_PER_EPOCH)
    start = [r.getMessage() for r in caplog.records if r.getMessage().startswith("training: epochs")]
    assert start == [
        f"training: epochs 1-3 of a 3-epoch schedule, {STEPS_PER_EPOCH} steps/epoch, batch {BATCH} per rank, "
        f"lr {lr[0]:.4g} at the first step to {lr[-1]:.4g} at the last"
    ]
