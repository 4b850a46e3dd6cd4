"""A tuning's draws do not depend on how many processes drew them: a process that resumes a tuning (or joins it,
as a second machine does) draws the values an uninterrupted process gives each trial number, never the first
trials' again."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from trainlib.params.study import TuningParams, space_ranges
from trainlib.study.tuning import RetryDeadTrial, draw_values, open_study

CONF = Path(__file__).parents[2] / "conf/base/parameters_study.yml"


def tuning_params(storage: str, sampler: str) -> TuningParams:
    configured = yaml.safe_load(CONF.read_text())["study"]["tuning"]
    return TuningParams.model_validate({**configured, "trials": 8, "storage": storage, "sampler": sampler})


def draws(tuning: TuningParams, processes: list[int]) -> list[dict[str, float]]:
    """The values of thor's trials drawn by consecutive processes, each opening the study anew (a fresh sampler, as
    a new ``kedro run`` has) and drawing its count of trials, each finished with a made-up objective."""
    ranges = space_ranges(tuning.spaces["thor"])
    drawn = []
    for count in processes:
        study = open_study("thor", tuning=tuning, on_dead_trial=RetryDeadTrial(None, max_retry=0), eval_every_steps=20)

        def made_up_objective(trial) -> float:
            values = draw_values(trial, ranges, tuning=tuning)
            drawn.append(values)
            return values["lr.peak"]

        study.optimize(made_up_objective, n_trials=count)
    return drawn


@pytest.mark.parametrize("sampler", ["tpe", "qmc"])
def test_a_resumed_tuning_draws_what_an_uninterrupted_one_draws(tmp_path, sampler):
    # 6 trials: TPE's 4 random start-up trials (half of 8) and 2 from its model of them
    uninterrupted = draws(tuning_params(f"sqlite:///{tmp_path / 'one.db'}", sampler), [6])
    resumed = draws(tuning_params(f"sqlite:///{tmp_path / 'resumed.db'}", sampler), [2, 1, 3])
    assert resumed == uninterrupted
    assert len({tuple(values.values()) for values in resumed}) == 6  # no trial's values drawn twice
