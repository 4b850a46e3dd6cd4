"""What THOR's trace rule saves: second-order step time with and without it, and how often layers skip.

One process trains THOR (this project's preconditioner, the CPU default recipe of ``conf/base``) from the same
initial weights on the same Fashion-MNIST batches, once without a trace rule and once per ``--rules`` entry,
the runs alternating step by step so that a load change on a shared machine hits all alike. At frequency
``--frequency`` every F-th step is second-order; a layer whose damped trace changed by at most ``skip``
since its last refresh computes no inverse that step. Prints per run the median second-order and reuse step
times (the first of each kind, which compiles, left out), the ratio of the second-order medians to the run
without a rule, and the share of (layer, second-order step) pairs that skipped (after each layer's first).

    .venv/bin/python benchmarks/thor_trace_rule.py [--steps 200] [--frequency 10] [--rules 0.01,0.001 0.1,0.01]
"""

from __future__ import annotations

import argparse
import statistics
import time

from thor_vs_momentum import PROJECT, load_conf

import pipelines  # noqa: F401  (sets the CPU speed environment before MindSpore loads)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--steps", type=int, default=200, help="training steps of each run")
    parser.add_argument("--frequency", type=int, default=10, help="a second-order step every N steps")
    parser.add_argument("--rules", nargs="+", default=["0.01,0.001", "0.1,0.01"], help="skip,stop pairs")
    args = parser.parse_args()

    import mindspore as ms

    from trainlib.data import fashion_mnist
    from trainlib.data.folder import scan_image_tree, subset_manifest
    from trainlib.engine.runtime import configure_mindspore
    from trainlib.engine.state import capture_state, restore_network
    from trainlib.models.loss import CrossEntropySmooth
    from trainlib.recipes.classifier import create_network, train_data
    from trainlib.recipes.thor import thor_schedules, trainlib_thor_step

    conf = load_conf()
    data = conf.data
    configure_mindspore("CPU", "graph", 0)
    fashion_mnist.materialise(PROJECT / data.root)
    scan = scan_image_tree(PROJECT / data.root, data.split_dirs.model_dump(), verify="none")
    manifest = subset_manifest(scan.manifest, data.max_per_class.model_dump(), data.subset_seed)
    dataset = train_data(manifest, data, conf.thor.batch_size, 0)
    steps_per_epoch = dataset.get_dataset_size()
    epochs = -(-args.steps // steps_per_epoch)
    ms.set_seed(0)
    zero_init = conf.thor.zero_init_last_bn_gamma
    initial = capture_state(create_network(conf.network, scan.class_index, zero_init_last_bn_gamma=zero_init), None, {})

    rules: dict[str, tuple[float, float] | None] = {"no rule": None}
    for text in args.rules:
        skip, stop = (float(value) for value in text.split(","))
        rules[f"rule ({skip:g}, {stop:g})"] = (skip, stop)
    runs = {}
    for name, rule in rules.items():
        thor = conf.thor.model_copy(update={"epochs": epochs, "frequency": args.frequency, "trace_rule": rule})
        net = create_network(conf.network, scan.class_index)
        restore_network(net, initial)
        loss_fn = CrossEntropySmooth(len(scan.class_index), thor.label_smoothing)
        runs[name] = trainlib_thor_step(net, loss_fn, thor, *thor_schedules(thor, steps_per_epoch), rank_size=1).thor
    times = {name: {"second_order": [], "reuse": []} for name in runs}

    done = 0
    for epoch in range(epochs):
        ms.dataset.config.set_seed(epoch)
        for images, labels in dataset.create_tuple_iterator(num_epochs=1):
            if done == args.steps:
                break
            for name, step in runs.items():
                second_order = step.preconditioner.second_order_now()
                started = time.perf_counter()
                step(images, labels).asnumpy()
                took = time.perf_counter() - started
                if done >= 2:  # steps 0 and 1 compile the second-order and the reuse cells
                    times[name]["second_order" if second_order else "reuse"].append(took)
            done += 1

    layers = len(next(iter(runs.values())).preconditioner.layer_names)
    baseline = statistics.median(times["no rule"]["second_order"])
    print(
        f"THOR on {conf.network.name}, batch {conf.thor.batch_size}, {data.image_size}px, {layers} layers, "
        f"{args.steps} steps at frequency {args.frequency} (medians; compiling steps left out):"
    )
    for name, step in runs.items():
        pre = step.preconditioner
        second, reuse = (statistics.median(times[name][kind]) for kind in ("second_order", "reuse"))
        checks = layers * (pre.second_order_steps - 1)  # a layer's first second-order step always computes
        print(
            f"  {name:>18}: second-order {1000 * second:7.1f} ms ({second / baseline:.3f} x no rule, "
            f"{len(times[name]['second_order'])} steps), reuse {1000 * reuse:6.1f} ms; "
            f"inverses computed {pre.inverses_computed} of {layers * pre.second_order_steps}, "
            f"skips {pre.trace_skips}/{checks} = {pre.trace_skips / max(checks, 1):.1%}, "
            f"stopped layers {len(pre.stopped_layers)}"
        )


if __name__ == "__main__":
    main()
