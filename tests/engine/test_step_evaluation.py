"""The engine's evaluation every K steps: rows at the right global steps, evaluation time kept out of every
training time, rows carried through a resume and handed to callbacks (``on_step_evaluation``)."""

from __future__ import annotations

import time

import numpy as np
import pytest

from tests.support.training import GivenSteps
from trainlib.data.folder import create_dataset, scan_image_tree
from trainlib.engine.callbacks import Callback
from trainlib.engine.checkpoint import Checkpoint
from trainlib.engine.epochs import TrainingSpec
from trainlib.engine.loop import Checkpointing, train
from trainlib.engine.step import TrainStep
from trainlib.metrics import EVAL_TIME_S, STEP_KEY, TRAIN_ELAPSED_S, TRAIN_EPOCH_TIME_S, VAL_STEP_TOP1

BATCH = 4
STEPS_PER_EPOCH = 4  # 18 train images -> 4 full batches
EVALUATION_S = 0.3


@pytest.fixture(scope="module")
def train_data(tmp_path_factory):
    from tests.support.trees import write_image_tree

    root = write_image_tree(tmp_path_factory.mktemp("tree"), classes=("a", "b", "c"), per_class={"train": 6, "val": 2})
    manifest = scan_image_tree(root, {"train": "train", "val": "val"}).manifest
    return create_dataset(manifest, "train", 12, BATCH, training=True, num_workers=1)


class StepRows(Callback):
    def __init__(self):
        self.rows = []

    def on_step_evaluation(self, row):
        self.rows.append(dict(row))


def run(train_data, epochs: int, checkpoints: Checkpointing | None = None, callbacks=(), every: int = 2):
    """Evaluations every ``every`` steps that take ``EVALUATION_S`` each, on a step that trains nothing."""
    import mindspore as ms
    from mindspore import nn

    accuracies = iter(np.linspace(0.1, 0.9, 8))

    def slow_evaluation(step):
        time.sleep(EVALUATION_S)
        return {"top1": float(next(accuracies)), "top5": 1.0}

    network = nn.Dense(1, 1)
    spec = TrainingSpec(epochs=epochs, batch_size=BATCH, examples_per_step=BATCH, eval_every_steps=every)
    return train(
        spec,
        train_data,
        GivenSteps(
            lambda start, steps: TrainStep(lambda images, labels: ms.Tensor(np.float32(1.0)), network),
            scores=lambda step, data: slow_evaluation(step),
        ),
        start=Checkpoint({p.name: p.asnumpy() for p in network.get_parameters()}, {}),
        fingerprint="steps",
        checkpoints=checkpoints,
        step_validation="subset",  # the scores ignore it
        callbacks=callbacks,
    )


def test_step_evaluations_are_timed_apart_from_training(train_data):
    recorder = StepRows()
    result = run(train_data, epochs=2, callbacks=[recorder])
    rows = result.step_history
    assert [row[STEP_KEY] for row in rows] == [2, 4, 6, 8]  # global steps, across both epochs
    assert recorder.rows == rows
    assert all(row[EVAL_TIME_S] >= EVALUATION_S for row in rows)
    training_s = sum(row[TRAIN_EPOCH_TIME_S] for row in result.history)
    assert training_s < 2 * EVALUATION_S  # four evaluations took 1.2 s; none of it is training time
    elapsed = [row[TRAIN_ELAPSED_S] for row in rows]
    assert elapsed == sorted(elapsed) and elapsed[-1] <= training_s
    assert "val/top1" not in result.history[0]  # no evaluate: only the step evaluations ran


@pytest.mark.parametrize(("epochs", "every", "steps"), [(1, 6, [4]), (2, 3, [3, 6, 8])])
def test_the_trainings_last_step_is_always_a_point_of_the_curve(train_data, epochs, every, steps):
    # an epoch of 4 steps and an interval of 6 (the study's 15 < 20) once left the curve empty
    recorder = StepRows()
    result = run(train_data, epochs=epochs, callbacks=[recorder], every=every)
    assert [row[STEP_KEY] for row in result.step_history] == steps
    assert recorder.rows == result.step_history
    training_s = sum(row[TRAIN_EPOCH_TIME_S] for row in result.history)
    assert result.step_history[-1][TRAIN_ELAPSED_S] == pytest.approx(training_s, abs=0.05)
    assert training_s < EVALUATION_S  # the end point's evaluation is not training time either


def test_step_rows_survive_a_resume(tmp_path, train_data):
    checkpoints = Checkpointing(tmp_path / "epochs", every_epochs=1, keep_last=1)
    first = run(train_data, epochs=1, checkpoints=checkpoints)
    assert [row[STEP_KEY] for row in first.step_history] == [2, 4]
    # the 1-epoch training's checkpoint is what a 2-epoch one killed after epoch 1 leaves
    recorder = StepRows()
    resumed = run(train_data, epochs=2, checkpoints=checkpoints, callbacks=[recorder])
    assert [row[STEP_KEY] for row in resumed.step_history] == [2, 4, 6, 8]
    assert [row[STEP_KEY] for row in recorder.rows] == [2, 4, 6, 8]  # the earlier rows replayed first
    assert resumed.step_history[:2] == first.step_history
    assert resumed.step_history[1][VAL_STEP_TOP1] == first.step_history[1][VAL_STEP_TOP1]
