"""The metric schema itself: the keys every recipe logs, written out once here so that a change to them is a
deliberate one (the MLflow UI and every report overlay runs by these names)."""

from __future__ import annotations

from trainlib import metrics


def test_the_schema_keys_are_the_documented_ones():
    assert metrics.EPOCH_KEYS == (
        "train/loss",
        "train/lr",
        "train/images_per_s",
        "train/epoch_time_s",
        "train/compile_s",
        "val/top1",
        "val/top5",
    )
    assert metrics.STEP_KEYS == ("val/step_top1", "val/step_top5", "train/elapsed_s", "eval/time_s")
    assert metrics.FINAL_KEYS == ("final/top1", "final/top5")


def test_the_schema_module_loads_without_mindspore():
    import subprocess
    import sys

    code = "import sys, trainlib.metrics; sys.exit('mindspore' in sys.modules)"
    assert subprocess.run([sys.executable, "-c", code], check=False).returncode == 0
