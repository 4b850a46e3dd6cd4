"""A run's logged model registered afterwards (``kedro models register``): a new version of a registered model
without training again.

MLflow 3 keeps a run's model as a logged model (``models:/m-…``), not as artifacts under the run: registering
``runs:/<run id>/model`` finds no ``MLmodel`` there, falls back to the logged model and warns so. Here the logged
model is found through MLflow's public search (``MlflowClient.search_logged_models``: the run's READY model named
``model``) and its own URI registered, with the run's id, so the version names both and nothing is warned."""

from __future__ import annotations

from dataclasses import dataclass

import mlflow
from mlflow.entities import LoggedModel, Run
from mlflow.exceptions import MlflowException

from pipelines.tracking.models import MODEL_NAME
from trainlib import fast_dev_run

# how many of a recipe's newest finished runs are searched for one with a logged model (a run of its data nodes
# alone, or one that failed before its export, has none)
RUNS_SEARCHED = 100


class RegistryError(ValueError):
    """No run, or no logged model, for what was asked; the message says which and what to give instead."""


@dataclass(frozen=True)
class Registered:
    """A version of ``name`` made from (or already holding) the logged model ``model_uri`` of run ``run_id``."""

    name: str
    version: str
    model_uri: str
    run_id: str
    run_name: str
    new: bool
    alias: str | None = None

    def lines(self) -> list[str]:
        """What the command prints: no tracking URI, so no password that a URI may hold."""
        made = "registered" if self.new else "already registered"
        lines = [
            f"{made}: {self.model_uri} of run {self.run_id} ('{self.run_name}') as {self.name} version {self.version}"
        ]
        lines.append(f"load it as models:/{self.name}/{self.version}")
        if self.alias:
            lines.append(f"alias: models:/{self.name}@{self.alias} is version {self.version}")
        return lines


def recipe_and_training(name: str) -> tuple[str, str | None]:
    """``baseline`` -> (``baseline``, None); ``dim_reduce.stage2`` -> (``dim_reduce``, ``stage2``): the catalog's
    registered names are ``{recipe}`` and ``{recipe}.{training}`` (``hooks.models``)."""
    recipe, _, training = name.partition(".")
    return recipe, training or None


def _of_pipeline(run: Run, recipe: str) -> bool:
    return recipe in (run.data.tags.get("pipeline") or "").split("+")


def _training_run(client: mlflow.MlflowClient, run: Run, training: str | None) -> Run | None:
    """The run holding the model of ``training``: ``run`` itself for a recipe of one training (or a child run of
    that training given directly), else its child run tagged ``training`` (``tracking.trainings``)."""
    if training is None or run.data.tags.get("training") == training:
        return run
    children = client.search_runs(
        [run.info.experiment_id],
        f"tags.mlflow.parentRunId = '{run.info.run_id}' and tags.training = '{training}'",
    )
    return children[0] if children else None


def logged_model(client: mlflow.MlflowClient, run: Run) -> LoggedModel | None:
    """The newest READY logged model named ``model`` that ``run`` logged (a resumed training may log it again)."""
    found = client.search_logged_models(
        experiment_ids=[run.info.experiment_id],
        filter_string=f"source_run_id = '{run.info.run_id}' AND name = '{MODEL_NAME}'",
        order_by=[{"field_name": "creation_time", "ascending": False}],
    )
    return next((model for model in found if str(model.status) == "READY"), None)


def _given_run(client: mlflow.MlflowClient, run_id: str, name: str) -> tuple[Run, LoggedModel]:
    recipe, training = recipe_and_training(name)
    try:
        run = client.get_run(run_id)
    except MlflowException as error:
        raise RegistryError(f"no run {run_id} in the tracking store ({error.error_code})") from error
    parent_id = run.data.tags.get("mlflow.parentRunId")
    pipeline_run = client.get_run(parent_id) if parent_id and training else run
    if not _of_pipeline(pipeline_run, recipe):
        pipeline = pipeline_run.data.tags.get("pipeline", "none")
        raise RegistryError(f"run {run_id} is a run of pipeline '{pipeline}', not of {recipe}: {name} holds {recipe}'s")
    held = _training_run(client, run, training)
    model = logged_model(client, held) if held is not None else None
    if model is None:
        where = f"its {training} training" if training and held is not run else "it"
        raise RegistryError(f"run {run_id} has no logged model '{MODEL_NAME}' of {where} (status {run.info.status})")
    return held, model


def _newest_run(client: mlflow.MlflowClient, experiment_name: str, name: str) -> tuple[Run, LoggedModel]:
    """The newest FINISHED run of the recipe, not a rehearsal (``fast_dev_run``), whose training logged a model."""
    recipe, training = recipe_and_training(name)
    experiment = client.get_experiment_by_name(experiment_name)
    if experiment is None:
        raise RegistryError(f"no experiment '{experiment_name}' in the tracking store: no run to register")
    runs = client.search_runs(
        [experiment.experiment_id],
        f"attributes.status = 'FINISHED' and tags.pipeline LIKE '%{recipe}%'",
        order_by=["attributes.start_time DESC"],
        max_results=RUNS_SEARCHED,
    )
    for run in runs:
        tags = run.data.tags
        if not _of_pipeline(run, recipe) or fast_dev_run.TAG in tags or "mlflow.parentRunId" in tags:
            continue
        held = _training_run(client, run, training)
        model = logged_model(client, held) if held is not None else None
        if model is not None:
            return held, model
    raise RegistryError(
        f"no finished run of pipeline {recipe} in experiment '{experiment_name}' logged a model '{MODEL_NAME}'"
        f"{f' of its {training} training' if training else ''}: run `kedro run --pipelines={recipe}` first, "
        "or give --run-id"
    )


def register_run_model(
    name: str, *, experiment: str, run_id: str | None = None, alias: str | None = None
) -> Registered:
    """Register the logged model of run ``run_id`` (by default the recipe's newest finished run in ``experiment``)
    as a version of ``name`` (``baseline``, ``dim_reduce.stage2``, …), and point ``alias`` at it when given.

    A logged model already registered under ``name`` is not registered twice: its version is returned (and
    aliased). The version's source is the logged model's URI and its run id the run's."""
    client = mlflow.MlflowClient()
    held, model = _given_run(client, run_id, name) if run_id else _newest_run(client, experiment, name)
    existing = [
        version
        for version in client.search_model_versions(f"name = '{name}' and run_id = '{held.info.run_id}'")
        if version.source == model.model_uri
    ]
    if existing:
        version = max(existing, key=lambda found: int(found.version))
    else:
        try:
            client.create_registered_model(name)
        except MlflowException as error:
            if error.error_code != "RESOURCE_ALREADY_EXISTS":
                raise
        version = client.create_model_version(
            name, source=model.model_uri, run_id=held.info.run_id, model_id=model.model_id
        )
    if alias:
        client.set_registered_model_alias(name, alias, version.version)
    return Registered(
        name, str(version.version), model.model_uri, held.info.run_id, held.info.run_name, not existing, alias
    )
