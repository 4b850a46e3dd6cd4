"""Gradients of a loss-scaled network, unscaled and averaged over ranks, and the first-order step that hands them to
an optimizer: shared by THOR's step and the optimizers that take no loss scale of their own (AdamWeightDecay, Lamb:
MindSpore's loss-scale train cell needs an NPU status op that CPU lacks)."""

from __future__ import annotations

import mindspore as ms
from mindspore import nn, ops

from trainlib.distributed.collectives import MeanOverRanks


class UnscaledGradients(nn.Cell):
    """Scaled loss and gradients, unscaled (and averaged over ranks): ``(*batch) -> (loss, grads)``, the batch's
    columns as the network with its loss takes them (images and labels, or BERT's seven columns)."""

    def __init__(self, net_with_loss: nn.Cell, weights, loss_scale, ranks):
        super().__init__(auto_prefix=False)
        self.net_with_loss = net_with_loss
        self.loss_scale = float(loss_scale)
        self.mean_over_ranks = MeanOverRanks(ranks)
        self.value_and_grad = ms.value_and_grad(self._scaled_loss, None, weights)

    def _scaled_loss(self, *batch):
        return self.net_with_loss(*batch) * self.loss_scale

    def construct(self, *batch):
        scaled_loss, scaled_grads = self.value_and_grad(*batch)
        loss = self.mean_over_ranks(scaled_loss / self.loss_scale)
        grads = ()
        for grad in scaled_grads:
            grads += (self.mean_over_ranks(grad / self.loss_scale),)
        return loss, grads


class FirstOrderStep(nn.Cell):
    """A first-order step: the unscaled gradients straight to the optimizer; returns the unscaled loss (THOR's step
    with the preconditioner switched off, BERT's Lamb/AdamWeightDecay baseline)."""

    def __init__(self, gradients: UnscaledGradients, optimizer: nn.Optimizer):
        super().__init__(auto_prefix=False)
        self.gradients = gradients
        self.optimizer = optimizer

    def construct(self, *batch):
        loss, grads = self.gradients(*batch)
        return ops.depend(loss, self.optimizer(grads))
