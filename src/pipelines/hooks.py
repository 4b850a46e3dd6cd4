"""Project hooks: validate parameters and fail fast on a missing device; name and tag the MLflow run; install
the orderly stop on SIGINT/SIGTERM (``pipelines.signals``) and end the run KILLED when it comes; end KILLED the
runs of earlier processes that were killed outright. Every MLflow call goes through ``pipelines.tracking``."""

from __future__ import annotations

import logging
import os
import re
import shlex
import subprocess
import sys
from pathlib import Path

import click
import yaml
from kedro.framework.hooks import hook_impl
from pydantic import BaseModel

from pipelines import fast_dev_run, signals
from pipelines.data.fashion_mnist import CLASS_NAMES as DEFAULT_TREE_CLASSES
from pipelines.distributed.launch import hand_off_runs_with
from pipelines.engine.checkpoint import Checkpoint
from pipelines.engine.resume import remove_finished_checkpoints
from pipelines.engine.runtime import DeviceUnavailableError, require_device
from pipelines.errors import NODE_NOTE, Failure
from pipelines.metrics import VAL_MLM_ACCURACY, VAL_TOP1
from pipelines.params import ParameterError, validate_parameters
from pipelines.tracking import (
    DESCRIPTION_TAG,
    MlflowRunHandoff,
    active_run_id,
    base_is_server,
    comparison_url,
    current_tracking_uri,
    experiment_of,
    mark_killed,
    mark_orphaned_runs_killed,
    run_description,
    run_identity,
    run_name,
    runs_page_url,
    runs_to_compare,
    set_run_name,
    set_tags,
    tag_failure,
    ui_base_url,
)

logger = logging.getLogger(__name__)

COMPARED_METRICS = (VAL_TOP1, VAL_MLM_ACCURACY)  # the chart a run's closing link opens on, the first its runs logged


def _git_commit(project_path: Path) -> str:
    try:
        return subprocess.run(
            ["git", "rev-parse", "HEAD"], cwd=project_path, capture_output=True, text=True, check=True, timeout=10
        ).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        return "unknown"


def _leaf_items(tree: dict, prefix: str = ""):
    """(dotted key, value) of the leaves of a parameters mapping (a list or an empty mapping is a leaf)."""
    for key, value in tree.items():
        if isinstance(value, dict) and value:
            yield from _leaf_items(value, f"{prefix}{key}.")
        else:
            yield f"{prefix}{key}", value


def _leaf_keys(tree: dict):
    """Dotted keys of the leaves of a parameters mapping."""
    return (key for key, _ in _leaf_items(tree))


def _shown_path(path: Path) -> str:
    """``path`` relative to the working directory (``conf/base/parameters.yml``) when it lies below it."""
    try:
        return str(path.resolve().relative_to(Path.cwd().resolve()))
    except ValueError:
        return str(path)


def parameter_sources(conf_source: str | Path, env: str, runtime_params: dict | None) -> dict[str, str]:
    """The file (or ``--params``) that last set each dotted parameter key, in Kedro's merge order."""
    sources: dict[str, str] = {}
    for folder in dict.fromkeys(("base", env)):
        for path in sorted((Path(conf_source) / folder).glob("parameters*.yml")):
            for key in _leaf_keys(yaml.safe_load(path.read_text()) or {}):
                sources[key] = _shown_path(path)
    for key in _leaf_keys(runtime_params or {}):
        sources[key] = "--params"
    return sources


def configured_values(conf_source: str | Path, env: str) -> dict:
    """Dotted key -> value as the parameter files set it (base, then ``env``), before ``--params``."""
    values = {}
    for folder in dict.fromkeys(("base", env)):
        for path in sorted((Path(conf_source) / folder).glob("parameters*.yml")):
            values.update(_leaf_items(yaml.safe_load(path.read_text()) or {}))
    return values


def _deep_merge(base: dict, extra: dict) -> dict:
    merged = dict(base)
    for key, value in extra.items():
        both = isinstance(value, dict) and isinstance(merged.get(key), dict)
        merged[key] = _deep_merge(merged[key], value) if both else value
    return merged


