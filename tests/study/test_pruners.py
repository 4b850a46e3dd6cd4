"""``study.tuning.pruner``: each pruner, built by ``create_pruner`` as the tuning builds it, stops a trial whose step
evaluations trail the others', in a real Optuna study whose trials report through the tuning's own callback
(``PruneOnStepEvaluations``: the error 1 - top-1 of each step evaluation at its step), on learning curves of the
default study's shape (a step evaluation every 20 steps of 460)."""

from __future__ import annotations

import math

import optuna
import pytest
from optuna.trial import TrialState

from trainlib.metrics import STEP_KEY, VAL_STEP_TOP1
from trainlib.study.tuning_search import PruneOnStepEvaluations, create_pruner

EVAL_EVERY_STEPS = 20
STEPS = range(EVAL_EVERY_STEPS, 461, EVAL_EVERY_STEPS)


def accuracies(final: float) -> list[float]:
    """A learning curve: top-1 rising from 0.1 towards ``final``."""
    return [final - (final - 0.1) * math.exp(-step / 150) for step in STEPS]


def run_trial(study: optuna.Study, curve: list[float]) -> tuple[str, int]:
    """One trial reporting ``curve`` as the tuning's trainings report their step evaluations; (state, last step)."""
    trial = study.ask()
    pruning = PruneOnStepEvaluations(trial, VAL_STEP_TOP1)
    for step, top1 in zip(STEPS, curve, strict=True):
        try:
            pruning.on_step_evaluation({STEP_KEY: step, VAL_STEP_TOP1: top1})
        except optuna.TrialPruned:
            study.tell(trial, state=TrialState.PRUNED)
            return "PRUNED", step
    study.tell(trial, 1 - curve[-1])
    return "COMPLETE", step


# where each pruner stops the three trailing trials: median at the first step evaluation; successive halving at its
# first rung, 460 // 9 + 1 = 52 steps (the evaluation at 60); Hyperband at its bracket's first rung, 20, 60 or 180
# steps (brackets 0, 1, 2 of floor(log3(460 / 20)) + 1 = 3: trials 6, 7, 8 of study/baseline fall in 1, 0, 2)
PRUNED_AT = {"median": [20, 20, 20], "successive_halving": [60, 60, 60], "hyperband": [60, 20, 180]}


@pytest.mark.parametrize("pruner", sorted(PRUNED_AT))
def test_a_trial_that_trails_is_stopped_early_and_the_leaders_run_to_the_end(pruner):
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    study = optuna.create_study(
        study_name="study/baseline",  # Hyperband puts a trial in a bracket by its study's name and its number
        direction="minimize",
        sampler=optuna.samplers.RandomSampler(seed=0),
        pruner=create_pruner(pruner, eval_every_steps=EVAL_EVERY_STEPS),
    )
    # each better than the one before: none trails
    leaders = [run_trial(study, accuracies(final)) for final in (0.70, 0.72, 0.74, 0.76, 0.78, 0.80)]
    assert leaders == [("COMPLETE", STEPS[-1])] * len(leaders)
    # flat at chance: stopped early on
    trailing = [run_trial(study, [0.1] * len(STEPS)) for _ in range(3)]
    assert trailing == [("PRUNED", step) for step in PRUNED_AT[pruner]]
    assert run_trial(study, accuracies(0.85)) == ("COMPLETE", STEPS[-1])


def test_successive_halving_judges_within_the_first_third_of_a_training_only():
    """Its rungs are at 52 and 156 steps of 460: a trial that trails only after that trains to the end (stopping
    it then would save little and lose a finished trial), and nothing is pruned before a trial completes."""
    study = optuna.create_study(direction="minimize", pruner=create_pruner("successive_halving", eval_every_steps=20))
    late_fall = [top1 if step <= 160 else 0.1 for step, top1 in zip(STEPS, accuracies(0.9), strict=True)]
    assert run_trial(study, [0.1] * len(STEPS)) == ("COMPLETE", STEPS[-1])  # the first: no training length yet
    assert run_trial(study, accuracies(0.8)) == ("COMPLETE", STEPS[-1])
    assert run_trial(study, late_fall) == ("COMPLETE", STEPS[-1])


def test_without_a_pruner_every_trial_runs_to_the_end():
    study = optuna.create_study(direction="minimize", pruner=create_pruner("none", eval_every_steps=EVAL_EVERY_STEPS))
    assert [run_trial(study, curve)[0] for curve in (accuracies(0.8), [0.1] * len(STEPS))] == ["COMPLETE"] * 2
