"""MindSpore's own THOR (``nn.thor`` + ``ModelThor``), set up as the tutorial does, run with this project's callbacks.

The tutorial (seeds ``000``/``003``): ``opt = nn.thor(net, Tensor(lr), Tensor(damping), momentum, weight_decay,
loss_scale, batch_size, split_indices=..., frequency=...)``, a ``Model`` with a ``FixedLossScaleManager(loss_scale,
drop_overflow_update=False)``, ``amp_level`` and ``keep_batchnorm_fp32``, then
``ConvertModelUtils().convert_to_thor_model(...)`` and ``model.train(epochs, dataset, callbacks, sink_size,
dataset_sink_mode)``. (Seed ``003``'s ``frequency=`` argument of ``convert_to_thor_model`` is an older API: in
MindSpore 2.10 the frequency is ``nn.thor``'s.)

``nn.thor`` converts the network in place: each ``Conv2d``/``Dense`` becomes a ``Conv2dThor``/``DenseThor`` with the
same weight names plus the statistics buffers named in ``STATISTICS_NAMES``. Those buffers, the optimizer's moments,
inverses (``matrix_a_inv_<i>``/``matrix_g_inv_<i>``) and step counters are stored in checkpoints under
``OPTIMIZER_PREFIX``, so a checkpoint's network part loads into the plain network (evaluation) and the rest restores
the optimizer (resume).

Training runs only on Ascend and GPU: on CPU the kernels ThorIm2Col, CholeskyTrsm and UpdateThorGradient are missing
and ``ModelThor``'s non-sink path fails (``_exec_preprocess() missing 2 required positional arguments``). Building the
optimizer and converting the model work on CPU, which is what the tests here check.
"""

from __future__ import annotations

from collections.abc import Mapping

import mindspore as ms
import numpy as np

from trainlib.engine.checkpoint import OPTIMIZER_PREFIX, Checkpoint
from trainlib.optim.momentum import decays_unless_norm_or_bias
from trainlib.params.thor import ThorParams

# the last name part of the buffers Conv2dThor / DenseThor add to the network; optimizer state, not weights
STATISTICS_NAMES = ("matrix_a_cov", "matrix_g_cov", "a_normalizer", "g_normalizer", "matrix_a", "matrix_g")


def _decays(param) -> bool:
    return decays_unless_norm_or_bias(param.name)


def create_thor_optimizer(net, lr_per_step: np.ndarray, damping: np.ndarray, thor: ThorParams):
    """``nn.thor`` for ``net``, which it converts in place (``Conv2dThor``/``DenseThor``, same weight names), with
    ``thor``'s momentum, weight decay, loss scale, batch size, frequency and ``split_indices`` (empty: MindSpore's
    default, all A/G layers in one allreduce group).

    Weight decay skips BatchNorm gamma/beta and biases (``optim.momentum.decays_unless_norm_or_bias``), as the
    baseline's Momentum does.
    """
    from mindspore import nn

    return nn.thor(
        net,
        ms.Tensor(np.asarray(lr_per_step, np.float32)),
        ms.Tensor(np.asarray(damping, np.float32)),
        float(thor.momentum),
        float(thor.weight_decay),
        float(thor.loss_scale),
        int(thor.batch_size),
        decay_filter=_decays,
        split_indices=list(thor.split_indices) or None,
        frequency=int(thor.frequency),
    )


def create_thor_model(net, loss_fn, optimizer, thor: ThorParams):
    """The ``ModelThor`` that trains the converted ``net`` with its ``nn.thor`` ``optimizer``, as the tutorial builds
    it: a ``Model`` with ``thor``'s fixed loss scale (no overflow skipping) and ``thor.mindspore_builtin``'s amp
    options, converted by ``ConvertModelUtils``."""
    from mindspore import amp
    from mindspore.train import Model
    from mindspore.train.train_thor import ConvertModelUtils

    loss_scale_manager = amp.FixedLossScaleManager(float(thor.loss_scale), drop_overflow_update=False)
    # the same training set-up for the Model and for its THOR conversion, as the tutorial passes it twice
    setup = {
        "loss_fn": loss_fn,
        "optimizer": optimizer,
        "loss_scale_manager": loss_scale_manager,
        "metrics": {"acc"},
        "amp_level": thor.mindspore_builtin.amp_level,
        "keep_batchnorm_fp32": thor.mindspore_builtin.keep_batchnorm_fp32,
    }
    return ConvertModelUtils().convert_to_thor_model(model=Model(net, **setup), network=net, **setup)


def is_statistic(name: str) -> bool:
    """Whether ``name`` is a buffer that ``nn.thor``'s layer conversion added to the network."""
    return name.rsplit(".", 1)[-1] in STATISTICS_NAMES


def capture_thor_state(net, optimizer, metadata: Mapping) -> Checkpoint:
    """Weights and BatchNorm statistics of ``net`` as network parameters (float32); THOR buffers and optimizer state
    (moments, inverses, ``global_step``) under ``OPTIMIZER_PREFIX``."""
    params: dict[str, np.ndarray] = {}
    for param in net.get_parameters():
        value = param.asnumpy().copy()  # asnumpy() can share the parameter's memory on CPU
        if is_statistic(param.name):
            params[OPTIMIZER_PREFIX + param.name] = value
        else:
            params[param.name] = value.astype(np.float32) if np.issubdtype(value.dtype, np.floating) else value
    for param in optimizer.get_parameters():
        if param.name not in params:
            params[OPTIMIZER_PREFIX + param.name] = param.asnumpy().copy()
    return Checkpoint(params, dict(metadata))


def restore_thor_state(net, optimizer, checkpoint: Checkpoint) -> None:
    """Load the THOR buffers and optimizer state of ``checkpoint`` (``capture_thor_state``) into a converted ``net``
    and its ``nn.thor`` optimizer; the weights are expected to be in ``net`` already."""
    state = checkpoint.optimizer_state()
    weights = {p.name for p in net.get_parameters() if not is_statistic(p.name)}
    wanted = {p.name for p in net.get_parameters() if is_statistic(p.name)}
    wanted |= {p.name for p in optimizer.get_parameters()} - weights
    missing = sorted(wanted - set(state))
    if missing:
        raise ValueError(f"checkpoint lacks THOR state {missing[:5]}")
    as_params = {name: ms.Parameter(ms.Tensor(state[name]), name=name) for name in wanted}
    ms.load_param_into_net(net, {k: v for k, v in as_params.items() if is_statistic(k)})
    ms.load_param_into_net(optimizer, {k: v for k, v in as_params.items() if not is_statistic(k)})
