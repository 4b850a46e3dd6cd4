"""Nodes and pipeline pieces several pipeline folders use: a template instantiated as a namespaced modular
pipeline, the inputs of a training node, the build and evaluation nodes, a training's outputs.

Every recipe is a modular pipeline under its own namespace, the name it is registered under (``baseline``,
``dim_reduce`` with one nested namespace per stage, ``dim_reduce.stage2``): its nodes are ``baseline.train``,
``dim_reduce.stage2.train``, and the datasets it writes ``baseline.final_checkpoint``, which the catalog's
dataset factories (``{recipe}.final_checkpoint``) map to files. kedro-viz draws each namespace as a box that
expands, and the run commands it offers (``kedro run --to-nodes='dim_reduce.stage2.train'``) name the pipeline
through the first part of the name (``pipeline_registry.pipelines_named_by``).

Nodes here take typed parameter sections (``pipelines.params``), call the library (``pipelines.recipes``) and
log what it returns through ``pipelines.tracking``.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from contextlib import nullcontext

import pandas as pd
from kedro.pipeline import Node, Pipeline, node, pipeline

from pipelines import tracking
from pipelines.engine.checkpoint import Checkpoint
from pipelines.engine.loop import TrainingResult
from pipelines.metrics import history_table
from pipelines.params import DataParams, ModelParams, RuntimeParams
from pipelines.recipes import classifier

PARAMS_PREFIX = "params:"
# Read by every evaluation node after the checkpoint it evaluates.
EVALUATION_INPUTS = ("manifest", "class_index", "params:model", "params:data", "params:runtime")


def namespaced(
    template: Pipeline,
    namespace: str,
    inputs: Mapping[str, str] | None = None,
    outputs: Mapping[str, str] | None = None,
) -> Pipeline:
    """``template`` as the modular pipeline ``namespace`` (``baseline``, ``dim_reduce.stage2``).

    Its nodes and the datasets it writes take the namespace as prefix (``train`` -> ``baseline.train``,
    ``final_checkpoint`` -> ``baseline.final_checkpoint``). What it reads from elsewhere keeps its name: the data
    pipeline's ``manifest`` and ``class_index``, and every parameter (``params:dim_reduce.stage2``). ``inputs``
    maps its other inputs to another stage's datasets (``{"pca_matrix": "dim_reduce.trajectory_pca.pca_matrix"}``)
    and ``outputs`` names datasets it writes outside its namespace (the data pipeline's ``manifest``). Templates
    use plain names: Kedro warns about a dotted name outside its node's namespace.
    """
    inputs = dict(inputs or {})
    free = template.inputs()
    kept = {name: name for name in free if not name.startswith(PARAMS_PREFIX) and name not in inputs}
    return pipeline(
        template,
        namespace=namespace,
        inputs={**kept, **inputs} or None,
        outputs=dict(outputs or {}) or None,
        parameters={name for name in free if name.startswith(PARAMS_PREFIX)} or None,
    )


def training_inputs(*sections: str) -> list[str]:
    """The inputs of a training node after its start checkpoint: the data pipeline's manifest and class index,
    the parameter sections every training reads, then ``sections``, the training's own (``baseline``,
    ``dim_reduce.stage2``, ``boost``)."""
    shared = ["manifest", "class_index", "params:model", "params:data", "params:runtime", "params:distributed"]
    return [*shared, *(PARAMS_PREFIX + section for section in sections)]


def training_outputs(result: TrainingResult) -> tuple[Checkpoint, pd.DataFrame]:
    """A training node's outputs: the final checkpoint and the history table; its end-of-training figures
    (``distributed/replica_max_abs_diff``) go to the active run."""
    tracking.log_metrics(result.summary)
    return result.checkpoint, history_table(result.history)


def build_network(model: ModelParams, class_index: dict[str, int], runtime: RuntimeParams) -> Checkpoint:
    """Initial weights of the configured ResNet, seeded by ``runtime.seed``."""
    return classifier.build_network(model, class_index, runtime)


def build_network_node(output: str = "initial_weights") -> Node:
    """The node ``build_network``: initial weights of the configured network into the dataset ``output``."""
    return node(build_network, ["params:model", "class_index", "params:runtime"], output, name="build_network")


def evaluate_and_log(
    checkpoint: Checkpoint,
    manifest: pd.DataFrame,
    class_index: dict[str, int],
    model: ModelParams,
    data: DataParams,
    runtime: RuntimeParams,
    label: str,
    child_run: str | None = None,
) -> dict:
    """Evaluate ``checkpoint`` on val: the report, with ``final/top1``, ``final/top5`` logged.

    ``label`` names the model in the log (``baseline: top-1 …``); with ``child_run`` the metrics go to that
    training's child run (``tracking.training_run``) instead of the ``kedro run``'s run.
    """
    report = classifier.evaluate_checkpoint(checkpoint, manifest, class_index, model, data, runtime, label)
    with tracking.training_run(child_run) if child_run else nullcontext():
        tracking.log_final(report)
    return report


def evaluation_node(
    evaluate: Callable[..., dict],
    checkpoint: str = "final_checkpoint",
    report: str = "eval_report",
    name: str = "evaluate",
) -> Node:
    """The node ``name``: ``evaluate`` (a recipe's own function, which calls ``evaluate_and_log``) of the
    checkpoint dataset ``checkpoint`` into the report dataset ``report``."""
    return node(evaluate, [checkpoint, *EVALUATION_INPUTS], report, name=name)
