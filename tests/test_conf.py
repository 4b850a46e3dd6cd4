"""Configuration environments: soft merge over base, and the device check."""

from __future__ import annotations

import pytest

from pipelines.hooks.configuration import rehearsal_command
from tests.support.config import load_config
from trainlib.engine.runtime import DeviceUnavailableError, device_available, require_device


@pytest.fixture(scope="module")
def base() -> dict:
    return load_config("local")


@pytest.mark.parametrize(("env", "device"), [("ascend", "Ascend"), ("gpu", "GPU")])
def test_env_overrides_keys_and_keeps_the_rest(base, env, device):
    params = load_config(env)
    assert params["runtime"]["device_target"] == device
    # keys the environment does not name come from base, inside partially overridden sections
    assert params["runtime"]["seed"] == base["runtime"]["seed"]
    assert params["runtime"]["mode"] == base["runtime"]["mode"]
    assert params["data"]["split_dirs"] == base["data"]["split_dirs"]
    assert params["data"]["eval_resize_ratio"] == base["data"]["eval_resize_ratio"]
    assert params["baseline"]["momentum"] == base["baseline"]["momentum"]
    assert params["baseline"]["lr"]["gamma"] == base["baseline"]["lr"]["gamma"]
    assert params["baseline"]["checkpoint"]["dir"] == base["baseline"]["checkpoint"]["dir"]
    # and the recipe values replace the CPU defaults
    assert params["network"] == {**base["network"], "name": "resnet50", "num_classes": 1001}
    assert params["data"]["max_per_class"] == {"train": None, "val": None}
    assert params["data"]["image_size"] == 224
    assert params["distributed"]["worker_num"] == 8
    assert params["baseline"]["batch_size"] == 256
    assert params["baseline"]["epochs"] == 90
    assert params["baseline"]["loss_scale"] == 1024
    assert params["baseline"]["lr"]["shape"] == "linear"
    assert params["baseline"]["lr"]["peak"] == 0.8
    assert params["baseline"]["lr"]["warmup_epochs"] == 2
    assert params["baseline"]["lr"]["reference_devices"] == 8


def test_base_is_the_cpu_default(base):
    assert base["runtime"]["device_target"] == "CPU"
    assert base["data"]["source"] == "fashion_mnist"
    assert base["network"]["name"] == "resnet_narrow"


def test_the_tracking_uri_is_the_local_store_unless_mlflow_tracking_uri_names_a_server(monkeypatch):
    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    assert load_config("base", "mlflow")["server"]["mlflow_tracking_uri"] == "sqlite:///mlflow.db"
    monkeypatch.setenv("MLFLOW_TRACKING_URI", "https://mlflow.team.example")
    assert load_config("ascend", "mlflow")["server"]["mlflow_tracking_uri"] == "https://mlflow.team.example"


def test_cpu_is_always_available():
    assert device_available("CPU")
    require_device("CPU", "local")


@pytest.mark.skipif(device_available("GPU"), reason="this machine has a GPU")
def test_missing_gpu_is_named():
    with pytest.raises(DeviceUnavailableError, match=r"GPU.*'gpu'.*no NVIDIA GPU"):
        require_device("GPU", "gpu")


@pytest.mark.skipif(device_available("Ascend"), reason="this machine has an Ascend NPU")
def test_missing_ascend_is_named():
    with pytest.raises(DeviceUnavailableError, match=r"Ascend.*no Ascend NPU"):
        require_device("Ascend", "ascend")


@pytest.mark.skipif(device_available("Ascend"), reason="this machine has an Ascend NPU")
def test_the_refusal_names_the_rehearsal_to_run_instead():
    command = rehearsal_command("ascend", ["thor"])
    assert command == 'kedro run --pipelines=thor --env=ascend --params="runtime.fast_dev_run=true"'
    with pytest.raises(DeviceUnavailableError) as error:
        require_device("Ascend", "ascend", rehearsal=command)
    assert str(error.value).endswith(
        f"To rehearse this recipe on this CPU instead (every node, a few batches): {command}"
    )
    assert rehearsal_command(None) is None  # no --env: the CPU default needs no rehearsal
    assert rehearsal_command("gpu", []) == 'kedro run --env=gpu --params="runtime.fast_dev_run=true"'


def test_unknown_device_target():
    with pytest.raises(ValueError, match="TPU"):
        device_available("TPU")


