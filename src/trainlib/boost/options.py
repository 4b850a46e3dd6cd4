"""``mindspore.boost``'s LessBN, gradient freeze and gradient accumulation for our Momentum training step.

The trainings call their step cell once per batch (``trainlib.engine.loop.train``) rather than through
``mindspore.Model``, whose boost configuration (``AutoBoost``) is a process-wide singleton. So
``build_train_step`` assembles the same MindSpore pieces ``Model`` would, without the singleton:

- ``less_bn``: ``mindspore.boost.LessBN`` marks the network for MindSpore's ``less_bn`` graph
  pass, which deletes the BatchNorms of the residual branches it recognises (measured: the first
  two of a bottleneck and its down-sample BatchNorm, the first of a basic block); their
  parameters and moving statistics stay as they were. The pass runs only in GRAPH mode.
  ``grad_centralization`` is boost's ``gc_flag``: gradient centralisation of the convolution and
  dense weights through the ``Centralization`` kernel, which MindSpore 2.10 has only on Ascend.
  boost's ``fn_flag`` (the last Dense becomes a normalised head with an extra parameter) is not
  offered: the checkpoints must load into the plain network the evaluation nodes build.
- ``grad_freeze``: ``mindspore.boost.GradientFreeze`` splits the parameters into
  ``freeze_param_groups`` nested groups (group ``k`` holds the parameters after the first ``k``
  of ``n`` equal slices of the layers; group 0 is all of them) and a sequence choosing one group
  per step, from ``freeze_type`` (0: blocks of consecutive steps, 1: interleaved at random) and
  ``freeze_p`` (the share of steps that train group 0, i.e. freeze nothing). Each group has its
  own Momentum (``FreezeOpt``) with its own momentum buffers; the parameters outside the chosen
  group are not touched that step.
- ``grad_accumulation_steps`` N > 1: ``mindspore.boost.GradientAccumulation`` adds gradient / N
  every batch and runs the optimizer on the sum every N-th batch.

Refused by ``trainlib.params.BoostParams``: freeze with accumulation (MindSpore's freeze cell fails
when it accumulates) and LessBN with accumulation (the deleted BatchNorms' gamma and beta then receive
spurious updates, measured also through ``AutoBoost`` + ``BoostTrainOneStepCell``); by
``boost_problems`` when the step is built: LessBN outside GRAPH mode, gradient centralisation forced
on where MindSpore has no kernel.

The learning rate keeps following the per-batch schedule in all cases: the optimizer's step
counter still advances once per batch (the schedule and the checkpoints' step count batches), an
accumulated update uses the lr of the batch that completes it, and a frozen step uses the lr of
its batch. What the checkpoints do not hold (``capture_state`` saves the network and the
optimizer passed in): the per-group momentum buffers of ``grad_freeze``, and a partial
accumulation at an epoch end whose step count N does not divide; a resumed training restarts them
at zero.
"""

from __future__ import annotations

import logging

import numpy as np
from mindspore import Parameter, Tensor, get_context, nn, ops
from mindspore import boost as ms_boost
from mindspore import dtype as mstype

from trainlib.params import GRAD_CENTRALIZATION_TARGETS, BoostParams

logger = logging.getLogger(__name__)


def boost_problems(boost: BoostParams, device_target: str, mode: str = "graph") -> list[tuple[str, str]]:
    """(key, problem) pairs of a ``boost`` block that MindSpore cannot run on ``device_target`` in ``mode``.

    Combinations MindSpore cannot run anywhere (freeze or LessBN with accumulation) are refused by
    ``BoostParams`` itself; these depend on the device and mode the step is built for.
    """
    problems = []
    if boost.less_bn and mode != "graph":
        problems.append(
            (
                "boost.less_bn",
                f"needs runtime.mode graph (it is {mode}): LessBN is a graph-compiler pass and changes nothing "
                "in pynative mode",
            )
        )
    if boost.less_bn and boost.grad_centralization == "on" and device_target not in GRAD_CENTRALIZATION_TARGETS:
        problems.append(
            (
                "boost.grad_centralization",
                f"is on, but MindSpore has no Centralization kernel on {device_target} (only on "
                f"{', '.join(GRAD_CENTRALIZATION_TARGETS)}); use auto (off there) or off",
            )
        )
    return problems


def validate_boost(boost: BoostParams, device_target: str, mode: str = "graph") -> list[str]:
    """Problems with a ``boost`` block, one message each starting with the key to change; empty when fine."""
    return [f"{key} {problem}" for key, problem in boost_problems(boost, device_target, mode)]


def boost_enabled(boost: BoostParams | None) -> bool:
    """Whether any boost option is on (otherwise the step is a plain TrainOneStepCell)."""
    return boost is not None and boost.enabled


def grad_centralization_enabled(boost: BoostParams, device_target: str) -> bool:
    """Whether LessBN's gradient centralisation runs: ``auto`` means where MindSpore has the kernel."""
    setting = boost.grad_centralization
    if setting == "auto":
        return device_target in GRAD_CENTRALIZATION_TARGETS
    return setting == "on"


