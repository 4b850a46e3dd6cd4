"""A recipe's specification, declared once beside its parameter section, and the registry every part reads.

A recipe module of this package declares ``RECIPES``, a tuple of ``RecipeSpec`` (``baseline.py``: the Momentum
baseline; ``thor.py``: THOR and THOR without its preconditioner, two recipes of one section). Another installed
package adds its own through the entry-point group ``resnet_recipes.recipes`` (each entry a ``RecipeSpec`` or a
tuple of them), as Kedro's plugins and MLflow's apps are found. The study's result rows, the pairs it compares, the
rows a tuning covers and the sections it tunes, and the keys the study's budget sets are read from here
(``result_rows``, ``paired_rows``, ``tuned_trainings``, ``row_sections``, ``budgeted_sections``), not listed by hand.

Plain data: a specification names sections and rows by their dotted configuration keys, so it sits with the
parameter models, below the code that trains.
"""

from __future__ import annotations

import importlib
import pkgutil
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from functools import cache
from importlib.metadata import entry_points
from pathlib import Path
from typing import Any, Literal

from trainlib.fast_dev_run import Rehearsals, Rule

ENTRY_POINT_GROUP = "resnet_recipes.recipes"
# Colour families of runs in MLflow's charts (Tableau 10's hues), one per kind of training so that a chart reads at a
# glance: first-order baselines and controls blue, THOR orange, THOR's recipe without its preconditioner red, Adasum
# green against its plain data parallelism teal, P-BFGS purple, dim_reduce's stage 1 grey
FIRST_ORDER = "#4e79a7"
SECOND_ORDER = "#f28e2b"
WITHOUT_PRECONDITIONER = "#e15759"
ADASUM = "#59a14f"
ALL_REDUCE = "#76b7b2"
SUBSPACE = "#b07aa1"
WARM_START = "#bab0ac"
# What a recipe's trainings are scored on: top-1 of an image classifier, masked-LM accuracy of a language model
Task = Literal["image_classification", "masked_lm"]
# The key that names a training's result row in the study's files (its records, runs.csv, curves.csv, summary.csv,
# tuning/choices.csv) and its MLflow tag; ``recipe`` there is the recipe, as everywhere else
RESULT_KEY = "result"
# The study's files of before 2026-11-28 (issue 51 item 7) named the result row ``recipe``: ``result_named`` reads them
OLD_RESULT_KEY = "recipe"


@dataclass(frozen=True)
class ResultRow:
    """One training a recipe gives in a study, named as its result row (``RESULT_KEY``: runs.csv's ``result``
    column, the MLflow ``result`` tag). ``section``: the dotted configuration section it trains with;
    ``paired_with``: the rows it is compared against (``thor``: ``baseline``, then ``thor_first_order``);
    ``budgeted``: the section's keys the study's budget sets (``epochs``, ``eval_every_steps``); ``tunable``: a
    tuning samples it; ``preconditioned``: it has THOR's damping and frequency to tune; ``colour``: its runs' colour
    family; ``values``: dotted parameter keys its training sets on top of the configuration (``thor_first_order``:
    ``thor.precondition`` false), rows of different values training in separate runs of the recipe's pipeline.

    Its training's datasets in the recipe's pipeline are named after ``section`` (``dim_reduce.stage2.history``):
    the study reads its ``history`` and ``step_history`` there."""

    name: str
    section: str
    paired_with: tuple[str, ...] = ()
    budgeted: tuple[str, ...] = ("epochs", "eval_every_steps")
    tunable: bool = False
    preconditioned: bool = False
    colour: str = FIRST_ORDER  # its runs' colour family in MLflow (``#rrggbb``)
    values: tuple[tuple[str, object], ...] = ()


@dataclass(frozen=True)
class ReportRuns:
    """Where the report finds a recipe's numbers among the MLflow runs of its ``kedro run``: ``pipelines``, the values
    of the run's ``pipeline`` tag that are this recipe's; ``trainings``, child runs (``training`` tag) whose epochs in
    this order are its curve, the last holding its final evaluation (none: the run itself); ``side_trainings``,
    child runs drawn beside the curve, not in the table (dim_reduce's control)."""

    pipelines: tuple[str, ...]
    trainings: tuple[str, ...] = ()
    side_trainings: tuple[str, ...] = ()


