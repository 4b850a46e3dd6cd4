"""Everything MLflow: the only module that imports it (the library reaches MLflow through what is here).

- ``EpochMetrics``: the engine callback that logs each epoch's row to the active run (step = epoch,
  the row's own wall-clock time) and, on resume, the rows of the epochs before, so a resumed run
  holds every epoch from 1;
- ``training_run(name)``: a child run of the ``kedro run``'s run for one of several trainings of a
  pipeline (dim_reduce's stage1, stage2, control);
- ``log_final``, ``log_metrics``, ``set_tags``: no-ops outside an active run (library tests, ranks > 0);
- ``MlflowRunHandoff``: hands the active run to global rank 0 of an msrun job (``distributed.launch``).

Metric keys follow the schema of ``pipelines.engine.loop`` (``train/loss``, ``val/top1``, …,
``final/top1``).
"""

from __future__ import annotations

import json
import logging
import math
import os
import socket
import tempfile
import time
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import quote

import mlflow
import pandas as pd
from mlflow.entities import Metric, Run, RunStatus
from mlflow.exceptions import MlflowException

from pipelines.engine.callbacks import Callback
from pipelines.metrics import FINAL_PREFIX, STEP_KEY, TIMESTAMP_KEY, VAL_TOP1

logger = logging.getLogger(__name__)

# MLflow accepts at most 1000 metrics per log_batch call
BATCH_LIMIT = 1000


def _finite(value) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool) and math.isfinite(value)


def log_metrics(metrics: Mapping[str, float], step: int | None = None) -> None:
    """Log finite numeric ``metrics`` to the active MLflow run, if there is one."""
    if mlflow.active_run() is None:
        return
    finite = {k: float(v) for k, v in metrics.items() if _finite(v)}
    if finite:
        mlflow.log_metrics(finite, step=step)


FINAL_FIGURES = ("top1", "top5", "mlm_accuracy", "mlm_loss", "nsp_accuracy")  # what a final evaluation may hold


def log_final(figures: Mapping[str, float]) -> None:
    """Log a final evaluation (``top1``, ``top5`` fractions; a language model's ``mlm_accuracy``, ``mlm_loss``,
    ``nsp_accuracy``) as ``final/top1``, …; other keys of ``figures`` (a report's ``epoch``) are not metrics."""
    log_metrics({FINAL_PREFIX + k: figures[k] for k in FINAL_FIGURES if k in figures})


def set_tags(tags: Mapping[str, str]) -> None:
    """Set ``tags`` on the active MLflow run, if there is one."""
    if mlflow.active_run() is not None:
        mlflow.set_tags(dict(tags))


def log_artifact(path: str | Path, artifact_path: str) -> None:
    """Copy the file ``path`` into the active run's artifacts, folder ``artifact_path``, if there is a run."""
    if mlflow.active_run() is not None:
        mlflow.log_artifact(str(path), artifact_path)


def set_run_name(name: str) -> None:
    """Rename the active MLflow run, if there is one (the runs table's first column)."""
    active = mlflow.active_run()
    if active is not None:
        mlflow.MlflowClient().update_run(active.info.run_id, name=name)


# MLflow refuses longer tag values (mlflow.utils.validation.MAX_TAG_VAL_LENGTH)
TAG_VALUE_LIMIT = 8000


def tag_failure(run_id: str, message: str) -> None:
    """Tag run ``run_id`` and its child runs that did not finish with ``error`` = ``message``."""
    client = mlflow.MlflowClient()
    unfinished = [child.info.run_id for child in child_runs(run_id) if child.info.status != "FINISHED"]
    for failed in [run_id, *unfinished]:
        client.set_tag(failed, "error", message[:TAG_VALUE_LIMIT])


# A run's tag listing, comma-separated, the runs it compared (the report's), for the closing comparison link
COMPARED_RUNS_TAG = "compared_runs"
WORKFLOW = "workflowType=machine_learning"  # MLflow 3's UI otherwise shows its GenAI pages


