"""``MemoryInputHooks``: a partial run (``--nodes=baseline.evaluate``, ``--from-nodes=dim_reduce.stage2.train_stage2``)
whose nodes read an in-memory dataset that a node it leaves out makes (a training's ``training_context``) runs that
node first, with the run's hooks, as the whole pipeline would. An in-memory dataset holds nothing from one run to
the next, and Kedro's node filters keep only the nodes named: without this, such a run would fail on its first
node."""

from __future__ import annotations

from kedro.framework.hooks import hook_impl
from kedro.framework.project import pipelines
from kedro.runner.task import Task


class MemoryInputHooks:
    """Runs the registered node that makes an in-memory dataset, when a node of the run is about to read it and the
    run has not made it."""

    def __init__(self) -> None:
        self._hook_manager = None
        self._catalog = None
        self._run_id: str | None = None

    @hook_impl
    def after_context_created(self, context) -> None:
        # the session's hook manager: the node made here runs with the run's hooks (its parameters logged, its child
        # run opened) as in a whole run
        self._hook_manager = context._hook_manager

    @hook_impl
    def before_pipeline_run(self, run_params: dict, pipeline, catalog) -> None:
        self._catalog, self._run_id = catalog, run_params.get("run_id")

    @hook_impl
    def before_dataset_loaded(self, dataset_name: str, node) -> None:
        catalog = self._catalog
        if catalog is None or dataset_name not in catalog or catalog.exists(dataset_name):
            return
        if not getattr(catalog.get(dataset_name), "_EPHEMERAL", False):
            return  # a missing file stays Kedro's error
        maker = making(dataset_name)
        if maker is not None:
            Task(maker, catalog, is_async=False, hook_manager=self._hook_manager, run_id=self._run_id).execute()


def making(dataset_name: str):
    """The registered node that writes ``dataset_name``, or None."""
    for pipeline in pipelines.values():
        for node in pipeline.nodes:
            if dataset_name in node.outputs:
                return node
    return None