@dataclass(frozen=True)
class RecipeSpec:
    """A recipe as the study, the tuning and the report know it: its name (``study.recipes``), its configuration
    section and that section's parameter model, its result rows, what it is scored on, and its runs' colours.

    ``pipeline``: the registered Kedro pipeline that trains it (empty: the one of its name), which the study runs per
    seed; every key named ``dir`` under ``section`` is a folder its trainings write (checkpoints, a trajectory),
    which the study moves under its own. ``several_ranks``: the study trains it on ``study.adasum_workers`` msrun
    ranks of one node (its comparison is about combining ranks), every other recipe on one device.

    A recipe trained by the image template (``pipelines.training``) names its ``trainer``, ``"module:function"``
    called as ``function(context, start, section, *, callbacks)`` (and ``boost=`` when ``takes_boost``: the
    Momentum baseline's mindspore.boost options); ``pipeline_module`` is where its Kedro pipeline's
    ``create_pipeline`` is (empty: ``pipelines.<pipeline>.pipeline``; a package of its own names its module).
    ``rehearsal``: how ``runtime.fast_dev_run`` shrinks its section, when a section of one training's budget
    (``fast_dev_run.training_budget``) is not enough (THOR's implementation and frequency, dim_reduce's stages).
    ``reference``: the recipe a report compares the others against when it is among them (``reference_among``: the
    Momentum baseline, the one recipe that declares it). ``cross_section_problems``: ``function(parameters)``, the
    ``(key, problem)`` pairs its section cannot run with given the whole configuration (an implementation on this
    device target, its place in the study), which ``validate_parameters`` raises with the others' before any work."""

    name: str
    section: str
    parameters: type
    results: tuple[ResultRow, ...]
    task: Task = "image_classification"
    colour: str = FIRST_ORDER  # the colour family of its pipeline's run
    # its trainings that give no result row (dim_reduce's stage 1), by the name their child runs take, with colours
    other_trainings: tuple[tuple[str, str], ...] = ()
    report: ReportRuns | None = None  # a recipe with a pipeline of its own: the report compares its runs
    pipeline: str = ""
    several_ranks: bool = False
    trainer: str = ""
    takes_boost: bool = False
    pipeline_module: str = ""
    # its section's rule under runtime.fast_dev_run (``fast_dev_run.Rule``); None: ``fast_dev_run.training_budget``
    # for a section of one training
    rehearsal: Rule | None = None
    reference: bool = False
    cross_section_problems: Callable[[Any], list[tuple[str, str]]] | None = None
    doc: str = field(default="", compare=False)

    @property
    def pipeline_name(self) -> str:
        """The registered pipeline that trains it."""
        return self.pipeline or self.name

    @property
    def pipeline_module_name(self) -> str:
        """The module whose ``create_pipeline`` makes its pipeline."""
        return self.pipeline_module or f"pipelines.{self.pipeline_name}.pipeline"

    @property
    def result_trainings(self) -> dict[str, str]:
        """Each result row's training, as its namespace under the recipe's section (dim_reduce's ``stage2`` row
        trains in ``dim_reduce.stage2``: ``stage2``)."""
        return {row.name: row.section.removeprefix(f"{self.section}.") for row in self.results}

    @property
    def paired_trainings(self) -> tuple[tuple[str, str], ...]:
        """(training, the training it is compared against), by their namespaces under the recipe's section."""
        training = self.result_trainings
        return tuple((training[row.name], training[other]) for row in self.results for other in row.paired_with)


class RecipeRegistryError(ValueError):
    """Two recipe specifications with one name, or an entry point that is not a specification."""


def _specs_in(value, origin: str) -> tuple[RecipeSpec, ...]:
    specs = (value,) if isinstance(value, RecipeSpec) else tuple(value)
    if not all(isinstance(spec, RecipeSpec) for spec in specs):
        raise RecipeRegistryError(f"{origin} holds something other than RecipeSpec: {value!r}")
    return specs


@cache
def recipe_specs() -> dict[str, RecipeSpec]:
    """Every recipe by name: this package's modules' ``RECIPES`` in module order, then the entry points'."""
    found: list[tuple[RecipeSpec, str]] = []
    for module in pkgutil.iter_modules([str(Path(__file__).parent)]):  # this package's modules, by name
        declared = getattr(importlib.import_module(f"{__package__}.{module.name}"), "RECIPES", None)
        if declared is not None:
            origin = f"{__package__}.{module.name}.RECIPES"
            found += [(spec, origin) for spec in _specs_in(declared, origin)]
    for entry in entry_points(group=ENTRY_POINT_GROUP):
        origin = f"entry point {entry.name} = {entry.value} ({ENTRY_POINT_GROUP})"
        found += [(spec, origin) for spec in _specs_in(entry.load(), origin)]
    specs: dict[str, RecipeSpec] = {}
    rows: dict[str, str] = {}
    for spec, origin in found:
        if spec.name in specs:
            raise RecipeRegistryError(f"recipe {spec.name!r} is declared twice; the second in {origin}")
        for row in spec.results:
            if row.name in rows:
                raise RecipeRegistryError(f"result row {row.name!r} of {spec.name} is also {rows[row.name]}'s")
            rows[row.name] = spec.name
        specs[spec.name] = spec
    return specs


def recipe_pipelines() -> dict[str, RecipeSpec]:
    """The recipes with a pipeline of their own (not thor_first_order, which runs thor's), by pipeline name."""
    return {spec.name: spec for spec in recipe_specs().values() if spec.pipeline_name == spec.name}


