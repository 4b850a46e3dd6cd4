"""The ``report`` pipeline and its library: recipes compared from real MLflow runs.

Every recipe logs one metric schema (``train/loss``, ``train/lr``, ``train/images_per_s``,
``train/epoch_time_s``, ``val/top1``, ``val/top5`` per epoch; ``final/top1``, ``final/top5``);
dim_reduce's stage1, stage2 and control log it into child runs of the ``kedro run``. The expected
figures below are computed here from what MLflow holds, independently of the library.
"""

from __future__ import annotations

import logging
import math

import mlflow
import pandas as pd
import pytest

from pipelines.hooks.config_files import parameter_sources
from pipelines.tracking.reader import MlflowRunReader
from tests.support.config import CONF, changed, load_config
from tests.support.stores import EXPERIMENT
from trainlib.metrics import EPOCH_KEYS
from trainlib.params import ParameterError, validate_parameters
from trainlib.report.compare import compare, data_and_network, setting_differences, table_row
from trainlib.report.figures import figures
from trainlib.report.histories import epoch_rows, recipe_history, time_to_target
from trainlib.report.runs import NoRunsError, report_recipes

TARGET = 0.5


def reader(uri: str) -> MlflowRunReader:
    return MlflowRunReader(uri, EXPERIMENT)


def metric_frame(metrics: dict[str, dict[int, float]], timestamp: int = 0) -> pd.DataFrame:
    """A run's metrics as ``RunReader.metric_history`` returns them: key -> {step: value}, logged in this order."""
    rows = [
        (key, step, value, timestamp + index)
        for index, (key, step, value) in enumerate(
            (key, step, value) for key, steps in metrics.items() for step, value in steps.items()
        )
    ]
    return pd.DataFrame(rows, columns=["key", "step", "value", "timestamp"])


# -- the pure parts, on hand-built data -----------------------------------------------------------


def test_epoch_rows_keep_each_epochs_latest_value():
    metrics = metric_frame(
        {
            "train/loss": {1: 1.0, 2: 0.9},
            "val/top1": {2: 0.5},
            "final/top1": {0: 0.6},  # not an epoch
            "thor/damping": {1: 0.03},  # another prefix: not part of the history
        }
    )
    # a resumed training relogs epoch 2 later with the value it ended with
    metrics = pd.concat([metrics, metric_frame({"train/loss": {2: 0.8}}, timestamp=100)], ignore_index=True)
    rows = epoch_rows(metrics)
    assert list(rows.columns) == ["epoch", *EPOCH_KEYS]
    assert list(rows["epoch"]) == [1, 2]
    assert list(rows["train/loss"]) == [1.0, 0.8]
    assert rows["val/top1"].tolist() == pytest.approx([math.nan, 0.5], nan_ok=True)
    assert rows["train/lr"].isna().all()


def dim_reduce_metrics(stage2_first_epoch: int) -> dict[str, pd.DataFrame]:
    """stage1 (epochs 1-2), stage2 and control (one epoch each) as their child runs log them."""
    stage2_epoch, control_epoch = stage2_first_epoch, stage2_first_epoch
    return {
        "stage1": metric_frame(
            {
                "train/loss": {1: 1.0, 2: 0.8},
                "val/top1": {2: 0.6},
                "val/top5": {2: 0.9},
                "train/epoch_time_s": {1: 10.0, 2: 20.0},
                "train/images_per_s": {1: 100.0, 2: 50.0},
                "final/top1": {0: 0.61},
                "final/top5": {0: 0.91},
            }
        ),
        "stage2": metric_frame(
            {
                "train/loss": {stage2_epoch: 0.7},
                "train/epoch_time_s": {stage2_epoch: 30.0},
                "train/images_per_s": {stage2_epoch: 40.0},
                "final/top1": {0: 0.9},  # stage 2 has no per-epoch evaluation: its last epoch takes this
                "final/top5": {0: 1.0},
            }
        ),
        "control": metric_frame(
            {
                "train/loss": {control_epoch: 0.75},
                "val/top1": {control_epoch: 0.7},
                "train/epoch_time_s": {control_epoch: 25.0},
                "train/images_per_s": {control_epoch: 48.0},
                "final/top1": {0: 0.7},
                "final/top5": {0: 0.95},
            }
        ),
    }


