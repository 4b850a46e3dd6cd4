"""``adam_graft`` (Shampoo's layer-wise grafting), a step after the compute method: each preconditioned layer's
direction rescaled to the norm of the Adam update of its gradient; the maths: docs/recipes.md, section "THOR's
options" (``adam_graft``)."""

from __future__ import annotations

import mindspore as ms
from mindspore import nn, ops

from trainlib.optim.thor.curvature import scalar_parameter, zero_buffers


class AdamGraft(nn.Cell):
    """``(grads, directions) -> grafted directions``. Its state: Adam's moments of each preconditioned weight's
    gradient (``thor_graft_m.<layer>``, ``thor_graft_v.<layer>``) and their step ``thor_graft_step`` (counted from 1
    at the first grafted step); the last step's scales ``|u| / |d|`` per layer (``thor_graft_scale.<layer>``) are
    figures, not state. ``layer_of_param``: each gradient's layer, -1 for a gradient left as it is."""

    def __init__(
        self,
        betas_eps: tuple[float, float, float],
        weight_shapes: list[tuple[int, ...]],
        layer_names: list[str],
        layer_of_param: tuple[int, ...],
    ):
        super().__init__(auto_prefix=False)
        self.beta1, self.beta2, self.eps = betas_eps
        self.layer_of_param = layer_of_param
        self.layer_names = layer_names
        self.graft_m = zero_buffers("thor_graft_m", weight_shapes, layer_names)
        self.graft_v = zero_buffers("thor_graft_v", weight_shapes, layer_names)
        self.graft_step = scalar_parameter("thor_graft_step")
        self.graft_scales = ms.ParameterTuple([scalar_parameter(f"thor_graft_scale.{name}") for name in layer_names])

    def construct(self, grads, directions):
        beta1, beta2, eps = self.beta1, self.beta2, self.eps
        graft_step = self.graft_step + 1.0
        ops.assign(self.graft_step, graft_step)
        first_correction = 1.0 - ops.pow(beta1, graft_step)
        second_correction = 1.0 - ops.pow(beta2, graft_step)
        grafted = ()
        for j, direction in enumerate(directions):
            layer = self.layer_of_param[j]
            if layer < 0:
                grafted += (direction,)
                continue
            grad = grads[j]
            m = beta1 * self.graft_m[layer] + (1.0 - beta1) * grad
            v = beta2 * self.graft_v[layer] + (1.0 - beta2) * grad * grad
            ops.assign(self.graft_m[layer], m)
            ops.assign(self.graft_v[layer], v)
            adam = (m / first_correction) / (ops.sqrt(v / second_correction) + eps)
            norm = ops.sqrt(ops.reduce_sum(direction * direction))
            ratio = ops.sqrt(ops.reduce_sum(adam * adam)) / norm
            scale = ops.where(norm > 0, ratio, ops.zeros_like(ratio))  # a zero direction stays zero
            ops.assign(self.graft_scales[layer], scale)
            grafted += (direction * scale,)
        return grafted

    def state_params(self) -> list[ms.Parameter]:
        return [*self.graft_m, *self.graft_v, self.graft_step]

    def last_scales(self) -> dict[str, float]:
        """Per layer, the last step's scale ``|adam update| / |THOR direction|``."""
        return {name: float(p.asnumpy()) for name, p in zip(self.layer_names, self.graft_scales, strict=True)}
