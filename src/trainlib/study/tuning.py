"""Tuning at equal effort inside the study (AlgoPerf's external tuning, with Optuna).

Every tuned training gets the same number of trials (``TuningParams.trials``), each drawn by a seeded sampler from
its own search space (``TuningParams.spaces``: ranges over keys of its section, ``lr.peak``, ``weight_decay``,
...). A tuned training is named by its result row: the image recipes' one each, and thor_bert's two (``thor_bert``,
THOR, and ``thor_bert_control``), tuned one after the other, each with its own trials and Optuna study. A trial is
an ordinary study training of the recipe whose section holds the sampled values (thor_bert's trials train their own
row alone), on the tuning seeds (never the study's): its result files make a killed run resume, and its MLflow
child run is tagged ``trial``, ``trial_state`` and, for a failure, ``trial_error``. Its value, minimised, is the
steps to the study's target (``target.top1``; thor_bert's: ``thor_bert.target_mlm_accuracy``, masked-LM accuracy),
averaged over the tuning seeds; a seed that misses the target counts ``total steps + 1 + (1 - final accuracy)``, so
every trial that reached the target ranks first, the rest by their final accuracy. A trial
whose training diverges (``FloatingPointError``: ``NonFiniteLossError``, THOR's ``ThorInverseError`` and
``ThorDivergenceError``) is a FAIL trial naming its error and the tuning goes on; a pruned one stops at a step
evaluation its pruner rules out (``pruner``: ``median``, ``successive_halving``, ``hyperband``;
``create_pruner``). The best trial's values (thor_bert: both
trainings' best) are then trained on the study's seeds, fresh, for the paired intervals the study reports.

Each tuned training's trials are one Optuna study, ``<name>/<result>``, in ``storage`` (an RDB URL): any number of
processes, on any machines, given the same storage share it and split its budget. The budget counts every
COMPLETE, PRUNED, RUNNING and failed trial across the processes (a process starts a trial only while fewer than
``trials`` are counted, and gives back one that raced past the budget); a process whose budget is counted waits
for the other processes' running trials before choosing the best. Optuna's ``MaxTrialsCallback`` counts finished
trials only, so two processes would each start one past the budget.

A running trial records a heartbeat in the storage every ``heartbeat_interval`` seconds. One whose process died
(kill -9, a machine lost) is failed without an error, so not counted, by the first process to notice: any process
once its heartbeat is ``grace_period`` seconds old (Optuna's ``fail_stale_trials``), or a rerun on its own machine
at once (its pid is gone). Its values are enqueued again (Optuna's ``RetryHeartbeatStaleTrialCallback``, up to
``max_retry`` times), so the next trial trains them (on the same machine, resuming the killed training from its
checkpoints), and its tracking runs end FAILED. Each trial runs through Optuna's ``Study.optimize`` (``n_trials=1``
inside this module's budget loop, which counts across processes): it asks, beats the heartbeat, fails stale trials
and tells the outcome, with Optuna's public API only.

This module imports Optuna, never Kedro or MLflow (tracking comes in as ``StudyTracking``).
"""

from __future__ import annotations

import logging
import os
import socket
import time
import warnings
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, replace

import optuna
from matplotlib.figure import Figure
from optuna.exceptions import ExperimentalWarning, UpdateFinishedTrialError
from optuna.storages import RetryHeartbeatStaleTrialCallback
from optuna.trial import FrozenTrial, Trial, TrialState

from trainlib.engine.callbacks import Callback
from trainlib.metrics import STEP_KEY, VAL_STEP_MLM_ACCURACY, VAL_STEP_TOP1
from trainlib.params import TuningParams, space_ranges
from trainlib.params.recipe_spec import RESULT_KEY, recipe_of_row, row_sections, tuned_trainings
from trainlib.processes import process_alive
from trainlib.study.runner import RecipeTrainer, StudyPlan, StudyTracking, run_study
from trainlib.study.statistics import first_crossing
from trainlib.study.tuning_search import PruneOnStepEvaluations, create_pruner, create_sampler, draw_values
from trainlib.study.tuning_storage import open_storage

logger = logging.getLogger(__name__)

