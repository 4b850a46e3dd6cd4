"""Parameter validation (trainlib.params): typos, types, choices, ranges and cross-key rules, each
named with its dotted key and the file (or --params) it came from, every problem at once."""

from __future__ import annotations

import subprocess
import sys
from typing import get_args

import click
import pytest
from pydantic import ValidationError

from pipelines.hooks.config_files import ParameterFiles, parameter_sources
from pipelines.hooks.configuration import refuse_renamed
from tests.support.config import CONF, changed, load_config
from trainlib.params import BaselineParams, ParameterError, Parameters, ThorParams, validate_parameters
from trainlib.params.renames import RENAMED_KEYS, RENAMED_VALUES


@pytest.mark.parametrize("env", ["local", "ascend", "gpu"])
def test_shipped_environments_are_valid(env):
    refuse_renamed(ParameterFiles(CONF, env), {})  # no file uses an old name
    params = validate_parameters(load_config(env), parameter_sources(CONF, env, None))
    assert isinstance(params, Parameters)


def problems(params: dict, sources: dict | None = None) -> list[str]:
    """The problem lines of the ParameterError that ``params`` must raise."""
    with pytest.raises(ParameterError) as error:
        validate_parameters(params, sources)
    first, *lines = str(error.value).splitlines()
    assert first == "invalid parameters:"
    return [line.strip() for line in lines]


@pytest.mark.parametrize(
    ("key", "value", "message"),
    [
        # typos: the closest key beside the unknown one is suggested
        ("baseline.epoch", 3, "baseline.epoch is not a known parameter; did you mean baseline.epochs?"),
        ("baseline.lr.peek", 0.1, "baseline.lr.peek is not a known parameter; did you mean baseline.lr.peak?"),
        ("baselne.epochs", 3, "baselne is not a known parameter; did you mean baseline?"),
        ("baseline.zzz", 3, "baseline.zzz is not a known parameter"),
        # types: strict, an integer is not a float's
        ("baseline.epochs", "ten", "baseline.epochs is 'ten' but must be an integer"),
        ("baseline.epochs", 2.5, "baseline.epochs is 2.5 but must be an integer"),
        ("baseline.epochs", True, "baseline.epochs is true but must be an integer"),
        ("baseline.lr.peak", "0.1", "baseline.lr.peak is '0.1' but must be a number"),
        ("baseline.zero_init_last_bn_gamma", 1, "baseline.zero_init_last_bn_gamma is 1 but must be true or false"),
        ("data.split_dirs", "train", "data.split_dirs is 'train' but must be a mapping"),
        ("thor.trace_rule", 0.01, "thor.trace_rule is 0.01 but must be a list"),
        ("thor.trace_rule", [0.01, "x"], "thor.trace_rule[1] is 'x' but must be a number"),
        ("thor.trace_rule", [0.01], "thor.trace_rule is [0.01]: list should have at least 2 items"),
        ("boost.freeze_type", True, "boost.freeze_type is true but must be an integer"),
        # choices
        ("baseline.lr.shape", "cosin", "baseline.lr.shape is 'cosin'; choose one of linear, cosine, quadratic, steps"),
        (
            "network.name",
            None,
            "network.name is null; choose one of resnet18, resnet34, resnet50, resnet101, resnet_narrow",
        ),
        ("runtime.device_target", "TPU", "runtime.device_target is 'TPU'; choose one of CPU, GPU, Ascend"),
        ("dim_reduce.stage2.implementation", "boost", "is 'boost'; choose one of trainlib, mindspore_builtin"),
        ("data.on_bad_file", "skip", "data.on_bad_file is 'skip'; choose one of exclude, fail"),
        # ranges
        ("baseline.lr.peak", -0.1, "baseline.lr.peak is -0.1 but must be > 0"),
        ("baseline.batch_size", 0, "baseline.batch_size is 0 but must be > 0"),
        ("baseline.momentum", 1.5, "baseline.momentum is 1.5 but must be < 1"),
        ("baseline.momentum", -0.1, "baseline.momentum is -0.1 but must be >= 0"),
        ("thor.frequency", 1, "thor.frequency is 1 but must be >= 2"),
        ("thor.lr.peak", 0, "thor.lr.peak is 0 but must be > 0"),
        ("thor.damping.rat", 0.5, "thor.damping.rat is not a known parameter; did you mean thor.damping.rate?"),
        ("data.eval_resize_ratio", 1.2, "data.eval_resize_ratio is 1.2 but must be <= 1"),
        ("distributed.master_port", 80, "distributed.master_port is 80 but must be >= 1024"),
        ("boost.freeze_type", 2, "boost.freeze_type is 2 but must be <= 1"),
        ("dim_reduce.pca.n_components", 0, "dim_reduce.pca.n_components is 0 but must be > 0"),
        # rules across keys name the key to change
        ("dim_reduce.pca.n_components", 40, "dim_reduce.pca.n_components is 40 but must be below"),
        ("dim_reduce.stage1.epochs", 9, "dim_reduce.stage1.epochs is 9, beyond schedule_epochs 8"),
        ("dim_reduce.stage1.trajectory.start_epoch", 7, "start_epoch is after the last stage-1 epoch (6)"),
        ("dim_reduce.stage1.trajectory.every_epochs", 1, "every_epochs is 1 while every_steps is 25: set exactly one"),
        ("dim_reduce.stage1.trajectory.every_steps", None, "every_steps and every_epochs are both null: set one"),
        ("distributed.local_worker_num", 2, "distributed.local_worker_num is 2, more than distributed.worker_num"),
        ("distributed.node_rank", 1, "distributed.node_rank is 1; with 1 workers, 1 per node, use 0..0"),
        ("thor.implementation", "mindspore_builtin", "thor.implementation is mindspore_builtin, whose kernels"),
        ("thor.damping_method", "tikhonov", "thor.damping_method is 'tikhonov'; choose one of fixed, factored"),
        ("thor.kl_clip", 0, "thor.kl_clip is 0 but must be > 0"),
        ("thor.statistics_dtype", "float16", "thor.statistics_dtype is 'float16'; choose one of float32, float64"),
        (
            "thor_bert.thor.adam_graft",
            {"beta1": 0.9, "beta2": 1.0, "eps": 1e-8},
            "adam_graft.beta2 is 1.0 but must be < 1",
        ),
        (
            "adasum.implementation",
            "mindspore_builtin",
            "adasum.implementation is mindspore_builtin (mindspore.boost's Adasum), which MindSpore runs",
        ),
    ],
)
def test_bad_parameter_is_named_with_its_source(key, value, message):
    params = changed(load_config("local"), key, value)
    lines = problems(params, parameter_sources(CONF, "local", changed({}, key, value)))
    assert len(lines) == 1, lines
    assert message in lines[0]
    assert lines[0].endswith("(--params)")


