"""mindspore.boost's own Adasum, as the tutorial (seed 004) runs it: ``Model(boost_level="O2")``.

MindSpore applies it across servers after an AllReduce inside each 8-device server, with
Send/Receive between servers: Ascend only, 16 devices or more. Parameter validation refuses it
elsewhere; ``optim/adasum/`` (``combine``, ``step``) is the implementation that runs on any backend and rank count 2^k.
The engine trains it through ``engine.model_bridge`` (``recipes.momentum`` builds the step).
"""

from __future__ import annotations

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


def builtin_adasum_model(net, loss_fn, optimizer, loss_scale: float):
    """``Model(boost_level="O2")`` over ``net`` with only Adasum on and a fixed ``loss_scale``."""
    from mindspore.train import FixedLossScaleManager, Model

    return Model(
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
