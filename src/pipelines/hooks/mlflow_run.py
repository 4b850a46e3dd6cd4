"""The MLflow run of a ``kedro run``, beside kedro-mlflow's hooks (which start and end it and log the nodes'
parameters): ``MlflowRunHooks`` names and tags it, has kedro-mlflow log typed parameters as the configuration's
values, ends KILLED the runs of earlier processes that were killed outright, hands the run to msrun's rank 0,
tags a failure, and prints where to see the run. Every MLflow call goes through ``pipelines.tracking``."""

from __future__ import annotations

import re
import subprocess
from collections.abc import Mapping
from pathlib import Path

import click
from kedro.framework.hooks import hook_impl
from pydantic import BaseModel

from pipelines.failures import Failure
from pipelines.hooks.command_line import invoked_command
from pipelines.hooks.config_files import leaf_items
from pipelines.hooks.configuration import ConfigurationHooks
from pipelines.modular import value_at
from pipelines.pipeline_registry import DEFAULT_PIPELINE
from pipelines.tracking.handoff import MlflowRunHandoff
from pipelines.tracking.links import (
    base_is_server,
    closing_links,
    current_tracking_uri,
    no_mlflow_run_links,
    ui_base_url,
)
from pipelines.tracking.naming import (
    DESCRIPTION_TAG,
    RUN_COLOUR_TAG,
    run_colour,
    run_description,
    run_name,
    set_run_name,
)
from pipelines.tracking.runs import (
    active_run_id,
    mark_killed,
    mark_orphaned_runs_killed,
    run_identity,
    tag_failure,
)
from pipelines.tracking.writer import mark_model_training_experiment, set_tags
from trainlib import fast_dev_run, signals
from trainlib.distributed.launch import hand_off_runs_with
from trainlib.redaction import redact, redact_value
from trainlib.study.budget import study_budget

# run_params entries that run only part of the pipelines
NODE_FILTERS = ("node_names", "from_nodes", "to_nodes", "from_inputs", "to_outputs", "tags", "namespaces")
DEFAULT_UI = ("127.0.0.1", 5000)  # kedro-mlflow's mlflow.yml ui: host, port
STUDY = "study"
# Pipelines that read no recipe section: beside them, the study's budget is the only value of each key it sets
# (baseline.epochs); beside a recipe's own pipeline, which logs the configured value, the configured values stay
WITHOUT_RECIPE_SECTIONS = {"data", "report", STUDY}


def git_commit(project_path: Path) -> str:
    """The commit checked out in ``project_path``, or ``unknown``."""
    try:
        return subprocess.run(
            ["git", "rev-parse", "HEAD"], cwd=project_path, capture_output=True, text=True, check=True, timeout=10
        ).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        return "unknown"


def runner_name(described: str) -> str:
    """``SequentialRunner`` for Kedro's ``<kedro.runner.sequential_runner.SequentialRunner object at 0x…>``."""
    found = re.search(r"(\w+) object at 0x", described)
    return found[1] if found else described


def with_values(value, key: str, values: Mapping[str, object]):
    """``value``, the configuration's mapping (or value) at dotted ``key``, with the leaves ``values`` names (dotted
    keys) set to their values; a copy, the configuration is left as it is."""
    if isinstance(value, Mapping):
        return {name: with_values(inner, f"{key}.{name}" if key else name, values) for name, inner in value.items()}
    return values.get(key, value)


def run_pipelines(run_params: dict) -> list[str]:
    """The pipelines a run runs, by their real names: ``baseline`` for Kedro's ``__default__``."""
    asked = run_params.get("pipeline_names") or [run_params.get("pipeline_name") or "__default__"]
    return [DEFAULT_PIPELINE if name == "__default__" else name for name in asked]


