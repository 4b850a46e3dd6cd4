"""``kedro run`` of the real project on a tiny generated tree, in a temporary project folder."""

from __future__ import annotations

import base64
import hashlib
import json
import os
import urllib.request
from pathlib import Path

import mlflow
import numpy as np
import pandas as pd
import pytest
from hypothesis import given

from mindir_serving.classifier import MindirClassifier, prediction_columns
from tests.support.csv_files import CSV_REL
from tests.support.fuzz_images import fuzzing, mutated_images
from tests.support.projects import (
    DIM_REDUCE_PARAMS,
    EPOCHS,
    PROJECT,
    TINY_PARAMS,
    child_runs_by_training,
    kedro,
    kedro_runs,
    make_project,
    run_on_tiny_tree,
    runs,
)
from tests.support.servers import model_server, prepare_model_env
from tests.support.standalone import strict_json
from tests.support.trees import write_image_tree
from trainlib.engine.checkpoint import load_checkpoint
from trainlib.metrics import EPOCH_KEYS

# files that ended MindSpore's decoder (SIGFPE, SIGSEGV, a hang), and one it reads with a warning (warns_*)
BAD_IMAGES = Path(__file__).parents[1] / "predict" / "bad_images"


@pytest.fixture(scope="module")
def baseline_run(tmp_path_factory):
    root = tmp_path_factory.mktemp("project")
    return run_on_tiny_tree(root, "baseline", {"train": 8, "val": 3}, {"model": {"register": True}})


@pytest.fixture(scope="module")
def champion(baseline_run):
    """The baseline run's registered model, given the alias ``champion`` as docs/use-a-model.md says: its URI."""
    project, _ = baseline_run
    client, _ = runs(project)
    (version,) = client.search_model_versions("name = 'baseline'")
    client.set_registered_model_alias("baseline", "champion", version.version)
    return "models:/baseline@champion"


def test_outputs_are_written(baseline_run):
    project, _ = baseline_run
    manifest = pd.read_csv(project / "data/02_intermediate/manifest.csv")
    assert len(manifest) == 3 * (8 + 3)
    assert json.loads((project / "data/02_intermediate/class_index.json").read_text()) == {"cat": 0, "dog": 1, "fox": 2}
    report = json.loads((project / "data/08_reporting/baseline_eval.json").read_text())
    assert report["val_images"] == 9 and report["epoch"] == EPOCHS
    assert 0.0 <= report["top1"] <= report["top5"] <= 1.0
    final = load_checkpoint(project / "data/06_models/baseline/final.ckpt")
    assert final.metadata["network"] == "resnet_narrow" and final.metadata["epoch"] == EPOCHS
    assert len(final.metadata["fingerprint"]) == 16
    assert any(name.startswith("optimizer.moments.") for name in final.params)
    history = pd.read_csv(project / "data/08_reporting/baseline_history.csv")
    assert list(history["epoch"]) == list(range(1, EPOCHS + 1))
    assert list(history.columns) == [
        "epoch",
        "train/loss",
        "train/lr",
        "train/images_per_s",
        "train/epoch_time_s",
        "train/compile_s",
        "val/top1",
        "val/top5",
    ]
    # the final checkpoint carries the same rows (and each row's wall-clock time)
    carried = pd.DataFrame(json.loads(final.metadata["history"]))
    assert carried["timestamp"].is_monotonic_increasing
    pd.testing.assert_frame_equal(carried.drop(columns="timestamp"), history, check_dtype=False)
    # the periodic checkpoints (the newest kept while training) are removed once final.ckpt is saved, and no
    # temporary file is left behind
    assert list((project / "data/06_models/baseline/epochs").iterdir()) == []


def test_training_changed_the_weights(baseline_run):
    project, _ = baseline_run
    initial = load_checkpoint(project / "data/06_models/baseline/initial.ckpt").params
    final = load_checkpoint(project / "data/06_models/baseline/final.ckpt").network_params()
    assert set(initial) == set(final)
    assert any(not (initial[name] == final[name]).all() for name in initial)


