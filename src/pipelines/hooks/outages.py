"""``OutageHooks``: the parts a run reaches over the network, reached before its first node and told by name when
they go away.

- Before the MLflow run starts: a run that tunes (``study.tuning.trials`` above 0, a node of the study reading its
  parameters) opens its tuning storage once, with no retry (``check_storage``), so a wrong password or an
  unreachable database is one ``Error:`` line within seconds, before the data nodes and with no MLflow run created
  for it. The tracking server is reached earlier still: kedro-mlflow opens the experiment as the context is made,
  within MLflow's retries (``tracking.server_retry_window_s``, set by ``ConfigurationHooks``).
- A run stopped by the tracking server's outage records its failure without waiting that window again.
"""

from __future__ import annotations

from kedro.framework.hooks import hook_impl

from pipelines.hooks.configuration import ConfigurationHooks
from pipelines.tracking.outage import TrackingServerError, give_up_at_once, outage
from trainlib.study.tuning_storage import check_storage

STUDY = "study"


def reads_tuning(pipeline) -> bool:
    """Whether ``pipeline`` has a node of the study that reads its parameters (its trials, its tuning figures)."""
    return any(node.namespace == STUDY and f"params:{STUDY}" in node.inputs for node in pipeline.nodes)


class OutageHooks:
    def __init__(self, configuration: ConfigurationHooks):
        self._configuration = configuration

    @hook_impl(tryfirst=True)  # before kedro-mlflow's hook starts the MLflow run
    def before_pipeline_run(self, run_params: dict, pipeline, catalog) -> None:
        tuning = self._configuration.configuration.params.study.tuning
        if tuning.trials and reads_tuning(pipeline):
            check_storage(tuning.storage)

    @hook_impl(tryfirst=True)  # before kedro-mlflow's hook ends the run FAILED on the server that is away
    def on_pipeline_error(self, error: Exception, run_params: dict, pipeline, catalog) -> None:
        if isinstance(outage(error), TrackingServerError):
            give_up_at_once()
