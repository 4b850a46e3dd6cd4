"""``NodeParamsMlflowHook``: kedro-mlflow's hook, sending a node's parameters to MLflow in one batch.

kedro-mlflow logs each parameter with its own ``mlflow.log_param``, one HTTP request per flattened key. Behind a
team server's login every request checks the password hash (about a second each on a loaded 2-core machine), so
hundreds of keys per run took minutes. This subclass keeps all of kedro-mlflow's choice of what to log (which
inputs are parameters, ``flatten``/``recursive``/``sep``, sanitised names, ``long_params_strategy``) and only
gathers the short values it would log one by one, sending them with one ``log_batch`` (MLflow splits it by 100).

Why a subclass rather than logging them in ``MlflowRunHooks`` and taking the ``params:`` inputs away: the
``TrainingRunHooks`` (trylast) read those inputs after kedro-mlflow, and re-doing kedro-mlflow's selection,
flattening and long-value handling would copy more of its code; here the one internal relied on is
``MlflowHook._log_param(name, value)``, overridden. kedro-mlflow 2.0 has no public way to change how its hook sends
a parameter, so this module is the project's one use of a private name of kedro-mlflow (issue 51 item 6); a
kedro-mlflow upgrade that renames it fails ``tests/pipelines/test_node_params.py``.
"""

from __future__ import annotations

import threading

from kedro.framework.hooks import hook_impl
from mlflow.utils.validation import MAX_PARAM_VAL_LENGTH

from pipelines.hooks.experiment import ExperimentMlflowHook
from pipelines.tracking.writer import log_params


class NodeParamsMlflowHook(ExperimentMlflowHook):
    """kedro-mlflow's ``MlflowHook`` (registered in its place: settings' ``DISABLE_HOOKS_FOR_PLUGINS``), logging the
    parameters of each node in one batch; through ``ExperimentMlflowHook``, joining an MLflow experiment another
    process created at the same moment.

    A value longer than MLflow's limit still goes through kedro-mlflow's ``long_params_strategy`` (truncated,
    a tag, or an error), one request each as before. A parameter two nodes share is sent again with the same
    value, which MLflow accepts as before (and a different value it refuses, as before).
    """

    def __init__(self) -> None:
        super().__init__()
        self._pending = threading.local()  # per thread: Kedro's ThreadRunner runs nodes' hooks concurrently

    @hook_impl
    def before_node_run(self, node, catalog, inputs, is_async) -> None:
        self._pending.params = {}
        try:
            super().before_node_run(node=node, catalog=catalog, inputs=inputs, is_async=is_async)
        finally:
            # the values gathered before a failure too, as kedro-mlflow had logged them one by one
            params, self._pending.params = self._pending.params, None
            if params:
                log_params(params)

    def _log_param(self, name: str, value) -> None:
        pending = getattr(self._pending, "params", None)
        if pending is not None and len(str(value)) <= MAX_PARAM_VAL_LENGTH:
            pending[name] = value
            return
        super()._log_param(name, value)
