"""The backend audit: primitives read from MindSpore's own graph dumps, checked against the backends MindSpore's
docstrings declare; and the evidence behind each exception of tests/support/backends.py.

Every training pipeline's graphs are audited where tests/pipelines/test_runs.py runs it."""

from __future__ import annotations

import mindspore as ms
import numpy as np
import pytest
from mindspore import nn

from tests.support.backends import (
    DEVICE_PATHS,
    KNOWN_GAPS,
    Evidence,
    assert_declared_on_every_target,
    declared_platforms,
    dumped_graphs,
    evidence,
    graph_primitives,
    platform_table,
    undeclared,
)
from tests.support.config import load_config
from trainlib.boost.options import build_train_step
from trainlib.models.loss import CrossEntropySmooth
from trainlib.models.resnet import ResNet, ResNetLayout
from trainlib.optim.momentum import create_momentum
from trainlib.optim.thor.linalg import block_inverse
from trainlib.params import BoostParams


class Inverse(nn.Cell):
    def __init__(self, method: str):
        super().__init__()
        self.method = method

    def construct(self, matrix):
        return block_inverse(matrix, 2, self.method)


def compiled(cell: nn.Cell, folder, *inputs) -> set[str]:
    ms.set_context(mode=ms.GRAPH_MODE, device_target="CPU")
    with dumped_graphs(folder):
        cell(*inputs)
    return graph_primitives(folder)


@pytest.fixture(scope="module")
def spd() -> ms.Tensor:
    matrix = np.random.default_rng(0).normal(size=(4, 4)).astype(np.float32)
    return ms.Tensor(matrix @ matrix.T + 4 * np.eye(4, dtype=np.float32))


def test_the_audit_reads_the_primitives_of_a_training_step(tmp_path):
    net = nn.SequentialCell(nn.Conv2d(3, 4, 3), nn.BatchNorm2d(4), nn.ReLU(), nn.Flatten(), nn.Dense(4 * 8 * 8, 2))
    loss = nn.WithLossCell(net, nn.SoftmaxCrossEntropyWithLogits(sparse=True, reduction="mean"))
    step = nn.TrainOneStepCell(loss, nn.Momentum(net.trainable_params(), 0.1, 0.9))
    images, labels = ms.Tensor(np.ones((2, 3, 8, 8), np.float32)), ms.Tensor(np.array([0, 1], np.int32))
    primitives = compiled(step, tmp_path, images, labels)
    # gradient kernels count as their forward primitive; graph plumbing (Depend, Load, UpdateState) is left out
    assert {"Conv2D", "BatchNorm", "ReLU", "MatMul", "ApplyMomentum"} <= primitives
    assert not {"Conv2DBackpropFilter", "ReluGrad", "Depend", "Load", "UpdateState"} & primitives
    assert undeclared(primitives, "CPU", exceptions=()) == []
    # MindSpore declares the sparse cross entropy for GPU and CPU only: the audit names it for Ascend
    (finding,) = undeclared(primitives, "Ascend", exceptions=())
    assert finding.primitive == "SparseSoftmaxCrossEntropyWithLogits"
    assert finding.describe("Ascend") == "SparseSoftmaxCrossEntropyWithLogits: docstring name CPU, GPU, not Ascend"


def test_the_audit_reads_an_export_for_any_batch_size_without_its_symbolic_shapes(tmp_path):
    from trainlib.models.resnet import create_resnet

    net = create_resnet("resnet_narrow", 2)
    net.set_train(False)
    ms.set_context(mode=ms.GRAPH_MODE, device_target="CPU")
    with dumped_graphs(tmp_path / "graphs"):
        any_batch = ms.Tensor(shape=[None, 3, 16, 16], dtype=ms.float32)
        ms.export(net, any_batch, file_name=str(tmp_path / "net"), file_format="MINDIR")
    dumps = "".join(path.read_text() for path in (tmp_path / "graphs").rglob("*validate*.ir"))
    symbols = dumps[dumps.index("symbol engine details:") :]
    assert "= ScalarMax(" in symbols  # the residual sums' batch dimension, as a relation between shapes
    primitives = graph_primitives(tmp_path / "graphs")
    assert {"Conv2D", "BatchNorm", "ReLU", "MatMul"} <= primitives
    assert "ScalarMax" not in primitives  # which the compiler evaluates: no kernel runs it


def test_the_audit_catches_thors_cpu_inverse_on_ascend(tmp_path, spd):
    primitives = compiled(Inverse("cholesky"), tmp_path, spd)
    assert "Cholesky" in primitives
    assert [finding.primitive for finding in undeclared(primitives, "Ascend", exceptions=())] == ["Cholesky"]
    assert undeclared(primitives, "GPU", exceptions=()) == undeclared(primitives, "CPU", exceptions=()) == []


def test_thors_ascend_inverse_uses_only_primitives_declared_for_ascend(tmp_path, spd):
    """The evidence for DEVICE_PATHS: the "matrix_inverse" method THOR's preconditioner picks on Ascend compiles to
    MatrixInverse, which MindSpore declares there, and to no Cholesky."""
    primitives = compiled(Inverse("matrix_inverse"), tmp_path, spd)
    assert "MatrixInverse" in primitives and not {"Cholesky", "CholeskySolve"} & primitives
    assert set(DEVICE_PATHS.values()) == {"MatrixInverse"}
    assert undeclared(primitives, "Ascend", exceptions=()) == []


