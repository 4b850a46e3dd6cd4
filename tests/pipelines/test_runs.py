"""Each registered pipeline run once in this process, through ``KedroSession`` as ``kedro run`` runs it, on a tiny
generated tree (tests/support/runner.py): the nodes' glue, typed parameters and outputs, the catalog's files, the
project's hooks, and what the run logs to MLflow.

The same pipelines as real ``kedro run`` processes, with the command line, are the slow tier's (tests/e2e/)."""

from __future__ import annotations

import logging
import math
import os
import platform
import shutil
from pathlib import Path

import mindspore
import mlflow
import numpy as np
import pandas as pd
import pytest

from pipelines.pipeline_registry import PIPELINE_NAMES
from pipelines.tracking.links import runs_to_compare
from tests.support.backends import assert_declared_on_every_target, dumped_graphs
from tests.support.csv_files import assert_readable_csv_files
from tests.support.pipeline_runs import (
    assert_the_study_trained_it,
    children,
    client,
    cpu_model,
    only_run,
    runs_of,
    up_to,
    widest_isa,
)
from tests.support.runner import process_state_kept, run_pipeline, session_project, tiny_params, tracking_uri
from tests.support.trees import write_image_tree
from trainlib.metrics import (
    EPOCH_KEYS,
    FINAL_MLM_ACCURACY,
    FINAL_TOP1,
    TRAIN_LOSS,
    TRAIN_SEQUENCES_PER_S,
    VAL_MLM_ACCURACY,
    VAL_MLM_LOSS,
    VAL_TOP1,
)
from trainlib.recipes.language_model import COLLAPSED, MOST_FREQUENT_TOKEN_ACCURACY
from trainlib.text.tokenizer import pieces, tokenizer_from_json

CLASSES = ("cat", "dog", "fox")


@pytest.fixture
def workspace(tmp_path):
    """A tree and a temporary project of its own: the runs' files and their MLflow store land there."""
    tree = write_image_tree(tmp_path / "tree", classes=CLASSES, per_class={"train": 8, "val": 3})
    return tree, session_project(tmp_path / "project")


def run_audited(pipeline: str, params: dict, project: Path, graphs, **filters) -> dict:
    """``run_pipeline``, then the backend audit of every graph it compiled (tests/support/backends.py)."""
    with dumped_graphs(graphs):
        outputs = run_pipeline(pipeline, params, project, **filters)
    assert_declared_on_every_target(graphs)
    return outputs


def assert_trained(outputs: dict, recipe: str, epochs: int) -> None:
    report, history = outputs[f"{recipe}.eval_report"], outputs[f"{recipe}.history"]
    assert report["val_images"] == 3 * len(CLASSES) and report["epoch"] == epochs
    assert 0.0 <= report["top1"] <= report["top5"] <= 1.0
    assert list(history["epoch"]) == list(range(1, epochs + 1))
    assert set(EPOCH_KEYS) <= set(history.columns)
    assert history[TRAIN_LOSS].map(math.isfinite).all()


def test_every_registered_pipeline_has_a_run_here():
    tested = {
        name.removeprefix("test_").removesuffix("_pipeline")
        for name in globals()
        if name.startswith("test_") and name.endswith("_pipeline")
    }
    for test in globals().values():  # a test running several pipelines names them in its ``pipelines`` mark
        tested.update(*(mark.args for mark in getattr(test, "pytestmark", []) if mark.name == "pipelines"))
    assert set(PIPELINE_NAMES) == tested


def mlflow_process_state() -> tuple:
    """What a run could leave set for the whole process: MLflow's tracking URI and active experiment."""
    return mlflow.get_tracking_uri(), os.environ.get("MLFLOW_TRACKING_URI"), os.environ.get("MLFLOW_EXPERIMENT_ID")