# the step evaluation whose target a tuned training's objective counts steps to (by its recipe's task), and the final
# figure that orders the trials that missed it
TASK_STEP_METRIC = {"image_classification": VAL_STEP_TOP1, "masked_lm": VAL_STEP_MLM_ACCURACY}
FINAL_ACCURACY = {VAL_STEP_TOP1: "final_top1", VAL_STEP_MLM_ACCURACY: "final_mlm_accuracy"}
# what makes a trial FAIL and lets the tuning go on: the training diverged (a bug still stops the study)
TRIAL_FAILURES = (FloatingPointError,)
HOST = socket.gethostname()
ERROR_ATTR = "error"  # a trial's user attribute: the name of the error that failed its training
RUN_IDS_ATTR = "run_ids"  # a trial's user attribute: its trainings' tracking runs, ended FAILED if its process dies
RUNNING_POLL_S = 5  # how often a process done with its share looks again at the other processes' running trials
DEAD_TRIAL_ERROR = "stale"  # the trial_error tag of a trial whose process died (Optuna: heartbeat-stale)
_STATES = (TrialState.COMPLETE, TrialState.PRUNED, TrialState.FAIL, TrialState.RUNNING)  # the states reported


@dataclass(frozen=True)
class ResultTuning:
    """One tuned training's tuning (``result``: its result row, ``recipe_spec.tuned_trainings``): its Optuna study's
    name, the chosen (best) values beside the section's own, its trials by state (every process's), the best value,
    and this process's wall time and all trials' time."""

    result: str
    study_name: str
    chosen: Mapping[str, float]
    documented: Mapping[str, float]
    trials: Mapping[str, int]  # COMPLETE, PRUNED, FAIL, RUNNING
    best_trial: int
    best_value: float
    wall_time_s: float
    trials_time_s: float


def step_metric(row: str) -> str:
    """The step evaluation a tuned result row's objective counts steps to target on."""
    return TASK_STEP_METRIC[recipe_of_row()[row].task]


def run_tuned_study(
    trainer: RecipeTrainer,
    plan: StudyPlan,
    tracking: StudyTracking,
    *,
    tuning: TuningParams,
    targets: Mapping[str, float],
) -> tuple[list[dict], list[ResultTuning]]:
    """Tune every training of the plan's recipes (``targets``: each step metric's target), then train each recipe
    with its trainings' best values on the plan's seeds: the study's records (``run_study``'s, fresh seeds only)
    and each training's tuning."""
    records, tunings = [], []
    for recipe in plan.recipes:
        chosen: dict[str, object] = {}
        for training in tuned_trainings()[recipe]:
            tuned = tune_result(training, trainer, plan, tracking, tuning=tuning, target=targets[step_metric(training)])
            logger.info(
                "tuning %s: trial %d of %d chose %s (documented %s); %s; %.0f s here, %.0f s in all trials",
                training,
                tuned.best_trial,
                tuning.trials,
                _values_text(tuned.chosen),
                _values_text(tuned.documented),
                ", ".join(f"{n} {state}" for state, n in tuned.trials.items() if n),
                tuned.wall_time_s,
                tuned.trials_time_s,
            )
            tunings.append(tuned)
            chosen |= with_values(training, tuned.chosen)
        records += run_study(trainer, replace(plan, recipes=[recipe], values={**plan.values, **chosen}), tracking)
    return records, tunings


def tune_result(
    result: str,
    trainer: RecipeTrainer,
    plan: StudyPlan,
    tracking: StudyTracking,
    *,
    tuning: TuningParams,
    target: float,
) -> ResultTuning:
    """Run trials of ``result`` (a tuned training's result row, ``recipe_spec.tuned_trainings``) until its Optuna
    study counts ``tuning.trials`` (every process's), then its best."""
    ranges = space_ranges(tuning.spaces[result])
    on_dead_trial = RetryDeadTrial(tracking, max_retry=tuning.max_retry)
    study = open_study(result, tuning=tuning, on_dead_trial=on_dead_trial, eval_every_steps=plan.eval_every_steps)
    _release_abandoned(study, on_dead_trial)
    started = time.monotonic()
    waiting = False
    run_trial = _TrialObjective(result, ranges, trainer, plan, tracking, tuning=tuning, target=target)
    while True:
        _fail_stale_trials(study)
        counted = _counted(study)
        if len(counted) >= tuning.trials:
            running = sum(t.state == TrialState.RUNNING for t in counted)
            if not running:
                break
            if not waiting:
                logger.info("tuning %s: waiting for the trials running in other processes (%d)", result, running)
                waiting = True
            # each either ends, or goes stale and its values come back to this loop
            time.sleep(min(tuning.heartbeat_interval, RUNNING_POLL_S))
            continue
        # Optuna's own loop, one trial at a time (this loop keeps the budget, counted across processes): it asks (a
        # dead trial's values first), beats the trial's heartbeat, and tells PRUNED, FAIL or the value
        study.optimize(run_trial, n_trials=1, catch=(*TRIAL_FAILURES, _PastTheBudget))
    wall_time_s = time.monotonic() - started
    trials = study.get_trials(deepcopy=False)
    complete = [t for t in trials if t.state == TrialState.COMPLETE]
    if not complete:
        failures = sorted({t.user_attrs.get(ERROR_ATTR, "abandoned") for t in trials if t.state == TrialState.FAIL})
        raise ValueError(
            f"study.tuning: no trial of {result} completed in {study.study_name!r} ({len(trials)} trials; failures: "
            f"{', '.join(failures) or 'none'}); narrow study.tuning.spaces.{result} "
            "(conf/base/parameters_study.yml) or raise study.tuning.trials"
        )
    best = min(complete, key=lambda t: t.value)
    return ResultTuning(
        result=result,
        study_name=study.study_name,
        chosen={key: best.params[key] for key in ranges},
        documented={key: trainer.configured(f"{row_sections()[result]}.{key}") for key in ranges},
        trials={state.name: sum(t.state == state for t in trials) for state in _STATES},
        best_trial=best.number,
        best_value=float(best.value),
        wall_time_s=wall_time_s,
        trials_time_s=sum(t.duration.total_seconds() for t in trials if t.duration is not None),
    )


