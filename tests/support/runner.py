"""Registered pipelines run in this process as ``kedro run`` runs them: through ``KedroSession``, with the
project's hooks (validation, the MLflow run's name and tags by the project's hooks and kedro-mlflow, checkpoint
clean-up, artifacts), its catalog and its configuration, and a tiny configuration passed as runtime parameters
(``--params``).

Each run is in a temporary project (``session_project``: this project's configuration without conf/local), which is
also the working directory meanwhile: the catalog's files, the nodes' own folders (checkpoints, the trajectory, the
study's results, the image cache) and the MLflow store (``tracking_uri``) land there, never in the repository. The
process-wide state a run sets (MLflow's tracking URI and active experiment, the working directory) is restored
after it.
"""

from __future__ import annotations

import atexit
import functools
import os
import shutil
import tempfile
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from pathlib import Path

import mlflow
import mlflow.tracking._model_registry.utils as mlflow_registry_utils
import mlflow.tracking._tracking_service.utils as mlflow_tracking_utils
import mlflow.tracking.fluent as mlflow_fluent
import pytest
from kedro.framework.hooks import hook_impl
from kedro.framework.session import KedroSession
from kedro.runner import SequentialRunner
from omegaconf import OmegaConf

from tests.support.config import PROJECT, load_config
from trainlib.params import Parameters, validate_parameters

STORE = "mlflow.db"  # a project's MLflow store, as conf/base/mlflow.yml names it

# A tiny configuration every pipeline runs in seconds: 16 px images of the generated tree, batch 4, 1-2 epochs.
TINY = {
    "data": {
        "source": "folder",
        "max_per_class": {"train": None, "val": None},
        "image_size": 16,
        "crop_scale": [0.5, 1.0],
        "eval_batch_size": 8,
        "num_workers": 1,
        "step_eval_images": None,
    },
    "baseline": {"epochs": 2, "batch_size": 4, "lr": {"peak": 0.05, "warmup_epochs": 0}},
    "adasum": {"epochs": 1, "batch_size": 4, "lr": {"peak": 0.05, "warmup_epochs": 0}},
    "lars": {"epochs": 1, "batch_size": 4, "lr": {"peak": 1.0, "warmup_epochs": 0}},
    "thor": {"epochs": 2, "batch_size": 4, "frequency": 2},
    "dim_reduce": {
        "stage1": {
            "epochs": 2,
            "schedule_epochs": 3,
            "batch_size": 4,
            "lr": {"peak": 0.05, "warmup_epochs": 0},
            "eval_interval": 0,
            "trajectory": {"start_epoch": 1, "every_steps": 1, "every_epochs": None},
        },
        "collect": {"n_files": 5},
        "pca": {"n_components": 4},
        "stage2": {"batch_size": 4},
    },
    "study": {"recipes": ["baseline", "thor", "thor_first_order"], "seeds": [0], "epochs": 1, "eval_every_steps": 2},
    # a 1-layer BERT of 16 hidden units on the first documents of the real corpus, sequences of 32 tokens
    "thor_bert": {
        "corpus": {"max_documents": 12, "held_out_fraction": 0.25},
        "tokenizer": {"vocab_size": 300},
        "examples": {"max_seq_length": 32, "max_predictions_per_seq": 5},
        "network": {
            "hidden_size": 16,
            "num_hidden_layers": 1,
            "num_attention_heads": 2,
            "intermediate_size": 32,
            "max_position_embeddings": 32,
        },
        "eval_batch_size": 32,
        "step_eval_examples": 32,
        "thor": {"epochs": 2, "batch_size": 16, "frequency": 3},
        "control": {"epochs": 2, "batch_size": 16, "lr": {"warmup_steps": 2}},
    },
}


def tiny_params(tree: Path | str, overrides: Mapping | None = None) -> dict:
    """The runtime parameters (``--params``) of a tiny run on the image tree ``tree``: ``TINY``, then
    ``overrides``."""
    return OmegaConf.to_container(OmegaConf.merge(TINY, {"data": {"root": str(tree)}}, overrides or {}))


def tiny_parameters(tree: Path | str, overrides: Mapping | None = None) -> Parameters:
    """conf/base with ``tiny_params(tree, overrides)``, validated as ``kedro run`` validates it."""
    return validate_parameters(load_config("base", runtime_params=tiny_params(tree, overrides)))


