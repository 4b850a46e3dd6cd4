"""Pipeline pieces reused by every training pipeline."""

from functools import partial

from kedro.pipeline import Pipeline, node, pipeline

from .nodes import build_network, evaluate_checkpoint


def build_network_pipeline(output: str) -> Pipeline:
    return pipeline([
        node(build_network, ["params:model", "class_index", "params:runtime"], output,
             name=f"build_network_{output}"),
    ])


def evaluation_pipeline(checkpoint: str, report: str, metric_prefix: str) -> Pipeline:
    """Evaluate the catalog checkpoint ``checkpoint`` on val into the catalog report ``report``."""
    return pipeline([
        node(
            partial(evaluate_checkpoint, metric_prefix=metric_prefix),
            [checkpoint, "manifest", "class_index", "params:model", "params:data", "params:runtime"],
            report, name=f"evaluate_{metric_prefix}",
        ),
    ])