@pytest.mark.parametrize("stage2_first_epoch", [1, 3], ids=["stage2-counts-from-1", "stage2-continues"])
def test_dim_reduce_history_chains_stage2_after_stage1_and_branches_the_control(stage2_first_epoch):
    history = recipe_history(report_recipes()["dim_reduce"], "parent", dim_reduce_metrics(stage2_first_epoch))
    assert list(history["training"]) == ["stage1", "stage1", "stage2", "control"]
    assert list(history["epoch"]) == [1, 2, 3, 3]
    assert set(history["recipe"]) == {"dim_reduce"} and set(history["run_id"]) == {"parent"}
    # stage 1's per-epoch top-1, then stage 2's final evaluation at its last epoch; the control its own
    assert history["val/top1"].tolist() == pytest.approx([math.nan, 0.6, 0.9, 0.7], nan_ok=True)
    # training time runs on from stage 1's end for stage 2 and, separately, for the control
    assert list(history["train_time_s"]) == [10.0, 30.0, 60.0, 55.0]


def test_time_to_target_is_the_first_epoch_reaching_it():
    history = pd.DataFrame({"epoch": [1, 2, 3], "val/top1": [0.5, math.nan, 0.8], "train_time_s": [10.0, 25.0, 45.0]})
    assert time_to_target(history, 0.5) == (1.0, 10.0)
    assert time_to_target(history, 0.7) == (3.0, 45.0)
    assert all(math.isnan(v) for v in time_to_target(history, 0.9))


def run_record(params: dict[str, str], env: str = "local", **tags: str) -> dict:
    return {
        "run_id": "abc",
        "run_name": "r",
        "status": "FINISHED",
        "start_time_ms": 1_000,
        "end_time_ms": 91_000,
        "tags": {"env": env, **tags},
        "params": params,
        "metric_keys": ["train/loss", "final/top1"],
    }


def test_table_row_takes_settings_from_params_and_time_from_the_curve():
    # model.name: a run logged before the network section (params.renames), read as network.name
    params = {"model.name": "resnet18", "data.image_size": "16", "runtime.seed": "7", "data.num_workers": "1"}
    history = recipe_history(report_recipes()["dim_reduce"], "abc", dim_reduce_metrics(1))
    curve = history[history["training"] != "control"]
    row = table_row(report_recipes()["dim_reduce"], run_record(params), curve, {"top1": 0.9, "top5": 1.0}, 0.85, False)
    assert (row["network"], row["image_size"], row["seed"]) == ("resnet18", 16, 7)
    assert row["epoch_images"] == 1000 and row["train_images"] is None  # 100 images/s for 10 s; no split tag
    assert (row["epochs"], row["train_time_s"], row["wall_time_s"]) == (3, 60.0, 90.0)
    assert row["images_per_s"] == pytest.approx((100 * 10 + 50 * 20 + 40 * 30) / 60)
    assert (row["epoch_to_target"], row["time_to_target_s"]) == (3.0, 60.0)  # stage 2's final evaluation


def test_settings_that_differ_between_runs_are_named_per_run():
    same = {"data.image_size": "32", "data.max_per_class.train": "1500", "network.name": "resnet_narrow"}
    settings = {
        "baseline": data_and_network(run_record({**same, "data.num_workers": "2", "runtime.seed": "1"})),
        "thor": data_and_network(run_record({**same, "data.num_workers": "1", "runtime.seed": "2"})),
    }
    # worker count and seed change neither the data nor the network
    assert setting_differences(settings) == {"baseline": "", "thor": ""}
    settings["adasum"] = data_and_network(run_record({**same, "data.image_size": "16"}, env="gpu"))
    settings["dim_reduce"] = data_and_network(run_record({k: v for k, v in same.items() if k != "network.name"}))
    assert setting_differences(settings) == {
        "baseline": "data.image_size=32; env=local; network.name=resnet_narrow",
        "thor": "data.image_size=32; env=local; network.name=resnet_narrow",
        "adasum": "data.image_size=16; env=gpu; network.name=resnet_narrow",
        "dim_reduce": "data.image_size=32; env=local; network.name=?",
    }


