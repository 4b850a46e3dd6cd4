"""``ExperimentMlflowHook``: two machines that start on a new MLflow server at the same moment both get their run.

kedro-mlflow's hook looks the experiment up in its ``after_context_created`` and creates it when it is missing; the
second of two processes doing so together is refused (``RESOURCE_ALREADY_EXISTS``) and its ``kedro run`` would stop
before it began. This subclass of kedro-mlflow's ``MlflowHook`` (the base of the project's ``NodeParamsMlflowHook``,
registered in the plugin's place) sets kedro-mlflow up once more on that refusal: it now finds the experiment the
other process made. Only kedro-mlflow's own set-up runs again, within its hook, so the refusal never reaches Kedro's
hook manager and every other ``after_context_created`` hook runs once, as Kedro calls it.
"""

from __future__ import annotations

import logging

from kedro.framework.hooks import hook_impl
from kedro_mlflow.framework.hooks import MlflowHook

from pipelines.tracking.runs import experiment_created_meanwhile

logger = logging.getLogger(__name__)


class ExperimentMlflowHook(MlflowHook):
    """kedro-mlflow's ``MlflowHook``, joining an experiment another process created while this one set up."""

    @hook_impl
    def after_context_created(self, context) -> None:
        try:
            super().after_context_created(context)
        except Exception as error:
            if not experiment_created_meanwhile(error):
                raise
            logger.info("Another process created the MLflow experiment meanwhile: this run joins it")
            super().after_context_created(context)
