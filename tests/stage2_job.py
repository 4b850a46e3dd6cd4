"""A stage-2 (P-BFGS) training run as its own process, so a test can kill it: ``python stage2_job.py WORK TREE``.

Builds a tiny network's stage-1 checkpoint and an orthonormal PCA matrix (both from fixed seeds,
so every run of the job gets the same inputs), calls the ``train_stage2`` node with the base
parameters and ``WORK`` as checkpoint folder, and writes the result to ``WORK/stage2.ckpt`` and
``WORK/stage2_steps.csv``.
"""

from __future__ import annotations

# isort: off
import pipelines  # noqa: F401  (sets ONEDNN_MAX_CPU_ISA before MindSpore loads)

# isort: on
import logging
import sys
from pathlib import Path

import numpy as np
import yaml

PROJECT = Path(__file__).resolve().parents[1]
EPOCHS = 3
STAGE1_EPOCH = 2
K = 4


def parameters(work: Path) -> dict:
    params = {}
    for name in ("parameters.yml", "parameters_dim_reduce.yml"):
        params.update(yaml.safe_load((PROJECT / "conf/base" / name).read_text()))
    params["model"]["name"] = "resnet_narrow"
    params["data"].update({"image_size": 16, "num_workers": 1})
    params["dim_reduce"]["stage2"].update(
        {
            "epochs": EPOCHS,
            "batch_size": 4,
            "checkpoint": {"dir": str(work / "epochs"), "every_epochs": 1, "keep_last": 1},
        }
    )
    return params


def main(work: Path, tree: Path) -> None:
    from pipelines.common.nodes import create_network
    from pipelines.dim_reduce.nodes import train_stage2
    from pipelines.engine.checkpoint import save_checkpoint
    from pipelines.images.folder import scan_image_tree
    from pipelines.engine.runtime import configure_mindspore
    from pipelines.engine.loop import capture_state

    logging.basicConfig(level=logging.INFO, format="%(message)s")
    params = parameters(work)
    scan = scan_image_tree(tree, {"train": "train", "val": "val"})
    configure_mindspore("CPU", "graph", params["runtime"]["seed"])
    net = create_network(params["model"], scan.class_index)
    stage1 = capture_state(net, None, {"network": "resnet_narrow", "epoch": STAGE1_EPOCH})
    n = sum(int(np.prod(p.shape)) for p in net.trainable_params())
    q, _ = np.linalg.qr(np.random.default_rng(0).standard_normal((n, K)))
    checkpoint, history = train_stage2(
        stage1,
        q.T.astype(np.float32),
        scan.manifest,
        scan.class_index,
        params["model"],
        params["data"],
        params["runtime"],
        params["distributed"],
        params["dim_reduce"],
    )
    save_checkpoint(checkpoint, work / "stage2.ckpt")
    history.to_csv(work / "stage2_steps.csv", index=False)


if __name__ == "__main__":
    main(Path(sys.argv[1]), Path(sys.argv[2]))
