"""Parameter validation: typos, types, ranges and cross-key rules, each named with its source."""

from __future__ import annotations

import copy

import pytest
from test_config import CONF, load_params

from pipelines.config_validation import ParameterError, base_schema, parameter_sources, validate_parameters


@pytest.fixture(scope="module")
def base() -> dict:
    return base_schema(CONF)


@pytest.mark.parametrize("env", ["local", "ascend", "gpu"])
def test_shipped_environments_are_valid(base, env):
    validate_parameters(load_params(env), base, parameter_sources(CONF, env, None))


def changed(params: dict, dotted: str, value) -> dict:
    params = copy.deepcopy(params)
    *parents, leaf = dotted.split(".")
    node = params
    for key in parents:
        node = node.setdefault(key, {})
    node[leaf] = value
    return params


@pytest.mark.parametrize(
    ("key", "value", "message"),
    [
        ("baseline.lr.lr_maxx", 0.1, "baseline.lr.lr_maxx is not a known parameter"),
        ("baseline.epochs", "ten", "baseline.epochs must be an integer, got 'ten'"),
        ("baseline.epochs", 2.5, "baseline.epochs must be an integer"),
        ("baseline.lr.lr_max", -0.1, "baseline.lr.lr_max is -0.1 but must be > 0"),
        ("baseline.batch_size", 0, "baseline.batch_size is 0 but must be > 0"),
        ("baseline.momentum", 1.5, "baseline.momentum is 1.5 but must be in [0, 1)"),
        ("baseline.lr.schedule", "cosin", "baseline.lr.schedule is 'cosin'; choose one of"),
        ("model.zero_init_last_bn_gamma", 1, "must be true or false"),
        ("model.name", None, "model.name must not be null"),
        ("runtime.device_target", "TPU", "runtime.device_target is 'TPU'"),
        ("data.split_dirs", "train", "data.split_dirs"),
        ("dim_reduce.pca.n_components", 40, "dim_reduce.pca.n_components is 40 but must be below"),
        ("dim_reduce.stage1.epochs", 9, "beyond schedule_epochs"),
        ("dim_reduce.stage2.implementation", "boost", "choose one of own, mindspore_boost"),
    ],
)
def test_bad_parameter_is_named_with_its_source(base, key, value, message):
    params = changed(load_params("local"), key, value)
    sources = parameter_sources(CONF, "local", changed({}, key, value))
    with pytest.raises(ParameterError) as error:
        validate_parameters(params, base, sources)
    assert message in str(error.value)
    assert "(--params)" in str(error.value)


def test_source_file_is_named(base, tmp_path):
    conf = tmp_path / "conf"
    for folder in ("base", "gpu"):
        (conf / folder).mkdir(parents=True)
        for path in (CONF / folder).glob("parameters*.yml"):
            (conf / folder / path.name).write_text(path.read_text())
    typo = conf / "gpu" / "parameters_extra.yml"
    typo.write_text("baseline:\n  batch_sise: 32\n")
    params = changed(load_params("gpu"), "baseline.batch_sise", 32)
    with pytest.raises(ParameterError, match=rf"baseline.batch_sise is not a known parameter.*\({typo}\)"):
        validate_parameters(params, base, parameter_sources(conf, "gpu", None))
    sources = parameter_sources(conf, "gpu", None)
    assert sources["baseline.epochs"] == str(conf / "gpu" / "parameters_baseline.yml")
    assert sources["baseline.momentum"] == str(conf / "base" / "parameters_baseline.yml")


def test_all_problems_are_reported_together(base):
    params = changed(changed(load_params("local"), "baseline.epochs", -1), "data.image_size", "big")
    with pytest.raises(ParameterError) as error:
        validate_parameters(params, base, {})
    assert "baseline.epochs" in str(error.value) and "data.image_size" in str(error.value)


def test_nullable_keys_accept_null(base):
    params = changed(
        changed(load_params("local"), "data.max_per_class.train", None), "dim_reduce.collect.n_files", None
    )
    validate_parameters(params, base, {})


def test_zero_warmup_is_allowed_but_zero_epochs_is_not(base):
    validate_parameters(changed(load_params("local"), "baseline.lr.warmup_epochs", 0), base, {})
    with pytest.raises(ParameterError, match="baseline.epochs is 0"):
        validate_parameters(changed(load_params("local"), "baseline.epochs", 0), base, {})


def test_thor_trace_rule_and_frequency(base):
    validate_parameters(changed(load_params("local"), "thor.trace_rule", [0.01, 0.001]), base, {})
    with pytest.raises(ParameterError, match="thor.trace_rule must be null or a list of two numbers"):
        validate_parameters(changed(load_params("local"), "thor.trace_rule", 0.01), base, {})
    with pytest.raises(ParameterError, match="thor.frequency is 1 but must be >= 2"):
        validate_parameters(changed(load_params("local"), "thor.frequency", 1), base, {})
