"""Pipeline pieces reused by every training pipeline."""

from functools import partial, update_wrapper

from kedro.pipeline import Pipeline, node, pipeline

from .nodes import build_network, evaluate_checkpoint


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


def build_network_pipeline(output: str, name: str) -> Pipeline:
    """Initial weights of the configured network into the catalog checkpoint ``output``."""
    return pipeline([node(build_network, ["params:model", "class_index", "params:runtime"], output, name=name)])


def evaluation_pipeline(checkpoint: str, report: str, metric_prefix: str) -> Pipeline:
    """Evaluate the catalog checkpoint ``checkpoint`` on val into the catalog report ``report``."""
    return pipeline(
        [
            node(
                update_wrapper(partial(evaluate_checkpoint, metric_prefix=metric_prefix), evaluate_checkpoint),
                [checkpoint, "manifest", "class_index", "params:model", "params:data", "params:runtime"],
                report,
                name=f"evaluate_{metric_prefix}",
            ),
        ]
    )
