"""``kl_clip`` (kfac-pytorch's ``_compute_grad_scale``), the last step after the compute method and the graft:
every preconditioned direction scaled by one factor ``nu`` that bounds the step's KL change; the maths:
docs/recipes.md, section "THOR's options" (``kl_clip``)."""

from __future__ import annotations

import mindspore as ms
from mindspore import nn, ops

from trainlib.optim.thor.curvature import scalar_parameter


class KlClip(nn.Cell):
    """``(grads, directions) -> clipped directions``, with ``nu = min(1, sqrt(kl_clip / |lr^2 sum g . d|))`` over the
    preconditioned gradients (``layer_of_param`` >= 0). ``lr`` is the step's, which ``set_lr`` writes before it; the
    last ``nu`` is kept in ``thor_clip_factor`` (figures, not state)."""

    def __init__(self, kl_clip: float, layer_of_param: tuple[int, ...]):
        super().__init__(auto_prefix=False)
        self.kl_clip = kl_clip
        self.layer_of_param = layer_of_param
        self.step_lr = scalar_parameter("thor_step_lr")
        self.clip_factor = scalar_parameter("thor_clip_factor")

    def construct(self, grads, directions):
        agreement = 0.0  # sum over the preconditioned layers of g . d
        for j, direction in enumerate(directions):
            if self.layer_of_param[j] >= 0:
                agreement = agreement + ops.reduce_sum(direction * grads[j])
        nu = ops.minimum(ops.sqrt(self.kl_clip / ops.abs(self.step_lr * self.step_lr * agreement)), 1.0)
        ops.assign(self.clip_factor, nu)
        clipped = ()
        for j, direction in enumerate(directions):
            clipped += (direction * nu if self.layer_of_param[j] >= 0 else direction,)
        return clipped

    def set_lr(self, lr: float) -> None:
        """The learning rate of the next step, which ``nu`` is computed with."""
        self.step_lr.set_data(ms.Tensor(lr, ms.float32))

    @property
    def last_factor(self) -> float:
        """``nu`` of the last step (0 before the first)."""
        return float(self.clip_factor.asnumpy())