def ui_base_url(tracking_uri: str, host: str, port: str | int) -> str:
    """Where the MLflow UI of ``tracking_uri`` is: the tracking server itself when it is one (``http(s)://``),
    else ``mlflow ui`` over the local store at ``host``:``port`` (``mlflow.yml``'s ``ui``)."""
    if base_is_server(tracking_uri):
        return tracking_uri.rstrip("/")
    return f"http://{host}:{port}"


def current_tracking_uri() -> str:
    return mlflow.get_tracking_uri()


def base_is_server(tracking_uri: str) -> bool:
    """Whether ``tracking_uri`` is a tracking server (whose own address serves the UI)."""
    return tracking_uri.startswith(("http://", "https://"))


def experiment_of(run_id: str) -> str:
    return mlflow.MlflowClient().get_run(run_id).info.experiment_id


def runs_page_url(base: str, experiment_id: str) -> str:
    """The MLflow UI's runs table of experiment ``experiment_id``, in model-training mode."""
    return f"{base}/#/experiments/{experiment_id}/runs?{WORKFLOW}"


def comparison_url(base: str, experiment_id: str, run_ids: Sequence[str], metric: str = VAL_TOP1) -> str:
    """The MLflow UI's chart of ``metric`` with one line per run of ``run_ids``, all drawn, in model-training mode.

    MLflow 3.17's runs page keeps which runs its charts draw, and their order, in the browser (local storage);
    only its search facets come from the URL. Its metric page takes the runs and the metric from the URL, so this
    link opens on exactly the runs to compare, whatever the browser saw before.
    """
    query = "&".join(
        [
            f"runs={quote(json.dumps(list(run_ids)), safe='[],')}",
            f"metric={quote(json.dumps(metric))}",
            f"experiments={quote(json.dumps([experiment_id]), safe='[]')}",
            f"plot_metric_keys={quote(json.dumps([metric]))}",
            "plot_layout={}",
            "x_axis=step",
            "y_axis_scale=linear",
            "line_smoothness=1",
            "show_point=true",
            "deselected_curves=[]",
            "last_linear_y_axis_range=[]",
            WORKFLOW,
        ]
    )
    return f"{base}/#/metric?{query}"


def record_compared_runs(run_ids: Sequence[str]) -> None:
    """Tag the active run with ``run_ids`` and their child runs (dim_reduce's trainings): what it compared."""
    compared = [
        child.info.run_id
        for run_id in run_ids
        for child in (mlflow.MlflowClient().get_run(run_id), *child_runs(run_id))
    ]
    set_tags({COMPARED_RUNS_TAG: ",".join(dict.fromkeys(compared))})  # once each: a child may be named too


def runs_to_compare(run_id: str, metric: str = VAL_TOP1) -> list[str]:
    """The runs a ``kedro run``'s comparison link draws: its own run and its child runs that logged ``metric`` (a
    training pipeline's, the study's trainings), and the runs its ``compared_runs`` tag names (the report's)."""
    client = mlflow.MlflowClient()
    run = client.get_run(run_id)
    candidates = [run, *child_runs(run_id)]
    named = run.data.tags.get(COMPARED_RUNS_TAG, "")
    candidates += [client.get_run(other) for other in named.split(",") if other]
    return list(dict.fromkeys(candidate.info.run_id for candidate in candidates if metric in candidate.data.metrics))


def log_epoch_rows(rows: Sequence[Mapping[str, float]], step_key: str = "epoch") -> None:
    """Log per-epoch rows to the active run: every finite value, step = the row's epoch, at the row's time.

    ``step_key`` names the column that is the step instead (e.g. ``step`` for per-step rows).
    """
    active = mlflow.active_run()
    if active is None:
        return
    metrics = []
    for row in rows:
        timestamp_ms = int(1000 * row.get(TIMESTAMP_KEY, time.time()))
        step = int(row[step_key])
        metrics += [
            Metric(key, float(value), timestamp_ms, step)
            for key, value in row.items()
            if key not in (step_key, TIMESTAMP_KEY) and _finite(value)
        ]
    client = mlflow.MlflowClient()
    for first in range(0, len(metrics), BATCH_LIMIT):
        client.log_batch(active.info.run_id, metrics=metrics[first : first + BATCH_LIMIT])