def study_name(result: str, *, tuning: TuningParams) -> str:
    """The Optuna study of the tuned training whose result row is ``result``: ``<study.tuning.name>/<result>``."""
    return f"{tuning.name}/{result}"


def open_study(
    result: str, *, tuning: TuningParams, on_dead_trial: RetryDeadTrial, eval_every_steps: int
) -> optuna.Study:
    """The Optuna study of result row ``result``'s tuning in the storage (created by the first process to ask),
    minimising the objective, with ``tuning``'s heartbeats and pruner (on step evaluations every
    ``eval_every_steps`` steps); ``on_dead_trial`` is called with each trial this process fails as dead."""
    # our own log lines say what each trial did; Optuna's would add a traceback for each failed one
    optuna.logging.set_verbosity(optuna.logging.ERROR)
    return optuna.create_study(
        storage=open_storage(tuning.storage, heartbeats=(tuning, on_dead_trial)),
        study_name=study_name(result, tuning=tuning),
        direction="minimize",
        sampler=create_sampler(tuning),
        pruner=create_pruner(tuning.pruner, eval_every_steps=eval_every_steps),
        load_if_exists=True,
    )


def load_study(result: str, *, tuning: TuningParams) -> optuna.Study:
    """The existing Optuna study of result row ``result``'s tuning (its figures)."""
    return optuna.load_study(study_name=study_name(result, tuning=tuning), storage=open_storage(tuning.storage))


def objective(records: Sequence[Mapping], *, target: float, epochs: int) -> float:
    """Mean over the tuning seeds' records of the steps to ``target`` (of each record's ``step_metric``: top-1, or
    masked-LM accuracy); a seed that missed it counts its total steps + 1 + (1 - final accuracy), after every seed
    that reached it, ordered by its final accuracy."""
    values = []
    for record in records:
        metric = record.get("step_metric", VAL_STEP_TOP1)
        crossing = first_crossing(record["step_history"], target, metric)
        total = record["steps_per_epoch"] * epochs
        values.append(float(crossing[STEP_KEY]) if crossing else total + 1 + (1 - record[FINAL_ACCURACY[metric]]))
    return sum(values) / len(values)


def with_values(result: str, values: Mapping[str, object]) -> dict[str, object]:
    """``values`` (keys of the section result row ``result`` trains with: ``lr.peak``) under their whole dotted keys
    (``recipe_spec.row_sections``: ``thor_bert.thor.lr.peak``), as a study plan's ``values``."""
    section = row_sections()[result]
    return {f"{section}.{key}": value for key, value in values.items()}


def choices_rows(tunings: Sequence[ResultTuning], *, tuning: TuningParams) -> list[dict]:
    """Per tuned training (column ``result``: its result row) and tuned key: the documented (configured) and chosen
    value, with the budget it was chosen at."""
    return [
        {
            RESULT_KEY: tuned.result,
            "key": key,
            "documented": tuned.documented[key],
            "chosen": tuned.chosen[key],
            "trials": tuning.trials,
            **{state.lower(): n for state, n in tuned.trials.items()},
            "best_trial": tuned.best_trial,
            "best_value": tuned.best_value,
            "wall_time_s": round(tuned.wall_time_s, 1),
            "trials_time_s": round(tuned.trials_time_s, 1),
            "study_name": tuned.study_name,
        }
        for tuned in tunings
        for key in tuned.chosen
    ]


