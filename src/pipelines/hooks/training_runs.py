"""``TrainingRunHooks``: the nodes of one of a pipeline's several trainings (tagged ``training_run``: dim_reduce's
stage1, stage2 and control, thor_bert's thor and baseline) run in an MLflow child run of the ``kedro run``'s run,
named after the last part of their namespace (``dim_reduce.stage2.train_stage2`` and ``dim_reduce.stage2.evaluate``: the
child ``stage2``). So each training's parameters, per-epoch rows and final figures stay together, and MLflow's
Compare shows the trainings side by side; the nodes themselves only log (``pipelines.tracking``)."""

from __future__ import annotations

from contextlib import ExitStack

from kedro.framework.hooks import hook_impl

from pipelines.modular import PARAMS_PREFIX, TRAINING_RUN_TAG
from pipelines.tracking.trainings import training_run


class TrainingRunHooks:
    """Opens a tagged node's child run before it runs, with the node's parameters, and ends it after: FINISHED, or
    FAILED when the node raises."""

    def __init__(self) -> None:
        self._open: dict[str, ExitStack] = {}

    # After kedro-mlflow's hook has logged the node's parameters into the kedro run's run, and after
    # MlflowRunHooks has turned them back into the configuration's mappings (tryfirst).
    @hook_impl(trylast=True)
    def before_node_run(self, node, inputs: dict) -> None:
        if TRAINING_RUN_TAG not in node.tags:
            return
        params = {
            name.removeprefix(PARAMS_PREFIX): value for name, value in inputs.items() if name.startswith(PARAMS_PREFIX)
        }
        stack = ExitStack()
        stack.enter_context(training_run(node.namespace.rsplit(".", 1)[-1], params))
        self._open[node.name] = stack

    @hook_impl
    def after_node_run(self, node) -> None:
        stack = self._open.pop(node.name, None)
        if stack is not None:
            stack.close()

    @hook_impl
    def on_node_error(self, error: Exception, node) -> None:
        stack = self._open.pop(node.name, None)
        if stack is not None:
            stack.__exit__(type(error), error, error.__traceback__)
