"""The study's statistics against closed forms: t-intervals (cut to what an accuracy can be), first crossings,
summaries, paired differences, the figure's band."""

from __future__ import annotations

import math

import numpy as np
import pandas as pd
import pytest
from scipy import stats

from trainlib.study.statistics import (
    curves_figure,
    first_crossing,
    paired_differences,
    seeds_to_decide,
    summarise,
    t_interval,
)


def test_t_interval_is_the_student_t_interval():
    values = [0.81, 0.84, 0.86, 0.83]
    mean, low, high, n = t_interval(values)
    half = stats.t.ppf(0.975, 3) * np.std(values, ddof=1) / 2
    assert n == 4 and mean == pytest.approx(np.mean(values))
    assert (low, high) == pytest.approx((mean - half, mean + half))
    # NaN (never reached the target) is left out; one value has no interval
    assert t_interval([0.5, math.nan])[3] == 1 and math.isnan(t_interval([0.5, math.nan])[1])
    assert t_interval([])[3] == 0


def test_intervals_of_accuracies_stay_inside_what_an_accuracy_can_be():
    """Two seeds near 1 (or near 0) give a t-interval far past [0, 1]; the study's tables and figure cut it there."""
    runs = pd.DataFrame(
        {
            "result": ["thor", "thor", "baseline", "baseline"],
            "seed": [0, 1, 0, 1],
            "final_top1": [0.99, 0.8, 0.02, 0.3],
            "final_top5": [1.0, 0.9, 0.5, 0.6],
            "time_to_target_s": [1.0, 2.0, 3.0, 4.0],
            "epochs_to_target": [1.0, 2.0, 1.0, 1.0],
        }
    )
    raw = t_interval(runs["final_top1"][:2].tolist())
    assert raw[2] > 1  # the uncut interval of the two thor seeds
    summary = summarise(runs).set_index("result")
    assert summary.at["thor", "final_top1_ci_high"] == 1.0 and summary.at["baseline", "final_top1_ci_low"] == 0.0
    assert summary.at["thor", "final_top1_ci_low"] == max(raw[1], 0.0)
    assert summary.at["thor", "time_to_target_s_ci_low"] < 0  # times are not accuracies: not cut
    differences = paired_differences(runs).set_index("measure")
    assert (
        -1
        <= differences.at["final_top1_difference", "ci_low"]
        <= differences.at["final_top1_difference", "ci_high"]
        <= 1
    )
    curves = pd.DataFrame(
        [(result, seed, t, top1) for result, seed, top1 in (("thor", 0, 0.99), ("thor", 1, 0.6)) for t in (1.0, 2.0)],
        columns=["result", "seed", "elapsed_s", "top1"],
    )
    band = curves_figure(curves).axes[0].collections[0].get_paths()[0].vertices[:, 1]
    assert band.min() >= 0 and band.max() <= 1


def test_first_crossing_is_the_earliest_step_at_or_above_the_target():
    rows = [{"step": s, "val/step_top1": v, "train/elapsed_s": 2.0 * s} for s, v in ((6, 0.9), (2, 0.4), (4, 0.5))]
    assert first_crossing(rows, 0.5)["step"] == 4
    assert first_crossing(rows, 0.4)["train/elapsed_s"] == 4.0
    assert first_crossing(rows, 0.95) is None