class EpochMetrics(Callback):
    """Logs each epoch's row to the active MLflow run as it ends (step = epoch, at the row's time).

    On resume it logs the rows of the epochs before, carried by the checkpoint, and tags the run
    ``resumed_from`` = the checkpoint's path, so the resumed run holds every epoch from 1.
    """

    def on_resume(self, source: Path, history: Sequence[Mapping[str, float]]) -> None:
        set_tags({"resumed_from": str(source)})
        log_epoch_rows(history)

    def on_epoch_end(self, epoch: int, metrics: dict[str, float]) -> None:
        log_epoch_rows([metrics])

    def on_step_evaluation(self, row: Mapping[str, float]) -> None:
        log_epoch_rows([row], step_key=STEP_KEY)  # val/step_top1, train/elapsed_s, ... at step = global step


def run_identity() -> dict[str, str]:
    """Tags that let a later run find this one if its process is killed outright (``hooks``)."""
    return {"pid": str(os.getpid()), "host": socket.gethostname()}


def flat_params(sections: Mapping[str, object]) -> dict[str, str]:
    """Parameter sections (``{"dim_reduce.stage2": Stage2Params(...)}``, models or mappings) as MLflow params,
    one per leaf under its dotted key (``dim_reduce.stage2.rho``), as kedro-mlflow logs a ``kedro run``'s."""
    flat: dict[str, str] = {}

    def visit(prefix: str, value) -> None:
        value = value.model_dump() if hasattr(value, "model_dump") else value
        if isinstance(value, Mapping) and value:
            for key, inner in value.items():
                visit(f"{prefix}.{key}", inner)
        else:
            flat[prefix] = value if isinstance(value, str) else json.dumps(value)

    for prefix, section in sections.items():
        visit(prefix, section)
    return flat


@contextmanager
def training_run(name: str, params: Mapping[str, object] | None = None) -> Iterator[mlflow.ActiveRun | None]:
    """Inside the active (``kedro run``'s) run, the child run ``name`` (tag ``training=<name>``; named
    ``<pipeline>/<name>``), active meanwhile; a new one logs the parameter sections ``params`` (``flat_params``),
    so MLflow's Compare shows each training's own settings.

    A child of that name already under the parent is continued (the node that evaluates a training
    logs into the training's run). Outside an active run it does nothing. The child ends FINISHED, or
    FAILED when the block raises.
    """
    parent = mlflow.active_run()
    if parent is None:
        yield None
        return
    client = mlflow.MlflowClient()
    found = client.search_runs(
        [parent.info.experiment_id],
        f"tags.mlflow.parentRunId = '{parent.info.run_id}' and tags.training = '{name}'",
    )
    if found:
        run = mlflow.start_run(run_id=found[0].info.run_id, nested=True)
    else:
        # named after its parent's pipeline too (dim_reduce/stage2), so its own page says whose it is
        pipeline = client.get_run(parent.info.run_id).data.tags.get("pipeline")
        title = f"{pipeline}/{name}" if pipeline else name
        run = mlflow.start_run(run_name=title, nested=True, tags={"training": name, **run_identity()})
        if params:
            mlflow.log_params(flat_params(params))
    try:
        yield run
    except BaseException:
        mlflow.end_run(status="FAILED")
        raise
    mlflow.end_run()


