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

Each tuned training's trials are one Optuna study, ``<name>/<recipe>``, in ``storage`` (an RDB URL): any number of
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
checkpoints), and its tracking runs end FAILED. Optuna's ``Study.optimize`` does the heartbeats and the stale check
itself; this loop asks and tells trials itself (its budget counts across processes), so it does them too.

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
from pathlib import Path

import optuna
import sqlalchemy.exc
from matplotlib.figure import Figure
from optuna.exceptions import ExperimentalWarning, UpdateFinishedTrialError
from optuna.storages import RetryHeartbeatStaleTrialCallback
from optuna.storages._heartbeat import get_heartbeat_thread
from optuna.trial import FrozenTrial, Trial, TrialState

from trainlib.engine.callbacks import Callback
from trainlib.metrics import STEP_KEY, VAL_STEP_MLM_ACCURACY, VAL_STEP_TOP1
from trainlib.params import TUNED_TRAININGS, TuningParams, space_ranges
from trainlib.processes import process_alive
from trainlib.redaction import redact
from trainlib.study.runner import StudyInputs, StudyPlan, StudyTracking, run_study
from trainlib.study.statistics import first_crossing

logger = logging.getLogger(__name__)

# keys sampled on a log scale, and as integers; the rest (warm-up epochs) uniformly
LOG_SCALE = ("lr.peak", "damping.peak", "weight_decay")
INTEGER = ("frequency", "lr.warmup_steps")
# the section a tuned training's values go into (dotted in StudyInputs): thor_first_order is the thor section
# without its preconditioner
SECTION = {
    "baseline": "baseline",
    "thor": "thor",
    "thor_first_order": "thor",
    "thor_bert": "thor_bert.thor",
    "thor_bert_control": "thor_bert.control",
}
# the study recipe that trains a tuned training
RECIPE = {training: recipe for recipe, trainings in TUNED_TRAININGS.items() for training in trainings}
# the step evaluation whose target a tuned training's objective counts steps to, and the final figure that orders
# the trials that missed it
STEP_METRIC = {
    training: VAL_STEP_MLM_ACCURACY if RECIPE[training] == "thor_bert" else VAL_STEP_TOP1 for training in RECIPE
}
FINAL_ACCURACY = {VAL_STEP_TOP1: "final_top1", VAL_STEP_MLM_ACCURACY: "final_mlm_accuracy"}
# what makes a trial FAIL and lets the tuning go on: the training diverged (a bug still stops the study)
TRIAL_FAILURES = (FloatingPointError,)
HOST = socket.gethostname()
SCHEMA_ATTEMPTS = 5  # opening a new storage that other processes create at the same moment
ERROR_ATTR = "error"  # a trial's user attribute: the name of the error that failed its training
RUN_IDS_ATTR = "run_ids"  # a trial's user attribute: its trainings' tracking runs, ended FAILED if its process dies
RUNNING_POLL_S = 5  # how often a process done with its share looks again at the other processes' running trials
DEAD_TRIAL_ERROR = "stale"  # the trial_error tag of a trial whose process died (Optuna: heartbeat-stale)
_STATES = (TrialState.COMPLETE, TrialState.PRUNED, TrialState.FAIL, TrialState.RUNNING)  # the states reported
REDUCTION_FACTOR = 3  # successive halving's and hyperband's: a third of the trials at a rung go on (Optuna's default)


@dataclass(frozen=True)
class RecipeTuning:
    """One recipe's tuning: its Optuna study's name, the chosen (best) values beside the section's own, its
    trials by state (every process's), the best value, and this process's wall time and all trials' time."""

    recipe: str
    study_name: str
    chosen: Mapping[str, float]
    documented: Mapping[str, float]
    trials: Mapping[str, int]  # COMPLETE, PRUNED, FAIL, RUNNING
    best_trial: int
    best_value: float
    wall_time_s: float
    trials_time_s: float


