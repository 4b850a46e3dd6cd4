"""``conf/base/parameters_study.yml``: the multi-seed comparison of recipes, and its tuning at equal effort."""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import Field, model_validator

from trainlib.params.base import Section
from trainlib.params.choices import Pruner
from trainlib.params.errors import CrossKeyProblems
from trainlib.params.numbers import NonNegativeFloat, NonNegativeInt, PositiveFloat, PositiveInt
from trainlib.params.recipe_spec import recipe_specs, rows, tuned_trainings, unknown_names

# [low, high] of a knob a tuning samples: log-uniform (learning rates, damping, weight decay), uniform (warm-up
# epochs), integers (warm-up steps, THOR's frequency)
LogRange = Annotated[list[PositiveFloat], Field(min_length=2, max_length=2)]
LinearRange = Annotated[list[NonNegativeFloat], Field(min_length=2, max_length=2)]
StepRange = Annotated[list[NonNegativeInt], Field(min_length=2, max_length=2)]
FrequencyRange = Annotated[list[Annotated[int, Field(ge=2)]], Field(min_length=2, max_length=2)]


class ScheduleSpace(Section):
    """The keys of a schedule (``<recipe>.lr``, ``thor.damping``) a tuning samples; null: the section's value."""

    peak: LogRange | None = None
    warmup_epochs: LinearRange | None = None  # the Momentum schedules' warm-up (shapes with warmup_epochs)
    warmup_steps: StepRange | None = None  # the BERT schedules' warm-up (shape polynomial)


class RecipeSpace(Section):
    """A training's search space: ranges over the keys of its own section (null: the section's value)."""

    lr: ScheduleSpace | None = None
    weight_decay: LogRange | None = None
    damping: ScheduleSpace | None = None  # THOR's (thor, thor_bert: thor_first_order has no preconditioner)
    frequency: FrequencyRange | None = None  # THOR's statistics and inverses every N steps (thor, thor_bert)
    trust_coefficient: LogRange | None = None  # LARS's eta (lars)


class TuningParams(Section):
    """Tuning at equal effort (``study.tuning``, off with ``trials: 0``): per tuned result row ``trials`` Optuna
    trials on the tuning ``seeds``, drawn from ``spaces``, in one Optuna study per row in ``storage``; the best of
    each is then trained on ``study.seeds``."""

    trials: NonNegativeInt  # per tuned result row, across every process sharing the storage; 0: no tuning
    seeds: Annotated[list[int], Field(min_length=1)]  # runtime.seed of the trials: disjoint from study.seeds
    sampler: Literal["tpe", "qmc"]
    sampler_seed: int
    pruner: Pruner  # stop a trial whose step evaluations trail the other trials' (docs/study.md, Pruners)
    storage: Annotated[str, Field(min_length=1)]  # an Optuna storage URL: sqlite:///<file>, postgresql://..., ...
    credentials: str | None = None  # an entry of conf/local/credentials.yml exported as environment variables
    name: Annotated[str, Field(min_length=1)]  # Optuna study <name>/<result> (a tuned result row)
    spaces: dict[str, RecipeSpace]  # by tunable result row (trainlib.params.recipe_spec)
    # a running trial records a heartbeat every heartbeat_interval seconds; one silent for grace_period seconds (its
    # machine died) is failed by the next process to look, and its values retried up to max_retry times
    heartbeat_interval: PositiveInt = 60
    grace_period: PositiveInt = 180
    max_retry: NonNegativeInt = 2
    # a storage that stops answering mid-run (a restart, a lost network) is retried this long, one log line per retry,
    # before the run stops naming it; 0: at once (trainlib.study.tuning_storage)
    retry_window_s: Annotated[float, Field(ge=0, le=3600)] = 60

    @model_validator(mode="after")
    def _ranges(self) -> TuningParams:
        problems = []
        if self.grace_period <= self.heartbeat_interval:
            problems.append(
                (
                    "study.tuning.grace_period",
                    f"is {self.grace_period} s; give more than heartbeat_interval ({self.heartbeat_interval} s), or "
                    "every running trial looks dead between two heartbeats",
                )
            )
        tunable = [name for name, row in rows().items() if row.tunable]
        unknown = unknown_names(self.spaces, "rows that are not tunable", tunable)
        if unknown:
            problems.append(("study.tuning.spaces", unknown))
        for recipe, space in self.spaces.items():
            for key, (low, high) in space_ranges(space).items():
                if not low < high:
                    problems.append(
                        (f"study.tuning.spaces.{recipe}.{key}", f"is {[low, high]}; give [low, high] with low < high")
                    )
            thor_only = [key for key in ("damping", "frequency") if getattr(space, key) is not None]
            if recipe in tunable and not rows()[recipe].preconditioned and thor_only:
                problems.append(
                    (
                        f"study.tuning.spaces.{recipe}.{thor_only[0]}",
                        f"is set, but {recipe} has no preconditioner: THOR's damping and frequency change nothing",
                    )
                )
        CrossKeyProblems.raise_if_any(problems)
        return self