class StudyRuns:
    """MLflow for a study (``study.runner.StudyTracking``): each training a child run of the study's run, with
    its tags, per-epoch rows (``EpochMetrics``) and final accuracy."""

    @contextmanager
    def run(self, name: str, tags: Mapping[str, str], params: Mapping[str, object]) -> Iterator[str | None]:
        with training_run(name, params) as run:
            set_tags(tags)
            yield None if run is None else run.info.run_id

    def callbacks(self) -> list[Callback]:
        return [EpochMetrics()]

    def log_final(self, accuracy: Mapping[str, float]) -> None:
        log_final(accuracy)


def child_runs(run_id: str) -> list:
    """The child runs (``training_run``) of run ``run_id``."""
    client = mlflow.MlflowClient()
    experiment_id = client.get_run(run_id).info.experiment_id
    return client.search_runs([experiment_id], f"tags.mlflow.parentRunId = '{run_id}'")


@dataclass(frozen=True)
class MlflowRunHandoff:
    """The caller's active run, handed to global rank 0 of an msrun job (``distributed.launch.launch``).

    Pickled into the job; in the worker ``attached()`` makes the run active meanwhile and hands it back
    RUNNING; in the caller ``reclaim()`` marks it RUNNING again (it is still the caller's run).
    """

    tracking_uri: str
    run_id: str

    @classmethod
    def capture(cls) -> MlflowRunHandoff | None:
        """The hand-off of the active run, or None without one."""
        active = mlflow.active_run()
        return None if active is None else cls(mlflow.get_tracking_uri(), active.info.run_id)

    @contextmanager
    def attached(self) -> Iterator[None]:
        mlflow.set_tracking_uri(self.tracking_uri)
        mlflow.start_run(run_id=self.run_id)
        try:
            yield
        finally:
            mlflow.end_run(status="RUNNING")

    def reclaim(self) -> None:
        mlflow.MlflowClient().update_run(self.run_id, status="RUNNING")


class MlflowRunReader:
    """Read access to one MLflow experiment as plain data, for ``pipelines.report.compare`` (its
    ``RunReader``): runs as ``RunRecord`` dicts, metric histories and CSV artifacts as DataFrames."""

    def __init__(self, tracking_uri: str, experiment_name: str):
        self.tracking_uri = tracking_uri
        self.experiment_name = experiment_name
        self._client = mlflow.MlflowClient(tracking_uri=tracking_uri)
        experiment = self._client.get_experiment_by_name(experiment_name)
        self._experiment_id = experiment.experiment_id if experiment is not None else None
        self.experiment_exists = experiment is not None

    @classmethod
    def of_active_run(cls) -> MlflowRunReader:
        """The store and experiment of the active run (what kedro-mlflow set up from ``mlflow.yml``)."""
        active = mlflow.active_run()
        if active is None:
            raise RuntimeError(
                "the report pipeline reads the MLflow experiment of its own run, but no run is active: "
                "is tracking disabled for it in conf/base/mlflow.yml (tracking.disable_tracking.pipelines)?"
            )
        return cls(mlflow.get_tracking_uri(), mlflow.get_experiment(active.info.experiment_id).name)

    @staticmethod
    def _record(run: Run) -> dict:
        return {
            "run_id": run.info.run_id,
            "run_name": run.info.run_name,
            "status": run.info.status,
            "start_time_ms": run.info.start_time,
            "end_time_ms": run.info.end_time,
            "tags": dict(run.data.tags),
            "params": dict(run.data.params),
            "metric_keys": sorted(run.data.metrics),
        }

    def search(self, filter_string: str) -> list[dict]:
        """The experiment's runs matching ``filter_string`` (MLflow search syntax), newest first."""
        if self._experiment_id is None:
            return []
        records, token = [], None
        while True:
            page = self._client.search_runs(
                [self._experiment_id], filter_string, order_by=["attributes.start_time DESC"], page_token=token
            )
            records += [self._record(run) for run in page]
            token = page.token
            if not token:
                return records

    def get(self, run_id: str) -> dict | None:
        """The run ``run_id``, or ``None`` when the store has none."""
        try:
            return self._record(self._client.get_run(run_id))
        except MlflowException:
            return None

    def metric_history(self, run_id: str, keys: Sequence[str]) -> pd.DataFrame:
        """Every logged value of ``keys``: columns ``key``, ``step``, ``value``, ``timestamp`` (ms)."""
        rows = [
            (key, m.step, m.value, m.timestamp) for key in keys for m in self._client.get_metric_history(run_id, key)
        ]
        return pd.DataFrame(rows, columns=["key", "step", "value", "timestamp"]).astype(
            {"key": "object", "step": "int64", "value": "float64", "timestamp": "int64"}
        )

    def artifact_csv(self, run_id: str, path: str) -> pd.DataFrame | None:
        """The run's CSV artifact at ``path``, or ``None`` when it has none."""
        with tempfile.TemporaryDirectory() as folder:
            try:
                return pd.read_csv(self._client.download_artifacts(run_id, path, folder))
            except (MlflowException, OSError):
                return None