def test_data_pipeline(workspace):
    tree, project = workspace
    before = mlflow_process_state()
    outputs = run_pipeline("data", tiny_params(tree), project)
    assert mlflow_process_state() == before  # the run's store and experiment were the run's only
    assert outputs["class_index"] == {name: label for label, name in enumerate(CLASSES)}
    assert outputs["manifest"]["split"].value_counts().to_dict() == {"train": 24, "val": 9}
    assert outputs["data.bad_files"].empty
    assert (project / "data/02_intermediate/manifest.csv").is_file()  # the catalog's files, in the project
    # named and tagged by the project's hooks, the parameters logged by kedro-mlflow
    run = only_run(tracking_uri(project), "data")
    assert run.info.status == "FINISHED"
    assert run.info.run_name.startswith("data source=folder ")  # the --params that change the configuration
    expected = {"env": "base", "runner": "RecordingRunner", "network": "resnet_narrow", "image_size": "16"}
    expected |= {"train_images": "24", "val_images": "9", "classes": "3"}  # from the manifest it saved
    assert {key: run.data.tags[key] for key in expected} == expected
    assert run.data.params["data.image_size"] == "16" and run.data.params["data.root"] == str(tree)


def test_the_default_pipelines_run_has_its_real_name_in_a_model_training_experiment(workspace, caplog):
    """``kedro run`` without ``--pipelines`` (here its data nodes only): named and tagged ``baseline``, not
    ``__default__``, in kedro-mlflow's start line too; the experiment the run created is MLflow 3's model-training
    kind, not GenAI."""
    tree, project = workspace
    uri = tracking_uri(project)
    with caplog.at_level(logging.INFO, logger="kedro_mlflow"):
        run_pipeline(None, tiny_params(tree), project, namespaces=["data"])
    run = only_run(uri, "baseline")
    assert run.info.run_name.startswith("baseline ") and run.info.run_name.endswith(" (partial)")
    started = [record.getMessage() for record in caplog.records if record.getMessage().endswith("has started")]
    assert started == [f"Mlflow run '{run.info.run_name}' - '{run.info.run_id}' has started"]
    experiment = client(uri).get_experiment(run.info.experiment_id)
    assert experiment.tags["mlflow.experimentKind"] == "custom_model_development"


