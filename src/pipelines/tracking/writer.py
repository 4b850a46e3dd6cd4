"""Writing to the active MLflow run: metrics, final figures, params, tags, artifacts and per-epoch rows.

Every function here is a no-op outside an active run (library tests, ranks > 0), so the library can call
them unconditionally. Metric keys follow the schema of ``trainlib.metrics`` (``train/loss``, ``val/top1``, …,
``final/top1``).
"""

from __future__ import annotations

import math
import time
from collections.abc import Mapping, Sequence
from pathlib import Path

import mlflow
from mlflow.entities import Metric
from mlflow.exceptions import MlflowException

from trainlib.engine.callbacks import Callback
from trainlib.metrics import (
    FINAL_PREFIX,
    STEP_KEY,
    TARGET_EPOCHS,
    TARGET_METRICS,
    TARGET_REACHED,
    TARGET_STEPS,
    TARGET_TIME_S,
    TIMESTAMP_KEY,
    TRAIN_ELAPSED_S,
    TRAIN_EPOCH_TIME_S,
)
from trainlib.redaction import redact_value

# MLflow accepts at most 1000 metrics per log_batch call
BATCH_LIMIT = 1000
FINAL_FIGURES = ("top1", "top5", "mlm_accuracy", "mlm_loss", "nsp_accuracy")  # what a final evaluation may hold


# Significant digits a metric keeps: the MLflow UI prints a value as logged, so 2/3 would read 0.6666666666666666.
# Seven is what a float32 (every loss and statistic of the trainings) carries, and still tells one image in ten
# million apart, so no figure loses meaning and a metric compared with its history file differs by < 1e-7 relative.
METRIC_DIGITS = 7


def _finite(value) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool) and math.isfinite(value)


def as_logged(value: float) -> float:
    """``value`` as the runs store it: rounded to ``METRIC_DIGITS`` significant digits."""
    return float(f"{value:.{METRIC_DIGITS}g}")


def log_metrics(metrics: Mapping[str, float], step: int | None = None) -> None:
    """Log finite numeric ``metrics`` to the active MLflow run, if there is one."""
    if mlflow.active_run() is None:
        return
    finite = {k: as_logged(v) for k, v in metrics.items() if _finite(v)}
    if finite:
        mlflow.log_metrics(finite, step=step)


def log_final(figures: Mapping[str, float]) -> None:
    """Log a final evaluation (``top1``, ``top5`` fractions; a language model's ``mlm_accuracy``, ``mlm_loss``,
    ``nsp_accuracy``) as ``final/top1``, …; other keys of ``figures`` (a report's ``epoch``) are not metrics."""
    log_metrics({FINAL_PREFIX + k: figures[k] for k in FINAL_FIGURES if k in figures})


def log_params(params: Mapping[str, object]) -> None:
    """Log ``params`` to the active MLflow run, if there is one, in as few requests as MLflow allows (``log_batch``,
    100 params a request)."""
    if mlflow.active_run() is not None:
        mlflow.log_params(redact_value(dict(params)))


def set_tags(tags: Mapping[str, str]) -> None:
    """Set ``tags`` on the active MLflow run, if there is one."""
    if mlflow.active_run() is not None:
        mlflow.set_tags(redact_value(dict(tags)))


# MLflow 3's experiment kind (the tag its experiment-kind selector writes): model training, not GenAI development
EXPERIMENT_KIND_TAG = "mlflow.experimentKind"
MODEL_TRAINING_KIND = "custom_model_development"


def mark_model_training_experiment() -> None:
    """Tag the active run's experiment as MLflow 3's model-training kind, unless it has a kind already (one set by
    hand in the UI stands)."""
    active = mlflow.active_run()
    if active is None:
        return
    client = mlflow.MlflowClient()
    experiment = client.get_experiment(active.info.experiment_id)
    if EXPERIMENT_KIND_TAG not in experiment.tags:
        try:
            client.set_experiment_tag(experiment.experiment_id, EXPERIMENT_KIND_TAG, MODEL_TRAINING_KIND)
        except MlflowException:
            # two machines starting together both find the tag missing; the server refuses the second insert
            # (a unique key): the tag is there, as wanted
            if EXPERIMENT_KIND_TAG not in client.get_experiment(experiment.experiment_id).tags:
                raise


def log_artifact(path: str | Path, artifact_path: str) -> None:
    """Copy the file ``path`` into the active run's artifacts, folder ``artifact_path``, if there is a run."""
    if mlflow.active_run() is not None:
        mlflow.log_artifact(str(path), artifact_path)


