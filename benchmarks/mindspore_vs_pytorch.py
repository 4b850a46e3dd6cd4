"""Training images/s of MindSpore (the project's loop, graph mode) against PyTorch on the same network and images.

Side by side (the default): the default network (``resnet_narrow``, 32 px, batch 64) trained on the same arrays
(``--steps`` batches of the default Fashion-MNIST tree, decoded and augmented once by the project's input pipeline)
by the project's loop (``trainlib.engine.loop.train``, MindSpore GRAPH mode, the baseline's Momentum with loss scale
1024) and by PyTorch 2.13 CPU: eager NCHW, eager ``channels_last`` and ``torch.compile`` (``channels_last``) where
it runs. The PyTorch network is the same architecture with the same number of trainable parameters (asserted). After
one untimed warm-up pass each (graph compilation), the frameworks alternate for ``--repeats`` timed passes, the order
rotating each repeat, so machine noise hits all alike. Then ResNet-50 at 224 px, batch 32, ``--r50-steps`` steps on
random images, the same way; numpy's fp32 matmul GFLOP/s is the physical yardstick of the same run.

Sweep (``--sweep``): each MindSpore CPU setting in its own process (``ONEDNN_MAX_CPU_ISA`` must be set before
MindSpore loads), MindSpore only, the real input pipeline (``create_dataset`` over the tree, as the default run
reads it); a process with no setting runs before, between and after them, and each setting's ratio is against the
mean of its two neighbours.

    .venv/bin/python benchmarks/mindspore_vs_pytorch.py --repeats 5
    .venv/bin/python benchmarks/mindspore_vs_pytorch.py --sweep --repeats 3
    .venv/bin/python benchmarks/mindspore_vs_pytorch.py --framework mindspore --input tree --setting threads=1
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

import numpy as np

# each setting of the sweep: KEY=VALUE as --setting takes it
SWEEP = (
    "jit_level=O0",
    "jit_level=O1",
    "jit_level=O2",
    "graph_kernel=on",
    "graph_kernel_flags=--opt_level=2",
    "threads=1",
    "threads=2",
    "threads=4",
    "inter_op=1",
    "inter_op=2",
    "dispatch_threads=1",
    "bind=on",
    "workers=1",
    "workers=4",
    "prefetch=2",
    "prefetch=64",
    "loop=model",
    "loop=sink",
    "isa=ALL",
    "isa=AVX512_CORE",
)
RESULT_PREFIX = "RESULT "


def matmul_gflops(n: int = 1024, repeats: int = 5) -> float:
    """numpy's fp32 matrix product, ``2 n^3`` flops a call: the median GFLOP/s of ``repeats`` calls."""
    a = np.random.default_rng(0).standard_normal((n, n), dtype=np.float32)
    b = np.random.default_rng(1).standard_normal((n, n), dtype=np.float32)
    a @ b  # warm-up: BLAS thread pool
    rates = []
    for _ in range(repeats):
        started = time.perf_counter()
        a @ b
        rates.append(2 * n**3 / (time.perf_counter() - started) / 1e9)
    return statistics.median(rates)


def load_average() -> str:
    return "/".join(f"{value:.2f}" for value in os.getloadavg())


def apply_settings(settings: dict[str, str]) -> None:
    """The MindSpore context settings of ``settings`` (after ``configure_mindspore``, before any graph compiles);
    the dataset, loop and ISA settings are read where they act."""
    import mindspore as ms

    for key, value in settings.items():
        if key == "jit_level":
            ms.set_context(jit_config={"jit_level": value})
        elif key == "graph_kernel":
            ms.set_context(enable_graph_kernel=value == "on")
        elif key == "graph_kernel_flags":
            ms.set_context(enable_graph_kernel=True, graph_kernel_flags=value)
        elif key == "threads":  # CPU kernels' thread pool (the old runtime_num_threads)
            ms.device_context.cpu.op_tuning.threads_num(int(value))
        elif key == "inter_op":  # deprecated in 2.10 for dispatch_threads_num, still accepted
            ms.set_context(inter_op_parallel_num=int(value))
        elif key == "dispatch_threads":
            ms.runtime.dispatch_threads_num(int(value))
        elif key == "bind":
            ms.runtime.set_cpu_affinity(value == "on")
        elif key == "prefetch":
            import mindspore.dataset as ds

            ds.config.set_prefetch_size(int(value))
        elif key not in ("workers", "loop", "isa"):
            raise ValueError(f"unknown setting {key!r}")


