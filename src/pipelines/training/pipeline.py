"""The image training template: ``training_context`` -> ``build_network`` -> ``train`` -> ``evaluate``, one modular
pipeline that each image recipe instantiates under its own namespace and parameter section
(``training_pipeline("thor")``: nodes ``thor.training_context``, ``thor.build_network``, ``thor.train``,
``thor.evaluate``, ``thor.export_model`` reading ``params:thor``). dim_reduce's stages take its ``context_node``,
``build_node``, ``evaluate_node`` and ``export_node`` around trainings of their own."""

from kedro.pipeline import Node, Pipeline, node, pipeline

from pipelines.modular import namespaced

from .nodes import build_network, evaluate, export_model, train, training_context

# The template's name for the recipe's parameter section; training_pipeline maps it to the recipe's
RECIPE = "recipe"
# What a training's context is made of: the data pipeline's datasets and the shared sections
CONTEXT_INPUTS = ["manifest", "class_index", "params:model", "params:data", "params:runtime", "params:distributed"]


def context_node() -> Node:
    """``training_context``: the manifest, class index and shared sections as one dataset, ``training_context``,
    which the training's other nodes read."""
    return node(training_context, CONTEXT_INPUTS, "training_context", name="training_context")


def build_node() -> Node:
    """``build_network``: the initial weights, with the recipe section's ``zero_init_last_bn_gamma``."""
    return node(
        build_network,
        ["training_context", f"params:{RECIPE}.zero_init_last_bn_gamma"],
        "initial_weights",
        name="build_network",
    )


def evaluate_node() -> Node:
    """``evaluate``: the training's ``final_checkpoint`` on val into ``eval_report``."""
    return node(evaluate, ["final_checkpoint", "training_context"], "eval_report", name="evaluate")


def export_node() -> Node:
    """``export_model``: the training's ``final_checkpoint`` as a model folder, ``model`` (MindIR, description,
    example image), which ``hooks.models`` logs to the training's MLflow run."""
    return node(export_model, ["final_checkpoint", "training_context"], "model", name="export_model")


def training_pipeline(section: str) -> Pipeline:
    """The template for the recipe whose parameter section and namespace are ``section`` (``baseline``,
    ``adasum``, ``thor``)."""
    train_node = node(
        train,
        ["initial_weights", "training_context", f"params:{RECIPE}", "params:boost", "params:target"],
        ["final_checkpoint", "history", "step_history"],
        name="train",
    )
    template = pipeline([context_node(), build_node(), train_node, evaluate_node(), export_node()])
    return namespaced(template, section, sections={RECIPE: section})
