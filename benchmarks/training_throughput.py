"""Training images/s of the pipeline's loop against a bare MindSpore loop, in one run.

Both train the same network (fresh copies of one initialisation) on the same Fashion-MNIST
subset through the same input pipeline; they differ only in the loop:

- pipeline: ``trainlib.engine.loop.train`` with the callbacks the baseline node uses (progress display,
  ``tracking.EpochMetrics`` into a real run in a temporary store, periodic checkpoints), one epoch a call;
- bare: ``mindspore.Model.train`` with ``FixedLossScaleManager`` and no callbacks.

After one untimed warm-up epoch each (graph compilation), the two alternate for ``--repeats``
timed epochs, so machine noise hits both alike. Prints each median and pipeline / bare.

    .venv/bin/python benchmarks/training_throughput.py --repeats 5
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
from pathlib import Path

import pipelines  # noqa: F401  (sets the CPU speed environment before MindSpore loads)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--images-per-class", type=int, default=300)
    parser.add_argument("--batch-size", type=int, default=64)
    parser.add_argument("--image-size", type=int, default=32)
    parser.add_argument("--network", default="resnet_narrow")
    parser.add_argument("--data-root", default="data/01_raw/fashion_mnist")
    args = parser.parse_args()

    import mlflow
    from mindspore import nn
    from mindspore.train import FixedLossScaleManager, Model
    from mindspore_vs_pytorch import BuiltStep  # this folder is the script's sys.path[0]

    from pipelines.tracking.writer import EpochMetrics
    from trainlib.data import fashion_mnist
    from trainlib.data.folder import create_dataset, scan_image_tree, subset_manifest
    from trainlib.engine.callbacks import PeriodicCheckpoint
    from trainlib.engine.epochs import TrainingSpec
    from trainlib.engine.loop import train
    from trainlib.engine.runtime import configure_mindspore
    from trainlib.engine.state import capture_state, restore_state
    from trainlib.engine.step import TrainStep
    from trainlib.models.loss import CrossEntropySmooth
    from trainlib.models.resnet import create_resnet
    from trainlib.optim.momentum import create_momentum
    from trainlib.optim.schedules import warmup_schedule

    configure_mindspore("CPU", "graph", 0)
    fashion_mnist.materialise(args.data_root)
    scan = scan_image_tree(args.data_root, {"train": "train", "val": "val"}, verify="none")
    manifest = subset_manifest(scan.manifest, {"train": args.images_per_class, "val": 0}, seed=0)
    loss_scale = 1024.0

    def dataset():
        return create_dataset(manifest, "train", args.image_size, args.batch_size, training=True, crop_scale=(0.35, 1))

    steps = dataset().get_dataset_size()
    images = steps * args.batch_size
    total_epochs = 1 + args.repeats
    lr = warmup_schedule("cosine", 0.01, 0.1, 0.0, 0, total_epochs, steps)
    initial = capture_state(create_resnet(args.network, 10), None, {})

    def parts():
        net = create_resnet(args.network, 10)
        restore_state(net, initial)
        return net, CrossEntropySmooth(10, 0.1), create_momentum(net, lr, 0.9, 1e-4, loss_scale)

    net, loss_fn, optimizer = parts()
    cell = nn.TrainOneStepCell(nn.WithLossCell(net, loss_fn), optimizer, sens=loss_scale)
    cell.set_train(True)
    train_step = TrainStep(cell, net, optimizer, lr)
    workdir = Path(tempfile.mkdtemp(prefix="throughput-"))
    mlflow.set_tracking_uri(f"sqlite:///{workdir / 'mlflow.db'}")
    # the engine adds the progress display itself; the checkpoint writer is the one it adds per training
    callbacks = [
        EpochMetrics(),
        PeriodicCheckpoint(lambda epoch: capture_state(net, optimizer, {"epoch": epoch}), workdir / "ckpt"),
    ]
    pipeline_data = dataset()
    one_epoch = TrainingSpec(epochs=1, batch_size=args.batch_size, examples_per_step=args.batch_size)

    bare_net, bare_loss, bare_optimizer = parts()
    model = Model(
        bare_net,
        bare_loss,
        bare_optimizer,
        loss_scale_manager=FixedLossScaleManager(loss_scale, drop_overflow_update=False),
    )
    bare_data = dataset()

    def run_pipeline() -> float:
        started = time.perf_counter()
        train(one_epoch, pipeline_data, BuiltStep(train_step), callbacks=callbacks)
        return images / (time.perf_counter() - started)

    def run_bare() -> float:
        started = time.perf_counter()
        model.train(1, bare_data, dataset_sink_mode=False)
        return images / (time.perf_counter() - started)

    rates = {"pipeline": [], "bare": []}
    with mlflow.start_run():
        run_pipeline(), run_bare()  # warm-up: graph compilation
        for _ in range(args.repeats):
            rates["pipeline"].append(run_pipeline())
            rates["bare"].append(run_bare())

    print(
        f"network {args.network}, {images} images/epoch ({steps} steps of {args.batch_size}), "
        f"{args.image_size}px, {args.repeats} alternating epochs each"
    )
    for name, values in rates.items():
        print(f"{name:>9}: median {statistics.median(values):8.1f} img/s   runs {[round(v, 1) for v in values]}")
    ratio = statistics.median(rates["pipeline"]) / statistics.median(rates["bare"])
    per_pair = [p / b for p, b in zip(rates["pipeline"], rates["bare"], strict=True)]
    print(f"pipeline / bare: {ratio:.3f} (median of per-pair ratios {statistics.median(per_pair):.3f}; goal >= 0.95)")


if __name__ == "__main__":
    main()