def tree_dataset(args, workers: int = 2):
    """The default run's training input pipeline over ``--images-per-class`` images a class of the default tree."""
    from trainlib.data import fashion_mnist
    from trainlib.data.folder import create_dataset, scan_image_tree, subset_manifest

    fashion_mnist.materialise(args.data_root)
    scan = scan_image_tree(args.data_root, {"train": "train", "val": "val"}, verify="none")
    manifest = subset_manifest(scan.manifest, {"train": args.images_per_class, "val": 0}, seed=0)
    return create_dataset(
        manifest, "train", args.image_size, args.batch_size, training=True, crop_scale=(0.35, 1), num_workers=workers
    )


def fixed_batches(args) -> tuple[np.ndarray, np.ndarray]:
    """``--steps`` batches of the tree, decoded and augmented once: the arrays both frameworks train on."""
    images, labels = [], []
    for image, label in tree_dataset(args).create_tuple_iterator(output_numpy=True, num_epochs=1):
        images.append(image)
        labels.append(label)
        if len(images) == args.steps:
            break
    if len(images) < args.steps:
        raise ValueError(f"the tree has {len(images)} batches, fewer than --steps {args.steps}")
    return np.concatenate(images).astype(np.float32), np.concatenate(labels).astype(np.int32)


class MindSporeTrainer:
    """The baseline's training (network, label-smoothed loss, Momentum with loss scale 1024) run by the project's
    loop, one pass over ``dataset`` a call; ``loop`` ``model`` or ``sink``: ``Model.train`` instead, without or
    with dataset sink mode."""

    def __init__(self, network: str, classes: int, dataset, passes: int, loop: str = "project"):
        from mindspore import nn
        from mindspore.train import FixedLossScaleManager, Model

        from trainlib.engine.epochs import TrainingSpec
        from trainlib.engine.step import TrainStep
        from trainlib.models.loss import CrossEntropySmooth
        from trainlib.models.resnet import create_resnet
        from trainlib.optim.momentum import create_momentum
        from trainlib.optim.schedules import warmup_schedule

        loss_scale = 1024.0
        self.dataset, self.loop = dataset, loop
        self.steps = dataset.get_dataset_size()
        batch = dataset.get_batch_size()
        lr = warmup_schedule("cosine", 0.01, 0.1, 0.0, 0, passes, self.steps)
        self.net = create_resnet(network, classes)
        optimizer = create_momentum(self.net, lr, 0.9, 1e-4, loss_scale)
        loss = CrossEntropySmooth(classes, 0.1)
        if loop == "project":
            cell = nn.TrainOneStepCell(nn.WithLossCell(self.net, loss), optimizer, sens=loss_scale)
            cell.set_train(True)
            self.step = TrainStep(cell, self.net, optimizer, lr)
            self.spec = TrainingSpec(epochs=1, batch_size=batch, examples_per_step=batch)
        else:
            manager = FixedLossScaleManager(loss_scale, drop_overflow_update=False)
            self.model = Model(self.net, loss, optimizer, loss_scale_manager=manager)

    def parameters(self) -> int:
        from trainlib.models.resnet import count_parameters

        return count_parameters(self.net)

    def __call__(self) -> None:
        from trainlib.engine.loop import train

        if self.loop == "project":
            train(self.spec, self.dataset, BuiltStep(self.step))
        else:
            self.model.train(1, self.dataset, dataset_sink_mode=self.loop == "sink")


class BuiltStep:
    """The engine's step factory (``engine.step.StepFactory``) for a step built once: every pass trains the same
    cells on, so the graph compiles once. No pass is given validation data, so ``evaluate`` is never called."""

    def __init__(self, step) -> None:
        self.step = step

    def make_step(self, start, steps_per_epoch: int):
        return self.step

    def evaluate(self, step, dataset) -> dict:
        raise TypeError("the benchmark's passes train only")