def copied_conf(tmp_path, envs=("base", "gpu")):
    """A copy of the project's parameter files of ``envs`` under ``tmp_path/conf``."""
    conf = tmp_path / "conf"
    for folder in envs:
        (conf / folder).mkdir(parents=True)
        for path in (CONF / folder).glob("parameters*.yml"):
            (conf / folder / path.name).write_text(path.read_text())
    return conf


def test_source_file_is_named(tmp_path):
    conf = copied_conf(tmp_path)
    typo = conf / "gpu" / "parameters_extra.yml"
    typo.write_text("baseline:\n  batch_sise: 32\n")
    params = changed(load_config("gpu"), "baseline.batch_sise", 32)
    sources = parameter_sources(conf, "gpu", None)
    (line,) = problems(params, sources)
    assert line == f"baseline.batch_sise is not a known parameter; did you mean baseline.batch_size? ({typo})"
    assert sources["baseline.epochs"] == str(conf / "gpu" / "parameters_baseline.yml")
    assert sources["baseline.momentum"] == str(conf / "base" / "parameters_baseline.yml")


def test_a_renamed_value_in_a_file_stops_the_run_naming_the_file_and_the_new_value(tmp_path):
    conf = copied_conf(tmp_path)
    thor = conf / "base" / "parameters_thor.yml"
    thor.write_text(thor.read_text().replace("damping_method: fixed ", "damping_method: mindspore "))
    with pytest.raises(click.ClickException) as error:
        refuse_renamed(ParameterFiles(conf, "gpu"), {})
    assert error.value.message == f"renamed parameters:\n  {thor}: thor.damping_method: 'mindspore' was renamed 'fixed'"


def test_renamed_keys_and_values_in_params_stop_the_run_naming_the_new_ones():
    given = {
        "thor_bert": {"baseline": {"epochs": 2}},
        "adasum": {"implementation": "own"},
        "thor": {"mindspore": {"amp_level": "O3"}},
        "model": {"name": "resnet18"},
    }
    with pytest.raises(click.ClickException) as error:
        refuse_renamed(ParameterFiles(CONF, "local"), given)
    assert error.value.message.splitlines() == [
        "renamed parameters:",
        "  --params: thor_bert.baseline was renamed thor_bert.control",
        "  --params: adasum.implementation: 'own' was renamed 'trainlib'",
        "  --params: thor.mindspore was renamed thor.mindspore_builtin",
        "  --params: model.name was renamed network.name",
    ]


