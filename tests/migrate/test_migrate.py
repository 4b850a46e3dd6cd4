"""PyTorch -> MindSpore migration: torchvision's layout, the converter, both parity checks, ``kedro run``."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from tests.support.torch_weights import IMAGE_SIZE, PARITY, random_torch_resnet, save_state_dict
from trainlib.migrate.convert import (
    MigrationError,
    ParityInput,
    check_parity,
    convert,
    forward_parity,
    load_state_dict,
    require_parity,
)
from trainlib.migrate.torch_resnet import TorchResNet


@pytest.fixture(scope="module")
def pynative():
    """PyNative mode for this module (no graph compilation of each network), graph mode again afterwards."""
    from trainlib.engine.runtime import configure_mindspore

    configure_mindspore("CPU", "pynative", 0)
    yield
    configure_mindspore("CPU", "graph", 0)


@pytest.fixture(scope="module")
def resnet18(tmp_path_factory):
    """A random resnet18 with 10 classes: its state_dict file and arrays."""
    path = save_state_dict(random_torch_resnet("resnet18", 10), tmp_path_factory.mktemp("torch") / "resnet18.pth")
    return path, load_state_dict(path)


def test_torch_resnet_has_torchvision_keys_shapes_and_sizes():
    # torchvision's state_dicts: 122 entries and 11,689,512 parameters (resnet18), 320 and 25,557,032 (resnet50)
    for name, entries, n_params in (("resnet18", 122, 11_689_512), ("resnet50", 320, 25_557_032)):
        model = TorchResNet(name)
        assert len(model.state_dict()) == entries, name
        assert sum(p.numel() for p in model.parameters()) == n_params, name
    shapes = {k: tuple(v.shape) for k, v in model.state_dict().items()}
    assert shapes["conv1.weight"] == (64, 3, 7, 7)
    assert shapes["layer1.0.conv1.weight"] == (64, 64, 1, 1)
    assert shapes["layer2.0.downsample.0.weight"] == (512, 256, 1, 1)
    assert shapes["layer4.2.bn3.running_var"] == (2048,)
    assert shapes["fc.weight"] == (1000, 2048)
    # v1.5: the stride of a downsampling bottleneck is on its 3x3 convolution
    assert model.layer2[0].conv1.stride == (1, 1) and model.layer2[0].conv2.stride == (2, 2)


@pytest.mark.parametrize("name", ["resnet18", "resnet34", "resnet50", "resnet101"])
def test_every_torchvision_tensor_lands_on_a_mindspore_parameter(name):
    state_dict = {k: v.numpy() for k, v in TorchResNet(name, 7).state_dict().items()}
    checkpoint = convert(state_dict, name, 7)
    kept = {k: v for k, v in state_dict.items() if not k.endswith("num_batches_tracked")}
    assert len(checkpoint.params) == len(kept)
    # each value is used once, at its own shape (conv and dense layouts are the same in both frameworks)
    assert sorted(v.size for v in checkpoint.params.values()) == sorted(v.size for v in kept.values())
    assert checkpoint.metadata["network"] == name


def test_names_and_batchnorm_statistics_are_mapped(resnet18):
    _, state_dict = resnet18
    params = convert(state_dict, "resnet18", 10).params
    pairs = {
        "stem.0.weight": "conv1.weight",
        "stem.1.gamma": "bn1.weight",
        "stem.1.beta": "bn1.bias",
        "layers.2.conv1.weight": "layer2.0.conv1.weight",
        "layers.3.bn2.moving_mean": "layer2.1.bn2.running_mean",
        "layers.2.down_sample.0.weight": "layer2.0.downsample.0.weight",
        "layers.2.down_sample.1.moving_variance": "layer2.0.downsample.1.running_var",
        "layers.7.bn2.moving_variance": "layer4.1.bn2.running_var",
        "fc.weight": "fc.weight",
        "fc.bias": "fc.bias",
    }
    for ours, theirs in pairs.items():
        np.testing.assert_array_equal(params[ours], state_dict[theirs], err_msg=ours)
    assert not any("num_batches_tracked" in name for name in params)


def test_resnet18_forward_parity(resnet18, pynative):
    _, state_dict = resnet18
    result = forward_parity(
        state_dict, convert(state_dict, "resnet18", 10), "resnet18", 10, ParityInput(IMAGE_SIZE, 4, 0)
    )
    assert result["max_abs_diff"] <= 1e-4, result
    assert 0.5 < result["max_abs_logit"] < 50, result  # a scale at which an absolute bound of 1e-4 means something


def test_resnet18_forward_and_single_step_parity(resnet18, pynative):
    _, state_dict = resnet18
    checkpoint = convert(state_dict, "resnet18", 10)
    report, table = check_parity(state_dict, checkpoint, "resnet18", 10, PARITY)
    forward, step = report["forward"], report["single_step"]
    assert forward["max_abs_diff"] <= 1e-4, forward
    # PyTorch float32 parity itself, not the ill-conditioning fallback
    assert step["criterion"] == "pytorch_float32", step
    assert step["weight_max_abs_diff"] <= 1e-4 and step["update_max_rel_diff"] <= 1e-3, step
    assert abs(step["loss_mindspore"] - step["loss_torch"]) < 1e-4
    assert report["passed"]
    # every parameter and moving statistic was compared, and the step moved them
    assert len(table) == len(checkpoint.params)
    assert (table["update_max_abs_torch"] > 0).all()
    require_parity(report)


def test_a_mapping_mistake_breaks_parity(resnet18, pynative):
    _, state_dict = resnet18
    checkpoint = convert(state_dict, "resnet18", 10)
    params = checkpoint.params
    params["layers.3.bn1.moving_mean"], params["layers.3.bn1.moving_variance"] = (
        params["layers.3.bn1.moving_variance"],
        params["layers.3.bn1.moving_mean"],
    )
    result = forward_parity(state_dict, checkpoint, "resnet18", 10, ParityInput(IMAGE_SIZE, 2, 0))
    assert result["max_abs_diff"] > 1e-2
    report = {
        "architecture": "resnet18",
        "forward": {**result, "tolerance": 1e-4, "passed": False},
        "single_step": {"passed": True},
    }
    with pytest.raises(MigrationError, match=r"resnet18 migration is not at parity: forward: max \|logit"):
        require_parity(report)


def test_a_failed_step_is_explained():
    step = {
        "passed": False,
        "weight_max_abs_diff": 6.5e-4,
        "weight_tolerance": 1e-4,
        "update_max_rel_diff": 0.017,
        "update_tolerance": 1e-3,
        "worst_tensor": "layers.0.bn1.beta",
        "mindspore_update_error": 0.017,
        "noise_factor": 2.0,
        "torch_float32_update_error": 3.5e-5,
        "near_kink_activations": 4,
    }
    report = {"architecture": "resnet18", "forward": {"passed": True}, "single_step": step}
    with pytest.raises(MigrationError) as error:
        require_parity(report)
    message = str(error.value)
    assert "single step: max |weight difference| 0.00065 (bound 0.0001)" in message
    assert "worst layers.0.bn1.beta" in message and "2 x PyTorch's float32 error 3.5e-05" in message
    assert "4 ReLU input(s) of this batch lie within float32 rounding of zero" in message
    assert "forward" not in message


def test_resnet50_forward_parity(tmp_path, pynative):
    model = random_torch_resnet("resnet50", 10)
    state_dict = load_state_dict(save_state_dict(model, tmp_path / "resnet50.pth"))
    result = forward_parity(
        state_dict, convert(state_dict, "resnet50", 10), "resnet50", 10, ParityInput(IMAGE_SIZE, 2, 0)
    )
    assert result["max_abs_diff"] <= 1e-4, result


def test_wrong_keys_and_shapes_are_named(resnet18):
    _, state_dict = resnet18
    renamed = dict(state_dict)
    renamed["fc.weights"] = renamed.pop("fc.weight")
    renamed["extra.bias"] = np.zeros(3, np.float32)
    with pytest.raises(MigrationError) as error:
        convert(renamed, "resnet18", 10, source="my.pth")
    message = str(error.value)
    assert "my.pth is not a torchvision resnet18 state_dict" in message
    assert "missing keys ['fc.weight']" in message and "unexpected keys ['extra.bias', 'fc.weights']" in message
    with pytest.raises(MigrationError, match=r"fc.weight has shape \(10, 512\), resnet18 with 1000 classes needs"):
        convert(state_dict, "resnet18", 1000)
    with pytest.raises(MigrationError, match=r"layer1.0.conv1.weight has shape \(64, 64, 3, 3\)"):
        convert(state_dict, "resnet50", 10)
    with pytest.raises(MigrationError, match="'resnet_narrow' has no torchvision counterpart"):
        convert(state_dict, "resnet_narrow", 10)


def test_old_state_dicts_without_num_batches_tracked_convert(resnet18):
    _, state_dict = resnet18
    old = {k: v for k, v in state_dict.items() if not k.endswith("num_batches_tracked")}
    converted = convert(old, "resnet18", 10).params
    np.testing.assert_array_equal(converted["fc.weight"], state_dict["fc.weight"])


def test_state_dict_files(tmp_path, resnet18):
    path, state_dict = resnet18
    torch.save({"model": torch.load(path, weights_only=True), "epoch": 3}, tmp_path / "training.pth")
    assert load_state_dict(tmp_path / "training.pth").keys() == state_dict.keys()
    with pytest.raises(MigrationError, match=f"{tmp_path / 'none.pth'} does not exist"):
        load_state_dict(tmp_path / "none.pth")
    torch.save([1, 2], tmp_path / "list.pth")
    with pytest.raises(MigrationError, match="holds list, not a state_dict"):
        load_state_dict(tmp_path / "list.pth")
    (tmp_path / "junk.pth").write_bytes(b"not a torch file")
    with pytest.raises(MigrationError, match="junk.pth is not a readable PyTorch state_dict file"):
        load_state_dict(tmp_path / "junk.pth")


def test_migrate_parameters_are_validated():
    from tests.support.config import changed, load_config
    from trainlib.params import ParameterError, validate_parameters

    params = load_config("local")
    assert validate_parameters(params).migrate.parity.batch_size == 2
    for key, value, message in (
        ("migrate.architecture", "resnet_narrow", "migrate.architecture is 'resnet_narrow'; choose one of resnet18"),
        ("migrate.parity.batch_size", 1, "migrate.parity.batch_size is 1 but must be >= 2"),
        ("migrate.parity.forward_tolerance", 0.0, "migrate.parity.forward_tolerance is 0.0 but must be > 0"),
        ("migrate.num_classes", 0, "migrate.num_classes is 0 but must be > 0"),
    ):
        with pytest.raises(ParameterError, match=message):
            validate_parameters(changed(params, key, value))