def rehearsal_substitutions(
    raw_params: dict, *, env: str, project: Path, conf_source: str | Path, pipelines: list[str] | None
) -> fast_dev_run.Substitutions:
    """``pipelines.fast_dev_run``'s substitutions of ``raw_params`` (``env``'s merged parameters) for this machine's
    cores and memory, image trees found relative to ``project``, the CPU default tree as ``conf_source``'s base
    configures it."""

    def classes_in(root: str, train_dir: str) -> int | None:
        path = Path(root) if Path(root).is_absolute() else project / root
        if not path.is_dir():
            return None
        train = path / train_dir
        return sum(p.is_dir() and not p.name.startswith(".") for p in train.iterdir()) if train.is_dir() else 0

    base = configured_values(conf_source, "base")
    default_data = {
        "source": base["data.source"],
        "root": base["data.root"],
        "split_dirs": {"train": base["data.split_dirs.train"], "val": base["data.split_dirs.val"]},
    }
    return fast_dev_run.fast_dev_run_overrides(
        raw_params,
        env=env,
        cpu_workers=len(os.sched_getaffinity(0)),
        memory_gb=os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / 1e9,
        pipelines=pipelines,
        default_data=default_data,
        classes_in=classes_in,
        default_classes=len(DEFAULT_TREE_CLASSES),
    )


def rehearse_on_cpu(context, env: str, raw_params: dict) -> fast_dev_run.Substitutions:
    """``runtime.fast_dev_run``: the substitutions of ``pipelines.fast_dev_run`` for this machine, applied as
    runtime parameters (the user's ``--params`` win) and logged in one line.

    Applied through ``context.config_loader.runtime_params``, the public attribute of Kedro's config loader that
    holds ``--params``: OmegaConfigLoader merges it into the parameters on every ``config_loader["parameters"]``,
    and ``KedroContext.params`` (which builds the catalog's ``params:`` datasets the nodes read) reads them from
    there, so validation, MLflow's params and every node see the substituted values.
    """
    given = dict(_leaf_items(context.config_loader.runtime_params or {}))
    substitutions = rehearsal_substitutions(
        raw_params,
        env=env,
        project=Path(context.project_path),
        conf_source=context.config_loader.conf_source,
        pipelines=requested_pipelines(),
    )
    for key in [k for k in substitutions.values if k in given and k not in ("data.root", "data.source")]:
        del substitutions.values[key]  # set by --params: the user's value stands
    loader = context.config_loader
    loader.runtime_params = _deep_merge(loader.runtime_params or {}, substitutions.nested())
    # The catalog's files (final checkpoints, histories, reports, the manifest) move under data/fast_dev_run/<env>/
    # too. A key set on the loader is returned as it is (OmegaConfigLoader.__getitem__), and KedroContext builds
    # the catalog from loader["catalog"].
    loader["catalog"] = {
        name: {**entry, "filepath": fast_dev_run.relocated(entry["filepath"], env)}
        if isinstance(entry, dict) and str(entry.get("filepath", "")).startswith("data/")
        else entry
        for name, entry in loader["catalog"].items()
    }
    logger.info("fast_dev_run: %s", substitutions.summary())
    return substitutions


def configuration_env(conf_source: str | Path, env: str | None) -> str:
    """The environment the configuration came from: ``env`` when given; without it Kedro applies
    conf/local on top of conf/base, so ``local`` when conf/local holds a configuration file, else ``base``."""
    if env:
        return env
    local = Path(conf_source) / "local"
    has_files = local.is_dir() and any(p.suffix in (".yml", ".yaml", ".json") for p in local.rglob("*"))
    return "local" if has_files else "base"


# run_params entries that run only part of the pipelines
NODE_FILTERS = ("node_names", "from_nodes", "to_nodes", "from_inputs", "to_outputs", "tags", "namespaces")


def invoked_command() -> str | None:
    """The command line of this run when it was started from one (``kedro run …`` with every option)."""
    context = click.get_current_context(silent=True)
    if context is None:
        return None
    program = "kedro" if context.parent is not None else "python -m pipelines"
    return shlex.join([program, *sys.argv[1:]])


def requested_pipelines() -> list[str] | None:
    """The pipelines ``kedro run`` was asked for (``--pipelines``, ``--pipeline``), or ``None`` when it names none
    (its node filters may pick any pipeline) or runs outside a command line."""
    context = click.get_current_context(silent=True)
    names = context and (context.params.get("pipelines") or context.params.get("pipeline"))
    if not names:
        return None
    names = names if isinstance(names, list | tuple) else str(names).split(",")
    return [name.strip() for name in names]