def test_the_network_settings_in_an_old_model_section_stop_the_run_naming_the_network_section(tmp_path):
    conf = copied_conf(tmp_path)
    base = conf / "base" / "parameters.yml"
    text = base.read_text()
    model = next(line for line in text.splitlines() if line.startswith("model:"))
    # the model section before the split: the network's keys in it
    base.write_text(text.replace(f"\n{model}\n", "\n").replace("\nnetwork:", "\nmodel:", 1))
    with pytest.raises(click.ClickException) as error:
        refuse_renamed(ParameterFiles(conf, "local"), {})
    assert error.value.message.splitlines() == [
        "renamed parameters:",
        *(
            f"  {base}: model.{key} was renamed network.{key}"
            for key in ("name", "num_classes", "conv_init", "dense_init")
        ),
    ]


def test_every_renamed_key_and_value_names_one_that_exists():
    """The map old -> new points at keys and choices ``Parameters`` accepts, and none of the old ones."""
    params = load_config("local")
    for key, values in RENAMED_VALUES.items():
        *sections, name = key.split(".")
        model = Parameters
        for section in sections:
            model = model.model_fields[section].annotation
        choices = get_args(model.model_fields[name].annotation)
        assert set(values.values()) <= set(choices) and not set(values) & set(choices), key
    for old, new in RENAMED_KEYS.items():
        assert has_key(params, new) and not has_key(params, old)


def has_key(tree: dict, dotted: str) -> bool:
    for part in dotted.split("."):
        if not isinstance(tree, dict) or part not in tree:
            return False
        tree = tree[part]
    return True


def test_sources_below_the_working_directory_are_relative(monkeypatch):
    monkeypatch.chdir(CONF.parent)
    sources = parameter_sources(CONF, "gpu", {"thor": {"epochs": 3}})
    assert sources["baseline.epochs"] == "conf/gpu/parameters_baseline.yml"
    assert sources["baseline.momentum"] == "conf/base/parameters_baseline.yml"
    assert sources["thor.epochs"] == "--params"


def test_all_problems_are_reported_together():
    params = changed(changed(load_config("local"), "baseline.epochs", -1), "data.image_size", "big")
    params = changed(changed(params, "dim_reduce.stage1.epochs", 9), "thor.epoch", 3)
    lines = problems(params, {})
    assert [line.split()[0] for line in lines] == [
        "data.image_size",
        "baseline.epochs",
        "dim_reduce.stage1.epochs",
        "thor.epoch",
    ]
    assert all(line.endswith("(unknown source)") for line in lines)


def test_cross_key_rules_report_every_broken_rule():
    params = changed(load_config("local"), "dim_reduce.pca.n_components", 40)
    params = changed(params, "dim_reduce.stage1.trajectory.start_epoch", 7)
    lines = problems(params)
    assert [line.split()[0] for line in lines] == [
        "dim_reduce.pca.n_components",
        "dim_reduce.stage1.trajectory.start_epoch",
    ]


@pytest.mark.parametrize(
    ("changes", "key"),
    [
        ({"boost.less_bn": True, "runtime.mode": "pynative"}, "boost.less_bn needs runtime.mode graph"),
        ({"boost.less_bn": True, "boost.grad_centralization": "on"}, "boost.grad_centralization is on, but"),
        ({"dim_reduce.stage2.implementation": "mindspore_builtin", "distributed.worker_num": 2}, "dim_reduce.stage2"),
        (
            {"dim_reduce.stage2.implementation": "mindspore_builtin", "study.recipes": ["dim_reduce"]},
            "dim_reduce.stage2.implementation is mindspore_builtin, but study.recipes",
        ),
        ({"study.recipes": ["adasum"], "study.adasum_workers": 6}, "study.adasum_workers is 6"),
        (
            {"dim_reduce.stage2.eval_every_steps": 10, "dim_reduce.stage2.implementation": "mindspore_builtin"},
            "dim_reduce.stage2.eval_every_steps",
        ),
        (
            {"distributed.worker_num": 2, "thor.checkpoint.keep_last": 1},
            "thor.checkpoint.keep_last is 1, but the job spans 2 nodes",
        ),
        ({"thor.trace_rule": [0.001, 0.01]}, "thor.trace_rule is [0.001, 0.01]; give [skip, stop] with 0 <= stop"),
        ({"thor.compute_method": "eigen", "thor.block_size": 128}, "thor.compute_method eigen decomposes the full"),
        ({"thor.compute_method": "eigen", "thor.trace_rule": [0.01, 0.001]}, "thor.compute_method eigen has no trace"),
        (
            {"thor_bert.thor.compute_method": "eigen", "thor_bert.thor.block_size": 64},
            "thor_bert.thor.compute_method eigen decomposes the full factors; set thor_bert.thor.block_size: null",
        ),
    ],
)
def test_rules_across_sections_name_the_key_to_change(changes, key):
    params = load_config("local")
    for dotted, value in changes.items():
        params = changed(params, dotted, value)
    (line,) = problems(params, {dotted: "--params" for dotted in changes})
    assert line.startswith(key) and line.endswith("(--params)")