def log_epoch_rows(rows: Sequence[Mapping[str, float]], step_key: str = "epoch") -> None:
    """Log per-epoch rows to the active run: every finite value, step = the row's epoch, at the row's time.

    ``step_key`` names the column that is the step instead (e.g. ``step`` for per-step rows).
    """
    active = mlflow.active_run()
    if active is None:
        return
    metrics = []
    for row in rows:
        timestamp_ms = int(1000 * row.get(TIMESTAMP_KEY, time.time()))
        step = int(row[step_key])
        metrics += [
            Metric(key, as_logged(value), timestamp_ms, step)
            for key, value in row.items()
            if key not in (step_key, TIMESTAMP_KEY) and _finite(value)
        ]
    client = mlflow.MlflowClient()
    for first in range(0, len(metrics), BATCH_LIMIT):
        client.log_batch(active.info.run_id, metrics=metrics[first : first + BATCH_LIMIT])


class EpochMetrics(Callback):
    """Logs each epoch's row to the active MLflow run as it ends (step = epoch, at the row's time).

    On resume it logs the rows of the epochs before, carried by the checkpoint, and tags the run
    ``resumed_from`` = the checkpoint's path, so the resumed run holds every epoch from 1.
    """

    def on_resume(self, source: Path, history: Sequence[Mapping[str, float]]) -> None:
        set_tags({"resumed_from": str(source)})
        log_epoch_rows(history)

    def on_epoch_end(self, epoch: int, metrics: dict[str, float]) -> None:
        log_epoch_rows([metrics])

    def on_step_evaluation(self, row: Mapping[str, float]) -> None:
        log_epoch_rows([row], step_key=STEP_KEY)  # val/step_top1, train/elapsed_s, ... at step = global step


class TimeToTarget(Callback):
    """Logs, at the end of a training, when it first reached ``target`` on the evaluation ``measure`` (``top1``,
    ``mlm_accuracy``; ``metrics.TARGET_METRICS``): ``target/steps``, ``target/epochs``, ``target/time_s`` and
    ``target/reached`` (1; 0 and nothing else when it never did; nothing at all for a training that evaluates
    another measure).

    Read on the step evaluations where the training has them (step resolution), else on the epochs' evaluations (the
    end of the epoch that first reached it). A resumed training sees its earlier rows again (``on_resume``,
    ``on_step_evaluation``), so the figure is the whole training's.
    """

    def __init__(self, target: float, measure: str = "top1"):
        self.target = target
        self.step_key, self.epoch_key = TARGET_METRICS[measure]
        self.steps_per_epoch = 0
        self.at_step: tuple[int, float] | None = None  # (global step, training seconds) of the first crossing
        self.at_epoch: tuple[int, float] | None = None  # (epochs done, training seconds) of the first crossing
        self.seconds = 0.0  # training seconds of the epochs done
        self.evaluated = False  # whether any row held the measure

    def on_resume(self, source: Path, history: Sequence[Mapping[str, float]]) -> None:
        for row in history:
            self._epoch_row(int(row["epoch"]), row)

    def on_train_begin(self, total_epochs: int, steps_per_epoch: int, start_epoch: int) -> None:
        self.steps_per_epoch = steps_per_epoch

    def on_epoch_end(self, epoch: int, metrics: dict[str, float]) -> None:
        self._epoch_row(epoch + 1, metrics)

    def _epoch_row(self, epochs_done: int, row: Mapping[str, float]) -> None:
        self.seconds += row.get(TRAIN_EPOCH_TIME_S, 0.0)
        self.evaluated = self.evaluated or self.epoch_key in row
        if self.at_epoch is None and row.get(self.epoch_key, -math.inf) >= self.target:
            self.at_epoch = (epochs_done, self.seconds)

    def on_step_evaluation(self, row: Mapping[str, float]) -> None:
        self.evaluated = self.evaluated or self.step_key in row
        if self.at_step is None and row.get(self.step_key, -math.inf) >= self.target:
            self.at_step = (int(row[STEP_KEY]), float(row[TRAIN_ELAPSED_S]))

    def on_train_end(self) -> None:
        if self.at_step is not None:
            steps, seconds = self.at_step
            epochs = steps / self.steps_per_epoch
        elif self.at_epoch is not None:
            epochs, seconds = self.at_epoch
            steps = epochs * self.steps_per_epoch
        else:
            log_metrics({TARGET_REACHED: 0} if self.evaluated else {})
            return
        log_metrics({TARGET_STEPS: steps, TARGET_EPOCHS: epochs, TARGET_TIME_S: seconds, TARGET_REACHED: 1})
