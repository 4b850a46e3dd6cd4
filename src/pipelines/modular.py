"""Modular pipelines: a template pipeline under a namespace, as Kedro reuses one pipeline for several recipes.

Every pipeline is a modular pipeline under its own namespace, the name it is registered under (``baseline``,
``dim_reduce`` with one nested namespace per stage, ``dim_reduce.stage2``): its nodes are ``baseline.train``,
``dim_reduce.stage2.train_stage2``, and the datasets it writes ``baseline.final_checkpoint``, which the catalog's
dataset factories (``{recipe}.final_checkpoint``) map to files. kedro-viz draws each namespace as a box that
expands, and the run commands it offers (``kedro run --to-nodes='dim_reduce.stage2.train_stage2'``) name the pipeline
through the first part of the name (``pipeline_registry.pipelines_named_by``). A parameter dataset
(``params:thor.lr``) names a dotted key of the configuration, whose value ``value_at`` reads.
"""

from __future__ import annotations

from collections.abc import Mapping

from kedro.pipeline import Pipeline, pipeline

PARAMS_PREFIX = "params:"
# The tag of the nodes of one of a pipeline's several trainings (dim_reduce's stage1, stage2, control; thor_bert's thor,
# baseline): each such node runs in the MLflow child run named after the last part of its namespace
# (``hooks.training_runs``), so a training's parameters, rows and final figures stay together.
TRAINING_RUN_TAG = "training_run"


def namespaced(
    template: Pipeline,
    namespace: str,
    inputs: Mapping[str, str] | None = None,
    outputs: Mapping[str, str] | None = None,
    sections: Mapping[str, str] | None = None,
) -> Pipeline:
    """``template`` as the modular pipeline ``namespace`` (``baseline``, ``dim_reduce.stage2``).

    Its nodes and the datasets it writes take the namespace as prefix (``train`` -> ``baseline.train``,
    ``final_checkpoint`` -> ``baseline.final_checkpoint``). What it reads from elsewhere keeps its name: the data
    pipeline's ``manifest`` and ``class_index``, and every parameter (``params:dim_reduce.stage2``). ``inputs``
    maps its other inputs to another stage's datasets (``{"pca_matrix": "dim_reduce.trajectory_pca.pca_matrix"}``),
    ``outputs`` names datasets it writes outside its namespace (the data pipeline's ``manifest``), and
    ``sections`` maps a template's parameter section, with its keys, to the configuration's (``{"recipe": "thor"}``:
    ``params:recipe`` is ``params:thor``, ``params:recipe.frequency`` is ``params:thor.frequency``).
    Templates use plain names: Kedro warns about a dotted name outside its node's namespace.
    """
    inputs = dict(inputs or {})
    free = template.inputs()
    kept = {name: name for name in free if not _is_parameter(name) and name not in inputs}
    parameters = {name: _section_key(name, sections or {}) for name in free if _is_parameter(name)}
    return pipeline(
        template,
        namespace=namespace,
        inputs={**kept, **inputs} or None,
        outputs=dict(outputs or {}) or None,
        parameters=parameters or None,
    )


def _is_parameter(name: str) -> bool:
    """A section or key (``params:thor``), or Kedro's whole configuration (``parameters``)."""
    return name.startswith(PARAMS_PREFIX) or name == "parameters"


def _section_key(name: str, sections: Mapping[str, str]) -> str:
    """The configuration's parameter for the template's ``name`` (``params:recipe.frequency``)."""
    key = name.removeprefix(PARAMS_PREFIX)
    head, dot, rest = key.partition(".")
    return PARAMS_PREFIX + sections[head] + dot + rest if head in sections else name


def value_at(tree: Mapping, key: str):
    """The value of the dotted key ``key`` in the configuration ``tree``: a parameter dataset's (``params:thor.lr``)
    or the key itself (``thor.lr.peak``); ``tree``'s sections may be mappings or models (sections Kedro validated)."""
    value = tree
    for name in key.removeprefix(PARAMS_PREFIX).split("."):
        if isinstance(value, Mapping) and name in value:
            value = value[name]
        elif name in getattr(type(value), "model_fields", ()):  # a section Kedro validated (a pydantic model)
            value = getattr(value, name)
        else:
            raise KeyError(f"the configuration has no key {key.removeprefix(PARAMS_PREFIX)!r} (at {name!r})")
    return value