# ----------------------------------------------------------------- run names and run states


RUN_NAME_LIMIT = 40  # characters: the runs table shows about this much of a name
DESCRIPTION_TAG = "mlflow.note.content"  # the run page's description


def short_key(key: str, keys: Sequence[str]) -> str:
    """The shortest dotted suffix of ``key`` that no other key of ``keys`` ends with (``thor.lr.lr_init``:
    ``lr_init``; ``model.name``, as other keys end with ``name``): one abbreviation per key, in every run."""
    parts = key.split(".")
    for length in range(1, len(parts)):
        suffix = ".".join(parts[-length:])
        if sum(k == suffix or k.endswith("." + suffix) for k in keys) == 1:
            return suffix
    return key


def _value(value) -> str:
    return value if isinstance(value, str) else json.dumps(value, separators=(",", ":"))


def run_name(
    pipelines: list[str],
    env: str | None,
    overrides: Mapping,
    keys: Sequence[str],
    partial: bool,
    *,
    fast_dev_run: bool = False,
) -> str:
    """The MLflow run's name, at most ``RUN_NAME_LIMIT`` characters: ``fast_dev_run`` first for a rehearsal, the
    pipelines, the configuration environment when one was chosen (``--env``), each ``--params`` override that
    changes the configuration by its short key (``thor lr_init=0.05``), and ``(partial)`` when node filters
    (``--nodes``, ``--from-nodes``, …) cut the run. A longer name ends in an ellipsis; ``run_description`` holds
    everything."""
    words = [*(["fast_dev_run"] if fast_dev_run else []), "+".join(pipelines), *([env] if env else [])]
    shown = {k: v for k, v in overrides.items() if not (fast_dev_run and k == "runtime.fast_dev_run")}
    words += [f"{short_key(key, keys)}={_value(value)}" for key, value in shown.items()]
    name = " ".join(words)
    suffix = " (partial)" if partial else ""
    if len(name) + len(suffix) > RUN_NAME_LIMIT:
        name = name[: RUN_NAME_LIMIT - len(suffix) - 1] + "…"
    return name + suffix


def run_description(command: str | None, env: str, overrides: Mapping) -> str:
    """The run's description (its page shows it): the command, the environment, every override in full."""
    lines = [f"`{command}`" if command else "kedro run", "", f"configuration environment: {env}"]
    if overrides:
        lines += ["", "overrides (`--params`) that change the configuration:"]
        lines += [f"- `{key}` = `{_value(value)}`" for key, value in overrides.items()]
    return "\n".join(lines)


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


def active_run_id() -> str | None:
    """The id of the active MLflow run, or None."""
    active = mlflow.active_run()
    return None if active is None else active.info.run_id


def mark_killed(run_id: str) -> None:
    """End run ``run_id`` and its child runs KILLED (an interrupted ``kedro run``)."""
    client = mlflow.MlflowClient()
    for killed in [run_id, *(child.info.run_id for child in child_runs(run_id))]:
        client.set_terminated(killed, RunStatus.to_string(RunStatus.KILLED))
