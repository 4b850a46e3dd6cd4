"""Nodes and pipeline pieces several pipeline folders use: build the network, evaluate a checkpoint,
the inputs of a training node, the history table of a training.

Nodes here take typed parameter sections (``pipelines.params``), call the library
(``pipelines.recipes``) and log what it returns through ``pipelines.tracking``.
"""

from __future__ import annotations

import pandas as pd
from kedro.pipeline import Pipeline, node, pipeline

from pipelines import tracking
from pipelines.engine.checkpoint import Checkpoint
from pipelines.engine.loop import TrainingResult, history_table
from pipelines.params import DataParams, ModelParams, RuntimeParams
from pipelines.recipes.common import build_network, evaluate_checkpoint


def training_inputs(section: str) -> list[str]:
    """The inputs every training node takes after its start checkpoint; ``section`` its own parameters."""
    return [
        "manifest",
        "class_index",
        "params:model",
        "params:data",
        "params:runtime",
        "params:distributed",
        f"params:{section}",
    ]


def training_outputs(result: TrainingResult) -> tuple[Checkpoint, pd.DataFrame]:
    """A training node's outputs: the final checkpoint and the history table; its end-of-training figures
    (``distributed/replica_max_abs_diff``) go to the active run."""
    tracking.log_metrics(result.summary)
    return result.checkpoint, history_table(result.history)


def build_network_node(model: ModelParams, class_index: dict[str, int], runtime: RuntimeParams) -> Checkpoint:
    """Initial weights of the configured ResNet, seeded by ``runtime.seed``."""
    return build_network(model, class_index, runtime)


def build_network_pipeline(output: str, name: str) -> Pipeline:
    """Initial weights of the configured network into the catalog checkpoint ``output``."""
    return pipeline([node(build_network_node, ["params:model", "class_index", "params:runtime"], output, name=name)])


def evaluation_node(label: str, child_run: str | None = None):
    """A node function evaluating a checkpoint on val: report, and ``final/top1``, ``final/top5`` logged.

    ``label`` names the model in the log (``baseline: top-1 …``); with ``child_run`` the metrics go to
    that training's child run (``tracking.training_run``) instead of the ``kedro run``'s run.
    """

    def evaluate(
        checkpoint: Checkpoint,
        manifest: pd.DataFrame,
        class_index: dict[str, int],
        model: ModelParams,
        data: DataParams,
        runtime: RuntimeParams,
    ) -> dict:
        report = evaluate_checkpoint(checkpoint, manifest, class_index, model, data, runtime, label)
        if child_run is None:
            tracking.log_final(report)
        else:
            with tracking.training_run(child_run):
                tracking.log_final(report)
        return report

    evaluate.__name__ = evaluate.__qualname__ = f"evaluate_{label}"
    return evaluate


def evaluation_pipeline(checkpoint: str, report: str, label: str, child_run: str | None = None) -> Pipeline:
    """Evaluate the catalog checkpoint ``checkpoint`` on val into the catalog report ``report``
    (node ``evaluate_<label>``; see ``evaluation_node``)."""
    return pipeline(
        [
            node(
                evaluation_node(label, child_run),
                [checkpoint, "manifest", "class_index", "params:model", "params:data", "params:runtime"],
                report,
                name=f"evaluate_{label}",
            ),
        ]
    )
