"""THOR against Momentum on the same network and data, from one run.

1. Step costs: median seconds of a Momentum step, a THOR reuse step and a THOR second-order
   step (statistics + inverses), measured in alternation so machine noise hits all alike; the
   amortised THOR step at frequency F is ``(second_order + (F-1) * reuse) / F``, printed as a
   ratio to Momentum for the configured frequencies (goal <= 1.25).
2. Time to target: the ``study`` pipeline (``study_runner.run_study``) with recipes baseline and thor over
   ``--seeds``, evaluating every ``--eval-every-steps`` steps on the fixed val subset; prints each run, and
   THOR / Momentum time to ``--target`` as the mean of the per-seed ratios with its 95 % t-interval (the
   seeds report about 0.6; goal <= 0.6, with an interval below 1).

    .venv/bin/python benchmarks/thor_vs_momentum.py [--target 0.75] [--epochs 2] [--seeds 0,1,2]
        [--params "k=v,..."] [--skip-time-to-target]
"""

from __future__ import annotations

import argparse
import statistics
import time
from pathlib import Path

from study_runner import print_outcome, run_study

import pipelines  # noqa: F401  (sets the CPU speed environment before MindSpore loads)

PROJECT = Path(__file__).resolve().parents[1]


def load_conf():
    """The CPU default configuration (``conf/base``), validated into ``trainlib.params.Parameters``."""
    import yaml

    from trainlib.params import validate_parameters

    params = {}
    for path in sorted((PROJECT / "conf/base").glob("parameters*.yml")):
        params.update(yaml.safe_load(path.read_text()))
    return validate_parameters(params)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--target", type=float, default=0.75)
    parser.add_argument("--epochs", type=int, default=2)
    parser.add_argument("--seeds", default="0,1,2")
    parser.add_argument("--eval-every-steps", type=int, default=20)
    parser.add_argument("--params", default="", help="further study overrides, as kedro run --params takes them")
    parser.add_argument("--steps", type=int, default=24, help="timed steps per kind")
    parser.add_argument("--frequencies", default="50,834")
    parser.add_argument("--skip-time-to-target", action="store_true")
    args = parser.parse_args()

    import mindspore as ms
    from mindspore import nn

    from trainlib.data import fashion_mnist
    from trainlib.data.folder import scan_image_tree, subset_manifest
    from trainlib.engine.runtime import configure_mindspore
    from trainlib.engine.state import capture_state, restore_network
    from trainlib.models.loss import CrossEntropySmooth
    from trainlib.optim.momentum import create_momentum
    from trainlib.optim.schedules import per_step
    from trainlib.recipes.classifier import create_network, train_data
    from trainlib.recipes.thor import thor_schedules, trainlib_thor_step

    conf = load_conf()
    data, network, baseline = conf.data, conf.network, conf.baseline
    configure_mindspore("CPU", "graph", 0)
    fashion_mnist.materialise(PROJECT / data.root)
    scan = scan_image_tree(PROJECT / data.root, data.split_dirs.model_dump(), verify="none")
    manifest = subset_manifest(scan.manifest, data.max_per_class.model_dump(), data.subset_seed)
    classes = len(scan.class_index)
    batch = baseline.batch_size
    dataset = train_data(manifest, data, batch, 0)
    steps_per_epoch = dataset.get_dataset_size()

    def initial_weights(section):
        """Same seed for both: identical weights but for THOR's zero-initialised last BN gammas."""
        ms.set_seed(0)
        net = create_network(network, scan.class_index, zero_init_last_bn_gamma=section.zero_init_last_bn_gamma)
        return capture_state(net, None, {})

    momentum_initial, thor_initial = initial_weights(baseline), initial_weights(conf.thor)

    def momentum_setup(epochs: int):
        net = create_network(network, scan.class_index)
        restore_network(net, momentum_initial)
        lrs = per_step(baseline.lr, epochs=epochs, steps_per_epoch=steps_per_epoch)
        optimizer = create_momentum(net, lrs, baseline.momentum, baseline.weight_decay, baseline.loss_scale)
        step = nn.TrainOneStepCell(
            nn.WithLossCell(net, CrossEntropySmooth(classes, baseline.label_smoothing)),
            optimizer,
            sens=float(baseline.loss_scale),
        )
        step.set_train(True)
        return net, step

    def thor_setup(epochs: int, frequency: int):
        """The THOR recipe's step (preconditioner + Momentum) for ``epochs`` epochs at ``frequency``."""
        thor = conf.thor.model_copy(update={"epochs": epochs, "frequency": frequency})
        net = create_network(network, scan.class_index)
        restore_network(net, thor_initial)
        loss_fn = CrossEntropySmooth(classes, thor.label_smoothing)
        return net, trainlib_thor_step(net, loss_fn, thor, *thor_schedules(thor, steps_per_epoch), rank_size=1).thor

    # 1. step costs: THOR with frequency 2 alternates second-order and reuse steps
    batches = [(x, y) for x, y in dataset.create_tuple_iterator(num_epochs=1)][: 2 * args.steps + 2]
    _, momentum_step = momentum_setup(1)
    _, thor = thor_setup(1, 2)
    times = {"momentum": [], "second_order": [], "reuse": []}
    for i, (images, labels) in enumerate(batches):
        started = time.perf_counter()
        momentum_step(images, labels).asnumpy()
        momentum_time = time.perf_counter() - started
        before = thor.preconditioner.second_order_steps
        started = time.perf_counter()
        thor(images, labels).asnumpy()
        thor_time = time.perf_counter() - started
        if i >= 2:  # the first of each kind compiles
            times["momentum"].append(momentum_time)
            times["second_order" if thor.preconditioner.second_order_steps > before else "reuse"].append(thor_time)
    medians = {kind: statistics.median(values) for kind, values in times.items()}
    print(f"network {network.name}, batch {batch}, {data.image_size}px, medians of {args.steps} steps each:")
    for kind, value in medians.items():
        print(f"  {kind:>13} step: {1000 * value:7.1f} ms  ({value / medians['momentum']:.2f} x Momentum)")
    for frequency in map(int, args.frequencies.split(",")):
        amortised = (medians["second_order"] + (frequency - 1) * medians["reuse"]) / frequency
        print(
            f"  amortised THOR step at frequency {frequency}: {1000 * amortised:.1f} ms = "
            f"{amortised / medians['momentum']:.3f} x Momentum (goal <= 1.25)"
        )
    if args.skip_time_to_target:
        return

    # 2. time to target top-1, from the study
    overrides = {
        "study.recipes": ["baseline", "thor"],
        "study.seeds": [int(seed) for seed in args.seeds.split(",")],
        "study.epochs": args.epochs,
        "target.top1": args.target,
        "study.eval_every_steps": args.eval_every_steps,
    }
    print_outcome(run_study(overrides, extra_params=args.params))


if __name__ == "__main__":
    main()