def torch_network(network: str, classes: int):
    """The PyTorch counterpart of ``create_resnet(network, classes)``: torchvision's layout for the torchvision
    names, else the same blocks as ours (``trainlib.migrate.torch_resnet``) in our layout (the narrow ResNet's 3x3
    stride-1 stem without max-pool)."""
    import torch
    from torch import nn

    from trainlib.migrate.layouts import TORCHVISION_ARCHITECTURES
    from trainlib.migrate.torch_resnet import BasicBlock, Bottleneck, TorchResNet
    from trainlib.models.resnet import RESNET_LAYOUTS

    if network in TORCHVISION_ARCHITECTURES:
        return TorchResNet(network, classes)
    layout = RESNET_LAYOUTS[network]
    block = Bottleneck if layout.block == "bottleneck" else BasicBlock
    width = layout.base_width
    if not layout.small_input_stem:
        raise ValueError(f"{network}: only the small-input stem is rebuilt here")
    layers = [nn.Conv2d(3, width, 3, 1, 1, bias=False), nn.BatchNorm2d(width), nn.ReLU(inplace=True)]
    in_ch = width
    for stage, n_blocks in enumerate(layout.blocks_per_stage):
        stage_width = width * 2**stage
        for index in range(n_blocks):
            stride = 2 if stage > 0 and index == 0 else 1
            out_ch = stage_width * block.expansion
            down = None
            if stride != 1 or in_ch != out_ch:
                down = nn.Sequential(nn.Conv2d(in_ch, out_ch, 1, stride, bias=False), nn.BatchNorm2d(out_ch))
            layers.append(block(in_ch, stage_width, stride, down))
            in_ch = out_ch
    layers += [nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(in_ch, classes)]
    return torch.nn.Sequential(*layers)


class TorchTrainer:
    """The same training in PyTorch: SGD with momentum 0.9, weight decay 1e-4 off BatchNorm and biases, label
    smoothing 0.1 (no loss scale: fp32 needs none), one pass over the arrays a call; ``variant``: ``eager``,
    ``channels_last`` (eager), ``compile`` (``torch.compile`` of the channels_last model)."""

    def __init__(self, network: str, classes: int, images: np.ndarray, labels: np.ndarray, batch: int, variant: str):
        import torch

        torch.manual_seed(0)
        self.model = torch_network(network, classes).train()
        layout = torch.channels_last if variant != "eager" else torch.contiguous_format
        self.model = self.model.to(memory_format=layout)
        decay = [p for p in self.model.parameters() if p.ndim > 1]
        rest = [p for p in self.model.parameters() if p.ndim <= 1]
        self.optimizer = torch.optim.SGD(
            [{"params": decay, "weight_decay": 1e-4}, {"params": rest, "weight_decay": 0.0}], lr=0.1, momentum=0.9
        )
        self.loss = torch.nn.CrossEntropyLoss(label_smoothing=0.1)
        self.forward = torch.compile(self.model) if variant == "compile" else self.model
        self.batches = [
            (
                torch.from_numpy(images[i : i + batch]).contiguous(memory_format=layout),
                torch.from_numpy(labels[i : i + batch]).long(),
            )
            for i in range(0, len(images), batch)
        ]

    def parameters(self) -> int:
        return sum(p.numel() for p in self.model.parameters() if p.requires_grad)

    def __call__(self) -> None:
        for image, label in self.batches:
            self.optimizer.zero_grad(set_to_none=True)
            self.loss(self.forward(image), label).backward()
            self.optimizer.step()


def alternate(trainers: dict, images: int, repeats: int) -> dict[str, list[float]]:
    """One untimed warm-up pass each, then ``repeats`` timed passes each, the order rotating every repeat."""
    for name, trainer in list(trainers.items()):
        try:
            trainer()
        except Exception as error:
            if name != "torch compile":
                raise  # a pass of ours that fails is a broken benchmark, not a missing toolchain
            # torch.compile needs a working compiler toolchain; say so and go on
            print(f"{name}: does not run here ({type(error).__name__}: {str(error).splitlines()[0][:160]})")
            del trainers[name]
    rates: dict[str, list[float]] = {name: [] for name in trainers}
    names = list(trainers)
    for repeat in range(repeats):
        for name in names[repeat % len(names) :] + names[: repeat % len(names)]:
            started = time.perf_counter()
            trainers[name]()
            rates[name].append(images / (time.perf_counter() - started))
    return rates