@pytest.mark.pipelines("baseline", "thor", "report")
def test_baseline_thor_and_report_pipelines(workspace, tmp_path):
    """The baseline's and thor's runs, each checked as its pipeline's, then the report over the two runs they logged
    (thor trains 1 epoch and the baseline 2: an unequal budget the report must refuse to compare)."""
    tree, project = workspace
    uri = tracking_uri(project)
    params = tiny_params(
        tree,
        {
            "model": {"register": True},
            "target": {"top1": 0.01},
            "thor": {"epochs": 1},
            "report": {"recipes": ["baseline", "thor"]},
        },
    )
    outputs = outputs_of_baseline = run_audited("baseline", params, project, tmp_path / "baseline_graphs")
    assert_trained(outputs, "baseline", epochs=2)
    run = only_run(uri, "baseline")
    baseline_run_id = run.info.run_id
    assert run.data.metrics[FINAL_TOP1] == pytest.approx(outputs["baseline.eval_report"]["top1"])
    assert [m.step for m in client(uri).get_metric_history(run.info.run_id, TRAIN_LOSS)] == [1, 2]
    # when it first reached its target (a low one, reached after the first epoch; no step evaluations here)
    history = outputs["baseline.history"]
    reached = {
        "target/reached": 1,
        "target/epochs": 1,
        "target/steps": 6,
        "target/time_s": history["train/epoch_time_s"][0],
    }
    assert {key: run.data.metrics[key] for key in reached} == pytest.approx(reached, rel=1e-6)
    # the final network as MindIR, logged as the run's MLflow model and registered under the recipe's name
    assert outputs["baseline.model"].description["classes"] == list(CLASSES)
    assert (project / "data/06_models/baseline/model/network.mindir").is_file()
    (version,) = client(uri).search_model_versions("name = 'baseline'")
    assert version.run_id == run.info.run_id
    # the final checkpoint in its file, and an artifact of the run (its catalog entry's mlflow_artifact): the
    # periodic checkpoints are gone (CheckpointHooks)
    assert (project / "data/06_models/baseline/final.ckpt").is_file()
    assert not list((project / "data/06_models/baseline/epochs").glob("*.ckpt"))
    artifacts = {artifact.path for artifact in client(uri).list_artifacts(run.info.run_id, "checkpoints")}
    assert artifacts == {"checkpoints/final.ckpt"}

    outputs = run_audited("thor", params, project, tmp_path / "thor_graphs", **up_to("thor.evaluate"))
    assert_trained(outputs, "thor", epochs=1)
    # 24 images in batches of 4: 6 steps, the inverses refreshed every 2
    history = outputs["thor.history"]
    assert list(history["thor/second_order_steps"]) == [3] and history["thor/inverses_computed"].iloc[-1] > 0
    assert outputs["thor.final_checkpoint"].metadata["epoch"] == 1

    outputs = run_pipeline("report", params, project)
    table = outputs["report.table"].set_index("recipe")
    for recipe in ("baseline", "thor"):
        assert table.at[recipe, "top1"] == pytest.approx(only_run(uri, recipe).data.metrics[FINAL_TOP1])
    histories = outputs["report.histories"]
    assert sorted(histories.groupby("recipe")["epoch"].max().items()) == [("baseline", 2), ("thor", 1)]
    # thor trained 1 epoch, the baseline 2: not compared (no study in this store), and the summary says why
    assert outputs["report.differences"].empty
    assert table.at["thor", "left_out"] == "unequal budget to baseline's run: epochs 1 vs 2"
    summary = outputs["report.summary"]
    assert summary.startswith("No verdict: no study in the experiment and no pair of single runs at equal budget")
    assert "- thor vs baseline (single runs): unequal budget: epochs 1 vs 2; not compared side by side." in summary
    axes = outputs["report.top1_vs_epoch_plot"].axes[0]
    assert [line.get_label() for line in axes.get_lines()] == ["baseline", "_target"]  # thor is not drawn beside it
    # no dim_reduce run: no explained-variance figure, on disk or in MLflow
    assert outputs["report.explained_variance_plot"] == {}
    assert not list((project / "data/08_reporting/report").rglob("explained_variance.png"))
    # the runs the closing link compares: the recipes' runs the report read
    report_run = only_run(uri, "report")
    assert set(report_run.data.tags["compared_runs"].split(",")) == {
        only_run(uri, r).info.run_id for r in ("baseline", "thor")
    }
    logged = {artifact.path for artifact in client(uri).list_artifacts(report_run.info.run_id, "report")}
    assert "report/summary.md" in logged and "report/explained_variance.png" not in logged
    assert_readable_csv_files(project / "data")

    # a partial rerun (`kedro run --nodes=baseline.evaluate`): the node reads the manifest, the class index and the
    # shared sections from the catalog itself, as in the whole run, and the run logs the sections it read
    evaluated = run_pipeline("baseline", params, project, node_names=["baseline.evaluate"])
    assert evaluated["baseline.eval_report"] == outputs_of_baseline["baseline.eval_report"]
    (partial,) = [run for run in runs_of(uri, "baseline") if run.info.run_id != baseline_run_id]
    assert {"network.name", "data.image_size", "runtime.seed"} <= set(partial.data.params)
    # `kedro run --nodes=data.build_manifest`: the data pipeline's one node reads only the parameters, so it runs
    # alone, and the tree it scans again gives the same manifest
    manifest = project / "data/02_intermediate/manifest.csv"
    before = manifest.read_bytes()
    rebuilt = run_pipeline("data", params, project, node_names=["data.build_manifest"])
    assert set(rebuilt) >= {"manifest", "class_index"} and manifest.read_bytes() == before


