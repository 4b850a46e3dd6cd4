"""THOR's compute method as one cell chosen at construction (``InverseMethod`` or ``EigenMethod``), the Adam graft
and kl_clip as steps after it, against the algorithm before that split (``legacy.LegacyPrecondition``), in one
process and in GRAPH mode, as training compiles it: with every option off the compiled step graphs are the same
(``graph_fingerprint``), and for each option and the combinations below the weights and the preconditioner's state
after three steps (second-order, reuse, second-order) are the same bit for bit."""

from __future__ import annotations

import hashlib
import re

import mindspore as ms
import numpy as np
import pytest
from mindspore.graph.api import _cell_graph_executor
from mindspore.train.anf_ir_pb2 import ModelProto

from tests.optim.thor.legacy import LegacyPrecondition
from tests.support.thor import TinyNet, batch, make_thor, params_of, run

# The slow tier: a refactoring's proof (the former cell against the new ones, each compiled), not a unit test.
pytestmark = pytest.mark.slow

GRAFT = (0.9, 0.99, 1e-8)
# test_options' cases: each option alone, and all four together (kl_clip binding: a loose one is the off case)
CASES = {
    "factored": {"damping_method": "factored"},
    "eigen": {"compute_method": "eigen"},
    "kl_clip": {"kl_clip": 1e-5},
    "adam_graft": {"adam_graft": GRAFT},
    "all": {"damping_method": "factored", "compute_method": "eigen", "kl_clip": 1e-5, "adam_graft": GRAFT},
}


@pytest.fixture
def graph_mode():
    before = ms.get_context("mode")
    ms.set_context(mode=ms.GRAPH_MODE)
    yield
    ms.set_context(mode=before)


def graph_fingerprint(cell) -> str:
    """A hash of the graph ``cell`` last compiled to (MindSpore's ANF IR protobuf) that keeps what the graph
    computes (each node's operator, sorted attributes, input edges and output type, in MindSpore's order; the
    graph's parameters with names, types and shapes) and drops where the code lives: node scopes and full names
    (cell paths), the graph's name, and the counter MindSpore names unnamed inputs with (``Parameter_<n>``)."""
    proto = _cell_graph_executor._graph_executor.get_func_graph_proto(cell.compile_phase, "anf_ir", False)
    graph = ModelProto.FromString(proto).graph
    graph.name = ""
    inputs = {}
    for k, parameter in enumerate(graph.parameters):
        if re.fullmatch(r"Parameter_\d+", parameter.name):
            inputs[parameter.name] = parameter.name = f"input{k}"
    for node in graph.node:
        node.scope = node.full_name = ""
        attributes = sorted(node.attribute, key=lambda attribute: attribute.name)
        del node.attribute[:]
        node.attribute.extend(attributes)
        for edge in node.input:
            edge.name = inputs.get(edge.name, edge.name)
    return hashlib.sha256(graph.SerializeToString(deterministic=True)).hexdigest()


def trained(options: dict, legacy: bool):
    """THOR on TinyNet after three steps with ``options``; ``legacy``: preconditioned by the former cell."""
    net = TinyNet()
    lrs, dampings = np.array([0.2, 0.1, 0.1], np.float32), np.array([0.03, 0.02, 0.02], np.float32)
    thor = make_thor(net, lr=lrs, damping=dampings, frequency=2, momentum=0.9, weight_decay=0.05, **options)
    if legacy:
        thor._second_order.precondition = LegacyPrecondition(thor.preconditioner, second_order=True)
        thor._reuse.precondition = LegacyPrecondition(thor.preconditioner, second_order=False)
    losses = [run(thor, *batch(step)) for step in range(3)]
    return thor, params_of(net), losses


def assert_same_bits(new, old) -> None:
    (thor, weights, losses), (old_thor, old_weights, old_losses) = new, old
    assert losses == old_losses
    for name, value in weights.items():
        np.testing.assert_array_equal(value, old_weights[name], err_msg=name)
    old_state = old_thor.preconditioner.state()
    for key, value in thor.preconditioner.state().items():
        np.testing.assert_array_equal(value, old_state[key], err_msg=key)


def test_with_every_option_off_the_compiled_step_graphs_are_the_former_ones(graph_mode):
    new, old = trained({}, legacy=False), trained({}, legacy=True)
    fingerprints = {}
    for step in ("_second_order", "_reuse"):
        fingerprints[step] = graph_fingerprint(getattr(new[0], step))
        assert fingerprints[step] == graph_fingerprint(getattr(old[0], step)), step
    assert fingerprints["_second_order"] != fingerprints["_reuse"]  # the fingerprint tells graphs apart
    assert_same_bits(new, old)


@pytest.mark.parametrize("case", list(CASES))
def test_each_option_trains_the_former_weights_bit_for_bit(graph_mode, case):
    assert_same_bits(trained(CASES[case], legacy=False), trained(CASES[case], legacy=True))


def buffers(options: dict) -> set[str]:
    """The kinds of buffer (the name before the layer) the preconditioning cell of THOR with ``options`` holds."""
    cell = make_thor(TinyNet(), **options).preconditioner.second_order_cell
    return {parameter.name.split(".")[0] for parameter in cell.get_parameters()}


def test_the_method_and_each_step_after_it_allocate_only_their_own_buffers():
    statistics = {"thor_stats"}
    inverse = {"thor_a_inv", "thor_g_inv"}
    eigen = {"thor_a_eigvec", "thor_g_eigvec", "thor_eigen_scale"}
    graft = {"thor_graft_m", "thor_graft_v", "thor_graft_step", "thor_graft_scale"}
    clip = {"thor_step_lr", "thor_clip_factor"}
    assert buffers({}) == statistics | inverse
    assert buffers({"damping_method": "factored"}) == statistics | inverse
    assert buffers({"compute_method": "eigen"}) == statistics | eigen
    assert buffers({"adam_graft": GRAFT}) == statistics | inverse | graft
    assert buffers({"kl_clip": 1e-3}) == statistics | inverse | clip
    assert buffers(CASES["all"]) == statistics | eigen | graft | clip
