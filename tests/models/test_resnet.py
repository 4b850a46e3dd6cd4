"""ResNet family: sizes, shapes, zero-gamma option and weight initialisers."""

from __future__ import annotations

import math
from typing import get_args

import numpy as np
import pytest

from trainlib.migrate.layouts import TORCHVISION_ARCHITECTURES
from trainlib.models.resnet import (
    CONV_INITS,
    RESNET_LAYOUTS,
    BasicBlock,
    Bottleneck,
    _weight_init,
    count_parameters,
    create_resnet,
)
from trainlib.params import NetworkName, TorchvisionArchitecture

# torchvision / the models repo, 1000 classes
REFERENCE_PARAMETER_COUNTS = {
    "resnet18": 11_689_512,
    "resnet34": 21_797_672,
    "resnet101": 44_549_160,
}


@pytest.fixture(scope="module")
def resnet50():
    """The one ResNet-50 of this module (1000 classes, last BN gamma of each block zeroed)."""
    return create_resnet("resnet50", 1000, zero_init_last_bn_gamma=True)


@pytest.fixture(scope="module")
def narrow_by_init():
    """resnet_narrow with 1000 classes (a 1000 x 128 fc layer), one per initialiser."""
    return {kind: create_resnet("resnet_narrow", 1000, conv_init=kind, dense_init=kind) for kind in CONV_INITS}


def weights(net) -> dict[str, np.ndarray]:
    return {p.name: p.asnumpy() for p in net.get_parameters()}


def test_resnet50_has_the_reference_parameter_count(resnet50):
    assert count_parameters(resnet50) == 25_557_032


@pytest.mark.parametrize("name", sorted(REFERENCE_PARAMETER_COUNTS))
def test_parameter_counts_match_the_reference(name):
    assert count_parameters(create_resnet(name, 1000)) == REFERENCE_PARAMETER_COUNTS[name]


def test_count_parameters_excludes_batchnorm_moving_statistics():
    net = create_resnet("resnet_narrow", 10)
    every = sum(math.prod(p.shape) for p in net.get_parameters())
    moving = sum(math.prod(p.shape) for p in net.get_parameters() if "moving_" in p.name)
    assert moving > 0
    assert count_parameters(net) == every - moving


def test_resnet50_is_v1_5_with_the_stride_on_the_3x3_convolution(resnet50):
    blocks = list(resnet50.layers)
    assert len(blocks) == 16
    assert all(isinstance(block, Bottleneck) for block in blocks)
    first_of_stage = {3, 7, 13}  # blocks (3, 4, 6, 3): stages 2-4 start here and halve the size
    for index, block in enumerate(blocks):
        assert tuple(block.conv1.stride) == (1, 1)
        assert tuple(block.conv2.stride) == ((2, 2) if index in first_of_stage else (1, 1)), index
    assert tuple(resnet50.stem[0].kernel_size) == (7, 7)


def test_narrow_network_output_shape(mindspore_cpu):
    ms = mindspore_cpu
    net = create_resnet("resnet_narrow", 10)
    net.set_train(False)
    x = ms.Tensor(np.random.default_rng(0).standard_normal((2, 3, 32, 32)).astype(np.float32))
    logits = net(x)
    assert logits.shape == (2, 10)
    assert logits.dtype == ms.float32
    assert np.all(np.isfinite(logits.asnumpy()))
    assert all(isinstance(block, BasicBlock) for block in net.layers)


def test_narrow_network_takes_grey_input_and_tiny_images(mindspore_cpu):
    ms = mindspore_cpu
    net = create_resnet("resnet_narrow", 3, in_channels=1)
    net.set_train(False)
    assert net(ms.Tensor(np.zeros((4, 1, 12, 12), np.float32))).shape == (4, 3)


def _gammas(net) -> dict[str, np.ndarray]:
    return {name: value for name, value in weights(net).items() if name.endswith(".gamma")}