def rehearsals() -> Rehearsals:
    """What ``runtime.fast_dev_run`` needs of the recipes: each section's own rule, the recipes the study trains on
    several ranks, the pipelines that may train THOR (a row that is ``preconditioned``)."""
    specs = recipe_specs().values()
    return Rehearsals(
        rules={spec.section: spec.rehearsal for spec in specs if spec.rehearsal is not None},
        several_ranks=frozenset(spec.name for spec in specs if spec.several_ranks),
        second_order_pipelines=frozenset(
            spec.pipeline_name for spec in specs if any(row.preconditioned for row in spec.results)
        ),
    )


def template_trainers() -> dict[type, RecipeSpec]:
    """The recipes the image template trains, by the type of their section (the first of a section wins)."""
    found: dict[type, RecipeSpec] = {}
    for spec in recipe_specs().values():
        if spec.trainer:
            found.setdefault(spec.parameters, spec)
    return found


def reference_among(recipes: Iterable[str]) -> str | None:
    """The recipe the others among ``recipes`` are compared against: the one declared ``reference`` when it is
    there, else the first (``None``: no recipe)."""
    recipes = list(recipes)
    specs = recipe_specs()
    declared = [name for name in recipes if name in specs and specs[name].reference]
    return (declared or recipes or [None])[0]


def result_rows() -> dict[str, tuple[str, ...]]:
    """Each recipe's result rows, by recipe."""
    return {name: tuple(row.name for row in spec.results) for name, spec in recipe_specs().items()}


def result_named(table):
    """``table``, a study's record (a mapping) or table (a pandas DataFrame: runs.csv, curves.csv, summary.csv,
    tuning/choices.csv), with its result row under ``RESULT_KEY``. The one place that reads the files of before the
    rename: they held the row under ``OLD_RESULT_KEY`` (``recipe``), which is renamed here; a file of now is
    returned as it is."""
    if OLD_RESULT_KEY not in table or RESULT_KEY in table:  # a DataFrame's ``in`` is its columns'
        return table
    if isinstance(table, Mapping):
        return {RESULT_KEY if key == OLD_RESULT_KEY else key: value for key, value in table.items()}
    return table.rename(columns={OLD_RESULT_KEY: RESULT_KEY})


def rows() -> dict[str, ResultRow]:
    """Every result row by name."""
    return {row.name: row for spec in recipe_specs().values() for row in spec.results}


def recipe_of_row() -> dict[str, RecipeSpec]:
    """The recipe that gives each result row."""
    return {row.name: spec for spec in recipe_specs().values() for row in spec.results}


def paired_rows() -> tuple[tuple[str, str], ...]:
    """(row, a row it is compared against), in the registry's order."""
    return tuple((row.name, reference) for row in rows().values() for reference in row.paired_with)


def tuned_trainings() -> dict[str, tuple[str, ...]]:
    """The recipes a tuning covers and the rows of each it tunes, each with trials of its own."""
    tuned = {name: tuple(row.name for row in spec.results if row.tunable) for name, spec in recipe_specs().items()}
    return {name: trained for name, trained in tuned.items() if trained}


def row_sections() -> dict[str, str]:
    """The dotted configuration section each result row trains with."""
    return {name: row.section for name, row in rows().items()}


def row_section(tree, row: str):
    """The section result row ``row`` trains with, found in ``tree`` (the parameters, or the study's inputs) by its
    dotted key: ``thor_bert``'s is ``tree.thor_bert.thor``."""
    for name in row_sections()[row].split("."):
        tree = getattr(tree, name)
    return tree


def budgeted_sections() -> dict[str, tuple[str, ...]]:
    """The dotted sections the study's budget changes, with the keys it sets (first row of a section wins)."""
    budgeted: dict[str, tuple[str, ...]] = {}
    for row in rows().values():
        if row.budgeted:
            budgeted.setdefault(row.section, row.budgeted)
    return budgeted


def reported_recipes() -> dict[str, ReportRuns]:
    """The recipes the report can compare (``report.recipes``), with where their runs are."""
    return {name: spec.report for name, spec in recipe_specs().items() if spec.report is not None}


def colour_families() -> dict[str, str]:
    """The colour family of the runs of each recipe's pipeline, result row and other training, by name."""
    families: dict[str, str] = {}
    for spec in recipe_specs().values():
        families[spec.name] = spec.colour
        families |= {row.name: row.colour for row in spec.results} | dict(spec.other_trainings)
    return families


def unknown_names(names, what: str, choices) -> str | None:
    """Why ``names`` are not all ``what`` (``choices``), as the rest of a sentence that starts with their key; or
    None."""
    unknown = [name for name in names if name not in choices]
    if not unknown:
        return None
    return f"names {what} {unknown}; known: {', '.join(choices)}"
