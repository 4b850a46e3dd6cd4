"""Registered pipelines run in this process by Kedro's ``SequentialRunner``, as the Kedro starters test theirs.

Every dataset is a ``MemoryDataset`` and every ``params:`` input the typed section the configuration validates to
(conf/base, then ``overrides``), so the nodes receive what ``kedro run`` would give them. Files a node writes itself
(checkpoint folders, the trajectory, the study's results, the image cache) land under the working directory, which
the caller points at a temporary folder. An MLflow run of a temporary store is active meanwhile, tagged as the
project's hooks tag it, so the nodes log where a ``kedro run`` would and the report pipeline finds earlier runs.
"""

from __future__ import annotations

import copy
from collections.abc import Mapping
from pathlib import Path

import mlflow
from kedro.io import DataCatalog, MemoryDataset
from kedro.runner import SequentialRunner

from pipelines.params import Parameters, validate_parameters
from pipelines.pipeline_registry import register_pipelines
from tests.support.config import load_params

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
    "baseline": {"epochs": 2, "batch_size": 4, "lr": {"lr_max": 0.05, "warmup_epochs": 0}},
    "adasum": {"epochs": 1, "batch_size": 4, "lr": {"lr_max": 0.05, "warmup_epochs": 0}},
    "thor": {"epochs": 2, "batch_size": 4, "frequency": 2},
    "dim_reduce": {
        "stage1": {
            "epochs": 2,
            "schedule_epochs": 3,
            "batch_size": 4,
            "lr": {"lr_max": 0.05, "warmup_epochs": 0},
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


def merged(base: dict, overrides: Mapping) -> dict:
    """``base`` with ``overrides`` applied key by key (nested mappings merged, other values replaced)."""
    result = copy.deepcopy(base)
    for key, value in overrides.items():
        if isinstance(value, Mapping) and isinstance(result.get(key), dict):
            result[key] = merged(result[key], value)
        else:
            result[key] = copy.deepcopy(value)
    return result


def tiny_parameters(tree: Path, overrides: Mapping | None = None) -> Parameters:
    """conf/base with ``TINY``, the tree at ``tree`` and ``overrides``, validated as ``kedro run`` validates it."""
    raw = merged(merged(load_params("base"), TINY), {"data": {"root": str(tree)}, **(overrides or {})})
    return validate_parameters(raw)


def section(params: Parameters, dotted: str):
    """The typed section ``dotted`` (``dim_reduce.stage2``) of ``params``."""
    value = params
    for part in dotted.split("."):
        value = getattr(value, part)
    return value


class KeptDataset(MemoryDataset):
    """A ``MemoryDataset`` the runner does not empty after its last reader, so the test sees every output."""

    def _release(self) -> None:
        pass


def run_pipeline(name: str, params: Parameters, tracking_uri: str) -> dict:
    """Run the registered pipeline ``name`` in this process inside an MLflow run tagged ``pipeline=<name>``;
    returns every dataset the run produced, by name."""
    pipeline = register_pipelines()[name]
    catalog = DataCatalog()
    for dataset in sorted(pipeline.datasets()):
        if dataset.startswith("params:"):
            catalog[dataset] = section(params, dataset.removeprefix("params:"))
        else:
            catalog[dataset] = KeptDataset()
    mlflow.set_tracking_uri(tracking_uri)
    mlflow.set_experiment("resnet-recipes")
    with mlflow.start_run(run_name=name, tags={"pipeline": name, "env": "base"}):
        SequentialRunner().run(pipeline, catalog)
    return {dataset: catalog.load(dataset) for dataset in pipeline.all_outputs() if catalog.exists(dataset)}