def test_predict_pipeline(workspace, tmp_path):
    """A model logged as a training run logs it (a random network here: the trained one is the slow tier's), then
    ``kedro run --pipelines=predict`` over the tree's val folder, with an image that does not decode."""
    from mindir_serving.classifier import MindirClassifier
    from pipelines.tracking.models import log_model
    from trainlib.models.resnet import create_resnet
    from trainlib.predict.export import export_classifier, save_model

    tree, project = workspace
    uri = tracking_uri(project)
    val = sorted((tree / "val").rglob("*.png"))
    model = export_classifier(
        create_resnet("resnet_narrow", len(CLASSES)),
        image_size=16,
        eval_resize_ratio=0.875,
        class_index={name: label for label, name in enumerate(CLASSES)},
        num_classes=len(CLASSES),
        network="resnet_narrow",
        training="baseline",
        example_image=val[0].read_bytes(),
        batch_size=4,
    )
    save_model(model, tmp_path / "model")
    with process_state_kept(tmp_path):
        mlflow.set_tracking_uri(uri)
        with mlflow.start_run() as trained:
            log_model(tmp_path / "model")
    (tree / "val/dog/broken.png").write_bytes(b"not a png")
    # the files that ended MindSpore's decoder (issue 52) and one it reads with libjpeg's warning
    kept = sorted((Path(__file__).parents[1] / "predict/bad_images").iterdir())
    (tree / "val/unsorted").mkdir()
    for path in kept:
        shutil.copyfile(path, tree / "val/unsorted" / path.name)
    params = {"predict": {"model": trained.info.run_id, "images": str(tree / "val"), "top_k": 2}}
    outputs = run_pipeline("predict", params, project)
    predictions, bad = outputs["predict.predictions"], outputs["predict.bad_images"]
    assert len(predictions) == len(val) + 1 + len(kept)
    crashers = [tree / "val/unsorted" / path.name for path in kept if not path.name.startswith("warns_")]
    assert list(bad["path"]) == [
        str(tree / "val/dog/broken.png"),
        *map(str, crashers),
        str(tree / "val/unsorted/warns_extraneous_bytes.jpg"),
    ]
    assert list(bad["error"])[0] == "not an image: the file starts with no JPEG, PNG or BMP signature"
    assert all(error.startswith(("corrupt JPEG: ", "truncated JPEG: ")) for error in bad["error"][1:-1])
    assert bad["error"].iloc[-1] == "" and bad["warning"].iloc[-1].startswith("Corrupt JPEG data: ")
    classified = predictions[(predictions["error"] == "") & (predictions["class_name"] != "")]
    expected = MindirClassifier.from_folder(tmp_path / "model").predict(
        [Path(path).read_bytes() for path in classified["path"]], top_k=2
    )
    assert list(classified["class_1"]) == list(expected["class_1"])
    assert set(classified["class_name"]) == set(CLASSES)  # labelled by their class folders
    top1 = (classified["class_1"] == classified["class_name"]).mean()
    run = only_run(uri, "predict")
    assert run.data.metrics["predict/top1"] == pytest.approx(top1)
    assert run.data.metrics["predict/images"] == len(val) + 1 + len(kept)
    assert run.data.metrics["predict/bad_images"] == 1 + len(crashers)
    assert (project / "data/07_model_output/predictions.csv").is_file()


def test_adasum_pipeline(workspace, tmp_path):
    tree, project = workspace
    outputs = run_audited("adasum", tiny_params(tree), project, tmp_path / "graphs", **up_to("adasum.evaluate"))
    assert_trained(outputs, "adasum", epochs=1)


def test_lars_pipeline(workspace, tmp_path):
    """LARS (its own optimizer cell: tests/optim/test_lars.py) trains through the image template, its checkpoints
    named after it."""
    tree, project = workspace
    outputs = run_audited("lars", tiny_params(tree), project, tmp_path / "graphs", **up_to("lars.evaluate"))
    assert_trained(outputs, "lars", epochs=1)
    assert outputs["lars.final_checkpoint"].metadata["training"] == "lars"