def run_tuned_study(
    inputs: StudyInputs,
    plan: StudyPlan,
    tracking: StudyTracking,
    *,
    tuning: TuningParams,
    targets: Mapping[str, float],
) -> tuple[list[dict], list[RecipeTuning]]:
    """Tune every training of the plan's recipes (``targets``: each step metric's target), then train each recipe
    with its trainings' best values on the plan's seeds: the study's records (``run_study``'s, fresh seeds only)
    and each training's tuning."""
    records, tunings = [], []
    for recipe in plan.recipes:
        chosen = inputs
        for training in TUNED_TRAININGS[recipe]:
            tuned = tune_recipe(training, inputs, plan, tracking, tuning=tuning, target=targets[STEP_METRIC[training]])
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
            chosen = with_values(chosen, training, tuned.chosen)
        records += run_study(chosen, replace(plan, recipes=[recipe]), tracking)
    return records, tunings


def tune_recipe(
    recipe: str, inputs: StudyInputs, plan: StudyPlan, tracking: StudyTracking, *, tuning: TuningParams, target: float
) -> RecipeTuning:
    """Run trials of ``recipe`` (a tuned training, ``SECTION``) until its Optuna study counts ``tuning.trials``
    (every process's), then its best."""
    ranges = space_ranges(tuning.spaces[recipe])
    on_dead_trial = RetryDeadTrial(tracking, max_retry=tuning.max_retry)
    study = open_study(recipe, tuning=tuning, on_dead_trial=on_dead_trial, eval_every_steps=plan.eval_every_steps)
    _release_abandoned(study, on_dead_trial)
    started = time.monotonic()
    waiting = False
    while True:
        _fail_stale_trials(study)
        counted = _counted(study)
        if len(counted) >= tuning.trials:
            running = sum(t.state == TrialState.RUNNING for t in counted)
            if not running:
                break
            if not waiting:
                logger.info("tuning %s: waiting for the trials running in other processes (%d)", recipe, running)
                waiting = True
            # each either ends, or goes stale and its values come back to this loop
            time.sleep(min(tuning.heartbeat_interval, RUNNING_POLL_S))
            continue
        trial, values = draw_trial(study, ranges, tuning=tuning)
        if sorted(t.number for t in _counted(study)).index(trial.number) >= tuning.trials:
            study.tell(trial, state=TrialState.FAIL)  # another process took the last trial at the same moment
            continue
        # Study.optimize's own heartbeat thread (Optuna has no public handle on it for an ask-and-tell loop)
        with get_heartbeat_thread(trial._trial_id, study._storage):
            _run_trial(study, trial, recipe, values, inputs, plan, tracking, tuning=tuning, target=target)
    wall_time_s = time.monotonic() - started
    trials = study.get_trials(deepcopy=False)
    complete = [t for t in trials if t.state == TrialState.COMPLETE]
    if not complete:
        failures = sorted({t.user_attrs.get(ERROR_ATTR, "abandoned") for t in trials if t.state == TrialState.FAIL})
        raise ValueError(
            f"study.tuning: no trial of {recipe} completed in {study.study_name!r} ({len(trials)} trials; failures: "
            f"{', '.join(failures) or 'none'}); narrow study.tuning.spaces.{recipe} "
            "(conf/base/parameters_study.yml) or raise study.tuning.trials"
        )
    best = min(complete, key=lambda t: t.value)
    section = _section(inputs, recipe)
    return RecipeTuning(
        recipe=recipe,
        study_name=study.study_name,
        chosen={key: best.params[key] for key in ranges},
        documented={key: _value_of(section, key) for key in ranges},
        trials={state.name: sum(t.state == state for t in trials) for state in _STATES},
        best_trial=best.number,
        best_value=float(best.value),
        wall_time_s=wall_time_s,
        trials_time_s=sum(t.duration.total_seconds() for t in trials if t.duration is not None),
    )


def study_name(recipe: str, *, tuning: TuningParams) -> str:
    return f"{tuning.name}/{recipe}"


