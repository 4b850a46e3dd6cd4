"""``SignalHooks``: during a pipeline run, SIGINT and SIGTERM stop it in order (``trainlib.signals``)."""

from __future__ import annotations

from kedro.framework.hooks import hook_impl

from trainlib import signals


class SignalHooks:
    """Installs the orderly stop for the pipeline run and restores the previous handlers after it.

    The stop (``signals.Interrupted``) ends the running node like any error: kedro-mlflow closes the MLflow run,
    and ``MlflowRunHooks.on_pipeline_error`` marks it KILLED; files are written by rename, so none is half-written.
    """

    def __init__(self) -> None:
        self._previous_handlers: dict = {}

    @hook_impl
    def before_pipeline_run(self, run_params: dict, pipeline, catalog) -> None:
        # Installed here, after MindSpore has loaded (with the pipelines' nodes), so that no handler of its own
        # replaces ours.
        self._previous_handlers = signals.install()

    @hook_impl
    def after_pipeline_run(self, run_params: dict, run_result, pipeline, catalog) -> None:
        self._restore()

    @hook_impl
    def on_pipeline_error(self, error: Exception, run_params: dict, pipeline, catalog) -> None:
        self._restore()

    def _restore(self) -> None:
        signals.restore(self._previous_handlers)  # and no deferred stop after the run
        self._previous_handlers = {}
