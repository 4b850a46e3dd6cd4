"""The state of MLflow runs: the active run, child runs, and runs that ended badly (a failure, an interruption, a
process killed outright).

A run is tagged with the ``pid`` and ``host`` of its process (``run_identity``), so that a later run on the same
host can end KILLED the runs whose process no longer exists (``mark_orphaned_runs_killed``), and with the machine it
ran on (``machine.cpu``, ``machine.isa``, ... : ``engine.runtime.describe_machine``), so that a figure names it.
"""

from __future__ import annotations

import os
import socket

import mlflow
from mlflow.entities import RunStatus
from mlflow.exceptions import MlflowException

from trainlib.engine.runtime import describe_machine
from trainlib.processes import process_alive
from trainlib.redaction import redact

# MLflow refuses longer tag values (mlflow.utils.validation.MAX_TAG_VAL_LENGTH)
TAG_VALUE_LIMIT = 8000
MACHINE_TAG_PREFIX = "machine."


def active_run_id() -> str | None:
    """The id of the active MLflow run, or None."""
    active = mlflow.active_run()
    return None if active is None else active.info.run_id


def child_runs(run_id: str) -> list:
    """The child runs (``trainings.training_run``) of run ``run_id``."""
    client = mlflow.MlflowClient()
    experiment_id = client.get_run(run_id).info.experiment_id
    return client.search_runs([experiment_id], f"tags.mlflow.parentRunId = '{run_id}'")


def machine_tags() -> dict[str, str]:
    """The machine this process runs on, as ``machine.<key>`` tags (``describe_machine``)."""
    return {MACHINE_TAG_PREFIX + key: value for key, value in describe_machine().items()}


def run_identity() -> dict[str, str]:
    """Where a run runs: its process, so that a later run can find it if the process is killed outright
    (``mark_orphaned_runs_killed``), and its machine (``machine_tags``); every run and child run is tagged so."""
    return {"pid": str(os.getpid()), "host": socket.gethostname(), **machine_tags()}


def experiment_created_meanwhile(error: BaseException) -> bool:
    """Whether ``error`` is the server refusing to create an experiment because another process has just created
    it (``RESOURCE_ALREADY_EXISTS``)."""
    return isinstance(error, MlflowException) and error.error_code == "RESOURCE_ALREADY_EXISTS"


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
        if not process_alive(int(pid)):
            client.set_terminated(run.info.run_id, RunStatus.to_string(RunStatus.KILLED))


def mark_killed(run_id: str) -> None:
    """End run ``run_id`` and its child runs KILLED (an interrupted ``kedro run``)."""
    client = mlflow.MlflowClient()
    for killed in [run_id, *(child.info.run_id for child in child_runs(run_id))]:
        client.set_terminated(killed, RunStatus.to_string(RunStatus.KILLED))


def tag_failure(run_id: str, message: str) -> None:
    """Tag run ``run_id`` and its child runs that did not finish with ``error`` = ``message``."""
    client = mlflow.MlflowClient()
    unfinished = [child.info.run_id for child in child_runs(run_id) if child.info.status != "FINISHED"]
    for failed in [run_id, *unfinished]:
        client.set_tag(failed, "error", redact(message)[:TAG_VALUE_LIMIT])