@pytest.mark.pipelines("dim_reduce", "study")
def test_dim_reduce_pipeline(workspace, tmp_path):
    tree, project = workspace
    uri = tracking_uri(project)
    graphs = tmp_path / "graphs"
    # stage 2 (and so the control) evaluates every 2 steps, as the study does it below
    overrides = {"dim_reduce": {"stage2": {"eval_every_steps": 2}}, "runtime": {"seed": 0}}
    params = tiny_params(tree, overrides)
    outputs = run_audited("dim_reduce", params, project, graphs, **up_to("dim_reduce.comparison.compare_runs"))
    comparison = outputs["dim_reduce.comparison.comparison"]
    assert list(comparison["model"]) == ["stage1", "stage2", "control"]
    assert list(comparison["epoch"]) == [2, 3, 3]
    assert list(outputs["dim_reduce.stage2.steps"]["step"]) == [13, 14, 15, 16, 17, 18]  # 6 steps per epoch
    assert len(outputs["dim_reduce.trajectory_pca.explained_variance"]) == 4
    trainings = children(uri, only_run(uri, "dim_reduce"))
    assert set(trainings) == {"stage1", "stage2", "control"}
    for training, child in trainings.items():
        assert FINAL_TOP1 in child.data.metrics, training
        assert child.info.run_name == f"dim_reduce/{training}"  # whose training it is, on its own page too
    # each child logs the parameters of its own section, so MLflow's Compare has columns for it
    assert trainings["stage2"].data.params["dim_reduce.stage2.rho"] == "0.55"
    assert trainings["control"].data.params["dim_reduce.control.checkpoint.keep_last"] == "2"
    # and the shared sections its training read, as the kedro run's run logs them
    for training, child in trainings.items():
        assert child.data.params["data.image_size"] == "16", training
        assert {"network.name", "runtime.seed", "distributed.worker_num"} <= set(child.data.params), training
    stage1_params = set(trainings["stage1"].data.params)
    assert "dim_reduce.stage1.epochs" in stage1_params and any(key.startswith("boost.") for key in stage1_params)

    # the study of dim_reduce on the same seed and evaluation trains what this run trained, to the bit
    study = {"study": {"recipes": ["dim_reduce"], "seeds": [0]}}
    studied = run_pipeline("study", tiny_params(tree, {**study, **overrides}), project, **up_to("study.run"))
    for row in ("stage2", "control"):
        history, steps = outputs[f"dim_reduce.{row}.history"], outputs[f"dim_reduce.{row}.step_history"]
        assert_the_study_trained_it(studied, row, history, steps)


