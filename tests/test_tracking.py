"""Run names and the configuration environment of a run: what the MLflow runs table shows."""

from __future__ import annotations

from pathlib import Path

from pipelines.hooks import configuration_env
from pipelines.tracking import run_name


def test_run_names_show_the_overrides_that_change_the_configuration():
    keys = ["thor.lr.lr_init", "thor.epochs", "baseline.epochs", "baseline.lr.lr_init", "model.name", "data.root"]
    assert run_name(["thor"], {"thor.lr.lr_init": 0.05}, keys, partial=False) == "thor lr_init=0.05"
    # outside the pipeline's own section a key keeps its parent, and more where that is ambiguous
    keys += ["dim_reduce.stage2.lr.lr_init", "dim_reduce.stage2.alpha"]
    overrides = {"baseline.epochs": 3, "model.name": "resnet18", "dim_reduce.stage2.lr.lr_init": 1.0}
    assert run_name(["thor"], overrides, keys, partial=True) == (
        "thor baseline.epochs=3 model.name=resnet18 stage2.lr.lr_init=1.0 (partial)"
    )
    assert run_name(["data", "baseline"], {"baseline.lr.lr_init": [1, 2]}, keys, partial=False) == (
        "data+baseline lr_init=[1, 2]"
    )


def test_configuration_env_names_where_the_configuration_came_from(tmp_path: Path):
    (tmp_path / "local").mkdir()
    assert configuration_env(tmp_path, None) == "base"  # Kedro's default run env, but nothing in it
    (tmp_path / "local" / "parameters.yml").write_text("model: {name: resnet18}\n")
    assert configuration_env(tmp_path, None) == "local"
    assert configuration_env(tmp_path, "gpu") == "gpu"


def test_the_ui_is_the_tracking_server_itself_or_mlflow_ui_over_a_local_store():
    from pipelines.tracking import ui_base_url

    assert ui_base_url("http://mlflow.team:8080/", "127.0.0.1", 5000) == "http://mlflow.team:8080"
    assert ui_base_url("https://mlflow.example.org", "127.0.0.1", 5000) == "https://mlflow.example.org"
    assert ui_base_url("sqlite:///mlflow.db", "0.0.0.0", "5001") == "http://0.0.0.0:5001"


def test_the_comparison_link_names_the_runs_the_metric_and_model_training_mode():
    import json
    from urllib.parse import parse_qs, unquote, urlsplit

    from pipelines.tracking import comparison_url

    url = comparison_url("http://mlflow.team:8080", "7", ["a1", "b2"])
    assert url.startswith("http://mlflow.team:8080/#/metric?")
    query = parse_qs(urlsplit(url.split("#", 1)[1]).query)
    assert json.loads(unquote(query["runs"][0])) == ["a1", "b2"]
    assert json.loads(query["metric"][0]) == "val/top1" and json.loads(query["plot_metric_keys"][0]) == ["val/top1"]
    assert json.loads(query["experiments"][0]) == ["7"]
    assert query["workflowType"] == ["machine_learning"]