def runner_name(described: str) -> str:
    """``SequentialRunner`` for Kedro's ``<kedro.runner.sequential_runner.SequentialRunner object at 0x…>``."""
    found = re.search(r"(\w+) object at 0x", described)
    return found[1] if found else described


def require_environment(conf_source: str | Path, env: str | None) -> None:
    """Refuse an ``--env`` that names no folder of ``conf_source``, listing those that exist (``local`` may be
    absent: it is optional)."""
    if env is None or env == "local" or (Path(conf_source) / env).is_dir():
        return
    existing = sorted(p.name for p in Path(conf_source).iterdir() if p.is_dir() and not p.name.startswith("."))
    raise click.ClickException(
        f"configuration environment {env!r} does not exist: {_shown_path(Path(conf_source))}/ holds "
        f"{', '.join(existing)}; choose one of those with --env (base is the CPU default, used without --env)"
    )


class ProjectHooks:
    @hook_impl(tryfirst=True)  # before kedro-mlflow's hook reads mlflow.yml of a missing environment
    def after_context_created(self, context) -> None:
        require_environment(context.config_loader.conf_source, context.env)
        # The raw configuration (runtime --params merged in), not context.params: that property runs
        # Kedro's own typed-parameter validation, which imports every pipeline's nodes (MindSpore)
        # and stops at the first failing section; this check reports every problem in well under a second.
        env = context.env or "local"
        sources = parameter_sources(context.config_loader.conf_source, env, getattr(context, "_runtime_params", None))
        raw_params = context.config_loader["parameters"]
        self._fast_dev_run = None
        if raw_params.get("runtime", {}).get("fast_dev_run") is True:
            self._fast_dev_run = rehearse_on_cpu(context, env, raw_params)
            sources |= dict.fromkeys(self._fast_dev_run.values, "runtime.fast_dev_run")
            raw_params = context.config_loader["parameters"]
        try:
            params = validate_parameters(raw_params, sources)
            require_device(params.runtime.device_target, env)
        except (ParameterError, DeviceUnavailableError) as error:
            # click prints a ClickException as one "Error: ..." line instead of a traceback
            raise click.ClickException(str(error)) from error
        self._raw_params = raw_params
        self._device_target = params.runtime.device_target
        self._env = env
        runtime_params = getattr(context, "_runtime_params", None) or {}
        configured = configured_values(context.config_loader.conf_source, env)
        self._overrides = {k: v for k, v in _leaf_items(runtime_params) if k not in configured or configured[k] != v}
        self._config_env = configuration_env(context.config_loader.conf_source, context.env)
        self._identity = {"model": params.model.name, "image_size": params.data.image_size, "seed": params.runtime.seed}
        self._context = context

    @hook_impl(tryfirst=True)  # before kedro-mlflow's hook logs the node's parameters
    def before_node_run(self, node, inputs: dict) -> None:
        # Kedro gives the hooks a copy of the node's inputs. In that copy, typed parameters (models)
        # go back to the mappings of the configuration, so that kedro-mlflow logs them flattened, one
        # MLflow param per key with its YAML value (thor.lr.lr_init), not one param holding a model's
        # repr; the node itself still receives the models.
        for name, value in inputs.items():
            if name.startswith("params:") and isinstance(value, BaseModel):
                raw = self._raw_params
                for key in name.removeprefix("params:").split("."):
                    raw = raw[key]
                inputs[name] = raw

    @hook_impl(trylast=True)  # after kedro-mlflow's hook has started the run
    def before_pipeline_run(self, run_params: dict, pipeline, catalog) -> None:
        self._catalog = catalog  # after_dataset_saved asks it whether a dataset is stored
        names = run_params.get("pipeline_names") or [run_params.get("pipeline_name") or "__default__"]
        partial = any(run_params.get(key) for key in (*NODE_FILTERS, "only_missing_outputs"))
        chosen_env = self._config_env if self._config_env not in ("base", "local") else None
        rehearsal = getattr(self, "_fast_dev_run", None)
        keys = list(_leaf_keys(self._raw_params))
        set_run_name(run_name(names, chosen_env, self._overrides, keys, partial, fast_dev_run=rehearsal is not None))
        command = invoked_command()
        set_tags(
            {
                "pipeline": "+".join(names),
                "env": self._config_env,
                "device_target": self._device_target,
                "git_commit": _git_commit(Path(run_params["project_path"])),
                "runner": runner_name(str(run_params.get("runner") or "SequentialRunner")),
                **({"kedro_command": command} if command else {}),  # else kedro-mlflow's, without --params/--env
                **{key: str(value) for key, value in self._identity.items()},
                **run_identity(),
                DESCRIPTION_TAG: run_description(command, self._config_env, self._overrides),
                # the report skips runs with this tag: a rehearsal, not a result
                **({fast_dev_run.TAG: rehearsal.summary()} if rehearsal is not None else {}),
            }
        )
        self._data_size_tagged = False
        mark_orphaned_runs_killed()
        self._run_id = active_run_id()
        hand_off_runs_with(MlflowRunHandoff.capture)  # msrun's rank 0 logs into this run (or a child)
        # Installed here, after MindSpore has loaded, so that no handler of its own replaces ours.
        # The exception ends the node like any error: kedro-mlflow closes the run, and
        # on_pipeline_error marks it KILLED; files are written by rename, so none is half-written.
        self._previous_handlers = signals.install()

    @hook_impl
    def after_dataset_loaded(self, dataset_name: str, data) -> None:
        self._tag_data_size(dataset_name, data)

    @hook_impl
    def after_dataset_saved(self, dataset_name: str, data) -> None:
        self._tag_data_size(dataset_name, data)
        if isinstance(data, Checkpoint) and self._stored(dataset_name):
            # a training's final state is on disk: its periodic checkpoints are no longer the only copy
            remove_finished_checkpoints(data)

    def _stored(self, dataset_name: str) -> bool:
        """Whether the catalog keeps ``dataset_name`` in storage (not in memory) and it is there, as Kedro's
        runner decides it (``_EPHEMERAL``: MemoryDataset, the default for a name the catalog lacks)."""
        catalog = getattr(self, "_catalog", None)
        if catalog is None or dataset_name not in catalog:
            return False
        return not getattr(catalog.get(dataset_name), "_EPHEMERAL", False) and catalog.exists(dataset_name)

    def _tag_data_size(self, dataset_name: str, data) -> None:
        """Tag the run with the size of the data it uses, from the first manifest it saves or loads."""
        if getattr(self, "_data_size_tagged", True) or dataset_name.rsplit(".", 1)[-1] != "manifest":
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
    def on_node_error(self, error: Exception, node) -> None:
        # pipelines.cli's Error: block names the node from this note
        error.add_note(NODE_NOTE + node.name)

    @hook_impl
    def after_pipeline_run(self, run_params: dict, run_result, pipeline, catalog) -> None:
        self._restore_handlers()
        if getattr(self, "_run_id", None) is not None:
            self._print_links()

    @hook_impl(trylast=True)  # after kedro-mlflow's hook has ended the run FAILED
    def on_pipeline_error(self, error: Exception, run_params: dict, pipeline, catalog) -> None:
        self._restore_handlers()
        if getattr(self, "_run_id", None) is None:
            return
        if isinstance(error, signals.Interrupted):
            mark_killed(self._run_id)
        # the same text as the command's Error: block
        message = error.format_message() if isinstance(error, click.ClickException) else Failure.of(error).summary()
        tag_failure(self._run_id, message)

    def _print_links(self) -> None:
        """Where to see the run: the chart comparing its runs (and the runs table) at the tracking server's address,
        or at ``mlflow ui``'s over a local store (kedro-mlflow's ``mlflow.yml``: ``server``, ``ui``)."""
        config = getattr(getattr(self, "_context", None), "mlflow", None)
        ui = getattr(config, "ui", None)
        base = ui_base_url(current_tracking_uri(), getattr(ui, "host", "127.0.0.1"), getattr(ui, "port", 5000))
        local = "" if base_is_server(current_tracking_uri()) else " (start `mlflow ui` first, README)"
        experiment_id = experiment_of(self._run_id)
        # the image recipes' top-1, else a language model's masked-LM accuracy (thor_bert)
        metric, compared = next(
            ((metric, runs) for metric in COMPARED_METRICS if (runs := runs_to_compare(self._run_id, metric))),
            (None, []),
        )
        # printed, not logged: the console's log handler wraps lines at its width and would break the links
        if compared:
            url = comparison_url(base, experiment_id, compared, metric)
            click.echo(f"MLflow: compare the runs at {url}{local}")
        click.echo(f"MLflow: the runs table is {runs_page_url(base, experiment_id)}")

    def _restore_handlers(self) -> None:
        signals.restore(getattr(self, "_previous_handlers", {}))  # and no deferred stop after the run
        self._previous_handlers = {}
