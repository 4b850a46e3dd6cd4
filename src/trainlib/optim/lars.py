"""LARS (layer-wise adaptive rate scaling) as this project's own optimizer cell, in MLPerf ResNet-50's form.

MindSpore's ``nn.LARS`` wraps another optimizer around the ``LARSUpdate`` primitive, which has no CPU kernel
(``Unsupported op [LARSUpdate] on CPU``) and is deprecated since MindSpore 2.9; ``LARS`` here is written with public
ops that list CPU among their supported platforms (``ops.square``, ``ops.reduce_sum``, ``ops.sqrt``,
``ops.select``, ``ops.ApplyMomentum``), so the same cell runs on CPU, GPU and Ascend, in graph and PyNative mode.

The update, per parameter ``w`` with gradient ``g`` at step lr ``lr`` (read from the per-step schedule, as
``nn.Momentum`` does), momentum ``m``, weight decay ``wd``, trust coefficient ``eta`` and ``epsilon``:

- a parameter that ``adapts`` (by default every name without ``beta``, ``gamma`` or ``bias``, the project's
  BatchNorm and bias names: ``momentum.decays_unless_norm_or_bias``):
  ``trust = eta ||w|| / (||g|| + wd ||w|| + epsilon)`` if ``||w|| > 0`` and ``||g|| > 0``, else ``1``;
  ``v <- m v + lr trust (g + wd w)``; ``w <- w - v``;
- any other parameter (BatchNorm's gamma and beta, biases): plain momentum without weight decay,
  ``v <- m v + lr g``; ``w <- w - v``.

Norms are Frobenius norms over the whole tensor (one trust ratio per parameter, i.e. per layer's weight).
Momentum is heavy-ball, not Nesterov, and holds the lr-scaled step (the lr sits inside ``v``, where
``nn.Momentum`` multiplies the lr after the accumulation): with a changing lr the two differ, and this is MLPerf's.

Source read (2026-11-28): the MLPerf training reference, ``mlcommons/training``
``image_classification/tensorflow2/lars_optimizer.py`` (``LARSOptimizer.compute_lr`` and
``_resource_apply_dense``, commit 615ad0a2) and ``image_classification/tensorflow/official/resnet/
mlperf_lars_optimizer.py`` (``MLPERF_LARSOptimizer``, commit 91cf88b7, the TensorFlow optimizer that
``mlcommons/training_policies`` ``training_rules.adoc`` lists as a compliant LARS);
``image_classification/tensorflow2/common.py`` (``get_optimizer``) builds it with
``skip_list=['batch_normalization', 'bias', 'bn']``: skipped variables take neither the trust ratio nor the decay,
and the loss then carries no L2 term. ``epsilon`` defaults to 0.0 as in ``MLPERF_LARSOptimizer`` and the reference's
``--lars_epsilon=0`` (TF2's ``LARSOptimizer`` replaces a 0.0 by Keras' 1e-7, ``epsilon or
backend_config.epsilon()``; set ``epsilon: 1e-7`` for that one). Its schedule, a linear warm-up then polynomial
decay of power 2, is ``trainlib.optim.schedules.mlperf_polynomial_schedule``.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable

import mindspore as ms
import numpy as np
from mindspore import Parameter, Tensor, nn, ops

from trainlib.optim.momentum import decays_unless_norm_or_bias
from trainlib.params import LarsSettings

_lars_update = ops.MultitypeFuncGraph("lars_update")


def _norm(x):
    return ops.sqrt(ops.reduce_sum(ops.square(x)))


@_lars_update.register(
    "Function", "Tensor", "Number", "Number", "Number", "Tensor", "Bool", "Tensor", "Tensor", "Tensor"
)
def _update(apply_momentum, momentum, eta, weight_decay, epsilon, lr, adapts, gradient, weight, moment):
    """One parameter's LARS step; ``adapts`` is a Python bool, so graph mode keeps one branch per parameter."""
    if adapts:
        w_norm = _norm(weight)
        g_norm = _norm(gradient)
        both_positive = ops.logical_and(w_norm > 0.0, g_norm > 0.0)
        # the denominator of the branch select drops is set to 1, so a zero norm gives no 0/0 anywhere in the graph
        denominator = ops.select(both_positive, g_norm + weight_decay * w_norm + epsilon, ops.ones_like(g_norm))
        trust = ops.select(both_positive, eta * w_norm / denominator, ops.ones_like(g_norm))
        step = lr * trust * (gradient + weight_decay * weight)
    else:
        step = lr * gradient
    # ApplyMomentum with lr 1 is v <- m v + step; w <- w - v (MLPerf's reference calls apply_momentum the same way)
    return ops.depend(True, apply_momentum(weight, moment, ops.ones_like(lr), step, momentum))