def test_cpu_speed_settings_respect_the_user(monkeypatch):
    from trainlib.engine import runtime

    monkeypatch.setenv("ONEDNN_MAX_CPU_ISA", "AVX512_CORE")
    monkeypatch.delenv("GLOG_v", raising=False)
    runtime.apply_cpu_defaults()
    import os

    assert os.environ["ONEDNN_MAX_CPU_ISA"] == "AVX512_CORE"
    assert os.environ["GLOG_v"] == "3"


def test_the_machine_is_described_by_its_widest_vector_extension_and_the_onednn_limit_in_force(tmp_path, monkeypatch):
    from trainlib.engine.runtime import describe_machine

    cpuinfo = tmp_path / "cpuinfo"
    cpuinfo.write_text(
        "processor\t: 0\nmodel name\t: Intel(R) Xeon(R) CPU E5-2680 v3\nflags\t\t: fpu sse avx avx2 fma\n"
    )
    caches = tmp_path / "cache"
    for index, (level, size) in enumerate([("1", "32K"), ("1", "32K"), ("2", "256K"), ("3", "30720K")]):
        (caches / f"index{index}").mkdir(parents=True)
        (caches / f"index{index}" / "level").write_text(f"{level}\n")
        (caches / f"index{index}" / "size").write_text(f"{size}\n")
    monkeypatch.delenv("ONEDNN_MAX_CPU_ISA")
    machine = describe_machine(cpuinfo, caches)
    assert (machine["cpu"], machine["isa"], machine["onednn_isa"], machine["l2_cache"]) == (
        "Intel(R) Xeon(R) CPU E5-2680 v3",
        "avx2",
        "unset",
        "256K",
    )
    cpuinfo.write_text("model name\t: AMD EPYC\nflags\t\t: avx avx2 avx512f avx512bw\n")
    monkeypatch.setenv("ONEDNN_MAX_CPU_ISA", "AVX2")
    machine = describe_machine(cpuinfo, tmp_path / "no caches")
    assert (machine["isa"], machine["onednn_isa"], machine["l2_cache"]) == ("avx512f", "AVX2", "unknown")


@pytest.mark.parametrize("env", ["ascend", "gpu"])
def test_dim_reduce_recipe(base, env):
    recipe = load_config(env)["dim_reduce"]
    stage1 = recipe["stage1"]
    assert (stage1["epochs"], stage1["schedule_epochs"]) == (70, 90)
    assert stage1["lr"]["warmup_epochs"] == 5 and stage1["lr"]["peak"] == 0.8
    # the last 40 epoch weights: one file per epoch from epoch 31 to 70
    assert stage1["trajectory"] == {
        **base["dim_reduce"]["stage1"]["trajectory"],
        "start_epoch": 31,
        "every_steps": None,
        "every_epochs": 1,
    }
    assert stage1["epochs"] - stage1["trajectory"]["start_epoch"] + 1 == recipe["collect"]["n_files"] == 40
    assert recipe["pca"]["n_components"] == 32
    assert recipe["stage2"]["epochs"] == 2
    assert recipe["stage2"]["rho"] == base["dim_reduce"]["stage2"]["rho"]
    assert stage1["momentum"] == base["dim_reduce"]["stage1"]["momentum"]


@pytest.mark.parametrize(
    ("env", "epochs", "lr", "damping"),
    [("ascend", 45, (0.05803, 4.0839, 53), (0.03, 0.50036)), ("gpu", 40, (0.05672, 4.9687, 50), (0.02345, 0.5467))],
)
def test_thor_recipe(base, env, epochs, lr, damping):
    thor = load_config(env)["thor"]
    assert thor["epochs"] == epochs and thor["batch_size"] == 32 and thor["frequency"] == 834
    assert thor["loss_scale"] == 128 and thor["zero_init_last_bn_gamma"] is True
    assert (thor["lr"]["shape"], thor["lr"]["peak"], thor["lr"]["power"], thor["lr"]["end_epoch"]) == ("thor", *lr)
    assert (thor["damping"]["shape"], thor["damping"]["peak"], thor["damping"]["rate"]) == ("exponential", *damping)
    assert thor["damping"]["decay_epochs"] == 10
    assert thor["lr"]["halve_epoch"] == base["thor"]["lr"]["halve_epoch"] == 39
    assert thor["weight_decay"] == 0.0005 and thor["momentum"] == 0.9
