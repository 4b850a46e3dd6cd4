"""Same seed, same parameters, same CPU: two ``kedro run``s give the same per-epoch metrics and weights."""

from __future__ import annotations

import pandas as pd

from tests.support.projects import TINY_PARAMS, kedro, make_project
from tests.support.trees import write_image_tree
from trainlib.engine.checkpoint import load_checkpoint

# wall-clock figures, the only columns that may differ
TIMINGS = ["train/epoch_time_s", "train/compile_s", "train/images_per_s"]


def test_two_runs_with_the_same_seed_give_the_same_metrics(tmp_path):
    tree = write_image_tree(tmp_path / "tree", classes=("a", "b", "c"), per_class={"train": 8, "val": 3})
    params = {**TINY_PARAMS, "data": {**TINY_PARAMS["data"], "root": str(tree)}}
    histories, weights = [], []
    for name in ("first", "second"):
        project = make_project(tmp_path / name, params)
        result = kedro(project, "run", "--pipelines=baseline")
        assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
        histories.append(pd.read_csv(project / "data/08_reporting/baseline_history.csv").drop(columns=TIMINGS))
        weights.append(load_checkpoint(project / "data/06_models/baseline/final.ckpt").params)
    assert len(histories[0]) == TINY_PARAMS["baseline"]["epochs"]
    assert {"train/loss", "train/lr", "val/top1", "val/top5"} <= set(histories[0].columns)
    pd.testing.assert_frame_equal(histories[0], histories[1], check_exact=True)
    assert weights[0].keys() == weights[1].keys()
    different = [name for name in weights[0] if not (weights[0][name] == weights[1][name]).all()]
    assert not different, f"parameters that differ between the runs: {different[:5]}"
