"""The registered pipelines as kedro-viz shows them: namespaced modular pipelines (dim_reduce's stages nested),
nodes that are their own functions and take the parameter sub-keys they use, catalog entries with layers, and
run commands that work when pasted."""

from __future__ import annotations

import inspect
import logging
import types
import typing
from pathlib import Path

import pytest
from kedro.io import DataCatalog

from pipelines.pipeline_registry import DEFAULT_PIPELINE, PIPELINE_NAMES, pipelines_named_by, register_pipelines
from tests.support.config import load_config
from tests.support.projects import PROJECT
from trainlib.params import BoostParams, ImageRecipe, LanguageRecipe, Parameters

RECIPE_UNIONS = (ImageRecipe, LanguageRecipe)
LAYERS = {"raw", "intermediate", "primary", "feature", "model_input", "models", "model_output", "reporting"}
DIM_REDUCE_STAGES = {"stage1", "trajectory_pca", "stage2", "control", "comparison"}
TEMPLATE_NODES = PROJECT / "src/pipelines/training/nodes.py"


@pytest.fixture(scope="module")
def registered():
    return register_pipelines()


def datasets_of(pipeline) -> set[str]:
    """Every dataset a pipeline reads or writes, parameters left out."""
    return {name for name in pipeline.datasets() if not name.startswith("params:") and name != "parameters"}


def test_the_registry_holds_each_pipeline_and_the_default(registered):
    assert set(registered) == {*PIPELINE_NAMES, "__default__"}
    assert DEFAULT_PIPELINE == "baseline" and registered["__default__"] is registered[DEFAULT_PIPELINE]
    assert set(registered["baseline"].nodes) == set((registered["data"] + registered["baseline"]).nodes)


def test_every_node_and_dataset_is_named_after_its_pipeline(registered):
    for name in PIPELINE_NAMES:
        pipeline = registered[name]
        own = pipeline - registered["data"] if name != "data" else pipeline
        assert {node.name.split(".")[0] for node in own.nodes} == {name}
        assert {node.namespace.split(".")[0] for node in own.nodes} == {name}
        # the data pipeline's manifest and class index, read by every training, keep their names
        assert {d for d in datasets_of(own) if not d.startswith(name + ".")} <= {"manifest", "class_index"}
        # a name alone names a pipeline that holds it: what a kedro-viz run command without --pipelines runs
        for item in [node.name for node in pipeline.nodes] + sorted(datasets_of(pipeline)):
            holders = [registered[p] for p in pipelines_named_by([item])] or [registered["__default__"]]
            assert any(item in {n.name for n in p.nodes} | p.datasets() for p in holders), item


def test_dim_reduce_stages_are_nested_modular_pipelines(registered):
    own = registered["dim_reduce"] - registered["data"]
    assert {node.namespace for node in own.nodes} == {f"dim_reduce.{stage}" for stage in DIM_REDUCE_STAGES}
    names = {node.name for node in own.nodes}
    assert {
        "dim_reduce.stage1.train_stage1",
        "dim_reduce.stage2.train_stage2",
        "dim_reduce.control.train_control",
    } <= names
    assert {f"dim_reduce.{t}.evaluate" for t in ("stage1", "stage2", "control")} <= names
    assert "dim_reduce.comparison.compare_runs" in names


@pytest.mark.parametrize(
    ("names", "pipelines"),
    [
        ([], []),
        (["dim_reduce.stage2.train_stage2"], ["dim_reduce"]),
        (["baseline.train", "manifest"], []),  # in __default__: the command runs as it always did
        (["data.build_manifest"], []),
        (["thor.evaluate", "dim_reduce.stage2.final_checkpoint"], ["dim_reduce", "thor"]),
        (["params:dim_reduce.stage2"], ["dim_reduce"]),
        (["report.plot_recipes"], ["report"]),
        (["nowhere.train"], []),  # left to Kedro's own error
    ],
)
def test_pipelines_named_by(names, pipelines):
    assert pipelines_named_by(names) == pipelines


def test_each_node_runs_its_own_function(registered):
    # kedro-viz shows inspect.getfile(func) and the source of func (unwrapped): a decorator's file, a partial's
    # nothing; each node's function must be a plain module-level function of its pipeline folder or of the image
    # training template
    for node in {node for pipeline in registered.values() for node in pipeline.nodes}:
        func = node.func
        assert inspect.isfunction(func) and not hasattr(func, "__wrapped__"), node.name
        assert func.__qualname__ == func.__name__, node.name  # not a closure or a lambda
        source = Path(inspect.getfile(func))
        folder = node.name.split(".")[0]
        assert source in (PROJECT / f"src/pipelines/{folder}/nodes.py", TEMPLATE_NODES), node.name
        assert inspect.getsource(func).startswith(f"def {func.__name__}("), node.name


def test_recipes_of_one_shape_share_one_template(registered):
    """baseline, adasum and thor are one modular pipeline under three namespaces; dim_reduce's stages build and
    evaluate with its nodes; thor_bert's two trainings are one template too: one function per node, not a copy."""
    nodes = {node.name: node.func for pipeline in registered.values() for node in pipeline.nodes}
    for step in ("build_network", "train", "evaluate"):
        assert len({nodes[f"{recipe}.{step}"] for recipe in ("baseline", "adasum", "thor")}) == 1, step
    evaluations = {nodes[f"dim_reduce.{t}.evaluate"] for t in ("stage1", "stage2", "control")}
    assert evaluations == {nodes["baseline.evaluate"]}
    assert nodes["dim_reduce.stage1.build_network"] is nodes["baseline.build_network"]
    for step in ("train", "evaluate"):
        assert nodes[f"thor_bert.thor.{step}"] is nodes[f"thor_bert.control.{step}"]