def test_rules_across_sections_hold_on_the_targets_they_name():
    for env, changes in (
        ("ascend", {"boost.less_bn": True, "boost.grad_centralization": "on"}),
        ("local", {"dim_reduce.stage2.implementation": "mindspore_builtin"}),
    ):
        params = load_config(env)
        for dotted, value in changes.items():
            params = changed(params, dotted, value)
        validate_parameters(params)


def test_nullable_keys_accept_null():
    params = changed(load_config("local"), "data.max_per_class.train", None)
    params = changed(changed(params, "dim_reduce.collect.n_files", None), "report.run_ids.thor", "3999108af481")
    validated = validate_parameters(params)
    assert validated.data.max_per_class.train is None
    assert validated.report.run_ids["thor"] == "3999108af481"


def test_zero_warmup_is_allowed_but_zero_epochs_is_not():
    validate_parameters(changed(load_config("local"), "baseline.lr.warmup_epochs", 0))
    assert problems(changed(load_config("local"), "baseline.epochs", 0)) == [
        "baseline.epochs is 0 but must be > 0 (unknown source)"
    ]


def test_thor_trace_rule_takes_two_numbers_or_null():
    assert validate_parameters(changed(load_config("local"), "thor.trace_rule", [0.01, 0.001])).thor.trace_rule == [
        0.01,
        0.001,
    ]
    assert validate_parameters(load_config("local")).thor.trace_rule is None


def test_models_read_as_attributes_take_ints_for_floats_and_are_frozen():
    baseline = BaselineParams.model_validate(changed(load_config("local"), "baseline.lr.peak", 1)["baseline"])
    assert baseline.lr.peak == 1.0 and isinstance(baseline.lr.peak, float)
    with pytest.raises(ValidationError, match="frozen"):
        baseline.epochs = 3
    thor = ThorParams.model_validate(load_config("local")["thor"])
    assert thor.lr.peak == 0.1 and thor.mindspore_builtin.amp_level == "O2"


def test_validation_loads_neither_mindspore_nor_mlflow():
    # a typo must be reported in the time it takes to read the YAML, not to load MindSpore (seconds)
    script = f"""
import sys
from kedro.config import OmegaConfigLoader
loader = OmegaConfigLoader({str(CONF)!r}, env="local", base_env="base", merge_strategy={{"parameters": "soft"}})
params = loader["parameters"]
params["baseline"]["epoch"] = 3
before = set(sys.modules)
from trainlib.params import ParameterError, validate_parameters
try:
    validate_parameters(params)
except ParameterError as error:
    assert "did you mean baseline.epochs?" in str(error)
loaded = sorted(name for name in set(sys.modules) - before if name.split(".")[0] in ("mindspore", "mlflow", "kedro"))
assert "trainlib.params" not in before and not loaded, loaded
"""
    result = subprocess.run([sys.executable, "-c", script], check=False, capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr


def test_an_unknown_environment_is_named_with_those_that_exist(tmp_path):
    import click

    from pipelines.hooks.config_files import require_environment

    conf = tmp_path / "conf"
    for env in ("base", "ascend", "gpu"):
        (conf / env).mkdir(parents=True)
    with pytest.raises(click.ClickException) as error:
        require_environment(conf, "cuda")
    assert "configuration environment 'cuda' does not exist" in error.value.message
    assert "holds ascend, base, gpu" in error.value.message
    for env in (None, "gpu", "local"):  # local is optional: Kedro reads it when it is there
        require_environment(conf, env)