def open_study(
    recipe: str, *, tuning: TuningParams, on_dead_trial: RetryDeadTrial, eval_every_steps: int
) -> optuna.Study:
    """``recipe``'s Optuna study in the storage (created by the first process to ask), minimising the objective,
    with ``tuning``'s heartbeats and pruner (on step evaluations every ``eval_every_steps`` steps); ``on_dead_trial``
    is called with each trial this process fails as dead."""
    optuna.logging.set_verbosity(optuna.logging.WARNING)  # our own log lines say what each trial did
    return optuna.create_study(
        storage=_storage(tuning.storage, heartbeats=(tuning, on_dead_trial)),
        study_name=study_name(recipe, tuning=tuning),
        direction="minimize",
        sampler=_sampler(tuning),
        pruner=create_pruner(tuning.pruner, eval_every_steps=eval_every_steps),
        load_if_exists=True,
    )


def load_study(recipe: str, *, tuning: TuningParams) -> optuna.Study:
    """``recipe``'s existing Optuna study (its figures)."""
    return optuna.load_study(study_name=study_name(recipe, tuning=tuning), storage=_storage(tuning.storage))


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


def with_values(inputs: StudyInputs, recipe: str, values: Mapping[str, float]) -> StudyInputs:
    """The study's inputs with ``values`` (dotted keys of the tuned training's section: ``lr.peak``) in that
    section (``SECTION``: ``thor_bert.thor`` is the thor section of ``inputs.thor_bert``)."""
    section = _section(inputs, recipe)
    update: dict = {}
    for key, value in values.items():
        head, _, leaf = key.partition(".")
        update[head] = update.get(head, getattr(section, head)).model_copy(update={leaf: value}) if leaf else value
    updated = section.model_copy(update=update)
    outer, _, inner = SECTION[recipe].partition(".")
    if inner:
        updated = getattr(inputs, outer).model_copy(update={inner: updated})
    return replace(inputs, **{outer: updated})


