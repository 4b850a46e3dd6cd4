"""A tiny network and THOR set-up shared by the THOR tests: one conv and one dense layer, batches, a THOR step."""

from __future__ import annotations

import mindspore as ms
import numpy as np
from mindspore import nn

from trainlib.models.loss import CrossEntropySmooth
from trainlib.optim.thor.step import ThorStep, create_thor_step
from trainlib.params import ThorSettings

NAMES = ("conv.weight", "fc.weight", "fc.bias")


N, C_IN, SIZE, C_OUT, CLASSES = 4, 2, 8, 3, 4
POSITIONS = (SIZE // 2) ** 2  # stride-2, padding-1, 3x3 conv on 8x8: 4x4 outputs
FC_IN = C_OUT * POSITIONS


class TinyNet(nn.Cell):
    def __init__(self, seed: int = 0):
        super().__init__()
        rng = np.random.default_rng(seed)
        self.conv = nn.Conv2d(C_IN, C_OUT, 3, stride=2, pad_mode="pad", padding=1, has_bias=False)
        self.relu = nn.ReLU()
        self.flatten = nn.Flatten()
        self.fc = nn.Dense(FC_IN, CLASSES)
        self.conv.weight.set_data(ms.Tensor(rng.standard_normal((C_OUT, C_IN, 3, 3)).astype(np.float32) * 0.5))
        self.fc.weight.set_data(ms.Tensor(rng.standard_normal((CLASSES, FC_IN)).astype(np.float32) * 0.3))
        self.fc.bias.set_data(ms.Tensor(rng.standard_normal(CLASSES).astype(np.float32) * 0.1))

    def construct(self, x):
        return self.fc(self.flatten(self.relu(self.conv(x))))


def batch(seed: int, scale: float = 1.0) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(100 + seed)
    x = (rng.standard_normal((N, C_IN, SIZE, SIZE)) * scale).astype(np.float32)
    return x, rng.integers(0, CLASSES, N).astype(np.int32)


def params_of(net) -> dict[str, np.ndarray]:
    # asnumpy() can share memory with the parameter on CPU: copy before the next in-place update
    return {p.name: p.asnumpy().copy() for p in net.trainable_params()}


# The models repo's THOR settings (momentum, weight decay, loss scale, frequency); each test overrides what it varies
RECIPE = {
    "momentum": 0.9,
    "weight_decay": 5e-4,
    "loss_scale": 128.0,
    "frequency": 834,
    "block_size": None,
}
# create_thor_step's own keywords; every other keyword of make_thor is a key of its section (ThorSettings)
STEP_KEYWORDS = ("rank_size", "precondition", "trace_rule", "inverse_method", "decays")


def thor_settings(**settings) -> ThorSettings:
    """``RECIPE`` with ``settings`` as a section's ``ThorSettings`` (validated: a misspelt key is refused);
    ``adam_graft`` may be given as ``(beta1, beta2, eps)``."""
    graft = settings.get("adam_graft")
    if isinstance(graft, tuple):
        settings["adam_graft"] = dict(zip(("beta1", "beta2", "eps"), graft, strict=True))
    every_step = settings.get("frequency") == 1
    if every_step:  # the sections refuse 1 (a recipe choice); the library takes it: a refresh at every step
        settings["frequency"] = 2
    validated = ThorSettings.model_validate({**RECIPE, **settings})
    return validated.model_copy(update={"frequency": 1}) if every_step else validated


def make_thor(net, steps=8, lr=0.1, damping=0.03, **settings) -> ThorStep:
    """THOR for ``net`` with ``RECIPE``'s settings but for ``settings`` (a section's keys, or ``STEP_KEYWORDS``), and
    constant (or given) schedules."""
    lrs = np.full(steps, lr, np.float32) if np.isscalar(lr) else np.asarray(lr, np.float32)
    dampings = np.full(steps, damping, np.float32) if np.isscalar(damping) else np.asarray(damping, np.float32)
    keywords = {key: settings.pop(key) for key in STEP_KEYWORDS if key in settings}
    loss = nn.WithLossCell(net, CrossEntropySmooth(CLASSES, 0.0))
    return create_thor_step(net, loss, lrs, dampings, thor_settings(**settings), **{"rank_size": 1, **keywords})


def run(thor: ThorStep, x, y) -> float:
    return float(thor(ms.Tensor(x), ms.Tensor(y)).asnumpy())
