"""The training state as a ``Checkpoint``: capture from, and restore into, MindSpore cells.

One layout for every recipe: the network's parameters (BatchNorm statistics included) under their
own names, the optimizer's state under ``optimizer.`` (``checkpoint.OPTIMIZER_PREFIX``), and metadata
``epoch``, ``fingerprint``, ``network``, ``history`` (JSON list of the per-epoch rows so far).
"""

from __future__ import annotations

import json
from collections.abc import Mapping

import numpy as np

from trainlib.engine.checkpoint import OPTIMIZER_PREFIX, Checkpoint

HISTORY_KEY = "history"


def network_state(net) -> dict[str, np.ndarray]:
    """Copies of every parameter of ``net`` (BatchNorm statistics included), by name."""
    # asnumpy() shares memory with the parameter on CPU: copy so later steps do not change the state
    return {p.name: p.asnumpy().copy() for p in net.get_parameters()}


def capture_state(net, optimizer, metadata: Mapping) -> Checkpoint:
    """Network parameters, ``optimizer``'s own parameters under ``optimizer.`` (when given), and ``metadata``."""
    params = network_state(net)
    if optimizer is not None:
        params.update(
            {OPTIMIZER_PREFIX + p.name: p.asnumpy().copy() for p in optimizer.get_parameters() if p.name not in params}
        )
    return Checkpoint(params, dict(metadata))


def _as_params(arrays: Mapping[str, np.ndarray]) -> dict:
    import mindspore as ms

    return {name: ms.Parameter(ms.Tensor(value), name=name) for name, value in arrays.items()}


def restore_network(net, checkpoint: Checkpoint) -> None:
    """Load ``checkpoint``'s network parameters into ``net``; every parameter of ``net`` must be there."""
    import mindspore as ms

    not_loaded, _ = ms.load_param_into_net(net, _as_params(checkpoint.network_params()), strict_load=True)
    if not_loaded:
        raise ValueError(f"checkpoint lacks network parameters {not_loaded[:5]}")


def restore_optimizer(net, optimizer, checkpoint: Checkpoint) -> None:
    """Load ``checkpoint``'s optimizer state (moments, step) into ``optimizer``, which must find all of its own."""
    import mindspore as ms

    optimizer_state = checkpoint.optimizer_state()
    own = {p.name for p in optimizer.get_parameters()} - {p.name for p in net.get_parameters()}
    missing = sorted(own - set(optimizer_state))
    if missing:
        raise ValueError(f"checkpoint lacks optimizer state {missing[:5]}")
    ms.load_param_into_net(optimizer, _as_params(optimizer_state), strict_load=True)


def restore_state(net, checkpoint: Checkpoint, optimizer=None) -> None:
    """Load ``checkpoint`` into ``net`` (and ``optimizer``'s state, when given); names must match."""
    restore_network(net, checkpoint)
    if optimizer is not None:
        restore_optimizer(net, optimizer, checkpoint)


def history_of(checkpoint: Checkpoint) -> list[dict[str, float]]:
    """The per-epoch rows a checkpoint carries (empty for start weights, which have none)."""
    return json.loads(checkpoint.metadata.get(HISTORY_KEY, "[]"))


def encode_history(rows: list[Mapping[str, float]]) -> str:
    """``rows`` as the JSON string stored under the ``history`` metadata key."""
    return json.dumps([dict(row) for row in rows])