CHOICE_COLUMNS = [
    RESULT_KEY,
    "key",
    "documented",
    "chosen",
    "trials",
    "complete",
    "pruned",
    "fail",
    "running",
    "best_trial",
    "best_value",
    "wall_time_s",
    "trials_time_s",
    "study_name",
]


def tuning_figures(results: Sequence[str], *, tuning: TuningParams) -> tuple[dict[str, Figure], dict[str, Figure]]:
    """Optuna's optimization history and parameter importances of each tuned training's study (``results``: their
    result rows), as ``<result>.png`` figures; importances need completed trials of two different values (a training
    without has none, and the log says so)."""
    histories, importances = {}, {}
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", ExperimentalWarning)
        for result in results:
            study = load_study(result, tuning=tuning)
            histories[f"{result}.png"] = _titled(
                optuna.visualization.matplotlib.plot_optimization_history(study), f"{result}: objective by trial"
            )
            values = {t.value for t in study.get_trials(deepcopy=False, states=(TrialState.COMPLETE,))}
            if len(values) < 2:
                # Optuna's importances compare the best trials with the rest: with one value there is no rest
                logger.info(
                    "tuning %s: no parameter importances (the completed trials score %s; they need two different "
                    "values)",
                    result,
                    f"{values.pop():.6g} each" if values else "nothing",
                )
                continue
            importances[f"{result}.png"] = _titled(
                optuna.visualization.matplotlib.plot_param_importances(study), f"{result}: parameter importances"
            )
    return histories, importances


def _titled(axes, title: str) -> Figure:
    axes.set_title(title)
    figure = axes.figure
    figure.tight_layout()
    return figure


def _counted(study: optuna.Study) -> list[FrozenTrial]:
    """The trials the budget counts: finished, running, and failed by their training (not those given back)."""
    return [
        trial
        for trial in study.get_trials(deepcopy=False)
        if trial.state in (TrialState.COMPLETE, TrialState.PRUNED, TrialState.RUNNING)
        or (trial.state == TrialState.FAIL and ERROR_ATTR in trial.user_attrs)
    ]


def _release_abandoned(study: optuna.Study, on_dead_trial: RetryDeadTrial) -> None:
    """Trials left RUNNING by a killed process of this machine, failed at once (not after the grace period), as
    Optuna fails a stale one: their values run again (the next trial, resuming from the killed training's
    checkpoints)."""
    for trial in study.get_trials(deepcopy=False, states=(TrialState.RUNNING,)):
        pid = trial.user_attrs.get("pid")
        if trial.user_attrs.get("host") == HOST and isinstance(pid, int) and not process_alive(pid):
            try:
                study.tell(trial.number, state=TrialState.FAIL)
            except (ValueError, UpdateFinishedTrialError):
                continue  # another process failed it first
            on_dead_trial(study, trial)


