"""``ThorStep``: THOR's training step, compiled as cells that call ``optimizer(precondition(grads))``: forward and
backward with the loss scaled, the gradients unscaled and averaged over ranks, ``ThorPreconditioner``, then the
baseline's Momentum optimizer (``create_thor_step``)."""

from __future__ import annotations

from collections.abc import Callable

import mindspore as ms
import numpy as np
from mindspore import nn, ops

from trainlib.optim.gradients import FirstOrderStep, UnscaledGradients
from trainlib.optim.momentum import create_momentum, decays_unless_norm_or_bias
from trainlib.optim.thor.preconditioner import ThorPreconditioner
from trainlib.params.thor import ThorSettings


class _PreconditionedStep(nn.Cell):
    """One compiled step: gradients (``UnscaledGradients``), precondition, optimizer."""

    def __init__(self, gradients: UnscaledGradients, precondition: nn.Cell, optimizer: nn.Optimizer):
        super().__init__(auto_prefix=False)
        self.gradients = gradients
        self.precondition = precondition
        self.optimizer = optimizer

    def construct(self, damping, *batch):
        loss, grads = self.gradients(*batch)
        return ops.depend(loss, self.optimizer(self.precondition(grads, damping)))


class _CapturingGradients(nn.Cell):
    """The trace rule's first part of a second-order step: gradients with the statistics captured, and each
    layer's damped trace (``ThorPreconditioner.traces_cell``)."""

    def __init__(self, gradients: UnscaledGradients, traces: nn.Cell):
        super().__init__(auto_prefix=False)
        self.gradients = gradients
        self.traces = traces

    def construct(self, damping, *batch):
        loss, grads = self.gradients(*batch)
        return loss, grads, self.traces(grads, damping)


class _PreconditionedUpdate(nn.Cell):
    """The trace rule's last part: the stored inverses applied to given gradients, then the optimizer."""

    def __init__(self, precondition: nn.Cell, optimizer: nn.Optimizer):
        super().__init__(auto_prefix=False)
        self.precondition = precondition
        self.optimizer = optimizer

    def construct(self, grads, damping):
        return self.optimizer(self.precondition(grads, damping))


class ThorInverseError(FloatingPointError):
    """A damped A or G factor that Cholesky cannot invert: the damping too small for float32 statistics."""


class ThorDivergenceError(FloatingPointError):
    """The training diverged: a layer's A or G statistic holds NaN or Inf (so no damping can invert it)."""


def _first_non_finite(preconditioner: ThorPreconditioner) -> tuple[str, str, float] | None:
    """(layer, "A" or "G", a non-finite value) of the first statistic of this step that is not finite, or None."""
    for name, a, g in zip(preconditioner.layer_names, preconditioner.a_stats, preconditioner.g_stats, strict=True):
        for factor, stat in (("A", a), ("G", g)):
            values = stat.asnumpy()
            bad = values[~np.isfinite(values)]
            if bad.size:
                return name, factor, float(bad[0])
    return None


