"""The image training template: ``build_network`` -> ``train`` -> ``evaluate`` -> ``export_model``, one modular
pipeline that each image recipe instantiates under its own namespace and parameter section
(``training_pipeline("thor")``: nodes ``thor.build_network``, ``thor.train``, ``thor.evaluate``,
``thor.export_model`` reading ``params:thor``). dim_reduce's stages take its ``build_node``, ``evaluate_node`` and
``export_node`` around trainings of their own, which read ``CONTEXT_INPUTS`` as ``train`` does.

Every node reads the data pipeline's datasets and the shared sections it needs from the catalog itself: no
in-memory dataset passes them on, which a partial run (``--nodes=baseline.evaluate``,
``--from-nodes=dim_reduce.stage2.train_stage2``) would not have."""

from kedro.pipeline import Node, Pipeline, node, pipeline

from pipelines.modular import namespaced

from .nodes import build_network, evaluate, export_model, train

# The template's name for the recipe's parameter section; training_pipeline maps it to the recipe's
RECIPE = "recipe"
# What a training reads besides its weights and its own sections (trainlib's TrainingContext): the data pipeline's
# datasets and the shared sections
CONTEXT_INPUTS = ["manifest", "class_index", "params:network", "params:data", "params:runtime", "params:distributed"]
# What an evaluation or an export reads of them: it runs in this process alone, on no msrun worker
EVALUATION_INPUTS = CONTEXT_INPUTS[:-1]


def build_node() -> Node:
    """``build_network``: the initial weights, with the recipe section's ``zero_init_last_bn_gamma``."""
    return node(
        build_network,
        ["class_index", "params:network", "params:runtime", f"params:{RECIPE}.zero_init_last_bn_gamma"],
        "initial_weights",
        name="build_network",
    )


def evaluate_node() -> Node:
    """``evaluate``: the training's ``final_checkpoint`` on val into ``eval_report``."""
    return node(evaluate, ["final_checkpoint", *EVALUATION_INPUTS], "eval_report", name="evaluate")


def export_node() -> Node:
    """``export_model``: the training's ``final_checkpoint`` as a model folder, ``model`` (MindIR, description,
    example image; ``params:model``'s ``export_batch_size``), which ``hooks.models`` logs to the training's MLflow
    run."""
    return node(export_model, ["final_checkpoint", *EVALUATION_INPUTS, "params:model"], "model", name="export_model")


def training_pipeline(section: str) -> Pipeline:
    """The template for the recipe whose parameter section and namespace are ``section`` (``baseline``,
    ``adasum``, ``thor``)."""
    train_node = node(
        train,
        ["initial_weights", *CONTEXT_INPUTS, f"params:{RECIPE}", "params:boost", "params:target"],
        ["final_checkpoint", "history", "step_history"],
        name="train",
    )
    template = pipeline([build_node(), train_node, evaluate_node(), export_node()])
    return namespaced(template, section, sections={RECIPE: section})