def test_each_training_of_several_runs_in_a_child_run_of_its_own(registered):
    tagged = {node.name for pipeline in registered.values() for node in pipeline.nodes if "training_run" in node.tags}
    stages = ("stage1", "stage2", "control")
    expected = {f"dim_reduce.{t}.{step}" for t in stages for step in (f"train_{t}", "evaluate")}
    expected |= {f"thor_bert.{t}.{step}" for t in ("thor", "control") for step in ("train", "evaluate")}
    # building the initial weights is not part of the training's run: it logs nothing; the training's node reads the
    # shared sections itself, so its run logs them
    assert tagged == expected


def kinds_of(annotation) -> tuple:
    """The types a union annotation admits, ``None`` left out (``BoostParams | None``: ``BoostParams``)."""
    if isinstance(annotation, types.UnionType) or typing.get_origin(annotation) is typing.Union:
        return tuple(kind for kind in typing.get_args(annotation) if kind is not type(None))
    return (annotation,)


def parameter_type(key: str):
    """The type ``Parameters`` gives the dotted parameter ``key`` (``dim_reduce.stage2``: ``Stage2Params``)."""
    annotation = Parameters
    for part in key.split("."):
        annotation = annotation.model_fields[part].annotation
    return annotation


def test_nodes_take_the_parameter_sub_keys_they_use_as_typed_models(registered):
    for node in {node for pipeline in registered.values() for node in pipeline.nodes}:
        hints = typing.get_type_hints(node.func, include_extras=True)  # bounds too (PositiveInt)
        arguments = list(inspect.signature(node.func).parameters)
        for position, name in enumerate(node.inputs):
            if name.startswith("params:"):
                key, hint = name.removeprefix("params:"), hints[arguments[position]]
                # a template's section (ImageRecipe, LanguageRecipe) has the section's own model among its kinds;
                # an optional section (the template's boost, which only the baseline reads) is the section's model
                kinds = hint.__subclasses__() if hint in RECIPE_UNIONS else kinds_of(hint)
                assert set(kinds_of(parameter_type(key))) <= set(kinds), (node.name, name)
    params = {name for node in registered["dim_reduce"].nodes for name in node.inputs if name.startswith("params:")}
    assert "params:dim_reduce" not in params
    assert {"params:dim_reduce.stage1", "params:dim_reduce.pca", "params:dim_reduce.stage2"} <= params
    (build,) = [node for node in registered["thor"].nodes if node.name == "thor.build_network"]
    assert "params:thor.zero_init_last_bn_gamma" in build.inputs and "params:thor" not in build.inputs


@pytest.fixture(scope="module")
def catalog() -> DataCatalog:
    return DataCatalog.from_config(load_config("base", "catalog"))


def test_every_dataset_has_a_layer(registered, catalog):
    for name in sorted(set().union(*(datasets_of(p) for p in registered.values()))):
        assert name in catalog, name
        assert catalog.get(name).metadata["kedro-viz"]["layer"] in LAYERS, name


@pytest.mark.parametrize(
    ("name", "file", "artifact"),
    [
        ("baseline.final_checkpoint", "data/06_models/baseline/final.ckpt", {"folder": "checkpoints"}),
        ("thor.history", "data/08_reporting/thor_history.csv", {"folder": "reports"}),
        ("adasum.eval_report", "data/08_reporting/adasum_eval.json", {"folder": "reports"}),
        ("dim_reduce.stage1.initial_weights", "data/06_models/dim_reduce/initial.ckpt", None),
        (
            "dim_reduce.stage2.final_checkpoint",
            "data/06_models/dim_reduce/stage2.ckpt",
            {"folder": "checkpoints", "training": "stage2"},
        ),
        (
            "dim_reduce.control.eval_report",
            "data/08_reporting/dim_reduce/control_eval.json",
            {"folder": "reports", "training": "control"},
        ),
        ("dim_reduce.trajectory_pca.pca_matrix", "data/06_models/dim_reduce/pca_matrix.npy", {"folder": "pca"}),
        ("report.loss_plot", "data/08_reporting/report/loss.png", {"folder": "report"}),
    ],
)
def test_dataset_factories_give_each_recipe_its_files_and_artifacts(catalog, name, file, artifact):
    dataset = catalog.get(name)
    assert Path(dataset._describe()["filepath"]).as_posix().endswith(file)
    assert dataset.metadata.get("mlflow_artifact") == artifact


def test_corpus_sentences_survive_the_catalog_round_trip(catalog, tmp_path):
    """Sentences pandas would read as missing values or numbers come back as the text they are."""
    from trainlib.text.corpus import Document, documents_from_table, documents_table

    documents = [Document("a.rst.txt", ("NaN", "None", "1.0", "null", "")), Document("b.rst.txt", ("Plain text.",))]
    dataset = catalog.get("thor_bert.corpus.train_documents")
    dataset._filepath = tmp_path / "train_documents.csv"  # the catalog's dataset, pointed at a temporary file
    dataset.save(documents_table(documents))
    assert documents_from_table(dataset.load()) == documents


def test_every_node_types_a_parameter_as_every_other_node_does(registered, caplog):
    """Kedro validates a parameter once per run by the type its nodes give it; two types for one key
    ('Conflicting type requirements') would make a node receive the other node's model, and warn."""
    from kedro.validation.type_extractor import TypeExtractor

    with caplog.at_level(logging.WARNING, logger="kedro.validation.type_extractor"):
        requirements = TypeExtractor(registered).extract_types_from_pipelines()
    assert not [record.getMessage() for record in caplog.records if "Conflicting" in record.getMessage()]
    assert requirements["boost"] is BoostParams and requirements["thor"] is ImageRecipe
