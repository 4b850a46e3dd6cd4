"""How a tuning searches: each trial's values drawn by a sampler seeded with the trial's number, on the scale each
key takes, and the pruner that stops a trailing trial at a step evaluation (``tuning`` runs the trials)."""

from __future__ import annotations

import warnings
from collections.abc import Mapping, Sequence

import optuna
from optuna.exceptions import ExperimentalWarning
from optuna.trial import FrozenTrial, Trial, TrialState

from trainlib.engine.callbacks import Callback
from trainlib.metrics import STEP_KEY
from trainlib.params import TuningParams

# keys sampled on a log scale, and as integers; the rest (warm-up epochs) uniformly
LOG_SCALE = ("lr.peak", "damping.peak", "weight_decay", "trust_coefficient")
INTEGER = ("frequency", "lr.warmup_steps")
REDUCTION_FACTOR = 3  # successive halving's and hyperband's: a third of the trials at a rung go on (Optuna's default)


def draw_values(trial: Trial, ranges: Mapping[str, Sequence[float]], *, tuning: TuningParams) -> dict[str, float]:
    """``trial``'s values, drawn by ``tuning``'s sampler seeded with the trial's number: a process that resumes or
    joins a tuning draws what an uninterrupted process would give that trial. A sampler seeded once per process
    starts its sequence over, and drew trials 0 and 1's values again in a resumed tuning (measured); QMC's sequence
    already indexes by the trials in the storage. A retried trial's values are the dead one's (Optuna enqueued
    them)."""
    trial.study.sampler = create_sampler(tuning, trial_number=trial.number)
    return {key: _suggest(trial, key, low, high) for key, (low, high) in ranges.items()}


def _suggest(trial: Trial, key: str, low: float, high: float) -> float:
    if key in INTEGER:
        return trial.suggest_int(key, int(low), int(high))
    return trial.suggest_float(key, low, high, log=key in LOG_SCALE)


def create_sampler(tuning: TuningParams, *, trial_number: int = 0) -> optuna.samplers.BaseSampler:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", ExperimentalWarning)
        if tuning.sampler == "qmc":
            return optuna.samplers.QMCSampler(seed=tuning.sampler_seed, scramble=True)
    # TPE's first half of a small budget at random (its default, 10, would leave nothing to model)
    return optuna.samplers.TPESampler(
        seed=tuning.sampler_seed + trial_number, n_startup_trials=max(1, tuning.trials // 2)
    )


def create_pruner(pruner: str, *, eval_every_steps: int) -> optuna.pruners.BasePruner:
    """The Optuna pruner ``study.tuning.pruner`` names. A trial reports each step evaluation's error at its step
    (``PruneOnStepEvaluations``: steps ``eval_every_steps``, twice that, ..., and the training's last step), so a
    resource is a number of training steps, and every trial of a study trains the same steps.
    ``successive_halving``: ``SuccessiveHalving`` (rungs at a ninth and a third of a training). ``hyperband``:
    Optuna's brackets of such rungs, the first from the first step evaluation on, up to the steps of the first
    completed trial; each trial falls in one bracket, and Optuna's sampler then learns from that bracket's trials
    only (docs/study.md#pruners)."""
    if pruner == "median":
        return optuna.pruners.MedianPruner(n_startup_trials=2)
    if pruner == "successive_halving":
        return SuccessiveHalving()
    if pruner == "hyperband":
        return optuna.pruners.HyperbandPruner(
            min_resource=eval_every_steps, max_resource="auto", reduction_factor=REDUCTION_FACTOR
        )
    return optuna.pruners.NopPruner()


class SuccessiveHalving(optuna.pruners.BasePruner):
    """Optuna's (asynchronous) ``SuccessiveHalvingPruner`` with reduction factor 3 and its rungs inside a training:
    at ``r`` and ``3 r`` steps with ``r = total // 9 + 1``, ``total`` the steps of the first completed trial (the
    study's training length, as Hyperband's ``max_resource: auto`` reads it). At each rung a trial goes on only if its
    error is among the best third of the trials that reached that rung so far (the first to reach it does). So a
    trial is judged after a ninth of a training, when the curves have parted (the first step evaluation, 4 % of the
    default study's, is noise: every trial near chance), and never at the training's end, where stopping saves
    nothing and loses a finished trial. Until a trial completes, none is pruned."""

    def __init__(self) -> None:
        self._pruner: optuna.pruners.SuccessiveHalvingPruner | None = None

    def prune(self, study: optuna.Study, trial: FrozenTrial) -> bool:
        if self._pruner is None:
            completed = study.get_trials(deepcopy=False, states=(TrialState.COMPLETE,))
            steps = [t.last_step for t in completed if t.last_step is not None]
            if not steps:
                return False
            first_rung = max(steps) // REDUCTION_FACTOR**2 + 1
            self._pruner = optuna.pruners.SuccessiveHalvingPruner(
                min_resource=first_rung, reduction_factor=REDUCTION_FACTOR
            )
        return self._pruner.prune(study, trial)


class PruneOnStepEvaluations(Callback):
    """Reports each step evaluation's error (1 - its accuracy ``step_metric``) to the trial; stops the training when
    the pruner says."""

    def __init__(self, trial: Trial, step_metric: str):
        self._trial, self._step_metric = trial, step_metric

    def on_step_evaluation(self, row: Mapping[str, float]) -> None:
        step = int(row[STEP_KEY])
        self._trial.report(1 - row[self._step_metric], step)
        if self._trial.should_prune():
            raise optuna.TrialPruned(f"trial {self._trial.number} at step {step}")