def test_zero_init_last_bn_gamma_basic_blocks():
    gammas = _gammas(create_resnet("resnet_narrow", 10, zero_init_last_bn_gamma=True))
    zeroed = {name for name, value in gammas.items() if np.all(value == 0)}
    assert zeroed == {f"layers.{i}.bn2.gamma" for i in range(4)}
    for name, value in gammas.items():
        if name not in zeroed:
            np.testing.assert_array_equal(value, 1.0, err_msg=name)


def test_zero_init_last_bn_gamma_bottleneck_blocks(resnet50):
    gammas = _gammas(resnet50)
    zeroed = {name for name, value in gammas.items() if np.all(value == 0)}
    assert zeroed == {f"layers.{i}.bn3.gamma" for i in range(16)}
    for name, value in gammas.items():
        if name not in zeroed:
            np.testing.assert_array_equal(value, 1.0, err_msg=name)


def test_without_zero_init_every_gamma_is_one_and_betas_zero():
    params = weights(create_resnet("resnet_narrow", 10))
    gammas = [v for n, v in params.items() if n.endswith(".gamma")]
    betas = [v for n, v in params.items() if n.endswith(".beta")]
    assert len(gammas) == len(betas) == 1 + 4 * 2 + 3  # stem + two per block + three down-samples
    assert all(np.all(g == 1) for g in gammas)
    assert all(np.all(b == 0) for b in betas)


def test_zero_init_changes_only_the_gammas(mindspore_cpu):
    ms = mindspore_cpu
    ms.set_seed(7)
    plain = weights(create_resnet("resnet_narrow", 10))
    ms.set_seed(7)
    zeroed = weights(create_resnet("resnet_narrow", 10, zero_init_last_bn_gamma=True))
    assert plain.keys() == zeroed.keys()
    for name in plain:
        if name.endswith(".bn2.gamma") and name.startswith("layers."):
            assert not np.array_equal(plain[name], zeroed[name])
        else:
            np.testing.assert_array_equal(plain[name], zeroed[name], err_msg=name)


# Layer used for the statistics: 128 x 128 x 3 x 3 = 147,456 values, fan_in = fan_out = 1152.
SQUARE_CONV = "layers.3.conv2.weight"
# 128 x 64 x 3 x 3: fan_in = 576, fan_out = 1152.
WIDENING_CONV = "layers.3.conv1.weight"


def fans(shape: tuple[int, ...]) -> tuple[int, int]:
    receptive = math.prod(shape[2:])
    return shape[1] * receptive, shape[0] * receptive


def test_he_normal_is_normal_with_fan_out_std(narrow_by_init):
    params = weights(narrow_by_init["he_normal"])
    for name in (SQUARE_CONV, WIDENING_CONV, "fc.weight"):
        w = params[name]
        _, fan_out = fans(w.shape)
        std = math.sqrt(2.0 / fan_out)
        assert abs(w.mean()) < 0.02 * std, name
        assert w.std() == pytest.approx(std, rel=0.03), name
        # a normal sample of >100k values reaches beyond 3.5 sigma; uniform or 2-sigma-truncated would not
        assert np.abs(w).max() > 3.5 * std, name


def test_xavier_uniform_respects_its_bound(narrow_by_init):
    params = weights(narrow_by_init["xavier_uniform"])
    for name in (SQUARE_CONV, WIDENING_CONV, "fc.weight"):
        w = params[name]
        fan_in, fan_out = fans(w.shape)
        bound = math.sqrt(6.0 / (fan_in + fan_out))
        assert np.abs(w).max() <= bound * (1 + 1e-6), name
        assert np.abs(w).max() > 0.99 * bound, name  # fills the whole interval
        assert w.std() == pytest.approx(bound / math.sqrt(3.0), rel=0.03), name
        # uniform: about a tenth of the values in each tenth of [-bound, bound]
        histogram, _ = np.histogram(w, bins=10, range=(-bound, bound))
        np.testing.assert_allclose(histogram / w.size, 0.1, atol=0.02)