def baseline_mlflow_run(project: Path):
    """The baseline's run (the tests of this set-up add a predict run beside it)."""
    client, found = runs(project)
    (run,) = [run for run in found if run.data.tags.get("pipeline") == "baseline"]
    return client, run


def test_the_run_logs_its_model_with_the_mindir_network_as_a_registered_version(baseline_run):
    project, _ = baseline_run
    client, run = baseline_mlflow_run(project)
    (version,) = client.search_model_versions("name = 'baseline'")
    assert version.run_id == run.info.run_id
    (logged,) = client.search_logged_models(experiment_ids=[run.info.experiment_id])
    assert logged.source_run_id == run.info.run_id and logged.name == "model"
    files = mlflow.artifacts.download_artifacts(artifact_uri=logged.artifact_location, dst_path=str(project / "got"))
    assert (Path(files) / "artifacts/network.mindir").read_bytes() == (
        project / "data/06_models/baseline/model/network.mindir"
    ).read_bytes()
    assert (Path(files) / "MLmodel").is_file() and (Path(files) / "input_example.json").is_file()


def test_predict_over_the_evaluations_images_gives_its_top1(baseline_run, champion):
    project, _ = baseline_run
    result = kedro(project, "run", "--pipelines=predict", f"--params=predict.model={champion}")
    assert result.returncode == 0, result.stdout[-5000:] + result.stderr[-5000:]
    predictions = pd.read_csv(project / "data/07_model_output/predictions.csv", keep_default_na=False)
    report = json.loads((project / "data/08_reporting/baseline_eval.json").read_text())
    assert len(predictions) == report["val_images"]  # the manifest's val rows, as the evaluation read them
    assert (predictions["class_1"] == predictions["class_name"]).mean() == pytest.approx(report["top1"])
    hits = predictions[[f"class_{k}" for k in range(1, 4)]].eq(predictions["class_name"], axis=0).any(axis=1)
    assert hits.mean() == pytest.approx(report["top5"])  # 3 classes: the top 5 is the top 3


def invoke(url: str, images: list[bytes], top_k: int) -> list[dict]:
    """The served model's reply to ``images``, parsed as strict JSON (no bare NaN)."""
    rows = [[base64.b64encode(image).decode()] for image in images]
    body = {"dataframe_split": {"columns": ["image"], "data": rows}, "params": {"top_k": top_k}}
    request = urllib.request.Request(
        f"{url}/invocations", json.dumps(body).encode(), {"Content-Type": "application/json"}
    )
    with urllib.request.urlopen(request, timeout=120) as response:
        return strict_json(response.read().decode())["predictions"]


def test_the_registered_model_serves_over_rest(baseline_run, champion, tmp_path):
    """The evaluation's classes for val images, a named error for a non-image; then 60 fuzzed files (Hypothesis's
    mutations of JPEG, PNG, GIF, WebP and BMP files), one request each: every reply is strict JSON with classes or a
    reason, and the server still classifies a good image after them (issue 52: one garbled JPEG ended it)."""
    project, _ = baseline_run
    manifest = pd.read_csv(project / "data/02_intermediate/manifest.csv")
    paths = list(manifest.loc[manifest["split"] == "val", "path"][:4])
    images = [Path(path).read_bytes() for path in paths]
    with model_server(champion, f"sqlite:///{project / 'mlflow.db'}", project, tmp_path / "serve.log") as url:
        answer = invoke(url, [*images, b"not an image"], top_k=2)

        @fuzzing(60)
        @given(image=mutated_images())
        def fuzzed(image):
            (reply,) = invoke(url, [image], top_k=2)
            assert (reply["class_1"] is not None) != bool(reply["error"]), reply

        fuzzed()
        kept = sorted(BAD_IMAGES.iterdir())
        replies = invoke(url, [path.read_bytes() for path in kept] + images[:1], top_k=2)
        for path, reply in zip(kept, replies, strict=False):
            if path.name.startswith("warns_"):
                assert reply["class_1"] is not None and reply["warning"].startswith("Corrupt JPEG data: "), reply
            else:
                assert reply["error"].startswith(("corrupt JPEG: ", "truncated JPEG: ")), (path.name, reply)
        assert replies[-1]["class_1"] is not None and replies[-1]["error"] == ""
    expected = MindirClassifier.from_folder(project / "data/06_models/baseline/model").predict(
        [Path(path).read_bytes() for path in paths], top_k=2
    )
    assert [row["class_1"] for row in answer[:4]] == list(expected["class_1"])
    assert [row["probability_1"] for row in answer[:4]] == pytest.approx(list(expected["probability_1"]), rel=1e-5)
    # "not an image", named, and the others still answered
    assert answer[4]["error"] == "not an image: the file starts with no JPEG, PNG or BMP signature"


