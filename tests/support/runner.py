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

import shutil
from collections.abc import Mapping
from pathlib import Path

import mlflow.tracking._model_registry.utils as mlflow_registry_utils
import mlflow.tracking._tracking_service.utils as mlflow_tracking_utils
import mlflow.tracking.fluent as mlflow_fluent
import pytest
from kedro.framework.session import KedroSession
from kedro.io import MemoryDataset
from kedro.runner import SequentialRunner
from omegaconf import OmegaConf

from pipelines.params import Parameters, validate_parameters
from tests.support.config import PROJECT, load_config

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
        "baseline": {"epochs": 2, "batch_size": 16, "lr": {"warmup_steps": 2}},
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
    configuration, without conf/local (a developer's own settings, a team's MLflow server, stay out). The package
    itself is the installed one."""
    root.mkdir(parents=True, exist_ok=True)
    for name in ("pyproject.toml", ".telemetry"):
        shutil.copy(PROJECT / name, root)
    shutil.copytree(PROJECT / "conf", root / "conf", ignore=shutil.ignore_patterns("local"), dirs_exist_ok=True)
    (root / "conf" / "local").mkdir(exist_ok=True)
    return root


def tracking_uri(project: Path) -> str:
    """The MLflow store of ``project``'s in-process runs."""
    return f"sqlite:///{project / 'mlflow.db'}"


class KeptDataset(MemoryDataset):
    """A ``MemoryDataset`` the runner does not empty after its last reader, so the test sees every output."""

    def _release(self) -> None:
        pass


class KeepingRunner(SequentialRunner):
    """Kedro's ``SequentialRunner`` on the session's catalog, keeping the datasets it holds in memory (a runner
    empties one after its last reader); ``outputs`` is then every dataset the run produced, by name, the stored
    ones loaded back from the catalog."""

    outputs: dict

    def run(self, pipeline, catalog, hook_manager=None, run_id=None, only_missing_outputs=False):
        for name in pipeline.datasets():
            if name.startswith("params:") or name == "parameters":
                continue
            if type(catalog.get(name, fallback_to_runtime_pattern=True)) is MemoryDataset:
                catalog[name] = KeptDataset()
        result = super().run(pipeline, catalog, hook_manager, run_id, only_missing_outputs)
        self.outputs = {name: catalog.load(name) for name in pipeline.all_outputs() if catalog.exists(name)}
        return result


def run_pipeline(name: str, params: Mapping, project: Path) -> dict:
    """``kedro run --pipelines=<name> --params=<params>`` in this process, in ``project`` (``session_project``),
    logging to ``tracking_uri(project)``; returns every dataset the run produced, by name."""
    runner = KeepingRunner()
    with pytest.MonkeyPatch.context() as patch:
        patch.chdir(project)
        patch.delenv("KEDRO_ENV", raising=False)
        # conf/base/mlflow.yml reads the store from MLFLOW_TRACKING_URI, as a team's server is given
        patch.setenv("MLFLOW_TRACKING_URI", tracking_uri(project))
        patch.delenv("MLFLOW_EXPERIMENT_ID", raising=False)
        patch.delenv("MLFLOW_REGISTRY_URI", raising=False)
        # kedro-mlflow sets MLflow's tracking URI, registry URI and active experiment for the process; MLflow has no
        # public way to unset them, so its module globals are restored as they were
        patch.setattr(mlflow_tracking_utils, "_tracking_uri", mlflow_tracking_utils._tracking_uri)
        patch.setattr(mlflow_registry_utils, "_registry_uri", mlflow_registry_utils._registry_uri)
        patch.setattr(mlflow_fluent, "_active_experiment_id", mlflow_fluent._active_experiment_id)
        with KedroSession.create(project_path=project, save_on_close=False, runtime_params=dict(params)) as session:
            session.run(pipeline_names=[name], runner=runner)
    return runner.outputs
