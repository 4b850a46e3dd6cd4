"""``statistics_dtype`` (issue 44): float64 takes THOR's A and G as float64 products rounded once to float32, so they
do not depend on how oneDNN's float32 GEMM splits its sums on this CPU; the keys reach the library. That whole
trainings give the same bits whatever oneDNN's kernels: tests/e2e/test_thor_statistics_dtype.py."""

from __future__ import annotations

import mindspore as ms
import numpy as np
import pytest
import yaml
from mindspore import nn, ops
from pydantic import ValidationError

from tests.support.config import CONF
from trainlib.models.loss import CrossEntropySmooth
from trainlib.optim.thor.capture import CapturedLayer
from trainlib.optim.thor.step import create_thor_step
from trainlib.params import BertThorTraining

ROWS, IN, OUT = 2048, 64, 32  # a long sum: float32's rounding then differs from one rounding of the exact product


class _CapturedDense(nn.Cell):
    """A Dense layer captured as THOR captures it, and ``sum(output * weights)``, whose gradient with respect to the
    output (G's rows) is ``weights`` exactly."""

    def __init__(self, statistics_dtype: str):
        super().__init__()
        self.wrapper = CapturedLayer(nn.Dense(IN, OUT, has_bias=False), 1.0, statistics_dtype)
        self.wrapper.capture = True

    def construct(self, x, weights):
        return (self.wrapper(x) * weights).sum()


def _statistics(statistics_dtype: str, x: np.ndarray, dout: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    cell = _CapturedDense(statistics_dtype)
    ops.GradOperation()(cell)(ms.Tensor(x), ms.Tensor(dout))
    return cell.wrapper.a_stat.asnumpy().copy(), cell.wrapper.g_stat.asnumpy().copy()


def _rounded_once(rows: np.ndarray) -> np.ndarray:
    wide = rows.astype(np.float64)
    return (wide.T @ wide / len(wide)).astype(np.float32)


def test_float64_statistics_are_the_exact_products_rounded_once_to_float32():
    rng = np.random.default_rng(0)
    x = np.maximum(rng.standard_normal((ROWS, IN)), 0).astype(np.float32)
    dout = (rng.standard_normal((ROWS, OUT)) * 1e-3).astype(np.float32)
    g_rows = dout * np.float32(ROWS)  # G's rows: the per-example gradients (ROWS is a power of 2: exact)
    a64, g64 = _statistics("float64", x, dout)
    assert (a64.dtype, g64.dtype) == (np.float32, np.float32)  # the buffers, and what reads them, stay float32
    np.testing.assert_array_equal(a64, _rounded_once(x))
    np.testing.assert_array_equal(g64, _rounded_once(g_rows))
    # the float32 GEMM rounds its partial sums: not the same bits (so the comparison above can fail)
    a32, g32 = _statistics("float32", x, dout)
    assert not np.array_equal(a32, a64) and not np.array_equal(g32, g64)
    np.testing.assert_allclose(a32, a64, rtol=1e-5, atol=1e-7)


def test_the_documented_recipes_keep_float32_and_the_key_reaches_the_library():
    """Both sections default to float32 (the documented recipes); the BERT section, like the ResNet one, is the
    ``ThorSettings`` that ``create_thor_step`` reads, which sets every wrapped layer's dtype."""
    from tests.support.thor import TinyNet

    thor = yaml.safe_load((CONF / "base" / "parameters_thor.yml").read_text())["thor"]
    bert = yaml.safe_load((CONF / "base" / "parameters_thor_bert.yml").read_text())["thor_bert"]["thor"]
    assert thor["statistics_dtype"] == bert["statistics_dtype"] == "float32"
    section = BertThorTraining.model_validate({**bert, "statistics_dtype": "float64"})
    net = TinyNet()
    step = create_thor_step(
        net, nn.WithLossCell(net, CrossEntropySmooth(4, 0.0)), np.ones(2), np.ones(2), section, rank_size=1
    )
    assert {wrapper.statistics_dtype for wrapper in step.preconditioner.wrappers} == {"float64"}


def test_an_unknown_statistics_dtype_is_refused():
    from tests.support.thor import TinyNet, make_thor

    with pytest.raises(ValidationError, match=r"statistics_dtype\n  Input should be 'float32' or 'float64'"):
        make_thor(TinyNet(), statistics_dtype="float16")