@pytest.mark.pipelines("study", "report")
def test_study_pipeline(workspace, caplog):
    """The study of three recipes, each an epoch of 6 steps shorter than its evaluation interval of 8 (the issue's 15
    < 20), then the report over the study's runs."""
    tree, project = workspace
    uri = tracking_uri(project)
    params = tiny_params(tree, {"target": {"top1": 0.01}, "study": {"eval_every_steps": 8}})
    with caplog.at_level(logging.WARNING, logger="trainlib.study"):
        outputs = studied_outputs = run_pipeline("study", params, project)
    warnings = [record.getMessage() for record in caplog.records if record.name == "trainlib.study.runner"]
    assert warnings == [
        f"study.eval_every_steps is 8, but an epoch of {result} has 6 steps: its curve has a point every 8 steps "
        "across epochs and one at the training's end; set study.eval_every_steps to at most 6 for a point in every "
        "epoch"
        for result in ("baseline", "thor", "thor_first_order")
    ]
    # the curve is never empty: each training's end is a point of it
    curves = outputs["study.curves"]
    assert sorted(curves.groupby("result")["step"].apply(list).items()) == [
        ("baseline", [6]),
        ("thor", [6]),
        ("thor_first_order", [6]),
    ]
    drawn = [line for line in outputs["study.top1_vs_time_plot"].axes[0].get_lines() if line.get_marker() == "o"]
    assert [len(line.get_xdata()) for line in drawn] == [1, 1, 1]  # one point each, drawn as a marker
    summary = outputs["study.summary"]
    assert list(summary["result"]) == ["baseline", "thor", "thor_first_order"] and (summary["runs"] == 1).all()
    # the recipe as documented, and the curvature alone at equal recipe
    assert list(outputs["study.paired"]["comparison"].unique()) == ["thor vs baseline", "thor vs thor_first_order"]
    study_run = only_run(uri, "study")
    runs = children(uri, study_run).values()
    assert {child.data.tags["recipe"] for child in runs} == {"baseline", "thor", "thor_first_order"}
    assert all(child.data.tags["result"] == child.data.tags["recipe"] for child in runs)  # one row each
    # the run and each training's child run name the machine their figures came from
    machine = {
        "machine.cpu": cpu_model(),
        "machine.isa": widest_isa(),
        "machine.onednn_isa": os.environ["ONEDNN_MAX_CPU_ISA"],
        "machine.cores": str(os.cpu_count()),
        "machine.mindspore": mindspore.__version__,
    }
    for run in (study_run, *runs):
        assert {key: run.data.tags.get(key) for key in machine} == machine
        assert run.data.tags["machine.python"] == platform.python_version()
    names = {child.info.run_name: child for child in runs}
    assert set(names) == {"seed0 baseline", "seed0 thor", "seed0 thor_first_order"}  # the seed first, readable
    assert names["seed0 thor_first_order"].data.params["thor.precondition"] == "false"
    # the preconditioner changes the training: second-order steps in thor's, none in its first-order twin's
    thor, first_order = names["seed0 thor"].data.metrics, names["seed0 thor_first_order"].data.metrics
    assert thor["thor/second_order_steps"] > 0 and first_order["thor/second_order_steps"] == 0
    assert thor["train/loss"] != first_order["train/loss"]
    # each training's run says when it first reached the target (a low one: every training reaches it), as the
    # study's own table does
    table = outputs["study.runs"].set_index("result")
    for name, child in names.items():
        result = name.split()[1]
        assert child.data.metrics["target/reached"] == 1
        assert child.data.metrics["target/epochs"] == pytest.approx(table.loc[result, "epochs_to_target"], rel=1e-6)
        assert child.data.metrics["target/time_s"] == pytest.approx(table.loc[result, "time_to_target_s"], rel=1e-6)
    # the study's run holds the values it trained with, not the recipes' own (baseline.epochs 2 in these params)
    for key in ("baseline.epochs", "thor.epochs", "thor_bert.thor.epochs", "adasum.epochs"):
        assert study_run.data.params[key] == "1", key
    assert study_run.data.params["thor.eval_every_steps"] == study_run.data.params["dim_reduce.stage2.eval_every_steps"]
    assert study_run.data.params["baseline.eval_every_steps"] == "8"

    # the report over the study: its rows, histories and link are the study's runs, and no compared recipe is missing
    outputs = run_pipeline("report", {**params, "report": {"recipes": ["baseline", "thor"]}}, project)
    table = outputs["report.table"].set_index("recipe")
    assert list(table["source"]) == ["study, 1 seed"] * 2 and list(table["run_status"]) == ["FINISHED"] * 2
    assert list(table["left_out"]) == ["", ""]
    for recipe in ("baseline", "thor"):
        assert table.at[recipe, "top1"] == pytest.approx(names[f"seed0 {recipe}"].data.metrics[FINAL_TOP1])
    assert outputs["report.summary"].startswith(("thor beat baseline", "baseline beat thor", "Inconclusive: thor"))
    axes = outputs["report.top1_vs_epoch_plot"].axes[0]
    assert [line.get_label() for line in axes.get_lines()] == ["baseline", "thor", "_target"]
    compared = only_run(uri, "report").data.tags["compared_runs"].split(",")
    studied = sorted(names[f"seed0 {recipe}"].info.run_id for recipe in ("baseline", "thor"))
    assert sorted(compared) == studied
    with process_state_kept(project):  # what the closing link charts: those runs, not the report's own
        mlflow.set_tracking_uri(uri)
        assert sorted(runs_to_compare(only_run(uri, "report").info.run_id)) == studied
    assert_readable_csv_files(project / "data")

    # the study trains what `kedro run --pipelines=<recipe>` trains: on the study's seed and budget, the same
    # figures to the bit (thor_first_order is thor's pipeline with thor.precondition false)
    for recipe, section, values in (
        ("baseline", "baseline", {}),
        ("thor", "thor", {}),
        ("thor_first_order", "thor", {"precondition": False}),
    ):
        budget = {"target": {"top1": 0.01}, section: {"epochs": 1, "eval_every_steps": 8, **values}}
        alone = run_pipeline(
            section, tiny_params(tree, {**budget, "runtime": {"seed": 0}}), project, **up_to(f"{section}.train")
        )
        assert_the_study_trained_it(
            studied_outputs, recipe, alone[f"{section}.history"], alone[f"{section}.step_history"]
        )


