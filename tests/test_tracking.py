"""Run names and the configuration environment of a run: what the MLflow runs table shows."""

from __future__ import annotations

import re
from pathlib import Path

from pipelines.hooks.config_files import configuration_env
from pipelines.tracking.naming import run_description, run_name, short_key


def test_run_names_are_short_and_abbreviate_each_key_the_same_way_everywhere():
    keys = [
        "thor.lr.peak",
        "thor.epochs",
        "baseline.epochs",
        "baseline.lr.peak",
        "network.name",
        "data.root",
        "dim_reduce.stage1.trajectory.start_epoch",
        "dim_reduce.stage2.alpha",
    ]
    # a key is cut to its shortest suffix no other key ends with, whichever pipeline runs
    assert short_key("dim_reduce.stage1.trajectory.start_epoch", keys) == "start_epoch"
    assert short_key("thor.lr.peak", keys) == "thor.lr.peak"  # baseline's peak too: the whole key
    assert short_key("dim_reduce.stage2.alpha", keys) == "alpha"
    assert run_name(["dim_reduce"], None, {"dim_reduce.stage1.trajectory.start_epoch": 2}, keys, False) == (
        "dim_reduce start_epoch=2"
    )
    assert run_name(["study"], None, {"dim_reduce.stage1.trajectory.start_epoch": 2}, keys, False) == (
        "study start_epoch=2"
    )
    assert run_name(["thor"], "ascend", {"thor.epochs": 3}, keys, partial=True) == "thor ascend thor.epochs=3 (partial)"
    assert run_name(["data", "baseline"], None, {"dim_reduce.stage2.alpha": [1, 2]}, keys, False) == (
        "data+baseline alpha=[1,2]"
    )
    long = run_name(
        ["dim_reduce"], None, {"data.root": "/data/imagenet/train-subset", "network.name": "resnet50"}, keys, True
    )
    assert len(long) == 40 and long.endswith("… (partial)") and long.startswith("dim_reduce root=/data/")


def test_the_description_lists_every_override_in_full():
    text = run_description("kedro run --pipelines=thor --params=thor.epochs=3", "ascend", {"thor.epochs": 3})
    assert "`kedro run --pipelines=thor --params=thor.epochs=3`" in text and "environment: ascend" in text
    assert "- `thor.epochs` = `3`" in text


def test_configuration_env_names_where_the_configuration_came_from(tmp_path: Path):
    (tmp_path / "local").mkdir()
    assert configuration_env(tmp_path, None) == "base"  # Kedro's default run env, but nothing in it
    (tmp_path / "local" / "parameters.yml").write_text("model: {name: resnet18}\n")
    assert configuration_env(tmp_path, None) == "local"
    assert configuration_env(tmp_path, "gpu") == "gpu"


def test_the_ui_is_the_tracking_server_itself_or_mlflow_ui_over_a_local_store():
    from pipelines.tracking.links import ui_base_url

    assert ui_base_url("http://mlflow.team:8080/", "127.0.0.1", 5000) == "http://mlflow.team:8080"
    assert ui_base_url("https://mlflow.example.org", "127.0.0.1", 5000) == "https://mlflow.example.org"
    assert ui_base_url("sqlite:///mlflow.db", "0.0.0.0", "5001") == "http://0.0.0.0:5001"
    # a password in the tracking URI stays out of the link printed and shared (issue 52): the browser logs in itself
    assert ui_base_url("http://alice:s3cr%40t@mlflow.team:8080/", "127.0.0.1", 5000) == "http://mlflow.team:8080"
    assert ui_base_url("https://token@mlflow.example.org", "127.0.0.1", 5000) == "https://mlflow.example.org"


def test_a_credentials_file_other_users_can_read_is_found(tmp_path: Path):
    from pipelines.hooks.credentials import readable_by_others

    credentials = tmp_path / "credentials.yml"
    assert not readable_by_others(credentials)  # none yet
    credentials.write_text("tuning_db: {PGPASSWORD: s3cret}\n")
    for mode, readable in [(0o644, True), (0o640, True), (0o604, True), (0o600, False), (0o400, False)]:
        credentials.chmod(mode)
        assert readable_by_others(credentials) == readable, oct(mode)


