"""Child runs: one per training of a pipeline that trains several (dim_reduce's stage1, stage2, control; thor_bert's
two; each training of a study), each with its own parameters, rows and final figures."""

from __future__ import annotations

import json
import logging
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager

import mlflow
from mlflow.exceptions import MlflowException

from pipelines.tracking.naming import RUN_COLOUR_TAG, run_colour
from pipelines.tracking.runs import run_identity
from pipelines.tracking.writer import log_final, log_params, set_tags
from trainlib.engine.callbacks import Callback
from trainlib.redaction import redact, redact_value

logger = logging.getLogger(__name__)


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
def training_run(
    name: str, params: Mapping[str, object] | None = None, title: str | None = None
) -> Iterator[mlflow.ActiveRun | None]:
    """Inside the active (``kedro run``'s) run, the child run ``name`` (tag ``training=<name>``; named ``title``,
    by default ``<pipeline>/<name>``), active meanwhile, logging the parameter sections ``params``
    (``flat_params``) it has not logged yet, so MLflow's Compare shows each training's own settings.

    A child of that name already under the parent is continued (a training's nodes log into one run: its context's
    node opens it with the shared sections, its training adds its own section, its evaluation nothing new).
    Outside an active run it does nothing. The child ends FINISHED, or FAILED when the block raises.
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
        logged = found[0].data.params
    else:
        # named after its parent's pipeline too (dim_reduce/stage2), so its own page says whose it is
        pipeline = client.get_run(parent.info.run_id).data.tags.get("pipeline")
        title = title or (f"{pipeline}/{name}" if pipeline else name)
        tags = {"training": name, RUN_COLOUR_TAG: run_colour(name), **run_identity()}
        run = mlflow.start_run(run_name=redact(title), nested=True, tags=redact_value(tags))
        logged = {}
    missing = {key: value for key, value in flat_params(params or {}).items() if key not in logged}
    if missing:
        log_params(missing)
    try:
        yield run
    except BaseException:
        mlflow.end_run(status="FAILED")
        raise
    mlflow.end_run()


def study_title(name: str) -> str:
    """A study training's run name, its seed first so that the runs table tells the seeds apart however narrow the
    column: ``baseline/seed0``: ``seed0 baseline``, ``dim_reduce/stage2/seed1``: ``seed1 dim_reduce/stage2``."""
    rest, _, seed = name.rpartition("/")
    return f"{seed} {rest}" if rest else name


class StudyRuns:
    """MLflow for a study (``study.runner.StudyTracking``): each training a child run of the study's run (named
    ``study_title``), with its tags and final accuracy; its nodes log their per-epoch rows and when they first
    reached the target, as in a ``kedro run``."""

    @contextmanager
    def run(self, name: str, tags: Mapping[str, str], params: Mapping[str, object]) -> Iterator[str | None]:
        with training_run(name, params, study_title(name)) as run:
            seed = tags.get("seed")
            colour = run_colour(tags.get("result", tags.get("recipe", name)), None if seed is None else int(seed))
            set_tags({**tags, RUN_COLOUR_TAG: colour})
            yield None if run is None else run.info.run_id

    def callbacks(self) -> list[Callback]:
        return []  # the nodes' own: nothing to add

    def log_final(self, accuracy: Mapping[str, float]) -> None:
        log_final(accuracy)

    def set_tags(self, tags: Mapping[str, str]) -> None:
        set_tags(tags)

    def fail_runs(self, run_ids: Sequence[str], *, error: str) -> None:
        """The child runs ``run_ids`` of a trial whose process died, and that process's study runs, end FAILED
        (none stays RUNNING once another process has found it dead); runs this MLflow store does not hold (the
        other machine logged elsewhere) are left alone, with a warning."""
        client = mlflow.MlflowClient()
        for run_id in run_ids:
            try:
                run = client.get_run(run_id)
                client.set_tag(run_id, "trial_state", "FAIL")
                client.set_tag(run_id, "trial_error", error)
                parent = run.data.tags.get("mlflow.parentRunId")
                for ended in (run, *([client.get_run(parent)] if parent else [])):
                    if ended.info.status == "RUNNING":
                        client.set_terminated(ended.info.run_id, "FAILED")
            # another machine's store, or the server out of reach: the tuning goes on
            except MlflowException as refused:
                logger.warning("tuning: run %s of a dead trial was left as it is: %s", run_id, refused)