def test_thor_bert_pipeline(workspace):
    _, project = workspace
    uri = tracking_uri(project)
    params = tiny_params(Path("unused"))
    params["thor_bert"] = {**params["thor_bert"], "target_mlm_accuracy": 0.001}
    outputs = run_pipeline("thor_bert", params, project, **up_to("thor_bert.comparison.compare"))
    train, held_out = outputs["thor_bert.corpus.train_documents"], outputs["thor_bert.corpus.held_out_documents"]
    assert not set(train["document"]) & set(held_out["document"])  # split by document, before the tokenizer
    examples = outputs["thor_bert.examples.train_examples"]
    assert examples["input_ids"].shape[1] == 32 and examples["masked_lm_ids"].shape[1] == 5
    comparison = outputs["thor_bert.comparison.comparison"].set_index("training")
    assert list(comparison.index)[:2] == ["thor", "control"]
    assert list(comparison["optimizer"][:2]) == ["THOR", "AdamWeightDecay"]  # named by optimizer
    # the token by its text and id, as the collapse warning names it
    vocabulary = pieces(tokenizer_from_json(outputs["thor_bert.tokenizer.tokenizer"]))
    token_id = int(np.bincount(examples["masked_lm_ids"][examples["masked_lm_weights"] > 0]).argmax())
    assert comparison.index[2] == f"most frequent token {vocabulary[token_id]!r} (id {token_id})"
    most_frequent = comparison["mlm_accuracy"].iloc[2]  # always the most frequent train target, on the held-out
    assert 0 < most_frequent < 1
    for training in ("thor", "control"):
        report, history = outputs[f"thor_bert.{training}.eval_report"], outputs[f"thor_bert.{training}.history"]
        assert report["examples"] == len(outputs["thor_bert.examples.held_out_examples"]["input_ids"])
        assert 0.0 <= report["mlm_accuracy"] <= 1.0 and math.isfinite(report["mlm_loss"])
        assert comparison.at[training, "mlm_accuracy"] == report["mlm_accuracy"]
        assert list(history["epoch"]) == [1, 2]
        assert {TRAIN_LOSS, TRAIN_SEQUENCES_PER_S, VAL_MLM_ACCURACY, VAL_MLM_LOSS} <= set(history.columns)
        assert VAL_TOP1 not in history  # top-1 is the image recipes'
        # the last epoch's evaluation is the evaluation node's: the same held-out examples, the same weights
        assert history[VAL_MLM_ACCURACY].iloc[-1] == pytest.approx(report["mlm_accuracy"])
    assert outputs["thor_bert.thor.history"]["thor/second_order_steps"].iloc[-1] > 0
    runs = children(uri, only_run(uri, "thor_bert"))
    assert set(runs) == {"thor", "control"}
    for training, run in runs.items():
        assert run.info.status == "FINISHED" and run.info.run_name == f"thor_bert/{training}"
        assert 0 <= run.data.metrics[FINAL_MLM_ACCURACY] <= 1 and VAL_MLM_ACCURACY in run.data.metrics
        # every training is read against the most frequent token's accuracy: collapsed or not, in its run
        assert run.data.metrics[MOST_FREQUENT_TOKEN_ACCURACY] == pytest.approx(most_frequent)
        assert run.data.metrics[COLLAPSED] == float(comparison.at[training, "collapsed"])
        # and when it first reached target_mlm_accuracy (a low one): its first epoch (no step evaluations here)
        assert (run.data.metrics["target/reached"], run.data.metrics["target/epochs"]) == (1, 1)
    assert only_run(uri, "thor_bert").data.metrics[MOST_FREQUENT_TOKEN_ACCURACY] == pytest.approx(most_frequent)
    assert runs["control"].data.params["thor_bert.control.optimizer"] == "adamweightdecay"
    for training, run in runs.items():  # its own section, its target and the shared sections its training read
        logged = set(run.data.params)
        assert any(key.startswith(f"thor_bert.{training}.") for key in logged), training
        expected = {"thor_bert.target_mlm_accuracy", "thor_bert.eval_batch_size", "thor_bert.network.hidden_size"}
        assert expected | {"runtime.seed", "distributed.worker_num"} <= logged, training


def test_migrate_pipeline(workspace, tmp_path):
    pytest.importorskip("torch", reason="the migrate extra (PyTorch) is not installed")
    from tests.support.torch_weights import random_torch_resnet, save_state_dict

    tree, project = workspace
    state_dict = save_state_dict(random_torch_resnet("resnet18", 10), tmp_path / "resnet18.pth")
    params = tiny_params(
        tree,
        {
            "migrate": {
                "state_dict": state_dict,
                "architecture": "resnet18",
                "num_classes": 10,
                "parity": {"image_size": 64, "batch_size": 2},
            }
        },
    )
    outputs = run_audited("migrate", params, project, tmp_path / "graphs")
    report = outputs["migrate.parity_report"]
    assert report["passed"] is True
    assert isinstance(outputs["migrate.parity_tensors"], pd.DataFrame) and len(outputs["migrate.parity_tensors"])