def report(title: str, rates: dict[str, list[float]]) -> dict[str, float]:
    print(title)
    medians = {name: statistics.median(values) for name, values in rates.items()}
    for name, values in rates.items():
        print(f"  {name:>24}: median {medians[name]:8.1f} img/s   runs {[round(v, 1) for v in values]}")
    if "mindspore" in medians:
        for name, median in medians.items():
            if name != "mindspore":
                print(f"  mindspore / {name}: {medians['mindspore'] / median:.3f}")
    return medians


def side_by_side(args) -> None:
    import mindspore.dataset as ds

    from trainlib.engine.runtime import configure_mindspore

    configure_mindspore("CPU", "graph", 0)
    print(f"load average {load_average()} at start; numpy fp32 matmul {matmul_gflops():.1f} GFLOP/s")
    frameworks = ["mindspore", "torch eager", "torch channels_last", "torch compile"]
    if args.framework == "mindspore":
        frameworks = ["mindspore"]
    for network, size, batch, steps, repeats, classes in (
        (args.network, args.image_size, args.batch_size, args.steps, args.repeats, 10),
        ("resnet50", 224, args.r50_batch, args.r50_steps, args.r50_repeats, 10),
    ):
        if steps == 0:
            continue
        if size == args.image_size and network == args.network:
            images, labels = fixed_batches(args)
        else:  # no 224 px tree is needed to time ResNet-50: random images of the same shape
            rng = np.random.default_rng(0)
            images = rng.standard_normal((steps * batch, 3, size, size), dtype=np.float32)
            labels = rng.integers(0, classes, steps * batch).astype(np.int32)
        data = ds.NumpySlicesDataset({"image": images, "label": labels}, shuffle=False).batch(batch)
        trainers = {}
        for name in frameworks:
            if name == "mindspore":
                trainers[name] = MindSporeTrainer(network, classes, data, 2 + repeats)
            elif name != "torch compile" or network == args.network or args.r50_compile:
                trainers[name] = TorchTrainer(network, classes, images, labels, batch, name.split()[-1])
        counts = {name: trainer.parameters() for name, trainer in trainers.items()}
        assert len(set(counts.values())) == 1, f"{network}: trainable parameters differ {counts}"
        started_load = load_average()
        rates = alternate(trainers, len(images), repeats)
        title = (
            f"{network}, {size}px, batch {batch}, {steps} steps a pass, {repeats} alternating passes each, "
            f"{next(iter(counts.values()))} trainable parameters each; load {started_load} -> {load_average()}"
        )
        report(title, rates)
    print(f"numpy fp32 matmul {matmul_gflops():.1f} GFLOP/s at the end; load average {load_average()}")


def mindspore_child(args) -> None:
    """MindSpore alone with ``--setting``s, on the real input pipeline (``--input tree``) or the fixed arrays."""
    import mindspore.dataset as ds

    from trainlib.engine.runtime import configure_mindspore

    settings = dict(setting.split("=", 1) for setting in args.setting)
    configure_mindspore("CPU", "graph", 0)
    apply_settings(settings)
    if args.input == "tree":
        data = tree_dataset(args, int(settings.get("workers", 2)))
    else:
        images, labels = fixed_batches(args)
        data = ds.NumpySlicesDataset({"image": images, "label": labels}, shuffle=False).batch(args.batch_size)
    trainer = MindSporeTrainer(args.network, 10, data, 2 + args.repeats, settings.get("loop", "project"))
    images = data.get_dataset_size() * args.batch_size
    if args.profile:
        profile(trainer, args.profile)
        return
    rates = alternate({"mindspore": trainer}, images, args.repeats)["mindspore"]
    print(RESULT_PREFIX + json.dumps({"settings": settings, "median": statistics.median(rates), "runs": rates}))


