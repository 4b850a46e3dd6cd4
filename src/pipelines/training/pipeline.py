"""The image training template: ``build_network`` -> ``train`` -> ``evaluate``, one modular pipeline that each
image recipe instantiates under its own namespace and parameter section (``training_pipeline("thor")``: nodes
``thor.build_network``, ``thor.train``, ``thor.evaluate``, ``thor.export_model`` reading ``params:thor``).
dim_reduce's stages take its ``build_node``, ``evaluate_node`` and ``export_node`` around trainings of their own."""

from kedro.pipeline import Node, Pipeline, node, pipeline

from pipelines.modular import namespaced

from .nodes import build_network, evaluate, export_model, train

# The template's name for the recipe's parameter section; training_pipeline maps it to the recipe's
RECIPE = "recipe"
# What every training reads after its start checkpoint and before its own section
TRAINING_INPUTS = ["manifest", "class_index", "params:model", "params:data", "params:runtime", "params:distributed"]


def build_node() -> Node:
    """``build_network``: the initial weights, with the recipe section's ``zero_init_last_bn_gamma``."""
    return node(
        build_network,
        ["params:model", f"params:{RECIPE}.zero_init_last_bn_gamma", "class_index", "params:runtime"],
        "initial_weights",
        name="build_network",
    )


def evaluate_node() -> Node:
    """``evaluate``: the training's ``final_checkpoint`` on val into ``eval_report``."""
    inputs = ["final_checkpoint", "manifest", "class_index", "params:model", "params:data", "params:runtime"]
    return node(evaluate, inputs, "eval_report", name="evaluate")


def export_node() -> Node:
    """``export_model``: the training's ``final_checkpoint`` as a model folder, ``model`` (MindIR, description,
    example image), which ``hooks.models`` logs to the training's MLflow run."""
    inputs = ["final_checkpoint", "manifest", "class_index", "params:model", "params:data", "params:runtime"]
    return node(export_model, inputs, "model", name="export_model")


def training_pipeline(section: str) -> Pipeline:
    """The template for the recipe whose parameter section and namespace are ``section`` (``baseline``,
    ``adasum``, ``thor``)."""
    train_node = node(
        train,
        ["initial_weights", *TRAINING_INPUTS, f"params:{RECIPE}", "params:boost", "params:target"],
        ["final_checkpoint", "history"],
        name="train",
    )
    template = pipeline([build_node(), train_node, evaluate_node(), export_node()])
    return namespaced(template, section, sections={RECIPE: section})