def name_of_run(configuration, run_params: dict) -> str:
    """The run's name (``naming.run_name``) for the validated ``configuration`` and Kedro's ``run_params``."""
    partial = any(run_params.get(key) for key in (*NODE_FILTERS, "only_missing_outputs"))
    chosen_env = configuration.env if configuration.env not in ("base", "local") else None
    keys = [key for key, _ in leaf_items(configuration.raw_params)]
    overrides = redact_value(configuration.overrides)  # a password in --params, masked before it is cut
    rehearsal = configuration.rehearsal is not None
    return redact(run_name(run_pipelines(run_params), chosen_env, overrides, keys, partial, fast_dev_run=rehearsal))


class RunNameHooks:
    """Names the run before kedro-mlflow starts it, through its public setting for that (mlflow.yml's
    ``tracking.run.name``, read from ``context.mlflow`` when its hook starts the run): its start line, ``Mlflow run
    '<name>' - '<id>' has started``, then names the run as the runs table does, not by the pipelines asked for
    (``__default__`` for the run named ``baseline``). A hook of its own, as kedro-mlflow starts the run in its
    ``before_pipeline_run``, between this one (``tryfirst``) and ``MlflowRunHooks``' (``trylast``)."""

    def __init__(self, configuration: ConfigurationHooks):
        self._configuration = configuration
        self._mlflow = None

    @hook_impl(trylast=True)  # after kedro-mlflow's hook has read mlflow.yml into context.mlflow
    def after_context_created(self, context) -> None:
        self._mlflow = getattr(context, "mlflow", None)

    @hook_impl(tryfirst=True)  # before kedro-mlflow's hook starts the run
    def before_pipeline_run(self, run_params: dict, pipeline, catalog) -> None:
        run = getattr(getattr(self._mlflow, "tracking", None), "run", None)
        if run is not None:
            run.name = name_of_run(self._configuration.configuration, run_params)