def hand_built_histories() -> pd.DataFrame:
    baseline = metric_frame(
        {
            "train/loss": {1: 1.2, 2: 0.9, 3: 0.7},
            "val/top1": {1: 0.4, 2: 0.6, 3: 0.8},
            "train/epoch_time_s": {1: 12.0, 2: 12.0, 3: 12.0},
            "train/images_per_s": {1: 90.0, 2: 90.0, 3: 90.0},
        }
    )
    return pd.concat(
        [
            recipe_history(report_recipes()["baseline"], "b", {"baseline": baseline}),
            recipe_history(report_recipes()["dim_reduce"], "d", dim_reduce_metrics(1)),
        ],
        ignore_index=True,
    )


def test_curves_mark_the_stage_boundary_and_count_whole_epochs():
    histories = hand_built_histories()
    drawn = figures(histories, pd.DataFrame(columns=["component", "explained_variance_ratio"]), 0.85)
    assert "explained_variance" not in drawn  # no dim_reduce PCA: no empty figure
    for name, boundary in (("top1_vs_epoch", 2.0), ("top1_vs_time", 30.0), ("loss", 2.0)):
        axes = drawn[name].axes[0]
        lines = {line.get_label(): line for line in axes.get_lines()}
        # dim_reduce's stage 1 -> stage 2 boundary: a vertical line at the end of stage 1
        assert list(lines["_dim_reduce boundary"].get_xdata()) == [boundary, boundary], name
        assert [t.get_text() for t in axes.texts if "→" in t.get_text()] == ["dim_reduce: stage1 → stage2"], name
        # the control branches off at stage 1's end, dashed
        control = lines["dim_reduce control"]
        assert control.get_linestyle() == "--" and control.get_xdata()[0] == boundary, name
        assert [t.get_text() for t in axes.get_legend().get_texts()] == ["baseline", "dim_reduce", "dim_reduce control"]
    for name in ("top1_vs_epoch", "loss"):
        ticks = [tick for tick in drawn[name].axes[0].get_xticks() if 1 <= tick <= 3]
        assert ticks and all(float(tick).is_integer() for tick in ticks), (name, ticks)
    epoch_axes = drawn["top1_vs_epoch"].axes[0]
    dim_reduce = {line.get_label(): line for line in epoch_axes.get_lines()}["dim_reduce"]
    assert list(dim_reduce.get_xdata()) == [2, 3]  # epochs with a top-1: stage 1's second, stage 2's
    assert list(dim_reduce.get_ydata()) == pytest.approx([60.0, 90.0])  # percent


# -- a real MLflow store, logged by hand with known numbers ------------------------------------------


def log_run(client, experiment: str, tags: dict, params: dict, metrics: dict[str, dict[int, float]]) -> str:
    run_id = client.create_run(experiment, tags=tags, run_name=tags.get("training")).info.run_id
    for key, value in params.items():
        client.log_param(run_id, key, value)
    for name, steps in metrics.items():
        for step, value in steps.items():
            client.log_metric(run_id, name, value, step=step)
    return run_id


def hand_logged_store(tmp_path) -> tuple[str, dict[str, str]]:
    """A dim_reduce run with its three child runs as the pipeline logs them, a newer partial
    dim_reduce rerun (stage 2 only), and a baseline run on smaller images. Returns the URI and ids."""
    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    client = mlflow.MlflowClient(uri)
    experiment = client.create_experiment(EXPERIMENT, artifact_location=(tmp_path / "mlruns").as_uri())
    params = {"data.image_size": "32", "model.name": "resnet_narrow", "runtime.seed": "42"}
    ids = {}
    ids["dim_reduce"] = log_run(client, experiment, {"pipeline": "dim_reduce", "env": "local"}, params, {})
    for training, frame in dim_reduce_metrics(1).items():
        metrics: dict[str, dict[int, float]] = {}
        for row in frame.itertuples():
            metrics.setdefault(row.key, {})[row.step] = row.value
        tags = {"mlflow.parentRunId": ids["dim_reduce"], "training": training}
        client.set_terminated(log_run(client, experiment, tags, {}, metrics))
    variance = pd.DataFrame(
        {
            "component": [1, 2],
            "explained_variance": [3.0, 1.0],
            "explained_variance_ratio": [0.6, 0.2],
            "cumulative_ratio": [0.6, 0.8],
        }
    )
    variance.to_csv(tmp_path / "pca_explained_variance.csv", index=False)
    client.log_artifact(ids["dim_reduce"], str(tmp_path / "pca_explained_variance.csv"), "pca")
    client.set_terminated(ids["dim_reduce"])
    # `kedro run --pipelines=dim_reduce --nodes=dim_reduce.stage2.train_stage2,...`: FINISHED, but stage 1 is not in it
    ids["partial"] = log_run(client, experiment, {"pipeline": "dim_reduce"}, params, {})
    tags = {"mlflow.parentRunId": ids["partial"], "training": "stage2"}
    client.set_terminated(log_run(client, experiment, tags, {}, {"train/loss": {1: 0.5}, "final/top1": {0: 0.95}}))
    client.set_terminated(ids["partial"])
    metrics = {"train/loss": {1: 1.0}, "val/top1": {1: 0.5}, "train/epoch_time_s": {1: 5.0}, "final/top1": {0: 0.5}}
    baseline_params = {**params, "data.image_size": "16"}
    ids["baseline"] = log_run(client, experiment, {"pipeline": "baseline", "env": "local"}, baseline_params, metrics)
    client.set_terminated(ids["baseline"])
    return uri, ids