def test_truncated_normal_has_fan_in_scaled_spread(narrow_by_init):
    """What holds today: a zero-mean bell shape whose spread scales with 1/sqrt(fan_in)."""
    params = weights(narrow_by_init["truncated_normal"])
    w_square, w_widening = params[SQUARE_CONV], params[WIDENING_CONV]
    # fan_in 1152 vs 576: the spread differs by sqrt(2) (He-normal would give equal spreads: same fan_out)
    assert w_widening.std() / w_square.std() == pytest.approx(math.sqrt(2.0), rel=0.05)
    for w in (w_square, w_widening):
        assert abs(w.mean()) < 0.02 * w.std()


def test_truncated_normal_is_cut_at_two_sigma_with_variance_scaling_std(narrow_by_init):
    """Models-repo definition: truncnorm(-2, 2) * sigma, sigma = sqrt(1/fan_in) / 0.8796, so std = sqrt(1/fan_in)."""
    params = weights(narrow_by_init["truncated_normal"])
    for name in (SQUARE_CONV, WIDENING_CONV, "fc.weight"):
        w = params[name]
        fan_in, _ = fans(w.shape)
        sigma = math.sqrt(1.0 / fan_in) / 0.87962566103423978
        assert np.abs(w).max() <= 2 * sigma * (1 + 1e-6), name
        assert w.std() == pytest.approx(math.sqrt(1.0 / fan_in), rel=0.03), name


def test_initialisers_give_different_statistics(narrow_by_init):
    w = {kind: weights(net)[SQUARE_CONV] for kind, net in narrow_by_init.items()}
    # fan_in = fan_out = 1152: He std sqrt(2/1152) is sqrt(2) times Xavier's sqrt(1/1152)
    assert w["he_normal"].std() / w["xavier_uniform"].std() == pytest.approx(math.sqrt(2.0), rel=0.05)
    # uniform has a hard edge at sqrt(3) std; the normal-shaped ones reach further out
    for kind in ("he_normal", "truncated_normal"):
        assert np.abs(w[kind]).max() > 1.9 * w[kind].std(), kind
    assert np.abs(w["xavier_uniform"]).max() < 1.74 * w["xavier_uniform"].std()


def test_fc_bias_is_uniform_within_one_over_sqrt_fan_in(narrow_by_init):
    bias = weights(narrow_by_init["he_normal"])["fc.bias"]
    bound = 1.0 / math.sqrt(128)
    assert bias.shape == (1000,)
    assert np.abs(bias).max() <= bound * (1 + 1e-6)
    assert np.abs(bias).max() > 0.9 * bound


def test_every_network_name_has_a_layout():
    """The registry of layouts holds exactly the names the parameters accept (trainlib.params.NetworkName)."""
    assert tuple(RESNET_LAYOUTS) == get_args(NetworkName)


def test_torchvision_architectures_are_the_layouts_with_its_stem_and_width():
    """trainlib.params.TorchvisionArchitecture names every layout torchvision has: the 7x7 stem with max-pool and 64
    base channels."""
    with_counterpart = [
        name for name, layout in RESNET_LAYOUTS.items() if not layout.small_input_stem and layout.base_width == 64
    ]
    assert TORCHVISION_ARCHITECTURES == get_args(TorchvisionArchitecture) == tuple(with_counterpart)


def test_unknown_network_name_is_rejected_with_the_choices():
    with pytest.raises(ValueError, match="unknown network 'resnet51'") as error:
        create_resnet("resnet51", 10)
    for name in RESNET_LAYOUTS:
        assert name in str(error.value)


@pytest.mark.parametrize("option", ["conv_init", "dense_init"])
def test_unknown_initialiser_is_rejected_naming_the_option(option):
    with pytest.raises(ValueError, match=f"unknown {option} 'kaiming'"):
        create_resnet("resnet_narrow", 10, **{option: "kaiming"})


def test_weight_init_rejects_unknown_kind():
    with pytest.raises(ValueError, match="unknown initialiser 'orthogonal'"):
        _weight_init("orthogonal", (4, 4, 3, 3))