@pytest.mark.parametrize(
    ("primitive", "platforms"), [("Muls", {"Ascend", "GPU", "CPU"}), ("MatMulExt", {"Ascend", "GPU", "CPU"})]
)
def test_a_primitive_with_no_declaration_is_judged_by_the_kernel_headers_mindspore_ships(primitive, platforms):
    assert declared_platforms(primitive) is None  # its docstring defers to an undocumented function
    assert evidence(primitive) == Evidence(frozenset(platforms), "kernel headers")


def test_known_gaps_are_still_gaps():
    """Each KNOWN_GAPS entry is a primitive with no evidence on the devices listed: when MindSpore ships the kernel,
    this fails, and the entry goes."""
    for primitive, devices in KNOWN_GAPS.items():
        found = evidence(primitive)
        assert found.source == "kernel headers" and not set(devices) & found.platforms, primitive


def test_declarations_follow_the_primitives_reference_to_its_function():
    assert declared_platforms("ReLU") == {"Ascend", "GPU", "CPU"}  # its docstring says "Refer to ops.relu"
    assert declared_platforms("AllGather") == {"Ascend", "GPU"}
    assert declared_platforms("NoSuchPrimitive") is None
    assert evidence("NoSuchPrimitive") == Evidence(frozenset(), "none")


BOOST_OFF = load_config()["boost"]


@pytest.mark.parametrize(
    "options",
    [{"less_bn": True}, {"grad_freeze": True, "freeze_param_groups": 2}, {"grad_accumulation_steps": 2}],
    ids=["less_bn", "grad_freeze", "grad_accumulation"],
)
def test_each_boost_option_compiles_only_primitives_declared_on_every_target(tmp_path, options):
    """The boost options' training steps (the recipes' network and loss), which the pipelines' runs do not switch on;
    grad centralization builds only on Ascend, whose Centralization kernel a CPU cannot compile."""
    ms.set_context(mode=ms.GRAPH_MODE, device_target="CPU")
    ms.set_seed(0)
    net = ResNet(ResNetLayout("basic", (2,), base_width=4, small_input_stem=True), 3)
    optimizer = create_momentum(net, np.full(4, 0.1, np.float32), 0.9, 1e-4, 8.0)
    boost = BoostParams(**{**BOOST_OFF, **options})
    step = build_train_step(nn.WithLossCell(net, CrossEntropySmooth(3, 0.1)), optimizer, 8.0, boost, "CPU")
    step.set_train(True)
    images, labels = ms.Tensor(np.ones((4, 3, 8, 8), np.float32)), ms.Tensor(np.array([0, 1, 2, 0], np.int32))
    with dumped_graphs(tmp_path):
        for _ in range(2):
            step(images, labels)
    assert {"Conv2D", "ApplyMomentum", "SoftmaxCrossEntropyWithLogits"} <= assert_declared_on_every_target(tmp_path)


def test_a_folder_without_graphs_says_how_to_dump_them(tmp_path):
    with pytest.raises(FileNotFoundError, match="MS_DEV_SAVE_GRAPHS=1"):
        graph_primitives(tmp_path)


def test_the_table_has_a_row_per_primitive_with_each_platform():
    rows = platform_table({"baseline": {"Conv2D", "ReLU"}, "thor": {"Conv2D", "Cholesky"}})
    everywhere = {"Ascend": "yes", "GPU": "yes", "CPU": "yes"}
    assert rows == [
        {"primitive": "Cholesky", "recipes": "thor", "evidence": "docstring", **everywhere, "Ascend": "no"},
        {"primitive": "Conv2D", "recipes": "baseline, thor", "evidence": "docstring", **everywhere},
        {"primitive": "ReLU", "recipes": "baseline", "evidence": "docstring", **everywhere},
    ]


def test_thors_options_compile_only_primitives_declared_on_cpu_and_gpu_and_eigen_needs_eigh(tmp_path):
    """THOR with every option on (factored, eigen, kl_clip, Adam graft): the eigen method's ``Eigh`` is the one
    primitive Ascend lacks (its kernel headers: CPU and GPU; ``mindspore.scipy.linalg.eigh``, which calls it,
    declares "GPU" "CPU"), so the preconditioner refuses eigen there."""
    import inspect

    import mindspore.scipy.linalg

    from tests.support.thor import TinyNet, batch, make_thor, run

    ms.set_context(mode=ms.GRAPH_MODE, device_target="CPU")
    with dumped_graphs(tmp_path):
        options = {"damping_method": "factored", "compute_method": "eigen", "kl_clip": 1e-3}
        thor = make_thor(TinyNet(), frequency=2, adam_graft=(0.9, 0.999, 1e-8), **options)
        for step in range(2):  # the second-order step and the step reusing the eigenbases
            run(thor, *batch(step))
    primitives = graph_primitives(tmp_path)
    assert {"Eigh", "Trace", "Pow", "Minimum"} <= primitives
    assert undeclared(primitives, "CPU", exceptions=()) == undeclared(primitives, "GPU", exceptions=()) == []
    assert [finding.primitive for finding in undeclared(primitives, "Ascend", exceptions=())] == ["Eigh"]
    assert "Supported Platforms:\n    ``GPU`` ``CPU``" in inspect.getdoc(mindspore.scipy.linalg.eigh)
