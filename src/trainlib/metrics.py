"""The metric schema every recipe logs, so the MLflow UI overlays their runs; pandas only, no MindSpore.

Per-epoch keys (step = the epoch, 1-based) are in every training's history table (column ``epoch``, then
``EPOCH_KEYS``) and MLflow run; the evaluation every K steps adds its own rows (step = the global step); the
final evaluation of a checkpoint is logged once under ``final/``. A recipe's own figures go under its prefix and
are defined with the recipe (``thor/…`` in ``recipes.thor``, ``pbfgs/…`` in ``recipes.dim_reduce.stage2``,
``pca/…`` in the dim_reduce nodes). The engine, tracking, reporting, the study and the tests read the keys here.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import pandas as pd

TRAIN_LOSS = "train/loss"  # mean training loss over the epoch
TRAIN_LR = "train/lr"  # learning rate of the epoch's last step
TRAIN_IMAGES_PER_S = "train/images_per_s"  # all ranks together
TRAIN_SEQUENCES_PER_S = "train/sequences_per_s"  # a language model's throughput in place of images/s
THROUGHPUT_UNITS = {TRAIN_IMAGES_PER_S: "img", TRAIN_SEQUENCES_PER_S: "seq"}  # as the progress line shows them
TRAIN_EPOCH_TIME_S = "train/epoch_time_s"  # training only: evaluations and graph compilations excluded
# seconds of the epoch's steps that compiled a graph (a cell's first call in GRAPH mode: seconds on CPU, a fixed
# cost that a short run would otherwise charge to its optimizer), logged apart from the training time
TRAIN_COMPILE_S = "train/compile_s"
VAL_TOP1 = "val/top1"  # fractions in [0, 1], on evaluation epochs only
VAL_TOP5 = "val/top5"
# a language model's (thor_bert) evaluation in place of top-1/top-5: masked-LM accuracy (a fraction in [0, 1]) and
# loss on the held-out examples, and the next-sentence accuracy
VAL_MLM_ACCURACY = "val/mlm_accuracy"
VAL_MLM_LOSS = "val/mlm_loss"
VAL_NSP_ACCURACY = "val/nsp_accuracy"
TRAINING_KEYS = (TRAIN_LOSS, TRAIN_LR, TRAIN_IMAGES_PER_S, TRAIN_EPOCH_TIME_S, TRAIN_COMPILE_S)
EPOCH_KEYS = (*TRAINING_KEYS, VAL_TOP1, VAL_TOP5)
TIMESTAMP_KEY = "timestamp"  # wall clock at the end of the epoch (seconds since the Unix epoch); not a metric

# The evaluation every K steps on a fixed val subset (step = global step), for time to target at step resolution.
STEP_KEY = "step"  # global step, 1-based, counted from epoch 1
VAL_STEP_TOP1 = "val/step_top1"  # fractions in [0, 1] on the subset
VAL_STEP_TOP5 = "val/step_top5"
TRAIN_ELAPSED_S = "train/elapsed_s"  # training seconds from epoch 1 to this step, evaluations and compilations excluded
EVAL_TIME_S = "eval/time_s"  # seconds this evaluation took (not part of any training time)
STEP_KEYS = (VAL_STEP_TOP1, VAL_STEP_TOP5, TRAIN_ELAPSED_S, EVAL_TIME_S)
STEPS_PER_EPOCH = "steps_per_epoch"  # the step-history table's column: the training's steps in one epoch
VAL_STEP_MLM_ACCURACY = "val/step_mlm_accuracy"  # a language model's, on its step-evaluation subset
VAL_STEP_MLM_LOSS = "val/step_mlm_loss"

FINAL_PREFIX = "final/"  # the evaluation node's accuracy of the final checkpoint, logged once
FINAL_TOP1 = FINAL_PREFIX + "top1"
FINAL_TOP5 = FINAL_PREFIX + "top5"
FINAL_KEYS = (FINAL_TOP1, FINAL_TOP5)
FINAL_MLM_ACCURACY = FINAL_PREFIX + "mlm_accuracy"
FINAL_MLM_LOSS = FINAL_PREFIX + "mlm_loss"

# When a training first reached its target (target.top1; thor_bert: target_mlm_accuracy), logged once at its end: the
# global step, the epochs (steps / steps per epoch) and the training seconds to it, read on the step evaluations
# (val/step_top1, val/step_mlm_accuracy) or, where a training has none, at the end of the epoch on val/top1
# (val/mlm_accuracy); target/reached is 1 or 0. The runs table shows them beside final/.
TARGET_PREFIX = "target/"
TARGET_STEPS = TARGET_PREFIX + "steps"
TARGET_EPOCHS = TARGET_PREFIX + "epochs"
TARGET_TIME_S = TARGET_PREFIX + "time_s"
TARGET_REACHED = TARGET_PREFIX + "reached"
# The evaluation keys a target is read on: the step evaluation's, then the epoch's
TARGET_METRICS = {"top1": (VAL_STEP_TOP1, VAL_TOP1), "mlm_accuracy": (VAL_STEP_MLM_ACCURACY, VAL_MLM_ACCURACY)}

# What an evaluation returns -> the row keys it is logged under: image recipes (top-1/top-5) and language models
IMAGE_EVALUATION = (("top1", VAL_TOP1), ("top5", VAL_TOP5))
IMAGE_STEP_EVALUATION = (("top1", VAL_STEP_TOP1), ("top5", VAL_STEP_TOP5))
LANGUAGE_EVALUATION = (
    ("mlm_accuracy", VAL_MLM_ACCURACY),
    ("mlm_loss", VAL_MLM_LOSS),
    ("nsp_accuracy", VAL_NSP_ACCURACY),
)
LANGUAGE_STEP_EVALUATION = (("mlm_accuracy", VAL_STEP_MLM_ACCURACY), ("mlm_loss", VAL_STEP_MLM_LOSS))

REPLICA_DIVERGENCE = "distributed/replica_max_abs_diff"  # once, with several ranks (0 when data parallel works)


def history_table(history: Sequence[Mapping[str, float]]) -> pd.DataFrame:
    """The per-epoch rows as the history dataset: column ``epoch``, then the metric keys (no timestamp)."""
    table = pd.DataFrame([{k: v for k, v in row.items() if k != TIMESTAMP_KEY} for row in history])
    if table.empty:
        return pd.DataFrame(columns=["epoch", *EPOCH_KEYS])
    table["epoch"] = table["epoch"].astype(int)
    return table


def step_history_table(rows: Sequence[Mapping[str, float]], steps_per_epoch: int) -> pd.DataFrame:
    """The step evaluations as the step-history dataset: column ``step``, the evaluation's keys, and
    ``steps_per_epoch`` (the training's, on every row: a step reads as epochs, ``step / steps_per_epoch``)."""
    table = pd.DataFrame(list(rows))
    if table.empty:
        return pd.DataFrame(columns=[STEP_KEY, STEPS_PER_EPOCH])
    table[STEP_KEY] = table[STEP_KEY].astype(int)
    table[STEPS_PER_EPOCH] = steps_per_epoch
    return table


def table_rows(table: pd.DataFrame) -> list[dict[str, float]]:
    """A history or step-history table back as rows of plain numbers, an empty cell (an epoch without evaluation)
    left out, as the engine's rows have no such key."""
    return [
        {key: value.item() if hasattr(value, "item") else value for key, value in row.items() if not pd.isna(value)}
        for row in table.to_dict("records")
    ]