class ThorStep:
    """THOR training step ``(*batch) -> loss``: gradients, ``preconditioner``, then ``optimizer``.

    ``net_with_loss`` takes a batch's columns and returns the batch-mean loss (``nn.WithLossCell`` of an image
    network and its loss, or a network that computes its own loss, like BERT's pre-training network).

    The optimizer is an ordinary MindSpore optimizer over ``net.trainable_params()`` (in that order) that receives
    unscaled gradients (``loss_scale`` 1): ``create_thor_step`` passes the baseline's Momentum, so momentum, weight
    decay (after preconditioning) and their state are the baseline's. The loss is multiplied by ``loss_scale``
    before differentiation (like ``TrainOneStepCell(sens=loss_scale)``); gradients are divided by it before the
    preconditioner and G is unscaled as it is taken, so updates do not depend on it (exactly, for powers of two).
    The returned loss is unscaled (and averaged over ranks). ``lr_per_step``: the optimizer's schedule, one value
    per step; the optimizer indexes it by its global step, so a step past its end is refused.

    ``preconditioner`` None switches the second order off (``thor.precondition: false``): the same gradients,
    loss scaling, optimizer and schedules, but the gradients reach the optimizer unchanged and nothing is captured
    (THOR's recipe without its curvature; ``damping`` is then only reported).
    """

    def __init__(
        self,
        net: nn.Cell,
        net_with_loss: nn.Cell,
        preconditioner: ThorPreconditioner | None,
        optimizer: nn.Optimizer,
        lr_per_step: np.ndarray,
        damping: np.ndarray,
        *,
        loss_scale: float,
        rank_size: int,
    ):
        if [id(p) for p in optimizer.parameters] != [id(p) for p in net.trainable_params()]:
            raise ValueError("the optimizer must update net.trainable_params() in their order (group order_params)")
        self.net = net
        self.preconditioner = preconditioner
        self.optimizer = optimizer
        self.lr_per_step = np.asarray(lr_per_step, np.float32).ravel()
        self.damping = np.asarray(damping, np.float32).ravel()
        self.loss_scale = float(loss_scale)
        gradients = UnscaledGradients(net_with_loss, optimizer.parameters, loss_scale, rank_size)
        net.set_train(True)
        if preconditioner is None:
            self._first_order = FirstOrderStep(gradients, optimizer)
            return
        self._second_order = _PreconditionedStep(gradients, preconditioner.second_order_cell, optimizer)
        self._reuse = _PreconditionedStep(gradients, preconditioner.reuse_cell, optimizer)
        if preconditioner.trace_rule is not None:
            self._capturing = _CapturingGradients(gradients, preconditioner.traces_cell)
            self._update = _PreconditionedUpdate(preconditioner.reuse_cell, optimizer)

    def __call__(self, *batch) -> ms.Tensor:
        """One training step; returns the (unscaled, rank-averaged) loss."""
        preconditioner = self.preconditioner
        steps = int(self.optimizer.global_step.asnumpy()[0]) if preconditioner is None else preconditioner.steps
        if steps >= len(self.lr_per_step):
            raise ValueError(
                f"THOR step {steps + 1} is past the end of its lr schedule "
                f"({len(self.lr_per_step)} steps); build the schedule for every step of the training"
            )
        if preconditioner is None:
            return self._first_order(*batch)
        second_order = preconditioner.second_order_now()
        damping = ms.Tensor(preconditioner.current_damping, ms.float32)
        if preconditioner.clip is not None:  # the clip factor is computed with this step's lr
            preconditioner.clip.set_lr(self.lr_per_step[steps])
        try:
            if second_order and preconditioner.trace_rule is not None:
                return self._trace_rule_step(damping, *batch)
            preconditioner.capture(second_order)
            try:
                loss = (self._second_order if second_order else self._reuse)(damping, *batch)
            finally:
                preconditioner.capture(False)
        except RuntimeError as error:
            if "Cholesky" not in str(error):
                raise
            # the step's statistics were taken before the inverse failed: non-finite ones mean a divergence
            non_finite = _first_non_finite(preconditioner)
            if non_finite is not None:
                layer, factor, value = non_finite
                raise ThorDivergenceError(
                    f"THOR step {steps + 1}: the training diverged: layer {layer}'s statistic {factor} holds "
                    f"{value} (the step's inputs or output gradients overflowed; no damping inverts that). "
                    "Lower the learning rate."
                ) from None
            raise ThorInverseError(
                f"THOR step {steps + 1}: a layer's damped statistic is not positive definite in float32 (damping "
                f"{preconditioner.current_damping:.3g}); its statistics are finite but the damping is too small "
                "for them. Raise the damping (its minimum, or its schedule's total steps), or lower the learning rate."
            ) from None
        preconditioner.count_step(second_order)
        return loss

    def _trace_rule_step(self, damping: ms.Tensor, *batch) -> ms.Tensor:
        """A second-order step under the trace rule: statistics and traces, the refreshed layers' inverses only,
        then the update with the stored inverses (see the module docstring)."""
        preconditioner = self.preconditioner
        preconditioner.capture(True)
        try:
            loss, grads, traces = self._capturing(damping, *batch)
        finally:
            preconditioner.capture(False)
        preconditioner.refresh_by_trace_rule(traces.asnumpy(), damping)
        self._update(ms.mutable(grads), damping)  # mutable: a tuple of new tensors must not recompile the cell
        preconditioner.count_step(True)
        return loss


def create_thor_step(
    net: nn.Cell,
    net_with_loss: nn.Cell,
    lr_per_step: np.ndarray,
    damping: np.ndarray,
    settings: ThorSettings,
    *,
    rank_size: int,
    precondition: bool = True,
    trace_rule: tuple[float, float] | None = None,
    inverse_method: str | None = None,
    decays: Callable[[str], bool] = decays_unless_norm_or_bias,
) -> ThorStep:
    """THOR for ``net`` with a section's ``settings`` (``params.ThorSettings``: the ResNet or BERT section itself):
    the preconditioner, then the baseline's Momentum (``create_momentum``: weight decay on the parameters ``decays``
    names, by default all but BatchNorm gamma/beta and biases; ``lr_per_step`` indexed by its global step) with loss
    scale 1, as the preconditioner already receives unscaled gradients. ``net_with_loss``: a cell that computes the
    batch-mean loss of ``net`` from a batch's columns (``nn.WithLossCell(net, loss_fn)``, or BERT's pre-training
    network with its losses). ``trace_rule`` and ``inverse_method`` are ``ThorPreconditioner``'s; ``precondition``
    False builds no preconditioner (``ThorStep``: THOR's recipe without its second order)."""
    preconditioner = (
        ThorPreconditioner(
            net, damping, settings, rank_size=rank_size, trace_rule=trace_rule, inverse_method=inverse_method
        )
        if precondition
        else None
    )
    lr_per_step = np.asarray(lr_per_step, np.float32).ravel()
    optimizer = create_momentum(net, lr_per_step, settings.momentum, settings.weight_decay, 1.0, decays=decays)
    return ThorStep(
        net,
        net_with_loss,
        preconditioner,
        optimizer,
        lr_per_step,
        damping,
        loss_scale=settings.loss_scale,
        rank_size=rank_size,
    )
