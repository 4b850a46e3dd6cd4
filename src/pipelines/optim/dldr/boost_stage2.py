"""Stage 2 with ``mindspore.boost``'s own dim_reduce, for comparison with this project's P-BFGS.

``mindspore.boost.AutoBoost`` is a process-wide singleton configured by the first ``Model`` of
a process, so this always runs in a process of its own:

    python -m pipelines.optim.dldr.boost_stage2 job.json

The job file names the network, the start checkpoint, the precomputed projection (``.npy``,
passed as ``pca_mat_path``), the data and the output checkpoint; see ``run_job``. The boost
configuration uses MindSpore's real key names (``n_components``, ``device_number``; the
tutorial's ``n_component``/``device_num`` are silently ignored by MindSpore).
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import numpy as np


def boost_config(
    pca_path: str | Path,
    n_components: int,
    rho: float,
    gamma: float,
    alpha: float,
    sigma: float,
    device_number: int = 1,
) -> dict:
    """``boost_config_dict`` enabling only dim_reduce with a precomputed projection."""
    pca_path = Path(pca_path)
    return {
        "boost": {"mode": "manual", "dim_reduce": True},
        "common": {"device_number": device_number},
        "dim_reduce": {
            "rho": rho,
            "gamma": gamma,
            "alpha": alpha,
            "sigma": sigma,
            "n_components": n_components,
            "pca_mat_path": str(pca_path),
            "weight_load_dir": str(pca_path.parent),
            "timeout": 60,
        },
    }


def boost_model(net, loss_fn, config: dict, loss_scale: float | None):
    """A ``Model`` whose training step is ``mindspore.boost``'s DimReduce (SGD with lr 1 underneath).

    Without a loss-scale manager MindSpore's boost step reports a None loss; with one, its
    residual momentum uses the still-scaled gradient (one of the faults our P-BFGS fixes).
    """
    from mindspore import nn
    from mindspore.train import FixedLossScaleManager, Model

    optimizer = nn.SGD(net.trainable_params(), learning_rate=1.0, loss_scale=loss_scale or 1.0)
    manager = FixedLossScaleManager(loss_scale, drop_overflow_update=False) if loss_scale else None
    kwargs = {"loss_scale_manager": manager} if manager else {}
    # Model silently skips boost unless it has metrics or an eval network
    return Model(net, loss_fn, optimizer, metrics={"accuracy"}, boost_level="O1", boost_config_dict=config, **kwargs)


def _step_losses_callback():
    from mindspore.train import Callback

    class StepLosses(Callback):
        """Per-step loss as boost reports it (None without a loss-scale manager: a MindSpore fault)."""

        def __init__(self):
            self.rows = []

        def on_train_step_end(self, run_context):
            params = run_context.original_args()
            outputs = params.net_outputs
            loss = outputs[0] if isinstance(outputs, (tuple, list)) else outputs
            value = float(loss.asnumpy()) if loss is not None else float("nan")
            self.rows.append((params.cur_epoch_num, params.cur_step_num, value))

    return StepLosses()


def run_job(job: dict) -> None:
    """Train ``job["epochs"]`` epochs of boost stage 2 and save the network to ``job["output"]``."""
    import pandas as pd

    from pipelines.engine.checkpoint import load_checkpoint, save_checkpoint
    from pipelines.images.folder import create_dataset
    from pipelines.models.loss import CrossEntropySmooth
    from pipelines.models.resnet import create_resnet_from_config
    from pipelines.engine.runtime import configure_mindspore
    from pipelines.engine.state import capture_state, restore_state

    configure_mindspore(job["device_target"], job["mode"], job["seed"])
    model = job["model"]
    net = create_resnet_from_config(model, job["num_classes"])
    restore_state(net, load_checkpoint(job["start_checkpoint"]))
    data = job["data"]
    dataset = create_dataset(
        pd.read_csv(job["manifest"]),
        "train",
        data["image_size"],
        job["batch_size"],
        training=True,
        crop_scale=data["crop_scale"],
        num_workers=data["num_workers"],
        seed=job["seed"],
    )
    stage2 = job["stage2"]
    pca = np.load(job["pca_path"])
    config = boost_config(
        job["pca_path"], pca.shape[0], stage2["rho"], stage2["gamma"], stage2["alpha"], stage2["sigma"]
    )
    trainer = boost_model(
        net, CrossEntropySmooth(job["num_classes"], stage2["label_smoothing"]), config, stage2["loss_scale"]
    )
    losses = _step_losses_callback()
    trainer.train(job["epochs"], dataset, callbacks=[losses], dataset_sink_mode=False)
    save_checkpoint(capture_state(net, None, {"network": model["name"], "epoch": job["end_epoch"]}), job["output"])
    pd.DataFrame(losses.rows, columns=["epoch", "step", "loss"]).to_csv(job["history"], index=False)


if __name__ == "__main__":
    run_job(json.loads(Path(sys.argv[1]).read_text()))