# MLflow's environments built from models' requirements, kept across runs and clones in the user's cache (CI runs in a
# fresh clone on the same machine): the first build installs MindSpore, MLflow and their dependencies; a later run
# finds its environment built (one per set of pinned requirements)
MODEL_ENVS = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "resnet-recipes" / "model-envs"


def test_the_registered_model_serves_from_an_environment_built_from_its_requirements(baseline_run, champion, tmp_path):
    """``mlflow models serve --env-manager uv`` (issue 43; uv since issue 52: 5.7 s against virtualenv's 72.5 s,
    ``benchmarks/model_env.py``): MLflow builds an environment from the model's own requirements (no project package
    in it) and serves from it. The evaluation's val images get the evaluation's top-1, a cut image its named error,
    and the reply parses as strict JSON. An environment is 3.2-3.5 GB (MindSpore, MLflow and their dependencies); a
    built one is found under ``MODEL_ENVS`` at once."""
    project, _ = baseline_run
    tracking = f"sqlite:///{project / 'mlflow.db'}"
    env = {"MLFLOW_ENV_ROOT": str(MODEL_ENVS)}
    prepare_model_env(champion, tracking, project, "uv", **env)
    manifest = pd.read_csv(project / "data/02_intermediate/manifest.csv")
    val = manifest[manifest["split"] == "val"]
    images = [Path(path).read_bytes() for path in val["path"]]
    cut = images[0][: len(images[0]) // 2]
    rows = [[base64.b64encode(image).decode()] for image in [*images, cut]]
    body = {"dataframe_split": {"columns": ["image"], "data": rows}, "params": {"top_k": 3}}
    with model_server(champion, tracking, project, tmp_path / "serve.log", "uv", **env) as url:
        request = urllib.request.Request(
            f"{url}/invocations", json.dumps(body).encode(), {"Content-Type": "application/json"}
        )
        with urllib.request.urlopen(request, timeout=300) as response:
            answer = strict_json(response.read().decode())["predictions"]
    report = json.loads((project / "data/08_reporting/baseline_eval.json").read_text())
    top1 = np.mean([row["class_1"] == name for row, name in zip(answer[:-1], val["class_name"], strict=True)])
    assert top1 == pytest.approx(report["top1"])
    assert answer[-1] == {
        **dict.fromkeys(prediction_columns(3), None),
        "error": "truncated PNG: the file ends before its IEND chunk",
        "warning": "",
    }
    for packages in MODEL_ENVS.glob("mlflow-*/lib/python*/site-packages"):  # the model's code came with the model
        assert not {"pipelines", "trainlib", "mindir_serving"} & {path.name for path in packages.iterdir()}


def test_mlflow_run_holds_params_metrics_artifacts_tags(baseline_run):
    project, _ = baseline_run
    client, run = baseline_mlflow_run(project)
    assert run.info.status == "FINISHED"
    assert run.data.params["baseline.epochs"] == str(EPOCHS)
    assert run.data.params["network.name"] == "resnet_narrow"
    assert run.data.params["runtime.device_target"] == "CPU"
    for metric in ("train/loss", "train/lr", "train/epoch_time_s", "train/images_per_s", "val/top1", "val/top5"):
        history = client.get_metric_history(run.info.run_id, metric)
        assert sorted(m.step for m in history) == list(range(1, EPOCHS + 1)), metric
    assert {"final/top1", "final/top5"} <= run.data.metrics.keys()
    assert len(client.get_metric_history(run.info.run_id, "final/top1")) == 1  # not a per-epoch series
    assert not {"baseline_top1", "loss", "top1"} & run.data.metrics.keys()  # only the schema's keys
    tags = run.data.tags
    assert tags["pipeline"] == "baseline" and tags["env"] == "local" and tags["device_target"] == "CPU"
    assert tags["git_commit"]
    artifacts = {a.path for a in client.list_artifacts(run.info.run_id, "checkpoints")}
    artifacts |= {a.path for a in client.list_artifacts(run.info.run_id, "reports")}
    assert {"checkpoints/final.ckpt", "reports/baseline_eval.json", "reports/baseline_history.csv"} <= artifacts


def test_artifacts_above_the_size_limit_are_logged_as_path_size_and_hash(tmp_path):
    # tracking.artifact_max_mb 0: no file goes into MLflow; the run names each by path, size and sha256 instead
    params = {"baseline": {**TINY_PARAMS["baseline"], "epochs": 1}, "tracking": {"artifact_max_mb": 0}}
    project, _ = run_on_tiny_tree(tmp_path, "baseline", {"train": 4, "val": 2}, params)
    client, (run,) = runs(project)
    assert client.list_artifacts(run.info.run_id) == []
    for folder, path in (
        ("checkpoints", "data/06_models/baseline/final.ckpt"),
        ("reports", "data/08_reporting/baseline_history.csv"),
        ("reports", "data/08_reporting/baseline_eval.json"),
    ):
        file, key = project / path, f"artifact/{folder}/{Path(path).name}"
        assert run.data.tags[f"{key}/path"] == str(file.resolve())
        assert run.data.tags[f"{key}/bytes"] == str(file.stat().st_size)
        assert run.data.tags[f"{key}/sha256"] == hashlib.sha256(file.read_bytes()).hexdigest()


def test_progress_is_logged(baseline_run):
    _, result = baseline_run
    output = result.stdout + result.stderr
    assert "epoch 1/2 step" in output and "img/s" in output and "ETA" in output
    assert "baseline: top-1" in output


def test_adasum_on_one_worker_trains_the_momentum_recipe(tmp_path):
    adasum = {"epochs": EPOCHS, "batch_size": 4, "lr": {"peak": 0.05, "warmup_epochs": 0}, "eval_interval": 1}
    project, result = run_on_tiny_tree(tmp_path, "adasum", {"train": 8, "val": 3}, {"adasum": adasum})
    assert "Adasum of the weight deltas across 1 ranks" in result.stdout + result.stderr
    report = json.loads((project / "data/08_reporting/adasum_eval.json").read_text())
    assert report["epoch"] == EPOCHS and report["val_images"] == 9
    final = load_checkpoint(project / "data/06_models/adasum/final.ckpt")
    assert final.metadata["epoch"] == EPOCHS and any(n.startswith("optimizer.moments.") for n in final.params)
    history = pd.read_csv(project / "data/08_reporting/adasum_history.csv")
    assert list(history["epoch"]) == list(range(1, EPOCHS + 1))
    client, (run,) = runs(project)
    assert run.info.status == "FINISHED" and run.data.tags["pipeline"] == "adasum"
    for metric in ("train/loss", "val/top1"):
        assert sorted(m.step for m in client.get_metric_history(run.info.run_id, metric)) == [1, 2], metric
    assert "final/top1" in run.data.metrics
    assert "distributed/replica_max_abs_diff" not in run.data.metrics  # one rank: nothing to compare


def test_missing_device_fails_before_any_work(tmp_path):
    from trainlib.engine.runtime import device_available

    if device_available("GPU"):
        pytest.skip("this machine has a GPU")
    project = make_project(tmp_path / "project", {})
    result = kedro(project, "run", "--env=gpu", timeout=120)
    assert result.returncode != 0
    assert "Error: runtime.device_target is GPU" in result.stdout + result.stderr
    assert "Traceback" not in result.stdout + result.stderr
    assert not (project / "data").exists()


def test_registry_lists_the_pipelines():
    result = kedro(PROJECT, "registry", "list", timeout=120)
    assert result.returncode == 0, result.stderr
    listed = {line.strip("- ").strip() for line in result.stdout.splitlines()}
    assert {"data", "baseline", "dim_reduce", "thor", "adasum", "report", "migrate", "__default__"} <= listed


def test_viz_shows_nodes_and_datasets(viz_site):
    graph = json.loads((viz_site / "build" / "api" / "main").read_text())
    # a task node's name is its last part (``train``), its full name the namespaced one
    names = {n.get("full_name", n["name"]): n["type"] for n in graph["nodes"]}
    for task in (
        "data.build_manifest",
        "baseline.build_network",
        "baseline.train",
        "baseline.evaluate",
        "baseline.export_model",
    ):
        assert names[task] == "task"
    for dataset in (
        "manifest",
        "class_index",
        "baseline.initial_weights",
        "baseline.final_checkpoint",
        "baseline.eval_report",
        "baseline.model",
    ):
        assert names[dataset] == "data"
    edges = {(e["source"], e["target"]) for e in graph["edges"]}
    ids = {n.get("full_name", n["name"]): n["id"] for n in graph["nodes"]}
    assert (ids["baseline.train"], ids["baseline.final_checkpoint"]) in edges
    assert (ids["baseline.final_checkpoint"], ids["baseline.evaluate"]) in edges


@pytest.fixture(scope="module")
def dim_reduce_run(tmp_path_factory):
    return run_on_tiny_tree(
        tmp_path_factory.mktemp("dim_reduce"), "dim_reduce", {"train": 4, "val": 2}, DIM_REDUCE_PARAMS
    )


def test_dim_reduce_reports_stage1_stage2_and_control(dim_reduce_run):
    project, result = dim_reduce_run
    report = pd.read_csv(project / "data/08_reporting/dim_reduce/report.csv")
    assert list(report["model"]) == ["stage1", "stage2", "control"]
    assert list(report["epoch"]) == [2, 3, 3]
    assert report.loc[report["model"] == "control", "top1_minus_control"].item() == 0.0
    pca = np.load(project / "data/06_models/dim_reduce/pca_matrix.npy")
    assert pca.shape[0] == 4 and pca.dtype == np.float32
    np.testing.assert_allclose(pca @ pca.T, np.eye(4), atol=1e-4)
    selected = pd.read_csv(project / "data/06_models/dim_reduce/selected_trajectory.csv")
    assert len(selected) == 5
    steps = pd.read_csv(project / "data/08_reporting/dim_reduce/stage2_steps.csv")
    assert list(steps.columns) == ["epoch", "step", "loss", "step_size", "trials"]
    assert list(steps["epoch"]) == [3, 3, 3] and list(steps["step"]) == [7, 8, 9]  # 3 steps per epoch
    for training, epochs in (("stage1", [1, 2]), ("stage2", [3]), ("control", [3])):
        history = pd.read_csv(project / f"data/08_reporting/dim_reduce/{training}_history.csv")
        assert list(history["epoch"]) == epochs, training
        assert set(EPOCH_KEYS) <= set(history.columns), training
    stage2 = pd.read_csv(project / "data/08_reporting/dim_reduce/stage2_history.csv")
    assert stage2["train/lr"].item() == steps["step_size"].iloc[-1]  # the accepted step size, not a schedule's 1
    assert stage2["pbfgs/mean_trials"].item() == pytest.approx(steps["trials"].mean(), rel=CSV_REL)
    output = result.stdout + result.stderr
    assert "stage 2 - control" in output
    assert "Stage 2: 3 steps" in output


def test_dim_reduce_mlflow_run(dim_reduce_run):
    project, _ = dim_reduce_run
    client, found = runs(project)
    (run,) = kedro_runs(found)
    assert run.info.status == "FINISHED" and run.data.tags["pipeline"] == "dim_reduce"
    for metric in (
        "pca/trajectory_files",
        "pca/trajectory_length",
        "pca/explained_variance_ratio",
        "pca/first_component_ratio",
        "dim_reduce/stage2_minus_control_top1",
    ):
        assert metric in run.data.metrics, metric
    assert not any(key.startswith(("train/", "val/", "final/")) for key in run.data.metrics)
    artifacts = {a.path for a in client.list_artifacts(run.info.run_id, "pca")}
    assert {"pca/pca_matrix.npy", "pca/pca_explained_variance.csv", "pca/pca_explained_variance.png"} <= artifacts
    reports = {a.path for a in client.list_artifacts(run.info.run_id, "reports")}
    assert reports == {"reports/report.csv"}  # each training's files are artifacts of its own child run

    children = child_runs_by_training(client, run)
    assert set(children) == {"stage1", "stage2", "control"}
    for training, epochs in (("stage1", [1, 2]), ("stage2", [3]), ("control", [3])):
        child = children[training]
        assert child.info.run_name == f"dim_reduce/{training}" and child.info.status == "FINISHED"
        for key in ("train/loss", "train/lr", "train/images_per_s", "train/epoch_time_s", "val/top1", "val/top5"):
            logged = client.get_metric_history(child.info.run_id, key)
            assert sorted(m.step for m in logged) == (epochs if key.startswith("train/") else epochs[-1:]), key
        assert {"final/top1", "final/top5"} <= set(child.data.metrics), training
        artifacts = {
            a.path for folder in ("checkpoints", "reports") for a in client.list_artifacts(child.info.run_id, folder)
        }
        expected = {f"checkpoints/{training}.ckpt", f"reports/{training}_history.csv", f"reports/{training}_eval.json"}
        assert artifacts == expected | ({"reports/stage2_steps.csv"} if training == "stage2" else set()), training
    stage2 = children["stage2"].info.run_id
    assert [m.step for m in client.get_metric_history(stage2, "pbfgs/step_size")] == [7, 8, 9]
    assert len(client.get_metric_history(stage2, "pbfgs/trials")) == 3
    assert "pbfgs/accepted_fraction" in children["stage2"].data.metrics
    report = pd.read_csv(project / "data/08_reporting/dim_reduce/report.csv").set_index("model")
    assert children["stage2"].data.metrics["final/top1"] == pytest.approx(report.loc["stage2", "top1"], rel=CSV_REL)
    # stage 2's and the control's networks are their child runs' MLflow models; stage 1 exports none
    models = client.search_logged_models(experiment_ids=[run.info.experiment_id])
    assert sorted(model.source_run_id for model in models) == sorted(
        children[training].info.run_id for training in ("stage2", "control")
    )


def test_stage2_reruns_alone_with_the_builtin_dim_reduce(dim_reduce_run):
    project, _ = dim_reduce_run
    before = (project / "data/06_models/dim_reduce/stage1.ckpt").stat().st_mtime_ns
    result = kedro(
        project,
        "run",
        "--pipelines=dim_reduce",
        "--nodes=dim_reduce.stage2.train_stage2",
        "--params=dim_reduce.stage2.implementation=mindspore_builtin",
    )
    assert result.returncode == 0, result.stdout[-5000:] + result.stderr[-5000:]
    assert (project / "data/06_models/dim_reduce/stage1.ckpt").stat().st_mtime_ns == before
    steps = pd.read_csv(project / "data/08_reporting/dim_reduce/stage2_steps.csv")
    assert list(steps.columns) == ["epoch", "step", "loss"] and list(steps["step"]) == [7, 8, 9]
    history = pd.read_csv(project / "data/08_reporting/dim_reduce/stage2_history.csv")
    assert list(history["epoch"]) == [3] and history["train/loss"].item() == pytest.approx(
        steps["loss"].mean(), rel=CSV_REL
    )
    final = load_checkpoint(project / "data/06_models/dim_reduce/stage2.ckpt")
    assert final.metadata["epoch"] == 3 and not any(k.startswith("optimizer.") for k in final.network_params())
    assert "optimizer.boost.bk" in final.params  # boost's DimReduce state, for resuming
    stage1 = load_checkpoint(project / "data/06_models/dim_reduce/stage1.ckpt")
    assert set(final.network_params()) == set(stage1.network_params())
    assert not list((project / "data/06_models/dim_reduce").glob("*rank*"))
    client, found = runs(project)
    newest = kedro_runs(found)[0]
    assert newest.info.status == "FINISHED"
    child = child_runs_by_training(client, newest)["stage2"]  # logged from boost's own process
    assert child.info.status == "FINISHED"
    assert [m.step for m in client.get_metric_history(child.info.run_id, "train/loss")] == [3]


def test_bad_parameter_fails_before_any_work(tmp_path):
    project = make_project(tmp_path / "project", {"baseline": {"lr": {"peak": -1.0}}})
    result = kedro(project, "run", "--pipelines=baseline", "--params=baseline.epochz=3", timeout=120)
    output = result.stdout + result.stderr
    assert result.returncode != 0
    assert "baseline.epochz is not a known parameter; did you mean baseline.epochs? (--params)" in output
    assert f"baseline.lr.peak is -1.0 but must be > 0 ({Path('conf') / 'local' / 'parameters.yml'})" in output
    assert "Traceback" not in output
    assert not (project / "data").exists()
    assert runs(project)[1] == []  # no MLflow run was started


def test_thor_pipeline_trains_and_reports(tmp_path):
    thor = {"thor": {"epochs": 2, "batch_size": 4, "frequency": 4, "trace_rule": [0.01, 0.001]}}
    project, _ = run_on_tiny_tree(tmp_path, "thor", {"train": 8, "val": 3}, thor)
    report = json.loads((project / "data/08_reporting/thor_eval.json").read_text())
    assert report["epoch"] == 2 and report["val_images"] == 9
    final = load_checkpoint(project / "data/06_models/thor/final.ckpt")
    assert not any(name.startswith("thor_stats.") for name in final.network_params())
    history = pd.read_csv(project / "data/08_reporting/thor_history.csv")
    assert list(history["thor/second_order_steps"]) == [2, 3]  # 6 steps per epoch, every 4th is second order
    client, found = runs(project)
    run = found[0]
    assert run.info.status == "FINISHED" and run.data.tags["pipeline"] == "thor"
    for metric in ("train/loss", "train/lr", "thor/damping", "thor/second_order_step_s", "thor/reuse_step_s"):
        assert len(client.get_metric_history(run.info.run_id, metric)) == 2, metric
    assert {"val/top1", "final/top1", "final/top5"} <= set(run.data.metrics)


def test_mindspore_thor_is_refused_on_cpu(tmp_path):
    tree = write_image_tree(tmp_path / "tree", classes=("cat", "dog"), per_class={"train": 4, "val": 2})
    params = {"data": {**TINY_PARAMS["data"], "root": str(tree)}, "thor": {"implementation": "mindspore_builtin"}}
    project = make_project(tmp_path / "project", params)
    result = kedro(project, "run", "--pipelines=thor", timeout=120)
    assert result.returncode != 0
    assert "thor.implementation is mindspore_builtin, whose kernels (ThorIm2Col, CholeskyTrsm, UpdateThorGradient)" in (
        result.stdout + result.stderr
    )
    assert not (project / "data").exists()  # refused before any work
