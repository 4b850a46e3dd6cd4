"""The recipes' MLflow runs as plain data: which runs are a recipe's (``Recipe``, ``report_recipes``), read through a
``RunReader`` passed in (``pipelines.tracking.reader.MlflowRunReader``), and the run to report for each.

baseline, thor and adasum log into the ``kedro run``'s own run (tagged ``pipeline``); dim_reduce's trainings
(``stage1``, ``stage2``, ``control``) are child runs of it (tag ``training``), each with the same metric keys.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol, TypedDict

import pandas as pd

from trainlib import fast_dev_run
from trainlib.metrics import FINAL_TOP1, TRAIN_LOSS
from trainlib.params.recipe_spec import reported_recipes

logger = logging.getLogger(__name__)

TRAINING_TAG = "training"  # names a dim_reduce child run: stage1, stage2 or control
PARENT_TAG = "mlflow.parentRunId"


@dataclass(frozen=True)
class Recipe:
    """Where a recipe's numbers are among its MLflow runs.

    ``pipelines``: values of the ``pipeline`` tag that are runs of this recipe.
    ``trainings``: child runs (by ``training`` tag) whose epochs, in this order, are the recipe's
    curve, the last one holding the recipe's final evaluation; empty: the ``kedro run`` itself.
    ``side_trainings``: child runs that continue from the first training instead (dim_reduce's
    control, Momentum over stage 2's epochs), drawn beside the curve but not in the table.
    """

    name: str
    pipelines: tuple[str, ...]
    trainings: tuple[str, ...] = ()
    side_trainings: tuple[str, ...] = ()


def report_recipes() -> dict[str, Recipe]:
    """The recipes the report compares, by name, from their specifications (``recipe_spec.reported_recipes``)."""
    return {
        name: Recipe(name, runs.pipelines, runs.trainings, runs.side_trainings)
        for name, runs in reported_recipes().items()
    }


class RunRecord(TypedDict):
    """One MLflow run as plain data: ``metric_keys`` names the metrics it holds (any step)."""

    run_id: str
    run_name: str | None
    status: str
    start_time_ms: int
    end_time_ms: int | None
    tags: dict[str, str]
    params: dict[str, str]
    metric_keys: list[str]


class RunReader(Protocol):
    """Read access to one MLflow experiment, as plain data (``pipelines.tracking.reader.MlflowRunReader``)."""

    tracking_uri: str
    experiment_name: str
    experiment_exists: bool

    def search(self, filter_string: str) -> list[RunRecord]:
        """The experiment's runs matching an MLflow filter string, newest first."""
        ...

    def get(self, run_id: str) -> RunRecord | None:
        """The run ``run_id`` (any experiment), or ``None`` when there is none."""
        ...

    def metric_history(self, run_id: str, keys: Sequence[str]) -> pd.DataFrame:
        """Every logged value of ``keys``: columns ``key``, ``step``, ``value``, ``timestamp`` (ms)."""
        ...

    def artifact_csv(self, run_id: str, path: str) -> pd.DataFrame | None:
        """The run's CSV artifact at ``path``, or ``None`` when it has none."""
        ...


class NoRunsError(LookupError):
    """No recipe has a run to report."""


def absolute_tracking_uri(uri: str, project_path: str | Path) -> str:
    """``uri`` with a relative SQLite path made absolute against ``project_path``.

    kedro-mlflow leaves ``sqlite:///mlflow.db`` relative, which MLflow resolves against the
    working directory: right for ``kedro run`` at the project root, wrong in ``notebooks/``.
    """
    prefix = "sqlite:///"
    if uri.startswith(prefix) and not Path(uri.removeprefix(prefix)).is_absolute():
        return prefix + str(Path(project_path).resolve() / uri.removeprefix(prefix))
    return uri


def recipes_by_name(names: Sequence[str]) -> list[Recipe]:
    """The recipes named in ``report.recipes``; an unknown name is an error listing the known ones."""
    recipes = report_recipes()
    unknown = [name for name in names if name not in recipes]
    if unknown:
        raise ValueError(f"report.recipes names unknown recipes {unknown}; known: {', '.join(recipes)}")
    if not names:
        raise ValueError("report.recipes is empty; name at least one of " + ", ".join(recipes))
    return [recipes[name] for name in names]


def children_by_training(reader: RunReader, run: RunRecord) -> dict[str, RunRecord]:
    """The child runs of ``run`` by their ``training`` tag (the newest where a name repeats)."""
    children: dict[str, RunRecord] = {}
    for child in reader.search(f"tags.`{PARENT_TAG}` = '{run['run_id']}'"):  # newest first
        children.setdefault(child["tags"].get(TRAINING_TAG, ""), child)
    children.pop("", None)
    return children


def missing_metrics(recipe: Recipe, run: RunRecord, children: Mapping[str, RunRecord]) -> list[str]:
    """Metrics a complete run of ``recipe`` has and this one lacks (a partial rerun, ``--nodes=...``).

    In-run recipes need ``train/loss`` and ``final/top1``; dim_reduce needs ``train/loss`` in each
    training of its curve and ``final/top1`` in the last (``stage2: final/top1`` when absent).
    """
    if not recipe.trainings:
        return [key for key in (TRAIN_LOSS, FINAL_TOP1) if key not in run["metric_keys"]]
    missing = []
    for training in recipe.trainings:
        needed = (TRAIN_LOSS, FINAL_TOP1) if training == recipe.trainings[-1] else (TRAIN_LOSS,)
        held = children[training]["metric_keys"] if training in children else []
        missing += [f"{training}: {key}" for key in needed if key not in held]
    return missing


def find_run(reader: RunReader, recipe: Recipe, run_id: str | None = None) -> RunRecord | None:
    """The run to report for ``recipe``: ``run_id`` when pinned, else its latest complete FINISHED run that is not a
    rehearsal (``runtime.fast_dev_run``, tagged ``fast_dev_run``).

    A pinned run must exist, be tagged with one of the recipe's pipelines and be complete;
    skipped runs (partial reruns lacking the recipe's metrics) are logged. ``None`` when there is none.
    """
    if run_id:
        run = reader.get(run_id)
        if run is None:
            raise ValueError(f"report.run_ids.{recipe.name}: no MLflow run {run_id!r} at {reader.tracking_uri}")
        tag = run["tags"].get("pipeline")
        if tag not in recipe.pipelines:
            raise ValueError(
                f"report.run_ids.{recipe.name}: run {run_id} is tagged pipeline={tag!r}, "
                f"not {' or '.join(recipe.pipelines)}"
            )
        missing = missing_metrics(recipe, run, children_by_training(reader, run) if recipe.trainings else {})
        if missing:
            raise ValueError(f"report.run_ids.{recipe.name}: run {run_id} lacks the metrics {missing}")
        return run
    candidates: list[RunRecord] = []
    for tag in recipe.pipelines:
        candidates += reader.search(f"tags.pipeline = '{tag}' and attributes.status = 'FINISHED'")
    for run in sorted(candidates, key=lambda r: r["start_time_ms"], reverse=True):
        if fast_dev_run.TAG in run["tags"]:  # a few batches on CPU: not a result
            logger.info(
                "Report: skipping %s run %s, a fast_dev_run rehearsal (not a result)", recipe.name, run["run_id"]
            )
            continue
        missing = missing_metrics(recipe, run, children_by_training(reader, run) if recipe.trainings else {})
        if not missing:
            return run
        logger.info(
            "Report: skipping %s run %s, which lacks %s (a partial rerun?)", recipe.name, run["run_id"], missing
        )
    return None