def session_project(root: Path) -> Path:
    """A Kedro project at ``root`` for in-process runs: this project's ``pyproject.toml``, ``.telemetry`` and
    configuration, without conf/local (a developer's own settings, a team's MLflow server, stay out), and an empty
    MLflow store (``empty_store``). The package itself is the installed one."""
    root.mkdir(parents=True, exist_ok=True)
    for name in ("pyproject.toml", ".telemetry"):
        shutil.copy(PROJECT / name, root)
    shutil.copytree(PROJECT / "conf", root / "conf", ignore=shutil.ignore_patterns("local"), dirs_exist_ok=True)
    (root / "conf" / "local").mkdir(exist_ok=True)
    shutil.copy(empty_store(), root / STORE)
    return root


@functools.cache
def empty_store() -> Path:
    """An MLflow SQLite store with its tables and nothing else, made once per process: MLflow makes the tables of a
    new store by running its schema migrations, seconds each time, so every project starts from a copy."""
    folder = Path(tempfile.mkdtemp(prefix="empty-mlflow-store-"))
    atexit.register(shutil.rmtree, folder, ignore_errors=True)
    with process_state_kept(folder):  # the store's default experiment keeps its artifacts here, not in the caller's
        mlflow.MlflowClient(tracking_uri=f"sqlite:///{folder / STORE}").search_experiments()
    return folder / STORE


def tracking_uri(project: Path) -> str:
    """The MLflow store of ``project``'s in-process runs."""
    return f"sqlite:///{project / STORE}"


class SavedData:
    """A hook recording the data of every dataset a run saves, by name: what each node returned."""

    def __init__(self) -> None:
        self.data: dict = {}

    @hook_impl
    def after_dataset_saved(self, dataset_name: str, data) -> None:
        self.data[dataset_name] = data


class RecordingRunner(SequentialRunner):
    """Kedro's ``SequentialRunner``, recording what the run saves through the session's hooks (``SavedData``):
    ``outputs`` is then every dataset the run produced, by name, those the catalog holds in memory included
    (the runner empties them after their last reader)."""

    outputs: dict

    def run(self, pipeline, catalog, hook_manager=None, run_id=None, only_missing_outputs=False):
        saved = SavedData()
        hook_manager.register(saved)
        try:
            return super().run(pipeline, catalog, hook_manager, run_id, only_missing_outputs)
        finally:
            hook_manager.unregister(saved)
            self.outputs = saved.data


# What a run sets for the whole process: Kedro's environment, and MLflow's store, registry and experiment (which
# MLflow also writes into the environment, for subprocesses)
PROCESS_ENV = (
    "KEDRO_ENV",
    "MLFLOW_TRACKING_URI",
    "MLFLOW_REGISTRY_URI",
    "MLFLOW_EXPERIMENT_ID",
    "MLFLOW_EXPERIMENT_NAME",
)


@contextmanager
def process_state_kept(directory: Path) -> Iterator[None]:
    """``directory`` as the working directory meanwhile, and the process-wide state a ``kedro run`` sets restored
    afterwards: ``PROCESS_ENV``, and MLflow's tracking URI, registry URI and active experiment. MLflow has no public
    way to unset those three once kedro-mlflow has set them, so its module globals are restored as they were."""
    environ = {name: os.environ.get(name) for name in PROCESS_ENV}
    with pytest.MonkeyPatch.context() as patch:
        patch.chdir(directory)
        patch.setattr(mlflow_tracking_utils, "_tracking_uri", mlflow_tracking_utils._tracking_uri)
        patch.setattr(mlflow_registry_utils, "_registry_uri", mlflow_registry_utils._registry_uri)
        patch.setattr(mlflow_fluent, "_active_experiment_id", mlflow_fluent._active_experiment_id)
        try:
            yield
        finally:
            for name, value in environ.items():
                if value is None:
                    os.environ.pop(name, None)
                else:
                    os.environ[name] = value


def run_pipeline(name: str | None, params: Mapping, project: Path, **filters) -> dict:
    """``kedro run --pipelines=<name> --params=<params>`` in this process, in ``project`` (``session_project``),
    logging to ``tracking_uri(project)``; returns every dataset the run produced, by name. ``None``: no
    ``--pipelines`` (``__default__``); ``filters``: ``KedroSession.run``'s node filters (``namespaces=...``)."""
    runner = RecordingRunner()
    with process_state_kept(project):
        for variable in PROCESS_ENV:
            os.environ.pop(variable, None)
        # conf/base/mlflow.yml reads the store from MLFLOW_TRACKING_URI, as a team's server is given
        os.environ["MLFLOW_TRACKING_URI"] = tracking_uri(project)
        with KedroSession.create(project_path=project, save_on_close=False, runtime_params=dict(params)) as session:
            session.run(pipeline_names=None if name is None else [name], runner=runner, **filters)
    return runner.outputs
