"""A stage-2 training run as its own process, so a test can kill it: ``python stage2_job.py WORK TREE [IMPL]``.

``IMPL`` is ``dim_reduce.stage2.implementation``: ``own`` (P-BFGS, the default) or ``mindspore``.

Builds a tiny network's stage-1 checkpoint and an orthonormal PCA matrix (both from fixed seeds,
so every run of the job gets the same inputs), and calls the ``train_stage2`` node with the base
parameters and ``WORK`` as checkpoint folder, inside an MLflow run of the store ``WORK/mlflow.db``
(as ``kedro run`` would: the node logs into a child run ``stage2`` of it). Writes the result to
``WORK/stage2.ckpt``, ``WORK/stage2_history.csv`` (per epoch) and ``WORK/stage2_steps.csv`` (per step).
"""

from __future__ import annotations

# isort: off
import pipelines  # noqa: F401  (sets ONEDNN_MAX_CPU_ISA before MindSpore loads)

# isort: on
import logging
import sys
from pathlib import Path

import numpy as np

PROJECT = Path(__file__).resolve().parents[2]
EPOCHS = 3
STAGE1_EPOCH = 2
K = 4


def tracking_uri(work: Path) -> str:
    return f"sqlite:///{work / 'mlflow.db'}"


def parameters(work: Path, implementation: str = "trainlib"):
    """The base configuration (all of ``conf/base/parameters*.yml``), tiny, as validated ``Parameters``."""
    from tests.support.config import load_config
    from trainlib.params import validate_parameters

    raw = load_config()
    raw["network"]["name"] = "resnet_narrow"
    raw["data"].update({"image_size": 16, "num_workers": 1})
    raw["dim_reduce"]["stage2"].update(
        {
            "implementation": implementation,
            "epochs": EPOCHS,
            "batch_size": 4,
            "checkpoint": {"dir": str(work / "epochs"), "every_epochs": 1, "keep_last": 1},
        }
    )
    if implementation == "mindspore_builtin":  # boost's residual momentum takes the scaled gradient
        raw["dim_reduce"]["stage2"]["loss_scale"] = 1.0
    return validate_parameters(raw)


def main(work: Path, tree: Path, implementation: str) -> None:
    import mlflow

    from pipelines.dim_reduce.nodes import train_stage2
    from pipelines.tracking import training_run
    from trainlib.data.folder import scan_image_tree
    from trainlib.engine.checkpoint import save_checkpoint
    from trainlib.engine.runtime import configure_mindspore
    from trainlib.engine.state import capture_state
    from trainlib.recipes.classifier import create_network

    params = parameters(work, implementation)
    # its own log on stderr (the tests read it there), after reading the configuration set up Kedro's logging
    logging.basicConfig(level=logging.INFO, format="%(message)s", force=True)
    scan = scan_image_tree(tree, {"train": "train", "val": "val"})
    configure_mindspore("CPU", "graph", params.runtime.seed)
    net = create_network(params.network, scan.class_index)
    stage1 = capture_state(net, None, {"network": "resnet_narrow", "epoch": STAGE1_EPOCH})
    n = sum(int(np.prod(p.shape)) for p in net.trainable_params())
    q, _ = np.linalg.qr(np.random.default_rng(0).standard_normal((n, K)))
    mlflow.set_tracking_uri(tracking_uri(work))
    # the node in the child run its pipeline gives it (hooks.training_runs)
    with (
        mlflow.start_run(run_name="stage2_job"),
        training_run("stage2", {"dim_reduce.stage2": params.dim_reduce.stage2}),
    ):
        shared = (scan.manifest, scan.class_index, params.network, params.data, params.runtime, params.distributed)
        checkpoint, history, _, steps = train_stage2(stage1, q.T.astype(np.float32), *shared, params.dim_reduce.stage2)
    save_checkpoint(checkpoint, work / "stage2.ckpt")
    history.to_csv(work / "stage2_history.csv", index=False)
    steps.to_csv(work / "stage2_steps.csv", index=False)


if __name__ == "__main__":
    sys.path.insert(0, str(PROJECT))  # run as a script: tests.support from the repository
    main(Path(sys.argv[1]), Path(sys.argv[2]), sys.argv[3] if len(sys.argv) > 3 else "trainlib")
