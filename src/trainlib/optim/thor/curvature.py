"""What THOR's two compute methods share (``Curvature``): the layers' statistics as the compiled step reads them,
and the float32 buffers each method, and each step after it, allocates for itself. ``InverseMethod`` (``inverse``)
and ``EigenMethod`` (``eigen``) derive from it, as kfac-pytorch's ``KFACInverseLayer`` and ``KFACEigenLayer`` derive
from ``KFACBaseLayer``; ``ThorPreconditioner`` picks one at construction."""

from __future__ import annotations

import mindspore as ms
import numpy as np
from mindspore import nn, ops

from trainlib.distributed.collectives import MeanOverRanks
from trainlib.optim.thor.capture import CapturedLayer


def zero_buffers(kind: str, shapes: list[tuple[int, ...]], layer_names: list[str]) -> ms.ParameterTuple:
    """Zero float32 buffers ``<kind>.<layer>``, one per layer, of the given shapes (not trained)."""
    return ms.ParameterTuple(
        [
            ms.Parameter(ms.Tensor(np.zeros(shape, np.float32)), name=f"{kind}.{name}", requires_grad=False)
            for shape, name in zip(shapes, layer_names, strict=True)
        ]
    )


def scalar_parameter(name: str) -> ms.Parameter:
    """A float32 scalar buffer, 0 to start with (not trained)."""
    return ms.Parameter(ms.Tensor(0.0, ms.float32), name=name, requires_grad=False)


class Curvature(nn.Cell):
    """A compute method's common part: per captured layer ``i`` (``wrappers``, ``layer_names``: the weights'
    names) its A, G and P, averaged over ``rank_size`` ranks; ``factored`` is ``damping_method: factored``.

    A method adds ``refresh(i, grad, damping)`` (this step's curvature of layer ``i``, stored and returned),
    ``apply(curvature, matrix)`` (the direction of a ``C_out x n`` gradient matrix), ``apply_stored(i, matrix)``
    (the same with layer ``i``'s curvature of the last refresh) and ``state_params()`` (its buffers in the optimizer
    state). ``apply_stored`` reads the buffers inside the product, not as a tuple first: MindSpore lists a graph's
    parameters in the order it meets them, so this keeps the compiled reuse step's graph as it was."""

    def __init__(self, wrappers: list[CapturedLayer], layer_names: list[str], rank_size: int, factored: bool):
        super().__init__(auto_prefix=False)
        self.layer_names = layer_names
        self.factored = factored
        self.a_stats = ms.ParameterTuple([w.a_stat for w in wrappers])
        self.g_stats = ms.ParameterTuple([w.g_stat for w in wrappers])
        self.positions = ms.ParameterTuple([w.positions for w in wrappers])
        self.mean_over_ranks = MeanOverRanks(rank_size)

    def statistics(self, i, grad):
        """A, G (rank means) and P of layer ``i``, read once ``grad`` exists (so after the capture)."""
        a = self.mean_over_ranks(ops.depend(self.a_stats[i], grad))
        g = self.mean_over_ranks(ops.depend(self.g_stats[i], grad))
        positions = ops.depend(self.positions[i], grad)
        return a, g, positions