def test_summary_and_paired_differences():
    runs = pd.DataFrame(
        {
            "result": ["baseline"] * 3 + ["thor"] * 3,
            "seed": [0, 1, 2] * 2,
            "final_top1": [0.80, 0.82, 0.84, 0.83, 0.84, 0.88],
            "final_top5": [0.99] * 6,
            "time_to_target_s": [100.0, 120.0, math.nan, 60.0, 90.0, 70.0],
            "epochs_to_target": [1.0, 1.2, math.nan, 0.5, 0.9, 0.7],
        }
    )
    summary = summarise(runs).set_index("result")
    assert summary.loc["baseline", "runs"] == 3 and summary.loc["baseline", "time_to_target_s_n"] == 2
    assert summary.loc["thor", "final_top1"] == pytest.approx(np.mean([0.83, 0.84, 0.88]))
    paired = paired_differences(runs).set_index("measure")
    ratio = paired.loc["time_to_target_ratio"]
    assert ratio["n"] == 2 and ratio["mean"] == pytest.approx(np.mean([0.6, 0.75]))  # seed 2 never reached it
    difference = paired.loc["final_top1_difference"]
    assert difference["mean"] == pytest.approx(np.mean([0.03, 0.02, 0.04]))
    assert difference["ci_low"] < difference["mean"] < difference["ci_high"]
    assert difference["ci_low"] > 0 and difference["seeds_to_decide"] == 3  # decided on its 3 seeds
    assert ratio["ci_high"] > 1 and ratio["seeds_to_decide"] > 2  # 0.6 and 0.75: more seeds to tell it from 1


def test_seeds_to_decide_is_the_first_n_whose_interval_would_exclude_no_effect():
    values = [0.03, -0.01, 0.02]  # mean 0.0133, sd 0.0208: the 3-seed interval spans 0
    n = seeds_to_decide(values, 0.0)
    mean, sd = np.mean(values), np.std(values, ddof=1)

    def half_width(seeds: int) -> float:
        return stats.t.ppf(0.975, seeds - 1) * sd / math.sqrt(seeds)

    assert half_width(3) > mean  # undecided now
    assert half_width(int(n)) < mean <= half_width(int(n) - 1)  # the first n that decides it
    assert seeds_to_decide([1.2, 1.15, 1.25], 1.0) == 3  # a ratio whose interval is above 1 already
    assert math.isnan(seeds_to_decide([0.01, -0.01], 0.0))  # no effect observed: no number of seeds
    assert math.isnan(seeds_to_decide([0.5], 0.0))  # one seed: no spread
    assert math.isnan(seeds_to_decide([0.001, -0.3, 0.31], 0.0, most=50))  # beyond an affordable count


def test_run_figures_of_an_image_recipe_have_no_masked_lm_figures():
    from trainlib.metrics import STEP_KEY, TRAIN_ELAPSED_S, VAL_STEP_TOP1
    from trainlib.study.statistics import run_figures

    record = {
        "final_top1": 0.5,
        "final_top5": 0.9,
        "steps_per_epoch": 3,
        "step_history": [{STEP_KEY: 2, TRAIN_ELAPSED_S: 1.0, VAL_STEP_TOP1: 0.6}],
    }
    figures = run_figures(record, 0.55)
    assert figures["final_top1"] == 0.5 and math.isnan(figures["final_mlm_accuracy"])
    assert figures["steps_to_target"] == 2


def test_the_study_log_names_a_ratio_no_seed_could_give(caplog):
    """No seed on which both recipes reached the target: the study's log says so, not ``nan [nan, nan] n=0``."""
    import logging

    from pipelines.study.nodes import summarise_study

    runs = pd.DataFrame(
        {
            "result": ["thor", "thor", "thor", "baseline", "baseline", "baseline"],
            "seed": [0, 1, 2, 0, 1, 2],
            "final_top1": [0.81, 0.8, 0.82, 0.79, 0.78, 0.8],
            "final_top5": [0.99] * 6,
            "time_to_target_s": [math.nan] * 6,
            "steps_to_target": [math.nan] * 6,
            "epochs_to_target": [math.nan] * 6,
        }
    )
    with caplog.at_level(logging.INFO, logger="pipelines.study"):
        summarise_study(runs)
    assert "thor vs baseline time_to_target_ratio: none (no seed on which both reached the target)" in caplog.text
    assert "nan [nan, nan]" not in caplog.text
    assert "thor vs baseline final_top1_difference: 2 pt [" in caplog.text
