"""The configuration of a run, checked before anything starts: ``ConfigurationHooks``.

Before any MLflow run exists, and in well under a second: the ``--env`` names an existing environment, no
parameter file nor ``--params`` uses a renamed key or value (``trainlib.params.renames``), a
``runtime.fast_dev_run`` rehearsal gets its substitutions (``hooks.rehearsal``), every parameter is validated
against ``trainlib.params`` (every problem named with its dotted key and the file, or ``--params``, it came
from), and the device the configuration targets exists. What it found, ``RunConfiguration``, is what the hooks
that name and tag the MLflow run read (``ConfigurationHooks.configuration``).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import click
from kedro.framework.hooks import hook_impl

from pipelines.hooks.command_line import requested_pipelines
from pipelines.hooks.config_files import ParameterFiles, configuration_env, leaf_items, require_environment
from pipelines.hooks.rehearsal import rehearse_on_cpu
from pipelines.tracking.outage import set_server_retry_window
from trainlib.engine.runtime import DeviceUnavailableError, require_device
from trainlib.fast_dev_run import Substitutions
from trainlib.params import ParameterError, Parameters, validate_parameters
from trainlib.params.renames import renamed_in


@dataclass(frozen=True)
class RunConfiguration:
    """The configuration of one run, as ``ConfigurationHooks`` validated it."""

    env: str  # where it came from: --env, else local or base (config_files.configuration_env)
    raw_params: dict  # the merged parameters as the configuration's mappings (fast_dev_run's substitutions in)
    params: Parameters  # the same, validated
    overrides: dict[str, Any] = field(default_factory=dict)  # --params that change the configuration, dotted
    rehearsal: Substitutions | None = None  # runtime.fast_dev_run's substitutions, or None for a real run

    @property
    def identity(self) -> dict[str, str]:
        """What tells the run's results apart besides its pipelines: the network, image size and seed."""
        params = self.params
        return {
            "network": params.network.name,
            "image_size": str(params.data.image_size),
            "seed": str(params.runtime.seed),
        }


class ConfigurationHooks:
    """Checks the configuration as soon as Kedro has built its context; ``configuration`` is what it found."""

    def __init__(self) -> None:
        self._configuration: RunConfiguration | None = None

    @property
    def configuration(self) -> RunConfiguration:
        """The configuration of the current run (set by ``after_context_created``)."""
        if self._configuration is None:
            raise RuntimeError("no run configuration: Kedro has not created the run's context yet")
        return self._configuration

    @hook_impl(tryfirst=True)  # before kedro-mlflow's hook reads mlflow.yml of a missing environment
    def after_context_created(self, context) -> None:
        self._configuration = None
        loader = context.config_loader
        require_environment(loader.conf_source, context.env)
        env = context.env or loader.default_run_env
        given = dict(loader.runtime_params or {})  # --params, before fast_dev_run adds its substitutions
        files = ParameterFiles(loader.conf_source, env)
        refuse_renamed(files, given)
        # The raw configuration (--params merged in), not context.params: that property runs Kedro's own
        # typed-parameter validation, which imports every pipeline's nodes (MindSpore) and stops at the first
        # failing section; this check reports every problem in well under a second.
        raw_params = loader["parameters"]
        rehearsal = None
        if raw_params.get("runtime", {}).get("fast_dev_run") is True:
            rehearsal = rehearse_on_cpu(loader, env, raw_params, files.of_environment(), Path(context.project_path))
            raw_params = loader["parameters"]

        def sources() -> dict[str, str]:
            substituted = rehearsal.values if rehearsal is not None else ()
            return files.sources(given) | dict.fromkeys(substituted, "runtime.fast_dev_run")

        try:
            params = validated(raw_params, sources)
            require_device(params.runtime.device_target, env, rehearsal=rehearsal_command(context.env))
        except (ParameterError, DeviceUnavailableError) as error:
            # click prints a ClickException as one "Error: ..." line instead of a traceback
            raise click.ClickException(str(error)) from error
        # MLflow's retries cover the server's restart window from the first request, kedro-mlflow's next (it opens the
        # experiment); this hook runs first
        set_server_retry_window(params.tracking.server_retry_window_s)
        self._configuration = RunConfiguration(
            env=configuration_env(loader.conf_source, context.env),
            raw_params=raw_params,
            params=params,
            overrides=overrides(given, files),
            rehearsal=rehearsal,
        )


def refuse_renamed(files: ParameterFiles, given: dict) -> None:
    """Stop, naming every file (or ``--params``) that still uses a renamed key or value, and its new name."""
    lines = [f"  {source}: {line}" for source, parameters in files.each(given) for line in renamed_in(parameters)]
    if lines:
        raise click.ClickException("renamed parameters:\n" + "\n".join(lines))


def rehearsal_command(env: str | None, pipelines: list[str] | None = None) -> str | None:
    """The ``kedro run`` that rehearses ``env``'s recipe on this CPU (``runtime.fast_dev_run``) for ``pipelines``
    (default: the ones this command line asked for); ``None`` without an ``--env``."""
    if not env:
        return None
    pipelines = requested_pipelines() if pipelines is None else pipelines
    named = f" --pipelines={','.join(pipelines)}" if pipelines else ""
    return f'kedro run{named} --env={env} --params="runtime.fast_dev_run=true"'


def validated(raw_params: dict, sources: Callable[[], dict[str, str]]) -> Parameters:
    """``raw_params`` validated; when they are not valid, the ``ParameterError`` names the file each key came from
    (``sources()``, read only then: it loads every parameter file once more)."""
    try:
        return validate_parameters(raw_params)
    except ParameterError:
        return validate_parameters(raw_params, sources())  # raises again, with the files


def overrides(given: dict, files: ParameterFiles) -> dict[str, Any]:
    """The dotted keys of ``--params`` (``given``) that change the configuration ``files`` set, with their values."""
    if not given:
        return {}
    configured = dict(leaf_items(files.merged()))
    return {key: value for key, value in leaf_items(given) if key not in configured or configured[key] != value}