def test_dim_reduce_is_read_from_its_child_runs(tmp_path, caplog):
    uri, ids = hand_logged_store(tmp_path)
    with caplog.at_level(logging.INFO, logger="trainlib.report"):
        comparison = compare(reader(uri), ["dim_reduce", "baseline", "thor"], 0.85)
    history = comparison.histories[comparison.histories["recipe"] == "dim_reduce"]
    assert list(history["training"]) == ["stage1", "stage1", "stage2", "control"]
    assert list(history["epoch"]) == [1, 2, 3, 3]
    assert history["val/top1"].tolist() == pytest.approx([math.nan, 0.6, 0.9, 0.7], nan_ok=True)
    assert list(history["train_time_s"]) == [10.0, 30.0, 60.0, 55.0]
    table = comparison.table.set_index("recipe")
    row = table.loc["dim_reduce"]
    assert row["run_id"] == ids["dim_reduce"]  # the complete run, not the newer partial one
    assert (row["top1"], row["top5"], row["epochs"], row["train_time_s"]) == (0.9, 1.0, 3, 60.0)
    assert row["images_per_s"] == pytest.approx((100 * 10 + 50 * 20 + 40 * 30) / 60)
    assert (row["epoch_to_target"], row["time_to_target_s"]) == (3, 60.0)
    assert (row["network"], row["image_size"], row["seed"], row["epoch_images"]) == ("resnet_narrow", 32, 42, 1000)
    assert table.loc["thor", "run_status"] == "missing"
    assert f"skipping dim_reduce run {ids['partial']}, which lacks ['stage1: train/loss']" in caplog.text
    # the baseline trained on 16 px images: the table and the log say so
    assert table.loc["dim_reduce", "differs"] == "data.image_size=32"
    assert table.loc["baseline", "differs"] == "data.image_size=16"
    warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING and "differ" in r.getMessage()]
    assert warnings == [
        "Report: the compared runs differ in data or network, so their figures are not like for like: "
        "dim_reduce: data.image_size=32 | baseline: data.image_size=16"
    ]
    assert comparison.explained_variance["cumulative_ratio"].tolist() == [0.6, 0.8]
    axes = figures(comparison.histories, comparison.explained_variance, 0.85)["explained_variance"].axes[0]
    assert len(axes.patches) == 2 and list(axes.get_lines()[0].get_ydata()) == [0.6, 0.8]
    assert axes.get_xlabel() == "principal component" and axes.get_ylabel() == "explained variance ratio"


def test_pinned_dim_reduce_run_must_be_complete(tmp_path):
    uri, ids = hand_logged_store(tmp_path)
    pinned = compare(reader(uri), ["dim_reduce"], 0.85, {"dim_reduce": ids["dim_reduce"]})
    rows = pinned.table.set_index("recipe")["run_id"]
    assert list(rows.index) == ["dim_reduce", "dim_reduce/control"]  # the control beside stage 2, from the pinned run
    assert rows["dim_reduce"] == ids["dim_reduce"] and rows["dim_reduce/control"] not in ids.values()
    with pytest.raises(
        ValueError, match=r"report.run_ids.dim_reduce: run \w+ lacks the metrics \['stage1: train/loss'\]"
    ):
        compare(reader(uri), ["dim_reduce"], 0.85, {"dim_reduce": ids["partial"]})


