"""``CheckpointHooks``: once a training's final checkpoint is stored by the catalog, its periodic checkpoints are
removed (``trainlib.engine.resume.remove_finished_checkpoints``): they are no longer the only copy of its state."""

from __future__ import annotations

from kedro.framework.hooks import hook_impl
from kedro.io import MemoryDataset, SharedMemoryDataset

from trainlib.engine.checkpoint import Checkpoint
from trainlib.engine.resume import remove_finished_checkpoints


class CheckpointHooks:
    """Removes a training's periodic checkpoints after the catalog has stored its final one."""

    def __init__(self) -> None:
        self._catalog = None

    @hook_impl
    def before_pipeline_run(self, run_params: dict, pipeline, catalog) -> None:
        self._catalog = catalog  # after_dataset_saved asks it whether a dataset is stored

    @hook_impl
    def after_dataset_saved(self, dataset_name: str, data) -> None:
        if isinstance(data, Checkpoint) and self._stored(dataset_name):
            remove_finished_checkpoints(data)

    def _stored(self, dataset_name: str) -> bool:
        """Whether the catalog keeps ``dataset_name`` in storage and it is there: not a name the catalog lacks (a
        MemoryDataset at run time), nor one it declares in memory (a MemoryDataset, or the SharedMemoryDataset of
        Kedro's ParallelRunner), which holds the data only while this process runs."""
        catalog = self._catalog
        if catalog is None or dataset_name not in catalog:
            return False
        in_memory = isinstance(catalog.get(dataset_name), MemoryDataset | SharedMemoryDataset)
        return not in_memory and catalog.exists(dataset_name)
