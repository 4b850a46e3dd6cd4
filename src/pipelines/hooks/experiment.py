"""``ExperimentHooks``: two machines that start on a new MLflow server at the same moment both get their run.

kedro-mlflow looks the experiment up and creates it when it is missing; the second of two processes doing so
together is refused (``RESOURCE_ALREADY_EXISTS``) and its ``kedro run`` would stop before it began. Then every
``after_context_created`` hook runs once more: kedro-mlflow now finds the experiment the other process made.
"""

from __future__ import annotations

import logging

from kedro.framework.hooks import hook_impl

from pipelines.tracking.runs import experiment_created_meanwhile

logger = logging.getLogger(__name__)


class ExperimentHooks:
    @hook_impl(wrapper=True)  # around every after_context_created, kedro-mlflow's included
    def after_context_created(self, context):
        try:
            return (yield)
        except Exception as error:
            if not experiment_created_meanwhile(error):
                raise
        logger.info("Another process created the MLflow experiment meanwhile: this run joins it")
        # Kedro's session calls the hook through this manager; the call comes back to this wrapper, once
        return context._hook_manager.hook.after_context_created(context=context)
