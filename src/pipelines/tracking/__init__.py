"""Everything MLflow: the only package that imports it (the library reaches MLflow through what is here).

One module per concern:

- ``writer``: metrics, final figures, tags and artifacts of the active run; the engine callbacks ``EpochMetrics``,
  which logs each epoch's row (and, on resume, the rows before, so a resumed run holds every epoch from 1), and
  ``TimeToTarget``, when the training first reached its target;
- ``trainings``: ``training_run(name)``, a child run of the ``kedro run``'s run for one of several trainings of a
  pipeline (dim_reduce's stage1, stage2, control), and ``StudyRuns`` for a study's trainings;
- ``runs``: the active run, child runs, and runs that ended badly (failure tags, KILLED, orphaned runs);
- ``naming``: a run's name and description;
- ``links``: the MLflow UI's addresses of a run's runs table and comparison chart;
- ``reader``: ``MlflowRunReader``, an experiment as plain data for the report;
- ``handoff``: ``MlflowRunHandoff``, the active run handed to global rank 0 of an msrun job.
- ``registry``: a run's logged model registered afterwards (``kedro models register``), by its ``models:/m-…`` URI.

Every writer is a no-op outside an active run (library tests, ranks > 0). The names the pipelines' nodes use
(``tracking.log_metrics``, ``tracking.training_run``, …) are importable from the package itself.
"""

from pipelines.tracking.handoff import MlflowRunHandoff
from pipelines.tracking.links import record_compared_runs
from pipelines.tracking.reader import MlflowRunReader
from pipelines.tracking.trainings import StudyRuns, training_run
from pipelines.tracking.writer import EpochMetrics, TimeToTarget, log_epoch_rows, log_final, log_metrics, set_tags

__all__ = [
    "EpochMetrics",
    "TimeToTarget",
    "MlflowRunHandoff",
    "MlflowRunReader",
    "StudyRuns",
    "log_epoch_rows",
    "log_final",
    "log_metrics",
    "record_compared_runs",
    "set_tags",
    "training_run",
]