class LARS(nn.Optimizer):
    """LARS with momentum, MLPerf ResNet-50's form (the module docstring gives the update and its source).

    Args:
        params: the parameters to train, a list of ``Parameter`` (``net.trainable_params()``); no group dicts: the
            exclusions come from ``adapts``, and a group's own weight decay would contradict it.
        learning_rate: a float, or one value per step (numpy array or 1-D tensor), as for ``nn.Momentum``.
        settings: the recipe's section (``params.LarsSettings``, validated): heavy-ball ``momentum`` (MLPerf: 0.9);
            ``weight_decay``, the L2 weight decay of the adapted parameters, also in the trust ratio's denominator;
            ``trust_coefficient`` (``eta`` above, MLPerf's ``eeta``, 0.001); ``epsilon``, added to the trust ratio's
            denominator (MLPerf's ``lars_epsilon``, 0); ``loss_scale``, the factor the gradients arrive multiplied
            by (divided out before the norms, which it would otherwise change).
        adapts: ``adapts(name)`` True: the parameter takes the trust ratio and the weight decay; False: plain
            momentum (default: every name without ``beta``, ``gamma`` or ``bias``).

    Inputs: the gradients, a tuple in the order of ``params``. Output: a tuple of True.
    """

    def __init__(
        self,
        params: Iterable[Parameter],
        learning_rate: float | np.ndarray | Tensor,
        settings: LarsSettings,
        *,
        adapts: Callable[[str], bool] = decays_unless_norm_or_bias,
    ):
        params = list(params)
        if not params or not all(isinstance(param, Parameter) for param in params):
            raise TypeError("LARS takes a non-empty list of Parameters (net.trainable_params()), not group dicts")
        # the base class's own weight decay stays 0: LARS decays inside its update, on the adapted parameters only
        super().__init__(learning_rate, params, weight_decay=0.0, loss_scale=float(settings.loss_scale))
        self.momentum = Parameter(Tensor(float(settings.momentum), ms.float32), name="momentum")
        self.eta = float(settings.trust_coefficient)
        self.lars_weight_decay = float(settings.weight_decay)
        self.epsilon = float(settings.epsilon)
        self.adapt_flags = tuple(bool(adapts(param.name)) for param in self._parameters)
        # named as nn.Momentum names them, so a checkpoint's optimizer state has the same keys for either optimizer
        self.moments = self._parameters.clone(prefix="moments", init="zeros")
        self.apply_momentum = ops.ApplyMomentum(use_nesterov=False)

    def construct(self, gradients):
        gradients = self.scale_grad(gradients)
        lr = self.get_lr()
        self.assignadd(self.global_step, self.global_step_increase_tensor)
        return self.hyper_map(
            ops.partial(
                _lars_update,
                self.apply_momentum,
                self.momentum,
                self.eta,
                self.lars_weight_decay,
                self.epsilon,
                lr,
            ),
            self.adapt_flags,
            gradients,
            self._parameters,
            self.moments,
        )


def create_lars(
    net: nn.Cell,
    lr_per_step: np.ndarray,
    settings: LarsSettings,
    *,
    adapts: Callable[[str], bool] = decays_unless_norm_or_bias,
) -> LARS:
    """``LARS`` over ``net``'s trainable parameters with the recipe's ``settings`` (``params.LarsSettings``: the
    ``lars`` section itself), the factory beside ``momentum.create_momentum``: BatchNorm parameters and biases
    excluded from the trust ratio and the decay by default; gradients arrive multiplied by ``settings.loss_scale``."""
    return LARS(net.trainable_params(), lr_per_step, settings, adapts=adapts)
