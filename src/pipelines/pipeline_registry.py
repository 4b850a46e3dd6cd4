"""Project pipelines: each registered under the name of its folder, which is also its namespace.

Every node and dataset of a pipeline is named ``<pipeline>.…`` (``dim_reduce.stage2.train_stage2``,
``baseline.final_checkpoint``), except the data pipeline's manifest and class index, which every training reads.
So a name alone says which pipeline to run: ``pipelines_named_by`` is how ``kedro run`` resolves the run commands
kedro-viz offers, which name a node or a dataset but no pipeline
(``kedro run --to-nodes='dim_reduce.stage2.train_stage2'``).
"""

from __future__ import annotations

from collections.abc import Iterable
from importlib import import_module

from kedro.pipeline import Pipeline

from trainlib.params.recipe_spec import recipe_pipelines

# The registered names besides __default__ (tests/pipelines/test_registry.py checks them against register_pipelines()):
# the data every image recipe reads, each recipe with a pipeline of its own (``RecipeSpec``, this package's and other
# installed packages'), then the pipelines that read the recipes' runs. The recipes come before the study: Kedro 1.7
# validates typed parameters in this order and cannot set a section's keys (params:thor_bert.corpus) once the whole
# section is set, only the reverse.
PIPELINE_NAMES = ("data", *recipe_pipelines(), "report", "migrate", "study", "predict")
DEFAULT = ("data", "baseline")
DEFAULT_PIPELINE = "baseline"  # what __default__ runs, and the name its MLflow run and tag take


def register_pipelines() -> dict[str, Pipeline]:
    """Each image recipe after the data pipeline (a language model's alone); ``__default__`` is ``baseline``."""
    # Imported here, not at the top: ``pipelines_named_by`` serves the command line before any run, and the
    # pipeline modules load MindSpore through their nodes.
    recipes = recipe_pipelines()
    modules = {
        name: recipes[name].pipeline_module_name if name in recipes else f"pipelines.{name}.pipeline"
        for name in PIPELINE_NAMES
    }
    created = {name: import_module(module).create_pipeline() for name, module in modules.items()}
    data = created["data"]
    registered = {"data": data}
    for name, spec in recipes.items():
        registered[name] = data + created[name] if spec.task == "image_classification" else created[name]
    registered |= {
        "report": created["report"],
        "migrate": created["migrate"],
        "study": data + created["study"],
        "predict": created["predict"],  # a model from MLflow: no data pipeline, no training
    }
    return {**registered, "__default__": registered[DEFAULT_PIPELINE]}


def pipelines_named_by(names: Iterable[str]) -> list[str]:
    """The pipelines that node, dataset or parameter ``names`` belong to, by their first namespace part
    (``dim_reduce.stage2.train_stage2``, ``params:dim_reduce.stage2``: ``dim_reduce``), in registry order.

    For ``kedro run`` without ``--pipelines``: its node and dataset filters then run in these pipelines instead of
    ``__default__``. Empty when ``__default__`` holds every name (the data and baseline pipelines' names, the
    shared ``manifest``), so such a command runs as it always did; a name of no pipeline is left to Kedro's error.
    """
    named = {name.removeprefix("params:").split(".")[0] for name in names if "." in name}
    if named <= set(DEFAULT):
        return []
    return [pipeline for pipeline in PIPELINE_NAMES if pipeline in named]
