"""Project hooks: validate parameters and fail fast on a missing device; tag the MLflow run;
turn SIGINT/SIGTERM into an orderly stop whose MLflow run ends KILLED, and end KILLED the runs
of earlier processes that were killed outright."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
from pathlib import Path

import click
import mlflow
from kedro.framework.hooks import hook_impl
from mlflow.entities import RunStatus

from .config_validation import ParameterError, base_schema, parameter_sources, validate_parameters
from pipelines.engine.runtime import DeviceUnavailableError, require_device
from pipelines.tracking import set_tags

STOP_SIGNALS = (signal.SIGINT, signal.SIGTERM)


class Interrupted(click.ClickException):
    """The run received SIGINT or SIGTERM; it stops like a failing node, and exits 128 + the signal number.

    MindSpore's graph runtime installs a SIGINT handler of its own each time it compiles a graph,
    which raises SIGTERM instead, so Ctrl-C during training arrives here as SIGTERM.
    """

    def __init__(self, signum: int):
        name = signal.Signals(signum).name
        super().__init__(f"interrupted ({name}); rerun the same command to resume from the last full checkpoint")
        self.exit_code = 128 + signum


def _raise_interrupted(signum: int, frame) -> None:
    # a second signal while the run winds down stops the process at once
    for stop_signal in STOP_SIGNALS:
        signal.signal(stop_signal, signal.SIG_DFL)
    raise Interrupted(signum)


def _git_commit(project_path: Path) -> str:
    try:
        return subprocess.run(
            ["git", "rev-parse", "HEAD"], cwd=project_path, capture_output=True, text=True, check=True, timeout=10
        ).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        return "unknown"


class ProjectHooks:
    @hook_impl
    def after_context_created(self, context) -> None:
        conf_source = Path(context.config_loader.conf_source)
        base = base_schema(conf_source)
        env = context.env or "local"
        runtime_params = getattr(context, "_runtime_params", None)
        params = context.params
        try:
            validate_parameters(params, base, parameter_sources(conf_source, env, runtime_params))
            require_device(params["runtime"]["device_target"], env)
        except (ParameterError, DeviceUnavailableError) as error:
            # click prints a ClickException as one "Error: ..." line instead of a traceback
            raise click.ClickException(str(error)) from error
        self._device_target = params["runtime"]["device_target"]
        self._env = env

    @hook_impl(trylast=True)  # after kedro-mlflow's hook has started the run
    def before_pipeline_run(self, run_params: dict, pipeline, catalog) -> None:
        names = run_params.get("pipeline_names") or [run_params.get("pipeline_name") or "__default__"]
        set_tags(
            {
                "pipeline": "+".join(names),
                "env": run_params.get("env") or self._env or "local",
                "device_target": self._device_target,
                "git_commit": _git_commit(Path(run_params["project_path"])),
                "pid": str(os.getpid()),
                "host": socket.gethostname(),
            }
        )
        mark_orphaned_runs_killed()
        active = mlflow.active_run()
        self._run_id = active.info.run_id if active is not None else None
        # Installed here, after MindSpore has loaded, so that no handler of its own replaces ours.
        # The exception ends the node like any error: kedro-mlflow closes the run, and
        # on_pipeline_error marks it KILLED; files are written by rename, so none is half-written.
        self._previous_handlers = {s: signal.signal(s, _raise_interrupted) for s in STOP_SIGNALS}

    @hook_impl
    def after_pipeline_run(self, run_params: dict, run_result, pipeline, catalog) -> None:
        self._restore_handlers()

    @hook_impl(trylast=True)  # after kedro-mlflow's hook has ended the run FAILED
    def on_pipeline_error(self, error: Exception, run_params: dict, pipeline, catalog) -> None:
        self._restore_handlers()
        if isinstance(error, Interrupted) and self._run_id is not None:
            mlflow.MlflowClient().set_terminated(self._run_id, RunStatus.to_string(RunStatus.KILLED))

    def _restore_handlers(self) -> None:
        for stop_signal, handler in getattr(self, "_previous_handlers", {}).items():
            signal.signal(stop_signal, handler)
        self._previous_handlers = {}


def _process_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def mark_orphaned_runs_killed() -> None:
    """Runs left RUNNING by a process of this host that no longer exists (kill -9) end KILLED."""
    active = mlflow.active_run()
    if active is None:
        return
    client = mlflow.MlflowClient()
    host = socket.gethostname()
    for run in client.search_runs([active.info.experiment_id], "attributes.status = 'RUNNING'"):
        pid = run.data.tags.get("pid")
        if run.info.run_id == active.info.run_id or run.data.tags.get("host") != host or not (pid or "").isdigit():
            continue
        if not _process_alive(int(pid)):
            client.set_terminated(run.info.run_id, RunStatus.to_string(RunStatus.KILLED))