def test_the_closing_links_open_shared_views_that_chart_each_run_and_list_the_headline_columns(tmp_path: Path):
    import mlflow

    from pipelines.tracking.links import closing_links
    from tests.support.runner import process_state_kept
    from tests.support.views import charted, linked_view

    with process_state_kept(tmp_path):
        uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
        mlflow.set_tracking_uri(uri)
        mlflow.set_experiment("closing-links")
        with mlflow.start_run() as study:
            with mlflow.start_run(nested=True) as seed0:  # a 1-epoch training with step evaluations
                mlflow.log_params({"baseline.epochs": 1, "baseline.lr.warmup_epochs": 0})
                mlflow.log_metric("val/top1", 0.5, step=1)
                for step in (2, 4, 6):
                    mlflow.log_metric("val/step_top1", 0.1 * step, step=step)
            with mlflow.start_run(nested=True) as seed1:  # one without: its single val/top1 is charted as a point
                mlflow.log_params({"thor.epochs": 1})
                mlflow.log_metric("val/top1", 0.4, step=1)
        chart, table = closing_links("http://mlflow.team:8080", study.info.run_id)
        experiment = study.info.experiment_id
        assert chart.startswith(f"http://mlflow.team:8080/#/experiments/{experiment}/runs?viewStateShareKey=")
        assert chart.endswith("&compareRunsMode=CHART&workflowType=machine_learning")
        assert table.startswith(f"http://mlflow.team:8080/#/experiments/{experiment}/runs?viewStateShareKey=")
        assert table.endswith("&workflowType=machine_learning")
        charts = linked_view(uri, chart)
        assert charted(charts) == ["val/step_top1", "val/top1"]  # the step evaluations' chart first
        assert all(c["type"] == "LINE" and c["displayPoints"] for c in charts["compareRunCharts"])
        ids = (seed0.info.run_id, seed1.info.run_id)
        assert charts["searchFilter"] == f"attributes.run_id IN ('{ids[0]}', '{ids[1]}')"
        assert charts["runsHiddenMode"] == "SHOW_ALL"
        # two chart tiles a row in the compared section and in MLflow's section of the runs' other metrics
        sections = [(s["name"], s["columns"]) for s in charts["compareRunSections"]]
        assert sections == [("compared runs", 2), ("val", 2)]
        columns = linked_view(uri, table)
        assert columns["selectedColumns"] == [
            "metrics.`final/top1`",
            "metrics.`final/top5`",
            "metrics.`target/epochs`",
            "metrics.`target/time_s`",
            "params.`baseline.epochs`",
            "params.`thor.epochs`",
            "tags.`seed`",
        ]
        assert (columns["orderByKey"], columns["orderByAsc"]) == ("metrics.`final/top1`", False)
        # the same view is stored once: a second run's links reuse the tag
        assert closing_links("http://mlflow.team:8080", study.info.run_id) == (chart, table)
        tags = mlflow.MlflowClient().get_experiment(experiment).tags
        assert sum(key.startswith("mlflow.sharedViewState.") for key in tags) == 2


def test_each_compared_run_is_named_once_even_when_a_child_is_named_with_its_parent(tmp_path: Path):
    import mlflow

    from pipelines.tracking.links import COMPARED_RUNS_TAG, closing_links, record_compared_runs, runs_to_compare
    from tests.support.runner import process_state_kept
    from tests.support.views import linked_view

    # a store and an experiment of its own, for this test only (MLflow's are process-wide)
    with process_state_kept(tmp_path):
        mlflow.set_tracking_uri(f"sqlite:///{tmp_path / 'mlflow.db'}")
        mlflow.set_experiment("compared-runs")
        with mlflow.start_run() as parent:
            with mlflow.start_run(nested=True) as stage2:
                mlflow.log_metric("val/top1", 0.5, step=1)
            with mlflow.start_run(nested=True) as control:
                mlflow.log_metric("val/top1", 0.4, step=1)
        with mlflow.start_run() as report:  # the report names dim_reduce's run and its control row
            record_compared_runs([parent.info.run_id, control.info.run_id])
        tag = mlflow.MlflowClient().get_run(report.info.run_id).data.tags[COMPARED_RUNS_TAG]
        assert sorted(tag.split(",")) == sorted([parent.info.run_id, stage2.info.run_id, control.info.run_id])
        assert sorted(runs_to_compare(report.info.run_id)) == sorted([stage2.info.run_id, control.info.run_id])
        # the report's runs table lists what it compared, not the experiment's other runs (a FAILED one here)
        with mlflow.start_run() as failed:
            mlflow.log_metric("val/top1", 0.9, step=1)
        mlflow.MlflowClient().set_terminated(failed.info.run_id, "FAILED")
        uri = mlflow.get_tracking_uri()
        _, table = closing_links("http://127.0.0.1:5000", report.info.run_id)
        listed = re.fullmatch(r"attributes\.run_id IN \((.*)\)", linked_view(uri, table)["searchFilter"])[1]
        assert sorted(listed.split(", ")) == sorted(f"'{run.info.run_id}'" for run in (stage2, control))
        assert "searchFilter" not in linked_view(uri, closing_links("http://127.0.0.1:5000", parent.info.run_id)[1])


def test_each_recipe_has_its_own_colour_family_and_each_seed_its_own_shade():
    from pipelines.tracking.naming import run_colour
    from trainlib.params.recipe_spec import colour_families

    compared = ("baseline", "thor", "thor_first_order", "adasum", "allreduce", "stage2", "stage1")
    colours = {(kind, seed): run_colour(kind, seed) for kind in compared for seed in range(3)}
    assert len(set(colours.values())) == len(colours)  # every run of a 3-seed study of them apart
    assert run_colour("thor", 0) == colour_families()["thor"]  # seed 0 is the family's own colour
    # a first-order baseline is drawn as one, whichever pipeline trained it
    assert run_colour("control", 1) == run_colour("baseline", 1) == run_colour("thor_bert_control", 1)
    assert run_colour("report") != run_colour("baseline")