def build_train_step(network_with_loss, optimizer, loss_scale: float, boost: BoostParams | None, device_target: str):
    """The training step cell ``(images, labels) -> loss`` for ``boost`` (None or all off: a plain TrainOneStepCell).

    ``network_with_loss`` is a ``WithLossCell``-like cell, ``optimizer`` a Momentum over its
    network's trainable parameters (``trainlib.optim.momentum.create_momentum``) whose learning rate is the
    per-step schedule, already restored when resuming; gradients are scaled by ``loss_scale``.
    Raises ``ValueError`` (naming the ``boost`` key) for a combination MindSpore cannot run.
    """
    sens = float(loss_scale)
    if not boost_enabled(boost):
        return nn.TrainOneStepCell(network_with_loss, optimizer, sens=sens)
    mode = "graph" if get_context("mode") == 0 else "pynative"
    problems = validate_boost(boost, device_target, mode)
    if problems:
        raise ValueError("boost options MindSpore cannot run:\n  " + "\n  ".join(problems))
    # boost's cells prefix the names of the parameters they are given ("network._backbone.",
    # "optimizer."); checkpoints, resuming and the weight-decay groups go by the network's own names
    names = [(p, p.name) for cell in (network_with_loss, optimizer) for p in cell.get_parameters()]
    if boost.less_bn:
        network_with_loss = _less_bn(network_with_loss, optimizer, grad_centralization_enabled(boost, device_target))
    if boost.grad_freeze:
        step = _FreezeTrainStep(
            network_with_loss, _freeze_optimizer(network_with_loss, optimizer, boost), optimizer, sens
        )
    elif boost.grad_accumulation_steps > 1:
        step = _AccumulateTrainStep(network_with_loss, optimizer, sens, boost.grad_accumulation_steps)
    else:
        step = nn.TrainOneStepCell(network_with_loss, optimizer, sens=sens)
    for param, name in names:
        param.name = name
    return step


def _less_bn(network_with_loss, optimizer, grad_centralization: bool):
    wrapped = ms_boost.LessBN(network_with_loss, fn_flag=False)
    if grad_centralization:
        # boost's rule (OptimizerProcess): every non-BatchNorm, non-bias weight but grouped convolutions;
        # set on the existing optimizer so that its state stays the one the checkpoints save and restore
        cells = ms_boost.OptimizerProcess.build_params_dict(wrapped)
        gc_groups = ms_boost.OptimizerProcess.build_gc_params_group(cells, optimizer.init_params["params"])
        centralised = {id(p) for g in gc_groups if g.get("grad_centralization") for p in g["params"]}
        optimizer.grad_centralization_flags = tuple(id(p) in centralised for p in optimizer.parameters)
        logger.info(
            "LessBN gradient centralisation on %d of %d parameters", len(centralised), len(optimizer.parameters)
        )
    return wrapped


def _freeze_optimizer(network_with_loss, optimizer, boost: BoostParams):
    """boost's ``FreezeOpt`` over the rest of ``optimizer``'s schedule, one Momentum per parameter group."""
    n_groups = boost.freeze_param_groups
    done = int(optimizer.global_step.asnumpy().reshape(-1)[0])
    remaining = [float(lr) for lr in np.asarray(optimizer.init_learning_rate, dtype=np.float32)[done:]]
    freeze = ms_boost.GradientFreeze(n_groups, boost.freeze_type, boost.freeze_p, len(remaining))
    groups = freeze.split_parameters_groups(network_with_loss, n_groups)
    if len({len(g) for g in groups}) < n_groups:
        raise ValueError(
            f"boost.freeze_param_groups is {n_groups}, more groups than this network's layers can be split into "
            "(some would freeze nothing); lower it"
        )
    # FreezeOpt gives each group the learning rates of the steps it is chosen for only when the
    # schedule is a list that the step sequence covers: a fresh optimizer over the steps left
    rest = type(optimizer)(params=optimizer.init_params["params"], learning_rate=remaining, **optimizer.init_args)
    _, freeze_optimizer = freeze.freeze_generate(network_with_loss, rest)
    return freeze_optimizer


class _FreezeTrainStep(nn.TrainOneStepCell):
    """boost's gradient-freeze step, as BoostTrainOneStepCell runs it: the step's group trains, the rest waits."""

    def __init__(self, network, freeze_optimizer, schedule_optimizer, sens: float):
        super().__init__(network, freeze_optimizer, sens=sens)
        self.freeze_nets = ms_boost.freeze_cell(
            self.reducer_flag,
            self.network,
            freeze_optimizer,
            self.sens,
            self.grad,
            False,
            getattr(self, "mean", None),
            getattr(self, "degree", None),
        )
        self.train_strategy = freeze_optimizer.train_strategy
        self.strategy_length = len(freeze_optimizer.train_strategy)
        self.position = Parameter(Tensor(0, mstype.int32), name="freeze_position", requires_grad=False)
        self.schedule_step = schedule_optimizer.global_step

    def construct(self, *inputs):
        loss = self.freeze_nets[self.train_strategy[self.position]](*inputs)
        # FloorMod, not `%`: that lowers to RemainderTensorScalar, which has no GPU kernel (docs/backends.md)
        loss = ops.depend(loss, ops.assign(self.position, ops.floor_mod(self.position + 1, self.strategy_length)))
        return ops.depend(loss, ops.assign_add(self.schedule_step, ops.ones_like(self.schedule_step)))


class _AccumulateTrainStep(nn.TrainOneStepCell):
    """TrainOneStepCell whose update goes through boost's GradientAccumulation (every N-th batch)."""

    def __init__(self, network, optimizer, sens: float, steps: int):
        super().__init__(network, optimizer, sens=sens)
        self.accumulation = ms_boost.GradientAccumulation(steps, optimizer)

    def construct(self, *inputs):
        loss = self.network(*inputs)
        sens = ops.fill(loss.dtype, loss.shape, self.sens)
        grads = self.grad_reducer(self.grad(self.network, self.weights)(*inputs, sens))
        loss = self.accumulation(loss, grads)
        # the optimizer advanced its step only when it ran (the window count is back at 0): count the other batches
        waiting = ops.depend(self.accumulation._accumulation_step, loss)
        step = self.optimizer.global_step
        return ops.depend(loss, ops.assign_add(step, ops.cast(waiting > 0, step.dtype).reshape(step.shape)))
