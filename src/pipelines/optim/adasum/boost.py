"""mindspore.boost's own Adasum, as the tutorial (seed 004) runs it: ``Model(boost_level="O2")``.

MindSpore applies it across servers after an AllReduce inside each 8-device server, with
Send/Receive between servers: Ascend only, 16 devices or more. Parameter validation refuses it
elsewhere; lib/adasum.py is the implementation that runs on any backend and rank count 2^k.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import numpy as np

from pipelines.engine.loop import Callback

# Only adasum among the O2 algorithms, as the tutorial's boost_config_dict sets it.
BOOST_CONFIG = {
    "boost": {
        "mode": "manual",
        "less_bn": False,
        "grad_freeze": False,
        "adasum": True,
        "grad_accumulation": False,
        "dim_reduce": False,
    }
}


def train_with_boost_adasum(
    net,
    loss_fn,
    optimizer,
    loss_scale: float,
    dataset,
    epochs: int,
    lr_per_step: np.ndarray,
    images_per_step: int,
    callbacks: Sequence[Callback],
    start_epoch: int = 0,
    evaluate: Callable[[], dict[str, float]] | None = None,
    eval_interval: int = 0,
) -> list[dict[str, float]]:
    """Train ``net`` to ``epochs`` with ``Model(boost_level="O2")`` and only Adasum on; one metrics row per epoch."""
    from mindspore.train import FixedLossScaleManager, Model

    from pipelines.engine.model_bridge import EpochCallbacks

    model = Model(
        net,
        loss_fn=loss_fn,
        optimizer=optimizer,
        loss_scale_manager=FixedLossScaleManager(loss_scale, drop_overflow_update=False),
        # Model builds the boost network only when it can also evaluate (metrics or an eval network)
        metrics={"top_1_accuracy"},
        amp_level="O2",
        boost_level="O2",
        keep_batchnorm_fp32=False,
        boost_config_dict=BOOST_CONFIG,
    )
    steps_per_epoch = dataset.get_dataset_size()
    bridge = EpochCallbacks(
        callbacks,
        epochs,
        start_epoch,
        steps_per_epoch,
        lr_per_step,
        images_per_step,
        evaluate=evaluate,
        eval_interval=eval_interval,
    )
    try:
        model.train(
            epochs,
            dataset,
            callbacks=[bridge],
            dataset_sink_mode=True,
            sink_size=steps_per_epoch,
            initial_epoch=start_epoch,
        )
    finally:
        bridge.close()
    return bridge.rows