def test_study_runs_carry_their_colour_and_metrics_are_stored_to_seven_significant_digits(tmp_path: Path):
    import mlflow

    from pipelines.tracking.naming import RUN_COLOUR_TAG, run_colour
    from pipelines.tracking.trainings import StudyRuns
    from pipelines.tracking.writer import log_epoch_rows, log_metrics
    from tests.support.runner import process_state_kept

    with process_state_kept(tmp_path):
        mlflow.set_tracking_uri(f"sqlite:///{tmp_path / 'mlflow.db'}")
        mlflow.set_experiment("colours")
        with mlflow.start_run():
            with StudyRuns().run("thor/seed1", {"recipe": "thor", "result": "thor", "seed": "1"}, {}) as run_id:
                log_metrics({"final/top1": 2 / 3})
                log_epoch_rows([{"epoch": 1, "val/top1": 1 / 3, "train/lr": 1.23456789e-6}])
        logged = mlflow.MlflowClient().get_run(run_id).data
    assert logged.tags[RUN_COLOUR_TAG] == run_colour("thor", 1)
    assert logged.metrics == {"final/top1": 0.6666667, "val/top1": 0.3333333, "train/lr": 1.234568e-6}


def _logged_target(tmp_path: Path, drive) -> dict[str, float]:
    """The target/ metrics a ``TimeToTarget`` driven by ``drive(callback)`` logs into a fresh run."""
    import mlflow

    from pipelines.tracking.writer import TimeToTarget
    from tests.support.runner import process_state_kept

    with process_state_kept(tmp_path):
        mlflow.set_tracking_uri(f"sqlite:///{tmp_path / 'mlflow.db'}")
        with mlflow.start_run() as run:
            callback = TimeToTarget(0.75)
            drive(callback)
            callback.on_train_end()
        metrics = mlflow.MlflowClient().get_run(run.info.run_id).data.metrics
    return {key: value for key, value in metrics.items() if key.startswith("target/")}


def test_time_to_target_is_read_at_the_first_step_evaluation_that_reaches_it(tmp_path: Path):
    def drive(callback):
        callback.on_train_begin(total_epochs=2, steps_per_epoch=10, start_epoch=0)
        for step, top1, seconds in ((5, 0.5, 2.0), (10, 0.76, 4.5), (15, 0.74, 6.0), (20, 0.9, 8.0)):
            callback.on_step_evaluation({"step": step, "val/step_top1": top1, "train/elapsed_s": seconds})
            if step % 10 == 0:  # the epoch's own evaluation reached it too, later in the training's time
                callback.on_epoch_end(step // 10 - 1, {"val/top1": 0.8, "train/epoch_time_s": 5.0})

    logged = _logged_target(tmp_path, drive)
    assert logged == {"target/steps": 10, "target/epochs": 1.0, "target/time_s": 4.5, "target/reached": 1}


def test_without_step_evaluations_time_to_target_is_the_end_of_the_first_epoch_reaching_it(tmp_path: Path):
    def drive(callback):
        # resumed after epoch 1 (0.6): the figure counts the epochs and seconds before the resume
        callback.on_resume(tmp_path, [{"epoch": 1, "val/top1": 0.6, "train/epoch_time_s": 3.0}])
        callback.on_train_begin(total_epochs=3, steps_per_epoch=8, start_epoch=1)
        callback.on_epoch_end(1, {"val/top1": 0.7, "train/epoch_time_s": 3.5})
        callback.on_epoch_end(2, {"val/top1": 0.75, "train/epoch_time_s": 4.0})

    logged = _logged_target(tmp_path, drive)
    assert logged == {"target/steps": 24, "target/epochs": 3, "target/time_s": 10.5, "target/reached": 1}


def test_a_training_that_never_reaches_its_target_logs_only_that(tmp_path: Path):
    def drive(callback):
        callback.on_train_begin(total_epochs=1, steps_per_epoch=8, start_epoch=0)
        callback.on_step_evaluation({"step": 4, "val/step_top1": 0.7, "train/elapsed_s": 1.0})
        callback.on_epoch_end(0, {"val/top1": 0.74, "train/epoch_time_s": 2.0})

    assert _logged_target(tmp_path, drive) == {"target/reached": 0}


def test_a_training_of_another_measure_logs_no_target_figure(tmp_path: Path):
    def drive(callback):  # a language model's rows, seen by the top-1 target of a study of both
        callback.on_train_begin(total_epochs=1, steps_per_epoch=8, start_epoch=0)
        callback.on_step_evaluation({"step": 4, "val/step_mlm_accuracy": 0.9, "train/elapsed_s": 1.0})
        callback.on_epoch_end(0, {"val/mlm_accuracy": 0.9, "train/epoch_time_s": 2.0})

    assert _logged_target(tmp_path, drive) == {}