def space_ranges(space: RecipeSpace) -> dict[str, list[float]]:
    """A search space as its dotted keys in the recipe's section (``lr.peak``, ``weight_decay``) and ranges."""
    ranges = {}
    for key, value in space.model_dump(exclude_none=True).items():
        if isinstance(value, dict):
            ranges |= {f"{key}.{inner}": bounds for inner, bounds in value.items()}
        else:
            ranges[key] = value
    return ranges


class StudyParams(Section):
    """A multi-seed comparison of recipes (``kedro run --pipelines=study``): every recipe and seed on the same data,
    epoch budget and evaluation; each (recipe, seed) run's result is kept in ``dir`` and never rerun."""

    # paired differences: thor against baseline, dim_reduce's stage2 against its control
    recipes: Annotated[list[str], Field(min_length=1)]  # recipe names (trainlib.params.recipe_spec)
    seeds: Annotated[list[int], Field(min_length=1)]  # runtime.seed of each run
    epochs: PositiveInt  # baseline's and thor's budget (replaces <recipe>.epochs); dim_reduce keeps its stages'
    # epoch counts
    eval_every_steps: PositiveInt  # evaluation on data.step_eval_images every N steps (time to target.top1)
    dir: str  # one result file per finished run, and the runs' checkpoints
    adasum_workers: Annotated[int, Field(ge=2)] = 2  # msrun ranks of adasum's trainings: a power of two
    tuning: TuningParams

    @model_validator(mode="after")
    def _distinct(self) -> StudyParams:
        problems = []
        unknown = unknown_names(self.recipes, "unknown recipes", recipe_specs())
        if unknown:
            problems.append(("study.recipes", unknown))
        for key, values in (("study.recipes", self.recipes), ("study.seeds", self.seeds)):
            repeated = sorted({value for value in values if values.count(value) > 1})
            if repeated:
                problems.append((key, f"repeats {repeated}: each run is one (recipe, seed) pair"))
        workers = self.adasum_workers
        if "adasum" in self.recipes and workers & (workers - 1):
            problems.append(("study.adasum_workers", f"is {workers}; Adasum combines ranks in pairs: use 2, 4, 8, ..."))
        shared = sorted(set(self.seeds) & set(self.tuning.seeds))
        if shared:
            problems.append(
                (
                    "study.tuning.seeds",
                    f"and study.seeds share {shared}: the best configuration is scored on fresh seeds, never on the "
                    "seeds it was chosen on",
                )
            )
        tuned = tuned_trainings()
        if self.tuning.trials:
            for recipe in self.recipes:
                if recipe not in tuned:
                    problems.append(
                        (
                            "study.recipes",
                            f"has {recipe}, which study.tuning does not tune (it tunes "
                            f"{', '.join(tuned)}); set study.tuning.trials: 0 or take it out",
                        )
                    )
                    continue
                for training in tuned[recipe]:
                    space = self.tuning.spaces.get(training)
                    if space is None or not space_ranges(space):
                        problems.append(
                            (
                                f"study.tuning.spaces.{training}",
                                "is missing or empty: give the ranges its trials draw from",
                            )
                        )
        CrossKeyProblems.raise_if_any(problems)
        return self