def test_no_runs_at_all_is_an_error(tmp_path):
    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    with pytest.raises(NoRunsError, match="no MLflow experiment 'resnet-recipes'"):
        compare(reader(uri), ["baseline"], TARGET)
    client = mlflow.MlflowClient(uri)
    experiment = client.create_experiment(EXPERIMENT, artifact_location=(tmp_path / "mlruns").as_uri())
    client.set_terminated(client.create_run(experiment, tags={"pipeline": "data"}).info.run_id)
    with pytest.raises(NoRunsError, match=r"no finished run of any recipe \(baseline, thor\)"):
        compare(reader(uri), ["baseline", "thor"], TARGET)
    with pytest.raises(ValueError, match="report.recipes names unknown recipes \\['resnet'\\]"):
        compare(reader(uri), ["resnet"], TARGET)


@pytest.mark.parametrize(
    ("key", "value", "message"),
    [
        ("target.top1", 84, "target.top1 is 84 but must be <= 1"),
        ("target.top1", 0, "target.top1 is 0 but must be > 0"),
        ("report.target_top1", 0.84, "report.target_top1 is not a known parameter"),  # one target: target.top1
        ("report.recipes", ["baseline", "resnet"], "report.recipes names recipes the report cannot compare ['resnet']"),
        ("report.recipes", [], "report.recipes is []: list should have at least 1 item"),
        ("report.run_ids.thor", 3, "report.run_ids.thor is 3 but must be a string"),
        ("report.run_ids.sgdr", "abc", "report.run_ids names recipes the report cannot compare ['sgdr']"),
    ],
)
def test_bad_report_parameters_are_named(key, value, message):
    params = load_config("local")
    with pytest.raises(ParameterError) as error:
        validate_parameters(changed(params, key, value), parameter_sources(CONF, "local", None))
    assert message in str(error.value)


def test_pinned_run_id_is_a_valid_parameter():
    params = validate_parameters(changed(load_config("local"), "report.run_ids.thor", "3999108af481"))
    assert params.report.run_ids["thor"] == "3999108af481"


# -- a real MLflow store filled by tiny `kedro run`s of the recipes (tests/report_store.py) -------------


def test_every_recipe_name_has_a_recipe():
    """The report's recipes are the specifications' with a report entry, as they were when a hand-kept list held
    them, and they are the names report.recipes accepts."""
    recipes = report_recipes()
    assert sorted(recipes) == ["adasum", "baseline", "dim_reduce", "lars", "thor"]  # lars: issue 51's added one
    assert recipes["baseline"].pipelines == ("baseline", "__default__")
    assert (recipes["dim_reduce"].trainings, recipes["dim_reduce"].side_trainings) == (
        ("stage1", "stage2"),
        ("control",),
    )
    validate_parameters(changed(load_config("local"), "report.recipes", sorted(recipes)))


def test_the_logs_line_of_a_row_says_what_an_epoch_saw_and_prints_no_nan():
    """dim_reduce's control has no times of its own: its line leaves them out instead of ``nan s training``; a row
    with its split's size says the epoch's images are the full batches of it."""
    from pipelines.report.nodes import recipe_line

    columns = {"recipe": "baseline", "source": "study, 3 seeds", "top1": 0.8, "top5": 0.99, "epochs": 2}
    row = {**columns, "train_time_s": 50.0, "images_per_s": 117.76, "train_images": 3000, "epoch_images": 2944}
    row |= {"target_top1": 0.75, "time_to_target_s": math.nan, "left_out": ""}
    table = pd.DataFrame([row, {**columns, "recipe": "dim_reduce/control", "source": "single run"}])
    table = table.astype({"train_images": "Int64", "epoch_images": "Int64"})
    studied, control = (recipe_line(each) for each in table.itertuples())
    assert studied == (
        "baseline (study, 3 seeds): top-1 80.00%, top-5 99.00%, 2 epochs, 50 s training, 118 img/s, an epoch trains "
        "on 2944 of the 3000 train images (full batches), target 75% not reached"
    )
    assert control == "dim_reduce/control (single run): top-1 80.00%, top-5 99.00%, 2 epochs"