def choices_rows(tunings: Sequence[RecipeTuning], *, tuning: TuningParams) -> list[dict]:
    """Per recipe and tuned key: the documented (configured) and chosen value, with the budget it was chosen at."""
    return [
        {
            "recipe": tuned.recipe,
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
    "recipe",
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


def tuning_figures(recipes: Sequence[str], *, tuning: TuningParams) -> tuple[dict[str, Figure], dict[str, Figure]]:
    """Optuna's optimization history and parameter importances of each recipe's study, as ``<recipe>.png``
    figures; importances need two completed trials (a recipe with fewer has none, and the log says so)."""
    histories, importances = {}, {}
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", ExperimentalWarning)
        for recipe in recipes:
            study = load_study(recipe, tuning=tuning)
            histories[f"{recipe}.png"] = _titled(
                optuna.visualization.matplotlib.plot_optimization_history(study), f"{recipe}: objective by trial"
            )
            complete = sum(t.state == TrialState.COMPLETE for t in study.get_trials(deepcopy=False))
            if complete < 2:
                logger.info(
                    "tuning %s: no parameter importances (%d completed trial; they need 2 or more)", recipe, complete
                )
                continue
            importances[f"{recipe}.png"] = _titled(
                optuna.visualization.matplotlib.plot_param_importances(study), f"{recipe}: parameter importances"
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


def _ask(study: optuna.Study) -> Trial:
    """A new trial (a dead one's values first, when enqueued), marked with this process and machine."""
    with warnings.catch_warnings():
        # Optuna warns that heartbeats are meant for Study.optimize: this loop records them itself
        warnings.filterwarnings("ignore", "Heartbeat of storage", UserWarning)
        trial = study.ask()
    # at once: a trial with no heartbeat yet is never found stale, so one killed here would be waited for forever
    study._storage.record_heartbeat(trial._trial_id)
    # a retried trial arrives with the dead one's attributes: this process's replace them
    trial.set_user_attr("host", HOST)
    trial.set_user_attr("pid", os.getpid())
    trial.set_user_attr(RUN_IDS_ATTR, [])
    return trial


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
        self._tracking.fail_runs(trial.user_attrs.get(RUN_IDS_ATTR, []), error=DEAD_TRIAL_ERROR)
        retried = len(trial.system_attrs.get("retry_history", [])) < self._max_retry
        logger.warning(
            "tuning: trial %d of %s stopped with its process (%s on %s); %s",
            trial.number,
            study.study_name,
            trial.user_attrs.get("pid"),
            trial.user_attrs.get("host"),
            "its values run again" if retried else f"retried {self._max_retry} times: new values take its place",
        )


def _run_trial(
    study: optuna.Study,
    trial: Trial,
    recipe: str,
    values: Mapping[str, float],
    inputs: StudyInputs,
    plan: StudyPlan,
    tracking: StudyTracking,
    *,
    tuning: TuningParams,
    target: float,
) -> None:
    trial_tracking = TrialTracking(
        tracking, trial, values, pruning=tuning.pruner != "none", step_metric=STEP_METRIC[recipe]
    )
    trial_plan = replace(plan, recipes=[RECIPE[recipe]], seeds=list(tuning.seeds), results=[recipe])
    try:
        records = run_study(with_values(inputs, recipe, values), trial_plan, trial_tracking)
    except optuna.TrialPruned:
        study.tell(trial, state=TrialState.PRUNED)
        logger.info("tuning %s: trial %d pruned (%s)", recipe, trial.number, _values_text(values))
        return
    except TRIAL_FAILURES as error:
        trial.set_user_attr(ERROR_ATTR, type(error).__name__)
        study.tell(trial, state=TrialState.FAIL)
        logger.warning("tuning %s: trial %d failed, %s: %s", recipe, trial.number, type(error).__name__, error)
        return
    except BaseException:
        study.tell(trial, state=TrialState.FAIL)  # no error attribute: given back, not counted
        raise
    value = objective(records, target=target, epochs=plan.epochs)
    study.tell(trial, value)
    logger.info("tuning %s: trial %d (%s): %.4g", recipe, trial.number, _values_text(values), value)


class TrialTracking:
    """A study's tracking for one trial's trainings: each child run named ``<recipe>/trial<N>/seed<S>``, with the
    sampled values as ``tuning.<key>`` parameters and the tags ``trial``, ``tuning_study``, ``trial_state``
    (COMPLETE, PRUNED, FAIL) and ``trial_error`` (a failure's error name); the pruner's reports on the first
    training's step evaluations of ``step_metric``."""

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
        pruning = [_Pruning(self._trial, self._step_metric)] if self._pruning and self._trainings == 0 else []
        return [*self._tracking.callbacks(), *pruning]

    def log_final(self, accuracy: Mapping[str, float]) -> None:
        self._tracking.log_final(accuracy)

    def set_tags(self, tags: Mapping[str, str]) -> None:
        self._tracking.set_tags(tags)


class _Pruning(Callback):
    """Reports each step evaluation's error (1 - its accuracy ``step_metric``) to the trial; stops the training when
    the pruner says."""

    def __init__(self, trial: Trial, step_metric: str):
        self._trial, self._step_metric = trial, step_metric

    def on_step_evaluation(self, row: Mapping[str, float]) -> None:
        step = int(row[STEP_KEY])
        self._trial.report(1 - row[self._step_metric], step)
        if self._trial.should_prune():
            raise optuna.TrialPruned(f"trial {self._trial.number} at step {step}")


def draw_trial(
    study: optuna.Study, ranges: Mapping[str, Sequence[float]], *, tuning: TuningParams
) -> tuple[Trial, dict[str, float]]:
    """A new trial and its values, drawn by ``tuning``'s sampler seeded with the trial's number: a process that
    resumes or joins a tuning draws what an uninterrupted process would give that trial. A sampler seeded once per
    process starts its sequence over, and drew trials 0 and 1's values again in a resumed tuning (measured);
    QMC's sequence already indexes by the trials in the storage."""
    trial = _ask(study)
    study.sampler = _sampler(tuning, trial_number=trial.number)
    return trial, {key: _suggest(trial, key, low, high) for key, (low, high) in ranges.items()}


def _suggest(trial: Trial, key: str, low: float, high: float) -> float:
    if key in INTEGER:
        return trial.suggest_int(key, int(low), int(high))
    return trial.suggest_float(key, low, high, log=key in LOG_SCALE)


def _section(inputs: StudyInputs, recipe: str):
    """The tuned training's section in ``inputs``."""
    section = inputs
    for name in SECTION[recipe].split("."):
        section = getattr(section, name)
    return section


def _value_of(section, key: str) -> float:
    head, _, leaf = key.partition(".")
    value = getattr(section, head)
    return getattr(value, leaf) if leaf else value


def _values_text(values: Mapping[str, float]) -> str:
    return ", ".join(f"{key} {value:.4g}" for key, value in values.items())


def _sampler(tuning: TuningParams, *, trial_number: int = 0) -> optuna.samplers.BaseSampler:
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
    (``_Pruning``: steps ``eval_every_steps``, twice that, ..., and the training's last step), so a resource is a
    number of training steps, and every trial of a study trains the same steps. ``successive_halving``:
    ``SuccessiveHalving`` (rungs at a ninth and a third of a training). ``hyperband``: Optuna's brackets of such rungs,
    the first from the first step evaluation on, up to the steps of the first completed trial; each trial falls in one
    bracket, and Optuna's sampler then learns from that bracket's trials only (docs/study.md#pruners)."""
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


class TuningStorageError(RuntimeError):
    """``study.tuning.storage`` names a database that cannot be opened (unreachable, refused, wrong password)."""


def storage_url(url: str) -> str:
    """``url`` as SQLAlchemy opens it: a bare ``postgresql://`` through psycopg (3), the driver the project locks
    (SQLAlchemy's default for it is psycopg2). With no password in the URL, libpq reads ``PGPASSWORD`` or
    ``~/.pgpass`` (docs/team.md)."""
    if url.startswith(("postgresql://", "postgres://")):
        return "postgresql+psycopg://" + url.split("://", 1)[1]
    return url


def _storage(url: str, heartbeats: tuple[TuningParams, RetryDeadTrial] | None = None) -> optuna.storages.RDBStorage:
    """An Optuna RDB storage; a SQLite file's folder is made, and its writers wait for each other's locks. With
    ``heartbeats``, its trials record them and a dead one's goes to the ``RetryDeadTrial``.

    Processes started together on a new storage all create its schema: the ones that lose that race get a
    duplicate key or "relation already exists" (``_schema_race``), and open the storage the winner made.
    A storage that cannot be opened at all stops the study with ``TuningStorageError``, the URL's password
    masked."""
    options: dict = {}
    if url.startswith("sqlite:///"):
        Path(url.removeprefix("sqlite:///")).parent.mkdir(parents=True, exist_ok=True)
        options["engine_kwargs"] = {"connect_args": {"timeout": 60}}
    if heartbeats is not None:
        tuning, on_dead_trial = heartbeats
        options |= {
            "heartbeat_interval": tuning.heartbeat_interval,
            "grace_period": tuning.grace_period,
            "heartbeat_stale_trial_callback": on_dead_trial,
        }
    attempt = 1
    while True:
        try:
            return _rdb_storage(url, options)
        except sqlalchemy.exc.DBAPIError as error:
            if attempt < SCHEMA_ATTEMPTS and _schema_race(url, error):
                attempt += 1
                continue
            reason = str(error.orig or error).strip().splitlines()[0]
            raise TuningStorageError(
                f"study.tuning.storage {redact(url)} cannot be opened: {redact(reason)}. Check the server, the "
                "user and the password (PGPASSWORD or conf/local/credentials.yml, docs/team.md)"
            ) from None


def _rdb_storage(url: str, options: Mapping) -> optuna.storages.RDBStorage:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", ExperimentalWarning)  # heartbeat_interval
        return optuna.storages.RDBStorage(storage_url(url), **options)


def _schema_race(url: str, error: sqlalchemy.exc.DBAPIError) -> bool:
    """Whether ``error`` may be another process creating the same schema, not a database that cannot be
    reached: a duplicate row or type (``IntegrityError``), a table "already exists" (PostgreSQL's
    ``DuplicateTable`` is a ``ProgrammingError``, SQLite's an ``OperationalError``), or any error of a SQLite file,
    whose writers lock each other out. Optuna's answer, creating the storage before starting the machines
    (optuna/optuna#1092), is one more step for every team; a retry needs none."""
    return (
        isinstance(error, sqlalchemy.exc.IntegrityError)
        or url.startswith("sqlite")
        or "already exists" in str(error.orig or error)
    )
