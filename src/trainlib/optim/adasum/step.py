"""``AdasumTrainStep``: a training step whose ranks combine their weight deltas by Adasum (``optim.adasum.combine``)."""

from __future__ import annotations

import mindspore as ms
import numpy as np
from mindspore import Parameter, ParameterTuple, nn, ops
from mindspore.ops import composite as C
from mindspore.ops import functional as F

from trainlib.optim.adasum.combine import Adasum, check_rank_size, flatten, restore

_assign = C.MultitypeFuncGraph("adasum_assign")


@_assign.register("Tensor", "Tensor")
def _assign_tensor(target, value):
    return F.assign(target, value)


_delta = C.MultitypeFuncGraph("adasum_delta")


@_delta.register("Tensor", "Tensor")
def _delta_tensor(after, before):
    return after - before


_apply = C.MultitypeFuncGraph("adasum_apply")


@_apply.register("Tensor", "Tensor", "Tensor")
def _apply_tensor(param, before, delta):
    return F.assign(param, before + delta.astype(before.dtype))


def batchnorm_statistics(network: nn.Cell) -> list[Parameter]:
    """The non-trainable floating-point parameters of ``network`` (BatchNorm moving mean and variance)."""
    return [p for p in network.untrainable_params() if p.dtype in (ms.float16, ms.float32, ms.float64, ms.bfloat16)]


class AdasumTrainStep(nn.Cell):
    """Drop-in for ``nn.TrainOneStepCell(network, optimizer, sens)`` that combines ranks with Adasum.

    Each step: forward and backward on the local batch (no gradient AllReduce), the local optimizer
    step, then the per-tensor Adasum of every rank's weight delta (weights after minus before the
    step) is added to the weights from before the step, so all ranks hold the same trainable
    weights. Optimizer state (momentum) stays local, as in MindSpore's boost Adasum. With
    ``average_statistics`` the non-trainable float parameters (BatchNorm moving statistics) are
    averaged over the ranks by one AllReduce each step, which keeps the ranks' networks identical;
    otherwise they stay local. Ranks must start from the same weights (same checkpoint or seed).

    ``rank``/``rank_size`` default to ``mindspore.communication.get_rank()``/``get_group_size()``
    (needs ``init()`` first); a ``rank_size`` that is not a power of two raises ``ValueError``
    before any communication call. ``rank_size == 1`` trains like ``TrainOneStepCell``. Returns
    the local loss.
    """

    def __init__(
        self,
        network: nn.Cell,
        optimizer: nn.Optimizer,
        sens: float = 1.0,
        rank: int | None = None,
        rank_size: int | None = None,
        exchange: str | None = None,
        average_statistics: bool = True,
    ):
        super().__init__(auto_prefix=False)
        if rank_size is None:
            from mindspore.communication import get_group_size

            rank_size = get_group_size()
        check_rank_size(rank_size)
        if rank is None:
            from mindspore.communication import get_rank

            rank = get_rank() if rank_size > 1 else 0
        self.network = network
        self.network.set_grad()
        self.optimizer = optimizer
        self.weights = optimizer.parameters
        self.sens = float(sens)
        self.grad = ops.GradOperation(get_by_list=True, sens_param=True)
        self.hyper_map = C.HyperMap()
        self.distributed = rank_size > 1
        self.rank_size = rank_size
        if self.distributed:
            self.before = self.weights.clone(prefix="adasum_before", init="same")
            self.adasum = Adasum([w.shape for w in self.weights], rank, rank_size, exchange)
        stats = batchnorm_statistics(network) if average_statistics and self.distributed else []
        self.average_statistics = bool(stats)
        if stats:
            self.statistics = ParameterTuple(stats)
            self.stat_ends = tuple(int(e) for e in np.cumsum([np.prod(p.shape, dtype=np.int64) for p in stats]))
            self.stat_starts = (0, *self.stat_ends[:-1])
            self.sum_statistics = ops.AllReduce()

    def construct(self, *inputs):
        weights = self.weights
        if self.distributed:
            saved = self.hyper_map(_assign, self.before, weights)
        loss = self.network(*inputs)
        sens = F.fill(loss.dtype, loss.shape, self.sens)
        grads = self.grad(self.network, weights)(*inputs, sens)
        if self.distributed:
            # The copy must be taken before the optimizer, which consumes the gradients, changes the weights.
            grads = F.depend(grads, saved)
        loss = F.depend(loss, self.optimizer(grads))
        if self.distributed:
            deltas = self.hyper_map(_delta, F.depend(weights, loss), self.before)
            combined = self.adasum(deltas)
            loss = F.depend(loss, self.hyper_map(_apply, weights, self.before, combined))
        if self.average_statistics:
            loss = F.depend(loss, self._average_statistics(F.depend(self.statistics, loss)))
        return loss

    def _average_statistics(self, stats):
        flat = self.sum_statistics(ops.concat(self.hyper_map(flatten, stats))) / self.rank_size
        averaged = self.hyper_map(F.partial(restore, flat), self.stat_starts, self.stat_ends, stats)
        return self.hyper_map(_assign, self.statistics, averaged)