def _fail_stale_trials(study: optuna.Study) -> None:
    """Fail the trials whose heartbeat is ``grace_period`` old (each then goes to ``RetryDeadTrial``)."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", ExperimentalWarning)
        optuna.storages.fail_stale_trials(study)


class RetryDeadTrial:
    """What follows a trial failed because its process died: its values enqueued again (Optuna's
    ``RetryHeartbeatStaleTrialCallback``, up to ``max_retry`` times) and its tracking runs ended FAILED."""

    def __init__(self, tracking: StudyTracking, *, max_retry: int):
        self._tracking = tracking
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", ExperimentalWarning)
            self._retry = RetryHeartbeatStaleTrialCallback(max_retry=max_retry)
        self._max_retry = max_retry

    def __call__(self, study: optuna.Study, trial: FrozenTrial) -> None:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", ExperimentalWarning)
            self._retry(study, trial)
            retried = len(RetryHeartbeatStaleTrialCallback.retry_history(trial)) < self._max_retry
        self._tracking.fail_runs(trial.user_attrs.get(RUN_IDS_ATTR, []), error=DEAD_TRIAL_ERROR)
        logger.warning(
            "tuning: trial %d of %s stopped with its process (%s on %s); %s",
            trial.number,
            study.study_name,
            trial.user_attrs.get("pid"),
            trial.user_attrs.get("host"),
            "its values run again" if retried else f"retried {self._max_retry} times: new values take its place",
        )


class _PastTheBudget(Exception):
    """A trial asked after another process took the budget's last one at the same moment: failed without an error,
    so given back (not counted)."""


class _TrialObjective:
    """One trial of a tuned training, as ``study.optimize`` calls it: the trial marked with this process and machine
    (whoever finds them dead retries its values), its values drawn (``draw_values``), the training's study over the
    tuning seeds, its objective returned. A diverged training is a FAIL naming its error (``TRIAL_FAILURES``); a
    pruned one raises ``TrialPruned``."""

    def __init__(
        self,
        result: str,
        ranges: Mapping[str, Sequence[float]],
        trainer: RecipeTrainer,
        plan: StudyPlan,
        tracking: StudyTracking,
        *,
        tuning: TuningParams,
        target: float,
    ):
        self.result, self.ranges, self.trainer, self.plan, self.tracking = result, ranges, trainer, plan, tracking
        self.tuning, self.target = tuning, target

    def __call__(self, trial: Trial) -> float:
        # a retried trial arrives with the dead one's attributes: this process's replace them
        trial.set_user_attr("host", HOST)
        trial.set_user_attr("pid", os.getpid())
        trial.set_user_attr(RUN_IDS_ATTR, [])
        if sorted(t.number for t in _counted(trial.study)).index(trial.number) >= self.tuning.trials:
            raise _PastTheBudget(f"trial {trial.number}")
        result, values = self.result, draw_values(trial, self.ranges, tuning=self.tuning)
        trial_tracking = TrialTracking(
            self.tracking, trial, values, pruning=self.tuning.pruner != "none", step_metric=step_metric(result)
        )
        trial_plan = replace(
            self.plan,
            recipes=[recipe_of_row()[result].name],
            seeds=list(self.tuning.seeds),
            results=[result],
            values={**self.plan.values, **with_values(result, values)},
        )
        try:
            records = run_study(self.trainer, trial_plan, trial_tracking)
        except optuna.TrialPruned:
            logger.info("tuning %s: trial %d pruned (%s)", result, trial.number, _values_text(values))
            raise
        except TRIAL_FAILURES as error:
            trial.set_user_attr(ERROR_ATTR, type(error).__name__)
            logger.warning("tuning %s: trial %d failed, %s: %s", result, trial.number, type(error).__name__, error)
            raise
        value = objective(records, target=self.target, epochs=self.plan.epochs)
        logger.info("tuning %s: trial %d (%s): %.4g", result, trial.number, _values_text(values), value)
        return value


class TrialTracking:
    """A study's tracking for one trial's trainings: each child run named as the study names it
    (``runner.training_title``) with the trial before the seed, ``baseline/trial<N>/seed<S>``, with the sampled
    values as ``tuning.<key>`` parameters and the tags ``trial``, ``tuning_study``, ``trial_state`` (COMPLETE,
    PRUNED, FAIL) and ``trial_error`` (a failure's error name); the pruner's reports on the first training's step
    evaluations of ``step_metric``."""

    def __init__(
        self, tracking: StudyTracking, trial: Trial, values: Mapping[str, float], *, pruning: bool, step_metric: str
    ):
        self._tracking, self._trial, self._values, self._pruning = tracking, trial, dict(values), pruning
        self._step_metric = step_metric
        self._trainings = 0

    @contextmanager
    def run(self, name: str, tags: Mapping[str, str], params: Mapping[str, object]) -> Iterator[str | None]:
        rest, _, seed = name.rpartition("/")
        tags = {**tags, "trial": str(self._trial.number), "tuning_study": self._trial.study.study_name}
        with self._tracking.run(
            f"{rest}/trial{self._trial.number}/{seed}", tags, {**params, "tuning": self._values}
        ) as run_id:
            if run_id is not None:  # so that whoever finds this trial's process dead ends its run
                runs = self._trial.user_attrs.get(RUN_IDS_ATTR, [])
                self._trial.set_user_attr(RUN_IDS_ATTR, [*runs, run_id])
            try:
                yield run_id
            except optuna.TrialPruned:
                self._tracking.set_tags({"trial_state": "PRUNED"})
                raise
            except BaseException as error:
                self._tracking.set_tags({"trial_state": "FAIL", "trial_error": type(error).__name__})
                raise
            self._tracking.set_tags({"trial_state": "COMPLETE"})
        self._trainings += 1

    def callbacks(self) -> list[Callback]:
        pruning = (
            [PruneOnStepEvaluations(self._trial, self._step_metric)] if self._pruning and self._trainings == 0 else []
        )
        return [*self._tracking.callbacks(), *pruning]

    def log_final(self, accuracy: Mapping[str, float]) -> None:
        self._tracking.log_final(accuracy)

    def set_tags(self, tags: Mapping[str, str]) -> None:
        self._tracking.set_tags(tags)


def _values_text(values: Mapping[str, float]) -> str:
    return ", ".join(f"{key} {value:.4g}" for key, value in values.items())