class MlflowRunHooks:
    """Names, tags and reports the MLflow run kedro-mlflow starts for a ``kedro run``.

    ``configuration`` is the hook that validated the run's configuration: its ``RunConfiguration`` gives the
    environment, the overrides, the model and the raw parameters.
    """

    def __init__(self, configuration: ConfigurationHooks):
        self._configuration = configuration
        self._ui = DEFAULT_UI
        self._run_id: str | None = None
        self._data_size_tagged = True
        self._study_budget: dict[str, int] = {}

    @hook_impl(trylast=True)  # after kedro-mlflow's hook has read mlflow.yml into context.mlflow
    def after_context_created(self, context) -> None:
        no_mlflow_run_links()  # the run's links are _print_links', without credentials
        ui = getattr(getattr(context, "mlflow", None), "ui", None)
        self._ui = (getattr(ui, "host", DEFAULT_UI[0]), getattr(ui, "port", DEFAULT_UI[1]))
        self._run_id = None

    @hook_impl(tryfirst=True)  # before kedro-mlflow's hook logs the node's parameters
    def before_node_run(self, node, inputs: dict) -> None:
        # Kedro gives the hooks a copy of the node's inputs. In that copy, typed parameters (models) go back to the
        # mappings of the configuration, so that kedro-mlflow logs them flattened, one MLflow param per key with
        # its YAML value (thor.lr.peak), not one param holding a model's repr; the node itself still receives the
        # models.
        # Either way, a password in a parameter (a storage URL's) is masked before kedro-mlflow logs it.
        # A study node's recipe sections are logged as the study trains them (baseline.epochs is study.epochs).
        # The whole configuration (``parameters``, the study's) is logged section by section, as a section is.
        raw_params = self._configuration.configuration.raw_params
        if "parameters" in inputs:
            del inputs["parameters"]
            inputs.update({f"params:{section}": value for section, value in raw_params.items()})
        for name, value in inputs.items():
            if name.startswith("params:"):
                logged = value_at(raw_params, name) if isinstance(value, BaseModel) else value
                if node.namespace == STUDY and self._study_budget:
                    logged = with_values(logged, name.removeprefix("params:"), self._study_budget)
                inputs[name] = redact_value(logged)

    @hook_impl(trylast=True)  # after kedro-mlflow's hook has started the run
    def before_pipeline_run(self, run_params: dict, pipeline, catalog) -> None:
        configuration = self._configuration.configuration
        names = run_pipelines(run_params)
        rehearsal = configuration.rehearsal
        study = configuration.params.study
        self._study_budget = (
            study_budget(epochs=study.epochs, eval_every_steps=study.eval_every_steps)
            if STUDY in names and set(names) <= WITHOUT_RECIPE_SECTIONS
            else {}
        )
        overrides = redact_value(configuration.overrides)  # a password in --params, masked before it is cut
        # named already where kedro-mlflow started the run (RunNameHooks); not where the run was active before
        set_run_name(name_of_run(configuration, run_params))
        command = invoked_command()
        set_tags(
            {
                "pipeline": "+".join(names),
                "env": configuration.env,
                "device_target": configuration.params.runtime.device_target,
                "git_commit": git_commit(Path(run_params["project_path"])),
                "runner": runner_name(str(run_params.get("runner") or "SequentialRunner")),
                **({"kedro_command": command} if command else {}),  # else kedro-mlflow's, without --params/--env
                **configuration.identity,
                **run_identity(),
                DESCRIPTION_TAG: run_description(command, configuration.env, overrides),
                RUN_COLOUR_TAG: run_colour("+".join(names), configuration.params.runtime.seed),
                # the report skips runs with this tag: a rehearsal, not a result
                **({fast_dev_run.TAG: rehearsal.summary()} if rehearsal is not None else {}),
            }
        )
        mark_model_training_experiment()  # MLflow 3's UI: the model-training view, not GenAI
        self._data_size_tagged = False
        mark_orphaned_runs_killed()
        self._run_id = active_run_id()
        hand_off_runs_with(MlflowRunHandoff.capture)  # msrun's rank 0 logs into this run (or a child)

    @hook_impl
    def after_dataset_loaded(self, dataset_name: str, data) -> None:
        self._tag_data_size(dataset_name, data)

    @hook_impl
    def after_dataset_saved(self, dataset_name: str, data) -> None:
        self._tag_data_size(dataset_name, data)

    def _tag_data_size(self, dataset_name: str, data) -> None:
        """Tag the run with the size of the data it uses, from the first manifest it saves or loads."""
        if self._data_size_tagged or dataset_name.rsplit(".", 1)[-1] != "manifest":
            return
        images = data["split"].value_counts()
        set_tags(
            {
                "train_images": str(int(images.get("train", 0))),
                "val_images": str(int(images.get("val", 0))),
                "classes": str(data["label"].nunique()),
            }
        )
        self._data_size_tagged = True

    @hook_impl
    def after_pipeline_run(self, run_params: dict, run_result, pipeline, catalog) -> None:
        if self._run_id is not None:
            self._print_links()

    @hook_impl(trylast=True)  # after kedro-mlflow's hook has ended the run FAILED
    def on_pipeline_error(self, error: Exception, run_params: dict, pipeline, catalog) -> None:
        if self._run_id is None:
            return
        if isinstance(error, signals.Interrupted):
            mark_killed(self._run_id)
        # the same text as the command's Error: block
        message = error.format_message() if isinstance(error, click.ClickException) else Failure.of(error).summary()
        tag_failure(self._run_id, message)

    def _print_links(self) -> None:
        """Where to see the run: the chart comparing its runs (and the runs table) at the tracking server's address,
        or at ``mlflow ui``'s over a local store (kedro-mlflow's ``mlflow.yml``: ``server``, ``ui``)."""
        base = ui_base_url(current_tracking_uri(), *self._ui)
        local = ""
        if not base_is_server(current_tracking_uri()):
            local = " (start `mlflow ui --app-name model-training` first, README)"
        chart, table = closing_links(base, self._run_id)
        # printed, not logged: a log handler may wrap lines at the terminal's width and would break the links
        if chart:
            click.echo(f"MLflow: compare the runs at {chart}{local}")
        click.echo(f"MLflow: the runs table is {table}")
