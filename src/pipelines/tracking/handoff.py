"""The hand-off of a ``kedro run``'s MLflow run to global rank 0 of an msrun job (``distributed.launch``), which
knows no tracking library: it pickles what ``MlflowRunHandoff.capture`` returns into the job."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass

import mlflow


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