def profile(trainer: MindSporeTrainer, output: str) -> None:
    """One pass after the warm-up under MindSpore's profiler; prints the operator tables it writes (CSV)."""
    from mindspore import Profiler

    trainer()  # warm-up: the compilation is not what a step costs
    profiler = Profiler(output_path=output)
    trainer()
    profiler.analyse()
    for table in sorted(Path(output).rglob("*.csv")):
        if "op" in table.name.lower() or "kernel" in table.name.lower():
            print(f"== {table}")
            print("\n".join(table.read_text().splitlines()[:16]))


def run_child(args, setting: str | None) -> dict:
    env = dict(os.environ)
    command = [sys.executable, __file__, "--framework", "mindspore", "--input", "tree"]
    command += ["--repeats", str(args.repeats), "--images-per-class", str(args.images_per_class)]
    command += ["--data-root", args.data_root]
    if setting:
        command += ["--setting", setting]
        if setting.startswith("isa="):
            env["ONEDNN_MAX_CPU_ISA"] = setting.split("=", 1)[1]
    load = load_average()
    try:
        done = subprocess.run(command, check=False, env=env, capture_output=True, text=True, timeout=args.child_timeout)
    except subprocess.TimeoutExpired:
        return {"error": f"over {args.child_timeout} s", "load": load}
    for line in done.stdout.splitlines():
        if line.startswith(RESULT_PREFIX):
            return {**json.loads(line[len(RESULT_PREFIX) :]), "load": load}
    tail = [line for line in done.stderr.splitlines() if line.strip()][-1:] or ["no output"]
    return {"error": tail[0][:200], "load": load}


def sweep(args) -> None:
    settings = args.setting or list(SWEEP)
    print(f"load average {load_average()} at start; numpy fp32 matmul {matmul_gflops():.1f} GFLOP/s")
    baselines = [run_child(args, None)]
    rows = []
    for setting in settings:
        result = run_child(args, setting)
        baselines.append(run_child(args, None))
        neighbours = [b["median"] for b in baselines[-2:] if "median" in b]
        reference = statistics.mean(neighbours) if neighbours else float("nan")
        rows.append((setting, result, reference))
        if "median" in result:
            print(
                f"  {setting:>34}: {result['median']:7.1f} img/s, default {reference:7.1f}, "
                f"ratio {result['median'] / reference:.3f}  (load {result['load']})",
                flush=True,
            )
        else:
            print(f"  {setting:>34}: does not run: {result['error']}  (load {result['load']})", flush=True)
    medians = [b["median"] for b in baselines if "median" in b]
    print(f"default (no setting): {len(medians)} processes, median {statistics.median(medians):.1f} img/s {medians}")
    print(f"load average {load_average()} at the end")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--steps", type=int, default=20, help="batches a timed pass (the side-by-side arrays)")
    parser.add_argument("--batch-size", type=int, default=64)
    parser.add_argument("--image-size", type=int, default=32)
    parser.add_argument("--network", default="resnet_narrow")
    parser.add_argument("--r50-steps", type=int, default=2, help="ResNet-50 steps a pass; 0: no ResNet-50")
    parser.add_argument("--r50-batch", type=int, default=32)
    parser.add_argument("--r50-repeats", type=int, default=3)
    parser.add_argument("--r50-compile", action="store_true", help="also torch.compile ResNet-50 (minutes)")
    parser.add_argument("--images-per-class", type=int, default=150, help="the tree's images a class read")
    parser.add_argument("--data-root", default="data/01_raw/fashion_mnist")
    parser.add_argument("--framework", choices=("both", "mindspore"), default="both")
    parser.add_argument("--input", choices=("arrays", "tree"), default="arrays")
    parser.add_argument("--setting", action="append", default=[], help=f"KEY=VALUE, one of {SWEEP}")
    parser.add_argument("--sweep", action="store_true", help="each --setting (default: all) in its own process")
    parser.add_argument("--profile", metavar="DIR", help="MindSpore alone: one pass under the profiler, into DIR")
    parser.add_argument("--child-timeout", type=float, default=300)
    args = parser.parse_args()
    if args.sweep:
        sweep(args)
        return
    # the project's CPU settings (ONEDNN_MAX_CPU_ISA=AVX2 unless set) before MindSpore loads
    import pipelines  # noqa: F401

    if args.setting or args.input == "tree" or args.profile:
        mindspore_child(args)
    else:
        side_by_side(args)


if __name__ == "__main__":
    main()
